#!/usr/bin/env python3
"""Shared work (issue 16, state.work_topic): steps/s and records/s of one LDA
job run by 1, 2 and 3 vipsd processes against the same stream, with each
process's CPU time, against a solo daemon (no work topic) in the same
session.

Every run gets a fresh vipsd-mock-kafka (another process) with a 6-partition
input topic holding the first --docs records of the corpus (lz4-compressed:
the mock keeps ~5 MiB per partition). The daemons step as fast as they can
(schedule.interval_seconds far below a step's time: every slot is late), with
window_steps: 1000000000 (longer than the run; all is refused
for a private stream), so every step samples q of all --docs records. Workers
start first (they wait for the coordinator's first plan), the coordinator
last; it stops at --steps, then the workers get SIGTERM. Measured:

  steps/s        from the coordinator's step lines over the second half of
                 the run (after the consumer-group joins, the first
                 rebalances and the initial read)
  partials       partial sums the coordinator merged in that half, computed
                 by itself / by workers
  records/s      candidates scanned per second (steps/s x docs) and records
                 E-stepped per second (x q)
  CPU            user+system seconds of each process over its whole run
                 (os.wait4), and per step
  phases         median milliseconds per step of each phase of the
                 coordinator's step thread (metrics.expose_step_timing puts
                 phase_ms= on its step lines: charge, sample, estep, noise,
                 mstep alone; charge, plan, own, wait, merge, noise, mstep
                 shared; commit, the ledger commit, for both) and of the
                 workers (ahead, adopt, sum, append), over the second half; the
                 coordinator's serial time is every phase but own and wait

Prints one JSON object per configuration and a summary table. Wrap it in
`flock /tmp/vipsd-cpu.lock` on a shared machine.

Usage: shared_work_bench.py --vipsd BIN --mock-kafka BIN [--corpus JSONL]
       [--vocab FILE] [--docs N] [--vocab-size V] [--topics K] [--steps N]
       [--q Q] [--partitions P] [--fetch-wait-ms MS] [--interval-seconds S]
       [--configs solo:2,1:2,2:1,3:1] [--keep]
A configuration is PROCESSES:THREADS ("solo" = one process without
state.work_topic; PROCESSESc: the coordinator, one of the PROCESSES, reads
no partition, state.work_partitions: false; PROCESSES:THREADS+C: the
coordinator runs C threads, the others THREADS — its noise draw bounds a
step at Wikipedia scale, bench/README.md).
"""
import argparse
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "harness"))
import harness  # noqa: E402


@functools.lru_cache(maxsize=None)
def known_keys(binary):
    """The (section, key) pairs of `binary`'s reference configuration, or
    None when it prints none (then nothing is left out)."""
    result = subprocess.run([binary, "--print-reference-config"], capture_output=True,
                            text=True, timeout=60)
    if result.returncode != 0 or "\nschedule:" not in "\n" + result.stdout:
        return None
    reference = result.stdout
    keys, section = set(), None
    for line in reference.splitlines():
        m = re.match(r"([a-z_]+):", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"  ([a-z_]+):", line)
        if m and section:
            keys.add((section, m.group(1)))
    return frozenset(keys)


def for_build(binary, text):
    """`text` without the section keys that `binary` does not know: a build
    from before them (a before/after comparison, bench/shared_work_compare.py)
    refuses an unknown key, and runs with what it did before the key
    existed (here source.timestamps, schedule.start_delay_seconds and
    state.work_partitions can be missing from an old build)."""
    known = known_keys(binary)
    if known is None:
        return text
    kept, section = [], None
    for line in text.splitlines(keepends=True):
        m = re.match(r"([a-z_]+):", line)
        if m:
            section = m.group(1)
        m = re.match(r"  ([a-z_]+):", line)
        if m and (section, m.group(1)) not in known:
            continue
        kept.append(line)
    return "".join(kept)


@functools.lru_cache(maxsize=None)
def step_check_flag(binary):
    """("--no-step-time-check",) where `binary` has the start-up step-time
    check (every slot here is meant to be late), else () (a build from
    before that check, for a before/after comparison)."""
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    return ("--no-step-time-check",) if "--no-step-time-check" in (
        help_text.stdout + help_text.stderr) else ()


