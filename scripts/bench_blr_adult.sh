#!/usr/bin/env bash
# Held-out quality of Bayesian logistic regression (VIPS Algorithm 5) on the
# UCI Adult data prepared in ../shared/data/adult (92 features, ‖x‖₂ ≤ 1,
# y ∈ {0, 1}): non-private SVI and private SVI at ε ∈ {0.5, 1, 2}, δ = 1e-5,
# against non-private L2-penalised logistic regression (Newton's method in
# bench/blr_run; scikit-learn's lbfgs too when Debian's python3-sklearn is
# installed — the project's setup does not install it).
#   scripts/bench_blr_adult.sh [DATA_DIR] [OUT_DIR]
# Environment: VIPSD_BUILD_DIR (default: build, built here with
# scripts/build.sh; if set, the caller has built blr_run and vipsd-eval
# there), RUNS (default 5: runs per configuration; medians are reported).
#
# Schedules (both use the planner's σ for the target ε; the ε ceiling is
# the target, so no run can overspend):
#   private schedule   q = 0.25, T = 10 steps, τ0 = 1, κ = 0.7 — few large
#                      Poisson batches: with Adult's n = 32,561 the noise on
#                      S̃/q shrinks as q grows, and RDP grows slowly in q at
#                      this T (a small sweep found q ≥ 0.25, T ≈ 10 best at ε = 1).
#   reference SVI      q = 0.01, T = 300 steps (≈ 3 passes), non-private only.
# Prior a0 = b0 = 1; Newton/scikit-learn use L2 = 1 (C = 1) on all 92
# weights (the bias is feature 0), no separate intercept.
set -euo pipefail
cd "$(dirname "$0")/.."
data=$(realpath "${1:-../shared/data/adult}")
out=$(realpath -m "${2:-out/bench_blr_adult}")
runs=${RUNS:-5}
py=/usr/bin/python3   # Debian's interpreter, where the apt packages live
if [[ -z "${VIPSD_BUILD_DIR:-}" ]]; then
  scripts/build.sh build >/dev/null
  build=build
else
  build=$VIPSD_BUILD_DIR
fi
mkdir -p "$out"
common=(--train "$data/train.jsonl" --test "$data/test.jsonl" --dim 92 --delta 1e-5)
private=(--q 0.25 --steps 10 --tau0 1 --kappa 0.7)
reference=(--q 0.01 --steps 300 --tau0 1 --kappa 0.7)

"$build/bench/blr_run" "${common[@]}" "${reference[@]}" --seed 0 --newton 1 \
  2>/dev/null > "$out/newton.json"
for run in $(seq 1 "$runs"); do
  "$build/bench/blr_run" "${common[@]}" "${reference[@]}" --seed "$run" \
    2>/dev/null > "$out/nonprivate_reference_$run.json"
  "$build/bench/blr_run" "${common[@]}" "${private[@]}" --seed "$run" \
    2>/dev/null > "$out/nonprivate_schedule_$run.json"
  for eps in 0.5 1 2; do
    extra=()
    [[ $run == 1 && $eps == 1 ]] && extra=(--release-dir "$out/release_eps1")
    "$build/bench/blr_run" "${common[@]}" "${private[@]}" --target-epsilon "$eps" "${extra[@]}" \
      2>/dev/null > "$out/private_eps${eps}_$run.json"
  done
done
# The release written by run 1 at ε = 1, scored by vipsd-eval from disk.
"$build/tools/vipsd-eval" "$out/release_eps1" --test "$data/test.jsonl" > "$out/vipsd_eval_eps1.json"

"$py" - "$out" "$data" "$runs" <<'PY'
import json, statistics, sys
out, data, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
load = lambda name: [json.load(open(f"{out}/{name}_{r}.json")) for r in range(1, runs + 1)]
med = lambda rows, key: statistics.median(row[key] for row in rows)
newton = json.load(open(f"{out}/newton.json"))["newton"]
rows = [("non-private SVI, q=0.01, T=300", load("nonprivate_reference")),
        ("non-private SVI, q=0.25, T=10", load("nonprivate_schedule"))]
rows += [(f"private eps={e}, q=0.25, T=10", load(f"private_eps{e}")) for e in ("0.5", "1", "2")]
summary = {"runs_per_row": runs, "newton_l2_1": newton, "rows": []}
for label, rs in rows:
    summary["rows"].append({
        # epsilon is null for a non-private (sigma = 0) run: no finite bound.
        "setting": label, "sigma": rs[0]["sigma"],
        "epsilon": None if any(r["epsilon"] is None for r in rs) else max(r["epsilon"] for r in rs),
        "auc_median": med(rs, "auc"), "auc_min": min(r["auc"] for r in rs),
        "auc_max": max(r["auc"] for r in rs), "log_loss_median": med(rs, "log_loss"),
        "accuracy_median": med(rs, "accuracy")})
try:
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score
    def read(split):
        xs, ys = [], []
        for line in open(f"{data}/{split}.jsonl"):
            rec = json.loads(line)
            xs.append(rec["x"]); ys.append(rec["y"])
        return np.array(xs), np.array(ys)
    xtr, ytr = read("train"); xte, yte = read("test")
    clf = LogisticRegression(C=1.0, fit_intercept=False, max_iter=5000, tol=1e-10).fit(xtr, ytr)
    p = clf.predict_proba(xte)[:, 1]
    summary["sklearn_lbfgs_C1"] = {"auc": roc_auc_score(yte, p), "log_loss": log_loss(yte, p),
                                   "accuracy": float(np.mean((p >= 0.5) == yte))}
except ImportError:
    summary["sklearn_lbfgs_C1"] = "python3-sklearn not installed"
summary["vipsd_eval_release_eps1"] = json.load(open(f"{out}/vipsd_eval_eps1.json"))
summary["blr_run_release_eps1_auc"] = json.load(open(f"{out}/private_eps1_1.json"))["auc"]
print(json.dumps(summary, indent=1))
print()
print("| setting | sigma | eps (delta=1e-5) | AUC median [min, max] | log-loss median |")
print("|---|---|---|---|---|")
for row in summary["rows"]:
    eps = "none (not private)" if row["epsilon"] is None else f"{row['epsilon']:.3f}"
    print(f"| {row['setting']} | {row['sigma']:.3g} | {eps} | "
          f"{row['auc_median']:.4f} [{row['auc_min']:.4f}, {row['auc_max']:.4f}] | "
          f"{row['log_loss_median']:.4f} |")
print(f"| Newton LR, L2=1 | - | - | {newton['auc']:.4f} | {newton['log_loss']:.4f} |")
sk = summary["sklearn_lbfgs_C1"]
if isinstance(sk, dict):
    print(f"| scikit-learn LR, C=1 | - | - | {sk['auc']:.4f} | {sk['log_loss']:.4f} |")
PY
