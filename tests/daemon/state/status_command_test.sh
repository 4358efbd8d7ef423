#!/usr/bin/env bash
# `vipsd status` against a state directory the daemon wrote (the LDA offline
# example, 3 steps): it verifies, and its epsilon is the release manifest's
# and the planner's (one number everywhere), at the delta the ledger
# records (--delta cannot change it); a larger delta on restart is refused
# and a smaller one recorded; a contaminated directory names its first non-private and
# fixed-seed steps; damaged ledgers and checkpoints exit 1 naming the
# problem; no ledger or a bad --delta exit 2. Usage: status_command_test.sh
# VIPSD VIPSD_PRIVACY SOURCE_DIR.
set -euo pipefail
vipsd=$1
planner=$2
source_dir=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() {  # file key
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(repr(v) if isinstance(v,float) else v)' "$1" "$2"
}

cp "$source_dir/config/examples/lda_offline.yaml" "$work/"
cp -r "$source_dir/config/examples/demo" "$work/"
cp "$source_dir/config/examples/"*.txt "$work/" 2>/dev/null || true
cp "$work/demo/corpus.jsonl" "$work/train.jsonl"
sed -i -e "s|^  max_steps: [0-9]*|  max_steps: 3|" -e "s|^  max_epochs: [0-9.]*|  max_epochs: 0|" \
  "$work/lda_offline.yaml"
(cd "$work" && "$vipsd" --config lda_offline.yaml >"$work/run.out" 2>&1) ||
  { cat "$work/run.out"; fail "the offline example does not run"; }

"$vipsd" status --state "$work/state" --json >"$work/status.json" ||
  { cat "$work/status.json"; fail "status of a fresh directory does not verify"; }
[[ $(field "$work/status.json" ledger_verifies) == True ]] || fail "ledger_verifies"
[[ $(field "$work/status.json" checkpoint_verifies) == True ]] || fail "checkpoint_verifies"
[[ $(field "$work/status.json" next_step) == 4 ]] || fail "next_step is not 4"
[[ $(field "$work/status.json" private_steps) == 3 ]] || fail "private_steps is not 3"
[[ $(field "$work/status.json" last_release_step) == 3 ]] || fail "last_release_step is not 3"
status_eps=$(field "$work/status.json" epsilon_spent)
manifest_eps=$(field "$work/releases/step-3/manifest.json" epsilon_spent)
[[ "$status_eps" == "$manifest_eps" ]] ||
  fail "status says epsilon $status_eps, the release manifest $manifest_eps"
[[ $(field "$work/status.json" accountant) == $(field "$work/releases/step-3/manifest.json" accountant) ]] ||
  fail "status and manifest name different accountants"
"$planner" epsilon --sampling-rate 0.01 --noise-multiplier 1.0 --steps 3 --delta 1e-5 --json \
  >"$work/plan.json"
[[ "$status_eps" == "$(field "$work/plan.json" epsilon)" ]] ||
  fail "status says epsilon $status_eps, the planner $(field "$work/plan.json" epsilon)"
# The ledger records delta: --delta cannot lower epsilon (it is reported as
# ignored), and without status.json epsilon is still known.
"$vipsd" status --state "$work/state" --delta 1e-3 --json >"$work/s2.json"
python3 -c "import json,sys; a=json.load(open(sys.argv[1])); assert repr(a['epsilon_spent']) == '$status_eps' and a['delta'] == 1e-5 and a['delta_option'].startswith('ignored'), a" \
  "$work/s2.json" || fail "--delta 1e-3 changed epsilon of a directory that records delta 1e-5"
cp -r "$work/state" "$work/nostatus" && rm "$work/nostatus/status.json"
"$vipsd" status --state "$work/nostatus" >"$work/s3.txt"
grep -q "^epsilon_spent: *$status_eps" "$work/s3.txt" || { cat "$work/s3.txt"; fail "no status.json: epsilon not at the recorded delta"; }
grep -q "^mode: *global" "$work/s3.txt" || { cat "$work/s3.txt"; fail "text form"; }
grep -q "^unit: *record$" "$work/s3.txt" || { cat "$work/s3.txt"; fail "text: unit record"; }
grep -q "^protects: *one record$" "$work/s3.txt" || { cat "$work/s3.txt"; fail "text: protects"; }

