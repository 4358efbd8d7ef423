#include "core/privacy/accounting/pld_accountant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <cstdint>
#include <exception>
#include <limits>
#include <new>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <unsupported/Eigen/FFT>

namespace vipsd::privacy {
namespace {

// Per-step arithmetic is done in long double (64-bit mantissa on x86-64).
// Every error bound below is written in terms of the unit roundoff of the
// type actually used, so the bounds stay valid where long double is double.
using Real = long double;

constexpr Real kRealRoundoff = std::numeric_limits<Real>::epsilon() / 2;
constexpr double kDoubleRoundoff = std::numeric_limits<double>::epsilon() / 2;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Real kRealInf = std::numeric_limits<Real>::infinity();
constexpr Real kPi = 3.141592653589793238462643383279502884L;
constexpr Real kSqrt2 = 1.414213562373095048801688724209698079L;

// Largest composed grid (FFT length) and per-step grid: 2^21 points keeps the
// working set near 230 MB.
constexpr int64_t kMaxGridPoints = int64_t{1} << 21;
constexpr int64_t kMaxTotalSteps = int64_t{1} << 40;
// Composed grids up to this size are computed without any tail window.
constexpr int64_t kSmallFullSupport = int64_t{1} << 16;

// Assumed worst-case error of libm's erfcl/expl/logl/sinl, in ulps. glibc
// documents at most a few; the margin costs nothing measurable.
constexpr Real kLibmUlps = 32;
// Normwise error of one FFT, per radix-2 level, in unit roundoffs (Higham,
// "Accuracy and Stability of Numerical Algorithms", Thm 24.2, gives about
// 5 + twiddle error per level; Eigen's twiddles are within a few ulps).
constexpr double kFftUlpsPerLevel = 32;
// Per-step bins below this mass are moved to +∞ (upper bound) or dropped
// (lower bound); this keeps every logarithm of a mass above −700.
constexpr Real kNegligibleMass = 1e-300L;
// Work budget (terms) for recomputing the largest spectral coefficients.
constexpr int64_t kAccurateTermBudget = 2'000'000;
constexpr int64_t kMaxAccurateCoefficients = 256;
constexpr int64_t kMinAccurateCoefficients = 4;
// The largest λΔ used by the Chernoff bound (keeps block recurrences finite).
constexpr Real kMaxLambdaTimesSpacing = 30;

enum class Mode { kUpper, kLower };

// Composed grid indices can exceed 2^63 before the window is chosen.
__extension__ typedef __int128 Int128;

// ---------------------------------------------------------------------------
// Small numerical helpers.

// Narrows a bound to double, rounding towards +∞ (or −∞).
double RoundUpToDouble(Real x) {
  if (std::isnan(x)) return kInf;
  double d = static_cast<double>(x);
  if (static_cast<Real>(d) < x) d = std::nextafter(d, kInf);
  return d;
}

// Compensated (Kahan–Babuška) summation.
class KahanSum {
 public:
  void Add(Real x) {
    const Real t = sum_ + x;
    if (fabsl(sum_) >= fabsl(x)) {
      compensation_ += (sum_ - t) + x;
    } else {
      compensation_ += (x - t) + sum_;
    }
    sum_ = t;
  }
  Real Value() const { return sum_ + compensation_; }

