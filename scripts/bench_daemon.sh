#!/usr/bin/env bash
# End-to-end ingest of the daemon on a real corpus through the embedded Kafka
# (librdkafka's mock cluster, in the daemon's process), with private LDA steps
# running on the public clock while the records arrive (issue 15, "Ingest at
# stream speed"). Prints one JSON object: records/s consumed into the pool,
# steps/s and step time while ingesting, lag, and the mean time of the
# daemon's own step phases (ledger commit, checkpoint write, release publish;
# bench/lda_svi_run splits the compute phases of the same step driver).
#
#   scripts/bench_daemon.sh [CORPUS_JSONL] [VOCAB]
#
# Defaults: out/wikipedia/train.jsonl and out/wikipedia/vocab.txt (the whole
# vocabulary; benchmark data, never committed). The daemon starts on an
# empty topic; a producer (kcat, a separate process) then writes the corpus
# at RATE records/s, so slots cut the stream as it arrives and steps run
# while the daemon is still reading. Environment knobs (defaults):
#   RATE=150000       records/s offered by the producer (0: as fast as it can)
#   PARTITIONS=32     input partitions (the mock keeps only ~5 MiB per partition:
#                     the corpus is produced lz4-compressed to stay under it)
#   INTERVAL=0.5      schedule.interval_seconds (the public step clock)
#   Q=0.02 SIGMA=1.0  privacy.sampling_rate and noise_multiplier
#   THREADS=2         schedule.threads (E-step workers)
#   LEDGER_TOPIC=0    1: also keep the ledger of record on a Kafka topic
#                     (state.ledger_topic): ledger commits then include the
#                     append and read-back (issue 16's per-step overhead)
#   VIPSD=build/daemon/vipsd   the binary (built with scripts/build.sh unless set)
#   PERF_OUT=FILE     also `perf record -g` the daemon for PERF_SECONDS (4) once
#                     a quarter of the corpus was consumed
# Wrap it in `flock /tmp/vipsd-cpu.lock` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=$(realpath "${1:-out/wikipedia/train.jsonl}")
vocab=$(realpath "${2:-out/wikipedia/vocab.txt}")
rate=${RATE:-150000}
partitions=${PARTITIONS:-32}
interval=${INTERVAL:-0.5}
q=${Q:-0.02}
sigma=${SIGMA:-1.0}
threads=${THREADS:-2}
if [[ -z ${VIPSD:-} ]]; then
  scripts/build.sh build >/dev/null
  VIPSD=build/daemon/vipsd
