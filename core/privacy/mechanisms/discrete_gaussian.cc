#include "core/privacy/mechanisms/discrete_gaussian.h"

#include <sodium.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

namespace vipsd::privacy {
namespace {

using u128 = Uint128;

constexpr u128 kU128Max = ~static_cast<u128>(0);
constexpr u128 kTwoTo127 = static_cast<u128>(1) << 127;
constexpr u128 kTwoTo63 = static_cast<u128>(1) << 63;

// --- The sampling core ------------------------------------------------------
//
// One implementation of every sampling step, used both by Fill and by the
// building blocks in internal:: (which tests call). Each step reads random
// bits (RandomWords::Bits, each bit once) in exactly the order the
// algorithms in the header comment describe, so Fill's draws on a given
// stream are fixed (the test FixedSeedDrawsAreThoseOfTheFirstSampler pins
// them). For speed the inner
// loops do not build a Status per trial: a step that cannot complete records
// a Fault (each has probability far below 2^-64, see the header) and returns;
// its caller stops at once and turns the fault into the Status below.

enum class Fault : uint8_t {
  kNone,
  kLoopCounter,       // a Bernoulli(exp(−γ)) loop ran 2^64 − 1 times
  kGeometricCounter,  // the Laplace's geometric count reached 2^64 − 1
  kLaplaceCandidate,  // U + t·V ≥ 2^63
  kWideExponent,      // γ beyond 256-bit arithmetic passed every trial
};

Status FaultStatus(Fault fault, uint64_t t) {
  switch (fault) {
    case Fault::kLoopCounter:
      return OutOfRangeError("discrete Gaussian: Bernoulli(exp(-gamma)) loop counter overflowed");
    case Fault::kGeometricCounter:
      return OutOfRangeError("discrete Laplace: geometric counter overflowed");
    case Fault::kLaplaceCandidate:
      return OutOfRangeError("discrete Laplace: candidate U + t*V does not fit in int64 (t = " +
                             std::to_string(t) + "); no draw is returned");
    case Fault::kWideExponent:
      return OutOfRangeError(
          "discrete Gaussian: an acceptance exponent too large for 256-bit arithmetic "
          "passed every trial (probability below exp(-2^127)); no draw is returned");
    case Fault::kNone:
      break;
  }
  return Status::Ok();
}

// The bit length of max ≥ 1.
inline int BitLength(uint64_t max) { return 64 - std::countl_zero(max); }

// Uniform in [0, max] for max ≥ 1 with bits = BitLength(max): the next
// `bits` random bits, rejected if above max.
inline uint64_t DrawAtMost(internal::RandomWords& words, uint64_t max, int bits) {
  while (true) {
    const uint64_t candidate = words.Bits(bits);
    if (candidate <= max) return candidate;
  }
}

// Uniform in [0, max]; no bit is read for max = 0.
uint64_t UniformAtMost(internal::RandomWords& words, uint64_t max) {
  if (max == 0) return 0;
  return DrawAtMost(words, max, BitLength(max));
}

// Uniform in [0, max] for a fixed max < 2^128, its bit length worked out
// once: as DrawAtMost when max < 2^64, else the high bits (as many as the
// high word of max has) and then 64 low bits, the pair rejected if above max.
class UniformRange {
 public:
  explicit UniformRange(u128 max)
      : max_(max),
        wide_((max >> 64) != 0),
        bits_(wide_ ? BitLength(static_cast<uint64_t>(max >> 64))
                    : (max == 0 ? 0 : BitLength(static_cast<uint64_t>(max)))) {}

  u128 Draw(internal::RandomWords& words) const {
    if (!wide_) {
      if (max_ == 0) return 0;
      return DrawAtMost(words, static_cast<uint64_t>(max_), bits_);
    }
    while (true) {
      const uint64_t high = words.Bits(bits_);
      const uint64_t low = words.Bits(64);
      const u128 candidate = (static_cast<u128>(high) << 64) | low;
      if (candidate <= max_) return candidate;
    }
  }

