#include "daemon/state/budget.h"

#include <optional>

#include "core/privacy/accounting/rdp_accountant.h"

namespace vipsd::daemon {

StatusOr<SpentBudget> LedgerSpent(const LedgerState& state, double delta,
                                  const privacy::FixedScheduleAccountant* fixed) {
  const bool fixed_schedule = state.schedule == ScheduleKind::kFixed;
  SpentBudget spent;
  if (state.mode == AccountingMode::kResidency) {
    if (!state.residency.has_value()) {
      return FailedPreconditionError("residency ledger without a residency accountant");
    }
    spent.epsilon = state.residency->worst_epsilon();
    spent.accountant = fixed_schedule ? "residency_fixed" : "residency_rdp_filter";
    spent.conversion = fixed_schedule ? "pld_or_rdp_improved" : "rdp_improved";
    return spent;
  }
  if (!(delta > 0 && delta < 1)) return InvalidArgumentError("delta must be in (0, 1)");
  if (fixed_schedule) {
    std::optional<privacy::FixedScheduleAccountant> built;
    if (fixed == nullptr) {
      VIPSD_ASSIGN_OR_RETURN(built, privacy::FixedScheduleAccountant::Create(state.fixed_step));
      fixed = &*built;
    }
    VIPSD_ASSIGN_OR_RETURN(const privacy::ScheduleEpsilon at,
                           fixed->Epsilon(state.accountant.steps(), delta));
    spent.epsilon = at.epsilon;
    spent.accountant = std::string("fixed_") + at.accountant();
    spent.conversion = spent.accountant == "fixed_pld" ? "pld_pessimistic" : "rdp_improved";
    return spent;
  }
  VIPSD_ASSIGN_OR_RETURN(const auto at,
                         state.accountant.GetEpsilon(delta, privacy::RdpConversion::kImproved,
                                                     privacy::Adaptivity::kAdaptiveFilter));
  spent.epsilon = at.epsilon;
  spent.accountant = "rdp_filter";
  spent.conversion = "rdp_improved";
  return spent;
}

}  // namespace vipsd::daemon
