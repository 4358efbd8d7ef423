// The ε a state directory has spent, from its ledger and δ alone.
//
// What it is: the one function behind every statement of spent budget — the
// daemon's charge check and its budget metrics, the release manifest's
// `epsilon_spent` and `accountant`, and `vipsd status`. Global mode: the
// fixed-schedule accountant (min of PLD and RDP for the ledger's pinned
// q, σ) for schedule fixed, else the RDP privacy filter with the ledger's
// δ split. Residency mode: the worst per-record window ε so far (computed
// at the δ the daemon ran with; `delta` is not used).
//
// Privacy: reads public values only (step counts, (q, σ) history, orders).
// Failure: INVALID_ARGUMENT for δ outside (0, 1); the accountants' errors.
#pragma once

#include <string>

#include "core/base/status.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "daemon/state/ledger.h"

namespace vipsd::daemon {

struct SpentBudget {
  double epsilon = 0;
  // Manifest and metric names: "fixed_pld" | "fixed_rdp" | "rdp_filter" |
  // "residency_fixed" | "residency_rdp_filter".
  std::string accountant;
  // How RDP became (ε, δ): "pld_pessimistic" | "rdp_improved" |
  // "pld_or_rdp_improved".
  std::string conversion;
};

// `fixed` may carry the fixed-schedule accountant of the ledger's (q, σ)
// (it memoises; the daemon keeps one); null builds one from the ledger.
StatusOr<SpentBudget> LedgerSpent(const LedgerState& state, double delta,
                                  const privacy::FixedScheduleAccountant* fixed = nullptr);

}  // namespace vipsd::daemon