def write_config(directory, bootstrap, group, vocab, args, threads, shared, coordinator,
                 reads_partitions=True):
    os.makedirs(directory, exist_ok=True)
    state = "state:\n  directory: state\n"
    if shared:
        state += "  ledger_topic: ledger\n  ledger_key: job\n  work_topic: work\n"
        if not coordinator:
            state += "  standby_takeover_seconds: 600\n"
        elif not reads_partitions:
            state += "  work_partitions: false\n"
    consumer = ""
    if args.fetch_wait_ms is not None:
        # The mock cluster holds an empty fetch for fetch.wait.max.ms even
        # when a message arrives meanwhile (a real broker answers at once).
        consumer = '    fetch.wait.max.ms: "%d"\n' % args.fetch_wait_ms
    config = os.path.join(directory, "vipsd.yaml")
    with open(config, "w") as f:
        f.write(for_build(args.vipsd, """model:
  type: lda
  lda:
    topics: %d
    vocabulary: %s
    alpha: 0.1
    eta: 0.01
privacy:
  noise_multiplier: 1.0
  sampling_rate: %s
  delta: 1.0e-5
  epsilon_ceiling: 100000
schedule:
  threads: %d
  interval_seconds: %s
  start_delay_seconds: 0
  on_overrun: catch_up
  release_delay_seconds: 0
  window_steps: 1000000000
  max_steps: %d
pool:
  capacity: %d
source:
  type: kafka
  topics: [docs]
  group_id: %s
  timestamps: create_time
sink:
  type: kafka
  topic: releases
  publish_every: 1000000
dead_letter:
  topic: dead
kafka:
  bootstrap_servers: "%s"
  consumer_properties:
    session.timeout.ms: "6000"
    heartbeat.interval.ms: "500"
%s%smetrics:
  listen: ""
  expose_step_timing: true
log:
  level: info
""" % (args.topics, vocab, args.q, threads, args.interval_seconds, args.steps,
           args.docs * 2, group, bootstrap, consumer, state)))
    return config


