#include "daemon/state/ledger_replica.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tests/testing/memory_ledger_log.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;

LedgerState Steps(int64_t steps, const std::string& run = "0123456789abcdef0123456789abcdef") {
  LedgerState state;
  state.run_id = run;
  state.model_type = "lda";
  state.model_fingerprint = std::string(64, 'a');
  state.next_step = steps + 1;
  state.noise.private_steps = steps;
  if (steps > 0) {
    EXPECT_TRUE(state.accountant.Compose({0.01, 1.1}, steps).ok());
  }
  return state;
}

std::unique_ptr<LedgerReplica> Process(MemoryLog& log, const std::string& key = "job") {
  auto replica = LedgerReplica::Create(std::make_unique<MemoryLedgerLog>(&log), key);
  EXPECT_TRUE(replica.ok());
  return std::move(replica).value();
}

TEST(LedgerReplicaTest, ALostDiskRestoresTheBudgetOfRecordNeverZero) {
  MemoryLog log;
  auto a = Process(log);
  auto fresh = a->Claim(std::nullopt, "/a/ledger");
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->has_value());  // a new job
  EXPECT_TRUE(a->local_is_record());
  ASSERT_TRUE(a->Commit(Steps(1)).ok());
  ASSERT_TRUE(a->Commit(Steps(2)).ok());
  a.reset();  // the machine is gone

  auto b = Process(log);
  auto restored = b->Claim(std::nullopt, "/b/ledger");
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->next_step, 3);
  EXPECT_EQ((*restored)->accountant, Steps(2).accountant);
  EXPECT_FALSE(b->local_is_record());  // no checkpoint may be resumed
  EXPECT_THAT(b->restored_from(), HasSubstr("offset 2"));
}

// Every epoch a reader accepts can be claimed above, or the claim is
// refused before it writes an entry no reader accepts (issue 27).
TEST(LedgerReplicaTest, AClaimAboveTheLargestEpochIsRefusedAndWritesNothing) {
  MemoryLog log;
  LedgerLogEntry top;
  top.key = "job";
  top.kind = LedgerLogEntry::Kind::kClaim;
  top.epoch = kMaxLedgerEpoch;
  top.owner = std::string(32, 'a');
  top.offset = 0;
  log.entries.push_back(top);
  auto a = Process(log);
  auto claimed = a->Claim(std::nullopt, "/a/ledger");
  EXPECT_EQ(claimed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(claimed.status().message(), HasSubstr("999999999999999"));
  EXPECT_EQ(log.entries.size(), 1u);
  // One below the largest: the claim takes the largest, and succeeds.
  log.entries[0].epoch = kMaxLedgerEpoch - 1;
  auto b = Process(log);
  ASSERT_TRUE(b->Claim(std::nullopt, "/b/ledger").ok());
  EXPECT_EQ(b->epoch(), kMaxLedgerEpoch);
  EXPECT_EQ(std::to_string(b->epoch()).size(), 15u);  // what the Kafka log's reader accepts
}

TEST(LedgerReplicaTest, TheLocalFileIsOnlyACacheOfTheRecord) {
  MemoryLog log;
  auto a = Process(log);
  ASSERT_TRUE(a->Claim(std::nullopt, "f").ok());
  ASSERT_TRUE(a->Commit(Steps(1)).ok());
  ASSERT_TRUE(a->Commit(Steps(2)).ok());
  a.reset();
  // Same bytes as the record: continue, checkpoint usable.
  auto same = Process(log);
  auto got = same->Claim(Steps(2), "f");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 3);
  EXPECT_TRUE(same->local_is_record());
  ASSERT_TRUE(same->Commit(Steps(3)).ok());
  same.reset();
  // A stale file (a restored backup): the record wins.
  auto stale = Process(log);
  got = stale->Claim(Steps(1), "f");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 4);
  EXPECT_FALSE(stale->local_is_record());
  stale.reset();
  // A file AHEAD of the record (a step whose entry never became durable):
  // never used — its step was not released — and its checkpoint neither.
  auto ahead = Process(log);
  got = ahead->Claim(Steps(7), "f");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 4);
  EXPECT_FALSE(ahead->local_is_record());
  ahead.reset();
  // Another run's file that never took a step (it lost a claim race for a
  // new job): replaced by the record.
  auto unstepped = Process(log);
  got = unstepped->Claim(Steps(0, "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"), "f");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)->next_step, 4);
  EXPECT_FALSE(unstepped->local_is_record());
  unstepped.reset();
  // Another run's file next to this job's record: refused, both named —
  // already by Peek, which appends nothing (no claim, so no owner fenced).
  auto other = Process(log);
  const size_t entries = log.entries.size();
  auto peeked = other->Peek(Steps(3, "ffffffffffffffffffffffffffffffff"), "/state/ledger");
  EXPECT_EQ(peeked.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(peeked.status().message(), HasSubstr("/state/ledger"));
  EXPECT_EQ(log.entries.size(), entries);
  auto refused = other->Claim(Steps(3, "ffffffffffffffffffffffffffffffff"), "/state/ledger");
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("/state/ledger"));
  EXPECT_THAT(refused.status().message(), HasSubstr("memory log offset"));
}