 private:
  Real sum_ = 0;
  Real compensation_ = 0;
};

// Φ(z) and 1 − Φ(z); the smaller of the two comes straight from erfc and has
// full relative accuracy.
struct NormalTails {
  Real lower = 0;
  Real upper = 1;
};

NormalTails TailsAt(Real z) {
  if (z == -kRealInf) return {0, 1};
  if (z == kRealInf) return {1, 0};
  const Real small = erfcl(fabsl(z) / kSqrt2) / 2;
  return z < 0 ? NormalTails{small, 1 - small} : NormalTails{1 - small, small};
}

struct Mass {
  Real value = 0;
  Real error = 0;  // bound on |computed − exact|
};

// Standard-normal mass between two points (left < right) from their tails,
// subtracting the small tails so that nothing cancels catastrophically.
Mass IntervalMass(const NormalTails& left, const NormalTails& right) {
  const Real u = kRealRoundoff;
  Mass mass;
  if (right.lower <= 0.5L) {  // both points at or below 0
    mass.value = right.lower - left.lower;
    mass.error = kLibmUlps * u * (right.lower + left.lower);
  } else if (left.upper <= 0.5L) {  // both at or above 0
    mass.value = left.upper - right.upper;
    mass.error = kLibmUlps * u * (left.upper + right.upper);
  } else {
    mass.value = 1 - left.lower - right.upper;
    mass.error = kLibmUlps * u * (left.lower + right.upper) + 3 * u;
  }
  mass.error += u * fabsl(mass.value);
  mass.value = std::max<Real>(mass.value, 0);
  return mass;
}

// x·e^g without overflow when only the product is representable.
Real ScaleByExp(Real x, Real g, Real exp_g) {
  if (x == 0) return 0;
  if (std::isfinite(exp_g) && exp_g > 0) return x * exp_g;
  return expl(logl(x) + g);
}

// Minimises f over [a, b] by golden-section search; f need only be
// quasi-convex for the optimum, and any returned point is usable.
template <typename F>
std::pair<Real, Real> GoldenMinimize(F f, Real a, Real b, int iterations) {
  const Real ratio = (sqrtl(5.0L) - 1) / 2;
  Real x1 = b - ratio * (b - a);
  Real x2 = a + ratio * (b - a);
  Real f1 = f(x1);
  Real f2 = f(x2);
  for (int i = 0; i < iterations; ++i) {
    if (f1 <= f2) {
      b = x2;
      x2 = x1;
      f2 = f1;
      x1 = b - ratio * (b - a);
      f1 = f(x1);
    } else {
      a = x1;
      x1 = x2;
      f1 = f2;
      x2 = a + ratio * (b - a);
      f2 = f(x2);
    }
  }
  return f1 <= f2 ? std::make_pair(x1, f1) : std::make_pair(x2, f2);
}

// ---------------------------------------------------------------------------
// One dominating pair of one step.

struct PairModel {
  bool remove = true;  // remove: P = M, Q = μ0; add: P = μ0, Q = M
  Real sampling_rate = 1;
  Real sigma = 1;
  Real p_weight[2] = {0, 1};  // weights of N(0, σ²) and N(1, σ²) in P
  Real q_weight[2] = {1, 0};  // ... and in Q
};

PairModel MakePair(bool remove, double sampling_rate, double noise_multiplier) {
  PairModel pair;
  pair.remove = remove;
  pair.sampling_rate = sampling_rate;
  pair.sigma = noise_multiplier;
  const Real q = sampling_rate;
  const Real mixture[2] = {1 - q, q};
  const Real base[2] = {1, 0};
  for (int c = 0; c < 2; ++c) {
    pair.p_weight[c] = remove ? mixture[c] : base[c];
    pair.q_weight[c] = remove ? base[c] : mixture[c];
  }
  return pair;
}

// r(x) = ln(M/μ0)(x) = ln(1 − q + q·e^t), t = (2x − 1)/(2σ²); increasing in x.
Real LogMixtureRatio(const PairModel& pair, Real x) {
  const Real t = (2 * x - 1) / (2 * pair.sigma * pair.sigma);
  const Real q = pair.sampling_rate;
  if (q == 1) return t;
  if (t > 40) return logl(q) + t + log1pl((1 - q) / q * expl(-t));
  return log1pl(q * expm1l(t));
}

// Privacy loss ln(dP/dQ)(x): increasing in x for remove, decreasing for add.
Real LossAt(const PairModel& pair, Real x) {
  const Real r = LogMixtureRatio(pair, x);
  return pair.remove ? r : -r;
}

// Bound on the error of LossAt.
Real LossError(const PairModel& pair, Real x, Real loss) {
  const Real t = (2 * x - 1) / (2 * pair.sigma * pair.sigma);
  return kLibmUlps * kRealRoundoff * (fabsl(loss) + fabsl(t) + 2);
}

struct Bracket {
  Real lo = 0;
  Real hi = 0;
};

// An interval certain to contain the x with ln(M/μ0)(x) = r. lo may be −∞
// (when r is within rounding of ln(1 − q), below which no x exists). Only
// the end selected by `want_low` is guaranteed to be computed.
Bracket XAtLogRatio(const PairModel& pair, Real r, bool want_low) {
  const Real u = kRealRoundoff;
  const Real s2 = pair.sigma * pair.sigma;
  const Real q = pair.sampling_rate;
  if (q == 1) {
    const Real x = 0.5L + s2 * r;
    const Real e = 8 * u * (fabsl(x) + s2 * fabsl(r) + 1);
    return {x - e, x + e};
  }
  if (r > 40) {
    // e^r − 1 + q = e^r·(1 − (1 − q)e^{−r}).
    const Real log_ratio = r + log1pl(-(1 - q) * expl(-r)) - logl(q);
    const Real x = 0.5L + s2 * log_ratio;
    const Real e = kLibmUlps * u * (s2 * (fabsl(r) + fabsl(logl(q)) + 2) + fabsl(x) + 1);
    return {x - e, x + e};
  }
  const Real e1 = expm1l(r);
  const Real t = e1 + q;
  const Real et = kLibmUlps * u * (fabsl(e1) + q);
  if (t + et <= 0) return {-kRealInf, -kRealInf};
  // Only the end the caller needs is computed (the other is left infinite).
  Bracket bracket{-kRealInf, kRealInf};
  if (!want_low) {
    const Real log_ratio = logl((t + et) / q);
    const Real x = 0.5L + s2 * log_ratio;
    bracket.hi = x + kLibmUlps * u * (s2 * (fabsl(log_ratio) + 2) + fabsl(x) + 1);
  } else if (t - et > 0) {
    const Real log_ratio = logl((t - et) / q);
    const Real x = 0.5L + s2 * log_ratio;
    bracket.lo = x - kLibmUlps * u * (s2 * (fabsl(log_ratio) + 2) + fabsl(x) + 1);
  }
  return bracket;
}

Real PLowerTail(const PairModel& pair, Real x) {
  return pair.p_weight[0] * TailsAt(x / pair.sigma).lower +
         pair.p_weight[1] * TailsAt((x - 1) / pair.sigma).lower;
}

Real PUpperTail(const PairModel& pair, Real x) {
  return pair.p_weight[0] * TailsAt(x / pair.sigma).upper +
         pair.p_weight[1] * TailsAt((x - 1) / pair.sigma).upper;
}

// The per-step range: outputs x ∈ (x_low, x_high] carry all but 2·tail_mass
// of P; `low`/`high` are the losses at the low-loss and high-loss ends.
struct StepRange {
  Real x_low = 0;
  Real x_high = 0;
  Real low = 0;
  Real high = 0;
  Real low_error = 0;  // bound on the error of `low`
};

StepRange FindStepRange(const PairModel& pair, Real tail_mass) {
  StepRange range;
  // Largest x with P(X ≤ x) ≤ tail_mass, by bisection (Φ(−40) < 1e-349).
  Real a = -1 - 40 * pair.sigma;
  Real b = 1;
  for (int i = 0; i < 200 && b - a > 1e-12L * (fabsl(a) + fabsl(b)); ++i) {
    const Real mid = (a + b) / 2;
    (PLowerTail(pair, mid) <= tail_mass ? a : b) = mid;
  }
  range.x_low = a;
  a = 0;
  b = 1 + 40 * pair.sigma;
  for (int i = 0; i < 200 && b - a > 1e-12L * (fabsl(a) + fabsl(b)); ++i) {
    const Real mid = (a + b) / 2;
    (PUpperTail(pair, mid) <= tail_mass ? b : a) = mid;
  }
  range.x_high = b;
  const Real x_at_low_loss = pair.remove ? range.x_low : range.x_high;
  const Real x_at_high_loss = pair.remove ? range.x_high : range.x_low;
  range.low = LossAt(pair, x_at_low_loss);
  range.high = LossAt(pair, x_at_high_loss);
  range.low_error = LossError(pair, x_at_low_loss, range.low);
  return range;
}

// ---------------------------------------------------------------------------
// The discretised privacy-loss distribution of one step.

struct StepPmf {
  int64_t first = 0;        // grid index of mass[0]; mass[i] sits at (first + i)·Δ
  std::vector<Real> mass;   // P-mass per grid point
  Real infinity_mass = 0;   // P-mass at +∞
  // η: bound on |Σ g·(computed − exact)| over non-decreasing g with values in
  // [0, 1] and increments ≤ 1 − e^{−Δ} per grid step (see ComposeDirection).
  Real error = 0;
  // Derived quantities.
  Real total = 0;           // Σ mass (compensated)
  Real mean = 0;            // mean position (index − first), over mass
  Real variance = 0;        // variance of the position
  int64_t center = 0;       // round(mean)
  std::vector<Real> log_mass;        // ln mass (−∞ for 0)
  std::vector<Real> block_max_log;   // max of log_mass per block of kMgfBlock
};

constexpr int64_t kMgfBlock = 32;

void FinishStepPmf(StepPmf& pmf, Mode mode) {
  // Bins too small to matter go to +∞ (upper) or are dropped (lower); both
  // move mass in the safe direction.
  for (Real& m : pmf.mass) {
    if (m > 0 && m < kNegligibleMass) {
      if (mode == Mode::kUpper) pmf.infinity_mass += m;
      m = 0;
    }
  }
  // Trim empty ends.
  size_t begin = 0;
  while (begin < pmf.mass.size() && pmf.mass[begin] == 0) ++begin;
  size_t end = pmf.mass.size();
  while (end > begin && pmf.mass[end - 1] == 0) --end;
  if (begin == end) {
    pmf.mass.assign(1, 0);
    begin = 0;
  } else {
    pmf.mass.erase(pmf.mass.begin() + static_cast<std::ptrdiff_t>(end), pmf.mass.end());
    pmf.mass.erase(pmf.mass.begin(), pmf.mass.begin() + static_cast<std::ptrdiff_t>(begin));
  }
  pmf.first += static_cast<int64_t>(begin);

  KahanSum total;
  KahanSum first_moment;
  for (size_t i = 0; i < pmf.mass.size(); ++i) {
    total.Add(pmf.mass[i]);
    first_moment.Add(pmf.mass[i] * static_cast<Real>(i));
  }
  pmf.total = total.Value();
  pmf.mean = pmf.total > 0 ? first_moment.Value() / pmf.total : 0;
  KahanSum second_moment;
  for (size_t i = 0; i < pmf.mass.size(); ++i) {
    const Real d = static_cast<Real>(i) - pmf.mean;
    second_moment.Add(pmf.mass[i] * d * d);
  }
  pmf.variance = pmf.total > 0 ? second_moment.Value() / pmf.total : 0;
  pmf.center = static_cast<int64_t>(llroundl(pmf.mean));
  pmf.log_mass.resize(pmf.mass.size());
  pmf.block_max_log.assign((pmf.mass.size() + kMgfBlock - 1) / kMgfBlock, -kRealInf);
  for (size_t i = 0; i < pmf.mass.size(); ++i) {
    pmf.log_mass[i] = pmf.mass[i] > 0 ? logl(pmf.mass[i]) : -kRealInf;
    Real& block_max = pmf.block_max_log[i / kMgfBlock];
    block_max = std::max(block_max, pmf.log_mass[i]);
  }
  // Each bin received at most three roundings when cells were added to it.
  pmf.error += 3 * kRealRoundoff * pmf.total;
}

// Discretises one step of `pair` on the grid kΔ (Δ = spacing).
//
// Cell k is the set of outputs whose loss lies in [kΔ, (k+1)Δ]. Its P-mass p
// and Q-mass Q are Gaussian CDF differences. Upper bound: connect-the-dots
// puts w = (p − Q·e^{kΔ})/(1 − e^{−Δ}) at (k+1)Δ and p − w at kΔ (both
// masses preserved); round-up puts p at (k+1)Δ. Lower bound: p at kΔ.
StepPmf BuildStepPmf(const PairModel& pair, const StepRange& range, Real spacing, Mode mode,
                     PldDiscretization method) {
  const Real u = kRealRoundoff;
  StepPmf pmf;
  // One spare cell at each end, so that rounding in range.low/high cannot put
  // an output in a cell whose bottom is above its loss.
  const int64_t k_first =
      static_cast<int64_t>(floorl((range.low - range.low_error) / spacing)) - 1;
  const int64_t k_last = std::max(static_cast<int64_t>(ceill(range.high / spacing)) + 1, k_first + 4);
  pmf.first = k_first;
  pmf.mass.assign(static_cast<size_t>(k_last - k_first + 1), 0);
  const bool increasing = pair.remove;
  const Real x_low_loss_end = increasing ? range.x_low : range.x_high;
  const Real x_high_loss_end = increasing ? range.x_high : range.x_low;
  // Boundaries are moved, by their error bound, so that every output put in
  // a cell really has a loss ≤ the cell's top (upper bound) or ≥ its bottom
  // (lower bound).
  const bool take_lower_x = (mode == Mode::kUpper) == increasing;
  const Real one_minus_e_minus_spacing = -expm1l(-spacing);

  struct BoundaryTails {
    NormalTails component[2];
  };
  auto tails_at = [&](Real x) {
    BoundaryTails tails;
    for (int c = 0; c < 2; ++c) tails.component[c] = TailsAt((x - c) / pair.sigma);
    return tails;
  };

  Real previous_x = x_low_loss_end;
  BoundaryTails previous = tails_at(previous_x);

  // Low-loss tail: outputs beyond x_low_loss_end, losses ≤ range.low.
  {
    Mass below;
    for (int c = 0; c < 2; ++c) {
      const Real tail = increasing ? previous.component[c].lower : previous.component[c].upper;
      below.value += pair.p_weight[c] * tail;
      below.error += pair.p_weight[c] * (kLibmUlps + 2) * u * tail;
    }
    if (mode == Mode::kUpper) {
      const int64_t index = std::clamp<int64_t>(
          static_cast<int64_t>(ceill((range.low + range.low_error) / spacing)), k_first, k_last);
      pmf.mass[static_cast<size_t>(index - k_first)] += below.value;
      pmf.error += below.error;
    }
  }

  for (int64_t k = k_first; k < k_last; ++k) {
    // Upper boundary of cell k: the output whose loss is (k+1)Δ.
    Real x;
    if (k + 1 == k_last) {
      x = x_high_loss_end;
    } else {
      const Real grid_loss = static_cast<Real>(k + 1) * spacing;
      const Bracket bracket = XAtLogRatio(pair, increasing ? grid_loss : -grid_loss, take_lower_x);
      x = take_lower_x ? bracket.lo : bracket.hi;
      // Keep the boundaries inside the range and monotone.
      x = std::clamp(x, range.x_low, range.x_high);
      x = increasing ? std::max(x, previous_x) : std::min(x, previous_x);
    }
    const BoundaryTails current = tails_at(x);
    Mass p_mass;
    Mass q_mass;
    for (int c = 0; c < 2; ++c) {
      const Mass m = increasing ? IntervalMass(previous.component[c], current.component[c])
                                : IntervalMass(current.component[c], previous.component[c]);
      p_mass.value += pair.p_weight[c] * m.value;
      p_mass.error += pair.p_weight[c] * m.error;
      q_mass.value += pair.q_weight[c] * m.value;
      q_mass.error += pair.q_weight[c] * m.error;
    }
    p_mass.error += 2 * u * p_mass.value;
    q_mass.error += 2 * u * q_mass.value;
    const size_t low_bin = static_cast<size_t>(k - k_first);
    if (mode == Mode::kLower) {
      pmf.mass[low_bin] += p_mass.value;
      pmf.error += p_mass.error;
    } else if (method == PldDiscretization::kRoundUp) {
      pmf.mass[low_bin + 1] += p_mass.value;
      pmf.error += p_mass.error;
    } else {
      const Real grid_loss = static_cast<Real>(k) * spacing;
      const Real exp_g = fabsl(grid_loss) < 11000 ? expl(grid_loss) : kRealInf;
      const Real scaled_q = ScaleByExp(q_mass.value, grid_loss, exp_g);
      const Real scaled_q_error = ScaleByExp(q_mass.error, grid_loss, exp_g);
      Real upper_share = (p_mass.value - scaled_q) / one_minus_e_minus_spacing;
      upper_share = std::clamp<Real>(upper_share, 0, p_mass.value);
      pmf.mass[low_bin] += p_mass.value - upper_share;
      pmf.mass[low_bin + 1] += upper_share;
      // Moving mass m by one grid step changes any admissible functional by
      // at most m·(1 − e^{−Δ}), which cancels the division above.
      pmf.error += 2 * p_mass.error + scaled_q_error + 4 * u * (p_mass.value + scaled_q);
    }
    previous = current;
    previous_x = x;
  }

  // High-loss tail: outputs beyond x_high_loss_end go to +∞ (upper bound).
  if (mode == Mode::kUpper) {
    Mass above;
    for (int c = 0; c < 2; ++c) {
      const Real tail = increasing ? previous.component[c].upper : previous.component[c].lower;
      above.value += pair.p_weight[c] * tail;
      above.error += pair.p_weight[c] * (kLibmUlps + 2) * u * tail;
    }
    pmf.infinity_mass += above.value;
    pmf.error += above.error;
  }
  FinishStepPmf(pmf, mode);
  return pmf;
}

// ---------------------------------------------------------------------------
// Chernoff bounds on the composed loss.

// Upper bound on ln Σ_i mass_i·e^{λ(first + i)Δ}, |λ|Δ ≤ kMaxLambdaTimesSpacing.
// Blocks of kMgfBlock bins are scaled by a per-block bound of their largest
// term; blocks whose bound is below e^{−80} of the largest are replaced by
// that bound (which only raises the result).
Real LogMgf(const StepPmf& pmf, Real spacing, Real lambda) {
  const Real u = kRealRoundoff;
  const size_t n = pmf.mass.size();
  const size_t blocks = pmf.block_max_log.size();
  // Loss at the block end that maximises e^{λ·loss}.
  const auto edge_exponent = [&](size_t block) {
    const int64_t start = pmf.first + static_cast<int64_t>(block * kMgfBlock);
    const int64_t end = pmf.first + static_cast<int64_t>(std::min(n, (block + 1) * kMgfBlock)) - 1;
    return pmf.block_max_log[block] +
           lambda * static_cast<Real>(lambda > 0 ? end : start) * spacing;
  };
  Real max_exponent = -kRealInf;
  for (size_t block = 0; block < blocks; ++block) {
    if (pmf.block_max_log[block] == -kRealInf) continue;
    max_exponent = std::max(max_exponent, edge_exponent(block));
  }
  if (max_exponent == -kRealInf) return -kRealInf;
  const Real ratio = expl(lambda * spacing);
  Real sum = 0;
  Real skipped = 0;
  for (size_t block = 0; block < blocks; ++block) {
    if (pmf.block_max_log[block] == -kRealInf) continue;
    const Real bound = edge_exponent(block) - max_exponent;
    const size_t begin = block * kMgfBlock;
    const size_t end = std::min(n, begin + kMgfBlock);
    if (bound < -80) {
      skipped += static_cast<Real>(end - begin) * expl(bound);
      continue;
    }
    // Terms are at most e^{bound} ≤ 1 after scaling, and at least
    // e^{−80 − 32·30} of the largest: no overflow, no harmful underflow.
    Real factor =
        expl(lambda * static_cast<Real>(pmf.first + static_cast<int64_t>(begin)) * spacing -
             max_exponent);
    for (size_t i = begin; i < end; ++i) {
      sum += pmf.mass[i] * factor;
      factor *= ratio;
    }
  }
  const Real max_abs_lambda_loss =
      fabsl(lambda) * spacing *
      std::max(fabsl(static_cast<Real>(pmf.first)), fabsl(static_cast<Real>(pmf.first) + n));
  const Real margin = (static_cast<Real>(n) + kMgfBlock + kLibmUlps + 8) * u +
                      4 * u * (max_abs_lambda_loss + fabsl(max_exponent));
  return max_exponent + logl(sum + skipped) + margin;
}

struct Group {
  StepPmf pmf;
  int64_t steps = 1;
};

Real TotalLogMgf(const std::vector<Group>& groups, Real spacing, Real lambda) {
  Real total = 0;
  for (const Group& group : groups) {
    total += static_cast<Real>(group.steps) * LogMgf(group.pmf, spacing, lambda);
  }
  return total + 4 * kRealRoundoff * fabsl(total);
}

// Upper bound on P(S ≥ threshold) (λ > 0) or P(S ≤ threshold) (λ < 0) for
// the composed finite part S, in loss units.
Real ChernoffBound(const std::vector<Group>& groups, Real spacing, Real lambda, Real threshold) {
  const Real exponent = TotalLogMgf(groups, spacing, lambda) - lambda * threshold;
  const Real margin = 8 * kRealRoundoff * (fabsl(lambda * threshold) + fabsl(exponent) + 1);
  return std::min<Real>(1, expl(exponent + margin));
}

struct Threshold {
  Real loss = 0;    // tail beyond `loss` has mass ≤ target
  Real lambda = 0;  // the λ that certifies it (negative for the lower tail)
};

// The smallest (upper) or largest (lower) loss whose tail is certified to
// hold at most `target`, optimising λ over a bracket around the Gaussian
// guess sqrt(2 ln(1/target))/sd.
Threshold ChernoffThreshold(const std::vector<Group>& groups, Real spacing, Real target,
                            Real composed_sd, bool upper) {
  const Real log_target = logl(target);
  const Real guess = sqrtl(2 * -log_target) / std::max(composed_sd, spacing * 1e-6L);
  const Real max_lambda = kMaxLambdaTimesSpacing / spacing;
  const Real hi = std::min(logl(guess) + 4, logl(max_lambda));
  const Real lo = std::min(logl(guess) - 4, hi - 1);
  const auto objective = [&](Real log_lambda) {
    const Real lambda = expl(log_lambda);
    if (upper) return (TotalLogMgf(groups, spacing, lambda) - log_target) / lambda;
    return -(log_target - TotalLogMgf(groups, spacing, -lambda)) / lambda;
  };
  const auto [best, value] = GoldenMinimize(objective, lo, hi, 24);
  Threshold threshold;
  threshold.lambda = upper ? expl(best) : -expl(best);
  threshold.loss = upper ? value : -value;
  return threshold;
}

// ---------------------------------------------------------------------------
// Spectral composition.

// vers(2πv/N) = 1 − cos and sin(2πv/N), with relative errors ≤ (2K+8)u and
// (K+4)u (K = kLibmUlps): the angle is reduced with exact integers first.
struct VersSin {
  Real vers = 0;
  Real sin = 0;
};

VersSin AngleOfFraction(int64_t v, int64_t n) {
  VersSin result;
  if (v == 0) return result;
  const Real sign = v < 0 ? -1 : 1;
  const int64_t a = v < 0 ? -v : v;  // 0 < a ≤ n/2
  const Real half = sinl(kPi * static_cast<Real>(a) / static_cast<Real>(n));
  result.vers = 2 * half * half;
  // sin(2πa/n) = sin(2π·min(a, n/2 − a)/n), an angle in [0, π/2].
  const int64_t reduced = std::min(a, n / 2 - a);
  result.sin = sign * sinl(2 * kPi * static_cast<Real>(reduced) / static_cast<Real>(n));
  return result;
}

// Two-level table for e^{2πir/N}: r = h·block + l.
struct AngleTable {
  int64_t n = 0;
  int64_t block = 1;
  int log_block = 0;
  int64_t half_count = 0;  // h ∈ [−half_count, half_count]
  std::vector<VersSin> high;
  std::vector<VersSin> low;  // l ∈ [−block/2, block/2)
};

AngleTable MakeAngleTable(int64_t n) {
  AngleTable table;
  table.n = n;
  table.log_block = (std::bit_width(static_cast<uint64_t>(n)) - 1 + 1) / 2;
  table.block = int64_t{1} << table.log_block;
  table.half_count = n / (2 * table.block) + 1;
  table.high.resize(static_cast<size_t>(2 * table.half_count + 1));
  for (int64_t h = -table.half_count; h <= table.half_count; ++h) {
    int64_t v = (h * table.block) % n;
    if (v >= n / 2) v -= n;
    if (v < -n / 2) v += n;
    table.high[static_cast<size_t>(h + table.half_count)] = AngleOfFraction(v, n);
  }
  table.low.resize(static_cast<size_t>(table.block));
  for (int64_t l = -table.block / 2; l < table.block / 2; ++l) {
    table.low[static_cast<size_t>(l + table.block / 2)] = AngleOfFraction(l, n);
  }
  return table;
}

struct AccurateCoefficient {
  Real log_magnitude = 0;  // ln|B|
  Real argument = 0;       // arg B
  Real log_error = 0;      // bound on |ln B̃ − ln B| (perturbation)
  Real magnitude_eval_error = 0;  // rounding in ln|B̃|
  Real argument_eval_error = 0;   // rounding in arg B̃
  bool reliable = true;
};

// B = Σ_j p_j e^{−iθ_j}, θ_j = 2πk(j − c)/N, written as (m − V) − iS with
// V = Σ p_j(1 − cos θ_j) ≥ 0 and S = Σ p_j sin θ_j, so that ln B is accurate
// even when |B| is within 1e-15 of the total mass (low frequencies).
AccurateCoefficient AccurateCentredCoefficient(const StepPmf& pmf, const AngleTable& table,
                                               int64_t k) {
  const Real u = kRealRoundoff;
  const int64_t n = table.n;
  // Terms are summed in blocks of kSumBlock and the block sums compensated:
  // error ≤ (kSumBlock + 4)u per unit of Σ|term|.
  constexpr int kSumBlock = 256;
  KahanSum vers_sum;
  KahanSum sin_sum;
  Real vers_block = 0;
  Real sin_block = 0;
  int in_block = 0;
  Real vers_abs = 0;  // Σ p(va + vb + va·vb + |sa·sb|)
  Real sin_abs = 0;   // Σ p(|sa| + |sb|)
  int64_t r = (k * ((-pmf.center) % n)) % n;
  if (r < -n / 2) r += n;
  if (r >= n / 2) r -= n;
  const int64_t half_block = table.block / 2;
  for (size_t j = 0; j < pmf.mass.size(); ++j) {
    const Real p = pmf.mass[j];
    if (p != 0) {
      const int64_t h = (r + half_block) >> table.log_block;
      const int64_t l = r - h * table.block;
      const VersSin& a = table.high[static_cast<size_t>(h + table.half_count)];
      const VersSin& b = table.low[static_cast<size_t>(l + half_block)];
      const Real cross = a.sin * b.sin;
      vers_block += p * (a.vers + b.vers - a.vers * b.vers + cross);
      sin_block += p * (a.sin * (1 - b.vers) + b.sin * (1 - a.vers));
      vers_abs += p * (a.vers + b.vers + a.vers * b.vers + fabsl(cross));
      sin_abs += p * (fabsl(a.sin) + fabsl(b.sin));
      if (++in_block == kSumBlock) {
        vers_sum.Add(vers_block);
        sin_sum.Add(sin_block);
        vers_block = 0;
        sin_block = 0;
        in_block = 0;
      }
    }
    r += k;
    if (r >= n / 2) r -= n;
  }
  vers_sum.Add(vers_block);
  sin_sum.Add(sin_block);
  const Real count = static_cast<Real>(pmf.mass.size());
  const Real m = pmf.total;
  const Real v = vers_sum.Value();
  const Real s = sin_sum.Value();
  // Table entries: vers within (2K+8)u, sin within (K+4)u (relative); a few
  // more roundings per term; then the summation.
  const Real m_error = 4 * u * m;
  const Real v_error = (2 * kLibmUlps + 24 + kSumBlock + 4) * u * vers_abs * (1 + 4 * u) +
                       count * count * u * u * vers_abs;
  const Real s_error = 3 * (3 * kLibmUlps + 24 + kSumBlock + 4) * u * sin_abs * (1 + 4 * u) +
                       count * count * u * u * sin_abs;
  const Real re = m - v;
  const Real error = m_error + v_error + s_error + u * (fabsl(re) + fabsl(s));
  const Real magnitude = hypotl(re, s);
  AccurateCoefficient coefficient;
  if (!(magnitude > 2 * error) || m <= 0) {
    coefficient.reliable = false;
    coefficient.log_magnitude = logl(magnitude + error);
    return coefficient;
  }
  // ln|B| = ln m + ½ ln(1 + z), z = (V² + S² − 2mV)/m².
  const Real z = (v * v + s * s - 2 * m * v) / (m * m);
  coefficient.log_magnitude = logl(m) + log1pl(z) / 2;
  coefficient.argument = atan2l(-s, re);
  coefficient.log_error = -log1pl(-error / magnitude);
  coefficient.magnitude_eval_error =
      kLibmUlps * u * (fabsl(logl(m)) + fabsl(log1pl(z)) + 2) +
      8 * u * (v * v + s * s + 2 * m * v) / (m * m) / (1 + z);
  coefficient.argument_eval_error = kLibmUlps * u * (fabsl(coefficient.argument) + 2);
  return coefficient;
}

// ComposeSpectra's first pass, in double precision: per coefficient k,
// Σ_j T_j ln R_jk (R = |Â| + e₂), and the power Π Â_jk^{T_j} as
// log-magnitude and phase, with the rounding bounds the assembly needs.
struct DoubleSpectra {
  std::vector<double> log_r_total;
  std::vector<double> power_log;
  std::vector<double> power_phase;
  std::vector<double> power_eval;  // relative rounding of Σ T ln Â
  std::vector<char> power_zero;
  std::vector<std::vector<double>> log_r;
  std::vector<double> spectral_error;  // e₂_j = ‖Â_j − A_j‖₂
};
DoubleSpectra ComputeDoubleSpectra(const std::vector<Group>& groups, int64_t n, double kappa,
                                   Eigen::FFT<double>& fft) {
  const double ud = kDoubleRoundoff;
  const size_t bins = static_cast<size_t>(n / 2 + 1);
  const double two_pi = 2 * std::acos(-1.0);
  DoubleSpectra out;
  out.log_r_total.assign(bins, 0.0);
  out.power_log.assign(bins, 0.0);
  out.power_phase.assign(bins, 0.0);
  out.power_eval.assign(bins, 0.0);
  out.power_zero.assign(bins, 0);
  out.log_r.resize(groups.size());
  out.spectral_error.resize(groups.size());
  std::vector<double>& log_r_total = out.log_r_total;
  std::vector<double>& power_log = out.power_log;
  std::vector<double>& power_phase = out.power_phase;
  std::vector<double>& power_eval = out.power_eval;
  std::vector<char>& power_zero = out.power_zero;
  std::vector<std::vector<double>>& log_r = out.log_r;
  std::vector<double>& spectral_error = out.spectral_error;

  std::vector<double> signal(static_cast<size_t>(n));
  std::vector<std::complex<double>> spectrum(bins);
  for (size_t g = 0; g < groups.size(); ++g) {
    const StepPmf& pmf = groups[g].pmf;
    const double steps = static_cast<double>(groups[g].steps);
    const int64_t steps_mod_n = groups[g].steps % n;
    // The heaviest bin (mass m0 at position c) stays out of the FFT and is
    // added back exactly: Â_k = m0·e^{−iφ_k}(1 + z_k), φ_k = 2πkc/n,
    // z_k = R̂_k e^{iφ_k}/m0 with R̂ the FFT of the other bins. For the nearly
    // point-mass PMFs of small q the FFT error then scales with the small
    // remainder instead of with 1, and ln Â_k = ln m0 + ln(1 + z_k) keeps
    // its relative accuracy.
    const size_t count = pmf.mass.size();
    const size_t atom = static_cast<size_t>(
        std::max_element(pmf.mass.begin(), pmf.mass.end()) - pmf.mass.begin());
    const Real atom_mass = pmf.mass[atom];
    const int64_t atom_position = static_cast<int64_t>(atom) % n;
    const double log_atom = static_cast<double>(logl(atom_mass));
    std::fill(signal.begin(), signal.end(), 0.0);
    for (size_t i = 0; i < count; ++i) {
      if (i != atom) signal[i % static_cast<size_t>(n)] += static_cast<double>(pmf.mass[i]);
    }
    const double folds = std::ceil(static_cast<double>(count) / static_cast<double>(n));
    double norm2 = 0;
    for (double x : signal) norm2 += x * x;
    norm2 = std::sqrt(norm2) * (1 + (n + 4) * ud);
    // Normwise FFT error plus the rounding of the long double masses.
    spectral_error[g] = std::sqrt(static_cast<double>(n)) * (kappa + (folds + 1) * ud) * norm2 *
                            (1 + 1e-12) +
                        1e-300;
    fft.fwd(spectrum.data(), signal.data(), static_cast<Eigen::DenseIndex>(n));
    log_r[g].resize(bins);
    const double atom_mass_d = static_cast<double>(atom_mass);
    for (size_t k = 0; k < bins; ++k) {
      const int64_t kc = (static_cast<int64_t>(k) * atom_position) % n;
      const double phi = two_pi * static_cast<double>(kc) / static_cast<double>(n);
      const std::complex<double> z = spectrum[k] * std::polar(1.0, phi) / atom_mass_d;
      const double abs_z = std::abs(z);
      const double abs_one_plus_z = std::abs(1.0 + z);
      // R = |Â| + e₂ with |Â| rounded up.
      const double r = (atom_mass_d * (abs_one_plus_z + 8 * ud * (1 + abs_z)) + spectral_error[g]) *
                       (1 + 8 * ud);
      log_r[g][k] = std::log(r) + 4 * ud * std::abs(std::log(r));
      log_r_total[k] += steps * log_r[g][k];
      if (power_zero[k]) continue;
      const double x = z.real();
      const double y = z.imag();
      const double s2 = 2 * x + x * x + y * y;  // |1 + z|² − 1
      const double log_ratio = s2 > -1 ? 0.5 * std::log1p(s2) : -kInf;  // ln|1 + z|
      const double log_magnitude = log_atom + log_ratio;
      // Every other factor is at most 1 + 1e-12 per step, so a factor below
      // e^{−760} makes the whole product negligible (it is then set to 0).
      if (!(steps * log_magnitude >= -760)) {
        power_zero[k] = 1;
        continue;
      }
      const double theta = std::atan2(y, 1 + x);
      power_log[k] += steps * log_magnitude;
      power_phase[k] += std::fmod(steps * theta, two_pi) -
                        two_pi * static_cast<double>((kc * steps_mod_n) % n) / static_cast<double>(n);
      // Relative rounding of ln Â_k: z (a product, a quotient, the twiddle),
      // then log1p/atan2; each multiplied by the step count.
      power_eval[k] += steps * (16 * ud * abs_z / std::max(abs_one_plus_z, 1e-300) +
                                4 * ud * (std::abs(log_ratio) + std::abs(theta) + std::abs(log_atom)));
    }
  }
  return out;
}

// ComposeSpectra's choice of the coefficients to recompute in long double:
// the largest Π R^T, as many as the work budget allows, and only those whose
// potential error is above 1e-15.
std::vector<char> ChooseAccurate(const std::vector<Group>& groups, const DoubleSpectra& spectra,
                                 size_t bins) {
  const std::vector<double>& log_r_total = spectra.log_r_total;
  const std::vector<double>& spectral_error = spectra.spectral_error;
  Real total_steps_error = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    total_steps_error += static_cast<Real>(groups[g].steps) * spectral_error[g];
  }
  int64_t total_terms = 0;
  for (const Group& group : groups) total_terms += static_cast<int64_t>(group.pmf.mass.size());
  const int64_t max_accurate = std::clamp<int64_t>(
      kAccurateTermBudget / std::max<int64_t>(total_terms, 1), kMinAccurateCoefficients,
      kMaxAccurateCoefficients);
  std::vector<size_t> order(bins);
  std::iota(order.begin(), order.end(), size_t{0});
  const size_t candidates = std::min<size_t>(bins, static_cast<size_t>(max_accurate));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(candidates), order.end(),
                    [&](size_t a, size_t b) { return log_r_total[a] > log_r_total[b]; });
  // Recompute only coefficients whose potential error is above 1e-15.
  const double worth = std::log(1e-15) - std::log(static_cast<double>(total_steps_error));
  std::vector<char> accurate(bins, 0);
  for (size_t i = 0; i < candidates; ++i) {
    if (log_r_total[order[i]] >= worth) accurate[order[i]] = 1;
  }
  return accurate;
}

