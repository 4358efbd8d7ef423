// FixedScheduleAccountant: ε of a run whose (q, σ) never change — the
// daemon's `privacy.schedule: fixed` (docs/privacy_accounting.md §5a).
//
// With (q, σ) pinned for the lifetime of a state directory, the releases
// after n steps are exactly the first n outputs of a fixed, non-adaptive
// composition of n Poisson-subsampled Gaussian mechanisms. A stop at the
// ceiling is a stop at a step count that depends on public settings only
// (q, σ, δ, the ceiling), and any stop decided from the releases themselves
// (an operator's reload of the ceiling) is a truncation of a longer fixed
// schedule — post-processing of that longer run's transcript. So the plain
// (ε, δ) of n composed steps is the guarantee; no privacy filter and no
// union bound over orders is needed.
//
// ε(n) is the smaller of two valid upper bounds of the same quantity:
//  * PLD (pld_accountant.h), pessimistic connect-the-dots discretisation
//    with Δ = 2^-10 (kScheduleDiscretization): ~15× faster than Δ = 2^-14,
//    so it can be evaluated every step, and within about 1e-4 of it where
//    one step's loss spans many grid points; at small q it is not (1 % too
//    high at q = 0.001, σ = 0.8, n = 3000; docs/privacy_accounting.md §5a):
//    a safe overcharge, measured by privacy.dp_accounting_oracle;
//  * RDP over the default order grid with the improved conversion at δ
//    (fixed schedule: no δ/|orders| split).
// The minimum of two upper bounds is an upper bound. The daemon, the
// planner (`vipsd-privacy plan --config`), the manifests and the metrics all
// take ε from this class, so they agree to the last digit.
//
// Cost. ε(n) for an n not seen before is a PLD composition (15–17 ms at
// n ≈ 1000–2000 with q = 0.01, σ ≈ 1 on the development machine;
// bench/accounting_table), and the daemon asks for a new n before every
// step. The composed grid widens with n and q: at q = 0.1, σ = 1 it took
// about 30 ms at n ≤ 20, 70 ms at n = 1,000, 200 ms at 10^4 and 780 ms at
// 10^5 (2026-11-29; at q = 0.01, 74 ms at 10^5). Prefetch(n, δ) computes ε(n)
// on a background thread, so that the daemon's check before step n finds
// it memoised: the charge leaves the step's serial path (issue 30). The
// value is the one Epsilon computes (the same function, memoised).
//
// What is private: nothing; only (q, σ, δ, step counts).
// Thread-safety: Epsilon/MaxSteps/Prefetch may be called from several
// threads (the memo is guarded by a mutex). A prefetch still running when
// the last copy of the accountant goes away is waited for.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/base/thread_annotations.h"
#include "core/privacy/accounting/sampled_gaussian.h"

namespace vipsd::privacy {

// Requested PLD grid spacing for the fixed schedule (rounded down to 2^-10).
inline constexpr double kScheduleDiscretization = 1e-3;

struct ScheduleEpsilon {
  double epsilon = 0;    // min(pld, rdp): the charged value
  double pld = 0;        // PLD upper bound
  double rdp = 0;        // RDP upper bound (improved conversion)
  double rdp_order = 0;  // the order achieving `rdp`
  // "pld" or "rdp": which bound gave `epsilon`.
  const char* accountant() const { return pld <= rdp ? "pld" : "rdp"; }
};

class FixedScheduleAccountant {
 public:
  // q ∈ (0, 1], σ > 0.
  static StatusOr<FixedScheduleAccountant> Create(const SampledGaussian& step);

  // ε of `steps` ≥ 0 steps at δ ∈ (0, 1); 0 steps → ε = 0. Memoised.
  StatusOr<ScheduleEpsilon> Epsilon(int64_t steps, double delta) const;

  // The largest n ≤ limit with Epsilon(n) ≤ ceiling (0 if even one step is
  // over). ε(n) is non-decreasing in n for the true privacy profile; the
  // search assumes it for the bounds and verifies the answer's neighbours
  // (ε(n) ≤ ceiling < ε(n + 1)). The daemon does not rely on this search:
  // it checks ε(steps + 1) before every step.
  StatusOr<int64_t> MaxSteps(double delta, double epsilon_ceiling, int64_t limit) const;

  // Starts computing Epsilon(steps, delta) in the background unless it is
  // memoised or a prefetch is still running (then it does nothing: at most
  // one background computation at a time). Errors are not reported here;
  // Epsilon reports them when asked.
  void Prefetch(int64_t steps, double delta) const;

  // The step every step of the schedule is.
  const SampledGaussian& step() const { return step_; }

 private:
  FixedScheduleAccountant(const SampledGaussian& step, std::vector<double> per_step_rdp);

  SampledGaussian step_;
  std::shared_ptr<const std::vector<double>> per_step_rdp_;  // over DefaultRdpOrders()
  struct Memo {
    Mutex mutex;
    std::map<std::pair<int64_t, double>, ScheduleEpsilon> values GUARDED_BY(mutex);
    Mutex prefetch_mutex;  // one Prefetch call at a time
    std::thread prefetch GUARDED_BY(prefetch_mutex);  // joined by ~Memo
    bool prefetching GUARDED_BY(mutex) = false;
    std::pair<int64_t, double> prefetch_key GUARDED_BY(mutex);  // what is being prefetched
    std::condition_variable prefetched;  // notified (under mutex) when prefetching ends
    ~Memo();                             // joins `prefetch`
  };
  // ε(steps) from the settings alone (no memo).
  static StatusOr<ScheduleEpsilon> Compute(const SampledGaussian& step,
                                           const std::vector<double>& per_step_rdp,
                                           int64_t steps, double delta);
  static void Store(Memo& memo, int64_t steps, double delta, const ScheduleEpsilon& value);
  std::shared_ptr<Memo> memo_;
};

}  // namespace vipsd::privacy
