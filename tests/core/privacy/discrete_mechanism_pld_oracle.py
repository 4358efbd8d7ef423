#!/usr/bin/env python3
"""Independent check: what vipsd charges covers the discrete mechanism it runs.

vipsd releases an integer sum plus discrete Gaussian noise N_Z(0, sigma_g^2)
on a grid, with sigma_g^2 = ceil(sigma^2 * S * (1 + 2^-40)) + 100 for an
integer L2 sensitivity sqrt(S) (core/privacy/mechanisms/gaussian_mechanism.h), and its
accountant charges the Poisson-subsampled *continuous* Gaussian with noise
multiplier sigma. This script computes, from the discrete Gaussian's exact
pmf and without any vipsd code, the privacy-loss distribution of the
Poisson-subsampled one-dimensional discrete mechanism (sensitivity
Delta = sqrt(S) grid units, both adjacency directions), composes it T times
by FFT and converts it to epsilon at delta, twice:

  optimistic  - every loss rounded down to the grid h, mass beyond the
                truncation dropped: a lower bound on the true epsilon;
  pessimistic - every loss rounded up, the tails counted as infinite loss:
                an upper bound.

It then asks `vipsd-privacy epsilon --accountant pld` (argv[1]) for the same
(q, sigma, T, delta) and asserts

  (1) eps_optimistic(discrete) <= eps_charged: the charge covers the
      discrete mechanism (what the reduction in gaussian_mechanism.h proves);
  (2) eps_charged <= 1.01 * eps_pessimistic(discrete) + 2e-3: the charge is
      tight (the discrete mechanism is not much more private than charged);
  (3) power: a discrete mechanism with 10 % less noise variance than the
      formula gives is caught, eps_optimistic > eps_charged.

numpy only (/usr/bin/python3). Prints one line per case.
"""
import json
import math
import subprocess
import sys

import numpy as np

H = 1e-4           # loss grid
LOSS_MIN = -12.0   # compose on [LOSS_MIN, LOSS_MAX]
LOSS_MAX = 24.0
DELTA = 1e-5


def dg_log_pmf(sigma2, xs):
    """ln N_Z(0, sigma2) at the integers xs; the normaliser by its
    Poisson-summation dual (exact to double precision for sigma2 >= 64)."""
    log_z = 0.5 * math.log(2 * math.pi * sigma2) + math.log1p(
        2 * sum(math.exp(-2 * math.pi ** 2 * sigma2 * k * k) for k in range(1, 4)))
    return -(xs.astype(np.float64) ** 2) / (2 * sigma2) - log_z


def base_pair(sigma2, sensitivity):
    reach = int(45 * math.sqrt(sigma2)) + sensitivity + 10
    xs = np.arange(-reach, reach + 1, dtype=np.int64)
    log_p = dg_log_pmf(sigma2, xs)                 # N_Z(0, s2)
    log_q = dg_log_pmf(sigma2, xs - sensitivity)   # N_Z(Delta, s2)
    return log_p, log_q


def loss_pmf(log_x, log_y, pessimistic):
    """PLD of (X, Y) on the grid: loss ln X/Y under X, as a pmf over bins
    LOSS_MIN + i*H, plus the mass sent to +infinity."""
    loss = log_x - log_y
    mass = np.exp(log_x)
    n = int(round((LOSS_MAX - LOSS_MIN) / H)) + 1
    pmf = np.zeros(n)
    index = np.ceil((loss - LOSS_MIN) / H) if pessimistic else np.floor((loss - LOSS_MIN) / H)
    index = index.astype(np.int64)
    infinite = 0.0
    if pessimistic:
        infinite += max(0.0, 1.0 - mass.sum())  # mass outside the summed range
        infinite += mass[index >= n].sum()
        np.add.at(pmf, np.clip(index[index < n], 0, n - 1), mass[index < n])
    else:
        keep = (index >= 0) & (index < n)
        np.add.at(pmf, index[keep], mass[keep])
    return pmf, infinite


