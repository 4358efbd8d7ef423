// The privacy ledger: the durable record of spent budget (docs/privacy_accounting.md, docs/ledger_format.md).
//
// One file, `<state directory>/ledger`, holding everything needed to resume
// without ever undercounting ε or mixing runs:
//   * identity: a random run id (a checkpoint must carry the same one), the
//     model type and fingerprint (type, dimensions, vocabulary), the source
//     kind (kafka | file);
//   * t, the next step number, and the accounting mode;
//   * every parameter the charged ε depends on besides the charges: the
//     ceiling, δ, the privacy unit and its cap, the schedule;
//   * the noise history: how many steps ran private (σ > 0, secure noise),
//     non-private (σ = 0) or with fixed-seed noise (NOT private), and the
//     first step of each kind that is not private — a private run refuses a
//     state directory whose model ever took an un-noised step;
//   * the slot clock and the per-stream cuts that define every step's
//     candidate window (core/svi/slot_windows.h), from which a restarted
//     daemon knows where to resume reading;
//   * the accountants (the global RDP accountant; in residency mode the
//     per-record window accountant) and the highest budget warning already
//     announced.
// Format: docs/ledger_format.md (text, version 3, sections with explicit
// byte lengths, BLAKE2b-256 checksum of the whole).
//
// Durability: Commit() replaces the file atomically and durably — write
// `ledger.tmp`, fsync it, rename over `ledger`, fsync the directory — so the
// file on disk is always one complete committed state. The daemon commits a
// step's charge BEFORE it publishes the release that step produced, so a
// crash at any point can lose a release but never undercount ε.
//
// Failure: Decode() refuses, with DATA_LOSS naming the file, anything that is
// not exactly a version-7, 6, 5 or 4 ledger (or a version-3 one, read as
// schedule adaptive): a corrupt, truncated or checksum-mismatching
// file, counters beyond 2^53 (far from int64 overflow in any later sum), and
// the older versions 1 (no checksum) and 2 (no run id or noise history) —
// never a silent restart from zero. Open() takes an exclusive lock (flock on
// `<dir>/lock`) for the Ledger's lifetime, so two daemons can never spend one
// budget from the same state directory; a held lock is FAILED_PRECONDITION
// naming the directory.
//
// Privacy: only public values are stored (identity, step counter, noise
// mode counts, q/σ history as RDP per order, stream offsets — stream volume
// is public). No record content and nothing computed from records.
//
// Thread-safety: one Ledger per state directory, used from the step thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/base/status.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/residency_accountant.h"
#include "core/svi/slot_windows.h"

namespace vipsd::daemon {

enum class AccountingMode { kGlobal, kResidency };
// privacy.schedule of the state directory (config.h). Ledgers of version 3
// predate the key and read as kAdaptive (their mode is kept).
enum class ScheduleKind { kFixed, kAdaptive };
std::string_view ScheduleKindName(ScheduleKind kind);  // "fixed" | "adaptive"
enum class SourceKind { kKafka, kFile };

std::string_view AccountingModeName(AccountingMode mode);  // "global" | "residency"
std::string_view SourceKindName(SourceKind kind);          // "kafka" | "file"

// Steps by noise mode. Only `private_steps` carry a DP guarantee.
struct NoiseHistory {
  int64_t private_steps = 0;           // σ > 0, secure noise
  int64_t non_private_steps = 0;       // σ = 0: the exact statistic
  int64_t first_non_private_step = 0;  // 0 = none
  int64_t fixed_seed_steps = 0;        // σ > 0 with reproducible noise: NOT private
  int64_t first_fixed_seed_step = 0;   // 0 = none
  bool operator==(const NoiseHistory& other) const = default;
};

struct LedgerState {
  std::string run_id;             // 32 lowercase hex, random per state directory
  std::string model_type;         // "lda" | "blr" | "sbn"
  std::string model_fingerprint;  // 64 lowercase hex (daemon/setup/model_setup.h)
  SourceKind source = SourceKind::kKafka;
  int64_t next_step = 1;
  AccountingMode mode = AccountingMode::kGlobal;
  // kFixed pins (q, σ) for every private step of the directory.
  ScheduleKind schedule = ScheduleKind::kAdaptive;
  privacy::SampledGaussian fixed_step;  // kFixed only
  NoiseHistory noise;
  // Highest budget-warning fraction already announced (so a restart does not
  // repeat warnings); public.
  double warning_level = 0;
  // The ε ceiling this directory is held to: it can only go down (a start or
  // a reload with a higher privacy.epsilon_ceiling is refused; a lower one
  // lowers it), because the adaptive filter's budgets must be fixed before
  // the first release. 0: not recorded yet (a new directory, a non-private
  // one, or a ledger written before version 5; the next private start
  // records its configured ceiling).
  double epsilon_ceiling = 0;
  // The δ every ε of this directory is stated at (privacy.delta): recorded
  // at the first private start and only ever lowered (a start with a larger
  // δ is refused: it would make every past charge smaller; a smaller one is
  // recorded before the first step under it). Every ε the daemon, `vipsd
  // status` and the adaptive filter compute for the directory uses it. 0:
  // not recorded (a new or never-private directory, or a ledger before
  // version 7; the next private start records its configured δ, loudly).
  double delta = 0;
  // The privacy unit this directory's budget protects (privacy.unit;
  // docs/privacy_accounting.md "The privacy unit"): "record", "key" or
  // "field" (then unit_field names the JSON key), and the per-step cap of
  // a unit's records (0 for "record"). Fixed for the directory. A ledger
  // before version 6 is "record"; Encode writes version 6 only for a unit.
  std::string unit = "record";
  std::string unit_field;
  int64_t max_records_per_unit = 0;
  // A federated holder's directory: the aggregator run (32 lowercase hex:
  // the aggregator's run id) whose rounds it masks — its pads are bound to
  // it (core/privacy/mechanisms/secure_aggregation.h) and the directory serves no
  // other; recorded with its first round. Empty otherwise. Version 7 only.
  std::string federation_run;
  // The slot clock and the cuts of every input stream.
  svi::SlotWindows windows;
  // Every private step ever run. In global mode this is the budget of record;
  // in residency mode it is informational (what global accounting would say).
  privacy::RdpAccountant accountant;
  // Residency mode only.
  std::optional<privacy::ResidencyAccountant> residency;
};

// A fresh random run id (32 lowercase hex from the operating system's CSPRNG).
StatusOr<std::string> NewRunId();
// Whether `id` has that form.
bool IsRunId(const std::string& id);

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
  // Parses bytes written by Encode; `where` (the path) labels every error.
  static StatusOr<LedgerState> Decode(const std::string& bytes, const std::string& where);

 private:
  Ledger(std::string directory, int lock_fd);
  std::string directory_;
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace vipsd::daemon
