#!/usr/bin/env python3
"""Runs two vipsd binaries on the same inputs with fixed-seed noise and
compares everything they leave behind: releases, ledger, checkpoint,
metrics, log lines and exit codes. A refactoring that claims "no behaviour
change" (issue 25) is checked with it:

    scripts/compare_behaviour.py --base <git ref>      # builds that ref's vipsd
    scripts/compare_behaviour.py --base-binary PATH    # or compares with a binary

The current tree's binary is build/daemon/vipsd (--binary to change it).
Two runs, each once per binary, each in a fresh directory under out/compare:

  * offline: config/examples/lda_offline.yaml on the demo corpus (a JSON
    Lines file), 30 steps;
  * demo: config/examples/demo.yaml (in-process Kafka, the bundled corpus),
    ceiling lowered to 1.5 so that it halts after a few dozen steps, metrics
    scraped once it halted, then SIGTERM.

Both use privacy.noise: fixed_seed (--insecure-fixed-seed-noise), so that
the two binaries draw the same noise. What differs between any two runs of
one binary is masked before comparing: the run id (random per state
directory), checksums over it, wall-clock times (release timestamps, log
timestamps, the slot clock's anchor), slot numbers of the paced run (its
first slot depends on how long start-up took), the embedded cluster's port,
and log lines that report timing (deadline overruns, waiting for input).
Metrics: the series whose values follow from the inputs alone (steps, ε,
releases, records, dead letters), plus every metric's name, type and help.

Exit status 0 when everything compared is equal; 1 with the differences
listed otherwise; 2 for a usage or build error.
"""
import argparse
import difflib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Metrics whose values follow from the inputs alone (per series).
DETERMINISTIC_METRICS = [
    "vipsd_step", "vipsd_steps_total", "vipsd_step_size_rho",
    "vipsd_privacy_epsilon_spent", "vipsd_privacy_epsilon_ceiling",
    "vipsd_privacy_epsilon_remaining", "vipsd_privacy_delta", "vipsd_privacy_halted",
    "vipsd_privacy_budget_warning_level", "vipsd_privacy_accounting_mode",
    "vipsd_noise_multiplier", "vipsd_sampling_rate", "vipsd_pool_capacity",
    "vipsd_records_consumed_total", "vipsd_records_rejected_total",
    "vipsd_dead_letters_published_total", "vipsd_dead_letters_skipped_total",
    "vipsd_releases_published_total", "vipsd_last_release_step", "vipsd_release_bytes",
    "vipsd_checkpoint_writes_total", "vipsd_alerts_published_total", "vipsd_window_overflow",
]
# Log lines whose presence or numbers follow from how fast the machine ran.
TIMING_LINES = re.compile(
    r"finished after their release deadline|waiting for input|slots passed while vipsd|"
    r"observed the input's end offsets after|partitions (assigned|revoked)|"
    r"incrementally assigned|assigned \d+ partition|revoked \d+ partition|"
    r"epsilon ceiling reached|reload|a step on \d+ records .* took ")


def fail(message):
    print("compare_behaviour: " + message, file=sys.stderr)
    sys.exit(2)


def build_base(ref, work):
    source = os.path.join(work, "base-src")
    build = os.path.join(work, "base-build")
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", source],
                   stderr=subprocess.DEVNULL)
    shutil.rmtree(source, ignore_errors=True)
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", source, ref], check=True)
    launcher = []
    if shutil.which("ccache"):
        launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    env = dict(os.environ, CCACHE_BASEDIR=source, CCACHE_NOHASHDIR="1")
    subprocess.run(["cmake", "-S", source, "-B", build, "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DVIPSD_BUILD_BENCHMARKS=OFF"] + launcher,
                   check=True, stdout=subprocess.DEVNULL, env=env)
    print("== building %s's vipsd in %s" % (ref, build), flush=True)
    subprocess.run(["ninja", "-C", build, "vipsd"], check=True, env=env)
    return os.path.join(build, "daemon", "vipsd")


def example(name):
    with open(os.path.join(ROOT, "config", "examples", name)) as f:
        return f.read()


