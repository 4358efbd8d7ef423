// The discrete Gaussian N_Z(0, σ²) on the integers: an exact sampler driven
// by a NoiseSource's random words, its exact pmf (for tests and accounting),
// and the privacy loss of the one-dimensional discrete Gaussian mechanism.
//
// What it is. N_Z(μ, σ²) puts mass exp(−(x − μ)²/(2σ²)) / Z(σ²) on every
// integer x, Z(σ²) = Σ_{y ∈ Z} exp(−y²/(2σ²)). σ² is a parameter (the
// variance of the continuous Gaussian of the same shape; the discrete one has
// a slightly smaller variance). Canonne, Kamath, Steinke, "The Discrete
// Gaussian for Differential Privacy" (NeurIPS 2020; arXiv:2004.00010), here
// "CKS".
//
// Where it is used. Every private release draws its noise here:
// GaussianSumMechanism::Release (gaussian_mechanism.h) adds N_Z(0, σ_g²) to
// an exact integer sum of grid-rounded statistics, through
// NoiseSource::FillDiscreteGaussian. The accounting of that mechanism (a
// proven reduction to the continuous Gaussian the accountants charge) is in
// gaussian_mechanism.h and docs/privacy_accounting.md §1a.
//
// Sampler guarantees (DiscreteGaussianSampler).
//  * Exact in distribution. It is CKS Algorithm 1 as published: Bernoulli(
//    exp(−γ)) for rational γ (CKS Algorithm 1's first part, von Neumann's
//    alternating-series construction: for γ ≤ 1, K ← 1; while
//    Bernoulli(γ/K): K ← K + 1; return K odd; for γ > 1 a run of ⌊γ⌋
//    Bernoulli(exp(−1)) followed by Bernoulli(exp(−(γ − ⌊γ⌋)))), the discrete
//    Laplace with rational scale t/s (CKS Algorithm 2), and rejection from
//    the discrete Laplace of scale t = ⌊σ⌋ + 1 with acceptance probability
//    exp(−(|Y| − σ²/t)²/(2σ²)) (CKS Algorithm 3). Every sampling decision is
//    a comparison of integers: σ² is an exact rational n/d, every γ is an
//    exact ratio of unsigned (up to 256-bit intermediate) integers, and a
//    Bernoulli(p/q) is "a uniform integer in [0, q) is < p". No floating-point
//    value is computed anywhere in the sampling path. Given ideal random
//    words, the output distribution is exactly N_Z(0, n/d).
//  * Uniform integers in [0, m) are drawn by rejection: take the next
//    ⌈log2 m⌉ random bits (RandomWords::Bits; for m > 2^64 the high part
//    first, then 64 low bits), reject if ≥ m. No modulo bias; each try
//    succeeds with probability > 1/2. A sign is one bit. Every random bit
//    is used by at most one decision, so the decisions see independent
//    uniform bits, which is all the exactness argument needs.
//  * Bernoulli(γ/K) is sampled as Bernoulli(γ) AND Bernoulli(1/K) (fresh
//    randomness for both), so no product d·K is ever formed.
//  * Random words come only from NoiseSource::FillUniformBits (the production
//    SecureNoiseSource: ChaCha20 keyed from the OS CSPRNG; the reproducible
//    source in tests). A call buffers at most kWordBuffer words; the words
//    and bits it does not use are wiped and discarded when the call returns,
//    so the same seed and the same sequence of Fill calls (and sizes) give
//    the same draws.
//  * Running time. The sampler never sees the statistic the noise is added to,
//    so its running time cannot depend on it, nor on any record. The time
//    depends only on σ² (public) and on the random words: the rejection
//    loops (uniform draws, the Bernoulli loops, the Laplace and Gaussian
//    rejections) run a random, noise-dependent number of times, and the
//    acceptance test takes a slower exact 256-by-128-bit division when
//    ||Y|·t·d − n| ≥ 2^64, i.e. for candidates |Y| ≳ (2^64/n + 1)·σ (about 0.7%
//    of them when n is near 2^62, where that is 5σ; fewer as n shrinks). The noise values are secret, but a timing side channel
//    on them is a timing channel on the noise, not on the data; whether it
//    matters depends on what an adversary can time (releases in vipsd leave
//    at public times, not when sampling ends).
//  * σ² = n/d must satisfy n ≥ 1, d ≥ 1 and 2·n·d·t² < 2^127 with
//    t = ⌊sqrt(n/d)⌋ + 1 (checked by Create; e.g. any integer σ² < 2^62 with
//    d = 1 fits, i.e. σ up to 2^31). RoundUpSigma2 picks a fitting
//    power-of-two denominator for a double σ².
//
// Failure. Create returns InvalidArgument for a zero numerator or denominator
// and OutOfRange when the bound above does not hold. Fill returns OutOfRange
// only if an intermediate would overflow: the discrete Laplace candidate
// U + t·V ≥ 2^63 (probability below exp(−2^63/t + 1) per candidate, i.e. never
// for t ≤ 2^32), or a Gaussian acceptance test whose γ does not fit 128 bits
// and still passes 2^127 consecutive Bernoulli(exp(−1)) trials (probability
// exp(−2^127)). These are checks, not approximations: no value ever wraps.
// On failure `out` is zero-filled and must not be released.
//
// Pmf, δ(ε) and Rényi divergence (long double; accounting and test code, not
// used by the sampler). See each function for its truncation and error
// bound. The privacy loss of the 1-D mechanism x ↦ x + N_Z(0, σ²) for
// integer sensitivity Δ: with P = N_Z(0, σ²), Q = N_Z(Δ, σ²) the loss
// ln P(x)/Q(x) = Δ(Δ − 2x)/(2σ²) (the normaliser cancels), and
//   δ(ε) = max(Σ_x (P(x) − e^ε Q(x))₊, Σ_x (Q(x) − e^ε P(x))₊),
// summed over the integers (both directions; they are equal by the symmetry
// x ↦ Δ − x, which the tests check rather than assume).
// RDP: CKS Section 2, the proposition "Discrete Gaussian satisfies
// concentrated differential privacy" (Proposition 5 in arXiv:2004.00010v5 as
// we recall it; the number could not be checked offline, the statement is
// re-derived below and tested): for σ > 0 and integers μ, ν, |μ − ν| ≤ Δ,
//   D_α(N_Z(μ, σ²) ‖ N_Z(ν, σ²)) ≤ αΔ²/(2σ²)   for all α ∈ (1, ∞),
// i.e. (Δ²/(2σ²))-zCDP, the same as the continuous Gaussian. Direct
// derivation (used to test the bound): completing the square,
//   D_α = αΔ²/(2σ²) + ln(θ((α − 1)Δ)/θ(0)) / (α − 1),
// θ(c) = Σ_x exp(−(x − c)²/(2σ²)), and θ(c) ≤ θ(0) for every real c (Poisson
// summation: θ's Fourier coefficients are positive), with equality exactly
// when (α − 1)Δ is an integer. So the bound is attained at integer α and is
// strict otherwise.
//
// Thread-safety: a DiscreteGaussianSampler is immutable after Create and may
// be shared; Fill uses only the NoiseSource it is given (a NoiseSource is NOT
// thread-safe: one per thread). The free functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/base/status.h"
#include "core/privacy/mechanisms/noise_source.h"

