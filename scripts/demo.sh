#!/usr/bin/env bash
# The README's "run it" command: installs what is needed, builds, and runs
# the daemon's main job on its embedded default — private LDA over the
# bundled synthetic corpus, fed through an in-process Kafka (librdkafka's
# mock cluster), until the demo's epsilon ceiling; then prints the top words
# of a few topics and where the releases are.
#
# The demo starts from a fresh state directory (out/demo/state) every time:
# its Kafka lives in this process, so its data and budget do too. A real
# deployment keeps state.directory for ever (README "Running as a service").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build >/dev/null
rm -rf out/demo
mkdir -p out/demo
echo "== vipsd demo: 5000 synthetic documents from 8 known themes (config/examples/demo/topics.txt)"
echo "== private LDA, sigma 2.0, q 0.1, stops before epsilon would exceed 4.0 (delta 1e-5)"
build/daemon/vipsd --config config/examples/demo.yaml
echo
echo "== the themes the corpus was drawn from:"
cat config/examples/demo/topics.txt
