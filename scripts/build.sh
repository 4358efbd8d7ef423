#!/usr/bin/env bash
# Configures and builds vipsd. Usage: scripts/build.sh [BUILD_DIR [TARGET...]]
#   no TARGET: every target (daemon, tools, tests, benchmarks); scripts/demo.sh
#   builds only the one it runs (vipsd)
#   VIPSD_SANITIZE=address  ASan+UBSan build (default dir build-address)
#   VIPSD_SANITIZE=thread   TSan build (default dir build-thread)
#   VIPSD_BUILD_TYPE        CMake build type (default RelWithDebInfo)
#   VIPSD_JOBS              parallel compile jobs (default: all cores)
#   VIPSD_BUILD_TESTS, VIPSD_BUILD_BENCHMARKS  ON (default) or OFF: configure
#                           the test suite and the benchmarks (OFF needs
#                           only scripts/setup.sh --demo's packages)
# ccache is used when it is installed (optional: it only speeds up rebuilds).
# Says what it does on stdout (configuring, how many build steps), then
# ninja's progress.
set -euo pipefail
cd "$(dirname "$0")/.."
san=${VIPSD_SANITIZE:-}
dir=${1:-build${san:+-$san}}
targets=("${@:2}")
build_type=${VIPSD_BUILD_TYPE:-RelWithDebInfo}
jobs=${VIPSD_JOBS:-$(nproc)}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Worktrees and sanitizer trees share cache entries: hash paths relative to /.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
echo "build: configuring $dir ($build_type${san:+, sanitizer $san}) with cmake"
cmake -S . -B "$dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="$build_type" \
  -DVIPSD_BUILD_TESTS="${VIPSD_BUILD_TESTS:-ON}" \
  -DVIPSD_BUILD_BENCHMARKS="${VIPSD_BUILD_BENCHMARKS:-ON}" \
  -DVIPSD_SANITIZE="$san" "${launcher[@]}" >/dev/null
# A dry run counts the steps (compile and link commands) still to run.
steps=$(ninja -C "$dir" -n "${targets[@]}" | grep -c '^\[' || true)
echo "build: $steps build steps for ${targets[*]:-every target}, $jobs at a time"
ninja -C "$dir" -j"$jobs" "${targets[@]}"
