#!/usr/bin/env python3
"""Memory harness: the daemon's peak resident memory (VmHWM) against the
formula of docs/memory.md, in two runs against a Kafka cluster hosted in
another process (vipsd-mock-kafka):

  overload  far more records on the input topic than pool.capacity, all
            there before the daemon starts (it reads as fast as it can and
            back-pressure must hold): peak RSS at two capacities, and the
            pool must never pass its capacity (vipsd_pool_records);
  large     LDA with K = 100 topics over V = 50,000 terms for a few steps.

Each run must stay within the formula's bound; the measured values, the
bound and their ratio are printed. Usage: memory_harness.py --vipsd BIN
--mock-kafka BIN [--records N]. Exit 0 when every bound held, 1 otherwise.
"""
import argparse
import os
import shutil
import signal
import sys
import threading
import time

import harness
from harness import check, log

MIB = 1024 * 1024
# docs/memory.md: peak RSS <= BASE + PREFETCH + capacity * PER_RECORD
#                            + MODEL_COPIES * K * V * 8 bytes
BASE = 48 * MIB            # binary, libraries, thread stacks, metrics, librdkafka
PER_RECORD = 1024          # LDA record of a short document: tokens, counts, pool index
MODEL_COPIES = 12          # lambda, E[log beta], statistic, noise, new lambda,
                           # release arrays and bytes, unconfirmed release, checkpoint


def prefetch_bound(kbytes):
    """librdkafka's consumer queue (queued.max.messages.kbytes) plus one fetch."""
    return kbytes * 1024 + 4 * MIB


def bound(capacity, topics, vocabulary, queued_kbytes):
    return BASE + prefetch_bound(queued_kbytes) + capacity * PER_RECORD + \
        MODEL_COPIES * topics * vocabulary * 8


def vm_hwm(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def config_for(work, bootstrap, group, port, topics, vocabulary, capacity, queued_kbytes,
               max_steps, resample, topic, window, interval):
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "vocab.txt"), "w") as f:
        base = harness.VOCABULARY

        def term(i):  # distinct [a-z]+ terms

            s = ""
            while True:
                s = chr(97 + i % 26) + s
                i //= 26
                if i == 0:
                    return "z" + s
        words = base + [term(i) for i in range(vocabulary - len(base))]
        f.write("\n".join(words) + "\n")
    path = os.path.join(work, "vipsd.yaml")
    with open(path, "w") as f:
        f.write("""model:
  type: lda
  lda: {topics: %d, vocabulary: vocab.txt, alpha: 0.1, eta: 0.01, resample_length: %d}
privacy: {noise_multiplier: 1.0, sampling_rate: 0.01, delta: 1.0e-5, epsilon_ceiling: 100000}
schedule: {tau0: 64, kappa: 0.7, threads: 2, start_delay_seconds: 0, on_overrun: catch_up, interval_seconds: %s, max_steps: %d,
           window_steps: %s}
pool: {capacity: %d}
source: {type: kafka, topics: [%s], group_id: %s, timestamps: create_time}
sink: {type: kafka, topic: releases, publish_every: 1}
dead_letter: {topic: dead}
kafka:
  bootstrap_servers: "%s"
  consumer_properties:
    session.timeout.ms: "4000"
    heartbeat.interval.ms: "300"
    queued.max.messages.kbytes: "%d"
  producer_properties:
    message.max.bytes: "100000000"
state: {directory: state, checkpoint_every: 1}
metrics: {listen: "127.0.0.1:%d"}
log: {level: warning}
""" % (topics, resample, interval, max_steps, window, capacity, topic, group, bootstrap, queued_kbytes,
       port))
    return path


