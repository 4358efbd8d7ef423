// The digamma function ψ and exp(ψ(x) − c), fast enough for LDA's expectations
// E[log β] (K·V entries every M-step) and E[log θ] (K entries every E-step
// iteration): E[log β_kv] = ψ(λ_kv) − ψ(Σ_v λ_kv) (Hoffman, Blei, Wang,
// Paisley, "Stochastic Variational Inference", JMLR 2013, eq. 33).
//
// Method, for finite x > 0:
//   * Recurrence (Abramowitz & Stegun 6.3.5, applied ten times):
//       ψ(x) = ψ(x + 10) − S(x),  S(x) = Σ_{i=0}^{9} 1/(x + i).
//     S is computed as one quotient instead of ten divisions. The factors pair
//     up as (x + i)(x + 9 − i) = u + i(9 − i) with u = x(x + 9), so
//       Q(x) = Π_{i=0}^{9} (x + i) = u (u + 8)(u + 14)(u + 18)(u + 20)
//     and S = P/Q with P = Q'(x) = (2x + 9)·dQ/du. For x > 0 every
//     intermediate is a sum or product of positive numbers, so S has a
//     relative error of a few ulps. One division serves S and 1/y:
//     r = 1/(Q·y), 1/y = Q·r, S = P·y·r. The recurrence part uses
//     min(x, 1e20), which keeps Q·y below 1e221: beyond 1e20, S and 1/(2y) are
//     below 1e-19, far below half an ulp of ψ(x) > 46.
//   * Asymptotic series at y = x + 10 ≥ 10 (A&S 6.3.18):
//       ψ(y) = ln y − 1/(2y) − Σ_{n=1}^{7} B_{2n} / (2n y^{2n}),
//     truncation error below the first omitted term |B_16|/(16 y^16) < 5e-17.
//   Cancellation between ψ(x + 10) and S only happens near the positive root
//   x0 ≈ 1.4616, where the error is absolute (a few 1e-16), not relative.
//   The test (tests/core/models/digamma_test.cc) checks both functions against
//   Boost.Math's digamma: relative error ≤ 1e-12 (absolute near the root) for x
//   from 1e-300 to 1e300, densely over [1e-3, 1e7], the range LDA uses; the
//   observed worst case is ~2e-15.
//
// ExpDigammaMinus computes exp(ψ(x) − c) without a logarithm, as
//   y · exp(a),  a = −(S(x) + 1/(2y) + series) − c,
// eight entries at a time with GCC/Clang vector extensions (the compiler
// splits them into SSE2 operations by default, AVX with VIPSD_NATIVE), so the
// long dependency chains of several entries overlap. exp(a) = 2^k·e^r with
// k = round(a/ln 2), r = a − k·ln 2 (Cody–Waite two-part ln 2, exact k·ln2_hi),
// |r| ≤ ln2/2, e^r by its Taylor polynomial of degree 13 (truncation
// < 5e-18 relative); the observed error against std::exp of Boost's ψ is
// ≲ 1e-15·(1 + |ψ(x) − c|) relative (the exponential turns an absolute error
// of the argument into a relative one).
// Results with a < −708 are returned as exactly 0: the true value is then
// below y·e^−708 (< 4e-306 unless x > 10, which needs c > 700), i.e. zero for
// every use in LDA (E-step sums carry a 1e-100 floor). a is capped at 709
// (never reached in LDA, where c = ψ of a sum that includes x, so a < 0).
//
// Preconditions: x finite and ≥ DBL_MIN (normal and positive; λ ≥ η > 0 and
// γ ≥ α > 0 in LDA); other inputs give unspecified values. Pure functions,
// thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace vipsd::models {
namespace digamma_internal {

inline constexpr double kClamp = 1e20;
inline constexpr double kUnderflowArgument = -708.0;
inline constexpr double kOverflowArgument = 709.0;

// For y = x + 10 (x ≤ 1e20; larger x are clamped by the caller), the part of
// ψ(x) that is not ln y:
//   ln y − ψ(x) = S(x) + 1/(2y) + Σ_{n=1}^{7} B_{2n}/(2n y^{2n})
// (see the header comment). D is double or a vector of doubles; the result
// goes to `out` (vector types are not passed by value: that would change the
// calling convention between SSE2 and AVX builds).
template <typename D>
inline void LogMinusDigamma(const D& xc, D& out) {
  const D yc = xc + 10.0;
  const D u = xc * (xc + 9.0);
  // Q = u(u + 8)(u + 14)(u + 18)(u + 20) and dQ/du by the product rule.
  const D f1 = u + 8.0;
  D derivative = u + f1;  // d/du [u·(u + 8)]
  D product = u * f1;
  const D f2 = u + 14.0;
  derivative = derivative * f2 + product;
  product = product * f2;
  const D f3 = u + 18.0;
  derivative = derivative * f3 + product;
  product = product * f3;
  const D f4 = u + 20.0;
  derivative = derivative * f4 + product;
  product = product * f4;
  const D p = (xc + xc + 9.0) * derivative;  // P = dQ/dx = (2x + 9)·dQ/du
  const D r = 1.0 / (product * yc);
  const D z = product * r;             // 1/y
  const D shift_sum = (p * yc) * r;    // S = P/Q
  const D z2 = z * z;
  // B_14/14, B_12/12, …, B_2/2 by Horner in z².
  D t = z2 * (1.0 / 12.0) + (-691.0 / 32760.0);
  t = t * z2 + (1.0 / 132.0);
  t = t * z2 + (-1.0 / 240.0);
  t = t * z2 + (1.0 / 252.0);
  t = t * z2 + (-1.0 / 120.0);
  t = t * z2 + (1.0 / 12.0);
  out = (0.5 * z + t * z2) + shift_sum;
}

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
// Eight doubles; the compiler maps arithmetic onto the widest vector unit the
// build allows (four SSE2 operations by default), so the long dependency
// chains of eight entries overlap.
inline constexpr size_t kBlock = 8;
typedef double Block __attribute__((vector_size(kBlock * sizeof(double))));
typedef int64_t BlockBits __attribute__((vector_size(kBlock * sizeof(double))));
typedef double Pair __attribute__((vector_size(2 * sizeof(double))));
typedef int64_t PairBits __attribute__((vector_size(2 * sizeof(double))));

template <int kIndex>
inline Pair PairOf(const Block& block) {
  return __builtin_shufflevector(block, block, 2 * kIndex, 2 * kIndex + 1);
}

inline Pair SelectLessPair(const Pair& a, const Pair& b, const Pair& x, const Pair& y) {
  const PairBits mask = a < b;
  return (Pair)((mask & (PairBits)x) | (~mask & (PairBits)y));
}

// out = a < b ? x : y, lane by lane. Done on pairs: GCC would otherwise turn
// the comparison of two eight-lane vectors into eight scalar comparisons.
inline void SelectLess(const Block& a, const Block& b, const Block& x, const Block& y,
                       Block& out) {
  const Pair p0 = SelectLessPair(PairOf<0>(a), PairOf<0>(b), PairOf<0>(x), PairOf<0>(y));
  const Pair p1 = SelectLessPair(PairOf<1>(a), PairOf<1>(b), PairOf<1>(x), PairOf<1>(y));
  const Pair p2 = SelectLessPair(PairOf<2>(a), PairOf<2>(b), PairOf<2>(x), PairOf<2>(y));
  const Pair p3 = SelectLessPair(PairOf<3>(a), PairOf<3>(b), PairOf<3>(x), PairOf<3>(y));
  typedef double Quad __attribute__((vector_size(4 * sizeof(double))));
  const Quad low = __builtin_shufflevector(p0, p1, 0, 1, 2, 3);
  const Quad high = __builtin_shufflevector(p2, p3, 0, 1, 2, 3);
  out = __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7);
}

