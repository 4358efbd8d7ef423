#!/usr/bin/env python3
"""Federated mode (issue 31, docs/federation.md): what it costs against the
trusted shared mode on the same data at the same epsilon.

The first --docs records of the corpus are split by article (the id before
"_p"; a hash of it picks the holder) across --holders holders, each with a
two-partition topic of its own. Configurations, each on a fresh
vipsd-mock-kafka (another process), all at the same q, sigma and steps (so
the same epsilon: one accountant):

  shared        the trusted baseline: a coordinator that reads no partition
                (state.work_partitions: false) and --holders workers over one
                six-partition topic holding every record
  federated:T   --holders holders and an aggregator, tolerated_holders T

Every daemon steps as fast as it can (slots far shorter than a step: every
slot is late) and publishes only its final release, mirrored to a directory
that vipsd-eval scores on the first --test-docs held-out documents
(document-completion perplexity). Measured: steps/s over the second half of
the run, CPU seconds of each process (os.wait4), the bytes per step on the
work topic (plans on partition 0, partial sums or masked shares on
partition 1; message payload sizes read back with kcat), and the held-out
perplexity of the final release.

Usage: federated_bench.py --vipsd BIN --mock-kafka BIN --eval BIN
       [--corpus JSONL] [--test JSONL] [--vocab FILE] [--docs N]
       [--vocab-size V] [--topics K] [--steps N] [--q Q] [--sigma S]
       [--holders N] [--configs shared,federated:1,federated:0]
Wrap it in `flock out/vipsd-cpu.lock` on a shared machine.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_work_bench import Process, step_times  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "harness"))
import harness  # noqa: E402


def config_text(args, vocab, bootstrap, group, topics, state, federation, mirror):
    source = "source:\n  type: kafka\n"
    if topics:
        source += "  topics: [%s]\n" % ", ".join(topics)
    source += "  group_id: %s\n  timestamps: create_time\n" % group
    return """model:
  type: lda
  lda:
    topics: %d
    vocabulary: %s
    alpha: 0.1
    eta: 0.01
privacy:
  noise_multiplier: %s
  sampling_rate: %s
  delta: 1.0e-5
  epsilon_ceiling: 100000
schedule:
  threads: 1
  interval_seconds: 0.05
  start_delay_seconds: 0
  on_overrun: catch_up
  release_delay_seconds: 0
  window_steps: 1000000000
  max_steps: %d
pool:
  capacity: %d
%ssink:
  type: kafka
  topic: releases
  publish_every: 1000000
%sdead_letter:
  topic: dead
kafka:
  bootstrap_servers: "%s"
  consumer_properties:
    session.timeout.ms: "6000"
    heartbeat.interval.ms: "500"
state:
  directory: state
%s%smetrics:
  listen: ""
log:
  level: info
