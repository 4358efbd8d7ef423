#!/usr/bin/python3
"""The documentation's commands run on any machine (issue 29).

  machine_paths_test.py SOURCE_DIR

Scans README.md, docs/*.md and bench/README.md for absolute paths of the
machine that wrote them: paths under /work/, /tmp/, /root/ or /home/, and the
source directory's own absolute path (and its parent's) wherever the
checkout lives. Commands in the documentation name files relative to the
repository instead: data under ../shared/data/..., outputs under out/...
System paths any Debian host has (/etc/vipsd, /var/lib/vipsd, /usr/bin,
/dev/zero) are fine. Fails naming file, line and path.
"""
import glob
import os
import re
import sys

# Known offenders in files this change may not edit, each named by file and
# the exact path it contains. Remove an entry when its file is fixed: an
# entry that matches nothing fails the test, so none outlives its reason.
EXEMPT = set()

# A path starts where no path character precedes it ("python/src/" is
# relative; "`/tmp/x", " /tmp/x", "=/tmp/x" are absolute).
START = r"(?<![\w.~/-])"
PATH_TAIL = r"[^\s`'\"()<>\]|,;]*"


def patterns(source_dir):
    prefixes = ["/work/", "/tmp/", "/root/", "/home/"]
    root = os.path.realpath(source_dir)
    for directory in (root, os.path.dirname(root)):
        if directory != "/":
            prefixes.append(directory.rstrip("/") + "/")
    return [re.compile(START + re.escape(p) + PATH_TAIL) for p in prefixes]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: machine_paths_test.py SOURCE_DIR")
    source_dir = sys.argv[1]
    files = ["README.md", "bench/README.md"] + sorted(
        os.path.relpath(f, source_dir) for f in glob.glob(os.path.join(source_dir, "docs", "*.md")))
    compiled = patterns(source_dir)
    failures, used = [], set()
    for name in files:
        path = os.path.join(source_dir, name)
        if not os.path.exists(path):
            failures.append(f"{name}: missing (the test scans it)")
            continue
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                found = sorted({m.group(0) for p in compiled for m in p.finditer(line)})
                for absolute in found:
                    exemption = next((e for e in EXEMPT if e[0] == name and absolute.startswith(e[1])), None)
                    if exemption:
                        used.add(exemption)
                    else:
                        failures.append(f"{name}:{number}: absolute path of this machine: {absolute}")
    for stale in sorted(EXEMPT - used):
        failures.append(f"{stale[0]}: exemption for {stale[1]} matches nothing; remove it from "
                        "tests/docs/machine_paths_test.py")
    for failure in failures:
        print("FAIL: " + failure, file=sys.stderr)
    if failures:
        print("Use paths relative to the repository: ../shared/data/..., out/...", file=sys.stderr)
        return 1
    print(f"no absolute machine paths in {len(files)} files ({len(used)} exemptions used)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