// e^a for a in [−708, 709] (see the header comment).
inline void Exp(const Block& a, Block& out) {
  const double shifter = 0x1.8p52;  // adding it rounds to an integer
  const Block t = a * 1.4426950408889634 + shifter;
  const Block k = t - shifter;  // round(a / ln 2)
  const Block r = (a - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
  Block e = r * (1.0 / 6227020800.0) + (1.0 / 479001600.0);  // 1/13!, 1/12!
  e = e * r + (1.0 / 39916800.0);
  e = e * r + (1.0 / 3628800.0);
  e = e * r + (1.0 / 362880.0);
  e = e * r + (1.0 / 40320.0);
  e = e * r + (1.0 / 5040.0);
  e = e * r + (1.0 / 720.0);
  e = e * r + (1.0 / 120.0);
  e = e * r + (1.0 / 24.0);
  e = e * r + (1.0 / 6.0);
  e = e * r + 0.5;
  e = e * r + 1.0;
  e = e * r + 1.0;
  // 2^k from k's bits in t's mantissa: k + 1023 in the exponent field
  // (k ∈ [−1021, 1023] here, so the scale is a normal double).
  const BlockBits scale_bits = (((BlockBits)t - (BlockBits)(Block{} + shifter)) + 1023) << 52;
  out = e * (Block)scale_bits;
}

// out[0..8) = exp(ψ(x[0..8)) − offsets[0..8)).
inline void ExpDigammaMinusBlock(const double* x, const double* offsets, double* out) {
  Block xs, cs;
  std::memcpy(&xs, x, sizeof(Block));
  std::memcpy(&cs, offsets, sizeof(Block));
  const Block clamp = Block{} + kClamp;
  Block xc;
  SelectLess(xs, clamp, xs, clamp, xc);
  Block log_minus_digamma;
  LogMinusDigamma(xc, log_minus_digamma);
  const Block argument = -log_minus_digamma - cs;
  const Block low = Block{} + kUnderflowArgument;
  const Block high = Block{} + kOverflowArgument;
  Block limited;
  SelectLess(argument, low, low, argument, limited);
  SelectLess(high, limited, high, limited, limited);
  Block exp_argument;
  Exp(limited, exp_argument);
  const Block value = (xs + 10.0) * exp_argument;
  Block result;
  SelectLess(argument, low, Block{}, value, result);
  std::memcpy(out, &result, sizeof(Block));
}
#else
inline constexpr size_t kBlock = 1;
inline void ExpDigammaMinusBlock(const double* x, const double* offsets, double* out) {
  double log_minus_digamma = 0;
  LogMinusDigamma(std::min(x[0], kClamp), log_minus_digamma);
  const double argument = -log_minus_digamma - offsets[0];
  out[0] = argument < kUnderflowArgument
               ? 0.0
               : (x[0] + 10.0) * std::exp(std::min(argument, kOverflowArgument));
}
#endif

// out[i] = exp(ψ(x[i]) − offsets[i]) for i < n, where offsets(i) points at
// the offsets of entries i, i + 1, …. The tail shorter than a block goes
// through the same block code on a padded copy, so every entry is computed
// the same way whatever n is.
template <typename OffsetsAt>
inline void ExpDigammaMinusLoop(const double* x, size_t n, OffsetsAt offsets_at, double* out) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) ExpDigammaMinusBlock(x + i, offsets_at(i), out + i);
  if (i < n) {
    double padded_x[kBlock], padded_offsets[kBlock], padded_out[kBlock];
    std::fill(padded_x, padded_x + kBlock, 1.0);
    std::fill(padded_offsets, padded_offsets + kBlock, 0.0);
    std::copy(x + i, x + n, padded_x);
    std::copy(offsets_at(i), offsets_at(i) + (n - i), padded_offsets);
    ExpDigammaMinusBlock(padded_x, padded_offsets, padded_out);
    std::copy(padded_out, padded_out + (n - i), out + i);
  }
}

}  // namespace digamma_internal

