#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan with float-cast-overflow;
# fuzz/README.md) in build-fuzz and runs each for SECONDS (default 30) on its
# committed seed corpus plus the inputs it finds. A crash, a sanitizer report
# or a violated property fails the script; the input is kept in
# build-fuzz/findings/TARGET/. Longer runs: scripts/fuzz.sh 3600.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] ||
  targets=(fuzz_record_decoders fuzz_config fuzz_vocabulary fuzz_state fuzz_release fuzz_partial_sum fuzz_work_message)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVIPSD_SANITIZE=fuzz -DVIPSD_BUILD_TESTS=OFF -DVIPSD_BUILD_BENCHMARKS=OFF \
  "${launcher[@]}" >/dev/null
ninja -C build-fuzz -j"${VIPSD_JOBS:-$(nproc)}" "${targets[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for target in "${targets[@]}"; do
  work=build-fuzz/corpus/$target findings=build-fuzz/findings/$target
  mkdir -p "$work" "$findings"
  seeds=(fuzz/corpus/"$target")
  # The configuration loader also starts from every shipped example.
  [[ $target == fuzz_config ]] && seeds+=(config/examples)
  echo "fuzz: $target for ${seconds}s"
  if ! build-fuzz/fuzz/"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$findings/" -print_final_stats=1 "$work" "${seeds[@]}" \
       >"$findings/log" 2>&1; then
    echo "fuzz: $target FAILED; input and log in $findings/" >&2
    tail -40 "$findings/log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$findings/log" |
      sed "s/^/fuzz: $target /"
  fi
done
exit $status
