#!/usr/bin/env python3
"""Calibration of BLR's released posteriors (issue 50; docs/results.md,
"Calibrated posteriors"): how often the released intervals contain what
they should, over repeated private runs (each with fresh noise and a fresh
Poisson sample), through the real StepDriver (build/bench/blr_run).

  * synthetic, well specified: d = 20, n = 20,000, θ ~ N(0, I) (the model's
    prior at α = 1), ‖x‖ ≤ 1; coverage of θ by the released central 50 % and
    95 % intervals of every coefficient, at each ε and non-privately;
  * Adult (../shared/data/adult, the fit split of scripts/results.py): the
    coverage of the non-private full-batch posterior mean (q = 1, T = 30,
    σ = 0) by the released 95 % intervals, the median over coefficients of
    released sd / sqrt(non-private sd² + sd of the released means across
    draws²), the median of released sd / non-private sd, and test AUC.

Usage: bench/blr_calibration.py --blr-run build/bench/blr_run
           --adult ../shared/data/adult [--draws 20] [--synthetic-draws 50]
           [--out DIR]
Prints one JSON object (and a Markdown table on stderr).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

Z50, Z95 = 0.6744897501960817, 1.959963984540054
COMMON = ["--delta", "1e-05", "--tau0", "1", "--kappa", "0.7", "--q", "0.25", "--steps", "20"]


def run(blr_run, args, release_dir):
    out = subprocess.run([blr_run] + [str(a) for a in args] + ["--release-dir", release_dir],
                         check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    mean = np.load(os.path.join(release_dir, "mean.npy"))
    cov = np.load(os.path.join(release_dir, "covariance.npy"))
    return result, mean, np.sqrt(np.diag(cov))


def synthetic(blr_run, work, draws, rng):
    d, n = 20, 20000
    theta = rng.normal(size=d)
    x = rng.normal(size=(n, d)) / np.sqrt(d)
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1) / 0.999)[:, None]
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ theta))).astype(int)
    train = os.path.join(work, "synthetic.jsonl")
    with open(train, "w") as f:
        for xi, yi in zip(x, y):
            f.write(json.dumps({"x": [round(v, 12) for v in xi], "y": int(yi)}) + "\n")
    rows = {}
    for eps in ["non-private", 0.5, 1, 2, 4]:
        c50 = c95 = 0
        sds = []
        for k in range(draws):
            args = ["--dim", d, "--train", train, "--test", train, "--seed", k + 1] + COMMON
            if eps != "non-private":
                args += ["--target-epsilon", eps]
            _, mean, sd = run(blr_run, args, os.path.join(work, "syn"))
            c50 += np.mean(np.abs(mean - theta) <= Z50 * sd)
            c95 += np.mean(np.abs(mean - theta) <= Z95 * sd)
            sds.append(sd)
        rows[str(eps)] = {"coverage_50": c50 / draws, "coverage_95": c95 / draws,
                          "sd_median": float(np.median(np.mean(sds, axis=0)))}
    return rows


def adult(blr_run, data, work, draws):
    fit = os.path.join(work, "fit.jsonl")
    with open(os.path.join(data, "train.jsonl")) as f, open(fit, "w") as out:
        for i, line in enumerate(f):
            if hashlib.sha256(f"adult:{i}".encode()).digest()[0] >= 51:
                out.write(line)
    test = os.path.join(data, "test.jsonl")
    base = ["--dim", 92, "--train", fit, "--test", test]
    _, ref_mean, ref_sd = run(blr_run, base + ["--delta", "1e-05", "--tau0", "1", "--kappa", "0.7",
                                               "--q", "1", "--steps", "30", "--seed", 1],
                              os.path.join(work, "reference"))
    rows = {}
    for eps in [0.25, 0.5, 1, 2, 4]:
        means, sds, aucs = [], [], []
        for k in range(draws):
            result, mean, sd = run(blr_run, base + COMMON + ["--target-epsilon", eps, "--seed", k + 1],
                                   os.path.join(work, "adult"))
            means.append(mean)
            sds.append(sd)
            aucs.append(result["auc"])
        means, sds = np.array(means), np.array(sds)
        spread = means.std(axis=0, ddof=1)
        rows[str(eps)] = {
            "coverage_95": float(np.mean(np.abs(means - ref_mean) <= Z95 * sds)),
            "sd_ratio_median": float(np.median(sds.mean(axis=0) / np.sqrt(ref_sd ** 2 + spread ** 2))),
            "private_over_nonprivate_sd_median": float(np.median(sds.mean(axis=0) / ref_sd)),
            "released_sd_median": float(np.median(sds)),
            "spread_median": float(np.median(spread)),
            "auc_median": float(np.median(aucs)),
        }
    return {"reference_sd_median": float(np.median(ref_sd)), "rows": rows}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blr-run", required=True)
    parser.add_argument("--adult", required=True)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--synthetic-draws", type=int, default=50)
    parser.add_argument("--seed", type=int, default=50)
    parser.add_argument("--out")
    args = parser.parse_args()
    work = args.out or tempfile.mkdtemp(prefix="vipsd-blr-calibration-")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    report = {"synthetic": synthetic(args.blr_run, work, args.synthetic_draws, rng),
              "adult": adult(args.blr_run, args.adult, work, args.draws)}
    print(json.dumps(report, indent=1))
    t = ["| ε | coverage of θ, 50 % | coverage of θ, 95 % | released sd (median) |", "|---|---|---|---|"]
    for eps, r in report["synthetic"].items():
        t.append(f"| {eps} | {r['coverage_50']:.3f} | {r['coverage_95']:.3f} | {r['sd_median']:.3f} |")
    t += ["", "| ε | coverage of the non-private mean, 95 % | sd ratio | private / non-private sd | "
          "released sd | spread of means | AUC |", "|---|---|---|---|---|---|---|"]
    for eps, r in report["adult"]["rows"].items():
        t.append(f"| {eps} | {r['coverage_95']:.3f} | {r['sd_ratio_median']:.3f} | "
                 f"{r['private_over_nonprivate_sd_median']:.3f} | {r['released_sd_median']:.3f} | "
                 f"{r['spread_median']:.3f} | {r['auc_median']:.4f} |")
    print("\n".join(t), file=sys.stderr)


if __name__ == "__main__":
    main()