 private:
  u128 max_;
  bool wide_;
  int bits_;
};

// Bernoulli(p/q) for a fixed q ≥ 1: "a uniform integer in [0, q) is < p";
// no bit is read when p = 0 or p ≥ q.
class Fraction {
 public:
  explicit Fraction(u128 q) : q_(q), below_q_(q - 1) {}
  bool Draw(internal::RandomWords& words, u128 p) const {
    if (p == 0) return false;
    if (p >= q_) return true;
    return below_q_.Draw(words) < p;
  }

 private:
  u128 q_;
  UniformRange below_q_;
};

// Bernoulli(exp(−p/q)), 0 ≤ p ≤ q: K ← 1; while Bernoulli(1/K) and
// Bernoulli(p/q) (in that order; Bernoulli(1/1) reads nothing): K ← K + 1;
// return K odd.
inline bool ExpMinusAtMostOne(internal::RandomWords& words, u128 p, const Fraction& q,
                              Fault& fault) {
  uint64_t k = 1;
  while (true) {
    if (k != 1 && DrawAtMost(words, k - 1, BitLength(k - 1)) != 0) break;
    if (!q.Draw(words, p)) break;
    if (k == std::numeric_limits<uint64_t>::max()) {
      fault = Fault::kLoopCounter;
      return false;
    }
    ++k;
  }
  return (k & 1) == 1;
}

// Bernoulli(exp(−1)): the loop above with p = q, whose Bernoulli(p/q) is
// always true and reads nothing.
inline bool ExpMinusOne(internal::RandomWords& words, Fault& fault) {
  uint64_t k = 2;
  while (DrawAtMost(words, k - 1, BitLength(k - 1)) == 0) {
    if (k == std::numeric_limits<uint64_t>::max()) {
      fault = Fault::kLoopCounter;
      return false;
    }
    ++k;
  }
  return (k & 1) == 1;
}

// Bernoulli(exp(−γ)), γ = whole + p/q with p < q: `whole` Bernoulli(exp(−1))
// trials, stopping at the first failure, then Bernoulli(exp(−p/q)). With
// whole_is_lower_bound (γ only known to be ≥ whole) passing every trial is a
// kWideExponent fault.
inline bool ExpMinus(internal::RandomWords& words, u128 whole, u128 p, const Fraction& q,
                     bool whole_is_lower_bound, Fault& fault) {
  for (u128 i = 0; i < whole; ++i) {
    if (!ExpMinusOne(words, fault)) return false;
  }
  if (whole_is_lower_bound) {
    fault = Fault::kWideExponent;
    return false;
  }
  return ExpMinusAtMostOne(words, p, q, fault);
}

// The discrete Laplace with scale t/s (CKS Algorithm 2), s, t ≥ 1:
// U uniform in [0, t); accept with Bernoulli(exp(−U/t)), else start over;
// V ← the number of Bernoulli(exp(−1)) successes before the first failure;
// Y ← ⌊(U + t·V)/s⌋; a sign (the next random bit); start over on
// "negative zero".
class Laplace {
 public:
  Laplace(uint64_t s, uint64_t t)
      : s_(s), t_(t), u_range_(t - 1), u_fraction_(t), v_limit_((kTwoTo63 - 1) / t) {}

  int64_t Draw(internal::RandomWords& words, Fault& fault) const {
    while (true) {
      const uint64_t u = static_cast<uint64_t>(u_range_.Draw(words));
      if (!ExpMinusAtMostOne(words, u, u_fraction_, fault)) {
        if (fault != Fault::kNone) return 0;
        continue;
      }
      uint64_t v = 0;
      while (true) {
        const bool pass = ExpMinusOne(words, fault);
        if (fault != Fault::kNone) return 0;
        if (!pass) break;
        if (v == std::numeric_limits<uint64_t>::max()) {
          fault = Fault::kGeometricCounter;
          return 0;
        }
        ++v;
      }
      // t·V < 2^63 is checked before it is formed; then U + t·V < 2^64.
      if (v > v_limit_) {
        fault = Fault::kLaplaceCandidate;
        return 0;
      }
      const uint64_t x = u + t_ * v;
      if (x >= kTwoTo63) {
        fault = Fault::kLaplaceCandidate;
        return 0;
      }
      const uint64_t y = s_ == 1 ? x : x / s_;
      const bool negative = words.Bits(1) == 1;
      if (negative && y == 0) continue;
      return negative ? -static_cast<int64_t>(y) : static_cast<int64_t>(y);
    }
  }