fi
vipsd=$(realpath "$VIPSD")
command -v kcat >/dev/null || { echo "bench_daemon.sh: kcat is required (scripts/setup.sh)" >&2; exit 2; }
records=$(grep -c . "$corpus")
work=$(mktemp -d)
pid=""
producer=""
cleanup() {  # not under set -e: a producer that already exited must not skip the rest
  set +e
  [[ -n $producer ]] && kill "$producer" 2>/dev/null
  [[ -n $pid ]] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/vipsd.yaml" <<YAML
model:
  type: lda
  lda: {topics: 50, vocabulary: $vocab, alpha: 0.02, eta: 0.02, resample_length: 500, clip_fraction: 0.1}
privacy: {noise_multiplier: $sigma, sampling_rate: $q, delta: 1.0e-5, epsilon_ceiling: 10,
          on_ceiling: halt, accounting: global, schedule: fixed}
schedule: {tau0: 64, kappa: 0.7, threads: $threads, interval_seconds: $interval, start_delay_seconds: 0, on_overrun: catch_up, window_steps: 1000000000}
pool: {capacity: $((records + 10000))}
source: {type: kafka, topics: [docs], group_id: bench, timestamps: create_time}
sink: {type: kafka, topic: releases, publish_every: 5}
dead_letter: {topic: dead}
kafka:
  embedded: true
  partitions: $partitions
  consumer_properties: {session.timeout.ms: "6000", heartbeat.interval.ms: "500"}
state: {directory: state$([[ ${LEDGER_TOPIC:-0} == 1 ]] && echo ", ledger_topic: ledger")}
metrics: {listen: "127.0.0.1:$port", expose_step_timing: true}
log: {level: warning}
YAML
# Offers the corpus at a fixed rate, in chunks of 1000 lines.
cat > "$work/pace.py" <<'PY'
import sys, time
path, rate = sys.argv[1], float(sys.argv[2])
out, chunk, n, t0 = sys.stdout.buffer, [], 0, time.monotonic()
with open(path, "rb") as f:
    for line in f:
        if not line.strip():
            continue
        chunk.append(line)
        n += 1
        if len(chunk) == 1000:
            if rate > 0:
                time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
            out.write(b"".join(chunk))
            chunk = []
out.write(b"".join(chunk))
out.flush()
PY
"$vipsd" --config "$work/vipsd.yaml" --no-step-time-check > "$work/stdout" 2> "$work/stderr" &
pid=$!
for _ in $(seq 300); do [[ -s $work/state/bootstrap ]] && break; sleep 0.1; done
[[ -s $work/state/bootstrap ]] || { cat "$work/stderr" >&2; exit 1; }
bootstrap=$(cat "$work/state/bootstrap")
sleep 4  # the consumer group join (~3 s in the mock)
(/usr/bin/python3 "$work/pace.py" "$corpus" "$rate" |
   kcat -P -b "$bootstrap" -t docs -z lz4 -X sticky.partitioning.linger.ms=0 -X linger.ms=50 \
     -X batch.num.messages=10000 -X queue.buffering.max.messages=1000000; date +%s.%N > "$work/produced") &
producer=$!
/usr/bin/python3 - "$port" "$pid" "$records" "$work" "${PERF_OUT:-}" "${PERF_SECONDS:-4}" <<'PY'
import json, os, subprocess, sys, time, urllib.request
port, pid, expected, work, perf_out, perf_seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
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
samples, perf, deadline = [], None, time.monotonic() + 600
while time.monotonic() < deadline:
    m = scrape()
    if m is not None:
        samples.append((time.monotonic(), m))
        consumed = get(m, "vipsd_records_consumed_total")
        if perf_out and perf is None and consumed >= expected / 4:
            perf = subprocess.Popen(["perf", "record", "-g", "-p", str(pid), "-o", perf_out, "--",
                                     "sleep", perf_seconds], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        if consumed >= expected:
            break
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("vipsd exited; see its log")
    time.sleep(0.1)
if perf is not None:
    perf.wait()
consumed = [(t, get(m, "vipsd_records_consumed_total")) for t, m in samples]
total = consumed[-1][1]
start = next(t for t, c in consumed if c > 0)
end = next(t for t, c in consumed if c >= total)
def at(t):  # the last sample at or before t
    return max((s for s in samples if s[0] <= t), key=lambda s: s[0])[1]
first, last = at(start), at(end)
steps = get(last, "vipsd_steps_total") - get(first, "vipsd_steps_total")
step_count = get(last, "vipsd_step_duration_seconds_count") - get(first, "vipsd_step_duration_seconds_count")
step_sum = get(last, "vipsd_step_duration_seconds_sum") - get(first, "vipsd_step_duration_seconds_sum")
final = samples[-1][1]
def mean(histogram):  # over the whole run
    return round(get(final, histogram + "_sum") / max(get(final, histogram + "_count"), 1), 4)
print(json.dumps({
    "records": int(total),
    "records_rejected": int(get(last, "vipsd_records_rejected_total")),
    "ingest_seconds": round(end - start, 2),
    "records_per_second_consumed": round(total / max(end - start, 1e-9)),
    "steps_while_ingesting": int(steps),
    "steps_per_second_while_ingesting": round(steps / max(end - start, 1e-9), 2),
    "mean_step_seconds": round(step_sum / max(step_count, 1), 3),
    "mean_ledger_commit_seconds": mean("vipsd_ledger_commit_duration_seconds"),
    "mean_checkpoint_write_seconds": mean("vipsd_checkpoint_write_duration_seconds"),
    "mean_release_publish_seconds": mean("vipsd_release_publish_duration_seconds"),
    "max_consumer_lag_records": int(max(get(m, "vipsd_consumer_lag_records") for _, m in samples)),
    "pool_records_at_end": int(get(last, "vipsd_pool_records")),
}, indent=1))
PY
