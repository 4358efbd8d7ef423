#!/usr/bin/env bash
# Configures and builds vipsd. Usage: scripts/build.sh [BUILD_DIR]
#   VIPSD_SANITIZE=address  ASan+UBSan build (default dir build-address)
#   VIPSD_SANITIZE=thread   TSan build (default dir build-thread)
#   VIPSD_BUILD_TYPE        CMake build type (default RelWithDebInfo)
#   VIPSD_JOBS              parallel compile jobs (default: all cores)
# ccache is used when it is installed (optional: it only speeds up rebuilds).
set -euo pipefail
cd "$(dirname "$0")/.."
san=${VIPSD_SANITIZE:-}
dir=${1:-build${san:+-$san}}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Worktrees and sanitizer trees share cache entries: hash paths relative to /.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
cmake -S . -B "$dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="${VIPSD_BUILD_TYPE:-RelWithDebInfo}" \
  -DVIPSD_SANITIZE="$san" "${launcher[@]}" >/dev/null
ninja -C "$dir" -j"${VIPSD_JOBS:-$(nproc)}"
