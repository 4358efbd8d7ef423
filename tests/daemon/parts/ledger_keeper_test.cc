// LedgerKeeper: the budget of record as the step thread keeps it
// (daemon/parts/ledger_keeper.h) — the live and committed states, the commit
// retry, the ceiling check before a step and the step's record.
#include "daemon/parts/ledger_keeper.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/privacy/accounting/fixed_schedule.h"
#include "tests/testing/test_metrics.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;

LedgerState FreshState(ScheduleKind schedule) {
  LedgerState state;
  state.run_id = *NewRunId();
  state.model_type = "lda";
  state.model_fingerprint = std::string(64, 'a');
  state.source = SourceKind::kFile;
  state.schedule = schedule;
  if (schedule == ScheduleKind::kFixed) {
    state.fixed_step.sampling_rate = 0.1;
    state.fixed_step.noise_multiplier = 1.0;
  }
  return state;
}

struct Fixture {
  std::string dir;
  std::unique_ptr<Metrics> metrics = NewTestMetrics();
  bool disk_full = false;
  int attempts = 0;
  std::unique_ptr<LedgerKeeper> keeper;

  explicit Fixture(const std::string& name, ScheduleKind schedule = ScheduleKind::kAdaptive) {
    dir = ::testing::TempDir() + "ledger_keeper_" + name;
    std::filesystem::remove_all(dir);
    auto ledger = Ledger::Open(dir);
    EXPECT_TRUE(ledger.ok()) << ledger.status().ToString();
    keeper = std::make_unique<LedgerKeeper>(std::move(*ledger), FreshState(schedule), nullptr,
                                            dir, metrics.get(), [this]() -> Status {
                                              ++attempts;
                                              return disk_full ? UnavailableError("disk full")
                                                               : Status::Ok();
                                            });
    EXPECT_TRUE(keeper->UseFixedSchedule(/*is_private=*/true).ok());
  }
};

TEST(LedgerKeeperTest, TheCommittedStateMovesOnlyWithADurableCommit) {
  Fixture f("committed");
  ASSERT_TRUE(f.keeper->Commit(1).ok());
  ASSERT_TRUE(f.keeper->Charge({0.1, 1.0}).ok());
  EXPECT_EQ(f.keeper->committed().accountant.steps(), 0);  // not durable yet
  f.disk_full = true;
  EXPECT_EQ(f.keeper->CommitOrRetry(2, 1000.0), LedgerKeeper::CommitResult::kFailed);
  EXPECT_EQ(f.keeper->committed().accountant.steps(), 0);
  EXPECT_EQ(f.keeper->committed().next_step, 1);
  EXPECT_TRUE(f.keeper->failing());
  EXPECT_EQ(f.metrics->ledger_failing().Value(), 1);
  // Backing off: no attempt before the retry time (1 s, then doubling).
  const int attempts = f.attempts;
  EXPECT_EQ(f.keeper->CommitOrRetry(2, 1000.5), LedgerKeeper::CommitResult::kFailed);
  EXPECT_EQ(f.attempts, attempts);
  EXPECT_EQ(f.keeper->CommitOrRetry(2, 1001.0), LedgerKeeper::CommitResult::kFailed);
  EXPECT_EQ(f.attempts, attempts + 1);
  EXPECT_TRUE(f.keeper->backing_off(1002.5));  // 2 s after the second failure
  EXPECT_THAT(f.keeper->FailingError(1010.0).message(), HasSubstr("2 failed attempts over 10 s"));
  f.disk_full = false;
  EXPECT_EQ(f.keeper->CommitOrRetry(2, 1003.0), LedgerKeeper::CommitResult::kRecovered);
  EXPECT_FALSE(f.keeper->failing());
  EXPECT_EQ(f.metrics->ledger_failing().Value(), 0);
  EXPECT_EQ(f.keeper->committed().accountant.steps(), 1);
  EXPECT_EQ(f.keeper->committed().next_step, 2);
  EXPECT_EQ(f.keeper->CommitOrRetry(2, 1004.0), LedgerKeeper::CommitResult::kCommitted);
  // And what is on disk is the committed state.
  auto loaded = f.keeper->ledger().Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->next_step, 2);
  EXPECT_EQ((*loaded)->accountant, f.keeper->committed().accountant);
}