def run(args, kafka, name, topics, vocabulary, capacity, queued_kbytes, seconds, max_steps,
        topic, window, feed=None, resample=10, interval=0.5):
    work = os.path.join(args.work, "%s-%d" % (name, capacity))
    port = harness.free_port()
    config = config_for(work, kafka.bootstrap, "vipsd-mem-%s-%d-%d" % (name, capacity, os.getpid()),
                        port, topics, vocabulary, capacity, queued_kbytes, max_steps, resample,
                        topic, window, interval)
    daemon = harness.Vipsd(args.vipsd, config, os.path.join(work, "vipsd.log"))
    producer = None
    if feed is not None:
        # Records arrive while the daemon runs: `feed` records/s through kcat.
        producer = harness.subprocess.Popen(
            ["kcat", "-P", "-b", kafka.bootstrap, "-t", topic, "-K", "\t"],
            stdin=harness.subprocess.PIPE, stdout=harness.subprocess.DEVNULL,
            stderr=harness.subprocess.DEVNULL)

        def pump():
            start, sent = time.monotonic(), 0
            try:
                while time.monotonic() - start < seconds - 2:
                    due = int((time.monotonic() - start) * feed)
                    if due > sent:
                        producer.stdin.write("".join(
                            "r%d\t%s\n" % (i, harness.document(i))
                            for i in range(sent, due)).encode())
                        producer.stdin.flush()
                        sent = due
                    time.sleep(0.05)
            finally:
                producer.stdin.close()
        threading.Thread(target=pump, daemon=True).start()
    peak, pool_max, consumed, steps = 0, 0, 0, 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end and daemon.alive():
            peak = max(peak, vm_hwm(daemon.proc.pid))
            values = harness.scrape(port) or {}
            pool_max = max(pool_max, values.get("vipsd_pool_records", 0))
            consumed = max(consumed, sum(v for k, v in values.items()
                                         if k.startswith("vipsd_records_consumed_total")))
            steps = max(steps, values.get("vipsd_steps_total", 0))
            time.sleep(0.2)
        check(daemon.alive() or daemon.proc.returncode == 0,
              "%s: vipsd exited (%s):\n%s" % (name, daemon.proc.returncode, daemon.log_tail()))
        if daemon.alive():
            peak = max(peak, vm_hwm(daemon.proc.pid))
    finally:
        daemon.kill(signal.SIGTERM)
        daemon.wait(60)
        if producer is not None:
            producer.wait(120)
    limit = bound(capacity, topics, vocabulary, queued_kbytes)
    log("%-9s K=%d V=%d capacity=%d queued.max.messages.kbytes=%d: peak RSS %.1f MiB, bound "
        "%.1f MiB (ratio %.2f); pool max %d; records consumed %d; steps %d" %
        (name, topics, vocabulary, capacity, queued_kbytes, peak / MIB, limit / MIB,
         peak / limit, pool_max, consumed, steps))
    check(pool_max <= capacity, "%s: the pool held %d records > capacity %d" %
          (name, pool_max, capacity))
    check(peak <= limit, "%s: peak RSS %.1f MiB over the bound %.1f MiB" %
          (name, peak / MIB, limit / MIB))
    return peak, consumed, steps, pool_max


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--mock-kafka", required=True)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    args.work = args.workdir or os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                             "vipsd-memory-harness-%d" % os.getpid())
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    kafka = harness.MockKafka(args.mock_kafka, 1,
                              [("docs", 8), ("releases", 1), ("dead", 1), ("alerts", 1)])
    try:
        # Records ~70 bytes at 8,000/s for ~23 s: 16 partitions keep each
        # well below the mock's 5 MiB. A window (4 slots of 0.5 s) holds
        # ~16,000 records: over capacity 2,000, within 20,000.
        for capacity in (2000, 20000):
            topic = "docs%d" % capacity
            kafka.command("topic %s 16" % topic)
            peak, consumed, _, pool = run(args, kafka, "overload", 2, 6, capacity, 4096, 25, 0,
                                          topic, 4, feed=8000)
            check(consumed > 2 * capacity, "overload: only %d records consumed" % consumed)
        kafka.command("topic large 2")
        check(harness.produce(kafka.bootstrap, "large",
                              [("r%d" % i, harness.document(i)) for i in range(500)]), "produce")
        # Slots of 4 s: the step's noise alone (5,000,000 coordinates) takes
        # longer than a 0.5 s slot, which vipsd refuses at start-up.
        _, _, steps, _ = run(args, kafka, "large", 100, 50000, 2000, 4096, 45, 3, "large", "1000000000",
                             interval=4)
        check(steps >= 1, "the large model took no step")
        log("PASS: memory within docs/memory.md's bound in every run")
        return 0
    except harness.HarnessFailure as failure:
        log("FAIL: %s" % failure)
        return 1
    finally:
        kafka.close()
        if "VIPSD_HARNESS_KEEP" not in os.environ:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
