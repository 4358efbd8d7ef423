#!/usr/bin/env bash
# The unit and integration suite under AddressSanitizer +
# UndefinedBehaviorSanitizer, built with clang (its UBSan includes
# float-cast-overflow; a gcc ASan tree of everything is too slow for CI on
# 2 cores). Tree: build-asan (no benchmarks). No suppressions.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVIPSD_SANITIZE=address -DVIPSD_BUILD_BENCHMARKS=OFF "${launcher[@]}" >/dev/null
ninja -C build-asan -j"${VIPSD_JOBS:-$(nproc)}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The harnesses, the shipped examples' checks and the benchmark smoke run
# (label optimized_tree) run in the plain tree: they time the daemon against
# the wall clock as a user's build runs, and under ASan each harness run would
# take minutes.
scripts/ctest_run.sh build-asan -j"$(nproc)" -LE optimized_tree