def set_key(text, key, value):
    """Replaces the value of the (unique) line `  key: ...` keeping its indentation."""
    pattern = re.compile(r"^(\s*)" + re.escape(key) + r":[^\n]*$", re.M)
    if not pattern.search(text):
        fail("no key %r in the example" % key)
    return pattern.sub(lambda m: m.group(1) + key + ": " + value, text, count=1)


def add_after(text, key, line):
    pattern = re.compile(r"^(\s*)" + re.escape(key) + r":[^\n]*$", re.M)
    m = pattern.search(text)
    if not m:
        fail("no key %r in the example" % key)
    return text[:m.end()] + "\n" + m.group(1) + line + text[m.end():]


def offline_config(directory):
    demo = os.path.join(ROOT, "config", "examples", "demo")
    text = example("lda_offline.yaml")
    text = set_key(text, "vocabulary", os.path.join(demo, "vocab.txt"))
    text = set_key(text, "path", os.path.join(demo, "corpus.jsonl"))
    text = set_key(text, "noise", "fixed_seed")
    text = add_after(text, "noise", "noise_seed: 11")
    text = set_key(text, "max_steps", "30")
    text = set_key(text, "sampling_rate", "0.05")
    return text


def demo_config(directory, port):
    demo = os.path.join(ROOT, "config", "examples", "demo")
    text = example("demo.yaml")
    text = set_key(text, "vocabulary", os.path.join(demo, "vocab.txt"))
    text = set_key(text, "demo_corpus", os.path.join(demo, "corpus.jsonl"))
    text = set_key(text, "mirror_directory", "releases")
    text = set_key(text, "directory", "state")
    text = set_key(text, "epsilon_ceiling", "1.5")
    text = set_key(text, "on_ceiling", "halt")
    text = add_after(text, "on_ceiling", "noise: fixed_seed")
    text = add_after(text, "on_ceiling", "noise_seed: 11")
    text = set_key(text, "listen", "127.0.0.1:%d" % port)
    return text


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def metric_value(text, name):
    for line in (text or "").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def run(binary, kind, work):
    directory = os.path.join(work, kind)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    port = free_port()
    config = os.path.join(directory, "vipsd.yaml")
    with open(config, "w") as f:
        f.write(offline_config(directory) if kind == "offline" else demo_config(directory, port))
    log = open(os.path.join(directory, "stderr.log"), "w")
    out = open(os.path.join(directory, "stdout.log"), "w")
    proc = subprocess.Popen([binary, "--config", config, "--insecure-fixed-seed-noise"],
                            cwd=directory, stdout=out, stderr=log)
    metrics = None
    if kind == "demo":
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            text = scrape(port)
            if metric_value(text, "vipsd_privacy_halted") == 1.0:
                time.sleep(1.0)  # the halting slot's outputs are out
                metrics = scrape(port)
                break
            time.sleep(0.25)
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=300)
    log.close()
    out.close()
    return {"directory": directory, "exit": code, "metrics": metrics}


def normalise_log(path, paced):
    lines = []
    with open(path, errors="replace") as f:
        for line in f:
            m = re.search(r'msg="(.*)"\s*$', line)
            text = m.group(1) if m else line.rstrip("\n")
            if TIMING_LINES.search(text):
                continue
            text = re.sub(r"[0-9a-f]{32}", "<run>", text)
            text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
            text = re.sub(r"localhost:\d+", "localhost:<port>", text)
            text = re.sub(r"/[^\s\"']*/out/compare/(base|head)/", "<dir>/", text)
            if paced:
                text = re.sub(r"\bslot[= ]\d+", "slot <n>", text)
                text = re.sub(r"committed_at_slot=\d+", "committed_at_slot=<n>", text)
            lines.append(text)
    return lines


def normalise_ledger(text, paced):
    text = re.sub(r"^run [0-9a-f]{32}$", "run <run>", text, flags=re.M)
    text = re.sub(r"^blake2b [0-9a-f]{64}$", "blake2b <checksum>", text, flags=re.M)
    if paced:
        # The slot clock's anchor and the per-slot cuts follow wall time.
        text = re.sub(r"section slot-windows \d+\n(.*?)(?=section )", "section slot-windows <masked>\n",
                      text, flags=re.S)
    return text