// The inverse transform's output as window masses, clamped at 0: output r
// holds composed index S ≡ Σ T_j first_j + r (mod n), window entry w holds
// window_first + w.
std::vector<double> WindowMasses(const std::vector<double>& output,
                                 const std::vector<Group>& groups, int64_t n,
                                 int64_t window_first) {
  Int128 base = 0;
  for (const Group& group : groups) base += static_cast<Int128>(group.steps) * group.pmf.first;
  const int64_t shift = static_cast<int64_t>(((base - window_first) % n + n) % n);
  std::vector<double> mass(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t w = (r + shift) % n;
    mass[static_cast<size_t>(w)] = std::max(0.0, output[static_cast<size_t>(r)]);
  }
  return mass;
}

struct Composition {
  std::vector<double> mass;  // window masses, clamped at 0
  Real fft_error = 0;        // bound on the ℓ1 error of `mass` (before clamping)
};

// Computes the T-fold compositions (product of spectra) on a cyclic grid of
// n points; output w corresponds to composed index window_first + w.
Composition ComposeSpectra(const std::vector<Group>& groups, int64_t n, int64_t window_first) {
  const double ud = kDoubleRoundoff;
  const int64_t half = n / 2;
  const int log2n = std::bit_width(static_cast<uint64_t>(n)) - 1;
  const double kappa = kFftUlpsPerLevel * (log2n + 2) * ud;
  const size_t bins = static_cast<size_t>(half + 1);
  const double two_pi = 2 * std::acos(-1.0);

  Eigen::FFT<double> fft;
  fft.SetFlag(Eigen::FFT<double>::HalfSpectrum);

  const DoubleSpectra spectra = ComputeDoubleSpectra(groups, n, kappa, fft);
  const std::vector<double>& log_r_total = spectra.log_r_total;
  const std::vector<double>& power_log = spectra.power_log;
  const std::vector<double>& power_phase = spectra.power_phase;
  const std::vector<double>& power_eval = spectra.power_eval;
  const std::vector<char>& power_zero = spectra.power_zero;
  const std::vector<std::vector<double>>& log_r = spectra.log_r;
  const std::vector<double>& spectral_error = spectra.spectral_error;
  const std::vector<char> accurate = ChooseAccurate(groups, spectra, bins);

  // Assemble Ŷ and the error bound ‖Ŷ − Y‖₂ over the full spectrum.
  std::vector<std::complex<double>> power(bins);
  const AngleTable table = MakeAngleTable(n);
  const Real u = kRealRoundoff;
  Real accurate_error_sq = 0;
  Real eval_error_sq = 0;
  Real power_norm_sq = 0;
  std::vector<double> max_log_ratio(groups.size(), -kInf);  // max over U of ln(ΠR^T / R_j)
  for (size_t k = 0; k < bins; ++k) {
    const double weight = (k == 0 || static_cast<int64_t>(k) == half) ? 1.0 : 2.0;
    if (accurate[k]) {
      Real log_magnitude = 0;
      Real log_upper = 0;  // Σ T ln(|B̃| + e) ≥ ln|Y| (exact)
      Real phase = 0;
      Real log_error = 0;
      Real eval_error = 0;
      int64_t phase_index = 0;  // Σ_j k·c_j·T_j mod n
      bool reliable = true;
      for (const Group& group : groups) {
        const AccurateCoefficient c = AccurateCentredCoefficient(group.pmf, table, static_cast<int64_t>(k));
        const Real steps = static_cast<Real>(group.steps);
        reliable = reliable && c.reliable;
        log_magnitude += steps * c.log_magnitude;
        log_upper += steps * (c.log_magnitude + c.log_error);
        phase += steps * c.argument;
        log_error += steps * c.log_error;
        eval_error += steps * (c.magnitude_eval_error + c.argument_eval_error);
        const int64_t kc = (static_cast<int64_t>(k) * (group.pmf.center % n)) % n;
        phase_index = (phase_index + (kc * (group.steps % n)) % n) % n;
      }
      if (!reliable) {
        // Fall back to Ŷ = 0 with error |Y| ≤ Π(|B̃| + e)^T.
        power[k] = 0;
        const Real bound = log_upper < -11000 ? 0 : expl(log_upper);
        accurate_error_sq += weight * bound * bound;
        continue;
      }
      phase -= 2 * kPi * static_cast<Real>(phase_index) / static_cast<Real>(n);
      const Real reduced = fmodl(phase, 2 * kPi);
      eval_error += 4 * u * (fabsl(phase) + fabsl(log_magnitude) + 8);
      const Real magnitude = log_magnitude < -11000 ? 0 : expl(log_magnitude);
      const std::complex<Real> value = std::polar(magnitude, reduced);
      power[k] = std::complex<double>(static_cast<double>(value.real()), static_cast<double>(value.imag()));
      const Real relative = expm1l(log_error + eval_error) * (1 + 1e-6L) + eval_error;
      const Real error = magnitude * relative + 1e-4000L;
      accurate_error_sq += weight * error * error;
      power_norm_sq += weight * magnitude * magnitude;
    } else {
      for (size_t g = 0; g < groups.size(); ++g) {
        max_log_ratio[g] = std::max(max_log_ratio[g], log_r_total[k] - log_r[g][k]);
      }
      if (power_zero[k] || power_log[k] < -740) {
        power[k] = 0;
        // The exact power of the computed coefficients is below e^{−740}.
        eval_error_sq += weight * 1e-600L;
        continue;
      }
      const double magnitude = std::exp(power_log[k]);
      power[k] = std::polar(magnitude, std::fmod(power_phase[k], two_pi));
      const Real rho =
          power_eval[k] + 8 * ud * (std::abs(power_log[k]) + std::abs(power_phase[k]) + 8);
      if (rho > 0.5) {
        // Rounding swamps this coefficient: use Ŷ = 0, |Y| ≤ Π R^T.
        power[k] = 0;
        const Real bound = expl(log_r_total[k]);
        eval_error_sq += weight * bound * bound;
        continue;
      }
      const Real error = magnitude * (expm1l(rho) + rho);
      eval_error_sq += weight * error * error;
      power_norm_sq += weight * static_cast<Real>(magnitude) * magnitude;
    }
  }
  Real perturbation = 0;  // ‖ΔY‖₂ over the non-recomputed coefficients
  for (size_t g = 0; g < groups.size(); ++g) {
    if (max_log_ratio[g] == -kInf) continue;
    perturbation += static_cast<Real>(groups[g].steps) * spectral_error[g] * expl(max_log_ratio[g]);
  }
  const Real power_norm = sqrtl(power_norm_sq);
  const Real kappa_real = kappa;
  // ℓ1 error of the output ≤ ‖ΔY‖₂ (Parseval, with the 1/n of the inverse)
  // + the inverse transform's own error κ‖Ŷ‖₂ + the narrowing to double.
  Composition composition;
  composition.fft_error = (perturbation + sqrtl(accurate_error_sq) + sqrtl(eval_error_sq) +
                           (kappa_real + 2 * static_cast<Real>(ud)) * power_norm * (1 + 1e-6L)) *
                              (1 + 1e-9L) +
                          1e-300L;

  std::vector<double> output(static_cast<size_t>(n));
  fft.inv(output.data(), power.data(), static_cast<Eigen::DenseIndex>(n));
  composition.mass = WindowMasses(output, groups, n, window_first);
  return composition;
}

