#include "daemon/state/ledger_replica.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "core/base/log.h"

namespace vipsd::daemon {
namespace {

constexpr char kComponent[] = "ledger-replica";

// (counter, owner) order.
bool AtLeast(uint64_t epoch, const std::string& owner, uint64_t other_epoch,
             const std::string& other_owner) {
  return epoch > other_epoch || (epoch == other_epoch && owner >= other_owner);
}

std::string EpochText(uint64_t epoch, const std::string& owner) {
  return std::to_string(epoch) + "/" + owner;
}

}  // namespace

StatusOr<std::unique_ptr<LedgerReplica>> LedgerReplica::Create(std::unique_ptr<LedgerLog> log,
                                                               std::string key) {
  if (log == nullptr) return InvalidArgumentError("ledger replica: no log");
  if (key.empty()) return InvalidArgumentError("ledger replica: empty ledger key");
  VIPSD_ASSIGN_OR_RETURN(std::string owner, NewRunId());  // 128 random bits
  return std::unique_ptr<LedgerReplica>(
      new LedgerReplica(std::move(log), std::move(key), std::move(owner)));
}

Status LedgerReplica::ReadTo(int64_t to) {
  if (to <= read_to_) return Status::Ok();
  VIPSD_ASSIGN_OR_RETURN(auto entries, log_->Read(read_to_, to));
  for (const LedgerLogEntry& entry : entries) {
    if (entry.key != key_) continue;
    ++job_entries_;
    const bool valid = AtLeast(entry.epoch, entry.owner, max_epoch_, max_owner_);
    if (valid) {
      max_epoch_ = entry.epoch;
      max_owner_ = entry.owner;
      if (entry.kind == LedgerLogEntry::Kind::kState) last_valid_state_ = entry;
    }
    if (entry.offset == own_offset_) own_valid_ = valid;
    if (epoch_ > 0 && entry.owner != owner_ &&
        AtLeast(entry.epoch, entry.owner, epoch_, owner_) && !fenced_by_.has_value()) {
      fenced_by_ = entry;
    }
  }
  read_to_ = to;
  return Status::Ok();
}

Status LedgerReplica::Fenced(const LedgerLogEntry& by) const {
  return FailedPreconditionError(
      "ledger replica: fenced — another vipsd took over job '" + key_ + "' on " +
      log_->Describe() + " (epoch " + EpochText(by.epoch, by.owner) + " at offset " +
      std::to_string(by.offset) + ", above this process's " + EpochText(epoch_, owner_) +
      "); this process commits and releases nothing more");
}

StatusOr<std::optional<LedgerState>> LedgerReplica::Claim(std::optional<LedgerState> local,
                                                          const std::string& file) {
  if (epoch_ != 0) return FailedPreconditionError("ledger replica: already claimed");
  VIPSD_RETURN_IF_ERROR(ReadToEndFromStart());

  if (max_epoch_ >= kMaxLedgerEpoch) {
    // One more claim would carry an epoch no reader accepts, and every
    // process of the job would refuse the topic from then on.
    return FailedPreconditionError(
        "ledger replica: " + log_->Describe() + " job '" + key_ + "' holds epoch " +
        std::to_string(max_epoch_) + ", the largest a ledger entry may carry; no further claim "
        "is possible (move the job to a new state.ledger_key)");
  }
  LedgerLogEntry claim;
  claim.key = key_;
  claim.kind = LedgerLogEntry::Kind::kClaim;
  claim.epoch = max_epoch_ + 1;
  claim.owner = owner_;
  VIPSD_ASSIGN_OR_RETURN(const int64_t offset, log_->Append(claim));
  own_offset_ = offset;
  own_valid_ = false;
  epoch_ = claim.epoch;
  VIPSD_RETURN_IF_ERROR(ReadTo(offset + 1));
  if (!own_valid_) {
    fenced_ = true;
    lost_claim_race_ = true;
    const std::string winner = EpochText(max_epoch_, max_owner_);
    return UnavailableError("ledger replica: another vipsd claimed job '" + key_ + "' on " +
                            log_->Describe() + " at the same time (epoch " + winner +
                            "); this one does not start (a standby stands by again)");
  }

  return Choose(std::move(local), file, /*announce=*/true);
}

StatusOr<std::optional<LedgerState>> LedgerReplica::Choose(std::optional<LedgerState> local,
                                                           const std::string& file,
                                                           bool announce) {
  restored_from_.clear();
  local_is_record_ = false;
  const auto warn = [&](const std::string& message) {
    if (announce) Log(LogLevel::kWarning, kComponent, message);
  };
  std::optional<LedgerState> remote;
  std::string remote_where;
  if (last_valid_state_.has_value()) {
    remote_where = log_->Describe() + " offset " + std::to_string(last_valid_state_->offset) +
                   " (key '" + key_ + "')";
    VIPSD_ASSIGN_OR_RETURN(LedgerState decoded,
                           Ledger::Decode(last_valid_state_->ledger, remote_where));
    remote = std::move(decoded);
  }
  if (!remote.has_value()) {
    // No state of record yet: this directory's lineage becomes it.
    local_is_record_ = true;
    return local;
  }
  if (!local.has_value()) {
    restored_from_ = remote_where;
    warn(
        "no ledger in the state directory (" + file + "): the budget of record is restored from " +
            remote_where + ", next_step=" + std::to_string(remote->next_step));
    return remote;
  }
  if (local->run_id != remote->run_id && local->next_step == 1 &&
      local->accountant.steps() == 0 && local->noise == NoiseHistory{}) {
    // A run this directory started but never stepped (e.g. it lost the
    // claim race for a new job and was fenced at its first commit): nothing
    // was charged or released under it, so the record simply replaces it.
    restored_from_ = remote_where;
    warn(
        "the ledger " + file + " is of run " + local->run_id +
            ", which never took a step; continuing from the ledger of record on " +
            remote_where + " (run " + remote->run_id + ")");
    return remote;
  }
  if (local->run_id != remote->run_id) {
    return FailedPreconditionError(
        "the ledger " + file + " (run " + local->run_id + ") is not the job's ledger of record on " +
        remote_where + " (run " + remote->run_id +
        "): another state directory, or another job with the same state.ledger_key; refusing "
        "to mix budgets");
  }
  local_is_record_ = Ledger::Encode(*local) == last_valid_state_->ledger;
  if (!local_is_record_) {
    restored_from_ = remote_where;
    warn(
        "the ledger " + file + " (next_step=" + std::to_string(local->next_step) +
            ") differs from the ledger of record on " + remote_where +
            " (next_step=" + std::to_string(remote->next_step) +
            "): continuing from the ledger of record (a stale disk or backup, or steps of this "
            "directory that were never confirmed and never released)");
  }
  return remote;
}

StatusOr<std::optional<LedgerState>> LedgerReplica::Peek(std::optional<LedgerState> local,
                                                         const std::string& file) {
  if (epoch_ != 0) return FailedPreconditionError("ledger replica: already claimed");
  VIPSD_RETURN_IF_ERROR(ReadToEndFromStart());
  return Choose(std::move(local), file, /*announce=*/false);
}

Status LedgerReplica::ReadToEndFromStart() {
  VIPSD_ASSIGN_OR_RETURN(auto bounds, log_->Bounds());
  if (bounds.first > 0) {
    return FailedPreconditionError(
        log_->Describe() + " has lost its beginning (first offset " + std::to_string(bounds.first) +
        " > 0): entries that fenced earlier owners may be gone, so the budget of record cannot "
        "be established; the ledger topic needs unlimited retention (retention.ms=-1, "
        "retention.bytes=-1, cleanup.policy=delete)");
  }
  return ReadTo(bounds.second);
}

Status LedgerReplica::AwaitSilence(std::chrono::milliseconds silence,
                                   const std::function<bool()>& stop,
                                   const std::function<int64_t()>& activity) {
  if (epoch_ != 0) return FailedPreconditionError("ledger replica: already claimed");
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_seen = Clock::now();  // an entry of the job, or the start
  size_t seen = 0;
  // While the log cannot be read (a broker restart, a partition without a
  // leader) nothing is known about the owner: the standby neither takes
  // over nor gives up; silence counts again from when a read succeeds.
  std::optional<Clock::time_point> unreadable_since;
  Clock::time_point warned{};
  for (;;) {
    if (stop()) return CancelledError("stopped while standing by");
    StatusOr<std::pair<int64_t, int64_t>> bounds = log_->Bounds();
    Status read = bounds.status();
    if (read.ok()) {
      // Count this job's entries as they arrive (the fold is the one Claim
      // continues from; reading claims nothing).
      const int64_t entries_before = job_entries_;
      read = ReadTo(bounds->second);
      if (read.ok() && job_entries_ > entries_before) {
        last_seen = Clock::now();
        seen += static_cast<size_t>(job_entries_ - entries_before);
      }
    }
    if (activity) {
      const Clock::time_point other{std::chrono::duration_cast<Clock::duration>(
          std::chrono::nanoseconds(activity()))};
      if (other > last_seen) last_seen = other;
    }
    const Clock::time_point now = Clock::now();
    if (read.ok()) {
      if (unreadable_since.has_value()) {
        // The owner may have been unable to commit meanwhile too: a whole
        // silence period from now, not from its last entry.
        last_seen = std::max(last_seen, now);
        Log(LogLevel::kInfo, kComponent,
            "standby: " + log_->Describe() + " readable again after " +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   now - *unreadable_since)
                                   .count()) +
                " ms; silence counts from now");
        unreadable_since.reset();
      }
      if (now - last_seen >= silence) {
        Log(LogLevel::kInfo, kComponent,
            "standby: no entry of job '" + key_ + "' on " + log_->Describe() + " for " +
                std::to_string(silence.count()) + " ms (" + std::to_string(seen) +
                " seen while standing by); taking over");
        return Status::Ok();
      }
    } else {
      if (!unreadable_since.has_value()) unreadable_since = now;
      // Said once the outage lasted a silence period, then once a minute:
      // an operator sees a standby that cannot watch its owner.
      if (now - *unreadable_since >= silence && now - warned >= std::chrono::minutes(1)) {
        warned = now;
        Log(LogLevel::kWarning, kComponent,
            "standby: " + log_->Describe() + " could not be read for " +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   now - *unreadable_since)
                                   .count()) +
                " ms; not taking over while it cannot see the owner (" + read.ToString() + ")");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Status LedgerReplica::ConfirmOwner() {
  if (epoch_ == 0) return FailedPreconditionError("ledger replica: ConfirmOwner before Claim");
  if (!fenced_) {
    VIPSD_ASSIGN_OR_RETURN(auto bounds, log_->Bounds());
    VIPSD_RETURN_IF_ERROR(ReadTo(bounds.second));
    if (fenced_by_.has_value()) fenced_ = true;
  }
  if (fenced_) {
    if (fenced_by_.has_value()) return Fenced(*fenced_by_);
    return FailedPreconditionError("ledger replica: fenced; this process releases nothing more");
  }
  return Status::Ok();
}

Status LedgerReplica::Commit(const LedgerState& state) {
  if (fenced_) {
    if (fenced_by_.has_value()) return Fenced(*fenced_by_);
    return FailedPreconditionError("ledger replica: fenced; this process commits nothing more");
  }
  if (epoch_ == 0) return FailedPreconditionError("ledger replica: Commit before Claim");
  LedgerLogEntry entry;
  entry.key = key_;
  entry.kind = LedgerLogEntry::Kind::kState;
  entry.epoch = epoch_;
  entry.owner = owner_;
  entry.ledger = Ledger::Encode(state);
  VIPSD_ASSIGN_OR_RETURN(const int64_t offset, log_->Append(entry));
  own_offset_ = offset;
  own_valid_ = false;
  VIPSD_RETURN_IF_ERROR(ReadTo(offset + 1));
  if (!own_valid_) {
    fenced_ = true;
    if (fenced_by_.has_value()) return Fenced(*fenced_by_);
    return FailedPreconditionError("ledger replica: this process's entry at offset " +
                                   std::to_string(offset) + " of " + log_->Describe() +
                                   " is not valid; fenced");
  }
  return Status::Ok();
}

}  // namespace vipsd::daemon
