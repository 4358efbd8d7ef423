#!/usr/bin/env bash
# Configures and builds vipsd. Usage: scripts/build.sh [BUILD_DIR]
#   VIPSD_SANITIZE=address  ASan+UBSan build (default dir build-address)
#   VIPSD_SANITIZE=thread   TSan build (default dir build-thread)
#   VIPSD_BUILD_TYPE        CMake build type (default RelWithDebInfo)
set -euo pipefail
cd "$(dirname "$0")/.."
san=${VIPSD_SANITIZE:-}
dir=${1:-build${san:+-$san}}
cmake -S . -B "$dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="${VIPSD_BUILD_TYPE:-RelWithDebInfo}" \
  -DVIPSD_SANITIZE="$san" >/dev/null
ninja -C "$dir" -j"${VIPSD_JOBS:-$(nproc)}"