""" % (args.topics, vocab, args.sigma, args.q, args.steps, args.docs * 2, source,
       ("  mirror_directory: %s\n" % mirror) if mirror else "", bootstrap, state, federation)


def write(directory, text):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "vipsd.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def produce(bootstrap, topic, path):
    result = subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-z", "lz4", "-K", "\t",
                             "-l", path], capture_output=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError("kcat: %s" % result.stderr[-300:])


def work_topic_bytes(bootstrap):
    """{partition: estimated payload bytes ever appended} of the work topic.

    The mock keeps only ~5 MiB per partition: the messages still there give
    the mean size, their offsets how many were ever appended."""
    result = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", "work", "-o", "beginning", "-e",
                             "-q", "-f", "%p %o %S\n"], capture_output=True, text=True,
                            timeout=300)
    kept = {0: [0, 0, -1], 1: [0, 0, -1]}  # messages read, their bytes, last offset
    for line in result.stdout.splitlines():
        p, offset, size = (int(x) for x in line.split())
        kept[p][0] += 1
        kept[p][1] += size
        kept[p][2] = max(kept[p][2], offset)
    return {p: (k[2] + 1) * k[1] / k[0] if k[0] else 0 for p, k in kept.items()}


def final_release(mirror):
    steps = [int(m.group(1)) for m in
             (re.match(r"step-(\d+)$", name) for name in os.listdir(mirror)) if m]
    return os.path.join(mirror, "step-%d" % max(steps)) if steps else None


def run(args, name, tolerated, split_paths, all_path, vocab, test_path, work):
    holders = ["h%d" % i for i in range(args.holders)]
    topics = [("releases", 1), ("dead", 1), ("ledger", 1), ("work", 2)]
    federated = tolerated is not None
    topics += [("%sdocs" % h, 2) for h in holders] if federated else [("docs", 6)]
    kafka = harness.MockKafka(args.mock_kafka, 1, topics)
    try:
        if federated:
            for h in holders:
                produce(kafka.bootstrap, "%sdocs" % h, split_paths[h])
        else:
            produce(kafka.bootstrap, "docs", all_path)
        group = "bench-%d-%d" % (os.getpid(), int(time.time() * 1000))
        mirror = os.path.join(work, "mirror")
        members = []
        if federated:
            keys = {}
            for h in holders:
                d = os.path.join(work, h)
                os.makedirs(d)
                out = subprocess.run([args.vipsd, "federation-keygen", "--out",
                                      os.path.join(d, "holder.key")], capture_output=True,
                                     text=True, check=True)
                keys[h] = out.stdout.strip()
            roster = "  holders:\n" + "".join("    %s: %s\n" % (h, keys[h]) for h in holders)
            common = "  tolerated_holders: %d\n  round_timeout_seconds: 120\n%s" % (tolerated,
                                                                                      roster)
            for h in holders:
                text = config_text(args, vocab, kafka.bootstrap, group + "-" + h,
                                   ["%sdocs" % h], "  ledger_key: job\n  work_topic: work\n",
                                   "federation:\n  role: holder\n  holder_id: %s\n"
                                   "  secret_key: {file: holder.key}\n"
                                   "  share_delay_seconds: %g\n%s" % (h, args.share_delay, common),
                                   None)
                members.append(Process(args.vipsd, write(os.path.join(work, h), text),
                                       os.path.join(work, h + ".log")))
            text = config_text(args, vocab, kafka.bootstrap, group, [],
                               "  ledger_topic: ledger\n  ledger_key: job\n  work_topic: work\n",
                               "federation:\n  role: aggregator\n" + common, mirror)
        else:
            for i in range(args.holders):
                d = os.path.join(work, "w%d" % i)
                text = config_text(args, vocab, kafka.bootstrap, group, ["docs"],
                                   "  ledger_topic: ledger\n  ledger_key: job\n"
                                   "  work_topic: work\n  standby_takeover_seconds: 600\n", "",
                                   None)
                members.append(Process(args.vipsd, write(d, text), os.path.join(work, "w%d.log" % i)))
                time.sleep(0.5)
            text = config_text(args, vocab, kafka.bootstrap, group, ["docs"],
                               "  ledger_topic: ledger\n  ledger_key: job\n  work_topic: work\n"
                               "  work_partitions: false\n", "", mirror)
        lead_log = os.path.join(work, "lead.log")
        members.append(Process(args.vipsd, write(os.path.join(work, "lead"), text), lead_log))
        start = time.monotonic()
        code, lead_cpu = members[-1].finish()
        wall = time.monotonic() - start
        if code != 0:
            raise RuntimeError("%s: the lead process exited with %r:\n%s" %
                               (name, code, open(lead_log).read()[-3000:]))
        cpus = [m.finish(signal.SIGTERM, 60)[1] for m in members[:-1]] + [lead_cpu]
        times = step_times(lead_log)
        first, last = max(3, args.steps // 2), args.steps
        steps_per_second = (last - first) / (times[last] - times[first])
        abandoned = open(lead_log).read().count(" abandoned (")
        sizes = work_topic_bytes(kafka.bootstrap)
        release = final_release(mirror)
        quality = json.loads(subprocess.run(
            [args.eval, release, "--test", test_path, "--vocab", vocab], capture_output=True,
            text=True, check=True).stdout)
        epsilon = None
        for line in open(lead_log):
            m = re.search(r'msg="stopped: .*epsilon_spent=([0-9.]+)', line)
            if m:
                epsilon = float(m.group(1))
        return {
            "config": name, "holders": args.holders, "tolerated": tolerated,
            "steps_per_second": round(steps_per_second, 3),
            "wall_seconds": round(wall, 1),
            "cpu_seconds": [round(c, 2) for c in cpus],
            "lead_cpu_seconds_per_step": round(lead_cpu / args.steps, 4),
            "abandoned_rounds": abandoned,
            "plan_bytes_per_step": round(sizes[0] / args.steps),
            "sum_bytes_per_step": round(sizes[1] / args.steps),
            "epsilon": epsilon,
            "release": os.path.basename(release),
            "perplexity": quality.get("doc_completion_perplexity"),
            "quality": quality,
        }
    finally:
        kafka.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--mock-kafka", required=True)
    parser.add_argument("--eval", required=True)
    parser.add_argument("--corpus", default="out/wikipedia/train.jsonl")
    parser.add_argument("--test", default="out/wikipedia/test.jsonl")
    parser.add_argument("--vocab", default="out/wikipedia/vocab.txt")
    parser.add_argument("--docs", type=int, default=30000)
    parser.add_argument("--test-docs", type=int, default=1000)
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--q", type=float, default=0.1)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--holders", type=int, default=3)
    parser.add_argument("--share-delay", type=float, default=5.0,
                        help="federation.share_delay_seconds of every holder: its shares "
                             "leave this long after each plan (a round takes at least this)")
    parser.add_argument("--configs", default="shared,federated:1,federated:0")
    args = parser.parse_args()
    for attr in ("vipsd", "mock_kafka", "eval"):
        setattr(args, attr, os.path.abspath(getattr(args, attr)))
    work = tempfile.mkdtemp(prefix="vipsd-federated-bench-")
    try:
        all_path = os.path.join(work, "corpus.jsonl")
        plain_path = os.path.join(work, "plain.jsonl")
        plain = open(plain_path, "w")
        split_paths = {"h%d" % i: os.path.join(work, "h%d.jsonl" % i) for i in range(args.holders)}
        split_files = {h: open(p, "w") for h, p in split_paths.items()}
        per_holder = {h: 0 for h in split_paths}
        with open(args.corpus) as src, open(all_path, "w") as dst:
            for i, line in enumerate(src):
                if i >= args.docs:
                    break
                article = json.loads(line)["id"].rsplit("_p", 1)[0]
                h = "h%d" % (int(hashlib.sha256(article.encode()).hexdigest(), 16) % args.holders)
                dst.write("k%d\t%s" % (i, line))
                plain.write(line)
                split_files[h].write("k%d\t%s" % (i, line))
                per_holder[h] += 1
        for f in list(split_files.values()) + [plain]:
            f.close()
        vocab = os.path.join(work, "vocab.txt")
        with open(args.vocab) as src, open(vocab, "w") as dst:
            for i, line in enumerate(src):
                if i >= args.vocab_size:
                    break
                dst.write(line)
        test_path = os.path.join(work, "test.jsonl")
        with open(args.test) as src, open(test_path, "w") as dst:
            for i, line in enumerate(src):
                if i >= args.test_docs:
                    break
                dst.write(line)
        unigram = json.loads(subprocess.run(
            [args.eval, "--baseline", "unigram", "--train", plain_path, "--test", test_path,
             "--vocab", vocab, "--eta", "0.01"], capture_output=True, text=True,
            check=True).stdout)
        print(json.dumps({"records_per_holder": per_holder,
                          "unigram_perplexity": unigram.get("doc_completion_perplexity")}),
              flush=True)
        rows = []
        for item in args.configs.split(","):
            tolerated = int(item.split(":")[1]) if item.startswith("federated") else None
            run_dir = os.path.join(work, "%d-%s" % (len(rows), item.replace(":", "-")))
            os.makedirs(run_dir)
            row = run(args, item, tolerated, split_paths, all_path, vocab, test_path, run_dir)
            row.update(docs=args.docs, topics=args.topics, vocab_size=args.vocab_size, q=args.q,
                       sigma=args.sigma, steps=args.steps)
            print(json.dumps(row), flush=True)
            rows.append(row)
        print("\n| configuration | steps/s | lead CPU s/step | plan bytes/step | "
              "sum bytes/step | abandoned | epsilon | perplexity |")
        print("|---|---|---|---|---|---|---|---|")
        for row in rows:
            print("| %s | %.3f | %.4f | %d | %d | %d | %s | %s |" % (
                row["config"], row["steps_per_second"], row["lead_cpu_seconds_per_step"],
                row["plan_bytes_per_step"], row["sum_bytes_per_step"], row["abandoned_rounds"],
                row["epsilon"], row["perplexity"]))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
