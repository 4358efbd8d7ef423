#!/usr/bin/python3
"""bench/shared_work_bench.py writes configurations that a build accepts.

  shared_work_bench_test.py VIPSD SOURCE_DIR

* Every configuration the bench writes (solo, a worker, a coordinator, one
  that reads no partition) passes `vipsd --check-config` of this build, with
  nothing left out: the build knows every key the bench writes.
* For an older build (a stand-in script whose reference configuration lacks
  source.timestamps and schedule.start_delay_seconds, and whose --help lacks
  --no-step-time-check) exactly those two lines go, nested lines and every
  other key stay, and the flag is not passed.
* A binary that prints no reference configuration leaves the text as it is.
Fails naming what differs.
"""
import argparse
import os
import stat
import subprocess
import sys
import tempfile

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def stand_in(directory, name, reference, help_text, code=0):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                "if [ \"$1\" = --print-reference-config ]; then cat <<'EOF'\n%sEOF\n"
                "exit %d\nfi\necho '%s'\n" % (reference, code, help_text))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def main():
    vipsd, source_dir = os.path.abspath(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, os.path.join(source_dir, "bench"))
    import shared_work_bench as bench  # noqa: E402

    with tempfile.TemporaryDirectory() as work:
        vocab = os.path.join(work, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("alpha\nbeta\ngamma\n")
        args = argparse.Namespace(vipsd=vipsd, topics=3, q=0.3, interval_seconds="0.05",
                                  steps=5, docs=10, fetch_wait_ms=None)
        # (threads, shared, coordinator, reads_partitions)
        cases = {"solo": (1, False, True, True), "worker": (1, True, False, True),
                 "coordinator": (2, True, True, True), "coordinator-reads-none": (1, True, True, False)}
        written = {}
        for name, (threads, shared, coordinator, reads) in cases.items():
            path = bench.write_config(os.path.join(work, name), "127.0.0.1:9", "g", vocab, args,
                                      threads, shared, coordinator, reads)
            text = open(path).read()
            written[name] = text
            result = subprocess.run([vipsd, "--config", path, "--check-config", *bench.step_check_flag(vipsd)],
                                    capture_output=True, text=True, timeout=60)
            check(result.returncode == 0, "%s: vipsd --check-config exit %d: %s" % (
                name, result.returncode, (result.stderr + result.stdout)[-500:]))
            check(bench.for_build(vipsd, text) == text,
                  "%s: this build does not know every key the bench writes" % name)
        check("  timestamps: create_time\n" in written["solo"], "solo: no source.timestamps")
        check("  work_partitions: false\n" in written["coordinator-reads-none"],
              "coordinator-reads-none: no state.work_partitions")
        check(bench.step_check_flag(vipsd) == ("--no-step-time-check",),
              "this build's --help should name --no-step-time-check")

        # An older build: its reference configuration without two keys.
        reference = subprocess.run([vipsd, "--print-reference-config"], capture_output=True,
                                   text=True, timeout=60).stdout
        old_reference = "".join(line for line in reference.splitlines(keepends=True)
                                if not line.startswith(("  timestamps:", "  start_delay_seconds:")))
        old = stand_in(work, "old-vipsd", old_reference, "usage: vipsd --config FILE")
        text = written["worker"]
        expected = "".join(line for line in text.splitlines(keepends=True)
                           if not line.startswith(("  timestamps:", "  start_delay_seconds:")))
        check(len(expected) < len(text), "the bench no longer writes the two keys this test drops")
        got = bench.for_build(old, text)
        check(got == expected, "old build: expected only the two unknown keys left out, got:\n" + got)
        check("    session.timeout.ms:" in got, "old build: a nested line was left out")
        check(bench.step_check_flag(old) == (), "old build: --no-step-time-check passed anyway")

        # No reference configuration: nothing is left out.
        broken = stand_in(work, "broken-vipsd", "", "usage", code=1)
        check(bench.for_build(broken, text) == text, "a failing binary changed the text")

    for failure in failures:
        print("FAIL: " + failure)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