TEST(LedgerKeeperTest, TheCeilingCheckOfAFixedScheduleCountsTheStepsItWouldComplete) {
  Fixture f("fixed", ScheduleKind::kFixed);
  auto fixed = privacy::FixedScheduleAccountant::Create({0.1, 1.0});
  ASSERT_TRUE(fixed.ok());
  const double one = fixed->Epsilon(1, 1e-5)->epsilon;
  const double two = fixed->Epsilon(2, 1e-5)->epsilon;
  double after = 0, window = 0;
  EXPECT_TRUE(f.keeper->AdmitsStep({0.1, 1.0}, {two, 1e-5}, &after, &window));
  EXPECT_DOUBLE_EQ(after, one);
  ASSERT_TRUE(f.keeper->Charge({0.1, 1.0}).ok());
  EXPECT_TRUE(f.keeper->AdmitsStep({0.1, 1.0}, {two, 1e-5}, &after, &window));
  EXPECT_DOUBLE_EQ(after, two);
  ASSERT_TRUE(f.keeper->Charge({0.1, 1.0}).ok());
  EXPECT_FALSE(f.keeper->AdmitsStep({0.1, 1.0}, {two, 1e-5}, &after, &window));
  EXPECT_GT(after, two);
  // One code path for ε: what the keeper states is LedgerSpent's.
  EXPECT_DOUBLE_EQ(f.keeper->EpsilonOf(f.keeper->state(), 1e-5, true),
                   LedgerSpent(f.keeper->state(), 1e-5)->epsilon);
  EXPECT_EQ(f.keeper->EpsilonOf(f.keeper->state(), 1e-5, false), 0);
}

TEST(LedgerKeeperTest, TheAdaptiveFilterAdmitsAStepOnlyWithinTheCeiling) {
  Fixture f("adaptive");
  double after = 0, window = 0;
  EXPECT_TRUE(f.keeper->AdmitsStep({0.5, 1.0}, {100, 1e-5}, &after, &window));
  EXPECT_GT(after, 0);
  EXPECT_FALSE(f.keeper->AdmitsStep({0.5, 1.0}, {after / 2, 1e-5}, &after, &window));
  EXPECT_EQ(window, 0);  // global mode: no window
}

TEST(LedgerKeeperTest, AStepIsRecordedInTheNoiseHistoryByItsKind) {
  Fixture f("noise");
  svi::StepResult step;
  step.step = 1;
  ASSERT_TRUE(f.keeper->RecordStep(step, /*is_private=*/true, /*secure_noise=*/true, 0).ok());
  step.step = 2;
  ASSERT_TRUE(f.keeper->RecordStep(step, /*is_private=*/true, /*secure_noise=*/false, 0).ok());
  step.step = 3;
  ASSERT_TRUE(f.keeper->RecordStep(step, /*is_private=*/false, /*secure_noise=*/true, 0).ok());
  step.step = 4;
  ASSERT_TRUE(f.keeper->RecordStep(step, /*is_private=*/false, /*secure_noise=*/true, 0).ok());
  const NoiseHistory& noise = f.keeper->state().noise;
  EXPECT_EQ(noise.private_steps, 1);
  EXPECT_EQ(noise.fixed_seed_steps, 1);
  EXPECT_EQ(noise.first_fixed_seed_step, 2);
  EXPECT_EQ(noise.non_private_steps, 2);
  EXPECT_EQ(noise.first_non_private_step, 3);
}

