#!/usr/bin/env bash
# The kcat command the embedded demo prints for reading its releases is one
# the reference decoder accepts: run the demo configuration, take the
# printed command while the daemon runs, run it as printed (from a
# directory laid out like the repository), and require verified releases.
# Usage: demo_kcat_command_test.sh VIPSD SOURCE_DIR
set -euo pipefail
vipsd=$1
source_dir=$2
work=$(mktemp -d)
pid=""
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
demo="$source_dir/config/examples/demo"
sed -e "s|vocabulary: demo/vocab.txt|vocabulary: $demo/vocab.txt|" \
    -e "s|demo_corpus: demo/corpus.jsonl|demo_corpus: $demo/corpus.jsonl|" \
    -e "s|mirror_directory: .*|mirror_directory: $work/mirror|" \
    -e "s|  directory: ../../out/demo/state|  directory: $work/state|" \
    -e "s|listen: 127.0.0.1:0 .*|listen: \"\"|" \
    "$source_dir/config/examples/demo.yaml" > "$work/vipsd.yaml"
"$vipsd" --config "$work/vipsd.yaml" >"$work/stdout" 2>"$work/stderr" &
pid=$!
command=""
for _ in $(seq 300); do
  command=$(sed -n 's/^Read releases while it runs:  //p' "$work/stdout")
  [[ -n "$command" ]] && ls "$work/mirror" 2>/dev/null | grep -q step- && break
  sleep 0.1
done
[[ -n "$command" ]] || { cat "$work/stdout" "$work/stderr"; fail "the demo printed no kcat command"; }
ls "$work/mirror" | grep -q step- || fail "the demo published no release"
# The command names tools/decode_release.py relative to the repository root.
mkdir "$work/root"
ln -s "$source_dir/tools" "$work/root/tools"
ln -s "$source_dir/python" "$work/root/python"
(cd "$work/root" && bash -c "$command" >"$work/decoded.txt" 2>"$work/decode.err") ||
  { cat "$work/decode.err"; fail "the printed command failed: $command"; }
grep -q "^release_id *step-" "$work/decoded.txt" ||
  { cat "$work/decoded.txt" "$work/decode.err"; fail "the printed command decoded no release"; }
echo "the demo's printed command decodes $(grep -c '^release_id' "$work/decoded.txt") release(s)"