// ---------------------------------------------------------------------------
// One direction, end to end.

struct DirectionResult {
  std::vector<double> mass;
  int64_t window_first = 0;
  double grid_spacing = 0;
  double relative = 0;
  double additive = 0;
  PldDirectionReport report;
};

struct GroupSpec {
  double sampling_rate;
  double noise_multiplier;
  int64_t steps;
};

// Largest power of two ≤ x (x > 0).
Real DyadicFloor(double x) {
  int exponent = 0;
  std::frexp(x, &exponent);  // x = f·2^exponent, f ∈ [0.5, 1)
  return ldexpl(1.0L, exponent - 1);
}

// One step PMF per group of identical steps, on the grid of `spacing`.
std::vector<Group> BuildGroups(const std::vector<GroupSpec>& specs,
                               const std::vector<PairModel>& pairs,
                               const std::vector<StepRange>& ranges, Real spacing, Mode mode,
                               PldDiscretization method) {
  std::vector<Group> groups;
  for (size_t g = 0; g < specs.size(); ++g) {
    Group group;
    group.pmf = BuildStepPmf(pairs[g], ranges[g], spacing, mode, method);
    group.steps = specs[g].steps;
    groups.push_back(std::move(group));
  }
  return groups;
}

// ComposeDirection's result once the grid fits: the composed masses (the
// FFT composition, one step's PMF, or nothing when every step is at +∞) and
// the bounds on what they leave out or round.
DirectionResult AssembleDirection(const std::vector<Group>& groups, Real spacing,
                                  int64_t window_first, int64_t window_size, bool use_fft,
                                  Real aliasing, Mode mode) {
  DirectionResult result;
  result.grid_spacing = static_cast<double>(spacing);
  result.window_first = window_first;
  Real fft_error = 0;
  if (window_size == 0) {
    result.mass.assign(1, 0.0);
  } else if (!use_fft) {
    const StepPmf& pmf = groups.front().pmf;
    result.mass.resize(pmf.mass.size());
    for (size_t i = 0; i < pmf.mass.size(); ++i) result.mass[i] = static_cast<double>(pmf.mass[i]);
    fft_error = 2 * kDoubleRoundoff * pmf.total;  // narrowing to double
  } else {
    Composition composition = ComposeSpectra(groups, window_size, window_first);
    result.mass = std::move(composition.mass);
    fft_error = composition.fft_error;
  }

  // Hybrid argument: replacing the exact per-step PMF by the computed one,
  // one step at a time, changes δ(ε) by at most η per step times the mass of
  // the other steps (≤ (1 + η)^T).
  Real rounding = 0;
  Real infinity_log = 0;  // ln P(no step at +∞)
  for (const Group& group : groups) {
    rounding += static_cast<Real>(group.steps) * group.pmf.error;
    infinity_log += static_cast<Real>(group.steps) * log1pl(-group.pmf.infinity_mass);
  }
  rounding *= expl(rounding) * (1 + 1e-9L);
  const Real infinity_mass =
      mode == Mode::kUpper ? -expm1l(infinity_log) * (1 + 16 * kRealRoundoff) : 0;

  result.report.grid_spacing = result.grid_spacing;
  result.report.grid_points = static_cast<int64_t>(result.mass.size());
  result.report.infinity_mass = RoundUpToDouble(infinity_mass);
  result.report.aliasing_bound = RoundUpToDouble(aliasing);
  result.report.fft_error = RoundUpToDouble(fft_error);
  result.report.rounding_error = RoundUpToDouble(rounding);
  // D(ε) is a sum of non-negative terms each within a few ulps.
  result.relative = static_cast<double>(result.mass.size() + 16) * kDoubleRoundoff;
  result.additive = RoundUpToDouble((infinity_mass + aliasing + fft_error + rounding) * (1 + 1e-12L));
  return result;
}