class Process:
    def __init__(self, binary, config, log_path):
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen([binary, "--config", config, *step_check_flag(binary)],
                                     stdout=self.log, stderr=self.log)

    def finish(self, sig=None, timeout=600):
        """Waits for the process (after `sig`); returns (exit status, CPU s)."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid == self.proc.pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.log.close()
                return self.proc.returncode, usage.ru_utime + usage.ru_stime
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("%s did not exit" % self.log_path)


def step_times(log_path):
    times = {}
    with open(log_path) as f:
        for line in f:
            m = re.search(r'ts=(\S+) .*msg="step=(\d+) ', line)
            if m:
                t = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S"))
                times[int(m.group(2))] = t + float("0" + m.group(1)[19:-1])
    return times


def phase_medians(log_paths, first):
    """Median ms of each phase over the steps after `first`, from the
    phase_ms= of the coordinator's step lines and the workers' lines."""
    values = {}
    for path in log_paths:
        with open(path) as f:
            for line in f:
                m = re.search(r'msg="step[= ](\d+)[ :].*phase_ms=([a-z:0-9.,]+)', line)
                if not m or int(m.group(1)) <= first:
                    continue
                for item in m.group(2).split(","):
                    name, ms = item.split(":")
                    values.setdefault(name, []).append(float(ms))
    return {name: round(statistics.median(v), 1) for name, v in values.items()}


def run(args, corpus_path, vocab, processes, threads, shared, work, coordinator_reads=True,
        coordinator_threads=None):
    kafka = harness.MockKafka(args.mock_kafka, 1, [("docs", args.partitions), ("releases", 1),
                                                   ("dead", 1), ("ledger", 1), ("work", 2)])
    try:
        # Keyed records: the key hash spreads them evenly over the partitions
        # (unkeyed, librdkafka's sticky partitioner fills one partition per
        # batch, and the slowest partition decides a shared step's time).
        result = subprocess.run(["kcat", "-P", "-b", kafka.bootstrap, "-t", "docs", "-z", "lz4",
                                 "-K", "\t", "-l", corpus_path], capture_output=True,
                                timeout=600)
        if result.returncode != 0:
            raise RuntimeError("kcat: %s" % result.stderr[-300:])
        group = "bench-%d-%d" % (os.getpid(), int(time.time() * 1000))
        members = []
        for i in range(processes):
            coordinator = i == processes - 1
            directory = os.path.join(work, "p%d" % i)
            own_threads = coordinator_threads if coordinator and coordinator_threads else threads
            config = write_config(directory, kafka.bootstrap, group, vocab, args, own_threads,
                                  shared, coordinator, coordinator_reads)
            members.append(Process(args.vipsd, config, os.path.join(work, "p%d.log" % i)))
            if not coordinator:
                time.sleep(0.5)
        start = time.monotonic()
        code, coordinator_cpu = members[-1].finish()
        wall = time.monotonic() - start
        if code != 0:
            raise RuntimeError("the coordinator exited with %r:\n%s" %
                               (code, open(members[-1].log_path).read()[-3000:]))
        cpus = []
        for member in members[:-1]:
            _, cpu = member.finish(signal.SIGTERM, 60)
            cpus.append(cpu)
        cpus.append(coordinator_cpu)
        times = step_times(members[-1].log_path)
        # The second half of the run: after the group joins, the first
        # rebalances and the initial read.
        first, last = max(3, args.steps // 2), args.steps
        local = remote = 0
        with open(members[-1].log_path) as f:
            for line in f:
                m = re.search(r'msg="step=(\d+) .*partials=(\d+)\+(\d+)', line)
                if m and int(m.group(1)) > first:
                    local += int(m.group(2))
                    remote += int(m.group(3))
        if first not in times or last not in times:
            # Step lines are info level; the bench runs at warning: use the
            # ledger's commit count instead.
            raise RuntimeError("no step lines in %s" % members[-1].log_path)
        steps_per_second = (last - first) / (times[last] - times[first])
        coordinator_phases = phase_medians([members[-1].log_path], first)
        worker_phases = phase_medians([m.log_path for m in members[:-1]], first)
        serial = sum(v for k, v in coordinator_phases.items() if k not in ("own", "wait", "sample",
                                                                             "estep"))
        return {
            "config": "solo" if not shared else "%d process(es)%s%s" % (
                processes, "" if coordinator_reads else ", coordinator reads none",
                ", coordinator %d threads" % coordinator_threads if coordinator_threads else ""),
            "processes": processes, "threads_each": threads, "shared": shared,
            "coordinator_threads": coordinator_threads or threads,
            "steps_per_second": round(steps_per_second, 3),
            "candidates_per_second": round(steps_per_second * args.docs),
            "records_estepped_per_second": round(steps_per_second * args.docs * args.q),
            "cpu_seconds": [round(c, 2) for c in cpus],
            "cpu_seconds_total": round(sum(cpus), 2),
            "wall_seconds": round(wall, 1),
            "partials_local_remote": [local, remote],
            "step_ms": round(1000 / steps_per_second, 1),
            "coordinator_phase_ms": coordinator_phases,
            "worker_phase_ms": worker_phases,
            "coordinator_serial_ms": round(serial, 1),
        }
    finally:
        kafka.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--mock-kafka", required=True)
    parser.add_argument("--corpus", default="out/wikipedia/train.jsonl")
    parser.add_argument("--vocab", default="out/wikipedia/vocab.txt")
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--q", type=float, default=0.1)
    parser.add_argument("--partitions", type=int, default=6,
                        help="partitions of the input topic")
    parser.add_argument("--fetch-wait-ms", type=int, default=None,
                        help="kafka.consumer_properties fetch.wait.max.ms of every process")
    parser.add_argument("--configs", default="solo:2,1:2,2:1,3:1")
    parser.add_argument("--interval-seconds", default="0.05",
                        help="schedule.interval_seconds (every slot is late; a step late "
                        "twice in a row waits for the next slot boundary, up to this long)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run directory (configs and every process's log) and "
                        "print where it is")
    args = parser.parse_args()
    args.vipsd = os.path.abspath(args.vipsd)
    args.mock_kafka = os.path.abspath(args.mock_kafka)
    work = tempfile.mkdtemp(prefix="vipsd-shared-bench-")
    try:
        corpus_path = os.path.join(work, "corpus.jsonl")
        with open(args.corpus) as src, open(corpus_path, "w") as dst:
            for i, line in enumerate(src):
                if i >= args.docs:
                    break
                dst.write("k%d\t%s" % (i, line))
        vocab = os.path.join(work, "vocab.txt")
        with open(args.vocab) as src, open(vocab, "w") as dst:
            for i, line in enumerate(src):
                if i >= args.vocab_size:
                    break
                dst.write(line)
        rows = []
        for item in args.configs.split(","):
            name, threads = item.split(":")
            threads, _, coordinator_threads = threads.partition("+")
            shared = name != "solo"
            if coordinator_threads and not shared:
                parser.error("%s: +C (the coordinator's threads) needs a shared configuration"
                             % item)
            coordinator_reads = not name.endswith("c")
            processes = 1 if not shared else int(name.rstrip("c"))
            run_dir = os.path.join(work, "%d-%s" % (len(rows),
                                                    item.replace(":", "-").replace("+", "-c")))
            os.makedirs(run_dir)
            row = run(args, corpus_path, vocab, processes, int(threads), shared, run_dir,
                      coordinator_reads, int(coordinator_threads) if coordinator_threads else None)
            row.update(docs=args.docs, topics=args.topics, vocab_size=args.vocab_size, q=args.q)
            print(json.dumps(row), flush=True)
            rows.append(row)
        base = rows[0]["steps_per_second"]
        print("\n| configuration | threads each | steps/s | x first | records E-stepped/s | "
              "partials local + remote | CPU s per process (coordinator last) | "
              "coordinator serial ms/step (% of step) |")
        print("|---|---|---|---|---|---|---|---|")
        for row in rows:
            print("| %s | %d | %.3f | %.2f | %d | %d + %d | %s | %.1f (%.0f %%) |" % (
                row["config"], row["threads_each"], row["steps_per_second"],
                row["steps_per_second"] / base, row["records_estepped_per_second"],
                row["partials_local_remote"][0], row["partials_local_remote"][1],
                " / ".join("%.1f" % c for c in row["cpu_seconds"]),
                row["coordinator_serial_ms"], 100 * row["coordinator_serial_ms"] / row["step_ms"]))
        print("\nPhases, median ms per step (coordinator | workers):")
        for row in rows:
            print("  %s x %d: %s | %s" % (
                row["config"], row["threads_each"],
                " ".join("%s %.1f" % kv for kv in row["coordinator_phase_ms"].items()),
                " ".join("%s %.1f" % kv for kv in row["worker_phase_ms"].items()) or "-"))
        return 0
    finally:
        if args.keep:
            print("kept: %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
