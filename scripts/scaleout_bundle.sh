#!/usr/bin/env bash
# Packs what issue 30's scale-out benchmark needs on a machine without Debian
# packages (the 16-core device machine): stripped vipsd and vipsd-mock-kafka,
# every shared library they load (glibc and its loader included, so the
# binaries run on whatever libc the machine has), and the first DOCS records
# of the corpus with the vocabulary. bench/shared_work_bench.py and
# tests/harness/ are tracked files and travel with the tree;
# scripts/scaleout_run.sh runs the configurations there.
#
#   scripts/scaleout_bundle.sh [BUILD_DIR] [OUT_DIR] [DOCS]
#     BUILD_DIR  default build        OUT_DIR  default out/scaleout
#     DOCS       default 30000 (the issue's benchmark; ~16 MB of Wikipedia)
#   Corpus and vocabulary: $CORPUS (default out/wikipedia/train.jsonl) and
#   $VOCAB (default out/wikipedia/vocab.txt), as scripts/prepare_wikipedia.py
#   writes them. The data stay out of the repository (out/ is ignored): the
#   bundle is for a measurement, never committed.
#   With $IDS_TRAIN and $IDS_TEST (tokenised paragraphs, {"ids": [...]} per
#   line, ids below the vocabulary's 10,000), bench/lda_svi_run and those
#   files go in too, for the one-process thread table (scaleout_run.sh).
#
# Prints the bundle's size; the device tool carries at most 64 MiB.
set -euo pipefail

build=${1:-build}
out=${2:-out/scaleout}
docs=${3:-30000}
corpus=${CORPUS:-out/wikipedia/train.jsonl}
vocab=${VOCAB:-out/wikipedia/vocab.txt}

for f in "$build/daemon/vipsd" "$build/tools/vipsd-mock-kafka" "$corpus" "$vocab"; do
  [[ -f $f ]] || { echo "scaleout_bundle: $f is missing (build first; prepare the corpus)" >&2; exit 1; }
done

# Only a bundle is replaced: OUT_DIR must be new or hold an earlier bundle.
if [[ -e $out && ! -e $out/bin/vipsd ]]; then
  echo "scaleout_bundle: $out exists and is not a bundle; choose another OUT_DIR" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
loader=""
binaries=("$build/daemon/vipsd" "$build/tools/vipsd-mock-kafka")
if [[ -n ${IDS_TRAIN:-} || -n ${IDS_TEST:-} ]]; then
  for f in "$build/bench/lda_svi_run" "${IDS_TRAIN:-}" "${IDS_TEST:-}"; do
    [[ -f $f ]] || { echo "scaleout_bundle: ${f:-IDS_TRAIN or IDS_TEST} is missing" >&2; exit 1; }
  done
  binaries+=("$build/bench/lda_svi_run")
  cp "$IDS_TRAIN" "$out/data/ids_train.jsonl"
  cp "$IDS_TEST" "$out/data/ids_test.jsonl"
fi
for binary in "${binaries[@]}"; do
  name=$(basename "$binary")
  strip -o "$out/lib/$name.bin" "$binary"
  # Every library the dynamic linker resolves, and the linker itself.
  while read -r lib; do
    cp -nL "$lib" "$out/lib/"
  done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}')
  loader=$(ldd "$binary" | awk '$1 ~ /^\/.*ld-linux/ {print $1}' | head -1)
  # The bench runs the wrapper: the bundled loader with the bundled libraries.
  cat > "$out/bin/$name" <<EOF
#!/bin/sh
here=\$(CDPATH= cd -- "\$(dirname -- "\$0")/../lib" && pwd)
exec "\$here/$(basename "$loader")" --library-path "\$here" "\$here/$name.bin" "\$@"
EOF
  chmod +x "$out/bin/$name"
done
[[ -n $loader ]] || { echo "scaleout_bundle: no dynamic loader found by ldd" >&2; exit 1; }

head -n "$docs" "$corpus" > "$out/data/corpus.jsonl"
cp "$vocab" "$out/data/vocab.txt"
lines=$(wc -l < "$out/data/corpus.jsonl")
[[ $lines -eq $docs ]] || { echo "scaleout_bundle: the corpus has only $lines records" >&2; exit 1; }

# The bundle must run here as it will there.
"$out/bin/vipsd" --version > /dev/null
du -sh "$out" | awk '{print "scaleout_bundle: " $1 " in '"$out"' (carry limit 64 MiB)"}'
