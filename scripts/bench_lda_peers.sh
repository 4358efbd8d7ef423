#!/usr/bin/env bash
# Quality and throughput of non-private vipsd LDA against the peer kit
# (gensim and scikit-learn online LDA), on the same tokens and SVI setting.
#   scripts/bench_lda_peers.sh [DATA_DIR] [OUT_DIR]
# DATA_DIR defaults to ../shared/data/20newsgroups; needs ../shared/peers and
# Debian's python3 with numpy, scipy, gensim and scikit-learn
# (apt-get install python3-numpy python3-scipy python3-gensim python3-sklearn).
# Environment: VIPSD_BUILD_DIR (default build; only bench/lda_svi_run is
# built there, RelWithDebInfo unless the directory is configured otherwise),
# VIPSD_BENCH_SEEDS (default 3), VIPSD_BASELINE_BIN (optional: another
# lda_svi_run binary, e.g. from an older commit, run with 1 and 2 threads
# in the same interleaved loop and reported as "baseline_*").
# Runs are interleaved: for every seed, gensim and sklearn (one run each),
# then vipsd with 1 and 2 threads, so that machine load falls on all of them.
# Prints one JSON summary: medians over the seeds, min–max, the throughput
# ratios vipsd / faster peer from this session, and the load average.
set -euo pipefail
cd "$(dirname "$0")/.."
data=$(realpath "${1:-../shared/data/20newsgroups}")
out=$(realpath -m "${2:-out/bench_lda_peers}")
peers=$(realpath ../shared/peers)
build=${VIPSD_BUILD_DIR:-build}
seeds=${VIPSD_BENCH_SEEDS:-3}
baseline=${VIPSD_BASELINE_BIN:-}
py=/usr/bin/python3   # Debian's interpreter, where the apt packages live
mkdir -p "$out"
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
ninja -C "$build" lda_svi_run >/dev/null
vocab=$(ls "$data"/vocab*.txt)
V=$(wc -l < "$vocab")
"$py" "$peers/tokenize.py" "$vocab" "$data/train.jsonl" --out "$out/train_ids.jsonl" >/dev/null
"$py" "$peers/tokenize.py" "$vocab" "$data/test.jsonl" --out "$out/test_ids.jsonl" >/dev/null
: > "$out/loadavg.txt"
for ((seed = 0; seed < seeds; seed++)); do
  cut -d' ' -f1 /proc/loadavg >> "$out/loadavg.txt"
  "$py" "$peers/run_peers.py" --data "$data" --passes 1 --repeats 1 --seed "$seed" \
    --out "$out/peers_$seed" > "$out/peers_$seed.log" 2>&1
  for threads in 1 2; do
    "$build/bench/lda_svi_run" --train "$out/train_ids.jsonl" --test "$out/test_ids.jsonl" \
      --V "$V" --threads "$threads" --seed "$seed" \
      --lambda-out "$out/lambda_${seed}_${threads}.bin" \
      2>/dev/null > "$out/vipsd_${seed}_${threads}.json"
    if [[ -n "$baseline" ]]; then
      "$baseline" --train "$out/train_ids.jsonl" --test "$out/test_ids.jsonl" --V "$V" \
        --threads "$threads" --seed "$seed" 2>/dev/null > "$out/baseline_${seed}_${threads}.json"
    fi
  done
done
"$py" - "$out" "$peers" "$data" "$V" "$seeds" "$baseline" <<'PY'
import json, statistics, subprocess, sys
import numpy as np
out, peers, data, V, seeds, baseline = (sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                        int(sys.argv[5]), sys.argv[6])
runs = {t: [json.load(open(f"{out}/vipsd_{s}_{t}.json")) for s in range(seeds)] for t in (1, 2)}
peer_runs = [r for s in range(seeds) for r in json.load(open(f"{out}/peers_{s}/results.json"))["runs"]]
unigram = json.load(open(f"{out}/peers_0/results.json"))["median"]["unigram_perplexity"]
lam = np.fromfile(f"{out}/lambda_0_1.bin", dtype="<f8").reshape(-1, V)
np.save(f"{out}/lambda_0_1.npy", lam)
kit = json.loads(subprocess.run([sys.executable, f"{peers}/doc_completion.py", f"{out}/lambda_0_1.npy",
                                 "--kind", "lambda", "--alpha", str(1 / lam.shape[0]), "--eta",
                                 str(1 / lam.shape[0]), "--data", data],
                                capture_output=True, text=True, check=True).stdout)

def summary(rs, keys=("docs_per_s", "tokens_per_s", "doc_completion_perplexity")):
    result = {k: statistics.median([r[k] for r in rs]) for k in keys}
    for k in keys:
        result[k + "_min_max"] = [min(r[k] for r in rs), max(r[k] for r in rs)]
    return result

result = {
    "seeds": seeds,
    "vipsd_1_thread": summary(runs[1]),
    "vipsd_2_threads": summary(runs[2]),
    "vipsd_seed0_own_eval": runs[1][0]["doc_completion_perplexity"],
    "vipsd_seed0_kit_eval": kit["doc_completion_perplexity"],
    "gensim": summary([r for r in peer_runs if r["impl"] == "gensim"]),
    "sklearn": summary([r for r in peer_runs if r["impl"] == "sklearn"]),
    "unigram_perplexity": unigram,
    "loadavg_1min_before_each_seed": [float(x) for x in open(f"{out}/loadavg.txt").read().split()],
}
fastest_peer = max(("gensim", "sklearn"), key=lambda p: result[p]["docs_per_s"])
best_quality = min(result[p]["doc_completion_perplexity"] for p in ("gensim", "sklearn"))
result["ratio_vs_faster_peer"] = {
    "faster_peer": fastest_peer,
    "vipsd_1_thread": result["vipsd_1_thread"]["docs_per_s"] / result[fastest_peer]["docs_per_s"],
    "vipsd_2_threads": result["vipsd_2_threads"]["docs_per_s"] / result[fastest_peer]["docs_per_s"],
}
result["perplexity_vs_better_peer"] = (
    result["vipsd_1_thread"]["doc_completion_perplexity"] / best_quality - 1)
result["kit_eval_agreement"] = (
    f"own evaluator {result['vipsd_seed0_own_eval']:.4f} vs kit evaluator "
    f"{result['vipsd_seed0_kit_eval']:.4f} (relative difference "
    f"{abs(result['vipsd_seed0_own_eval'] / result['vipsd_seed0_kit_eval'] - 1):.1e})")
if baseline:
    for t, name in ((1, "baseline_1_thread"), (2, "baseline_2_threads")):
        result[name] = summary([json.load(open(f"{out}/baseline_{s}_{t}.json")) for s in range(seeds)])
        result[name]["binary"] = baseline
        result[name]["speedup_of_vipsd"] = (
            result[f"vipsd_{t}_thread" + ("s" if t == 2 else "")]["docs_per_s"] / result[name]["docs_per_s"])
print(json.dumps(result, indent=1))
PY