StatusOr<DirectionResult> ComposeDirection(const std::vector<GroupSpec>& specs, bool remove,
                                           const PldOptions& options, Mode mode) {
  int64_t total_steps = 0;
  for (const GroupSpec& spec : specs) total_steps += spec.steps;
  const Real tail_total = options.tail_mass_truncation;
  // Per step: tail_total/(2T) on each side; composed window: tail_total/2.
  const Real step_tail = tail_total / (2 * static_cast<Real>(total_steps));
  const Real window_tail = tail_total / 2;

  std::vector<PairModel> pairs;
  std::vector<StepRange> ranges;
  for (const GroupSpec& spec : specs) {
    pairs.push_back(MakePair(remove, spec.sampling_rate, spec.noise_multiplier));
    ranges.push_back(FindStepRange(pairs.back(), step_tail));
  }

  Real spacing = DyadicFloor(options.discretization);
  std::vector<Group> groups;
  int64_t window_first = 0;
  int64_t window_size = 0;
  bool use_fft = total_steps > 1;
  Real aliasing = 0;
  bool fits = false;
  for (int attempt = 0; attempt < 80 && !fits; ++attempt) {
    // The per-step grid must fit.
    Real widest = 0;
    for (const StepRange& range : ranges) widest = std::max(widest, range.high - range.low);
    const Real needed = widest / spacing + 8;
    if (needed > static_cast<Real>(kMaxGridPoints)) {
      spacing *= static_cast<Real>(std::bit_ceil(static_cast<uint64_t>(ceill(needed / kMaxGridPoints))));
      continue;
    }
    groups = BuildGroups(specs, pairs, ranges, spacing, mode, options.method);
    Int128 full_first = 0;
    Int128 full_last = 0;
    Real composed_variance = 0;
    for (const Group& group : groups) {
      full_first += static_cast<Int128>(group.steps) * group.pmf.first;
      full_last += static_cast<Int128>(group.steps) *
                   (group.pmf.first + static_cast<int64_t>(group.pmf.mass.size()) - 1);
      composed_variance += static_cast<Real>(group.steps) * group.pmf.variance;
    }
    const Int128 full_size = full_last - full_first + 1;
    aliasing = 0;
    bool empty = false;
    for (const Group& group : groups) empty = empty || group.pmf.total <= 0;
    if (empty) {
      // Every step's finite part is empty: the composition is all at +∞.
      use_fft = false;
      window_first = 0;
      window_size = 0;
      fits = true;
      break;
    }
    if (!use_fft) {
      window_first = static_cast<int64_t>(full_first);
      window_size = static_cast<int64_t>(full_size);
      fits = true;
      break;
    }
    Int128 lo = full_first;
    Int128 hi = full_last;
    if (full_size > kSmallFullSupport) {
      const Real sd = sqrtl(composed_variance) * spacing;
      const Threshold upper = ChernoffThreshold(groups, spacing, window_tail, sd, /*upper=*/true);
      const Threshold lower = ChernoffThreshold(groups, spacing, window_tail, sd, /*upper=*/false);
      const Real upper_index = ceill(upper.loss / spacing);
      const Real lower_index = floorl(lower.loss / spacing);
      if (std::isfinite(upper_index) && upper_index < static_cast<Real>(hi)) {
        hi = static_cast<Int128>(upper_index);
      }
      if (std::isfinite(lower_index) && lower_index > static_cast<Real>(lo)) {
        lo = static_cast<Int128>(lower_index);
      }
      if (hi < lo) hi = lo;
      if (full_size <= 2 * (hi - lo + 1) && full_size <= kMaxGridPoints) {
        lo = full_first;
        hi = full_last;
      }
      const Int128 width = hi - lo + 1;
      const int64_t n = std::max<int64_t>(
          4, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::min<Int128>(width, int64_t{1} << 62)))));
      if (n > kMaxGridPoints) {
        spacing *= static_cast<Real>(
            std::bit_ceil(static_cast<uint64_t>((width + kMaxGridPoints - 1) / kMaxGridPoints)));
        continue;
      }
      window_first = static_cast<int64_t>(lo);
      window_size = n;
      // Mass beyond the window's top aliases downwards: bound and add it
      // (upper bound). Mass below its bottom aliases upwards, which only
      // raises δ; the lower bound subtracts it instead.
      const Int128 top = lo + n - 1;
      if (mode == Mode::kUpper && top < full_last) {
        aliasing = ChernoffBound(groups, spacing, upper.lambda,
                                 static_cast<Real>(top + 1) * spacing);
      }
      if (mode == Mode::kLower && lo > full_first) {
        aliasing = ChernoffBound(groups, spacing, lower.lambda,
                                 static_cast<Real>(lo - 1) * spacing);
      }
      fits = true;
      break;
    }
    window_first = static_cast<int64_t>(lo);
    window_size = std::max<int64_t>(
        4, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(full_size))));
    fits = true;
    break;
  }

  if (!fits) return InternalError("PLD accountant: the loss grid did not fit after coarsening");

  return AssembleDirection(groups, spacing, window_first, window_size, use_fft, aliasing, mode);
}