TEST(LedgerReplicaTest, PeekChoosesWhatClaimWouldWithoutClaiming) {
  MemoryLog log;
  auto owner = Process(log);
  ASSERT_TRUE(owner->Claim(std::nullopt, "f").ok());
  ASSERT_TRUE(owner->Commit(Steps(4)).ok());
  auto next = Process(log);
  const size_t entries = log.entries.size();
  auto peeked = next->Peek(std::nullopt, "g");
  ASSERT_TRUE(peeked.ok());
  ASSERT_TRUE(peeked->has_value());
  EXPECT_EQ((*peeked)->next_step, 5);
  EXPECT_EQ(log.entries.size(), entries);   // nothing appended
  EXPECT_TRUE(owner->Commit(Steps(5)).ok());  // the owner is not fenced
  auto claimed = next->Claim(std::nullopt, "g");
  ASSERT_TRUE(claimed.ok());
  EXPECT_EQ((*claimed)->next_step, 6);  // what was committed since the peek
}

TEST(LedgerReplicaTest, AStandbyWaitsForSilenceThenClaims) {
  MemoryLog log;
  auto owner = Process(log);
  ASSERT_TRUE(owner->Claim(std::nullopt, "f").ok());
  ASSERT_TRUE(owner->Commit(Steps(1)).ok());
  auto standby = Process(log);
  // While the owner keeps committing, the standby does not return.
  const auto start = std::chrono::steady_clock::now();
  auto last_commit = start;
  int commits = 0;
  const Status silent = standby->AwaitSilence(std::chrono::milliseconds(600), [&] {
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500)) {
      EXPECT_TRUE(owner->Commit(Steps(2 + commits++)).ok());  // the owner is alive
      last_commit = std::chrono::steady_clock::now();
    }
    return false;
  });
  ASSERT_TRUE(silent.ok());
  EXPECT_GE(commits, 5);
  // It returned only after 600 ms without an entry.
  EXPECT_GE(std::chrono::steady_clock::now() - last_commit, std::chrono::milliseconds(600));
  auto got = standby->Claim(std::nullopt, "g");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 2 + commits);  // every commit of the owner counted
  EXPECT_EQ(owner->Commit(Steps(9)).code(), StatusCode::kFailedPrecondition);
  // A stop request ends the wait at once.
  auto other = Process(log);
  EXPECT_EQ(other->AwaitSilence(std::chrono::seconds(60), [] { return true; }).code(),
            StatusCode::kCancelled);
}

// A broker restart makes the ledger topic unreadable for a while: the
// standby neither takes over (it cannot see the owner) nor gives up, and
// counts a whole silence period again once it can read.
TEST(LedgerReplicaTest, AStandbyWaitsOutAnUnreadableLogAndCountsSilenceAfterIt) {
  MemoryLog log;
  auto owner = Process(log);
  ASSERT_TRUE(owner->Claim(std::nullopt, "f").ok());
  ASSERT_TRUE(owner->Commit(Steps(1)).ok());
  auto standby = Process(log);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  log.unreadable = true;  // from the start, for 4 silence periods
  std::optional<Clock::time_point> readable_at;
  const Status silent = standby->AwaitSilence(std::chrono::milliseconds(300), [&] {
    if (!readable_at.has_value() && Clock::now() - start >= std::chrono::milliseconds(1200)) {
      log.unreadable = false;
      readable_at = Clock::now();
    }
    return false;
  });
  ASSERT_TRUE(silent.ok()) << silent.ToString();
  ASSERT_TRUE(readable_at.has_value());
  // Not during the outage, and a whole silence period after it ended
  // although the owner's last entry is far older.
  EXPECT_GE(Clock::now() - *readable_at, std::chrono::milliseconds(300));
  auto got = standby->Claim(std::nullopt, "g");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 2);
}