def normalise_checkpoint(data):
    data = re.sub(rb"^run [0-9a-f]{32}$", b"run <run>", data, flags=re.M)
    return re.sub(rb"\nblake2b [0-9a-f]{64}\n$", b"\nblake2b <checksum>\n", data)


def normalise_manifest(text):
    text = re.sub(r'"created_at_utc": "[^"]*"', '"created_at_utc": "<time>"', text)
    return text


def release_files(directory):
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "releases", "*", "*"))):
        name = os.path.relpath(path, os.path.join(directory, "releases"))
        with open(path, "rb") as f:
            data = f.read()
        if name.endswith("manifest.json"):
            data = normalise_manifest(data.decode()).encode()
        out[name] = data
    return out


def deterministic_metrics(text):
    if text is None:
        return ["<no scrape>"]
    out = []
    for line in text.splitlines():
        if line.startswith("# HELP vipsd_") or line.startswith("# TYPE vipsd_"):
            out.append(line)
            continue
        name = re.split(r"[{ ]", line, 1)[0]
        if name in DETERMINISTIC_METRICS:
            out.append(line)
    return out


def compare(base, head, kind, differences):
    paced = kind == "demo"
    def same(what, a, b):
        if a != b:
            if isinstance(a, list):
                diff = "\n".join(difflib.unified_diff(a, b, "base", "head", lineterm="", n=1))
            else:
                diff = "differ"
            differences.append("%s %s:\n%s" % (kind, what, diff[:4000]))
            return False
        return True
    same("exit code", base["exit"], head["exit"])
    a = release_files(base["directory"])
    b = release_files(head["directory"])
    same("release file names", sorted(a), sorted(b))
    for name in sorted(set(a) & set(b)):
        same("release " + name, a[name], b[name])
    for what, read in (("ledger", lambda p: normalise_ledger(open(p).read(), paced).splitlines()),
                       ("checkpoint", lambda p: normalise_checkpoint(open(p, "rb").read()))):
        pa = os.path.join(base["directory"], "state", what)
        pb = os.path.join(head["directory"], "state", what)
        if os.path.exists(pa) != os.path.exists(pb):
            differences.append("%s %s: exists in one run only" % (kind, what))
        elif os.path.exists(pa):
            same(what, read(pa), read(pb))
    same("log lines", normalise_log(os.path.join(base["directory"], "stderr.log"), paced),
         normalise_log(os.path.join(head["directory"], "stderr.log"), paced))
    if paced:
        same("metrics", deterministic_metrics(base["metrics"]), deterministic_metrics(head["metrics"]))
    return len(a)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="git ref whose vipsd is the baseline (built here)")
    parser.add_argument("--base-binary", help="a baseline vipsd binary instead of --base")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "daemon", "vipsd"))
    parser.add_argument("--work", default=os.path.join(ROOT, "out", "compare"))
    args = parser.parse_args()
    if bool(args.base) == bool(args.base_binary):
        fail("give exactly one of --base and --base-binary")
    os.makedirs(args.work, exist_ok=True)
    base_binary = os.path.abspath(args.base_binary or build_base(args.base, args.work))
    args.binary = os.path.abspath(args.binary)
    for binary in (base_binary, args.binary):
        if not os.access(binary, os.X_OK):
            fail("no executable " + binary)
    differences = []
    for kind in ("offline", "demo"):
        print("== %s run: baseline" % kind, flush=True)
        base = run(base_binary, kind, os.path.join(args.work, "base"))
        print("== %s run: this tree" % kind, flush=True)
        head = run(args.binary, kind, os.path.join(args.work, "head"))
        releases = compare(base, head, kind, differences)
        print("   %s: exit %s / %s, %d release files, %s" %
              (kind, base["exit"], head["exit"], releases,
               "metrics scraped" if base["metrics"] and head["metrics"] else "no metrics"))
    if differences:
        print("DIFFERENT:\n" + "\n\n".join(differences))
        return 1
    print("SAME: releases, ledger, checkpoint, metrics, log lines and exit codes of both runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
