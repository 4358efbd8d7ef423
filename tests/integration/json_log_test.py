#!/usr/bin/env python3
"""With log.format: json, every line vipsd writes to stderr is one JSON
object — warnings included, from the first line on (issue 29): a log
shipper that expects JSON lines rejects anything else.

Runs each binary that starts from a configuration with one that produces
warnings (privacy.delta above 1e-3, an epsilon ceiling above 10), in JSON
log format, and parses every stderr line:
  * vipsd --check-config (valid: warnings only),
  * vipsd --check-config on a configuration a start refuses (an error line;
    a file that does not parse is reported in plain text: the format it
    asks for is not known then),
  * vipsd on the offline example (a short run: start, steps, stop),
  * vipsd on the embedded demo until its first steps, then SIGTERM,
  * vipsd-privacy plan --config.
Usage: json_log_test.py VIPSD VIPSD_PRIVACY SOURCE_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def check_lines(what, stderr, expect_warning=True):
    lines = stderr.splitlines()
    if not lines:
        raise SystemExit("FAIL %s: nothing on stderr" % what)
    levels = []
    for n, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise SystemExit("FAIL %s: stderr line %d is not JSON: %r" % (what, n, line[:200]))
        if not isinstance(entry, dict) or not {"ts", "level", "component", "msg"} <= set(entry):
            raise SystemExit("FAIL %s: stderr line %d lacks ts/level/component/msg: %r" %
                             (what, n, line[:200]))
        levels.append(entry["level"])
    if expect_warning and not any("warning:" in json.loads(l)["msg"] for l in lines):
        raise SystemExit("FAIL %s: no configuration warning among %d lines" % (what, len(lines)))
    print("ok %s: %d JSON lines (%s)" % (what, len(lines), ", ".join(sorted(set(levels)))))


def with_json(text):
    text = text.replace("  delta: 1.0e-5", "  delta: 0.01")  # a warning: delta above 1e-3
    if "\nlog:\n" in text:
        return text.replace("\nlog:\n", "\nlog:\n  format: json\n")
    return text + "log:\n  format: json\n"


def main():
    vipsd, privacy, source = (os.path.abspath(a) for a in sys.argv[1:4])
    work = tempfile.mkdtemp(prefix="vipsd-json-log-")
    try:
        demo_dir = os.path.join(source, "config", "examples", "demo")
        with open(os.path.join(source, "config", "examples", "lda_offline.yaml")) as f:
            offline = f.read()
        offline = offline.replace("demo/vocab.txt", os.path.join(demo_dir, "vocab.txt"))
        offline = offline.replace("path: train.jsonl", "path: " + os.path.join(demo_dir, "corpus.jsonl"))
        offline = offline.replace("max_steps: 0 ", "max_steps: 3 ")
        offline = offline.replace("epsilon_ceiling: 3.0", "epsilon_ceiling: 20")  # a warning too
        path = os.path.join(work, "offline.yaml")
        with open(path, "w") as f:
            f.write(with_json(offline))

        run = subprocess.run([vipsd, "--config", path, "--check-config"], capture_output=True,
                             text=True, timeout=120)
        if run.returncode != 0:
            raise SystemExit("FAIL --check-config: exit %d\n%s" % (run.returncode, run.stderr))
        check_lines("vipsd --check-config", run.stderr)

        refused = os.path.join(work, "refused.yaml")
        with open(refused, "w") as f:
            # Parses, but a start refuses it (no vocabulary file): an error line.
            f.write(with_json(offline).replace(os.path.join(demo_dir, "vocab.txt"),
                                               os.path.join(work, "missing.txt")))
        run = subprocess.run([vipsd, "--config", refused, "--check-config"], capture_output=True,
                             text=True, timeout=120)
        if run.returncode != 2:
            raise SystemExit("FAIL refused --check-config: exit %d\n%s" % (run.returncode, run.stderr))
        check_lines("vipsd --check-config (refused)", run.stderr)

        run = subprocess.run([vipsd, "--config", path], capture_output=True, text=True,
                             timeout=600, cwd=work)
        if run.returncode != 0:
            raise SystemExit("FAIL offline run: exit %d\n%s" % (run.returncode, run.stderr))
        check_lines("vipsd offline run", run.stderr)

        with open(os.path.join(source, "config", "examples", "demo.yaml")) as f:
            demo = f.read()
        demo = demo.replace("demo/vocab.txt", os.path.join(demo_dir, "vocab.txt"))
        demo = demo.replace("demo/corpus.jsonl", os.path.join(demo_dir, "corpus.jsonl"))
        demo = demo.replace("../../out/demo/releases", os.path.join(work, "demo-releases"))
        demo = demo.replace("../../out/demo/state", os.path.join(work, "demo-state"))
        demo_path = os.path.join(work, "demo.yaml")
        with open(demo_path, "w") as f:
            f.write(with_json(demo))
        err_path = os.path.join(work, "demo.stderr")
        with open(err_path, "w") as err:
            proc = subprocess.Popen([vipsd, "--config", demo_path], stdout=subprocess.DEVNULL,
                                    stderr=err, cwd=work)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                with open(err_path) as f:
                    if "step=3 " in f.read():
                        break
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        with open(err_path) as f:
            stderr = f.read()
        if "step=3 " not in stderr:
            raise SystemExit("FAIL demo: no third step within 120 s\n" + stderr[-3000:])
        check_lines("vipsd embedded demo", stderr)

        run = subprocess.run([privacy, "plan", "--config", path, "--json"], capture_output=True,
                             text=True, timeout=120)
        check_lines("vipsd-privacy plan --config", run.stderr)
        answer = json.loads(run.stdout)
        for key in ("steps_to_ceiling", "steps", "max_steps"):
            if not isinstance(answer.get(key), int) or answer[key] != answer["steps_to_ceiling"]:
                raise SystemExit("FAIL plan --json: %s missing or different: %s" % (key, run.stdout))
        print("ok vipsd-privacy plan --json: steps_to_ceiling %d" % answer["steps_to_ceiling"])
        print("PASS")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
