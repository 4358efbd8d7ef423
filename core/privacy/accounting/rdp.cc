#include "core/privacy/accounting/rdp.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>

namespace vipsd::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Relative error we allow per floating-point term, applied as a pessimistic
// margin: a few ulps for the arithmetic plus the absolute error of the
// exponent (which is |log term| · ε_machine after exp).
constexpr double kUlpMargin = 8.0 * DBL_EPSILON;

// Series terms whose log is this far below the running total are dropped;
// the remainder is bounded and added as truncation error.
constexpr double kLogTruncation = -40.0;

// log(exp(a) + exp(b)) without overflow.
double LogAdd(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double hi = std::max(a, b);
  const double lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

// Streaming log-sum-exp of non-negative terms: one exp per added term.
// Holds Σ w_i·exp(x_i) as exp(max)·scaled_sum. The sum is compensated
// (Neumaier 1974), so that adding many small terms to a large total does
// not lose them: ten thousand terms summed naively near 1 lose up to 1e-12,
// more than the series' whole margin when A_α − 1 is small.
// SummationErrorLog() bounds what the summation itself still loses.
class LogSumAccumulator {
 public:
  void Add(double log_x, double weight = 1.0) {
    if (log_x == kNegInf || weight == 0.0) return;
    if (log_x > max_) {
      Rescale(log_x);
      Accumulate(weight);
    } else {
      Accumulate(weight * std::exp(log_x - max_));
    }
  }
  // Adds exp(log_x) to the sum and error_weight·exp(log_x) to a second sum
  // sharing the same scale (one exp for both). The error sum is itself a
  // bound with a margin of several ulps per term, so it is not compensated.
  void AddWithError(double log_x, double error_weight) {
    if (log_x == kNegInf) return;
    double x = 1.0;
    if (log_x > max_) {
      Rescale(log_x);
    } else {
      x = std::exp(log_x - max_);
    }
    Accumulate(x);
    scaled_error_ += error_weight * x;
  }
  double Log() const {
    const double total = scaled_sum_ + compensation_;
    return total > 0.0 ? max_ + std::log(total) : kNegInf;
  }
  double LogError() const {
    return scaled_error_ > 0.0 ? max_ + std::log(scaled_error_) : kNegInf;
  }
  // Log of a bound on |computed sum − exact sum of the terms as passed in|:
  // Neumaier's bound 2u·Σ + n·u²·Σ, plus 2u of the running sum for each
  // rescale by a rounded exp.
  double SummationErrorLog() const {
    const double u = DBL_EPSILON / 2;
    return Log() + std::log((4.0 + 2.0 * rescales_ + static_cast<double>(count_) * u) * u);
  }

 private:
  void Rescale(double log_x) {
    const double factor = std::exp(max_ - log_x);
    scaled_sum_ *= factor;
    compensation_ *= factor;
    scaled_error_ *= factor;
    max_ = log_x;
    ++rescales_;
  }
  void Accumulate(double x) {
    const double t = scaled_sum_ + x;
    compensation_ += scaled_sum_ >= x ? (scaled_sum_ - t) + x : (x - t) + scaled_sum_;
    scaled_sum_ = t;
    ++count_;
  }

  double max_ = kNegInf;
  double scaled_sum_ = 0.0;
  double compensation_ = 0.0;
  double scaled_error_ = 0.0;
  int64_t rescales_ = 0;
  int64_t count_ = 0;
};

// log(exp(a) - exp(b)) for a ≥ b.
double LogSub(double a, double b) {
  if (b == kNegInf) return a;
  if (b >= a) return kNegInf;
  return a + std::log1p(-std::exp(b - a));
}

// log(expm1(x)) for x > 0, without overflow for large x.
double LogExpm1(double x) {
  if (x > 40.0) return x;  // log1p(−e^{−x}) < 5e-18: below double resolution of x
  if (x > 1.0) return x + std::log1p(-std::exp(-x));
  return std::log(std::expm1(x));
}

// glibc's lgamma writes the global `signgam`; lgamma_r is the re-entrant form.
double LogAbsGamma(double x, int* sign) { return lgamma_r(x, sign); }

double LogBinomialInteger(double n, double k) {
  int sign = 1;
  return LogAbsGamma(n + 1, &sign) - LogAbsGamma(k + 1, &sign) -
         LogAbsGamma(n - k + 1, &sign);
}

// log Φ(x) = log(erfc(−x/√2)/2), accurate in both tails.
double LogNormalCdf(double x) {
  if (x > -20.0) return std::log(0.5 * std::erfc(-x / std::sqrt(2.0)));
  // Asymptotic expansion of the Mills ratio for the far lower tail, where
  // erfc underflows: Φ(x) = φ(x)/|x| · (1 − 1/x² + 3/x⁴ − 15/x⁶ + …).
  const double x2 = x * x;
  const double series = 1.0 - 1.0 / x2 + 3.0 / (x2 * x2) - 15.0 / (x2 * x2 * x2);
  return -0.5 * x2 - std::log(-x) - 0.5 * std::log(2.0 * M_PI) + std::log(series);
}

// ln(A_α − 1) for integer α ≥ 2 and q < 1, with an error margin added.
double LogAMinusOneInteger(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double inv_two_var = 1.0 / (2.0 * sigma * sigma);
  const auto n = static_cast<int64_t>(alpha);
  LogSumAccumulator sum;  // Σ terms, and Σ terms·(relative error bound)
  // log C(α, k) is updated incrementally (log((α−k+1)/k) per step) and
  // re-anchored to lgamma every kResync terms, which bounds the drift.
  constexpr int64_t kResync = 32;
  double log_binomial = 0.0;
  for (int64_t k = 2; k <= n; ++k) {
    const double kd = static_cast<double>(k);
    if (k % kResync == 2) {
      log_binomial = LogBinomialInteger(alpha, kd);
    } else {
      log_binomial += std::log((alpha - kd + 1.0) / kd);
    }
    const double log_term = log_binomial + (alpha - kd) * log_1mq + kd * log_q +
                            LogExpm1((kd * kd - kd) * inv_two_var);

    // Relative error of this term: rounding of its exponent (absolute error
    // ~ ε·(sum of magnitudes of its parts), times the resync distance for the
    // incremental binomial) plus a few ulps of arithmetic.
    const double magnitude = kResync * (std::abs(log_binomial) + 1.0) +
                             std::abs((alpha - kd) * log_1mq) + std::abs(kd * log_q) +
                             (kd * kd) * inv_two_var + 4.0;
    sum.AddWithError(log_term, kUlpMargin * magnitude);
  }
  return LogAdd(sum.Log(), LogAdd(sum.LogError(), sum.SummationErrorLog()));
}

// log(e^{w²/2}·Φ(w)), the normal CDF with its Gaussian factor divided out;
// increasing in w (its derivative is e^{w²/2}(wΦ(w) + φ(w)) > 0). Sets
// *relative_error to a bound on the relative error of e^{result}.
double LogScaledNormalCdf(double w, double* relative_error) {
  if (w > -20.0) {
    const double log_cdf = std::log(0.5 * std::erfc(-w / std::sqrt(2.0)));
    *relative_error = kUlpMargin * (0.5 * w * w + std::abs(log_cdf) + 4.0);
    return 0.5 * w * w + log_cdf;
  }
  // Mills ratio (Abramowitz & Stegun 26.2.12): e^{w²/2}Φ(w) =
  // (1/(|w|√(2π)))·(1 − 1/w² + 3/w⁴ − 15/w⁶ + R) with |R| ≤ 105/w⁸ (the
  // series envelops its limit).
  const double w2 = w * w;
  const double series = 1.0 - 1.0 / w2 + 3.0 / (w2 * w2) - 15.0 / (w2 * w2 * w2);
  *relative_error = 105.0 / (w2 * w2 * w2 * w2) / series + kUlpMargin * 8.0;
  return -std::log(-w) - 0.5 * std::log(2.0 * M_PI) + std::log(series);
}

// Terms whose magnitude is this far below A_α − 1 end the fractional series
// (e^-25 ≈ 1.4e-11: the truncation then moves ε(α) by at most that fraction,
// and it is added to the bound, never dropped).
constexpr double kLogRelativeTruncation = -25.0;

// ln(A_α) for fractional α > 1 and q < 1 (Mironov et al. 2019, Section 3.3),
// with an error margin added.
//
// A_α = Σ_{i≥0} C(α,i)·(s0_i + s1_i) with, for j = α − i,
//   s0_i = q^i (1−q)^j e^{(i²−i)/(2σ²)} Φ((z0 − i)/σ),
//   s1_i = q^j (1−q)^i e^{(j²−j)/(2σ²)} Φ((j − z0)/σ).
// Because z0 = σ² ln((1−q)/q) + 1/2, the exponents collapse exactly:
//   s0_i = K·M((z0 − i)/σ),  s1_i = K·M((j − z0)/σ),
//   K = (1−q)^α e^{−z0²/(2σ²)},  M(w) = e^{w²/2}Φ(w),
// so |C(α,i)|·(s0_i + s1_i) decreases in i for i > α (|C(α,i+1)/C(α,i)| =
// (i−α)/(i+1) < 1, M increasing, both arguments decreasing) while the sign
// of C(α,i) alternates: after any term i > α + 1 the remainder is smaller
// than that term, which is added as the truncation margin. Each term is
// evaluated in whichever form has no cancellation: the product form while
// Φ's argument is ≥ 0, the K·M form beyond (where e^{(i²−i)/(2σ²)} and Φ
// would cancel).
double LogAFractional(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double inv_two_var = 1.0 / (2.0 * sigma * sigma);
  const double z0 = sigma * sigma * (log_1mq - log_q) + 0.5;
  const double log_k = alpha * log_1mq - z0 * z0 * inv_two_var;
  const double log_k_magnitude = std::abs(alpha * log_1mq) + z0 * z0 * inv_two_var;
  int sign_unused = 1;
  const double log_gamma_alpha_plus_1 = LogAbsGamma(alpha + 1.0, &sign_unused);

  // ln|s| of one side, with the relative error bound of e^{ln|s|} (without
  // the binomial's, which the caller adds). `k` is the power of q of the
  // product form (i for s0, j for s1), `w` Φ's argument.
  auto log_side = [&](double k, double w, double* relative_error) {
    double log_m_error = 0.0;
    if (w >= 0.0) {
      const double log_cdf = LogNormalCdf(w);
      const double m = alpha - k;
      *relative_error = kUlpMargin * (std::abs(k * log_q) + std::abs(m * log_1mq) +
                                      (k * k + std::abs(k)) * inv_two_var +
                                      std::abs(log_cdf) + 8.0);
      return k * log_q + m * log_1mq + (k * k - k) * inv_two_var + log_cdf;
    }
    const double log_m = LogScaledNormalCdf(w, &log_m_error);
    *relative_error = log_m_error + kUlpMargin * (log_k_magnitude + std::abs(log_m) + 8.0);
    return log_k + log_m;
  };

  // log|C(α, i)| is updated incrementally (log(|α−i+1|/i) per step) and
  // re-anchored to lgamma every kResync terms, which bounds the drift.
  constexpr int64_t kResync = 32;
  double log_binomial = 0.0;  // i = 0: C(α, 0) = 1, exactly
  double binomial_error = 0.0;  // bound on the absolute error of log_binomial
  bool positive = true;
  LogSumAccumulator positive_sum;
  LogSumAccumulator negative_sum;
  LogSumAccumulator abs_sum;  // Σ|terms|, for the rounding of the subtraction
  LogSumAccumulator error;    // Σ|term|·(relative error bound of term)
  double log_truncation = kNegInf;
  for (int64_t i = 0;; ++i) {
    const double id = static_cast<double>(i);
    const double jd = alpha - id;
    if (i > 0) {
      if (i % kResync == 0) {
        int gamma_sign = 1;
        const double log_gamma_i = LogAbsGamma(id + 1.0, &sign_unused);
        const double log_gamma_j = LogAbsGamma(jd + 1.0, &gamma_sign);
        log_binomial = log_gamma_alpha_plus_1 - log_gamma_i - log_gamma_j;
        positive = gamma_sign > 0;  // C(α, i) has the sign of Γ(α − i + 1)
        // lgamma is accurate to a few ulps of its value.
        binomial_error = kUlpMargin * (std::abs(log_gamma_alpha_plus_1) +
                                       std::abs(log_gamma_i) + std::abs(log_gamma_j) + 4.0);
      } else {
        const double log_ratio = std::log(std::abs(jd + 1.0) / id);
        log_binomial += log_ratio;
        if (jd + 1.0 < 0.0) positive = !positive;
        // One rounding of the sum, of the log and of the quotient.
        binomial_error += kUlpMargin * (std::abs(log_binomial) + std::abs(log_ratio) + 2.0);
      }
    }
    double error0 = 0.0, error1 = 0.0;
    const double log_s0 = log_binomial + log_side(id, (z0 - id) / sigma, &error0);
    const double log_s1 = log_binomial + log_side(jd, (jd - z0) / sigma, &error1);
    const double log_pair = LogAdd(log_s0, log_s1);
    (positive ? positive_sum : negative_sum).Add(log_pair);
    abs_sum.Add(log_pair);
    error.Add(log_s0, binomial_error + error0);
    error.Add(log_s1, binomial_error + error1);
    if (id > alpha + 1.0) {
      // Every later term is smaller than this one and the signs alternate.
      const double log_abs_total = abs_sum.Log();
      bool done = log_pair - log_abs_total < kLogTruncation && log_pair < kLogTruncation;
      if (!done && log_pair - log_abs_total < kLogRelativeTruncation) {
        // A_α − 1 ≥ (partial sum) − 1 − (this term).
        const double log_partial = LogSub(positive_sum.Log(), negative_sum.Log());
        const double log_excess_lower = LogSub(log_partial, LogAdd(0.0, log_pair));
        done = log_excess_lower != kNegInf && log_pair < log_excess_lower + kLogRelativeTruncation;
      }
      if (done || i > 10'000'000) {  // the cap is unreachable for valid inputs
        log_truncation = log_pair;
        break;
      }
    }
  }
  const double log_a = LogSub(positive_sum.Log(), negative_sum.Log());
  // Margin: per-term rounding, the summation of the two signed parts and
  // their final subtraction, and the truncated tail (smaller than the last
  // term).
  const double log_summation =
      LogAdd(positive_sum.SummationErrorLog(), negative_sum.SummationErrorLog());
  const double log_error =
      LogAdd(LogAdd(error.Log(), abs_sum.Log() + std::log(4.0 * DBL_EPSILON)),
             LogAdd(log_summation, log_truncation));
  return LogAdd(log_a, log_error);
}

bool IsInteger(double x) { return std::floor(x) == x; }

Status ValidateStep(double sampling_rate, double noise_multiplier) {
  if (!(sampling_rate > 0.0 && sampling_rate <= 1.0)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1]");
  }
  if (!(noise_multiplier > 0.0) || !std::isfinite(noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and > 0");
  }
  return Status::Ok();
}

Status ValidateCurve(std::span<const double> orders, std::span<const double> rdp) {
  if (orders.empty()) return InvalidArgumentError("the order list is empty");
  if (orders.size() != rdp.size()) {
    return InvalidArgumentError("orders and rdp have different lengths");
  }
  for (size_t i = 0; i < orders.size(); ++i) {
    if (!(orders[i] > 1.0) || !std::isfinite(orders[i])) {
      return InvalidArgumentError("every Rényi order must be finite and > 1");
    }
    if (!(rdp[i] >= 0.0)) {  // NaN fails too; +∞ is allowed
      return InvalidArgumentError("RDP values must be >= 0");
    }
  }
  return Status::Ok();
}

}  // namespace

