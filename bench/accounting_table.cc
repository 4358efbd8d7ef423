// The accounting tables of docs/privacy_accounting.md, computed with the
// daemon's own accountants:
//   1. steps an ε ceiling allows under each way of charging (fixed schedule:
//      PLD/RDP; adaptive filter: uniform split over the first, 162-order
//      grid, uniform over the current grid, and the designed split);
//   2. the VIPS paper's settings: ε by RDP, PLD, the fixed-schedule charge
//      and strong composition;
//   3. plain RDP over the previous (324-order) and the current order grid
//      against the optimum over all real orders;
//   4. the cost of the ceiling check the daemon runs before every step, and
//      of one per-step RDP curve over each grid.
// Every grid comes from core/privacy/accounting/rdp.h (RdpOrders); none is copied here.
// Usage: accounting_table   (no arguments; prints Markdown tables)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/strong_composition.h"

namespace {

using namespace vipsd::privacy;

int64_t UniformFilterSteps(const std::vector<double>& orders, double q, double sigma,
                           double delta, double ceiling) {
  auto accountant = RdpAccountant::Create(orders);
  int64_t good = 0;
  int64_t bad = 1;
  auto fits = [&](int64_t steps) {
    return !accountant
                ->CheckCeiling({q, sigma}, steps, {ceiling, delta}, RdpConversion::kImproved,
                               Adaptivity::kAdaptiveFilter)
                ->would_exceed;
  };
  while (fits(bad)) {
    good = bad;
    bad *= 2;
  }
  while (bad - good > 1) {
    const int64_t mid = (good + bad) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

void StepsTable() {
  struct Row {
    const char* name;
    double q, sigma, delta, ceiling;
  };
  const Row rows[] = {{"demo", 0.1, 2.0, 1e-5, 4.0},
                      {"lda_offline example", 0.01, 1.1, 1e-5, 4.0},
                      {"BLR (paper)", 0.004, 1.0, 1e-3, 0.5},
                      {"LDA (paper)", 0.05, 1.24, 1e-4, 2.0},
                      {"SBN (paper, S=800)", 800.0 / 60000, 1.0, 1e-4, 1.0}};
  std::printf("## Steps allowed by the ceiling\n\n");
  std::printf("| setting | q | sigma | delta | ceiling | fixed: PLD/RDP | plain RDP | "
              "filter, uniform, first grid (%zu orders) | filter, uniform, current grid (%zu "
              "orders) | filter, designed split | peak order | penalty at peak: uniform over "
              "the first grid -> designed |\n",
              RdpOrders(RdpOrderGrid::kV1).size(), DefaultRdpOrders().size());
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<double>& old_grid = RdpOrders(RdpOrderGrid::kV1);
  for (const Row& r : rows) {
    auto fixed = FixedScheduleAccountant::Create({r.q, r.sigma});
    const int64_t fixed_steps = *fixed->MaxSteps(r.delta, r.ceiling, int64_t{1} << 40);
    const int64_t rdp_steps =
        *MaxStepsForEpsilon(AccountantKind::kRdp, r.ceiling, r.q, r.sigma, r.delta);
    const int64_t old_uniform = UniformFilterSteps(old_grid, r.q, r.sigma, r.delta, r.ceiling);
    const int64_t uniform =
        UniformFilterSteps(DefaultRdpOrders(), r.q, r.sigma, r.delta, r.ceiling);
    auto weights = DesignFilterWeights(r.q, r.sigma, r.delta, r.ceiling, 0);
    const int64_t designed = *FilterMaxSteps(r.ceiling, r.q, r.sigma, r.delta, *weights);
    const auto& orders = DefaultRdpOrders();
    const double peak = PeakFilterOrder(orders, *weights);
    const double peak_weight = *std::max_element(weights->begin(), weights->end());
    std::printf("| %s | %.4g | %.3g | %.0e | %.3g | %lld | %lld | %lld | %lld | %lld | %.4g | "
                "%.3f -> %.3f |\n",
                r.name, r.q, r.sigma, r.delta, r.ceiling, static_cast<long long>(fixed_steps),
                static_cast<long long>(rdp_steps), static_cast<long long>(old_uniform),
                static_cast<long long>(uniform), static_cast<long long>(designed), peak,
                std::log(static_cast<double>(old_grid.size())) / (peak - 1),
                -std::log(peak_weight) / (peak - 1));
  }
}

void PaperTable() {
  struct Row {
    const char* name;
    double q, sigma;
    int64_t steps;
    double delta;
  };
  const Row rows[] = {
      {"BLR, sigma 1", 0.004, 1.0, 100, 1e-3},
      {"BLR, sigma 6", 0.004, 6.0, 100, 1e-3},
      {"BLR, sigma 12", 0.004, 12.0, 100, 1e-3},
      {"SBN, S 400", 400.0 / 60000, 1.0, 150, 1e-4},
      {"SBN, S 800", 800.0 / 60000, 1.0, 75, 1e-4},
      {"SBN, S 1600", 1600.0 / 60000, 1.0, 38, 1e-4},
      {"SBN, S 3200", 3200.0 / 60000, 1.0, 19, 1e-4},
      {"LDA, S 20000 of 400000", 0.05, 1.24, 20, 1e-4},
  };
  std::printf("\n## The paper's settings (Poisson sampling, add/remove adjacency)\n\n");
  std::printf("| setting | q | sigma | steps | delta | RDP (improved) | RDP (classic) | PLD | "
              "fixed-schedule charge | strong composition |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    auto rdp = EstimateEpsilon(AccountantKind::kRdp, {r.q, r.sigma}, r.steps, r.delta);
    auto pld = EstimateEpsilon(AccountantKind::kPld, {r.q, r.sigma}, r.steps, r.delta);
    auto fixed = EstimateEpsilon(AccountantKind::kFixed, {r.q, r.sigma}, r.steps, r.delta);
    auto strong = EstimateEpsilon(AccountantKind::kStrong, {r.q, r.sigma}, r.steps, r.delta);
    std::printf("| %s | %.4g | %.3g | %lld | %.0e | %.4f | %.4f | %.4f | %.4f | %.4f |\n",
                r.name, r.q, r.sigma, static_cast<long long>(r.steps), r.delta, rdp->epsilon,
                *rdp->epsilon_classic, pld->epsilon, fixed->epsilon, strong->epsilon);
  }
}

// ε of `steps` steps at one real order, from the series.
double EpsilonAtRealOrder(double q, double sigma, double steps, double delta, double alpha) {
  const std::vector<double> order = {alpha};
  const std::vector<double> rdp = {*SampledGaussianRdp(q, sigma, alpha) * steps};
  return EpsilonFromRdp(order, rdp, delta, RdpConversion::kImproved)->epsilon;
}

// The optimum over all real orders: a scan in ln(α − 1) with step 0.03 from
// α = 1.001 to 301 (every row's optimum is far inside), then golden-section
// search between the scan's neighbours of its minimum (the tests check the
// same against the quadrature oracle, tests/core/privacy/accounting/rdp_order_grid_test.cc).
EpsilonAtOrder OptimumOverRealOrders(double q, double sigma, double steps, double delta) {
  auto at = [&](double u) { return EpsilonAtRealOrder(q, sigma, steps, delta, 1 + std::exp(u)); };
  const double first = std::log(0.001), step = 0.03;
  double best_u = first, best = at(first);
  for (double u = first + step; u <= std::log(300.0); u += step) {
    if (const double e = at(u); e < best) best = e, best_u = u;
  }
  double lo = best_u - step, hi = best_u + step;
  const double ratio = (std::sqrt(5.0) - 1) / 2;
  double u1 = hi - ratio * (hi - lo), u2 = lo + ratio * (hi - lo);
  double e1 = at(u1), e2 = at(u2);
  for (int i = 0; i < 40; ++i) {
    if (e1 < e2) {
      hi = u2, u2 = u1, e2 = e1, u1 = hi - ratio * (hi - lo), e1 = at(u1);
    } else {
      lo = u1, u1 = u2, e1 = e2, u2 = lo + ratio * (hi - lo), e2 = at(u2);
    }
  }
  const double u = e1 < e2 ? u1 : u2;
  return {std::min({e1, e2, best}), 1 + std::exp(u)};
}

EpsilonAtOrder GridEpsilon(const std::vector<double>& orders, double q, double sigma,
                           double steps, double delta) {
  std::vector<double> rdp = *SampledGaussianRdpCurve(q, sigma, orders);
  for (double& value : rdp) value *= steps;
  return *EpsilonFromRdp(orders, rdp, delta, RdpConversion::kImproved);
}

void GridTable() {
  struct Row {
    const char* name;
    double q, sigma, steps, delta;
  };
  const Row rows[] = {
      {"issue 29 example", 0.05, 0.6, 10, 1e-3},
      {"sigma 0.6, large q", 0.1, 0.6, 30, 1e-5},
      {"sigma 0.6, q 0.001", 0.001, 0.6, 10, 1e-3},
      {"sigma 0.8, q 0.001", 0.001, 0.8, 20, 1e-6},
      {"sigma 0.6, q 0.6, 1e4 steps", 0.6, 0.6, 1e4, 1e-3},
      {"BLR (paper)", 0.004, 1.0, 100, 1e-3},
      {"SBN (paper, S=800)", 800.0 / 60000, 1.0, 75, 1e-4},
      {"LDA (paper)", 0.05, 1.24, 20, 1e-4},
      {"demo", 0.1, 2.0, 276, 1e-5},
      {"sigma 1.24, q 0.001", 0.001, 1.24, 50, 1e-3},
      {"sigma 2, q 0.001", 0.001, 2.0, 20, 1e-3},
  };
  const auto& previous = RdpOrders(RdpOrderGrid::kV2);
  std::printf("\n## Plain RDP (improved conversion) over the order grids\n\n");
  std::printf("| setting | q | sigma | steps | delta | optimum over real orders (order) | "
              "previous grid, %zu orders | current grid, %zu orders |\n",
              previous.size(), DefaultRdpOrders().size());
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const EpsilonAtOrder best = OptimumOverRealOrders(r.q, r.sigma, r.steps, r.delta);
    const EpsilonAtOrder before = GridEpsilon(previous, r.q, r.sigma, r.steps, r.delta);
    const EpsilonAtOrder after = GridEpsilon(DefaultRdpOrders(), r.q, r.sigma, r.steps, r.delta);
    std::printf("| %s | %.4g | %.3g | %.0f | %.0e | %.5g (%.4g) | %.5g (%+.3f %%) | %.5g (%+.3f %%) "
                "|\n",
                r.name, r.q, r.sigma, r.steps, r.delta, best.epsilon, best.order, before.epsilon,
                100 * (before.epsilon / best.epsilon - 1), after.epsilon,
                100 * (after.epsilon / best.epsilon - 1));
  }
}

template <typename F>
double MicrosPerCall(int calls, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f(i);
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(end - start).count() / calls;
}

void CheckCostTable() {
  std::printf("\n## Cost of the ceiling check before a step (demo settings)\n\n");
  std::printf("| check | microseconds per step |\n|---|---|\n");
  // Fixed schedule: ε(n + 1) of a step count not seen before (a PLD
  // composition and an RDP conversion), and the memoised repeat.
  auto fixed = FixedScheduleAccountant::Create({0.1, 2.0});
  const double fresh =
      MicrosPerCall(20, [&](int i) { (void)fixed->Epsilon(1000 + i, 1e-5); });
  const double repeat =
      MicrosPerCall(2000, [&](int i) { (void)fixed->Epsilon(1000 + i % 20, 1e-5); });
  std::printf("| fixed schedule, new step count (PLD + RDP) | %.1f |\n", fresh);
  std::printf("| fixed schedule, memoised | %.3f |\n", repeat);
  // The daemon's way: before step n it asks for ε(n) and prefetches ε(n + 1)
  // on a background thread; the next check finds it memoised if the step
  // (here a 40 ms sleep standing in for the E-step) took longer than the
  // PLD composition.
  auto prefetched = FixedScheduleAccountant::Create({0.1, 2.0});
  (void)prefetched->Epsilon(2000, 1e-5);
  double check_total = 0;
  constexpr int kPrefetchSteps = 10;
  for (int i = 0; i < kPrefetchSteps; ++i) {
    check_total += MicrosPerCall(1, [&](int) {
      (void)prefetched->Epsilon(2000 + i, 1e-5);
      prefetched->Prefetch(2001 + i, 1e-5);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  std::printf("| fixed schedule, next step count prefetched during a 40 ms step | %.1f |\n",
              check_total / kPrefetchSteps);
  auto weights = DesignFilterWeights(0.1, 2.0, 1e-5, 4.0, 0);
  RdpAccountant filter;
  (void)filter.SetFilterWeights(*weights);
  (void)filter.Compose({0.1, 2.0}, 100);
  const double adaptive = MicrosPerCall(2000, [&](int) {
    (void)filter.CheckCeiling({0.1, 2.0}, 1, {4.0, 1e-5}, RdpConversion::kImproved,
                              Adaptivity::kAdaptiveFilter);
  });
  std::printf("| adaptive filter, cached step curve | %.2f |\n", adaptive);

  // What a new (q, σ) costs: one per-step RDP curve over each grid, best of
  // five, the two grids interleaved.
  std::printf("\n## Cost of one per-step RDP curve (uncached; best of 5)\n\n");
  std::printf("| q | sigma | previous grid (%zu orders), ms | current grid (%zu orders), ms | "
              "ratio |\n|---|---|---|---|---|\n",
              RdpOrders(RdpOrderGrid::kV2).size(), DefaultRdpOrders().size());
  const std::pair<double, double> settings[] = {{0.1, 2.0},  {0.01, 1.1}, {0.004, 1.0},
                                                {0.05, 0.6}, {0.5, 0.6},  {0.001, 0.8},
                                                {1e-6, 100}};
  for (const auto& setting : settings) {
    // Plain copies: C++20 lambdas may not capture structured bindings in
    // clang 14 (the thread-safety build).
    const double q = setting.first, sigma = setting.second;
    double before = 1e300, after = 1e300;
    for (int i = 0; i < 5; ++i) {
      before = std::min(before, MicrosPerCall(1, [&](int) {
                          (void)SampledGaussianRdpCurve(q, sigma, RdpOrders(RdpOrderGrid::kV2));
                        }));
      after = std::min(after, MicrosPerCall(1, [&](int) {
                         (void)SampledGaussianRdpCurve(q, sigma, DefaultRdpOrders());
                       }));
    }
    std::printf("| %.3g | %.3g | %.1f | %.1f | %.2f |\n", q, sigma, before / 1000, after / 1000,
                after / before);
  }
}

}  // namespace

int main() {
  StepsTable();
  PaperTable();
  GridTable();
  CheckCostTable();
  return 0;
}
