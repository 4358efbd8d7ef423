// The accounting tables of docs/privacy_accounting.md, computed with the
// daemon's own accountants:
//   1. steps an ε ceiling allows under each way of charging (fixed schedule:
//      PLD/RDP; adaptive filter: uniform split over the old 162-order grid,
//      uniform over today's grid, and the designed split);
//   2. the VIPS paper's settings: ε by RDP, PLD, the fixed-schedule charge
//      and strong composition;
//   3. the cost of the ceiling check the daemon runs before every step.
// Usage: accounting_table   (no arguments; prints Markdown tables)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/privacy/filter_weights.h"
#include "core/privacy/fixed_schedule.h"
#include "core/privacy/planner.h"
#include "core/privacy/rdp.h"
#include "core/privacy/rdp_accountant.h"
#include "core/privacy/strong_composition.h"

namespace {

using namespace vipsd::privacy;

// The order grid before quarter steps were extended to 64 (162 orders).
std::vector<double> OldGrid() {
  std::vector<double> grid;
  for (int i = 1; i <= 19; ++i) grid.push_back(1.0 + 0.05 * i);
  for (int i = 0; i <= 32; ++i) grid.push_back(2.0 + 0.25 * i);
  for (int a = 11; a <= 64; ++a) grid.push_back(a);
  for (int a = 72; a <= 256; a += 8) grid.push_back(a);
  for (double a = 320; a <= 262144; a = std::round(a * 1.25)) grid.push_back(a);
  grid.push_back(262144);
  std::sort(grid.begin(), grid.end());
  grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
  return grid;
}

int64_t UniformFilterSteps(const std::vector<double>& orders, double q, double sigma,
                           double delta, double ceiling) {
  auto accountant = RdpAccountant::Create(orders);
  int64_t good = 0;
  int64_t bad = 1;
  auto fits = [&](int64_t steps) {
    return !accountant
                ->CheckCeiling(q, sigma, steps, delta, ceiling, RdpConversion::kImproved,
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
              "filter, uniform, 162 orders | filter, uniform, %zu orders | filter, designed "
              "split | peak order | penalty at peak: uniform 162 -> designed |\n",
              DefaultRdpOrders().size());
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<double> old_grid = OldGrid();
  for (const Row& r : rows) {
    auto fixed = FixedScheduleAccountant::Create(r.q, r.sigma);
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
    auto rdp = EstimateEpsilon(AccountantKind::kRdp, r.q, r.sigma, r.steps, r.delta);
    auto pld = EstimateEpsilon(AccountantKind::kPld, r.q, r.sigma, r.steps, r.delta);
    auto fixed = EstimateEpsilon(AccountantKind::kFixed, r.q, r.sigma, r.steps, r.delta);
    auto strong = EstimateEpsilon(AccountantKind::kStrong, r.q, r.sigma, r.steps, r.delta);
    std::printf("| %s | %.4g | %.3g | %lld | %.0e | %.4f | %.4f | %.4f | %.4f | %.4f |\n",
                r.name, r.q, r.sigma, static_cast<long long>(r.steps), r.delta, rdp->epsilon,
                *rdp->epsilon_classic, pld->epsilon, fixed->epsilon, strong->epsilon);
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
  auto fixed = FixedScheduleAccountant::Create(0.1, 2.0);
  const double fresh =
      MicrosPerCall(20, [&](int i) { (void)fixed->Epsilon(1000 + i, 1e-5); });
  const double repeat =
      MicrosPerCall(2000, [&](int i) { (void)fixed->Epsilon(1000 + i % 20, 1e-5); });
  std::printf("| fixed schedule, new step count (PLD + RDP) | %.1f |\n", fresh);
  std::printf("| fixed schedule, memoised | %.3f |\n", repeat);
  auto weights = DesignFilterWeights(0.1, 2.0, 1e-5, 4.0, 0);
  RdpAccountant filter;
  (void)filter.SetFilterWeights(*weights);
  (void)filter.Compose(0.1, 2.0, 100);
  const double adaptive = MicrosPerCall(2000, [&](int) {
    (void)filter.CheckCeiling(0.1, 2.0, 1, 1e-5, 4.0, RdpConversion::kImproved,
                              Adaptivity::kAdaptiveFilter);
  });
  std::printf("| adaptive filter, cached step curve | %.2f |\n", adaptive);
}

}  // namespace

int main() {
  StepsTable();
  PaperTable();
  CheckCostTable();
  return 0;
}
