#!/usr/bin/env python3
"""Independent check: vipsd's charges against Google's and Microsoft's accountants.

vipsd charges every step as the Poisson-subsampled Gaussian mechanism with
noise multiplier sigma under add/remove adjacency
(docs/privacy_accounting.md sections 1, 5a and 7). This script asks
`vipsd-privacy` (argv[1]) what it charges for T such steps at delta and
recomputes the same quantity with accountants written by other people,
installed from PyPI into a virtual environment by scripts/oracle_venv.sh
(pinned in oracle_requirements.txt beside this file):

  dp_accounting (Google), PLD: the privacy-loss distribution of
    PoissonSampledDpEvent(q, GaussianDpEvent(sigma)) composed T times, both
    adjacency directions, converted to epsilon at delta, twice:
      optimistic  - privacy buckets, every loss rounded down
                    (pessimistic_estimate=False) on a grid
                    h = min(1e-4, 0.02 / T), truncated mass dropped: a lower
                    bound on the true epsilon. Rounding down moves each
                    step's loss by less than h, so it is below the truth by
                    up to T*h (measured: about T*h/2 <= 0.01);
      pessimistic - connect-the-dots (pessimistic_estimate=True, h = 1e-4),
                    truncated mass counted as infinite loss: an upper bound.
    The composition's FFT truncation (tail_mass_truncation = 1e-15) adds at
    most 2e-15 to delta(epsilon) in both modes (once as infinite loss, once
    as wrap-around), so the optimistic epsilon is read at delta + 2e-15,
    which keeps it a lower bound.
  dp_accounting, RDP: RdpAccountant on vipsd's own order grid (GridV3 of
    core/privacy/accounting/rdp.cc, rebuilt here from its rule: 323 orders) with the
    same improved conversion (Balle et al. 2020); orders above 1024 are
    evaluated only when a monotonicity bound says they could hold the minimum (each
    integer order costs dp_accounting a Python loop of that length).
  mpmath: the exact Renyi divergence of one step at the order vipsd picked,
    by 30-digit quadrature of E_{N(0,s^2)}[((1-q) + q e^{(2z-1)/(2s^2)})^a],
    converted the same way: the arbiter when the two RDP codes differ.
  scipy, q = 1 only: T Gaussian steps are one Gaussian with sigma/sqrt(T),
    whose delta(epsilon) has a closed form (Balle & Wang 2018): the exact
    epsilon, which must lie between the two PLD bounds.
  prv_accountant (Microsoft, Gopi, Lee & Wutschitz 2021), if installed:
    PRVAccountant(PoissonSubsampledGaussianMechanism) with eps_error 0.005,
    delta_error delta/1000: a lower and an upper bound on epsilon.

vipsd's charges compared (one `vipsd-privacy epsilon --json` each):
  fixed   - what the daemon charges with privacy.schedule: fixed (its
            default): min(PLD at grid 2^-10, RDP); its PLD and RDP parts are
            checked separately too;
  pld     - the planner's PLD (grid 2^-14);
  filter  - what the daemon charges with privacy.schedule: adaptive (the RDP
            filter; lower bound only: it pays for adaptivity on purpose).

Assertions, for every case of the grid:
  (1) soundness: every charge >= the optimistic PLD epsilon * (1 - 1e-9)
      (the slack covers floating-point rounding of the FFT composition and
      of the conversion, ~1e-12 relative; the smallest measured margin is
      9e-6 relative, at q = 1 and one step, where the oracle's own bracket
      is that narrow), and >= prv's lower bound, and >= the exact epsilon
      for q = 1;
  (2) tightness: fixed, its PLD part and pld <= the pessimistic PLD epsilon
      * (1 + 1e-3) + 1e-3, and the same against prv's upper bound. All are
      pessimistic bounds of one quantity. dp_accounting's (h = 1e-4) is
      within 5e-5 of prv's estimate on this grid and, at q = 1, within
      1.1e-7 of the closed form; vipsd's planner PLD (grid 2^-14) is
      measured between 6.3e-5 relative below it (small q, where 2^-14 is
      the finer grid) and 1e-9 above. The daemon's fixed schedule uses
      the grid 2^-10, documented (core/privacy/accounting/fixed_schedule.h,
      docs/privacy_accounting.md 5a) as within about 1e-4 of the finer
      one where one step's loss spans many grid points; the tolerance is
      ten times that, plus 0.1 % of epsilon. Where it does not (small q),
      the fixed schedule overcharges more: KNOWN_OVERCHARGE states the
      measured allowance by case;
  (3) RDP: vipsd's RDP epsilon (the fixed charge's RDP part) against the
      quadrature at the order vipsd picked: >= exact * (1 - 1e-10) (vipsd's
      series adds error margins, so it is never below the exact value) and
      <= exact * (1 + 1e-7); not above the quadrature at the order
      dp_accounting picked on the same grid * (1 + 1e-7) (vipsd found an
      order at least as good); and within [1 - 2e-3, 1 + 1e-7] of
      dp_accounting's minimum over the same grid. dp_accounting's integer
      orders are exact, but for fractional orders it adds the absolute
      values of the alternating series' terms, an upper bound that runs
      high: 1.4e-5 relative at q = 0.1, sigma = 2, alpha = 5.41 and 9e-4 at
      q = 0.3, sigma = 0.8, alpha = 2.5, measured against the quadrature,
      with which vipsd agrees to 1.1e-11; hence 2e-3 below and 1e-7 above;
  (4) power: vipsd's fixed charge for 1.1 x sigma is below the optimistic
      bound for sigma (a 10 % noise shortfall would be caught by (1)), and
      its charge for sigma / 1.1 is above the bound of (2) (a 10 %
      overcharge would be caught by (2)).

For the demo and the Wikipedia example the case is read from
`vipsd-privacy plan --config` on config/examples/*.yaml (q, sigma, delta
and the steps the ceiling allows), and the oracle's upper bound at that
step count is printed beside the ceiling.

Prints one line per case and the worst ratios. Exit 1 on any failure.
"""
import json
import math
import os
import subprocess
import sys
import time
import warnings

