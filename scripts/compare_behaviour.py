#!/usr/bin/env python3
"""Runs two vipsd binaries on the same inputs with fixed-seed noise and
compares everything they leave behind: releases, ledger, checkpoint,
metrics, log lines and exit codes. A refactoring that claims "no behaviour
change" (issue 25) is checked with it:

    scripts/compare_behaviour.py --base <git ref>      # builds that ref's vipsd
    scripts/compare_behaviour.py --base-binary PATH    # or compares with a binary

The current tree's binary is build/daemon/vipsd (--binary to change it),
the mock cluster build/tools/vipsd-mock-kafka (--mock-kafka). Four runs
(--runs to choose), each once per binary, each in a fresh directory under
out/compare:

  * offline: config/examples/lda_offline.yaml on the demo corpus (a JSON
    Lines file), 30 steps;
  * demo: config/examples/demo.yaml (in-process Kafka, the bundled corpus),
    ceiling lowered to 1.5 so that it halts after a few dozen steps, metrics
    scraped once it halted, then SIGTERM.

  * shared: a shared-work job (state.work_topic) on a vipsd-mock-kafka
    cluster of its own: a worker holding all six input partitions and a
    coordinator that reads none (state.work_partitions: false), 6 steps;
  * federated: an aggregator and two holders (federation.role), each holder
    reading its own topic, 5 rounds; every round needs both holders
    (tolerated_holders 1), so a round that misses one shows as a
    difference.

All use privacy.noise: fixed_seed (--insecure-fixed-seed-noise), so that
the two binaries draw the same noise (a federated holder's key pair is new
in each run; the pads cancel in the sum, so the releases do not depend on
it). What differs between any two runs of
one binary is masked before comparing: the run id (random per state
directory), checksums over it, wall-clock times (release timestamps, log
timestamps, the slot clock's anchor), slot numbers of the paced run (its
first slot depends on how long start-up took), the embedded cluster's port,
how many holders had joined by an aggregator's first slot (the consumer
group's join delay against the slot grid), and log lines that report
timing (deadline overruns, waiting for input).
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
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
import harness  # noqa: E402  (vipsd-mock-kafka as a child process)

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


MULTI_PROCESS_MODEL = """model:
  type: lda
  lda:
    topics: 3
    vocabulary: %(vocab)s
    alpha: 0.1
    eta: 0.01
    resample_length: 10
privacy:
  noise_multiplier: 1.0
  sampling_rate: 0.2
  delta: 1.0e-5
  epsilon_ceiling: 1000
  noise: fixed_seed
  noise_seed: 7
schedule:
  threads: 2
  interval_seconds: %(interval)s
  start_delay_seconds: 0
  on_overrun: catch_up
  window_steps: 1000000000
%(schedule)spool:
  capacity: 10000
source:
  type: kafka
%(topics)s  group_id: %(group)s
  timestamps: create_time
sink:
  type: kafka
  topic: releases
  publish_every: 1
%(sink)sdead_letter:
  topic: dead
kafka:
  bootstrap_servers: "%(bootstrap)s"
  consumer_properties:
    session.timeout.ms: "6000"
    heartbeat.interval.ms: "500"
state:
  directory: state
%(state)smetrics:
  listen: ""