TEST(LedgerKeeperTest, AStickyErrorStaysUntilTheProcessEnds) {
  Fixture f("sticky");
  EXPECT_FALSE(f.keeper->sticky().has_value());
  f.keeper->Stick(DataLossError("a cut below an earlier one"));
  ASSERT_TRUE(f.keeper->sticky().has_value());
  EXPECT_THAT(f.keeper->sticky()->message(), HasSubstr("a cut below"));
  EXPECT_TRUE(f.keeper->ConfirmOwner().ok());  // no replica: always the owner
  EXPECT_FALSE(f.keeper->fenced());
}

// Every change of the record is an edit validated before it applies: one
// that is refused changes nothing, byte for byte as the ledger encodes it.
TEST(LedgerEditTest, AnEditThatIsRefusedChangesNothing) {
  LedgerState state = FreshState(ScheduleKind::kAdaptive);
  state.windows = *svi::SlotWindows::Create(1000, 1, 10);
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::AddStream("docs:0", 5), &state).ok());
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::RecordCuts(3, {{"docs:0", 40}}), &state).ok());
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::LowerCeiling(2), &state).ok());
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::WarningLevel(0.5), &state).ok());
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::SetNextStep(4), &state).ok());
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::BindFederationRun(std::string(32, 'b')), &state).ok());
  ASSERT_TRUE(ApplyLedgerEdit(LedgerEdit::Charge({0.1, 1.0}), &state).ok());
  const std::string before = Ledger::Encode(state);
  const std::vector<std::pair<std::string, LedgerEdit>> refused = {
      {"a stream twice", LedgerEdit::AddStream("docs:0", 0)},
      {"a cut below the previous", LedgerEdit::RecordCuts(4, {{"docs:0", 39}})},
      {"a slot not after the last", LedgerEdit::RecordCuts(3, {{"docs:0", 41}})},
      {"a cut of an unknown stream", LedgerEdit::RecordCuts(4, {{"docs:1", 1}})},
      {"a raised ceiling", LedgerEdit::LowerCeiling(2.5)},
      {"a warning level that falls", LedgerEdit::WarningLevel(0.25)},
      {"the step counter back", LedgerEdit::SetNextStep(3)},
      {"another aggregator run", LedgerEdit::BindFederationRun(std::string(32, 'c'))},
      {"a longer window", LedgerEdit::SetWindowSlots(20)},
      {"an interval before the last slot", LedgerEdit::SetInterval(2, 2)},
      {"a residency edit on a global ledger", LedgerEdit::SetResidencySteps(5)},
      {"a charge the accountant refuses", LedgerEdit::Charge({1.5, 1.0})},
  };
  for (const auto& [what, edit] : refused) {
    EXPECT_FALSE(ApplyLedgerEdit(edit, &state).ok()) << what;
    EXPECT_EQ(Ledger::Encode(state), before) << what;
  }
}

// A reload's edits apply together or not at all.
TEST(LedgerKeeperTest, AReloadsEditsApplyTogetherOrNotAtAll) {
  Fixture f("reload_edits");
  ASSERT_TRUE(f.keeper->ApplyReload({LedgerEdit::LowerCeiling(3)}).ok());
  std::vector<LedgerEdit> seen;
  f.keeper->set_edit_observer(
      [&](const LedgerEdit& edit, const LedgerState&) { seen.push_back(edit); });
  const std::string before = Ledger::Encode(f.keeper->state());
  EXPECT_FALSE(
      f.keeper->ApplyReload({LedgerEdit::LowerCeiling(2), LedgerEdit::LowerCeiling(2.5)}).ok());
  EXPECT_EQ(Ledger::Encode(f.keeper->state()), before);
  EXPECT_TRUE(seen.empty());
  ASSERT_TRUE(f.keeper->ApplyReload({LedgerEdit::LowerCeiling(2.5), LedgerEdit::LowerCeiling(2)})
                  .ok());
  EXPECT_EQ(f.keeper->state().epsilon_ceiling, 2);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(f.keeper->committed().epsilon_ceiling, 0);  // not durable before a commit
}

}  // namespace
}  // namespace vipsd::daemon