// ψ(x) for finite x ≥ DBL_MIN (method and accuracy in the header comment).
inline double Digamma(double x) {
  double log_minus_digamma = 0;
  digamma_internal::LogMinusDigamma(std::min(x, digamma_internal::kClamp), log_minus_digamma);
  return std::log(x + 10.0) - log_minus_digamma;
}

// out[i] = exp(ψ(x[i]) − offsets[i]), x[i] finite and ≥ DBL_MIN. `out` may
// alias `x`; the three spans must have the same size (only the common prefix
// is computed otherwise).
inline void ExpDigammaMinus(std::span<const double> x, std::span<const double> offsets,
                            std::span<double> out) {
  const double* offset_data = offsets.data();
  digamma_internal::ExpDigammaMinusLoop(
      x.data(), std::min({x.size(), offsets.size(), out.size()}),
      [offset_data](size_t i) { return offset_data + i; }, out.data());
}

// out[i] = exp(ψ(x[i]) − offset); as above with one offset for every entry.
inline void ExpDigammaMinus(std::span<const double> x, double offset, std::span<double> out) {
  double offsets[digamma_internal::kBlock];
  std::fill(offsets, offsets + digamma_internal::kBlock, offset);
  digamma_internal::ExpDigammaMinusLoop(
      x.data(), std::min(x.size(), out.size()), [&offsets](size_t) { return &offsets[0]; },
      out.data());
}

}  // namespace vipsd::models