%(federation)s"""


def multi_process_config(directory, **values):
    os.makedirs(directory, exist_ok=True)
    fields = {"vocab": os.path.join(ROOT, "config", "examples", "demo", "vocab.txt"),
              "interval": "1.0", "schedule": "", "topics": "", "sink": "", "state": "",
              "federation": ""}
    fields.update(values)
    path = os.path.join(directory, "vipsd.yaml")
    with open(path, "w") as f:
        f.write(MULTI_PROCESS_MODEL % fields)
    return path


def produce(bootstrap, topic, lines, work):
    """Keyed lines into `topic` with kcat (an independent client)."""
    path = os.path.join(work, topic + ".input")
    with open(path, "w") as f:
        for i, line in enumerate(lines):
            f.write("k%d\t%s\n" % (i, line))
    result = subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-l", path],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        fail("kcat: " + result.stderr[-300:])


def demo_lines(count):
    with open(os.path.join(ROOT, "config", "examples", "demo", "corpus.jsonl")) as f:
        return [line.rstrip("\n") for line in f][:count]


class Member:
    """One vipsd process of a multi-process run, its stderr in DIR/stderr.log."""

    def __init__(self, binary, directory, config, extra=()):
        self.directory = directory
        self.log = open(os.path.join(directory, "stderr.log"), "w")
        self.proc = subprocess.Popen([binary, "--config", config, "--insecure-fixed-seed-noise",
                                      *extra], cwd=directory, stdout=self.log, stderr=self.log)

    def finish(self, sig=None, timeout=180):
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code


def run_shared(binary, mock_kafka, directory):
    """A worker holding every input partition and a coordinator that reads
    none: the coordinator's releases come from the worker's partial sums."""
    kafka = harness.MockKafka(mock_kafka, 1, [("docs", 6), ("releases", 1), ("dead", 1),
                                              ("ledger", 1), ("work", 2)])
    try:
        produce(kafka.bootstrap, "docs", demo_lines(600), directory)
        group = "compare-shared-%d" % os.getpid()
        shared = "  ledger_topic: ledger\n  ledger_key: job\n  work_topic: work\n"
        worker_dir = os.path.join(directory, "worker")
        worker = Member(binary, worker_dir, multi_process_config(
            worker_dir, topics="  topics: [docs]\n", group=group, bootstrap=kafka.bootstrap,
            state=shared + "  standby_takeover_seconds: 600\n"), ["--instance-id", "w1"])
        time.sleep(1.0)
        coordinator_dir = os.path.join(directory, "coordinator")
        coordinator = Member(binary, coordinator_dir, multi_process_config(
            coordinator_dir, topics="  topics: [docs]\n", group=group,
            bootstrap=kafka.bootstrap, schedule="  release_delay_seconds: 0.5\n  max_steps: 6\n",
            sink="  mirror_directory: releases\n", state=shared + "  work_partitions: false\n"),
            ["--instance-id", "c"])
        code = coordinator.finish(timeout=300)
        worker_code = worker.finish(signal.SIGTERM, 60)
    finally:
        kafka.close()
    return {"directory": coordinator_dir, "exit": (code, worker_code), "metrics": None}


def run_federated(binary, mock_kafka, directory):
    """An aggregator and two holders, each holder on its own topic."""
    ids = ["h1", "h2"]
    kafka = harness.MockKafka(mock_kafka, 1, [("h1docs", 2), ("h2docs", 2), ("releases", 1),
                                              ("dead", 1), ("fedledger", 1), ("fedwork", 2)])
    try:
        lines = demo_lines(400)
        roster = "  holders:\n"
        for h, holder in enumerate(ids):
            produce(kafka.bootstrap, holder + "docs", lines[h::2], directory)
            key = os.path.join(directory, holder + ".key")
            result = subprocess.run([binary, "federation-keygen", "--out", key],
                                    capture_output=True, text=True, timeout=60)
            if result.returncode != 0:
                fail("federation-keygen: " + result.stderr[-300:])
            roster += "    %s: %s\n" % (holder, result.stdout.split()[0])
        common = "  tolerated_holders: 1\n  round_timeout_seconds: 5\n"
        aggregator_dir = os.path.join(directory, "aggregator")
        aggregator = Member(binary, aggregator_dir, multi_process_config(
            aggregator_dir, interval="2.0", group="compare-aggregator-%d" % os.getpid(),
            bootstrap=kafka.bootstrap, schedule="  release_delay_seconds: 1.8\n  max_steps: 5\n",
            sink="  mirror_directory: releases\n",
            state="  ledger_topic: fedledger\n  ledger_key: fedjob\n  work_topic: fedwork\n",
            federation="federation:\n  role: aggregator\n" + common + roster))
        holders = []
        for holder in ids:
            holder_dir = os.path.join(directory, holder)
            holders.append(Member(binary, holder_dir, multi_process_config(
                holder_dir, interval="2.0", topics="  topics: [%sdocs]\n" % holder,
                group="compare-%s-%d" % (holder, os.getpid()), bootstrap=kafka.bootstrap,
                state="  ledger_key: fedjob\n  work_topic: fedwork\n",
                federation="federation:\n  role: holder\n  holder_id: %s\n  secret_key: "
                           "{file: %s}\n  share_delay_seconds: 1.5\n" %
                           (holder, os.path.join(directory, holder + ".key")) + common + roster)))
        code = aggregator.finish(timeout=300)
        holder_codes = tuple(member.finish(signal.SIGTERM, 60) for member in holders)
    finally:
        kafka.close()
    return {"directory": aggregator_dir, "exit": (code,) + holder_codes, "metrics": None,
            "holders": [os.path.join(directory, holder) for holder in ids]}


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


def run(binary, kind, work, mock_kafka):
    directory = os.path.join(work, kind)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    if kind == "shared":
        return run_shared(binary, mock_kafka, directory)
    if kind == "federated":
        return run_federated(binary, mock_kafka, directory)
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
                # How many holders joined before the aggregator's first slot
                # follows the consumer group's join delay against the slot
                # grid (a race of tenths of a second), not the code.
                text = re.sub(r"no round: \d+ holder\(s\) ready", "no round: <n> holder(s) ready",
                              text)
            lines.append(text)
    return lines


def normalise_ledger(text, paced):
    text = re.sub(r"^run [0-9a-f]{32}$", "run <run>", text, flags=re.M)
    text = re.sub(r"\b[0-9a-f]{32}\b", "<run>", text)  # a holder's aggregator run
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
    paced = kind != "offline"
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
    for a_holder, b_holder in zip(base.get("holders", []), head.get("holders", [])):
        name = os.path.basename(a_holder)
        same(name + " ledger",
             normalise_ledger(open(os.path.join(a_holder, "state", "ledger")).read(),
                              True).splitlines(),
             normalise_ledger(open(os.path.join(b_holder, "state", "ledger")).read(),
                              True).splitlines())
    if paced:
        same("metrics", deterministic_metrics(base["metrics"]), deterministic_metrics(head["metrics"]))
    return len(a)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="git ref whose vipsd is the baseline (built here)")
    parser.add_argument("--base-binary", help="a baseline vipsd binary instead of --base")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "daemon", "vipsd"))
    parser.add_argument("--work", default=os.path.join(ROOT, "out", "compare"))
    parser.add_argument("--mock-kafka",
                        default=os.path.join(ROOT, "build", "tools", "vipsd-mock-kafka"))
    parser.add_argument("--runs", default="offline,demo,shared,federated",
                        help="which runs, comma-separated (default: all four)")
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
    kinds = [kind for kind in args.runs.split(",") if kind]
    for kind in kinds:
        if kind not in ("offline", "demo", "shared", "federated"):
            fail("unknown run %r (offline, demo, shared, federated)" % kind)
    if ({"shared", "federated"} & set(kinds)) and not os.access(args.mock_kafka, os.X_OK):
        fail("no executable " + args.mock_kafka)
    for kind in kinds:
        print("== %s run: baseline" % kind, flush=True)
        base = run(base_binary, kind, os.path.join(args.work, "base"), args.mock_kafka)
        print("== %s run: this tree" % kind, flush=True)
        head = run(args.binary, kind, os.path.join(args.work, "head"), args.mock_kafka)
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
