#!/usr/bin/env bash
# Runs ctest in BUILD_DIR with --output-on-failure and the given arguments.
# One known flake is retried, and only that one: librdkafka 2.0.2's mock
# cluster brings a broker back up (rd_kafka_mock_broker_set_up) by binding
# its old port again and aborts ("Failed to-create mock broker listener")
# when another socket took that port while the broker was down. If every
# failed test failed with that abort, and no sanitizer or UBSan report is in
# the output, the failed tests run once more and their result counts.
# Anything else fails as it is.
#   scripts/ctest_run.sh BUILD_DIR [CTEST_ARGS...]
set -uo pipefail
dir=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
(cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[[ $status -eq 0 ]] && exit 0
failed=$(sed -n '/^The following tests FAILED:/,$p' "$log" | grep -cE '^[[:space:]]+[0-9]+ - ')
rebinds=$(grep -c 'Failed to-create mock broker listener' "$log")
if [[ $failed -gt 0 && $rebinds -eq $failed ]] &&
   ! grep -qE 'ThreadSanitizer|AddressSanitizer|LeakSanitizer|runtime error:' "$log"; then
  echo "ctest_run.sh: $failed test(s) failed only by the mock cluster's port re-bind abort; running them once more"
  (cd "$dir" && ctest --output-on-failure --rerun-failed)
  exit $?
fi
exit "$status"
