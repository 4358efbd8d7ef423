#!/usr/bin/env bash
# Quality and throughput of non-private vipsd LDA against the peer kit
# (gensim and scikit-learn online LDA), on the same tokens and SVI setting.
#   scripts/bench_lda_peers.sh [DATA_DIR] [OUT_DIR]
# DATA_DIR defaults to ../shared/data/20newsgroups; needs ../shared/peers and
# Debian's python3 with numpy, scipy, gensim and scikit-learn
# (apt-get install python3-numpy python3-scipy python3-gensim python3-sklearn).
# Runs peers and vipsd in the same session (machine noise affects both) and
# prints one JSON summary: medians over 3 seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
data=$(realpath "${1:-../shared/data/20newsgroups}")
out=$(realpath -m "${2:-out/bench_lda_peers}")
peers=$(realpath ../shared/peers)
py=/usr/bin/python3   # Debian's interpreter, where the apt packages live
mkdir -p "$out"
scripts/build.sh build >/dev/null
vocab=$(ls "$data"/vocab*.txt)
V=$(wc -l < "$vocab")
"$py" "$peers/tokenize.py" "$vocab" "$data/train.jsonl" --out "$out/train_ids.jsonl" >/dev/null
"$py" "$peers/tokenize.py" "$vocab" "$data/test.jsonl" --out "$out/test_ids.jsonl" >/dev/null
"$py" "$peers/run_peers.py" --data "$data" --passes 1 --out "$out/peers" > "$out/peers.log"
for seed in 0 1 2; do
  for threads in 1 2; do
    build/bench/lda_svi_run --train "$out/train_ids.jsonl" --test "$out/test_ids.jsonl" \
      --V "$V" --threads "$threads" --seed "$seed" --lambda-out "$out/lambda_${seed}_${threads}.bin" \
      2>/dev/null > "$out/vipsd_${seed}_${threads}.json"
  done
done
"$py" - "$out" "$peers" "$data" "$V" <<'PY'
import json, os, statistics, subprocess, sys
import numpy as np
out, peers, data, V = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runs = {t: [json.load(open(f"{out}/vipsd_{s}_{t}.json")) for s in range(3)] for t in (1, 2)}
lam = np.fromfile(f"{out}/lambda_0_1.bin", dtype="<f8").reshape(-1, V)
np.save(f"{out}/lambda_0_1.npy", lam)
kit = json.loads(subprocess.run([sys.executable, f"{peers}/doc_completion.py", f"{out}/lambda_0_1.npy",
                                 "--kind", "lambda", "--alpha", str(1 / lam.shape[0]), "--eta",
                                 str(1 / lam.shape[0]), "--data", data],
                                capture_output=True, text=True, check=True).stdout)
peer = json.load(open(f"{out}/peers/results.json"))["median"]
med = lambda xs: statistics.median(xs)
summary = {
    "vipsd_1_thread": {"docs_per_s": med([r["docs_per_s"] for r in runs[1]]),
                       "tokens_per_s": med([r["tokens_per_s"] for r in runs[1]]),
                       "doc_completion_perplexity": med([r["doc_completion_perplexity"] for r in runs[1]])},
    "vipsd_2_threads": {"docs_per_s": med([r["docs_per_s"] for r in runs[2]]),
                        "tokens_per_s": med([r["tokens_per_s"] for r in runs[2]])},
    "vipsd_seed0_own_eval": runs[1][0]["doc_completion_perplexity"],
    "vipsd_seed0_kit_eval": kit["doc_completion_perplexity"],
    "gensim": {k: peer["gensim"][k] for k in ("docs_per_s", "tokens_per_s", "doc_completion_perplexity")},
    "sklearn": {k: peer["sklearn"][k] for k in ("docs_per_s", "tokens_per_s", "doc_completion_perplexity")},
    "unigram_perplexity": peer.get("unigram_perplexity"),
}
print(json.dumps(summary, indent=1))
PY
