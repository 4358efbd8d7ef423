#!/usr/bin/env bash
# Every shipped example configuration passes `vipsd --check-config`, the
# planner says the daemon would start with it, and each offline example
# runs for a step on generated data of its record format (the examples'
# own train.jsonl paths are the operator's). lda_wikipedia.yaml reads data
# the project may not ship: scripts/prepare_wikipedia.py --example, run on a
# generated stand-in corpus, writes its vocabulary and training file where
# the example looks. Usage: examples_test.sh VIPSD VIPSD_PRIVACY SOURCE_DIR.
set -euo pipefail
vipsd=$1
planner=$2
source_dir=$3
# A temporary copy with the repository's layout (config/examples, scripts,
# out), so that the examples' relative paths (../../out/...) stay inside it.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
work=$root/config/examples
mkdir -p "$work" "$root/scripts"
fail() { echo "FAIL: $*" >&2; exit 1; }

cp -r "$source_dir/config/examples/." "$work/"
cp "$source_dir/scripts/prepare_wikipedia.py" "$root/scripts/"
# The service example's /var/lib/vipsd is systemd's StateDirectory; the
# check looks at the real directory, so point it somewhere this user owns.
sed -i "s|/var/lib/vipsd|$work/service_state|" "$work"/*.yaml
# A stand-in for the Wikipedia corpus (never the real one: its licence
# forbids bundling it): the demo's documents as paragraphs of made-up
# articles, and a small vocabulary generated from their words.
stand_in=$root/data/wikipedia_paragraphs
mkdir -p "$stand_in"
python3 - "$work/demo/corpus.jsonl" "$stand_in" <<'PY'
import collections, gzip, json, re, sys
corpus, out = sys.argv[1], sys.argv[2]
texts = []
for line in open(corpus, encoding="utf-8", errors="replace"):
    try:
        doc = json.loads(line)
    except ValueError:
        continue  # the demo's malformed records
    if isinstance(doc, dict) and isinstance(doc.get("text"), str):
        texts.append(doc["text"])
words = collections.Counter(w for t in texts for w in re.findall(r"[a-z]+", t.lower()))
with open(f"{out}/vocab_train_top10000.txt", "w") as f:
    f.write("".join(w + "\n" for w, _ in words.most_common(120)))
with gzip.open(f"{out}/train.jsonl.gz", "wt") as f:
    for i, t in enumerate(texts[:1500]):
        f.write(json.dumps({"id": f"standin{i // 3}_p{i % 3}", "text": t}) + "\n")
with open(f"{out}/test.jsonl", "w") as f:
    for i, t in enumerate(texts[1500:1600]):
        f.write(json.dumps({"id": f"standintest{i}_p0", "text": t}) + "\n")
PY
python3 "$root/scripts/prepare_wikipedia.py" --example "$stand_in" >"$work/prepare.out" 2>&1 ||
  { cat "$work/prepare.out"; fail "scripts/prepare_wikipedia.py --example on the stand-in corpus"; }
[[ $(wc -l <"$root/out/wikipedia/vocab.txt") == 120 ]] ||
  fail "prepare_wikipedia.py did not write the stand-in vocabulary to out/wikipedia/vocab.txt"
grep -qF "config/examples/lda_wikipedia.yaml reads out/wikipedia/vocab.txt" "$work/prepare.out" ||
  { cat "$work/prepare.out"; fail "prepare_wikipedia.py does not say where the example reads"; }
# The federated examples (docs/federation.md): the holder's key is made
# here, and its public key replaces hospital-a's in both files; a holder
# whose key is not its roster entry is refused.
fed=$work/federation
sed -i "s|/var/lib/vipsd|$work/service_state|" "$fed"/*.yaml
"$vipsd" federation-keygen --out "$fed/holder.key" >"$fed/public.txt" ||
  fail "vipsd federation-keygen"
[[ $(stat -c %a "$fed/holder.key") == 600 ]] || fail "federation-keygen: the key file is not 0600"
"$vipsd" --config "$fed/holder.yaml" --check-config >"$fed/check.out" 2>&1 &&
  fail "a holder whose key is not the roster's passes --check-config"
grep -q "federation.secret_key: .*unknown key" "$fed/check.out" ||
  { cat "$fed/check.out"; fail "no 'unknown key' for a holder key the roster does not list"; }
sed -i "s|hospital-a: [0-9a-f]*|hospital-a: $(cat "$fed/public.txt")|" "$fed"/*.yaml
for config in "$fed"/*.yaml; do
  "$vipsd" --config "$config" --check-config >"$fed/check.out" 2>&1 ||
    { cat "$fed/check.out"; fail "federation/$(basename "$config") does not pass --check-config"; }
done
for config in "$work"/*.yaml; do
  name=$(basename "$config")
  "$vipsd" --config "$config" --check-config >"$work/check.out" 2>&1 ||
    { cat "$work/check.out"; fail "$name does not pass --check-config"; }
  grep -q "is valid" "$work/check.out" || fail "$name: no 'is valid' line"
  # A non-private example (lda_public_fit.yaml) has no budget to plan.
  grep -q "^  noise_multiplier: 0 " "$config" && continue
  "$planner" plan --config "$config" >"$work/plan.out" 2>&1 ||
    { cat "$work/plan.out"; fail "$name: the planner says the daemon would not start"; }
done

# Generated records of each offline model's format.
python3 - "$work" <<'PY'
import json, random, sys
work = sys.argv[1]
random.seed(7)
with open(f"{work}/lda_train.jsonl", "w") as out:
    for line in open(f"{work}/demo/corpus.jsonl"):
        out.write(line)
with open(f"{work}/lda_unit_train.jsonl", "w") as out:  # an author per record
    for i, line in enumerate(open(f"{work}/demo/corpus.jsonl")):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            doc["author"] = f"author{i % 500}"
            out.write(json.dumps(doc) + "\n")
with open(f"{work}/blr_train.jsonl", "w") as out:
    for i in range(400):
        x = [random.uniform(-0.1, 0.1) for _ in range(92)]
        out.write(json.dumps({"x": x, "y": int(x[0] > 0)}) + "\n")
with open(f"{work}/sbn_train.jsonl", "w") as out:
    for i in range(400):
        out.write(json.dumps({"y": [random.randint(0, 1) for _ in range(784)]}) + "\n")
PY

for example in lda_offline blr_offline sbn_offline lda_wikipedia lda_public_fit lda_public_prior \
    lda_unit; do
  config="$work/$example.yaml"
  outputs=$work  # where the example writes releases/, state/ and dead_letter.jsonl
  prefix=""      # lda_public_fit writes public_releases/, public_state/, ...
  if [[ $example == lda_wikipedia ]]; then
    # Its own paths: the training file prepare_wikipedia.py wrote, outputs
    # beside it.
    outputs=$root/out/wikipedia
  elif [[ $example == lda_public_fit ]]; then
    prefix=public_  # reads the shipped public corpus, demo/public.jsonl
  else
    data=${example%_offline}
    data=${data%_public_prior}
    sed -i "s|^  path: train.jsonl|  path: ${data}_train.jsonl|" "$config"
  fi
  sed -i -e "s|^  max_steps: [0-9]*|  max_steps: 1|" \
         -e "s|^  max_epochs: [0-9.]*|  max_epochs: 0|" "$config"
  grep -q "^  max_steps: 1" "$config" || fail "$example.yaml has no schedule.max_steps line"
  (cd "$work" && "$vipsd" --config "$config" >"$work/run.out" 2>&1) ||
    { cat "$work/run.out"; fail "$example.yaml does not run"; }
  ls "$outputs/${prefix}releases" | grep -q '^step-1$' ||
    { cat "$work/run.out"; fail "$example.yaml: no release step-1 in $outputs/${prefix}releases"; }
  grep -q "steps_this_run=1" "$work/run.out" || { cat "$work/run.out"; fail "$example: not one step"; }
  if [[ $example == lda_unit ]]; then
    # Its releases say what epsilon protects.
    grep -q '"privacy_unit": "field"' "$outputs/releases/step-1/manifest.json" ||
      fail "lda_unit.yaml: its release does not name its privacy unit"
  fi
  if [[ $example == lda_public_prior ]]; then
    # Its releases name the public prior they started from.
    grep -q '"public_prior_fingerprint": "[0-9a-f]\{64\}"' "$outputs/releases/step-1/manifest.json" ||
      fail "lda_public_prior.yaml: its release does not name its public prior"
  fi
  rm -rf "$outputs/${prefix}releases" "$outputs/${prefix}state" "$outputs/${prefix}dead_letter.jsonl"
done
# --check-config refuses what a start refuses (exit 2), naming file:line: key.
expect_check() {  # name, expected exit code, expected text, vipsd arguments...
  local name=$1 code=$2 text=$3
  shift 3
  local got=0
  "$vipsd" "$@" --check-config >"$work/check.out" 2>&1 || got=$?
  [[ $got == "$code" ]] || { cat "$work/check.out"; fail "$name: exit $got, not $code"; }
  grep -qF -- "$text" "$work/check.out" || { cat "$work/check.out"; fail "$name: no '$text'"; }
}
expect_refused() { expect_check "$1" 2 "$3" --config "$2"; }  # name, config, expected text
kafka="$work/lda_kafka.yaml"
sed 's|compression.type: zstd|compression.type: brotli|' "$kafka" >"$work/bad.yaml"
expect_refused "invalid librdkafka value" "$work/bad.yaml" \
  "kafka.producer_properties.compression.type: kafka producer: invalid value"
sed 's|session.timeout.ms:|sesion.timeout.ms:|' "$kafka" >"$work/bad.yaml"
expect_refused "unknown librdkafka property" "$work/bad.yaml" \
  "kafka.consumer_properties.sesion.timeout.ms: kafka source: unknown librdkafka property"
sed 's|reconnect.backoff.max.ms: "1000"|group.id: "mine"|' "$kafka" >"$work/bad.yaml"
expect_refused "a managed property" "$work/bad.yaml" "kafka.properties.group.id:"
touch "$work/plain_file"
sed "s|directory: $work/service_state|directory: $work/plain_file/state|" "$kafka" >"$work/bad.yaml"
expect_refused "state directory under a file" "$work/bad.yaml" "state.directory: $work/plain_file is not a directory"
sed 's|^  epsilon_ceiling: [0-9.]*|  epsilon_ceiling: 0.001|' "$work/lda_offline.yaml" >"$work/bad.yaml"
expect_refused "first step over the ceiling" "$work/bad.yaml" "privacy.epsilon_ceiling: a single step"
# A state directory of another model: run the LDA example for a step, then
# check it with another number of topics.
# (lda_offline.yaml was pointed at lda_train.jsonl for one step above.)
config="$work/lda_offline.yaml"
(cd "$work" && "$vipsd" --config "$config" >"$work/run.out" 2>&1) || { cat "$work/run.out"; fail "lda rerun"; }
sed 's|^    topics: [0-9]*|    topics: 7|' "$config" >"$work/bad.yaml"
expect_refused "a ledger of another model" "$work/bad.yaml" "ledger"
"$vipsd" --config "$config" --check-config >/dev/null 2>&1 || fail "the directory's own config is refused"
# Another state directory for a copy of the LDA example: `state_at DIR`.
state_at() { sed "s|^  directory: state |  directory: $1 |" "$config"; }
# A checkpoint without its ledger: the spent budget is unknown.
cp -r "$work/state" "$work/no_ledger"
rm "$work/no_ledger/ledger"
state_at no_ledger >"$work/bad.yaml"
grep -q "^  directory: no_ledger " "$work/bad.yaml" || fail "lda_offline.yaml has no state.directory line"
expect_refused "a checkpoint without a ledger" "$work/bad.yaml" \
  "$work/no_ledger/ledger does not exist, but the state directory $work/no_ledger holds checkpoint"
grep -qF "the spent budget is unknown; refusing to start from zero" "$work/check.out" ||
  { cat "$work/check.out"; fail "a checkpoint without a ledger: no reason"; }
# One privacy mode per state directory. The LDA example's private state
# (step 1) is not continued by a non-private run of it ...
cp -r "$work/state" "$work/was_private"
state_at was_private | sed -e "s|^  noise_multiplier: [0-9.]*|  noise_multiplier: 0|" \
  -e "s|^  max_steps: [0-9]*|  max_steps: 2|" -e "s|^  directory: releases|  directory: open_releases|" \
  >"$work/open_on_private.yaml"
grep -q "^  noise_multiplier: 0" "$work/open_on_private.yaml" || fail "lda_offline.yaml has no noise_multiplier line"
open_line=$(grep -n "^  noise_multiplier: 0" "$work/open_on_private.yaml" | cut -d: -f1)
expect_refused "a non-private run of a private directory" "$work/open_on_private.yaml" \
  "$work/open_on_private.yaml:$open_line: privacy.noise_multiplier: $work/was_private/ledger: this state directory ran 1 private steps; a non-private (noise_multiplier 0) run would continue their model"
# ... and a directory that ran two non-private steps is refused to the
# private configuration.
state_at contaminated | sed -e "s|^  noise_multiplier: [0-9.]*|  noise_multiplier: 0|" \
  -e "s|^  max_steps: [0-9]*|  max_steps: 2|" -e "s|^  directory: releases|  directory: open_releases|" \
  >"$work/open.yaml"
(cd "$work" && "$vipsd" --config "$work/open.yaml" >"$work/run.out" 2>&1) ||
  { cat "$work/run.out"; fail "the non-private steps do not run"; }
state_at contaminated >"$work/bad.yaml"
expect_refused "a directory that ran non-private steps" "$work/bad.yaml" \
  "$work/contaminated/ledger: this state directory ran 2 non-private steps (noise_multiplier 0; the first was step 1)"
grep -qF "a private run needs a new state directory" "$work/check.out" ||
  { cat "$work/check.out"; fail "contaminated: no remedy"; }
# privacy.noise: fixed_seed needs --insecure-fixed-seed-noise as well (a
# new state directory).
state_at seeded | sed "s|^  noise: secure |  noise: fixed_seed |" >"$work/seeded.yaml"
grep -q "^  noise: fixed_seed " "$work/seeded.yaml" || fail "lda_offline.yaml has no privacy.noise line"
seeded_line=$(grep -n "^  noise: fixed_seed " "$work/seeded.yaml" | cut -d: -f1)
expect_refused "fixed_seed without the flag" "$work/seeded.yaml" \
  "$work/seeded.yaml:$seeded_line: privacy.noise: fixed_seed noise is reproducible and NOT private; it also needs the command-line flag --insecure-fixed-seed-noise"
expect_check "fixed_seed with the flag" 0 "is valid" --config "$work/seeded.yaml" \
  --insecure-fixed-seed-noise
echo "every example passes --check-config and the planner (lda_wikipedia.yaml on the stand-in that"
echo "scripts/prepare_wikipedia.py --example wrote where it looks); every offline example runs a step;"
echo "--check-config refuses bad librdkafka properties, state directories, ceilings, ledgers of"
echo "another model, a checkpoint without its ledger, a non-private run of a private directory, a"
echo "directory that ran non-private steps and"
echo "fixed_seed noise without --insecure-fixed-seed-noise"
