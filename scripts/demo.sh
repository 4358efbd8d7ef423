#!/usr/bin/env bash
# The README's "run it" command: installs what is needed, builds the one
# binary the demo runs (build/daemon/vipsd), and runs the daemon's main job
# on its embedded default — private LDA over the bundled synthetic corpus,
# fed through an in-process Kafka (librdkafka's mock cluster), until the
# demo's epsilon ceiling; then prints the top words of a few topics and
# where the releases are. Each phase says what it does and when it starts.
#
# A fresh build/ is configured Release (no debug information: about a third
# less compile time than the default RelWithDebInfo, which matters on a
# small machine) and without the test suite and benchmarks (so only
# scripts/setup.sh --demo's packages are needed); a build/ that exists keeps
# its build type and what it configures, so a tree scripts/test.sh built is
# reused as it is (and scripts/test.sh after the demo adds the rest).
# VIPSD_BUILD_TYPE overrides the build type.
#
# The demo starts from a fresh state directory (out/demo/state) every time:
# its Kafka lives in this process, so its data and budget do too. A real
# deployment keeps state.directory for ever (docs/operations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "== [$1/3, ${SECONDS} s] $2"; }

phase 1 "Debian packages: scripts/setup.sh --demo installs the missing ones (about 30 s on a fresh machine with a nearby mirror)"
scripts/setup.sh --demo

cached() { sed -n "s/^$1:[A-Z]*=//p" build/CMakeCache.txt 2>/dev/null || true; }
if [[ -z ${VIPSD_BUILD_TYPE:-} ]]; then
  VIPSD_BUILD_TYPE=$(cached CMAKE_BUILD_TYPE)
  export VIPSD_BUILD_TYPE=${VIPSD_BUILD_TYPE:-Release}
fi
tests=$(cached VIPSD_BUILD_TESTS)
benchmarks=$(cached VIPSD_BUILD_BENCHMARKS)
export VIPSD_BUILD_TESTS=${tests:-OFF} VIPSD_BUILD_BENCHMARKS=${benchmarks:-OFF}
phase 2 "building only the daemon, build/daemon/vipsd (about 3.5 minutes on 2 cores the first time, seconds later)"
scripts/build.sh build vipsd

rm -rf out/demo
mkdir -p out/demo
phase 3 "starting the demo: 5000 synthetic documents from 8 known themes (config/examples/demo/topics.txt)"
echo "== private LDA, sigma 2.0, q 0.1, stops before epsilon would exceed 4.0 (delta 1e-5)"
build/daemon/vipsd --config config/examples/demo.yaml
echo
echo "== the themes the corpus was drawn from:"
cat config/examples/demo/topics.txt
