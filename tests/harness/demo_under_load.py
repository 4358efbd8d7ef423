#!/usr/bin/env python3
"""The embedded demo beside a CPU hog: no slot overruns its deadline, and
releases leave only at public times (issue 26).

Runs config/examples/demo.yaml unchanged except for where it writes (state,
release mirror, a free metrics port), while one busy loop per CPU core runs
beside it, to its end at the epsilon ceiling. Asserts:

  * it stopped at the ceiling after the demo's 276 steps (exit 0);
  * no slot finished after its deadline: no "finished after their release
    deadline" warning and no step line "reported_at_slot=" (a late slot's
    outputs wait for a later slot's deadline);
  * no record joined a later slot than its timestamp (the warning "were
    readable only after its cut"): the cut's grace covered every read;
  * every release was published at a public deadline: each "published
    release" log time lies within PUBLISH_SLACK seconds after a slot
    boundary of the public clock (status.json's last_release_time is one
    such deadline; the boundaries are that time plus multiples of the
    interval), never spread over the interval the way step completion
    times would be.

Usage: demo_under_load.py --vipsd build/daemon/vipsd --source-dir .
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PUBLISH_SLACK = 0.12  # seconds: the delivery report of a release on the mock


def parse_ts(line):
    match = re.match(r"ts=(\S+)Z ", line)
    if not match:
        return None
    return datetime.datetime.fromisoformat(match.group(1)).replace(
        tzinfo=datetime.timezone.utc).timestamp()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    source = os.path.abspath(args.source_dir)
    work = tempfile.mkdtemp(prefix="vipsd-demo-load-")
    try:
        text = open(os.path.join(source, "config/examples/demo.yaml")).read()
        interval = float(re.search(r"interval_seconds: ([0-9.]+)", text).group(1))
        text = text.replace("vocabulary: demo/vocab.txt",
                            "vocabulary: " + os.path.join(source, "config/examples/demo/vocab.txt"))
        text = text.replace("demo_corpus: demo/corpus.jsonl",
                            "demo_corpus: " + os.path.join(source, "config/examples/demo/corpus.jsonl"))
        text = re.sub(r"mirror_directory: \S+", "mirror_directory: " + work + "/releases", text)
        text = re.sub(r"  directory: \S+", "  directory: " + work + "/state", text)
        config = os.path.join(work, "demo.yaml")
        open(config, "w").write(text)
        hogs = [subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"])
                for _ in range(os.cpu_count() or 2)]
        try:
            run = subprocess.run([args.vipsd, "--config", config], capture_output=True, text=True,
                                 timeout=400)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        log = run.stdout + run.stderr
        open(os.path.join(work, "demo.log"), "w").write(log)
        failures = []
        if run.returncode != 0:
            failures.append("exit status %d" % run.returncode)
        if "stopped: next_step=277" not in log:
            failures.append("did not stop at the ceiling after 276 steps")
        late = [l for l in log.splitlines()
                if "reported_at_slot=" in l or "finished after their release deadline" in l]
        if late:
            failures.append("%d line(s) of late slots, first: %s" % (len(late), late[0][:200]))
        read_late = [l for l in log.splitlines() if "were readable only after its cut" in l]
        if read_late:
            failures.append("records joined a later slot than their timestamp: %s"
                            % read_late[0][:200])
        status = json.load(open(os.path.join(work, "state", "status.json")))
        anchor = float(status["last_release_time"])
        published = [parse_ts(l) for l in log.splitlines() if "published release step-" in l]
        off = []
        for t in published:
            phase = (t - anchor) % interval
            if phase > PUBLISH_SLACK:
                off.append(round(phase, 3))
        if len(published) < 27:
            failures.append("only %d releases published" % len(published))
        if off:
            failures.append("%d of %d releases published off the public boundaries (phase s: %s)"
                            % (len(off), len(published), off[:8]))
        steps = len(re.findall(r"msg=\"step=\d+ slot=", log))
        print("demo beside %d busy loops: %d step lines, %d releases, late lines %d, "
              "records read late %d, publication phases after a boundary <= %.3f s"
              % (len(hogs), steps, len(published), len(late), len(read_late),
                 max(((t - anchor) % interval for t in published), default=0)))
        if failures:
            print("FAIL: " + "; ".join(failures))
            print("log kept in " + work)
            return 1
        shutil.rmtree(work, ignore_errors=True)
        return 0
    except BaseException:
        print("work directory kept: " + work)
        raise


if __name__ == "__main__":
    sys.exit(main())