import mpmath
from absl import logging as absl_logging
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import special

try:
    from prv_accountant import PRVAccountant, PoissonSubsampledGaussianMechanism
except ImportError:  # scripts/oracle_venv.sh leaves it out if it cannot install
    PRVAccountant = None

SOUND_SLACK = 1e-9     # (1)
TIGHT_REL = 1e-3       # (2)
TIGHT_ABS = 1e-3
RDP_BELOW = 2e-3       # (3) against dp_accounting (its fractional orders run high)
EXACT_BELOW = 1e-10    # (3) against the quadrature
EXACT_ABOVE = 1e-7
POWER = 1.1            # (4)
# (2) for the fixed schedule only, by case: its PLD grid (2^-10) is coarse
# where one step's privacy loss is not much larger than the grid (q = 0.001
# here): measured 1.04 % above the pessimistic bound on 2026-12-04 (0.46366
# against 0.45887), a safe overcharge documented in
# docs/privacy_accounting.md 5a. Allowed up to 1.25 % so that a growth of it
# still fails.
KNOWN_OVERCHARGE = {"small q": 0.0125}
TAIL = 1e-15           # dp_accounting's FFT tail truncation
OPT_BIAS = 0.02        # optimistic grid h = min(1e-4, OPT_BIAS / T)
PESS_GRID = 1e-4
PRV_EPS_ERROR = 0.005

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                        "config", "examples")

# label, q, sigma, T, delta; a file name instead reads the case from
# `vipsd-privacy plan --config`.
CASES = (
    ("demo", "demo.yaml"),
    ("wikipedia", "lda_wikipedia.yaml"),
    ("paper LDA", 0.05, 1.24, 111, 1e-4),
    ("paper BLR", 0.004, 1.0, 1534, 1e-3),
    ("lda_kafka window", 0.01, 1.1, 500, 1e-6),
    ("small q", 0.001, 0.8, 3000, 1e-5),
    ("one step", 1.0, 0.8, 1, 1e-5),
    ("large q", 0.5, 5.0, 100, 1e-5),
    ("large eps", 0.3, 0.8, 10, 1e-5),
    ("sigma 5, T 2000", 0.05, 5.0, 2000, 1e-5),
)


