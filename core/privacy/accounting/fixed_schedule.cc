#include "core/privacy/accounting/fixed_schedule.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "core/privacy/accounting/pld_accountant.h"
#include "core/privacy/accounting/rdp.h"

namespace vipsd::privacy {

StatusOr<FixedScheduleAccountant> FixedScheduleAccountant::Create(const SampledGaussian& step) {
  if (const Status valid = ValidateSampledGaussian(step, /*require_noise=*/true); !valid.ok()) {
    return InvalidArgumentError("fixed schedule: " + std::string(valid.message()));
  }
  VIPSD_ASSIGN_OR_RETURN(auto curve, SampledGaussianRdpCurve(step.sampling_rate,
                                                             step.noise_multiplier,
                                                             DefaultRdpOrders()));
  return FixedScheduleAccountant(step, std::move(curve));
}

FixedScheduleAccountant::FixedScheduleAccountant(const SampledGaussian& step,
                                                 std::vector<double> per_step_rdp)
    : step_(step),
      per_step_rdp_(std::make_shared<const std::vector<double>>(std::move(per_step_rdp))),
      memo_(std::make_shared<Memo>()) {}

FixedScheduleAccountant::Memo::~Memo() {
  if (prefetch.joinable()) prefetch.join();
}

StatusOr<ScheduleEpsilon> FixedScheduleAccountant::Compute(const SampledGaussian& step,
                                                           const std::vector<double>& per_step_rdp,
                                                           int64_t steps, double delta) {
  ScheduleEpsilon out;
  PldOptions options;
  options.discretization = kScheduleDiscretization;
  VIPSD_ASSIGN_OR_RETURN(out.pld,
                         PldEpsilon(step.sampling_rate, step.noise_multiplier, steps, delta,
                                    options));
  const std::vector<double>& orders = DefaultRdpOrders();
  std::vector<double> rdp(orders.size());
  for (size_t i = 0; i < orders.size(); ++i) {
    rdp[i] = per_step_rdp[i] * static_cast<double>(steps);
  }
  VIPSD_ASSIGN_OR_RETURN(const EpsilonAtOrder at,
                         EpsilonFromRdp(orders, rdp, delta, RdpConversion::kImproved));
  out.rdp = at.epsilon;
  out.rdp_order = at.order;
  out.epsilon = std::min(out.pld, out.rdp);
  return out;
}

void FixedScheduleAccountant::Store(Memo& memo, int64_t steps, double delta,
                                    const ScheduleEpsilon& value) {
  MutexLock lock(&memo.mutex);
  // A bounded memo: the daemon asks for n and n + 1, the planner a few
  // dozen points of a search.
  if (memo.values.size() > 4096) memo.values.clear();
  memo.values.emplace(std::make_pair(steps, delta), value);
}

StatusOr<ScheduleEpsilon> FixedScheduleAccountant::Epsilon(int64_t steps, double delta) const {
  if (!(delta > 0.0 && delta < 1.0)) return InvalidArgumentError("delta must be in (0, 1)");
  if (steps < 0) return InvalidArgumentError("steps must be >= 0");
  if (steps == 0) return ScheduleEpsilon{};
  {
    // A prefetch of this very value is waited for rather than computed a
    // second time beside it (both would take the same seconds of CPU).
    MutexLock lock(&memo_->mutex);
    const std::pair<int64_t, double> key{steps, delta};
    while (memo_->prefetching && memo_->prefetch_key == key) lock.Wait(memo_->prefetched);
    const auto it = memo_->values.find(key);
    if (it != memo_->values.end()) return it->second;
  }
  VIPSD_ASSIGN_OR_RETURN(
      const ScheduleEpsilon out,
      Compute(step_, *per_step_rdp_, steps, delta));
  Store(*memo_, steps, delta, out);
  return out;
}

void FixedScheduleAccountant::Prefetch(int64_t steps, double delta) const {
  if (!(delta > 0.0 && delta < 1.0) || steps <= 0) return;
  Memo& memo = *memo_;
  MutexLock one_at_a_time(&memo.prefetch_mutex);
  {
    MutexLock lock(&memo.mutex);
    if (memo.prefetching || memo.values.count({steps, delta}) > 0) return;
    memo.prefetching = true;
    memo.prefetch_key = {steps, delta};
  }
  // The previous prefetch has finished (prefetching was false): join it
  // before its std::thread is replaced (under prefetch_mutex).
  if (memo.prefetch.joinable()) memo.prefetch.join();
  // The thread uses the memo by reference: ~Memo joins it first.
  memo.prefetch = std::thread([&memo, step = step_, curve = per_step_rdp_, steps, delta] {
    auto value = Compute(step, *curve, steps, delta);
    if (value.ok()) Store(memo, steps, delta, *value);
    MutexLock lock(&memo.mutex);
    memo.prefetching = false;
    memo.prefetched.notify_all();
  });
}

StatusOr<int64_t> FixedScheduleAccountant::MaxSteps(double delta, double epsilon_ceiling,
                                                    int64_t limit) const {
  if (!(epsilon_ceiling > 0.0) || !std::isfinite(epsilon_ceiling)) {
    return InvalidArgumentError("epsilon ceiling must be finite and > 0");
  }
  if (limit < 1) return InvalidArgumentError("limit must be >= 1");
  auto within = [&](int64_t n) -> StatusOr<bool> {
    VIPSD_ASSIGN_OR_RETURN(const ScheduleEpsilon e, Epsilon(n, delta));
    return e.epsilon <= epsilon_ceiling;
  };
  VIPSD_ASSIGN_OR_RETURN(const bool one, within(1));
  if (!one) return int64_t{0};
  // Exponential search for an n over the ceiling, then bisection.
  int64_t good = 1, bad = 0;
  for (int64_t n = 2;; n = n > limit / 2 ? limit : n * 2) {
    VIPSD_ASSIGN_OR_RETURN(const bool ok, within(n));
    if (!ok) {
      bad = n;
      break;
    }
    good = n;
    if (n == limit) return limit;
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    VIPSD_ASSIGN_OR_RETURN(const bool ok, within(mid));
    (ok ? good : bad) = mid;
  }
  return good;
}

}  // namespace vipsd::privacy
