#!/usr/bin/env bash
# scripts/oracle_venv.sh VENV_DIR
#
# Creates (or checks) the Python virtual environment of the independent
# accounting oracles (tests/core/privacy/dp_accounting_oracle.py): Google's
# dp-accounting and Microsoft's prv-accountant at the versions pinned in
# tests/core/privacy/oracle_requirements.txt, from PyPI, wheels only.
# ctest runs it as the fixture privacy.oracle_venv with
# VENV_DIR = <build dir>/oracle-venv.
#
# Idempotent: VENV_DIR/.vipsd-oracle-stamp records the requirement file's
# SHA-256 and the interpreter; while both match and the packages import, it
# does nothing and needs no network. Otherwise it deletes VENV_DIR (only if
# it is empty or a virtual environment) and installs again; the stamp is
# written last, so an interrupted install is redone by the next run.
#
# The interpreter is Debian's /usr/bin/python3 (python3-venv and the
# packages the suite needs come from scripts/setup.sh), not whatever
# python3 is first on PATH, so that the environment does not depend on a
# developer's pyenv or conda; VIPSD_ORACLE_PYTHON overrides it.
# prv-accountant is optional: if it fails to install, the oracle skips it
# and says so (dp-accounting is required).
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: scripts/oracle_venv.sh VENV_DIR" >&2
  exit 2
fi
venv=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
requirements="$here/../tests/core/privacy/oracle_requirements.txt"
python=${VIPSD_ORACLE_PYTHON:-/usr/bin/python3}
if [[ ! -x "$python" ]]; then
  python=$(command -v python3 || true)
  [[ -n "$python" ]] || { echo "oracle_venv: no python3 found" >&2; exit 1; }
fi

mkdir -p "$(dirname "$venv")"
# One installer at a time (two ctest runs in one build directory).
if command -v flock >/dev/null; then
  exec 9>"$venv.lock"
  flock 9
fi

digest=$(sha256sum "$requirements" | cut -d' ' -f1)
interpreter=$("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')
stamp_text="requirements $digest python $interpreter"
stamp="$venv/.vipsd-oracle-stamp"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" ]] &&
   "$venv/bin/python" -c 'import dp_accounting, mpmath, scipy' 2>/dev/null; then
  echo "oracle_venv: $venv is up to date ($(cat "$venv/.vipsd-oracle-versions" 2>/dev/null))"
  exit 0
fi

if [[ -e "$venv" ]]; then
  if [[ -n "$(ls -A "$venv")" && ! -f "$venv/pyvenv.cfg" ]]; then
    echo "oracle_venv: $venv exists and is not a virtual environment; not touching it" >&2
    exit 1
  fi
  rm -rf "$venv"
fi

echo "oracle_venv: creating $venv with $interpreter"
if ! "$python" -m venv "$venv"; then
  echo "oracle_venv: '$python -m venv' failed (Debian: apt-get install python3-venv," \
       "which scripts/setup.sh installs)" >&2
  exit 1
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --no-input
     --only-binary=:all: --timeout 60)
required=$(mktemp)
optional=$(mktemp)
trap 'rm -f "$required" "$optional"' EXIT
grep -v -E '^prv-accountant==' "$requirements" >"$required"
grep -E '^prv-accountant==' "$requirements" >"$optional" || true
"${pip[@]}" -r "$required"
if [[ -s "$optional" ]] && ! "${pip[@]}" -r "$optional"; then
  echo "oracle_venv: warning: prv-accountant did not install; the oracle will skip it" >&2
fi
"$venv/bin/python" -c 'import dp_accounting, mpmath, scipy'
"$venv/bin/python" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null |
  grep -i -E '^(dp-accounting|prv-accountant|numpy|scipy)==' | tr '\n' ' ' |
  sed 's/ $//' >"$venv/.vipsd-oracle-versions"
echo "$stamp_text" >"$stamp"
echo "oracle_venv: installed $(cat "$venv/.vipsd-oracle-versions")"
