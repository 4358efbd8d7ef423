// LedgerReplica: the ledger of record beyond one disk (issue 16).
//
// With `state.ledger_topic` set, every ledger commit is also appended to a
// one-partition Kafka topic (entries keyed by `state.ledger_key`), and the
// commit counts — the release it covers may leave — only once the entry is
// durable there (acks=all) AND this process is confirmed to still own the
// job's ledger. The local file stays: it is the fast copy a restart reads
// first. A daemon whose disk is lost restores the budget from the topic; a
// daemon restarted from a stale disk (a restored backup) continues from the
// topic's state; never from zero and never from less than what was
// released. (The model checkpoint is resumed only next to a local ledger
// that is byte for byte the state of record; otherwise the model restarts
// from its prior — see Claim.)
//
// Ownership (fencing). Only one process may charge a job's budget at a
// time, and a paused process that lost the job must not release anything
// afterwards. The topic's log order decides, with no other consensus:
//   * every entry carries an epoch (counter, owner id); epochs are ordered
//     by counter, then owner id (128 random bits per process start);
//   * an entry is VALID iff its epoch is ≥ every epoch of the job's entries
//     before it in the log; the state of record is the last valid STATE
//     entry;
//   * a process takes the job by reading the log to its end, appending a
//     CLAIM entry (no state) with counter = highest counter + 1, and reading
//     the log up to its claim: if the claim is not valid another process
//     claimed first (start-up fails); otherwise the last valid state entry
//     before the claim is the budget of record it continues from (or its
//     local file, if that belongs to the same run and is ahead — only steps
//     never released can be there, see below);
//   * each commit appends a STATE entry under the process's epoch and reads
//     the log up to it; if a higher claim came before it, the process is
//     FENCED: the commit fails, nothing of that step leaves, and the daemon
//     stops with an error (sticky: a fenced replica never commits again);
//   * right before a release leaves, ConfirmOwner reads the log to its end
//     again (a process paused between its commit and its release's
//     deadline finds the claim that replaced it and releases nothing).
// Why no budget is lost: a release leaves only after its state entry was
// confirmed valid, i.e. before any later claim in the log; a new owner reads
// the log up to its own claim, so it sees — and continues from — every
// entry whose release may have left. Entries after its claim (a paused
// owner's) are invalid, and their writers, which read up to them before
// releasing, never release them. A local file that differs from the
// state of record is never used: if it is ahead, its extra steps' entries
// never became durable and valid, so none of them was released.
//
// What this needs of the topic: one partition, `cleanup.policy=delete` with
// unlimited retention (`retention.ms=-1`, `retention.bytes=-1`): start-up
// reads it from the beginning and refuses a log whose beginning was deleted
// (an entry that fenced others could be gone). Not compacted: compaction
// keeps the last entry per key, which may be a fenced one. The topic holds
// no record content, but its slot-window cuts are the stream's volume slot
// by slot: give it the read access control of the other telemetry
// (SECURITY.md). Whoever can write to it can fence the daemon or claim its
// job: give write access to vipsd alone. Entries are appended at each
// slot's public deadline (daemon.h), never when a step finished.
//
// Thread-safety: used from the daemon's step thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "daemon/state/ledger.h"

namespace vipsd::daemon {

// The largest epoch counter an entry may carry (15 decimal digits, as the
// Kafka log's reader accepts); a claim that would exceed it is refused.
inline constexpr uint64_t kMaxLedgerEpoch = 999'999'999'999'999;

// One entry of the ledger log.
struct LedgerLogEntry {
  int64_t offset = -1;   // set by the log
  std::string key;       // the job (state.ledger_key)
  enum class Kind { kClaim, kState };
  Kind kind = Kind::kState;
  uint64_t epoch = 0;    // counter
  std::string owner;     // 32 lowercase hex
  std::string ledger;    // Ledger::Encode bytes (kState); empty for kClaim
};

// The transport: an append-only, totally ordered, durable log (a Kafka
// topic's partition 0 in production; tests may use memory).
class LedgerLog {
 public:
  virtual ~LedgerLog() = default;
  // "Kafka topic T partition 0" — for messages.
  virtual std::string Describe() const = 0;
  // The first offset still in the log and the offset the next append gets.
  virtual StatusOr<std::pair<int64_t, int64_t>> Bounds() = 0;
  // Every entry with offset in [from, to), in log order (entries that do
  // not parse are DATA_LOSS naming the offset; entries of other keys are
  // returned too: the caller filters).
  virtual StatusOr<std::vector<LedgerLogEntry>> Read(int64_t from, int64_t to) = 0;
  // Appends durably; returns the entry's offset.
  virtual StatusOr<int64_t> Append(const LedgerLogEntry& entry) = 0;
};

class LedgerReplica {
 public:
  // `key`: the job whose ledger this is.
  static StatusOr<std::unique_ptr<LedgerReplica>> Create(std::unique_ptr<LedgerLog> log,
                                                         std::string key);