 private:
  uint64_t s_;
  uint64_t t_;
  UniformRange u_range_;  // [0, t − 1]
  Fraction u_fraction_;   // U/t
  uint64_t v_limit_;      // the largest V with t·V < 2^63
};

// ⌊a²/b⌋ and a² mod b as internal::DivideSquare, without a 128-bit division
// in the common case: when a < 2^64 and γ = a²/b is below 5 (nearly every
// acceptance test), the quotient comes from at most four subtractions.
internal::SquareDivision DivideSquareQuick(u128 a, u128 b) {
  if ((a >> 64) != 0) return internal::DivideSquare(a, b);
  if (b == 0 || b >= kTwoTo127) return internal::DivideSquare(a, b);  // outside the contract
  const uint64_t a0 = static_cast<uint64_t>(a);
  u128 remainder = static_cast<u128>(a0) * a0;
  internal::SquareDivision result;
  for (int step = 0; step < 4 && remainder >= b; ++step) {
    remainder -= b;
    ++result.quotient;
  }
  if (remainder >= b) return internal::DivideSquare(a, b);
  result.remainder = remainder;
  return result;
}

uint64_t IntegerSqrt(uint64_t value) {
  uint64_t root = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint64_t candidate = root | (uint64_t{1} << bit);
    if (static_cast<u128>(candidate) * candidate <= value) root = candidate;
  }
  return root;
}

Status ValidateSigma2(Rational sigma2) {
  if (sigma2.numerator == 0 || sigma2.denominator == 0) {
    return InvalidArgumentError(
        "discrete Gaussian: sigma^2 = numerator/denominator needs both >= 1 (got " +
        std::to_string(sigma2.numerator) + "/" + std::to_string(sigma2.denominator) + ")");
  }
  return Status::Ok();
}

long double Sigma2Value(Rational sigma2) {
  return static_cast<long double>(sigma2.numerator) /
         static_cast<long double>(sigma2.denominator);
}

constexpr long double kPi = 3.141592653589793238462643383279502884L;
constexpr long double kEps = LDBL_EPSILON;

// Σ_{x < -cut} exp(−x²/(2σ²)) ≤ ∫_{cut−1}^∞ exp(−u²/(2σ²)) du (the summand
// is decreasing in |x|), cut ≥ 1.
long double GaussTailBound(long double sigma, long double cut) {
  const long double from = std::max(0.0L, cut - 1);
  return sigma * std::sqrt(kPi / 2) * std::erfc(from / (sigma * std::sqrt(2.0L)));
}

}  // namespace

