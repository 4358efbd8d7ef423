// The privacy ledger: the durable record of spent budget.
//
// One file, `<state directory>/ledger`, holding the next step number t and
// the RDP accountant's exact state (rdp_accountant.h). Commit() replaces it
// atomically and durably: write `ledger.tmp`, fsync it, rename over
// `ledger`, fsync the directory. The daemon commits the step's charge
// BEFORE it publishes the release that step produced, so a crash at any
// point can lose a release but never undercount ε (DESIGN.md 5). Load()
// refuses a corrupt or truncated ledger (DATA_LOSS) rather than starting
// from zero; an absent ledger means a fresh run.
//
// Only public values are stored (step counter, q, σ history as RDP per
// order); no record content and nothing computed from records.
//
// Thread-safety: one Ledger per state directory, used from the step thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/base/status.h"
#include "core/privacy/rdp_accountant.h"

namespace vipsd::daemon {

struct LedgerState {
  int64_t next_step = 1;
  privacy::RdpAccountant accountant;
};

class Ledger {
 public:
  // Creates the directory (mode 0700) if it does not exist.
  static StatusOr<Ledger> Open(const std::string& directory);

  // The committed state, or nullopt if no ledger exists yet.
  StatusOr<std::optional<LedgerState>> Load() const;

  // Atomically and durably replaces the ledger.
  Status Commit(const LedgerState& state) const;

  const std::string& path() const { return path_; }

 private:
  explicit Ledger(std::string directory);
  std::string directory_;
  std::string path_;
};

}  // namespace vipsd::daemon