namespace {

std::vector<double> SortedUnique(std::vector<double> grid) {
  std::sort(grid.begin(), grid.end());
  grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
  return grid;
}

// The top of every grid: about ×1.25 per order, integers, up to 2^18.
void AppendLargeOrders(std::vector<double>* grid, double below) {
  for (double a = 320; a < below; a = std::round(a * 1.25)) grid->push_back(a);
  grid->push_back(262144);
}

std::vector<double> GridV1() {
  std::vector<double> grid;
  for (int i = 1; i <= 19; ++i) grid.push_back(1.0 + 0.05 * i);
  for (int i = 0; i <= 32; ++i) grid.push_back(2.0 + 0.25 * i);
  for (int a = 11; a <= 64; ++a) grid.push_back(a);
  for (int a = 72; a <= 256; a += 8) grid.push_back(a);
  AppendLargeOrders(&grid, 262144.5);
  return SortedUnique(std::move(grid));
}

std::vector<double> GridV2() {
  std::vector<double> grid;
  for (int i = 1; i <= 19; ++i) grid.push_back(1.0 + 0.05 * i);
  for (int i = 0; i <= 248; ++i) grid.push_back(2.0 + 0.25 * i);
  for (int a = 72; a <= 256; a += 8) grid.push_back(a);
  AppendLargeOrders(&grid, 262144.5);
  return SortedUnique(std::move(grid));
}

// Spacing follows the width of the interval of orders whose ε is within
// 0.1 % of the optimum (docs/privacy_accounting.md §3). Only +, ×, ÷ of
// small integers, so every build computes the same doubles.
std::vector<double> GridV3() {
  std::vector<double> grid;
  // (1, 2]: 1 + (k/46)², spacing ≈ 0.043·sqrt(α − 1) (1.0043 … 2).
  for (int k = 3; k <= 46; ++k) grid.push_back(1.0 + (k * k) / 2116.0);
  // (2, 4.5]: step 0.05.
  for (int i = 41; i <= 90; ++i) grid.push_back(i / 20.0);
  // (4.5, 10]: 1 + (k/70)², spacing ≈ 0.029·sqrt(α − 1): σ ≤ 0.8 with
  // q ≥ 0.001 has its optimum here, next to the order where RDP explodes.
  for (int k = 131; k <= 210; ++k) grid.push_back(1.0 + (k * k) / 4900.0);
  // (10, 64]: ×56/55 per order (1.8 %).
  double a = 10;
  for (int k = 1; k <= 102; ++k) {
    a = a * 56 / 55;
    grid.push_back(a);
  }
  grid.push_back(64);
  // (64, 256]: ×1.1 per order.
  a = 64;
  for (int k = 1; k <= 14; ++k) {
    a = a * 11 / 10;
    grid.push_back(a);
  }
  grid.push_back(256);
  // As before, without 258448 (1.4 % below 262144 and, after it, the
  // costliest order to evaluate).
  AppendLargeOrders(&grid, 262144 / 1.25);
  return SortedUnique(std::move(grid));
}

}  // namespace

