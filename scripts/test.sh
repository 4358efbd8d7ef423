#!/usr/bin/env bash
# The one command that runs the whole vipsd test suite:
#   installs missing packages, builds, runs every test with ctest.
# VIPSD_SANITIZE=address scripts/test.sh runs the same suite under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
san=${VIPSD_SANITIZE:-}
dir=build${san:+-$san}
scripts/build.sh "$dir"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$dir"
ctest --output-on-failure -j"$(nproc)"