Status ValidateGroup(const PldStepGroup& group) {
  if (!(group.sampling_rate > 0.0 && group.sampling_rate <= 1.0)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1]");
  }
  if (!(group.noise_multiplier > 0.0) || !std::isfinite(group.noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and > 0");
  }
  if (group.steps < 1) return InvalidArgumentError("steps must be >= 1");
  return Status::Ok();
}

Status ValidateOptions(const PldOptions& options) {
  if (!(options.discretization > 0.0 && options.discretization <= 1.0)) {
    return InvalidArgumentError("PLD discretization must be in (0, 1]");
  }
  if (!(options.tail_mass_truncation >= 1e-300 && options.tail_mass_truncation <= 1e-3)) {
    return InvalidArgumentError("PLD tail_mass_truncation must be in [1e-300, 1e-3]");
  }
  if (options.method != PldDiscretization::kConnectTheDots &&
      options.method != PldDiscretization::kRoundUp) {
    return InvalidArgumentError("unknown PLD discretization method");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ComposedPld> ComposedPld::Compose(std::span<const PldStepGroup> groups,
                                           const PldOptions& options) {
  return ComposeImpl(groups, options, Bound::kUpper);
}

StatusOr<ComposedPld> ComposedPld::ComposeLowerBound(std::span<const PldStepGroup> groups,
                                                     const PldOptions& options) {
  return ComposeImpl(groups, options, Bound::kLower);
}

StatusOr<ComposedPld> ComposedPld::ComposeImpl(std::span<const PldStepGroup> groups,
                                               const PldOptions& options, Bound bound) {
  if (groups.empty()) return InvalidArgumentError("at least one step group is required");
  VIPSD_RETURN_IF_ERROR(ValidateOptions(options));
  std::vector<GroupSpec> specs;
  int64_t total_steps = 0;
  for (const PldStepGroup& group : groups) {
    VIPSD_RETURN_IF_ERROR(ValidateGroup(group));
    if (group.steps > kMaxTotalSteps - total_steps) {
      return InvalidArgumentError("the total number of steps must be at most 2^40");
    }
    total_steps += group.steps;
    // Identical (q, σ) compose in one spectrum.
    auto same = std::find_if(specs.begin(), specs.end(), [&](const GroupSpec& spec) {
      return spec.sampling_rate == group.sampling_rate &&
             spec.noise_multiplier == group.noise_multiplier;
    });
    if (same != specs.end()) {
      same->steps += group.steps;
    } else {
      specs.push_back({group.sampling_rate, group.noise_multiplier, group.steps});
    }
  }
  const Mode mode = bound == Bound::kUpper ? Mode::kUpper : Mode::kLower;
  try {
    ComposedPld pld;
    pld.bound_ = bound;
    for (bool remove : {true, false}) {
      VIPSD_ASSIGN_OR_RETURN(DirectionResult result, ComposeDirection(specs, remove, options, mode));
      Direction& direction = remove ? pld.remove_ : pld.add_;
      direction.mass = std::move(result.mass);
      direction.window_first = result.window_first;
      direction.grid_spacing = result.grid_spacing;
      direction.relative = result.relative;
      direction.additive = result.additive;
      direction.report = result.report;
    }
    return pld;
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("PLD accountant: out of memory for the loss grid");
  } catch (const std::exception& e) {
    return InternalError(std::string("PLD accountant: ") + e.what());
  }
}

double ComposedPld::DeltaOf(const Direction& direction, double epsilon) const {
  const double spacing = direction.grid_spacing;
  const int64_t size = static_cast<int64_t>(direction.mass.size());
  // First grid point above ε (ε/Δ is clamped before the integer conversion).
  const double last_loss = static_cast<double>(direction.window_first + size);
  const double start = std::min(std::floor(epsilon / spacing), last_loss);
  int64_t w = static_cast<int64_t>(start) - direction.window_first;
  w = std::clamp<int64_t>(w, 0, size);
  double sum = 0;
  for (; w < size; ++w) {
    const double loss = static_cast<double>(direction.window_first + w) * spacing;
    if (loss <= epsilon) continue;
    sum += direction.mass[static_cast<size_t>(w)] * -std::expm1(epsilon - loss);
  }
  if (bound_ == Bound::kUpper) {
    return std::min(1.0, std::nextafter(sum * (1 + direction.relative), kInf) + direction.additive);
  }
  return std::max(0.0, std::nextafter(sum * (1 - direction.relative), -kInf) - direction.additive);
}

double ComposedPld::EpsilonOf(const Direction& direction, double delta) const {
  const bool upper = bound_ == Bound::kUpper;
  const double spacing = direction.grid_spacing;
  const int64_t size = static_cast<int64_t>(direction.mass.size());
  const auto loss_at = [&](int64_t w) {
    return static_cast<double>(direction.window_first + w) * spacing;
  };
  const auto satisfied = [&](double epsilon) { return DeltaOf(direction, epsilon) <= delta; };
  if (upper && direction.additive >= delta) return kInf;
  if (satisfied(0.0)) return 0.0;
  // D at the grid points, from the top: D_w = (1 − e^{−Δ})A_w + e^{−Δ}D_{w+1}
  // with A_w = Σ_{v>w} mass_v; H_w = Σ_{v>w} mass_v e^{l_{w+1} − l_v}.
  const double target = upper ? (delta - direction.additive) / (1 + direction.relative)
                              : (delta + direction.additive) / (1 - direction.relative);
  const double decay = std::exp(-spacing);
  const double one_minus_decay = -std::expm1(-spacing);
  // Invariant at the top of each iteration: above = A_w, d = D_w, h = H_w.
  double above = 0;
  double d = 0;
  double h = 0;
  int64_t k = 0;  // smallest w with D_w ≤ target (0 if every D_w is)
  for (int64_t w = size - 1; w >= 0; --w) {
    if (d > target) {
      k = w + 1;
      break;
    }
    const double next_mass = direction.mass[static_cast<size_t>(w)];
    h = next_mass + decay * h;                  // H_{w−1}
    above += next_mass;                         // A_{w−1}
    d = one_minus_decay * above + decay * d;    // D_{w−1}
  }
  // Now above = Σ_{v≥k} mass_v and h = Σ_{v≥k} mass_v e^{l_k − l_v}; on
  // [l_{k−1}, l_k] (or (−∞, l_0] when k = 0) D(ε) = above − e^{ε − l_k}·h.
  double root;
  if (h <= 0 || above <= target) {
    root = k == 0 ? -kInf : loss_at(k - 1);
  } else {
    root = loss_at(k) + std::log((above - target) / h);
  }
  double epsilon = std::max(0.0, root);
  if (upper) {
    epsilon = std::nextafter(epsilon + 1e-12 * (std::abs(epsilon) + spacing), kInf);
    // Verify; move up grid point by grid point if rounding fooled the solve.
    for (int guard = 0; guard < 64 && !satisfied(epsilon); ++guard) {
      epsilon = std::max(epsilon, (std::floor(epsilon / spacing) + 1) * spacing);
    }
    if (!satisfied(epsilon)) {
      epsilon = std::max(epsilon, loss_at(size));  // D = 0 above the grid
    }
    return epsilon;
  }
  epsilon = std::max(0.0, epsilon - 1e-12 * (std::abs(epsilon) + spacing));
  for (int guard = 0; guard < 64 && epsilon > 0 && satisfied(epsilon); ++guard) {
    epsilon = std::max(0.0, (std::ceil(epsilon / spacing) - 1) * spacing);
  }
  return satisfied(epsilon) ? 0.0 : epsilon;
}

StatusOr<double> ComposedPld::Delta(double epsilon) const {
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon)) {
    return InvalidArgumentError("epsilon must be finite and >= 0");
  }
  return std::max(DeltaOf(remove_, epsilon), DeltaOf(add_, epsilon));
}