namespace vipsd::privacy {

// Unsigned 128-bit integers (a GCC/Clang extension; __extension__ keeps
// -Wpedantic quiet, as in pld_accountant.cc).
__extension__ typedef unsigned __int128 Uint128;

// An exact non-negative rational numerator / denominator.
struct Rational {
  uint64_t numerator = 0;
  uint64_t denominator = 1;
};

// Rounds a double σ² > 0 UP to n / 2^k with the largest k ≤ 62 for which the
// result is accepted by DiscreteGaussianSampler::Create (n < 2^62 when
// k > 0), then reduces common factors of two. The result is ≥ sigma2 exactly
// (a double is a dyadic rational) and larger by less than 2^-k. In practice
// every σ² ≥ 2^-10 is represented exactly (its 53-bit mantissa fits); smaller
// ones gain less than 2^-62 in absolute terms (σ² = 3e-19 becomes 2^-61).
// Rounding σ² (hence σ) up can only add privacy under the RDP bound
// αΔ²/(2σ²), which decreases in σ²; an exact δ(ε) should be computed for the
// rational actually sampled (this function's result), not for the double.
// InvalidArgument for NaN, infinite
// or non-positive sigma2; OutOfRange if σ² ≥ 2^62.
StatusOr<Rational> RoundUpSigma2(double sigma2);

class DiscreteGaussianSampler {
 public:
  // Words fetched from the NoiseSource at a time during one Fill call.
  static constexpr size_t kWordBuffer = 64;