TEST(LedgerReplicaTest, ANewOwnerFencesTheOldOneWhichThenCommitsNothing) {
  MemoryLog log;
  auto old_owner = Process(log);
  ASSERT_TRUE(old_owner->Claim(std::nullopt, "f").ok());
  ASSERT_TRUE(old_owner->Commit(Steps(1)).ok());
  auto new_owner = Process(log);
  auto got = new_owner->Claim(Steps(1), "g");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 2);
  // The paused old owner wakes up: its entry lands after the claim, so it
  // is invalid and the commit fails — nothing of that step may leave.
  const Status late = old_owner->Commit(Steps(2));
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("fenced"));
  EXPECT_TRUE(old_owner->fenced());
  EXPECT_EQ(old_owner->Commit(Steps(3)).code(), StatusCode::kFailedPrecondition);  // sticky
  EXPECT_EQ(old_owner->ConfirmOwner().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(new_owner->ConfirmOwner().ok());
  ASSERT_TRUE(new_owner->Commit(Steps(2)).ok());
  ASSERT_TRUE(new_owner->Commit(Steps(3)).ok());
  // A third process restores the new owner's state, not the fenced entries.
  new_owner.reset();
  auto third = Process(log);
  got = third->Claim(std::nullopt, "h");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 4);
  EXPECT_EQ(third->restored_from(), "memory log offset " +
                                        std::to_string(log.entries.size() - 2) + " (key 'job')");
}

TEST(LedgerReplicaTest, AClaimAdoptsEveryEntryThatWasConfirmedBeforeIt) {
  // The old owner commits (and confirms, so it may release) between the new
  // owner's read of the log and its claim: the new owner must continue from
  // that entry, or the released step's charge would be lost.
  MemoryLog log;
  auto old_owner = Process(log);
  ASSERT_TRUE(old_owner->Claim(std::nullopt, "f").ok());
  ASSERT_TRUE(old_owner->Commit(Steps(1)).ok());
  auto new_owner = Process(log);
  bool interleaved = false;
  log.before_append = [&] { interleaved = old_owner->Commit(Steps(2)).ok(); };
  auto got = new_owner->Claim(Steps(1), "g");
  ASSERT_TRUE(interleaved);  // confirmed: its release may have left
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->next_step, 3);
  EXPECT_EQ((*got)->accountant, Steps(2).accountant);
}

TEST(LedgerReplicaTest, OfTwoSimultaneousClaimsExactlyOneOwnsTheJob) {
  for (int trial = 0; trial < 8; ++trial) {
    MemoryLog log;
    auto a = Process(log);
    auto b = Process(log);
    // Both read an empty log; a's claim lands first, then b's, same counter.
    Status a_claim = Status::Ok();
    log.before_append = [&] {
      log.before_append = nullptr;
      a_claim = a->Claim(std::nullopt, "a").status();
    };
    const Status b_claim = b->Claim(std::nullopt, "b").status();
    ASSERT_TRUE(a_claim.ok());
    const bool b_wins = b->owner() > a->owner();
    EXPECT_EQ(b_claim.ok(), b_wins);
    EXPECT_EQ(b->lost_claim_race(), !b_wins);
    if (!b_wins) {
      EXPECT_EQ(b_claim.code(), StatusCode::kUnavailable);  // a standby retries
    }
    const Status a_commit = a->Commit(Steps(1));
    const Status b_commit = b_claim.ok() ? b->Commit(Steps(1)) : b_claim;
    EXPECT_NE(a_commit.ok(), b_commit.ok()) << "exactly one owner";
    EXPECT_EQ(b_commit.ok(), b_wins);
  }
}

TEST(LedgerReplicaTest, OtherJobsOnTheTopicAndALostBeginning) {
  MemoryLog log;
  auto other_job = Process(log, "another-job");
  ASSERT_TRUE(other_job->Claim(std::nullopt, "x").ok());
  ASSERT_TRUE(other_job->Commit(Steps(5)).ok());
  auto mine = Process(log, "job");
  auto got = mine->Claim(std::nullopt, "f");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());  // another job's budget is not ours
  ASSERT_TRUE(mine->Commit(Steps(1)).ok());
  EXPECT_TRUE(other_job->Commit(Steps(6)).ok());  // and it does not fence the other job

  log.first = 1;  // retention deleted the beginning
  auto late = Process(log, "job");
  auto refused = late->Claim(std::nullopt, "f");
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("retention"));
  EXPECT_EQ(mine->Commit(Steps(2)).code(), StatusCode::kOk);
}

TEST(LedgerReplicaTest, CommitBeforeClaimIsRefused) {
  MemoryLog log;
  auto a = Process(log);
  EXPECT_EQ(a->Commit(Steps(1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->ConfirmOwner().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(log.entries.empty());
}

}  // namespace
}  // namespace vipsd::daemon