const std::vector<double>& RdpOrders(RdpOrderGrid grid) {
  static const std::vector<double> v1 = GridV1();
  static const std::vector<double> v2 = GridV2();
  static const std::vector<double> v3 = GridV3();
  switch (grid) {
    case RdpOrderGrid::kV1: return v1;
    case RdpOrderGrid::kV2: return v2;
    case RdpOrderGrid::kV3: return v3;
  }
  return v3;
}

const std::vector<double>& DefaultRdpOrders() { return RdpOrders(kCurrentRdpOrderGrid); }

std::optional<RdpOrderGrid> RdpOrderGridWithCount(size_t count) {
  for (RdpOrderGrid grid : {RdpOrderGrid::kV3, RdpOrderGrid::kV2, RdpOrderGrid::kV1}) {
    if (RdpOrders(grid).size() == count) return grid;
  }
  return std::nullopt;
}

StatusOr<double> SampledGaussianRdp(double sampling_rate, double noise_multiplier,
                                    double order) {
  VIPSD_RETURN_IF_ERROR(ValidateStep(sampling_rate, noise_multiplier));
  if (!(order > 1.0) || !std::isfinite(order)) {
    return InvalidArgumentError("Rényi order must be finite and > 1");
  }
  const double variance = noise_multiplier * noise_multiplier;
  if (sampling_rate == 1.0) return order / (2.0 * variance);

  double log_a;
  if (IsInteger(order)) {
    // A_α = 1 + (A_α − 1) with A_α − 1 ≥ 0 computed to full relative precision.
    const double log_excess = LogAMinusOneInteger(sampling_rate, noise_multiplier, order);
    if (log_excess > 700.0) {
      log_a = LogAdd(0.0, log_excess);
    } else {
      log_a = std::log1p(std::exp(log_excess));
    }
  } else {
    log_a = LogAFractional(sampling_rate, noise_multiplier, order);
    // The two-series form sums terms near 1 − αq and αq that cancel, so when
    // A_α − 1 is tiny (small q, large σ) its error margin dominates. Rényi
    // divergence is non-decreasing in the order, so the precise integer
    // series at ⌈α⌉ is also a valid bound: ln A_α/(α−1) ≤ ln A_⌈α⌉/(⌈α⌉−1).
    const double ceiling = std::ceil(order);
    const double log_excess = LogAMinusOneInteger(sampling_rate, noise_multiplier, ceiling);
    const double log_a_ceiling =
        log_excess > 700.0 ? LogAdd(0.0, log_excess) : std::log1p(std::exp(log_excess));
    log_a = std::min(log_a, log_a_ceiling * (order - 1.0) / (ceiling - 1.0));
  }
  if (std::isnan(log_a)) {
    return InternalError("RDP series produced NaN");
  }
  // A_α ≥ 1 always (Jensen); a tiny negative log from rounding is clamped.
  return std::max(0.0, log_a) / (order - 1.0);
}