StatusOr<double> ComposedPld::DirectionDelta(PldDirection direction, double epsilon) const {
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon)) {
    return InvalidArgumentError("epsilon must be finite and >= 0");
  }
  return DeltaOf(direction == PldDirection::kRemove ? remove_ : add_, epsilon);
}

StatusOr<double> ComposedPld::Epsilon(double delta) const {
  if (!(delta > 0.0 && delta < 1.0)) return InvalidArgumentError("delta must be in (0, 1)");
  return std::max(EpsilonOf(remove_, delta), EpsilonOf(add_, delta));
}

StatusOr<double> PldEpsilon(double sampling_rate, double noise_multiplier, int64_t steps,
                            double delta, const PldOptions& options) {
  if (!(delta > 0.0 && delta < 1.0)) return InvalidArgumentError("delta must be in (0, 1)");
  const PldStepGroup group{sampling_rate, noise_multiplier, steps};
  VIPSD_ASSIGN_OR_RETURN(const ComposedPld pld, ComposedPld::Compose({&group, 1}, options));
  return pld.Epsilon(delta);
}

StatusOr<double> PldDelta(double sampling_rate, double noise_multiplier, int64_t steps,
                          double epsilon, const PldOptions& options) {
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon)) {
    return InvalidArgumentError("epsilon must be finite and >= 0");
  }
  const PldStepGroup group{sampling_rate, noise_multiplier, steps};
  VIPSD_ASSIGN_OR_RETURN(const ComposedPld pld, ComposedPld::Compose({&group, 1}, options));
  return pld.Delta(epsilon);
}

}  // namespace vipsd::privacy