namespace internal {

RandomWords::~RandomWords() {
  sodium_memzero(buffer_, sizeof buffer_);
  sodium_memzero(&pool_, sizeof pool_);
}

void RandomWords::Refill() {
  source_.FillUniformBits(std::span<uint64_t>(buffer_, DiscreteGaussianSampler::kWordBuffer));
  position_ = 0;
}

uint64_t UniformBelow(RandomWords& words, uint64_t m) {
  if (m == 0) return 0;
  return UniformAtMost(words, m - 1);
}

Uint128 UniformBelow128(RandomWords& words, Uint128 m) {
  if (m == 0) return 0;
  return UniformRange(m - 1).Draw(words);
}

StatusOr<bool> BernoulliExpMinus(RandomWords& words, Uint128 whole,
                                 Uint128 remainder, Uint128 denominator,
                                 bool whole_is_lower_bound) {
  if (denominator == 0 || remainder >= denominator) {
    return InvalidArgumentError(
        "discrete Gaussian: Bernoulli(exp(-gamma)) needs remainder < denominator");
  }
  Fault fault = Fault::kNone;
  const bool result =
      ExpMinus(words, whole, remainder, Fraction(denominator), whole_is_lower_bound, fault);
  if (fault != Fault::kNone) return FaultStatus(fault, 0);
  return result;
}

StatusOr<bool> BernoulliExpMinusRational(RandomWords& words, uint64_t numerator,
                                         uint64_t denominator) {
  if (denominator == 0) {
    return InvalidArgumentError("discrete Gaussian: Bernoulli(exp(-n/d)) needs d >= 1");
  }
  return BernoulliExpMinus(words, numerator / denominator, numerator % denominator,
                           denominator);
}

StatusOr<int64_t> DiscreteLaplace(RandomWords& words, uint64_t s, uint64_t t) {
  if (s == 0 || t == 0) {
    return InvalidArgumentError("discrete Laplace: scale t/s needs s, t >= 1");
  }
  Fault fault = Fault::kNone;
  const int64_t y = Laplace(s, t).Draw(words, fault);
  if (fault != Fault::kNone) return FaultStatus(fault, t);
  return y;
}

SquareDivision DivideSquare(Uint128 a, Uint128 b) {
  SquareDivision result;
  if (b == 0 || b >= kTwoTo127) {  // caller bug: outside the contract
    result.overflow = true;
    result.quotient = kU128Max;
    return result;
  }
  // a² = high·2^128 + low, from 64-bit limbs.
  const u128 a1 = a >> 64;
  const u128 a0 = static_cast<uint64_t>(a);
  const u128 middle = a1 * a0;  // < 2^128
  u128 low = a0 * a0;
  u128 high = a1 * a1;
  for (int twice = 0; twice < 2; ++twice) {
    const u128 add = middle << 64;
    const u128 sum = low + add;
    high += (middle >> 64) + (sum < low ? 1 : 0);
    low = sum;
  }
  if (high >= b) {  // quotient ≥ 2^128
    result.overflow = true;
    result.quotient = kU128Max;
    return result;
  }
  if (high == 0) {
    result.quotient = low / b;
    result.remainder = low % b;
    return result;
  }
  // Restoring long division of (high, low) by b; the running remainder stays
  // below b < 2^127, so shifting it left by one never overflows.
  u128 remainder = high;
  u128 quotient = 0;
  for (int bit = 127; bit >= 0; --bit) {
    remainder = (remainder << 1) | ((low >> bit) & 1);
    if (remainder >= b) {
      remainder -= b;
      quotient |= static_cast<u128>(1) << bit;
    }
  }
  result.quotient = quotient;
  result.remainder = remainder;
  return result;
}

long double LogNormaliserDirect(long double sigma2, int64_t truncation) {
  long double sum = 0;
  for (int64_t y = truncation; y >= 1; --y) {
    const long double yy = static_cast<long double>(y);
    sum += 2 * std::exp(-yy * yy / (2 * sigma2));
  }
  return std::log1p(sum);
}

long double LogNormaliserDual(long double sigma2, int terms) {
  long double sum = 0;
  for (int k = terms; k >= 1; --k) {
    const long double kk = k;
    sum += 2 * std::exp(-2 * kPi * kPi * sigma2 * kk * kk);
  }
  return 0.5L * std::log(2 * kPi * sigma2) + std::log1p(sum);
}

}  // namespace internal

StatusOr<Rational> RoundUpSigma2(double sigma2) {
  if (!std::isfinite(sigma2) || sigma2 <= 0) {
    return InvalidArgumentError("discrete Gaussian: sigma^2 must be finite and > 0");
  }
  constexpr double kLimit = 0x1.0p62;
  if (sigma2 >= kLimit) {
    return OutOfRangeError("discrete Gaussian: sigma^2 must be < 2^62 (sigma < 2^31)");
  }
  for (int k = 62; k >= 0; --k) {
    const double scaled = std::ldexp(sigma2, k);  // exact: a power-of-two scaling
    if (scaled >= kLimit) continue;
    const double rounded = std::ceil(scaled);     // exact for doubles
    Rational candidate{static_cast<uint64_t>(rounded), uint64_t{1} << k};
    if (candidate.numerator == 0) candidate.numerator = 1;
    if (!DiscreteGaussianSampler::Create(candidate).ok()) continue;
    while (candidate.denominator > 1 && (candidate.numerator & 1) == 0) {
      candidate.numerator >>= 1;
      candidate.denominator >>= 1;
    }
    return candidate;
  }
  return OutOfRangeError("discrete Gaussian: no power-of-two denominator represents sigma^2");
}