def vipsd(cli, *args):
    out = subprocess.run([cli, *args, "--json"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def vipsd_epsilon(cli, accountant, q, sigma, steps, delta):
    return vipsd(cli, "epsilon", "--accountant", accountant, "--sampling-rate", repr(q),
                 "--noise-multiplier", repr(sigma), "--steps", str(steps),
                 "--delta", repr(delta))


def vipsd_orders():
    """GridV3 of core/privacy/accounting/rdp.cc (DefaultRdpOrders), from its rule."""
    grid = [1.0 + (k * k) / 2116.0 for k in range(3, 47)]
    grid += [i / 20.0 for i in range(41, 91)]
    grid += [1.0 + (k * k) / 4900.0 for k in range(131, 211)]
    a = 10.0
    for _ in range(102):
        a = a * 56 / 55
        grid.append(a)
    grid.append(64.0)
    a = 64.0
    for _ in range(14):
        a = a * 11 / 10
        grid.append(a)
    grid.append(256.0)
    a = 320.0
    while a < 262144 / 1.25:
        grid.append(a)
        a = float(math.floor(a * 1.25 + 0.5))  # std::round, a > 0
    grid.append(262144.0)
    grid = sorted(set(grid))
    assert len(grid) == 323, len(grid)
    return grid


ORDERS = vipsd_orders()


def pld_epsilon(q, sigma, steps, delta, pessimistic):
    if pessimistic:
        pld = pld_lib.from_gaussian_mechanism(
            sigma, sampling_prob=q, pessimistic_estimate=True,
            value_discretization_interval=PESS_GRID, use_connect_dots=True)
        return pld.self_compose(steps, tail_mass_truncation=TAIL).get_epsilon_for_delta(delta)
    grid = min(1e-4, OPT_BIAS / steps)
    pld = pld_lib.from_gaussian_mechanism(
        sigma, sampling_prob=q, pessimistic_estimate=False,
        value_discretization_interval=grid, use_connect_dots=False)
    composed = pld.self_compose(steps, tail_mass_truncation=TAIL)
    return composed.get_epsilon_for_delta(delta + 2 * TAIL)


def rdp_event(q, sigma, steps):
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)


def dp_rdp(q, sigma, steps, delta):
    """dp_accounting's RDP epsilon and order over vipsd's grid."""
    low = [a for a in ORDERS if a <= 1024]
    above = ORDERS[len(low)]  # the smallest order left out
    accountant = rdp_lib.RdpAccountant(orders=low)
    accountant.compose(rdp_event(q, sigma, steps))
    epsilon, order = accountant.get_epsilon_and_optimal_order(delta)
    # Every order a >= `above` converts to at least
    # T*rdp(low[-1]) + ln(1 - 1/above) - max(0, ln(delta*262144))/(above - 1):
    # Renyi divergence grows with the order, and -ln(delta*a)/(a - 1) >= that
    # last term for a in [above, 262144].
    tail = (float(accountant.rdp[-1]) + math.log1p(-1 / above)
            - max(0.0, math.log(delta * ORDERS[-1])) / (above - 1))
    if tail < epsilon:
        accountant = rdp_lib.RdpAccountant(orders=ORDERS)
        accountant.compose(rdp_event(q, sigma, steps))
        epsilon, order = accountant.get_epsilon_and_optimal_order(delta)
    return float(epsilon), float(order)


def exact_rdp_epsilon(q, sigma, steps, delta, order):
    """The improved conversion of T times the exact one-step RDP at `order`."""
    mpmath.mp.dps = 30
    q, s, a = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(order)
    if q == 1:
        per_step = a / (2 * s * s)
    else:
        ratio = lambda z: ((1 - q) + q * mpmath.exp((2 * z - 1) / (2 * s * s))) ** a
        density = lambda z: mpmath.npdf(z, 0, s) * ratio(z)
        points = [-mpmath.inf, -40 * s, -10 * s, -3 * s, 0, mpmath.mpf(0.5), 3 * s, 10 * s,
                  40 * s, 40 * s + a * 8, mpmath.inf]
        per_step = mpmath.log(mpmath.quad(density, sorted(set(points)))) / (a - 1)
    total = steps * per_step
    epsilon = total + mpmath.log1p(-1 / a) - mpmath.log(mpmath.mpf(delta) * a) / (a - 1)
    return float(epsilon)


def exact_gaussian_epsilon(sigma, steps, delta):
    """q = 1: T steps are N(0, sigma^2/T) with sensitivity 1; Balle & Wang's
    delta(eps) = Phi(1/(2s) - eps*s) - e^eps Phi(-1/(2s) - eps*s), s = sigma/sqrt(T)."""
    s = sigma / math.sqrt(steps)

    def delta_of(eps):
        return special.ndtr(0.5 / s - eps * s) - math.exp(eps) * special.ndtr(-0.5 / s - eps * s)

    lo, hi = 0.0, 1.0
    while delta_of(hi) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if delta_of(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def prv_bounds(q, sigma, steps, delta):
    if PRVAccountant is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accountant = PRVAccountant(
            prvs=PoissonSubsampledGaussianMechanism(noise_multiplier=sigma,
                                                    sampling_probability=q),
            max_self_compositions=steps, eps_error=PRV_EPS_ERROR, delta_error=delta / 1000)
        low, estimate, high = accountant.compute_epsilon(delta=delta,
                                                         num_self_compositions=[steps])
    return float(low), float(estimate), float(high)


def resolve(cli, case):
    if len(case) == 5:
        return case + ("",)
    label, name = case
    plan = vipsd(cli, "plan", "--config", os.path.join(EXAMPLES, name))
    q, sigma, delta = plan["sampling_rate"], plan["noise_multiplier"], plan["delta"]
    steps, ceiling = plan["steps"], plan["epsilon_ceiling"]
    note = f" plan: {steps} steps to ceiling {ceiling:g} (eps {plan['epsilon']:.6f})"
    return label, q, sigma, steps, delta, note


def main():
    cli = sys.argv[1]
    # dp_accounting warns for every fractional order near 1 whose series does
    # not converge at large q (it leaves the order out); not an error here.
    absl_logging.set_verbosity(absl_logging.ERROR)
    started = time.time()
    failures = []
    worst = {"fixed/optimistic": math.inf, "fixed/pessimistic": 0.0,
             "pld/pessimistic": 0.0, "rdp/dp_rdp": [math.inf, 0.0]}
    if PRVAccountant is None:
        print("prv_accountant: not installed, its comparison is skipped")
    for case in CASES:
        label, q, sigma, steps, delta, note = resolve(cli, case)
        t0 = time.time()
        fixed = vipsd_epsilon(cli, "fixed", q, sigma, steps, delta)
        planner = vipsd_epsilon(cli, "pld", q, sigma, steps, delta)["epsilon"]
        filt = vipsd_epsilon(cli, "filter", q, sigma, steps, delta)["epsilon"]
        weaker = vipsd_epsilon(cli, "fixed", q, sigma * POWER, steps, delta)["epsilon"]
        stronger = vipsd_epsilon(cli, "fixed", q, sigma / POWER, steps, delta)["epsilon"]
        charged, charged_pld, charged_rdp = (fixed["epsilon"], fixed["epsilon_pld"],
                                             fixed["epsilon_rdp"])
        order = fixed["order"]
        opt = pld_epsilon(q, sigma, steps, delta, pessimistic=False)
        pess = pld_epsilon(q, sigma, steps, delta, pessimistic=True)
        rdp, rdp_order = dp_rdp(q, sigma, steps, delta)
        exact_rdp = exact_rdp_epsilon(q, sigma, steps, delta, order)
        exact_at_dp_order = (exact_rdp if rdp_order == order else
                             exact_rdp_epsilon(q, sigma, steps, delta, rdp_order))
        exact = exact_gaussian_epsilon(sigma, steps, delta) if q == 1 else None
        prv = prv_bounds(q, sigma, steps, delta)

        def check(ok, what):
            if not ok:
                failures.append(f"{label}: {what}")
            return ok

        upper = pess * (1 + TIGHT_REL) + TIGHT_ABS
        # The fixed schedule's coarser grid where one step's loss is not much
        # larger than it: a safe, measured overcharge, allowed here and no
        # more (KNOWN_OVERCHARGE); the planner's PLD keeps the tight bound.
        fixed_upper = pess * (1 + max(TIGHT_REL, KNOWN_OVERCHARGE.get(label, 0))) + TIGHT_ABS
        for name, value in (("fixed", charged), ("fixed.pld", charged_pld),
                            ("fixed.rdp", charged_rdp), ("pld", planner), ("filter", filt)):
            check(value >= opt * (1 - SOUND_SLACK), f"{name} {value!r} below optimistic {opt!r}")
            if exact is not None:
                check(value >= exact * (1 - SOUND_SLACK), f"{name} {value!r} below exact {exact!r}")
            if prv is not None:
                check(value >= prv[0], f"{name} {value!r} below prv's lower bound {prv[0]!r}")
        for name, value, bound in (("fixed", charged, fixed_upper),
                                   ("fixed.pld", charged_pld, fixed_upper),
                                   ("pld", planner, upper)):
            check(value <= bound, f"{name} {value!r} above pessimistic {pess!r} + tolerance")
            if prv is not None:
                check(value <= prv[2] * (bound / pess if pess > 0 else 1) + TIGHT_ABS,
                      f"{name} {value!r} above prv's upper bound {prv[2]!r} + tolerance")
        check(opt <= pess, f"oracle's bounds crossed: {opt!r} > {pess!r}")
        if exact is not None:
            check(opt <= exact <= pess * (1 + 1e-9), f"exact {exact!r} outside [{opt!r}, {pess!r}]")
        check(any(abs(a - order) <= 1e-12 * order for a in ORDERS),
              f"vipsd's order {order!r} is not on the rebuilt grid")
        check(rdp * (1 - RDP_BELOW) <= charged_rdp <= rdp * (1 + EXACT_ABOVE),
              f"RDP {charged_rdp!r} vs dp_accounting {rdp!r} (order {order} vs {rdp_order})")
        check(exact_rdp * (1 - EXACT_BELOW) <= charged_rdp <= exact_rdp * (1 + EXACT_ABOVE),
              f"RDP {charged_rdp!r} vs quadrature {exact_rdp!r} at order {order}")
        check(charged_rdp <= exact_at_dp_order * (1 + EXACT_ABOVE),
              f"RDP {charged_rdp!r} above the quadrature {exact_at_dp_order!r} at "
              f"dp_accounting's order {rdp_order}")
        check(weaker < opt, f"power: sigma x {POWER} charges {weaker!r}, not below {opt!r}")
        check(stronger > upper, f"power: sigma / {POWER} charges {stronger!r}, not above {upper!r}")

        worst["fixed/optimistic"] = min(worst["fixed/optimistic"], charged / opt)
        worst["fixed/pessimistic"] = max(worst["fixed/pessimistic"], charged / pess)
        worst["pld/pessimistic"] = max(worst["pld/pessimistic"], planner / pess)
        worst["rdp/dp_rdp"][0] = min(worst["rdp/dp_rdp"][0], charged_rdp / rdp)
        worst["rdp/dp_rdp"][1] = max(worst["rdp/dp_rdp"][1], charged_rdp / rdp)
        prv_text = (f" prv [{prv[0]:.6f}, {prv[2]:.6f}]" if prv is not None else "")
        exact_text = f" exact {exact:.6f}" if exact is not None else ""
        ok = not any(f.startswith(label + ":") for f in failures)
        print(f"{label}: q={q:g} sigma={sigma:g} T={steps} delta={delta:g}: "
              f"PLD [{opt:.6f}, {pess:.6f}]{exact_text}{prv_text}; vipsd fixed {charged:.6f} "
              f"(pld part {charged_pld:.6f}, rdp part {charged_rdp:.6f} at order {order:.4g}), "
              f"planner pld {planner:.6f}, filter {filt:.6f}; dp_accounting rdp {rdp:.6f} "
              f"(order {rdp_order:.4g}), quadrature {exact_rdp:.6f}; "
              f"fixed/optimistic {charged / opt:.6f}, fixed/pessimistic {charged / pess:.6f}; "
              f"sigma x{POWER} {weaker:.6f}, sigma /{POWER} {stronger:.6f}{note} "
              f"[{time.time() - t0:.1f} s] {'ok' if ok else 'FAIL'}", flush=True)
    print(f"worst: smallest fixed/optimistic {worst['fixed/optimistic']:.6f}, largest "
          f"fixed/pessimistic {worst['fixed/pessimistic']:.6f}, largest planner "
          f"pld/pessimistic {worst['pld/pessimistic']:.6f}, rdp/dp_accounting rdp in "
          f"[{worst['rdp/dp_rdp'][0]:.7f}, {worst['rdp/dp_rdp'][1]:.7f}]; "
          f"{time.time() - started:.1f} s")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
