#!/usr/bin/env bash
# Installs every Debian 12 package vipsd needs to build, test and run.
# Idempotent: packages already installed are left alone, and apt is not
# touched at all when nothing is missing. Needs root (or sudo) only when
# something must be installed.
#   scripts/setup.sh           what the build, the demo and the tests need
#   scripts/setup.sh --demo    only what the daemon and its tools build and run
#                              with (scripts/demo.sh: no test, benchmark or
#                              fuzzing packages, about a third of the download)
#   scripts/setup.sh --bench   also the benchmark-only packages: the peer kit's
#                              gensim, scikit-learn and scipy, and matplotlib
#                              for scripts/results.py's plots
set -euo pipefail

PACKAGES=(
  # build
  cmake ninja-build pkg-config g++
  # core: linear algebra, secure randomness
  libeigen3-dev libsodium-dev
  # connectors / daemon / config
  librdkafka-dev prometheus-cpp-dev libyaml-cpp-dev nlohmann-json3-dev
  # the kcat command the demo prints; tools/decode_release.py
  kcat python3 python3-numpy
)
if [[ "${1:-}" == "--demo" ]]; then
  shift
else
  PACKAGES+=(
    # tests and benchmarks
    googletest libgtest-dev libgmock-dev libbenchmark-dev libboost-math-dev
    # an independent checker used by integration tests (kcat is above)
    prometheus
    # systemd-analyze (verify/security of the unit); absent from minimal images
    systemd
    # the release decoder's package (python/: venv + pip install, reading
    # releases straight from Kafka)
    python3-venv python3-pip python3-setuptools python3-confluent-kafka
    # libFuzzer targets (scripts/fuzz.sh): clang with its sanitizer runtimes
    clang libclang-rt-14-dev
    # the Apache Kafka broker the suite tests against (scripts/kafka_broker.sh:
    # its jars come from Maven Central, it runs on this JRE)
    openjdk-17-jre-headless maven
  )
fi

if [[ "${1:-}" == "--bench" ]]; then
  PACKAGES+=(python3-scipy python3-sklearn python3-gensim python3-matplotlib)
elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/setup.sh [--demo | --bench]" >&2
  exit 2
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