StatusOr<DiscreteGaussianSampler> DiscreteGaussianSampler::Create(Rational sigma2) {
  VIPSD_RETURN_IF_ERROR(ValidateSigma2(sigma2));
  const uint64_t n = sigma2.numerator;
  const uint64_t d = sigma2.denominator;
  // ⌊σ⌋ = ⌊sqrt(⌊n/d⌋)⌋ (an integer s has s² ≤ n/d iff s² ≤ ⌊n/d⌋).
  const uint64_t t = IntegerSqrt(n / d) + 1;
  const u128 dt = static_cast<u128>(d) * t;  // < 2^64 · (2^32 + 1)
  const u128 nd = static_cast<u128>(n) * d;  // < 2^128
  const u128 tt = static_cast<u128>(t) * t;  // ≤ (2^32 + 1)²
  // 2·n·d·t² must be < 2^127, i.e. n·d·t² ≤ 2^126 − 1.
  const u128 max_product = (kTwoTo127 >> 1) - 1;
  if (nd > max_product / tt) {
    return OutOfRangeError(
        "discrete Gaussian: sigma^2 = " + std::to_string(n) + "/" + std::to_string(d) +
        " is outside the exact-arithmetic range (2*n*d*t^2 must be < 2^127 with "
        "t = floor(sigma) + 1; reduce the fraction or use RoundUpSigma2)");
  }
  return DiscreteGaussianSampler(sigma2, t, dt, 2 * nd * tt);
}

Status NoiseSource::FillDiscreteGaussian(const DiscreteGaussianSampler& sampler,
                                         std::span<int64_t> out) {
  return sampler.Fill(*this, out);
}

Status NoiseSource::FillDiscreteGaussianParallel(const DiscreteGaussianSampler& sampler,
                                                 std::span<int64_t> out, int /*threads*/) {
  return FillDiscreteGaussian(sampler, out);
}

Status DiscreteGaussianSampler::Fill(NoiseSource& source, std::span<int64_t> out) const {
  internal::RandomWords words(source);
  const u128 n = sigma2_.numerator;
  const Laplace laplace(1, t_);
  const Fraction gamma_fraction(gamma_denominator_);
  // |Y| above this makes |Y|·t·d ≥ 2^128 (the numerator of γ is then
  // > 2^254, so γ > 2^127).
  const u128 magnitude_limit = kU128Max / dt_;
  Fault fault = Fault::kNone;
  for (size_t i = 0; i < out.size(); ++i) {
    while (true) {
      const int64_t y = laplace.Draw(words, fault);
      if (fault != Fault::kNone) break;
      // γ = (|Y|·t·d − n)² / (2·n·d·t²) = (|Y| − σ²/t)² / (2σ²).
      // |Y| as unsigned (Y > INT64_MIN: the Laplace draw is below 2^63 in size).
      const u128 magnitude = y < 0 ? uint64_t{0} - static_cast<uint64_t>(y)
                                   : static_cast<uint64_t>(y);
      bool accept = false;
      if (magnitude != 0 && magnitude > magnitude_limit) {
        accept = ExpMinus(words, kTwoTo127, 0, gamma_fraction, true, fault);
      } else {
        const u128 product = magnitude * dt_;
        const u128 a = product >= n ? product - n : n - product;
        const internal::SquareDivision gamma = DivideSquareQuick(a, gamma_denominator_);
        accept = ExpMinus(words, gamma.quotient, gamma.remainder, gamma_fraction,
                          gamma.overflow, fault);
      }
      if (fault != Fault::kNone) break;
      if (accept) {
        out[i] = y;
        break;
      }
    }
    if (fault != Fault::kNone) {
      std::fill(out.begin(), out.end(), 0);
      return FaultStatus(fault, t_);
    }
  }
  return Status::Ok();
}