  // Takes the job (see above). `local` is the state directory's ledger
  // (nullopt if none), `file` its path for messages. Returns the state to
  // continue from: the topic's state of record if there is one (the local
  // file is only a cache: a file that differs from it is stale, or holds
  // steps that were never confirmed and never released), else `local`, or
  // nullopt for a new job. Refuses a local ledger of another run and a log
  // whose beginning is gone (FAILED_PRECONDITION naming the topic and key),
  // and a lost claim race (UNAVAILABLE: another process owns the job now;
  // a standby may stand by again).
  //
  // local_is_record() then says whether the local file IS the state of
  // record (byte for byte) or there is none yet: only then may the local
  // model checkpoint be resumed. Otherwise its model may contain a step of
  // another lineage (a step this directory ran after another process took
  // the job) that the record does not charge, so the model restarts from
  // its prior while the budget continues.
  StatusOr<std::optional<LedgerState>> Claim(std::optional<LedgerState> local,
                                             const std::string& file);

  // What Claim would continue from if nothing is appended meanwhile — the
  // same choice and the same refusals — without claiming anything: the
  // daemon checks it against its configuration first, so that a
  // misconfigured process refuses before it fences a healthy owner.
  StatusOr<std::optional<LedgerState>> Peek(std::optional<LedgerState> local,
                                            const std::string& file);

  // Hot standby (state.standby_takeover_seconds): returns OK once no entry
  // of the job has appeared on the log for `silence` — counted from when
  // this call started watching or from the last entry it saw, whichever is
  // later — so that Claim can take over from an owner that stopped
  // committing (dead, paused or partitioned away; a live owner commits every
  // slot). CANCELLED as soon as `stop()` returns true. While the log cannot
  // be read it keeps waiting (a standby does not take over blindly, nor
  // does it give up: a broker restart is routine), with a warning once the
  // outage lasted `silence` and once a minute after; silence then counts
  // from the first successful read. Call before Claim.
  // `activity`, if given, is the steady-clock time (ns since its epoch; 0:
  // none) of the owner's last other sign of life — a working standby's last
  // plan from the coordinator (daemon/io/work_exchange.h), so that a
  // coordinator waiting for partial sums is not taken over.
  Status AwaitSilence(std::chrono::milliseconds silence, const std::function<bool()>& stop,
                      const std::function<int64_t()>& activity = {});

  // Appends `state` under this process's epoch and confirms the process
  // still owns the job. FAILED_PRECONDITION "fenced" (sticky) if another
  // process claimed it; UNAVAILABLE if the log cannot be written or read in
  // time (the daemon retries). Claim must have succeeded.
  Status Commit(const LedgerState& state);

  // Reads the log to its end: FAILED_PRECONDITION "fenced" (sticky) if
  // another process claimed the job above this one's epoch. The daemon calls
  // it right before a release leaves (a claim after the release's commit
  // was confirmed means a standby took over while this process was paused).
  Status ConfirmOwner();

  // True when Claim lost a simultaneous claim (or the owner could not be
  // established because another process claimed at the same time): the
  // caller may stand by again with a new replica.
  bool lost_claim_race() const { return lost_claim_race_; }

  bool local_is_record() const { return local_is_record_; }
  bool fenced() const { return fenced_; }
  uint64_t epoch() const { return epoch_; }
  const std::string& owner() const { return owner_; }
  // What restoring chose, for the start-up log line ("" when the local file
  // was used or the job is new).
  const std::string& restored_from() const { return restored_from_; }

 private:
  LedgerReplica(std::unique_ptr<LedgerLog> log, std::string key, std::string owner)
      : log_(std::move(log)), key_(std::move(key)), owner_(std::move(owner)) {}
  // Folds the log's entries in [read_to_, to) into the running state.
  Status ReadTo(int64_t to);
  // Refuses a log whose beginning is gone, then reads it to its end.
  Status ReadToEndFromStart();
  // The choice between the local file and the state of record (see Claim).
  StatusOr<std::optional<LedgerState>> Choose(std::optional<LedgerState> local,
                                              const std::string& file, bool announce);
  Status Fenced(const LedgerLogEntry& by) const;

  std::unique_ptr<LedgerLog> log_;
  std::string key_;
  std::string owner_;
  uint64_t epoch_ = 0;  // 0 until claimed
  bool fenced_ = false;
  std::string restored_from_;
  bool local_is_record_ = false;
  bool lost_claim_race_ = false;
  // Fold state over the log read so far (this key only).
  int64_t read_to_ = 0;
  int64_t job_entries_ = 0;  // entries of this key read so far
  uint64_t max_epoch_ = 0;
  std::string max_owner_;
  std::optional<LedgerLogEntry> last_valid_state_;
  std::optional<LedgerLogEntry> fenced_by_;  // the claim that fenced us, if any
  int64_t own_offset_ = -1;     // offset of our last appended entry
  bool own_valid_ = false;      // it was valid when read back
};

}  // namespace vipsd::daemon
