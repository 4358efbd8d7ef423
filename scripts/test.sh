#!/usr/bin/env bash
# The one command that runs the whole vipsd test suite:
#   installs missing packages, fetches the Apache Kafka broker the Kafka
#   tests run against (scripts/kafka_broker.sh; ctest starts and stops it
#   as the fixture real_kafka), builds, runs the optimized_tree tests with
#   ctest (the harnesses and the benchmark smoke run; every test when
#   VIPSD_ASAN=0), then
#   builds the libFuzzer targets (clang, ASan + UBSan) and runs each for
#   VIPSD_FUZZ_SECONDS (default 30; 0 skips) on its seed and regression
#   corpus (scripts/fuzz.sh, fuzz/README.md), then runs the concurrent
#   code's tests under ThreadSanitizer (scripts/tsan.sh; VIPSD_TSAN=0 skips)
#   and every other test under clang ASan+UBSan (scripts/asan.sh;
#   VIPSD_ASAN=0 skips it, and the plain tree runs them).
# VIPSD_SANITIZE=address scripts/test.sh runs the same suite under ASan+UBSan,
# VIPSD_SANITIZE=thread under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/kafka_broker.sh fetch
san=${VIPSD_SANITIZE:-}
dir=build${san:+-$san}
scripts/build.sh "$dir"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# librdkafka is not built with TSan: its internal races are suppressed (its C11
# threads are made visible by connectors/kafka/tsan_c11_threads.c).
if [[ "$san" == thread ]]; then
  export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$PWD/scripts/tsan.supp halt_on_error=1}
fi
# When the ASan stage runs below (the plain tree, ASan not disabled), it runs
# every test but those labelled optimized_tree (the harnesses and the
# shipped examples' checks, timed against the wall clock as a user's build
# runs, and the benchmark smoke run, whose binaries only the plain tree
# builds); the plain tree then runs only those.
# Every test thus runs once, under ASan+UBSan where it can; on 2 cores a
# second plain run of the rest cost CI minutes and found nothing the ASan run
# does not. VIPSD_ASAN=0 runs the whole suite here.
plain=()
if [[ -z "$san" && "${VIPSD_ASAN:-1}" != 0 ]]; then
  plain=(-L optimized_tree)
fi
scripts/ctest_run.sh "$dir" -j"$(nproc)" "${plain[@]}"  # retries only the mock cluster's re-bind abort
fuzz_seconds=${VIPSD_FUZZ_SECONDS:-30}
if [[ -z "$san" && "$fuzz_seconds" != 0 ]]; then
  scripts/fuzz.sh "$fuzz_seconds"
fi
if [[ -z "$san" && "${VIPSD_TSAN:-1}" != 0 ]]; then
  scripts/tsan.sh
fi
if [[ -z "$san" && "${VIPSD_ASAN:-1}" != 0 ]]; then
  scripts/asan.sh
fi