StatusOr<DiscreteGaussianNormaliser> DiscreteGaussianLogNormaliser(Rational sigma2) {
  VIPSD_RETURN_IF_ERROR(ValidateSigma2(sigma2));
  const long double s2 = Sigma2Value(sigma2);
  const long double sigma = std::sqrt(s2);
  DiscreteGaussianNormaliser result;
  if (s2 < 64) {
    const int64_t truncation = static_cast<int64_t>(std::ceil(40 * sigma)) + 1;
    result.log_normaliser = internal::LogNormaliserDirect(s2, truncation);
    result.terms = 2 * truncation + 1;
    // Omitted: Σ_{|y| > T} ≤ 2·tail; relative to Z ≥ 1. Rounding: each term
    // within 2 ulp (exp of a rounded argument; |arg| ≤ 800 costs at most
    // 800·ε more), each addition 1 ulp of the partial sum.
    const long double tail = 2 * GaussTailBound(sigma, static_cast<long double>(truncation) + 1);
    result.absolute_error_bound =
        tail + (static_cast<long double>(result.terms) * 4 + 1000) * kEps;
  } else {
    constexpr int kTerms = 3;
    result.log_normaliser = internal::LogNormaliserDual(s2, kTerms);
    result.terms = 2 * kTerms + 1;
    result.dual = true;
    // Omitted k ≥ 4: ≤ 2·exp(−2π²·σ²·16)/(1 − exp(−2π²σ²)); plus rounding of
    // log(2πσ²) and the small series.
    result.absolute_error_bound = 4 * std::exp(-2 * kPi * kPi * s2 * 16) + 64 * kEps;
  }
  return result;
}

StatusOr<long double> DiscreteGaussianLogPmf(Rational sigma2, int64_t x) {
  VIPSD_ASSIGN_OR_RETURN(const DiscreteGaussianNormaliser z, DiscreteGaussianLogNormaliser(sigma2));
  const long double s2 = Sigma2Value(sigma2);
  const long double xx = static_cast<long double>(x);
  return -xx * xx / (2 * s2) - z.log_normaliser;
}

StatusOr<DiscreteGaussianDelta> DiscreteGaussianMechanismDelta(Rational sigma2,
                                                              uint64_t sensitivity,
                                                              double epsilon) {
  VIPSD_RETURN_IF_ERROR(ValidateSigma2(sigma2));
  if (sensitivity == 0) {
    return InvalidArgumentError("discrete Gaussian delta: sensitivity must be >= 1");
  }
  if (!std::isfinite(epsilon) || epsilon < 0) {
    return InvalidArgumentError("discrete Gaussian delta: epsilon must be finite and >= 0");
  }
  VIPSD_ASSIGN_OR_RETURN(const DiscreteGaussianNormaliser z, DiscreteGaussianLogNormaliser(sigma2));
  const long double s2 = Sigma2Value(sigma2);
  const long double sigma = std::sqrt(s2);
  const long double delta_shift = static_cast<long double>(sensitivity);
  const long double eps = epsilon;
  const long double width = std::ceil(40 * sigma) + 1;
  // remove: L(x) = ln P/Q = Δ(Δ − 2x)/(2σ²) > ε  ⟺  x < Δ/2 − εσ²/Δ.
  const long double boundary = delta_shift / 2 - eps * s2 / delta_shift;
  const long double upper_boundary = delta_shift / 2 + eps * s2 / delta_shift;
  constexpr long double kIndexLimit = 0x1.0p61L;
  if (std::fabs(boundary) > kIndexLimit || upper_boundary > kIndexLimit) {
    return OutOfRangeError("discrete Gaussian delta: eps * sigma^2 / Delta is too large to sum");
  }
  // One extra point past each boundary (rounding of the boundary); terms on
  // the wrong side are clamped to 0.
  const int64_t remove_high = static_cast<int64_t>(std::ceil(boundary));
  const int64_t remove_low =
      std::min<int64_t>(remove_high, 0) - static_cast<int64_t>(width);
  const int64_t add_low = static_cast<int64_t>(std::floor(upper_boundary));
  const int64_t add_high =
      std::max<int64_t>(add_low, static_cast<int64_t>(sensitivity)) + static_cast<int64_t>(width);
  const int64_t terms = (remove_high - remove_low + 1) + (add_high - add_low + 1);
  if (terms > kMaxSummationTerms) {
    return OutOfRangeError("discrete Gaussian delta: the exact sum needs " +
                           std::to_string(terms) + " terms (limit " +
                           std::to_string(kMaxSummationTerms) + ")");
  }
  DiscreteGaussianDelta result;
  result.terms = terms;
  for (int64_t x = remove_low; x <= remove_high; ++x) {
    const long double xx = static_cast<long double>(x);
    const long double loss = delta_shift * (delta_shift - 2 * xx) / (2 * s2);
    if (loss <= eps) continue;
    const long double log_p = -xx * xx / (2 * s2) - z.log_normaliser;
    result.delta_remove += std::exp(log_p) * -std::expm1(eps - loss);
  }
  for (int64_t x = add_high; x >= add_low; --x) {
    const long double xx = static_cast<long double>(x);
    const long double loss = -delta_shift * (delta_shift - 2 * xx) / (2 * s2);  // ln Q/P
    if (loss <= eps) continue;
    const long double shifted = xx - delta_shift;
    const long double log_q = -shifted * shifted / (2 * s2) - z.log_normaliser;
    result.delta_add += std::exp(log_q) * -std::expm1(eps - loss);
  }
  result.delta = std::max(result.delta_remove, result.delta_add);
  // Omitted far tails (each ≤ the Gaussian tail beyond 40σ from the mode,
  // relative to Z ≥ 1), the normaliser's error (relative on every term) and
  // the rounding of each term (exp and expm1 of rounded arguments whose
  // magnitude is at most (|x| + Δ)²/(2σ²)) and of the summation.
  const long double far = 2 * GaussTailBound(sigma, width);
  const long double max_argument =
      std::pow(std::max(std::fabs(static_cast<long double>(remove_low)),
                        std::fabs(static_cast<long double>(add_high))) +
                   delta_shift,
               2) /
      (2 * s2);
  result.error_bound =
      far + result.delta * (2 * z.absolute_error_bound +
                            (static_cast<long double>(terms) * 4 + 4 * max_argument + 16) * kEps);
  return result;
}