# Issue 49: delta is pinned by the ledger. A restart with a larger delta
# exits 2 naming privacy.delta (and spends nothing); a smaller one is
# accepted and recorded, and status states every epsilon at it.
cp -r "$work/state" "$work/pinned"
sed -e "s|^  directory: state|  directory: pinned|" -e "s|^  directory: releases|  directory: pinned_releases|" \
  -e "s|^  max_steps: [0-9]*|  max_steps: 1|" -e "s|^  delta: .*|  delta: 1.0e-2|" \
  "$work/lda_offline.yaml" >"$work/larger_delta.yaml"
grep -q "^  delta: 1.0e-2" "$work/larger_delta.yaml" || fail "larger_delta.yaml: no delta line"
set +e
(cd "$work" && "$vipsd" --config larger_delta.yaml >"$work/larger.out" 2>&1)
code=$?
set -e
[[ $code == 2 ]] || { cat "$work/larger.out"; fail "a larger delta exited $code, not 2"; }
grep -q "larger_delta.yaml:[0-9]*: privacy.delta: 0.01 is above the delta this state directory is held to (1e-05)" \
  "$work/larger.out" || { cat "$work/larger.out"; fail "the refusal does not name the key, line and both values"; }
(cd "$work" && "$vipsd" --config larger_delta.yaml --check-config) >"$work/larger_check.out" 2>&1 && fail "--check-config accepts the larger delta"
grep -q "privacy.delta" "$work/larger_check.out" || { cat "$work/larger_check.out"; fail "--check-config: no privacy.delta"; }
"$vipsd" status --state "$work/pinned" --json >"$work/p1.json"
[[ $(field "$work/p1.json" next_step) == 4 ]] || fail "the refused start spent a step"
sed -e "s|^  delta: 1.0e-2|  delta: 1.0e-6|" "$work/larger_delta.yaml" >"$work/smaller_delta.yaml"
(cd "$work" && "$vipsd" --config smaller_delta.yaml >"$work/smaller.out" 2>&1) ||
  { cat "$work/smaller.out"; fail "a smaller delta is refused"; }
grep -q "^delta " "$work/pinned/ledger" || fail "the ledger records no delta"
"$vipsd" status --state "$work/pinned" --delta 1e-5 --json >"$work/p2.json"
python3 -c "import json,sys; a=json.load(open(sys.argv[1])); assert a['delta'] == 1e-6 and a['next_step'] == 5 and a['epsilon_spent'] > $status_eps, a" \
  "$work/p2.json" || fail "status does not state epsilon at the recorded, lowered delta"
"$planner" epsilon --sampling-rate 0.01 --noise-multiplier 1.0 --steps 4 --delta 1e-6 --json \
  >"$work/plan4.json"
[[ "$(field "$work/p2.json" epsilon_spent)" == "$(field "$work/plan4.json" epsilon)" ]] ||
  fail "status says $(field "$work/p2.json" epsilon_spent) at delta 1e-6, the planner $(field "$work/plan4.json" epsilon)"

# A directory whose steps all ran private names no first non-private step.
python3 -c "import json,sys; a=json.load(open(sys.argv[1])); assert a['private'] is True and a['first_non_private_step'] is None and a['first_fixed_seed_step'] is None, a" \
  "$work/status.json" || fail "a private directory names a first non-private step"
grep -q "^first_non_private_step: *none$" "$work/s3.txt" || { cat "$work/s3.txt"; fail "text: first_non_private_step none"; }

