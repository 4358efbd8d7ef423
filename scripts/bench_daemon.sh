#!/usr/bin/env bash
# End-to-end throughput of the daemon on a real corpus through Kafka:
# records/s consumed into the pool, steps/s, release size and publish time,
# for LDA with K = 50 and V = 8000 (issue "streaming daemon").
#   scripts/bench_daemon.sh [CORPUS_JSONL] [VOCAB]
# Defaults: ../shared/data/20newsgroups/train.jsonl and the first 8000 terms
# of its vocabulary (benchmark data; never bundled). The corpus is produced
# into the embedded Kafka (8 partitions) before the daemon's consumer starts,
# so consumption is measured on a full topic. Reads the daemon's own metrics
# endpoint; prints one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=$(realpath "${1:-../shared/data/20newsgroups/train.jsonl}")
vocab_src=$(realpath "${2:-../shared/data/20newsgroups/vocab_train_top10000.txt}")
scripts/build.sh build >/dev/null
work=$(mktemp -d)
pid=""
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
head -n 8000 "$vocab_src" > "$work/vocab.txt"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/vipsd.yaml" <<YAML
model:
  type: lda
  lda: {topics: 50, vocabulary: vocab.txt, alpha: 0.1, eta: 0.01, resample_length: 500, clip_fraction: 0.1}
privacy: {noise_multiplier: 1.0, sampling_rate: 0.02, delta: 1.0e-5, epsilon_ceiling: 1000, on_ceiling: halt}
schedule: {tau0: 64, kappa: 0.7, threads: 2, interval_seconds: 0.01, min_pool_records: 11000, max_steps: 40}
pool: {capacity: 100000}
source: {type: kafka, topics: [docs], group_id: bench}
sink: {type: kafka, topic: releases, publish_every: 5}
dead_letter: {topic: dead}
kafka:
  embedded: true
  demo_corpus: $corpus
  partitions: 8
  consumer_properties: {session.timeout.ms: "6000", heartbeat.interval.ms: "500"}
state: {directory: state}
metrics: {listen: "127.0.0.1:$port"}
log: {level: warning}
YAML
build/daemon/vipsd --config "$work/vipsd.yaml" > "$work/stdout" 2> "$work/stderr" &
pid=$!
/usr/bin/python3 - "$port" "$pid" <<'PY'
import json, os, re, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
def scrape():
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except Exception:
        return None
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values
def get(m, key):
    return sum(v for k, v in m.items() if k == key or k.startswith(key + "{"))
samples = []
while True:
    m = scrape()
    t = time.monotonic()
    if m is not None:
        samples.append((t, m))
    try:
        os.kill(pid, 0)
    except OSError:
        break
    if m is not None and get(m, "vipsd_steps_total") >= 40:
        break
    time.sleep(0.05)
# Consumption: first to last change of records consumed.
consumed = [(t, get(m, "vipsd_records_consumed_total")) for t, m in samples]
start = next(t for t, c in consumed if c > 0)
total = consumed[-1][1]
end = next(t for t, c in consumed if c >= total)
steps = [(t, get(m, "vipsd_steps_total")) for t, m in samples]
s_start = next(t for t, s in steps if s >= 1)
s_last = steps[-1]
last = samples[-1][1]
publish_count = get(last, "vipsd_release_publish_duration_seconds_count")
publish_sum = get(last, "vipsd_release_publish_duration_seconds_sum")
step_count = get(last, "vipsd_step_duration_seconds_count")
step_sum = get(last, "vipsd_step_duration_seconds_sum")
print(json.dumps({
    "records_consumed": total,
    "records_per_second_consumed": round(total / max(end - start, 1e-9), 1),
    "steps": s_last[1],
    "steps_per_second": round((s_last[1] - 1) / max(s_last[0] - s_start, 1e-9), 2),
    "mean_step_seconds_incl_ledger_and_checkpoint": round(step_sum / max(step_count, 1), 4),
    "release_bytes": last.get("vipsd_release_bytes"),
    "releases_published": publish_count,
    "mean_release_publish_seconds": round(publish_sum / max(publish_count, 1), 4),
    "mean_ledger_commit_seconds": round(get(last, "vipsd_ledger_commit_duration_seconds_sum") / max(get(last, "vipsd_ledger_commit_duration_seconds_count"), 1), 5),
}, indent=1))
PY
