#!/usr/bin/env bash
# The robustness harnesses on their own (tests/harness/): random SIGKILLs,
# broker faults, memory under overload and with a large model, and failover
# between an active daemon and two hot standbys, each against a Kafka
# cluster in its own process (vipsd-mock-kafka). The test command runs them
# with 30 kills (8 failover events); the long mode runs more:
#   scripts/harness.sh [KILLS]        # default 30; e.g. 300 for the long mode
#                                     # (failover events: KILLS / 10, 8 to 30)
# VIPSD_HARNESS_SEED fixes the kill schedule (each run prints its seed).
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-30}
scripts/build.sh build >/dev/null
# Failover events: KILLS / 10, between 8 and 30 (the mock keeps only ~5 MiB
# of a partition, and every slot adds a ~4 KB compressed ledger entry).
events=$(( kills / 10 < 8 ? 8 : (kills / 10 > 30 ? 30 : kills / 10) ))
export VIPSD_HARNESS_KILLS=$kills VIPSD_FAILOVER_EVENTS=$events
(cd build && ctest --output-on-failure -L harness --timeout $((600 + kills * 20)))
