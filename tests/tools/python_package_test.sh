#!/usr/bin/env bash
# The release-consumer package (python/): `pip install ./python` into a
# virtual environment (offline: Debian's numpy and setuptools), then, on
# releases the daemon wrote (the LDA offline example, 2 steps): load a
# release directory, a kcat dump, and the latest release straight from a
# Kafka topic (vipsd-mock-kafka, the release files produced by kcat as the
# daemon would: one message per file, headers, manifest last); the three
# agree, carry alpha and the vocabulary source, and a damaged release raises
# ReleaseError. Usage: python_package_test.sh VIPSD MOCK_KAFKA SOURCE_DIR
set -euo pipefail
vipsd=$1
mock=$2
source_dir=$3
work=$(mktemp -d)
mock_pid=""
cleanup() {
  [[ -n "$mock_pid" ]] && kill "$mock_pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Install (a copy: setuptools writes build metadata next to the sources).
cp -r "$source_dir/python" "$work/src"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-build-isolation --no-index --no-deps "$work/src" \
  >"$work/pip.out" 2>&1 || { cat "$work/pip.out"; fail "pip install ./python"; }
py="$work/venv/bin/python"
# The installed copy, not the source tree, is what is imported.
(cd / && "$py" -c 'import vipsd_release, sys; assert "/venv/" in vipsd_release.__file__, vipsd_release.__file__')

# Releases written by the daemon.
cp "$source_dir/config/examples/lda_offline.yaml" "$work/"
cp -r "$source_dir/config/examples/demo" "$work/"
cp "$work/demo/corpus.jsonl" "$work/train.jsonl"
sed -i -e "s|^  max_steps: [0-9]*|  max_steps: 2|" -e "s|^  max_epochs: [0-9.]*|  max_epochs: 0|" \
  "$work/lda_offline.yaml"
(cd "$work" && "$vipsd" --config lda_offline.yaml >"$work/run.out" 2>&1) ||
  { cat "$work/run.out"; fail "the offline example does not run"; }
release="$work/releases/step-2"
alpha=$(sed -n 's/^    alpha: *\([0-9.e-]*\).*/\1/p' "$work/lda_offline.yaml")

# A mock cluster in its own process, and the release produced into it.
coproc MOCK { "$mock" --brokers 1 --topic releases:1; }
mock_pid=$MOCK_PID
read -r word bootstrap <&"${MOCK[0]}"
[[ "$word" == bootstrap ]] || fail "vipsd-mock-kafka printed '$word'"
for file in $(cd "$release" && ls ./*.npy | sed 's|^\./||') manifest.json; do
  headers=(-H "vipsd-release-id=step-2" -H "vipsd-file=$file")
  [[ "$file" == manifest.json ]] || headers+=(-H "vipsd-chunk=0" -H "vipsd-chunks=1")
  kcat -P -b "$bootstrap" -t releases -k step-2 "${headers[@]}" "$release/$file" ||
    fail "kcat produce $file"
done
kcat -C -b "$bootstrap" -t releases -o beginning -e -q \
  -f 'vipsd-kcat %p %o %K %S\n%k\n%h\n%s\n' >"$work/releases.dump" || fail "kcat dump"

"$py" - "$release" "$work/releases.dump" "$bootstrap" "$alpha" "$work" <<'PY' || fail "package checks"
import shutil, sys
import numpy as np
import vipsd_release as vr
release_dir, dump, bootstrap, alpha, work = sys.argv[1:]
r = vr.load(release_dir)
assert r.release_id == "step-2" and r.step == 2 and r.model_type == "lda", r
assert r.is_private and r.epsilon_spent > 0, r.manifest
assert r.hyperparameters["alpha"] == float(alpha), (r.hyperparameters, alpha)
# A record-level release names no unit: it protects one record.
assert r.privacy_unit == "record" and r.max_records_per_unit == 0, r.manifest
assert r.manifest["vocabulary_source"].endswith("/demo/vocab.txt"), r.manifest
K, V = r.dimensions["K"], r.dimensions["V"]
assert r.arrays["lambda"].shape == (K, V)
# The noise the release states (docs/release_format.md): a positive floor
# below the noise sd of a cell with counts, shares in [0, 1], and a signal
# per cell.
noise = vr.lda_noise(r)
assert 0 < noise["floor"] < noise["noise_sd"] and noise["floor_sd"] > 0, noise
assert noise["signal"].shape == (K, V)
assert ((noise["noise_share"] >= 0) & (noise["noise_share"] <= 1)).all()
from_dump = vr.load_kcat_dump(dump)
assert [x.release_id for x in from_dump] == ["step-2"]
latest = vr.read_latest_from_kafka(bootstrap, "releases", timeout=30)
assert latest is not None and latest.release_id == "step-2"
for other in (from_dump[0], latest):
    assert other.manifest == r.manifest
    assert set(other.arrays) == set(r.arrays)
    for name in r.arrays:
        assert np.array_equal(other.arrays[name], r.arrays[name]), name
# A damaged copy: one byte of lambda.npy changed (its hash no longer matches).
damaged = work + "/damaged"
shutil.copytree(release_dir, damaged)
data = bytearray(open(damaged + "/lambda.npy", "rb").read())
data[-1] ^= 1
open(damaged + "/lambda.npy", "wb").write(data)
try:
    vr.load(damaged)
    raise AssertionError("a damaged release loaded")
except vr.ReleaseError as e:
    assert "lambda.npy" in str(e), e
print("package: directory, kcat dump and Kafka agree; alpha %s; damage refused" % alpha)
PY
# The console script of the package is the reference decoder.
"$work/venv/bin/vipsd-decode-release" "$release" --json >"$work/decoded.json" ||
  fail "vipsd-decode-release"
grep -q '"release_id": "step-2"' "$work/decoded.json" || fail "vipsd-decode-release output"
echo "pip install ./python works offline; the package reads directories, dumps and topics"