  static StatusOr<DiscreteGaussianSampler> Create(Rational sigma2);

  // Fills `out` with independent draws from N_Z(0, σ²). See the file comment
  // for exactness, timing and failure.
  Status Fill(NoiseSource& source, std::span<int64_t> out) const;

  // σ² as given (not reduced).
  Rational sigma2() const { return sigma2_; }
  // t = ⌊σ⌋ + 1, the scale of the discrete Laplace proposal.
  uint64_t laplace_scale() const { return t_; }

 private:
  DiscreteGaussianSampler(Rational sigma2, uint64_t t, Uint128 dt,
                          Uint128 gamma_denominator)
      : sigma2_(sigma2), t_(t), dt_(dt), gamma_denominator_(gamma_denominator) {}

  Rational sigma2_;
  uint64_t t_;
  Uint128 dt_;                 // d·t
  Uint128 gamma_denominator_;  // 2·n·d·t² < 2^127
};

// ln Z(σ²) = ln Σ_y exp(−y²/(2σ²)) in long double, with a bound on its error.
// σ² < 64: direct summation over |y| ≤ T = ⌈40σ⌉ + 1; the omitted tail is at
// most σ·sqrt(2π)·erfc(T/(σ√2)) < Z·1e-340. σ² ≥ 64: the Poisson-summation
// (Jacobi theta) dual, Z = σ·sqrt(2π)·(1 + 2 Σ_{k ≥ 1} exp(−2π²σ²k²)), summed
// for k ≤ 3; the omitted part is below exp(−2π²·64·16) relative. The
// reported bound adds the rounding of the summation (terms × 4 ulp).
struct DiscreteGaussianNormaliser {
  long double log_normaliser = 0;
  long double absolute_error_bound = 0;  // on log_normaliser
  int64_t terms = 0;                     // summands used
  bool dual = false;                     // the theta-dual series was used
};
StatusOr<DiscreteGaussianNormaliser> DiscreteGaussianLogNormaliser(Rational sigma2);

// ln P(X = x) for X ~ N_Z(0, σ²): −x²/(2σ²) − ln Z(σ²). Same error bound as
// the normaliser plus a few ulp of x²/(2σ²).
StatusOr<long double> DiscreteGaussianLogPmf(Rational sigma2, int64_t x);

// δ(ε) of the mechanism x ↦ x + N_Z(0, σ²) for integer sensitivity Δ ≥ 1 (see
// the file comment). Summation over every integer in the loss region from
// its boundary to 40σ past the mode (the omitted mass is below exp(−800) of
// the region's leading term; it is added to error_bound), in long double.
// OutOfRange if that needs more than kMaxSummationTerms terms (σ above about
// 10^5 with small ε, or ε·σ²/Δ that large).
struct DiscreteGaussianDelta {
  long double delta = 0;        // max of the two directions
  long double delta_remove = 0;  // Σ (P − e^ε Q)₊, P = N_Z(0), Q = N_Z(Δ)
  long double delta_add = 0;     // Σ (Q − e^ε P)₊
  long double error_bound = 0;   // absolute, on each direction
  int64_t terms = 0;
};
inline constexpr int64_t kMaxSummationTerms = 20'000'000;
StatusOr<DiscreteGaussianDelta> DiscreteGaussianMechanismDelta(Rational sigma2,
                                                              uint64_t sensitivity,
                                                              double epsilon);

// D_α(N_Z(0, σ²) ‖ N_Z(Δ, σ²)) by direct summation of P(x)^α Q(x)^(1−α) over
// x within 40σ of the tilted mode (1 − α)Δ (log-sum-exp in long double),
// for α ∈ (1, 1024]. Not used for accounting: it exists to check the bound.
StatusOr<long double> DiscreteGaussianRenyiDivergence(Rational sigma2, uint64_t sensitivity,
                                                      double alpha);

// The CKS bound αΔ²/(2σ²) (long double).
long double DiscreteGaussianRdpBound(Rational sigma2, uint64_t sensitivity, double alpha);

namespace internal {

// The sampler's building blocks, exposed for tests. All draw from `words`.
class RandomWords {
 public:
  explicit RandomWords(NoiseSource& source) : source_(source) {}
  ~RandomWords();
  RandomWords(const RandomWords&) = delete;
  RandomWords& operator=(const RandomWords&) = delete;

