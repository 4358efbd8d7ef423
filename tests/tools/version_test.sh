#!/usr/bin/env bash
# Every binary answers --version with "<its name> <version>" and exit 0, and
# --help with exit 0. Usage: version_test.sh VERSION BINARY...
set -euo pipefail
version=$1
shift
for binary in "$@"; do
  name=$(basename "$binary")
  out=$("$binary" --version)
  [[ "$out" == "$name $version" ]] || { echo "FAIL: $name --version said '$out'"; exit 1; }
  "$binary" --help >/dev/null || { echo "FAIL: $name --help exited non-zero"; exit 1; }
done
echo "--version and --help on: $*"