# A directory that is not private (vipsd keeps one privacy mode per state
# directory, so such steps never follow private ones): steps 1-2 with
# noise_multiplier 0, step 3 with fixed-seed noise; status names the first
# step of each kind.
sed -e "s|^  directory: state|  directory: mixed|" -e "s|^  directory: releases|  directory: mixed_releases|" \
  -e "s|^  max_steps: [0-9]*|  max_steps: 2|" -e "s|^  noise_multiplier: [0-9.]*|  noise_multiplier: 0|" \
  "$work/lda_offline.yaml" >"$work/open.yaml"
grep -q "^  noise_multiplier: 0" "$work/open.yaml" || fail "open.yaml: no noise_multiplier line"
(cd "$work" && "$vipsd" --config open.yaml >"$work/run.out" 2>&1) ||
  { cat "$work/run.out"; fail "the non-private steps do not run"; }
sed -e "s|^  directory: state|  directory: mixed|" -e "s|^  directory: releases|  directory: mixed_releases|" \
  -e "s|^  max_steps: [0-9]*|  max_steps: 1|" -e "s|^  noise: secure|  noise: fixed_seed|" \
  -e "/^  schedule: /d" "$work/lda_offline.yaml" >"$work/seeded.yaml"  # the ledger's schedule
(cd "$work" && "$vipsd" --config seeded.yaml --insecure-fixed-seed-noise >"$work/run.out" 2>&1) ||
  { cat "$work/run.out"; fail "the fixed-seed step does not run"; }
"$vipsd" status --state "$work/mixed" --json >"$work/mixed.json" || { cat "$work/mixed.json"; fail "mixed: does not verify"; }
python3 -c "import json,sys; a=json.load(open(sys.argv[1])); assert (a['private_steps'], a['non_private_steps'], a['first_non_private_step'], a['fixed_seed_steps'], a['first_fixed_seed_step'], a['private']) == (0, 2, 1, 1, 3, False), a" \
  "$work/mixed.json" || fail "mixed: the first non-private / fixed-seed steps are not 1 / 3"
"$vipsd" status --state "$work/mixed" >"$work/mixed.txt"
grep -q "^first_non_private_step: *1$" "$work/mixed.txt" || { cat "$work/mixed.txt"; fail "text: first_non_private_step"; }
grep -q "^first_fixed_seed_step: *3$" "$work/mixed.txt" || { cat "$work/mixed.txt"; fail "text: first_fixed_seed_step"; }

# A flipped byte in the ledger: exit 1, ledger_verifies false, the reason.
cp -r "$work/state" "$work/flipped"
python3 - "$work/flipped/ledger" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x01
open(p, "wb").write(b)
PY
if "$vipsd" status --state "$work/flipped" --json >"$work/s4.json"; then fail "a flipped ledger verified"; fi
[[ $(field "$work/s4.json" ledger_verifies) == False ]] || fail "flipped: ledger_verifies"
grep -q "ledger_error" "$work/s4.json" || fail "flipped: no ledger_error"
# A truncated checkpoint: exit 1, checkpoint_verifies false.
cp -r "$work/state" "$work/torn"
truncate -s 100 "$work/torn/checkpoint"
if "$vipsd" status --state "$work/torn" --json >"$work/s5.json"; then fail "a torn checkpoint verified"; fi
[[ $(field "$work/s5.json" checkpoint_verifies) == False ]] || fail "torn: checkpoint_verifies"
# No ledger, a bad --delta, a missing --state: exit 2.
set +e
"$vipsd" status --state "$work/demo" >/dev/null 2>&1; [[ $? == 2 ]] || fail "no ledger: not exit 2"
"$vipsd" status --state "$work/state" --delta 2 >/dev/null 2>&1; [[ $? == 2 ]] || fail "delta 2"
"$vipsd" status --state "$work/state" --delta x >/dev/null 2>&1; [[ $? == 2 ]] || fail "delta x"
"$vipsd" status >/dev/null 2>&1; [[ $? == 2 ]] || fail "no --state"
set -e
echo "vipsd status: verifies the daemon's directory, epsilon $status_eps equals the manifest's and"
echo "the planner's; names the first non-private and fixed-seed steps; flipped ledgers and torn"
echo "checkpoints exit 1; no ledger / bad delta exit 2"
