#!/usr/bin/env python3
"""Independent check of the discrete Gaussian's 1-D privacy loss.

Runs the C++ dump program (argv[1]), which prints delta(eps) in both
directions and the Renyi divergence D_alpha(N_Z(0, s2) || N_Z(Delta, s2)) on a
grid, and recomputes each by direct summation over the integers with Python's
decimal module at 40 significant digits (standard library only). sigma^2 is
the exact rational n/d. Sums run over |x| <= 45*sigma + |shift| + 10 around
the relevant centre, which leaves out less than exp(-1000) of the mass.

Pass: every C++ value agrees with the oracle within 1e-12 relative (+1e-300
absolute), the C++ error bound covers the difference for delta, the two
directions agree, and the oracle's D_alpha <= alpha*Delta^2/(2 sigma^2).
Prints the worst relative differences.
"""
import math
import subprocess
import sys
from decimal import Decimal, getcontext

getcontext().prec = 40
TOLERANCE = Decimal("1e-12")


NORMALISERS = {}


def log_normaliser(s2, reach):
    key = (s2, reach)
    if key not in NORMALISERS:
        NORMALISERS[key] = normaliser_sum(s2, reach)
    return NORMALISERS[key]


def normaliser_sum(s2, reach):
    total = Decimal(0)
    for y in range(-reach, reach + 1):
        total += (-(Decimal(y) ** 2) / (2 * s2)).exp()
    return total


def delta(s2, shift, eps, reach):
    z = log_normaliser(s2, reach)
    e = Decimal(eps).exp()
    remove = Decimal(0)
    add = Decimal(0)
    lo = -reach - shift - int(float(eps) * float(s2) / shift) - 10
    hi = reach + shift + int(float(eps) * float(s2) / shift) + 10
    for x in range(lo, hi + 1):
        p = (-(Decimal(x) ** 2) / (2 * s2)).exp() / z
        q = (-(Decimal(x - shift) ** 2) / (2 * s2)).exp() / z
        if p > e * q:
            remove += p - e * q
        if q > e * p:
            add += q - e * p
    return remove, add


def renyi(s2, shift, alpha, reach):
    z = log_normaliser(s2, reach)
    a = Decimal(alpha)
    centre = int(round((1 - float(alpha)) * shift))
    total = Decimal(0)
    for x in range(centre - reach - 10, centre + reach + 11):
        log_p = -(Decimal(x) ** 2) / (2 * s2)
        log_q = -(Decimal(x - shift) ** 2) / (2 * s2)
        total += (a * log_p + (1 - a) * log_q).exp()
    return ((total / z).ln()) / (a - 1)


def relative(a, b):
    if a == b:
        return Decimal(0)
    return abs(a - b) / max(abs(b), Decimal("1e-300"))


def main():
    out = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
    worst_delta = Decimal(0)
    worst_renyi = Decimal(0)
    worst_symmetry = Decimal(0)
    checked = 0
    failures = []
    for line in out.splitlines():
        parts = line.split()
        n, d, shift = int(parts[1]), int(parts[2]), int(parts[3])
        s2 = Decimal(n) / Decimal(d)
        reach = int(45 * math.sqrt(n / d)) + 10
        if parts[0] == "delta":
            eps = Decimal(parts[4])
            c_remove, c_add, c_bound = Decimal(parts[5]), Decimal(parts[6]), Decimal(parts[7])
            o_remove, o_add = delta(s2, shift, eps, reach)
            for c, o, name in ((c_remove, o_remove, "remove"), (c_add, o_add, "add")):
                r = relative(c, o)
                worst_delta = max(worst_delta, r)
                if r > TOLERANCE or abs(c - o) > c_bound + Decimal("1e-300") + o * Decimal("1e-17"):
                    failures.append(f"{line}: {name} oracle {o:.20e} rel diff {r:.3e}")
            worst_symmetry = max(worst_symmetry, relative(o_remove, o_add))
        elif parts[0] == "renyi":
            alpha = Decimal(parts[4])
            c_value, c_bound = Decimal(parts[5]), Decimal(parts[6])
            o_value = renyi(s2, shift, alpha, reach)
            bound = alpha * shift * shift / (2 * s2)
            r = relative(c_value, o_value)
            worst_renyi = max(worst_renyi, r)
            if r > TOLERANCE:
                failures.append(f"{line}: oracle {o_value:.20e} rel diff {r:.3e}")
            if o_value > bound * (1 + Decimal("1e-35")):  # 40-digit rounding; equality is attained
                failures.append(f"{line}: oracle D_alpha {o_value} above the CKS bound {bound}")
            if relative(c_bound, bound) > Decimal("1e-17"):
                failures.append(f"{line}: bound {c_bound} != {bound}")
        else:
            failures.append(f"unexpected line {line}")
            continue
        checked += 1
    print(f"checked {checked} values; worst relative difference: delta {worst_delta:.3e}, "
          f"renyi {worst_renyi:.3e}; oracle |remove - add|/add worst {worst_symmetry:.3e}")
    if checked < 100:
        failures.append(f"only {checked} values checked")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