  // The next whole word.
  uint64_t Next() {
    if (position_ == DiscreteGaussianSampler::kWordBuffer) Refill();
    return buffer_[position_++];
  }

  // The next `count` bits, 1 ≤ count ≤ 64, as the low bits of the result:
  // the unused bits of the last word first (lowest first), then the low
  // bits of the next word. No bit is returned twice, so draws from Bits and
  // Next are independent uniform bits.
  uint64_t Bits(int count) {
    if (count <= pool_bits_) {  // so count ≤ 63: the pool never holds 64
      const uint64_t result = pool_ & (~uint64_t{0} >> (64 - count));
      pool_ >>= count;
      pool_bits_ -= count;
      return result;
    }
    const int from_pool = pool_bits_;
    const int from_word = count - from_pool;  // 1..64
    const uint64_t word = Next();
    const uint64_t result =
        pool_ | ((word & (~uint64_t{0} >> (64 - from_word))) << from_pool);
    pool_ = from_word == 64 ? 0 : word >> from_word;
    pool_bits_ = 64 - from_word;
    return result;
  }

 private:
  void Refill();
  NoiseSource& source_;
  uint64_t buffer_[DiscreteGaussianSampler::kWordBuffer] = {};
  size_t position_ = DiscreteGaussianSampler::kWordBuffer;
  uint64_t pool_ = 0;  // the unused high bits of the last word Bits read
  int pool_bits_ = 0;  // 0..63
};

// Uniform in [0, m), m ≥ 1 (m = 0 is a caller bug and returns 0).
uint64_t UniformBelow(RandomWords& words, uint64_t m);
Uint128 UniformBelow128(RandomWords& words, Uint128 m);

// Bernoulli(exp(−γ)), γ = whole + remainder/denominator, remainder <
// denominator (InvalidArgument otherwise, or for denominator 0). If
// whole_is_lower_bound, γ is only known to be ≥ whole: the result is exact
// unless all `whole` Bernoulli(exp(−1)) trials pass, which returns OutOfRange.
StatusOr<bool> BernoulliExpMinus(RandomWords& words, Uint128 whole,
                                 Uint128 remainder,
                                 Uint128 denominator,
                                 bool whole_is_lower_bound = false);
// Convenience: γ = numerator/denominator.
StatusOr<bool> BernoulliExpMinusRational(RandomWords& words, uint64_t numerator,
                                         uint64_t denominator);

// Discrete Laplace, P(x) ∝ exp(−|x|·s/t), s, t ≥ 1 (CKS Algorithm 2).
StatusOr<int64_t> DiscreteLaplace(RandomWords& words, uint64_t s, uint64_t t);

// ⌊a²/b⌋ and a² mod b for b < 2^127 (exact 256-bit arithmetic). `overflow`
// is set (and quotient saturated to 2^128 − 1) when a²/b ≥ 2^128.
struct SquareDivision {
  Uint128 quotient = 0;
  Uint128 remainder = 0;
  bool overflow = false;
};
SquareDivision DivideSquare(Uint128 a, Uint128 b);

// The two normaliser series, for cross-checking in tests.
long double LogNormaliserDirect(long double sigma2, int64_t truncation);
long double LogNormaliserDual(long double sigma2, int terms);

}  // namespace internal
}  // namespace vipsd::privacy
