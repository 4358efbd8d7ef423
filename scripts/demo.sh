#!/usr/bin/env bash
# The README's "run it" command.
#
# The streaming daemon does not exist yet (it arrives with the daemon issue);
# until then this installs what is needed, builds, and runs the privacy
# planning tool on an example schedule: how much privacy 1000 steps of
# Poisson-subsampled Gaussian updates spend, which noise level a budget of
# epsilon = 1 needs, and how many steps that budget allows.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build >/dev/null
tool=build/tools/vipsd-privacy
q=0.01 steps=1000 delta=1e-5

echo "== epsilon spent by $steps steps (q=$q, sigma=1.1, delta=$delta), three accountants"
for accountant in rdp pld strong; do
  "$tool" epsilon --sampling-rate "$q" --noise-multiplier 1.1 --steps "$steps" \
    --delta "$delta" --accountant "$accountant"
done
echo
echo "== noise multiplier needed for epsilon <= 1 over the same schedule"
"$tool" sigma --target-epsilon 1 --sampling-rate "$q" --steps "$steps" --delta "$delta"
echo
echo "== steps allowed by epsilon <= 1 at sigma = 1.1 (machine-readable)"
"$tool" steps --target-epsilon 1 --sampling-rate "$q" --noise-multiplier 1.1 \
  --delta "$delta" --json
