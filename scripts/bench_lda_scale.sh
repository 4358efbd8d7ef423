#!/usr/bin/env bash
# The private LDA step at Wikipedia scale (issue 15, "Steps at scale"): time
# per phase of the step driver (charge, sample, E-step + clip + sum, noise,
# M-step), peak memory, and how step time grows with q (so with the pool
# share a step touches), for K x V = 50 x 10,000 and 100 x 50,000, on 1 and
# 2 threads. The daemon's own phases (ledger commit, checkpoint write,
# release publish) come from scripts/bench_daemon.sh, which scrapes them from
# the daemon's metrics.
#
#   scripts/bench_lda_scale.sh [OUT_DIR]
#
# Needs out/wikipedia from scripts/prepare_wikipedia.py (train_ids.jsonl,
# train_ids50k.jsonl, test_ids.jsonl). Each configuration runs STEPS (3)
# private steps with σ = 7.73 through build/bench/lda_svi_run; one JSON line
# per configuration goes to OUT_DIR/scale.jsonl and a table to stdout.
# Wrap it in `flock /tmp/vipsd-cpu.lock` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-out/bench_lda_scale}")
steps=${STEPS:-3}
data=out/wikipedia
for f in train_ids.jsonl train_ids50k.jsonl test_ids.jsonl; do
  [[ -f $data/$f ]] || { echo "bench_lda_scale.sh: $data/$f missing: run scripts/prepare_wikipedia.py" >&2; exit 2; }
done
ninja -C build lda_svi_run >/dev/null
mkdir -p "$out"
: > "$out/scale.jsonl"
run() {  # K V TRAIN Q THREADS
  local json
  json=$(build/bench/lda_svi_run --train "$data/$3" --test "$data/test_ids.jsonl" --K "$1" \
           --V "$2" --q "$4" --threads "$5" --steps "$steps" --sigma 7.73 --epsilon 100 \
           --tau0 1 --kappa 0.7 --alpha 0.02 --eta 0.02 2>/dev/null)
  echo "{\"K\": $1, \"V\": $2, \"q\": $4, \"threads\": $5, \"run\": $json}" >> "$out/scale.jsonl"
}
for q in 0.01 0.03 0.1 0.3; do run 50 10000 train_ids.jsonl "$q" 2; done
run 50 10000 train_ids.jsonl 0.1 1
for q in 0.01 0.1; do run 100 50000 train_ids50k.jsonl "$q" 2; done
run 100 50000 train_ids50k.jsonl 0.1 1
/usr/bin/python3 - "$out/scale.jsonl" "$(wc -l < "$data/train_ids.jsonl")" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
docs = int(sys.argv[2])
print("| K x V | q | docs/step | threads | charge | sample | E-step | noise | M-step | step total (ms) | docs/s | peak RSS (MiB) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    run, steps = r["run"], r["run"]["steps"]
    ph = {k: 1000 * v / steps for k, v in run["phase_seconds"].items()}
    print(f"| {r['K']} x {r['V']:,} | {r['q']} | {round(r['q'] * docs):,} | {r['threads']} | "
          f"{ph['charge']:.1f} | {ph['sample']:.1f} | {ph['estep']:.0f} | {ph['noise']:.0f} | "
          f"{ph['mstep']:.0f} | {sum(ph.values()):.0f} | {run['docs_per_s']:,.0f} | {run['max_rss_mib']:.0f} |")
PY