def convolve(a, b, pessimistic):
    """Distribution of the sum of two grid losses, truncated back to the grid
    range: above LOSS_MAX to +infinity (pessimistic) or dropped; below
    LOSS_MIN clamped up (pessimistic) or dropped."""
    n = len(a)
    size = 1 << int(math.ceil(math.log2(2 * n)))
    full = np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)[: 2 * n - 1]
    full = np.maximum(full, 0.0)
    # Index j of `full` is the loss 2*LOSS_MIN + j*H.
    shift = int(round(-LOSS_MIN / H))  # bins from 2*LOSS_MIN up to LOSS_MIN
    below = full[:shift].sum()
    out = full[shift: shift + n].copy()
    above = full[shift + n:].sum()
    if pessimistic:
        out[0] += below
        return out, above
    return out, 0.0


def compose(pmf, infinite, steps, pessimistic):
    result, result_inf = None, 0.0
    base, base_inf = pmf, infinite
    while steps:
        if steps & 1:
            if result is None:
                result, result_inf = base.copy(), base_inf
            else:
                result, extra = convolve(result, base, pessimistic)
                result_inf = 1 - (1 - result_inf) * (1 - base_inf) + extra
        steps >>= 1
        if steps:
            base, extra = convolve(base, base, pessimistic)
            base_inf = 1 - (1 - base_inf) ** 2 + extra
    return result, result_inf


def delta_of(pmf, infinite, epsilon):
    losses = LOSS_MIN + H * np.arange(len(pmf))
    above = losses > epsilon
    return infinite + float(np.sum(pmf[above] * -np.expm1(epsilon - losses[above])))


def epsilon_of(pmf, infinite, delta):
    if delta_of(pmf, infinite, LOSS_MAX - 1) > delta:
        return math.inf
    lo, hi = 0.0, LOSS_MAX - 1
    if delta_of(pmf, infinite, 0.0) <= delta:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if delta_of(pmf, infinite, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def discrete_epsilon(sigma2, sensitivity, q, steps, pessimistic):
    log_p, log_q = base_pair(sigma2, sensitivity)
    log_mix = np.logaddexp(math.log1p(-q) + log_p, math.log(q) + log_q) if q < 1 else log_q
    worst = 0.0
    for log_x, log_y in ((log_mix, log_p), (log_p, log_mix)):  # add, remove
        pmf, infinite = loss_pmf(log_x, log_y, pessimistic)
        composed, composed_inf = compose(pmf, infinite, steps, pessimistic)
        worst = max(worst, epsilon_of(composed, composed_inf, DELTA))
    return worst


def charged_epsilon(cli, q, sigma, steps):
    out = subprocess.run(
        [cli, "epsilon", "--accountant", "pld", "--sampling-rate", repr(q),
         "--noise-multiplier", repr(sigma), "--steps", str(steps), "--delta", repr(DELTA),
         "--json"], check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["epsilon"])


def vipsd_sigma2(sigma, bound_squared):
    """gaussian_mechanism.cc DiscreteNoiseFor, in exact rationals."""
    from fractions import Fraction
    value = Fraction(sigma) ** 2 * bound_squared * (1 + Fraction(1, 2 ** 40))
    return math.ceil(value) + 100


def main():
    cli = sys.argv[1]
    failures = 0
    sensitivity = 1024  # sqrt(S) grid units: S = 2^20
    for q, sigma, steps in ((0.05, 1.0, 100), (0.2, 2.0, 50), (1.0, 4.0, 20)):
        sigma2 = vipsd_sigma2(sigma, sensitivity ** 2)
        charged = charged_epsilon(cli, q, sigma, steps)
        low = discrete_epsilon(sigma2, sensitivity, q, steps, pessimistic=False)
        high = discrete_epsilon(sigma2, sensitivity, q, steps, pessimistic=True)
        weak = discrete_epsilon(int(0.9 * sigma2), sensitivity, q, steps, pessimistic=False)
        ok = low <= charged <= 1.01 * high + 2e-3 and weak > charged
        failures += not ok
        print(f"q={q} sigma={sigma} T={steps} sigma_g^2={sigma2}: discrete eps in "
              f"[{low:.6f}, {high:.6f}], charged {charged:.6f}, 0.9x variance {weak:.6f} "
              f"{'ok' if ok else 'FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
