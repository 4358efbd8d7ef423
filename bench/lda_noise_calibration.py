#!/usr/bin/python3
"""How well an LDA release states its own noise: two runs, one noise draw each.

  bench/lda_noise_calibration.py RUN_A.bin RUN_B.bin --K 50 --V 10000 --eta 0.02

RUN_A.bin and RUN_B.bin are the --lambda-out files of two bench/lda_svi_run
runs with the same settings and the same --seed (the same start), so that
they differ only by their privacy noise; each has the release's noise beside
it (FILE.summaries.json: noise_floor, noise_floor_variance, noise_variance,
noise_share). The release states (docs/release_format.md) that a cell
without counts holds noise_floor of noise mass with sd sqrt(noise_floor_
variance), and a cell with counts noise of sd sqrt(noise_variance); the two
runs' difference measures the spread: Var(λ_A − λ_B) = 2·Var(λ). The topics
of the two runs are matched first (Hungarian assignment on the cosine of
their word distributions). Cells are classed by their mean over the two
runs: "floor" (λ − η − f below one floor sd: no counts that the noise lets
one see) and "counts" (more than 20 floor sds above it). Prints JSON: the
ratio of measured to stated spread in each class. The statement covers the
noise each M-step adds, given the E-steps; later E-steps depend on earlier
noise too, so a ratio above 1 measures that part.
"""
import argparse
import json

import numpy as np
from scipy.optimize import linear_sum_assignment


def load(path, k, v):
    lam = np.fromfile(path, dtype="<f8").reshape(k, v)
    with open(path + ".summaries.json") as f:
        summaries = {name: np.asarray(values) for name, values in json.load(f).items()}
    return lam, summaries


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--K", type=int, required=True)
    parser.add_argument("--V", type=int, required=True)
    parser.add_argument("--eta", type=float, required=True)
    args = parser.parse_args()
    lam_a, sum_a = load(args.a, args.K, args.V)
    lam_b, sum_b = load(args.b, args.K, args.V)
    beta_a = lam_a / lam_a.sum(axis=1, keepdims=True)
    beta_b = lam_b / lam_b.sum(axis=1, keepdims=True)
    cosine = (beta_a @ beta_b.T) / np.outer(np.linalg.norm(beta_a, axis=1),
                                            np.linalg.norm(beta_b, axis=1))
    rows, cols = linear_sum_assignment(-cosine)
    order = cols[np.argsort(rows)]
    lam_b = lam_b[order]
    floor = float(sum_a["noise_floor"][0])
    floor_sd = float(np.sqrt(sum_a["noise_floor_variance"][0]))
    count_sd = float(np.sqrt(sum_a["noise_variance"][0]))
    assert floor == float(sum_b["noise_floor"][0]), "the runs' schedules differ"
    z = (0.5 * (lam_a + lam_b) - args.eta - floor) / floor_sd
    measured = 0.5 * (lam_a - lam_b) ** 2  # per cell, an estimate of Var(λ)
    out = {
        "topics_matched_to_themselves": int((order == np.arange(args.K)).sum()),
        "median_matched_cosine": float(np.median(cosine[np.arange(args.K), order])),
        "stated": {"noise_floor": floor, "floor_sd": floor_sd, "count_sd": count_sd},
        "median_noise_share": float(np.median(sum_a["noise_share"])),
    }
    for name, cells, stated in (("floor", z < 1, floor_sd), ("counts", z > 20, count_sd)):
        out[name] = {"cells": int(cells.sum()),
                     "measured_sd": float(np.sqrt(measured[cells].mean())) if cells.any() else 0.0,
                     "stated_sd": stated}
        out[name]["ratio_measured_to_stated"] = out[name]["measured_sd"] / stated
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
