#!/usr/bin/env bash
# The one command that runs the whole vipsd test suite:
#   installs missing packages, fetches the Apache Kafka broker the Kafka
#   tests run against (scripts/kafka_broker.sh; ctest starts and stops it
#   as the fixture real_kafka), builds, runs every test with ctest, then
#   builds the libFuzzer targets (clang, ASan + UBSan) and runs each for
#   VIPSD_FUZZ_SECONDS (default 30; 0 skips) on its seed and regression
#   corpus (scripts/fuzz.sh, fuzz/README.md), then runs the concurrent
#   code's tests under ThreadSanitizer (scripts/tsan.sh; VIPSD_TSAN=0 skips)
#   and the whole suite under clang ASan+UBSan (scripts/asan.sh;
#   VIPSD_ASAN=0 skips).
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
scripts/ctest_run.sh "$dir" -j"$(nproc)"  # retries only the mock cluster's re-bind abort
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
