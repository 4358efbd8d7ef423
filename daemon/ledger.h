// The privacy ledger: the durable record of spent budget (DESIGN.md 4, 5).
//
// One file, `<state directory>/ledger`, holding everything needed to resume
// without ever undercounting ε: the next step number t, the accounting mode,
// the global RDP accountant (every private step ever run), in residency mode
// the per-record window accountant and the arrival history, the offsets from
// which the pool is rebuilt after a restart, and the highest budget-warning
// level already announced. Format: docs/ledger_format.md (text, versioned,
// sections with explicit byte lengths, BLAKE2b-256 checksum of the whole).
//
// Durability: Commit() replaces the file atomically and durably — write
// `ledger.tmp`, fsync it, rename over `ledger`, fsync the directory — so the
// file on disk is always one complete committed state. The daemon commits a
// step's charge BEFORE it publishes the release that step produced, so a
// crash at any point can lose a release but never undercount ε.
//
// Failure: Load() refuses a corrupt, truncated or checksum-mismatching
// ledger with DATA_LOSS ("refusing to start from zero") rather than starting
// a fresh budget; an absent ledger in an otherwise empty state directory
// means a fresh run. Open() takes an exclusive lock (flock on
// `<dir>/lock`) for the Ledger's lifetime, so two daemons can never spend
// one budget from the same state directory; a held lock is
// FAILED_PRECONDITION naming the directory.
//
// Privacy: only public values are stored (step counter, q, σ history as RDP
// per order, stream offsets — stream volume is public). No record content
// and nothing computed from records.
//
// Thread-safety: one Ledger per state directory, used from the step thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/base/status.h"
#include "core/privacy/rdp_accountant.h"
#include "core/privacy/residency_accountant.h"
#include "core/svi/record_pool.h"

namespace vipsd::daemon {

enum class AccountingMode { kGlobal, kResidency };

std::string_view AccountingModeName(AccountingMode mode);  // "global" | "residency"

struct LedgerState {
  int64_t next_step = 1;
  AccountingMode mode = AccountingMode::kGlobal;
  // Every private step ever run. In global mode this is the budget of record;
  // in residency mode it is informational (what global accounting would say).
  privacy::RdpAccountant accountant;
  // Residency mode only.
  std::optional<privacy::ResidencyAccountant> residency;
  svi::ArrivalHistory arrivals;
  // Per input stream ("topic:partition"): the first offset to re-read after a
  // restart (the lowest pooled offset at the commit, or the next unread one).
  std::map<std::string, int64_t> resume_offsets;
  // Highest budget-warning fraction already announced (so a restart does not
  // repeat warnings); public.
  double warning_level = 0;
};

class Ledger {
 public:
  // Creates the directory (mode 0700) if needed and locks it.
  static StatusOr<Ledger> Open(const std::string& directory);

  Ledger(Ledger&& other) noexcept;
  Ledger& operator=(Ledger&& other) noexcept;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger();

  // The committed state, or nullopt if no ledger exists yet.
  StatusOr<std::optional<LedgerState>> Load() const;

  // Atomically and durably replaces the ledger.
  Status Commit(const LedgerState& state) const;

  const std::string& path() const { return path_; }
  const std::string& directory() const { return directory_; }

  // The exact bytes Commit writes (tests, docs).
  static std::string Encode(const LedgerState& state);
  // Parses bytes written by Encode (or a version-1 ledger); `where` labels
  // errors.
  static StatusOr<LedgerState> Decode(const std::string& bytes, const std::string& where);

 private:
  Ledger(std::string directory, int lock_fd);
  std::string directory_;
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace vipsd::daemon
