#!/usr/bin/env bash
# Checks daemon/systemd/vipsd.service offline with systemd's own tools:
#  1. `systemd-analyze verify` on a copy whose Exec lines point at the built
#     vipsd binary (a missing or non-executable binary is fatal); unknown
#     keys, sections or settings only warn there, so any warning about the
#     unit file fails this test (a typo in a hardening option would
#     otherwise silently drop that protection);
#  2. `systemd-analyze security --offline=yes` exposure score must stay at or
#     below --max-exposure (default 1.5; 1.1 when this test was written).
# Works without systemd as PID 1 (containers, CI).
#
#   systemd_unit_test.sh --unit FILE --binary VIPSD [--systemd-analyze BIN] [--max-exposure N]
set -euo pipefail

analyze=systemd-analyze
unit=""
binary=""
max_exposure=1.5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --unit) unit=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --systemd-analyze) analyze=$2; shift 2 ;;
    --max-exposure) max_exposure=$2; shift 2 ;;
    *) echo "systemd_unit_test: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$unit" && -n "$binary" ]] || { echo "usage: $0 --unit FILE --binary VIPSD" >&2; exit 2; }
command -v "$analyze" >/dev/null || {
  echo "FAIL: '$analyze' not found (Debian package 'systemd'; run scripts/setup.sh)" >&2; exit 1; }
[[ -x "$binary" ]] || { echo "FAIL: vipsd binary '$binary' is not executable" >&2; exit 1; }
binary=$(realpath "$binary")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
copy="$tmp/vipsd.service"
sed "s#/usr/local/bin/vipsd#${binary}#g" "$unit" > "$copy"
grep -q "^ExecStart=${binary} " "$copy" || { echo "FAIL: ExecStart does not run /usr/local/bin/vipsd" >&2; exit 1; }

status=0
"$analyze" verify "$copy" > "$tmp/verify.out" 2>&1 || status=$?
cat "$tmp/verify.out"
if [[ $status -ne 0 ]]; then
  echo "FAIL: systemd-analyze verify exited with $status" >&2; exit 1
fi
# Every diagnostic about our file starts with its path; anything else
# (e.g. complaints about unrelated system units) is ignored.
if grep -E "^${copy}(:[0-9]+)?:|Unknown (key|section|lvalue)|Failed to parse|is not executable|Invalid" "$tmp/verify.out"; then
  echo "FAIL: systemd-analyze verify reported problems in the unit (above)" >&2; exit 1
fi

"$analyze" security --offline=yes --no-pager "$copy" > "$tmp/security.out" 2>&1 || true
score=$(sed -n 's/.*Overall exposure level for vipsd.service: \([0-9.]*\).*/\1/p' "$tmp/security.out")
if [[ -z "$score" ]]; then
  cat "$tmp/security.out"; echo "FAIL: no exposure score from systemd-analyze security" >&2; exit 1
fi
echo "systemd-analyze security: exposure ${score} (maximum allowed ${max_exposure})"
if ! awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }'; then
  grep "✗" "$tmp/security.out" || true
  echo "FAIL: exposure ${score} is above ${max_exposure}" >&2; exit 1
fi
echo "PASS: vipsd.service verifies cleanly, exposure ${score}"