StatusOr<std::vector<double>> SampledGaussianRdpCurve(double sampling_rate,
                                                      double noise_multiplier,
                                                      std::span<const double> orders) {
  std::vector<double> curve;
  curve.reserve(orders.size());
  for (double order : orders) {
    VIPSD_ASSIGN_OR_RETURN(double value,
                           SampledGaussianRdp(sampling_rate, noise_multiplier, order));
    curve.push_back(value);
  }
  // Rényi divergence never decreases with the order (van Erven & Harremoës
  // 2014, Theorem 3), so a bound at a larger order bounds every smaller one:
  // where the error margins dominate (A_α − 1 below ~1e-13) this keeps the
  // curve monotone and takes the tighter bound.
  if (std::is_sorted(orders.begin(), orders.end())) {
    for (size_t i = curve.size(); i-- > 1;) curve[i - 1] = std::min(curve[i - 1], curve[i]);
  }
  return curve;
}

const char* RdpConversionName(RdpConversion conversion) {
  switch (conversion) {
    case RdpConversion::kImproved: return "improved";
    case RdpConversion::kClassic: return "classic";
  }
  return "unknown";
}

double ConversionImprovement(double order) {
  return std::log(order) / (order - 1.0) - std::log1p(-1.0 / order);
}

namespace {

// ε from the curve with order i converted at δ·exp(−extra_log_inv_delta(i)).
template <typename ExtraLogInvDelta>
StatusOr<EpsilonAtOrder> ConvertCurve(std::span<const double> orders,
                                      std::span<const double> rdp, double delta,
                                      RdpConversion conversion,
                                      const ExtraLogInvDelta& extra_log_inv_delta) {
  VIPSD_RETURN_IF_ERROR(ValidateCurve(orders, rdp));
  if (!(delta > 0.0 && delta < 1.0)) {
    return InvalidArgumentError("delta must be in (0, 1)");
  }
  const double log_inv_delta = -std::log(delta);
  EpsilonAtOrder best{kInf, orders.front()};
  for (size_t i = 0; i < orders.size(); ++i) {
    const double alpha = orders[i];
    double epsilon = rdp[i] + (log_inv_delta + extra_log_inv_delta(i)) / (alpha - 1.0);
    if (conversion == RdpConversion::kImproved) {
      epsilon -= ConversionImprovement(alpha);
    }
    if (epsilon < best.epsilon) best = {epsilon, alpha};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

}  // namespace

StatusOr<EpsilonAtOrder> EpsilonFromRdp(std::span<const double> orders,
                                        std::span<const double> rdp, double delta,
                                        RdpConversion conversion) {
  return ConvertCurve(orders, rdp, delta, conversion, [](size_t) { return 0.0; });
}

StatusOr<EpsilonAtOrder> EpsilonFromRdpFilter(std::span<const double> orders,
                                              std::span<const double> rdp, double delta,
                                              std::span<const double> weights,
                                              RdpConversion conversion) {
  if (weights.empty()) {
    const double log_count = std::log(static_cast<double>(orders.size()));
    return ConvertCurve(orders, rdp, delta, conversion, [&](size_t) { return log_count; });
  }
  if (weights.size() != orders.size()) {
    return InvalidArgumentError("the filter has " + std::to_string(weights.size()) +
                                " weights for " + std::to_string(orders.size()) + " orders");
  }
  for (double weight : weights) {
    if (!(weight > 0.0 && weight <= 1.0)) {
      return InvalidArgumentError("every filter weight must be in (0, 1]");
    }
  }
  return ConvertCurve(orders, rdp, delta, conversion,
                      [&](size_t i) { return -std::log(weights[i]); });
}

StatusOr<DeltaAtOrder> DeltaFromRdp(std::span<const double> orders,
                                    std::span<const double> rdp, double epsilon,
                                    RdpConversion conversion) {
  VIPSD_RETURN_IF_ERROR(ValidateCurve(orders, rdp));
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon)) {
    return InvalidArgumentError("epsilon must be finite and >= 0");
  }
  DeltaAtOrder best{1.0, orders.front()};
  double best_log_delta = 0.0;
  for (size_t i = 0; i < orders.size(); ++i) {
    const double alpha = orders[i];
    if (std::isinf(rdp[i])) continue;
    double log_delta;
    if (conversion == RdpConversion::kClassic) {
      log_delta = (alpha - 1.0) * (rdp[i] - epsilon);
    } else {
      // Balle et al. 2020, Theorem 21, solved for δ.
      log_delta = (alpha - 1.0) * (rdp[i] - epsilon + std::log1p(-1.0 / alpha)) -
                  std::log(alpha);
      // δ ≤ sqrt(1 − e^{−KL}) and KL ≤ ε(α) for α > 1.
      const double pinsker = rdp[i] == 0.0 ? kNegInf : 0.5 * std::log(-std::expm1(-rdp[i]));
      log_delta = std::min(log_delta, pinsker);
    }
    if (log_delta < best_log_delta) {
      best_log_delta = log_delta;
      best.order = alpha;
    }
  }
  best.delta = std::min(1.0, std::exp(best_log_delta));
  return best;
}

}  // namespace vipsd::privacy
