#!/usr/bin/env bash
# Runs issue 30's table (bench/shared_work_bench.py) from a bundle made by
# scripts/scaleout_bundle.sh: every configuration of the issue, one after
# the other on the same machine, each with its own mock cluster.
#
#   scripts/scaleout_run.sh [BUNDLE] [RESULTS_DIR] [BENCH ARGS...]
#     BUNDLE       default out/scaleout
#     RESULTS_DIR  default $OUT if set (the device tool's output folder),
#                  else out/scaleout-results
#   Extra arguments go to shared_work_bench.py after the defaults
#   (--docs 30000 --steps 30 --topics 50 --q 0.3 and CONFIGS below), e.g.
#   --steps 10 for a shorter run.
#   $CONFIGS: default the issue's table and 8 x 1 with a 2-thread
#     coordinator (its noise draw, bench/README.md),
#     solo:1,solo:2,solo:4,solo:8,1:1,2:1,4:1,8:1,8:1+2,4:2
#   $PASSES: run the whole list this many times (default 1); PASSES=0
#     skips the issue's table.
#   $WIKI_CONFIGS: when set (e.g. solo:1,solo:8,8:1,8:1+2,8:1+4), then a
#     Wikipedia-scale pass: --docs 60000 --vocab-size 10000 --q 0.1
#     --partitions 16 --steps 16 (a bundle of DOCS=60000 or more), into
#     RESULTS_DIR/wiki.txt.
#
#   $THREADS: when the bundle holds lda_svi_run and tokenised paragraphs
#     (IDS_TRAIN, IDS_TEST at bundling), the one-process table first:
#     lda_svi_run --V 10000 --K 50 --q 0.3 --steps 3 --sigma 1 at each of
#     these thread counts (default 1 2 4 8 16), per-phase seconds a step.
#
# Writes RESULTS_DIR/threads.jsonl (one lda_svi_run JSON per thread count),
# RESULTS_DIR/run-N.txt (the bench's JSON lines and table per pass),
# RESULTS_DIR/wiki.txt (with $WIKI_CONFIGS) and RESULTS_DIR/machine.txt (nproc, CPU model, memory). Needs python3.
set -euo pipefail

here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
bundle=${1:-out/scaleout}
results=${2:-${OUT:-out/scaleout-results}}
shift $(( $# >= 2 ? 2 : $# ))
configs=${CONFIGS:-solo:1,solo:2,solo:4,solo:8,1:1,2:1,4:1,8:1,8:1+2,4:2}
passes=${PASSES:-1}

command -v python3 > /dev/null || { echo "scaleout_run: python3 is needed" >&2; exit 1; }
for f in "$bundle/bin/vipsd" "$bundle/bin/vipsd-mock-kafka" "$bundle/data/corpus.jsonl"; do
  [[ -e $f ]] || { echo "scaleout_run: $f is missing (scripts/scaleout_bundle.sh)" >&2; exit 1; }
done
mkdir -p "$results"
{
  echo "nproc: $(nproc)"
  grep -m1 "model name" /proc/cpuinfo || true
  grep -m1 MemTotal /proc/meminfo || true
  echo "configs: $configs passes: $passes args: $*"
} > "$results/machine.txt"
cat "$results/machine.txt"

if [[ -x $bundle/bin/lda_svi_run && -f $bundle/data/ids_train.jsonl ]]; then
  : > "$results/threads.jsonl"
  for threads in ${THREADS:-1 2 4 8 16}; do
    "$bundle/bin/lda_svi_run" --train "$bundle/data/ids_train.jsonl" \
      --test "$bundle/data/ids_test.jsonl" --V 10000 --K 50 --q 0.3 --steps 3 --sigma 1 \
      --epsilon 1000 --threads "$threads" >> "$results/threads.jsonl"
    tail -1 "$results/threads.jsonl" | cut -c1-300
  done
fi

# The issue's benchmark: 30,000 records (fewer if the bundle has fewer).
issue_docs=$(wc -l < "$bundle/data/corpus.jsonl")
(( issue_docs <= 30000 )) || issue_docs=30000
for pass in $(seq "$passes"); do
  python3 "$here/bench/shared_work_bench.py" \
    --vipsd "$bundle/bin/vipsd" --mock-kafka "$bundle/bin/vipsd-mock-kafka" \
    --corpus "$bundle/data/corpus.jsonl" --vocab "$bundle/data/vocab.txt" \
    --docs "$issue_docs" --steps 30 --topics 50 --q 0.3 \
    --configs "$configs" "$@" 2>&1 | tee "$results/run-$pass.txt"
done

if [[ -n ${WIKI_CONFIGS:-} ]]; then
  docs=$(wc -l < "$bundle/data/corpus.jsonl")
  (( docs >= 60000 )) || { echo "scaleout_run: the Wikipedia-scale pass needs a bundle of DOCS=60000 (this one has $docs)" >&2; exit 1; }
  python3 "$here/bench/shared_work_bench.py" \
    --vipsd "$bundle/bin/vipsd" --mock-kafka "$bundle/bin/vipsd-mock-kafka" \
    --corpus "$bundle/data/corpus.jsonl" --vocab "$bundle/data/vocab.txt" \
    --docs 60000 --vocab-size 10000 --topics 50 --q 0.1 --partitions 16 --steps 16 \
    --configs "$WIKI_CONFIGS" 2>&1 | tee "$results/wiki.txt"
fi
