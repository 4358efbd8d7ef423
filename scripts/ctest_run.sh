#!/usr/bin/env bash
# Runs ctest in BUILD_DIR with --output-on-failure and the given arguments.
# Two known aborts of librdkafka 2.0.2's mock cluster (the Kafka peer of
# the tests, not vipsd) are retried, and only those: it brings a broker back
# up (rd_kafka_mock_broker_set_up) by binding its old port again and aborts
# ("Failed to-create mock broker listener") when another socket took that
# port while the broker was down; and its group coordinator asserts
# ("rd_kafka_mock_cgrp_member_add: Assertion `!member->resp' failed") when a
# member joins again while its previous JoinGroup is still unanswered (the
# mock keeps a pending JoinGroup response of a member whose connection
# closed, and asserts when that member joins again). In
# harness.failover_shared, on 2 cores, it aborted in 2 of 3 local runs on
# 2026-11-27, after kill as well as pause events; the failover harnesses now
# run on a real Apache Kafka broker, and the tests that still rejoin groups
# on the mock are in-process (daemon_kafka_test). If every failed test
# failed with one of these aborts, and no sanitizer or UBSan report is in
# the output, the failed tests run again, up to five more times, and the
# last result counts. Anything else fails as it is.
#   scripts/ctest_run.sh BUILD_DIR [CTEST_ARGS...]
set -uo pipefail
dir=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
(cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[[ $status -eq 0 ]] && exit 0
for attempt in 1 2 3 4 5; do
  failed=$(sed -n '/^The following tests FAILED:/,$p' "$log" | grep -cE '^[[:space:]]+[0-9]+ - ')
  aborts=$(grep -cE 'Failed to-create mock broker listener|rd_kafka_mock_cgrp_member_add: Assertion' "$log")
  if [[ $failed -gt 0 && $aborts -eq $failed ]] &&
     ! grep -qE 'ThreadSanitizer|AddressSanitizer|LeakSanitizer|runtime error:' "$log"; then
    echo "ctest_run.sh: $failed test(s) failed only by a known abort of the mock cluster; running them again ($attempt of 5)"
    (cd "$dir" && ctest --output-on-failure --rerun-failed) 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    [[ $status -eq 0 ]] && exit 0
  else
    break
  fi
done
exit "$status"