StatusOr<long double> DiscreteGaussianRenyiDivergence(Rational sigma2, uint64_t sensitivity,
                                                      double alpha) {
  VIPSD_RETURN_IF_ERROR(ValidateSigma2(sigma2));
  if (sensitivity == 0) {
    return InvalidArgumentError("discrete Gaussian Renyi divergence: sensitivity must be >= 1");
  }
  if (!(alpha > 1 && alpha <= 1024)) {
    return InvalidArgumentError("discrete Gaussian Renyi divergence: alpha must be in (1, 1024]");
  }
  VIPSD_ASSIGN_OR_RETURN(const DiscreteGaussianNormaliser z, DiscreteGaussianLogNormaliser(sigma2));
  const long double s2 = Sigma2Value(sigma2);
  const long double sigma = std::sqrt(s2);
  const long double a = alpha;
  const long double shift = static_cast<long double>(sensitivity);
  // P(x)^α Q(x)^(1−α) = exp(u(x) − ln Z), u(x) = −(αx² + (1−α)(x−Δ)²)/(2σ²);
  // its mass sits within 40σ of the tilted mode (1 − α)Δ.
  const long double centre = (1 - a) * shift;
  const long double width = std::ceil(40 * sigma) + 1;
  if (std::fabs(centre) + width > 0x1.0p61L || 2 * width + 3 > kMaxSummationTerms) {
    return OutOfRangeError("discrete Gaussian Renyi divergence: too many terms to sum");
  }
  const int64_t low = static_cast<int64_t>(std::floor(centre - width));
  const int64_t high = static_cast<int64_t>(std::ceil(centre + width));
  auto exponent = [&](int64_t x) {
    const long double xx = static_cast<long double>(x);
    const long double moved = xx - shift;
    return -(a * xx * xx + (1 - a) * moved * moved) / (2 * s2);
  };
  long double peak = -std::numeric_limits<long double>::infinity();
  for (int64_t x = low; x <= high; ++x) peak = std::max(peak, exponent(x));
  long double sum = 0;
  for (int64_t x = low; x <= high; ++x) sum += std::exp(exponent(x) - peak);
  return (peak + std::log(sum) - z.log_normaliser) / (a - 1);
}

long double DiscreteGaussianRdpBound(Rational sigma2, uint64_t sensitivity, double alpha) {
  const long double shift = static_cast<long double>(sensitivity);
  return static_cast<long double>(alpha) * shift * shift / (2 * Sigma2Value(sigma2));
}

}  // namespace vipsd::privacy
