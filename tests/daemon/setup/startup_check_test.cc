// The start-up check's parts that a reload and a takeover reuse
// (daemon/setup/startup_check.h); the start itself is tested through the daemon
// (daemon_test, offline_run_test) and its paths (path_checks_test).
#include "daemon/setup/startup_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/base/log.h"
#include "daemon/state/checkpoint.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;

config::VipsdConfig Config() {
  config::VipsdConfig config;
  config.file = "c.yaml";
  config.driver.mechanism.sampling_rate = 0.1;
  config.driver.mechanism.noise_multiplier = 1.0;
  config.driver.delta = 1e-5;
  config.driver.epsilon_ceiling = 10;
  config.window_steps = 20;
  config.step_interval_seconds = 1;
  return config;
}

// Config() for a two-dimensional BLR with `source` and a state directory
// named `name` under the test's temporary directory.
config::VipsdConfig BlrConfig(const std::string& name, config::SourceType source) {
  config::VipsdConfig config = Config();
  config.model_type = "blr";
  config.blr.dim = 2;
  config.source_type = source;
  config.state_directory = ::testing::TempDir() + name;
  return config;
}

// The warnings vipsd::Log says while it lives.
class WarningCapture {
 public:
  WarningCapture() {
    SetLogSink([this](LogLevel level, std::string_view, std::string_view message) {
      if (level == LogLevel::kWarning) lines.emplace_back(message);
    });
  }
  ~WarningCapture() { SetLogSink(nullptr); }
  std::vector<std::string> lines;
};

LedgerState State(ScheduleKind schedule, AccountingMode mode) {
  LedgerState state;
  state.run_id = std::string(32, 'c');
  state.schedule = schedule;
  state.mode = mode;
  state.fixed_step.sampling_rate = 0.1;
  state.fixed_step.noise_multiplier = 1.0;
  state.windows = *svi::SlotWindows::Create(1000, 1, 20);
  if (mode == AccountingMode::kResidency) state.residency = *privacy::ResidencyAccountant::Create(20);
  return state;
}

TEST(StartupCheckTest, AReloadKeepsAFixedSchedulesPinnedQAndSigma) {
  const config::VipsdConfig running = Config();
  config::VipsdConfig next = running;
  next.driver.mechanism.sampling_rate = 0.2;
  const LedgerState state = State(ScheduleKind::kFixed, AccountingMode::kGlobal);
  auto refused = CheckReload(running, next, state, "/s/ledger", /*paced=*/true);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("privacy.sampling_rate"));
  EXPECT_THAT(refused.status().message(), HasSubstr("schedule fixed pins it to 0.1"));
  // An adaptive schedule takes a new q.
  const LedgerState adaptive = State(ScheduleKind::kAdaptive, AccountingMode::kGlobal);
  EXPECT_TRUE(CheckReload(running, next, adaptive, "/s/ledger", true).ok());
}

TEST(StartupCheckTest, AReloadMayShortenTheWindowButNeverLengthenIt) {
  const config::VipsdConfig running = Config();
  config::VipsdConfig next = running;
  const LedgerState state = State(ScheduleKind::kAdaptive, AccountingMode::kResidency);
  next.window_steps = 10;
  auto shorter = CheckReload(running, next, state, "/s/ledger", true);
  ASSERT_TRUE(shorter.ok()) << shorter.status().ToString();
  EXPECT_EQ(shorter->windows.window_slots(), 10);
  EXPECT_EQ(shorter->residency->max_residency_steps(), 10);
  EXPECT_EQ(state.windows.window_slots(), 20);  // nothing installed yet
  next.window_steps = 30;
  auto longer = CheckReload(running, next, state, "/s/ledger", true);
  EXPECT_EQ(longer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(longer.status().message(), HasSubstr("schedule.window_steps"));
}

TEST(StartupCheckTest, AReloadRefusesAResidencyWindowTheCeilingCannotPay) {
  const config::VipsdConfig running = Config();
  config::VipsdConfig next = running;
  next.driver.mechanism.noise_multiplier = 0.5;
  next.driver.mechanism.sampling_rate = 1;
  next.driver.epsilon_ceiling = 1;
  const LedgerState state = State(ScheduleKind::kAdaptive, AccountingMode::kResidency);
  auto refused = CheckReload(running, next, state, "/s/ledger", true);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("would spend epsilon"));
  EXPECT_THAT(refused.status().message(), HasSubstr("> epsilon_ceiling 1"));
}

// Issue 26: the ceiling a state directory is held to can only go down.
TEST(StartupCheckTest, AReloadMayLowerTheCeilingButNeverRaiseIt) {
  const config::VipsdConfig running = Config();
  LedgerState state = State(ScheduleKind::kAdaptive, AccountingMode::kGlobal);
  state.epsilon_ceiling = 10;
  config::VipsdConfig next = running;
  next.driver.epsilon_ceiling = 10.5;
  auto raised = CheckReload(running, next, state, "/s/ledger", true);
  EXPECT_EQ(raised.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(raised.status().message(), HasSubstr("privacy.epsilon_ceiling"));
  EXPECT_THAT(raised.status().message(), HasSubstr("10.5 is above the ceiling this state "
                                                   "directory is held to (10)"));
  EXPECT_THAT(raised.status().message(), HasSubstr("can only be lowered"));
  next.driver.epsilon_ceiling = 8;
  EXPECT_TRUE(CheckReload(running, next, state, "/s/ledger", true).ok());
  // Held to a lowered ceiling, the old one is a raise too.
  state.epsilon_ceiling = 8;
  EXPECT_FALSE(CheckReload(next, running, state, "/s/ledger", true).ok());
}

TEST(StartupCheckTest, AStartRecordsTheCeilingAndRefusesToRaiseIt) {
  config::VipsdConfig config = BlrConfig("startup_ceiling", config::SourceType::kKafka);
  auto bundle = BuildModel(config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
  // A fresh directory records the configured ceiling.
  auto fresh = PrepareState(config, *bundle, std::nullopt, "/s/ledger", true, /*dry_run=*/true);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->state.epsilon_ceiling, 10);
  // A ledger from before the record (0) takes the configured one.
  LedgerState old = fresh->state;
  old.epsilon_ceiling = 0;
  config.driver.epsilon_ceiling = 12;
  auto adopted = PrepareState(config, *bundle, old, "/s/ledger", true, true);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_EQ(adopted->state.epsilon_ceiling, 12);
  // Held to 10: 12 is refused, 9 lowers it.
  auto raised = PrepareState(config, *bundle, fresh->state, "/s/ledger", true, true);
  EXPECT_EQ(raised.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(raised.status().message(), HasSubstr("12 is above the ceiling"));
  config.driver.epsilon_ceiling = 9;
  auto lowered = PrepareState(config, *bundle, fresh->state, "/s/ledger", true, true);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  EXPECT_EQ(lowered->state.epsilon_ceiling, 9);
}

// Issue 49: the δ a state directory is held to is recorded at its first
// private start and can only go down; an older ledger takes the configured
// one (loudly).
TEST(StartupCheckTest, AStartRecordsDeltaAndRefusesToRaiseIt) {
  config::VipsdConfig config = BlrConfig("startup_delta", config::SourceType::kKafka);
  config.driver.delta = 1e-6;
  auto bundle = BuildModel(config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
  auto fresh = PrepareState(config, *bundle, std::nullopt, "/s/ledger", true, /*dry_run=*/true);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->state.delta, 1e-6);
  // A larger δ would make every past charge smaller: refused, naming the
  // key, the line and both values.
  config.file = "c.yaml";
  config.driver.delta = 1e-2;
  auto raised = PrepareState(config, *bundle, fresh->state, "/s/ledger", true, true);
  EXPECT_EQ(raised.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(raised.status().message(), HasSubstr("privacy.delta"));
  EXPECT_THAT(raised.status().message(),
              HasSubstr("0.01 is above the delta this state directory is held to (1e-06)"));
  // A smaller one is recorded.
  config.driver.delta = 1e-7;
  auto lowered = PrepareState(config, *bundle, fresh->state, "/s/ledger", true, true);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  EXPECT_EQ(lowered->state.delta, 1e-7);
  // A ledger from before the record (0) takes the configured one, loudly:
  // one warning naming the key and the value recorded.
  LedgerState old = fresh->state;
  old.delta = 0;
  old.next_step = 5;
  config.driver.delta = 1e-3;
  StatusOr<PreparedState> adopted = UnavailableError("not prepared");
  {
    WarningCapture warnings;
    adopted = PrepareState(config, *bundle, old, "/s/ledger", true, true);
    ASSERT_EQ(warnings.lines.size(), 1u);
    EXPECT_THAT(warnings.lines[0], HasSubstr("c.yaml"));
    EXPECT_THAT(warnings.lines[0], HasSubstr("privacy.delta"));
    EXPECT_THAT(warnings.lines[0], HasSubstr("does not record a delta"));
    EXPECT_THAT(warnings.lines[0], HasSubstr("recording 0.001"));
  }
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_EQ(adopted->state.delta, 1e-3);
  {
    // A ledger that records one is not warned about.
    WarningCapture warnings;
    auto recorded = PrepareState(config, *bundle, adopted->state, "/s/ledger", true, true);
    ASSERT_TRUE(recorded.ok()) << recorded.status().ToString();
    EXPECT_TRUE(warnings.lines.empty()) << warnings.lines[0];
  }
  // A non-private run neither checks nor records it.
  config.driver.mechanism.noise_multiplier = 0;
  config.driver.delta = 0.5;
  LedgerState never_private = fresh->state;
  never_private.delta = 0;
  auto plain = PrepareState(config, *bundle, never_private, "/s/ledger", true, true);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->state.delta, 0);
}

// The accounting mode is the ledger's: another one is refused at start,
// naming the key and both modes (a global ledger's charges are not a
// residency window's, nor the other way round).
TEST(StartupCheckTest, AStartRefusesAnotherAccountingModeNamingBoth) {
  config::VipsdConfig config = BlrConfig("startup_mode", config::SourceType::kKafka);
  config.accounting = config::Accounting::kGlobal;
  auto bundle = BuildModel(config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
  auto global = PrepareState(config, *bundle, std::nullopt, "/s/ledger", true, /*dry_run=*/true);
  ASSERT_TRUE(global.ok()) << global.status().ToString();
  EXPECT_EQ(global->state.mode, AccountingMode::kGlobal);
  config.accounting = config::Accounting::kResidency;
  auto refused = PrepareState(config, *bundle, global->state, "/s/ledger", true, true);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("c.yaml"));
  EXPECT_THAT(refused.status().message(), HasSubstr("privacy.accounting"));
  EXPECT_THAT(refused.status().message(), HasSubstr("global mode, configured: residency"));
  // And back: a residency ledger refuses global accounting.
  auto residency = PrepareState(config, *bundle, std::nullopt, "/s/ledger", true, true);
  ASSERT_TRUE(residency.ok()) << residency.status().ToString();
  config.accounting = config::Accounting::kGlobal;
  refused = PrepareState(config, *bundle, residency->state, "/s/ledger", true, true);
  EXPECT_THAT(refused.status().message(), HasSubstr("residency mode, configured: global"));
}

// The privacy unit is recorded by a new directory and cannot change for it:
// not the unit, not its field, not the cap; a record-level ledger refuses a
// unit and the other way round.
TEST(StartupCheckTest, AStartRecordsThePrivacyUnitAndRefusesAnyChangeOfIt) {
  config::VipsdConfig config = BlrConfig("startup_unit", config::SourceType::kFile);
  config.privacy_unit = config::PrivacyUnit::kField;
  config.unit_field = "patient";
  config.driver.max_records_per_unit = 8;
  auto bundle = BuildModel(config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
  auto fresh = PrepareState(config, *bundle, std::nullopt, "/s/ledger", true, /*dry_run=*/true);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->state.unit, "field");
  EXPECT_EQ(fresh->state.unit_field, "patient");
  EXPECT_EQ(fresh->state.max_records_per_unit, 8);
  auto again = PrepareState(config, *bundle, fresh->state, "/s/ledger", true, true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();

  const auto refused = [&](config::VipsdConfig changed, const LedgerState& state) {
    auto other_bundle = BuildModel(changed);
    EXPECT_TRUE(other_bundle.ok());
    auto result = PrepareState(changed, *other_bundle, state, "/s/ledger", true, true);
    EXPECT_FALSE(result.ok());
    return std::string(result.status().message());
  };
  config::VipsdConfig other = config;
  other.driver.max_records_per_unit = 9;
  EXPECT_THAT(refused(other, fresh->state),
              HasSubstr("protects unit field (field patient) with max_records_per_unit 8; this "
                        "configuration says unit field (field patient) with max_records_per_unit 9"));
  other = config;
  other.unit_field = "visit";
  EXPECT_THAT(refused(other, fresh->state), HasSubstr("cannot change for a state directory"));
  other = config;
  other.privacy_unit = config::PrivacyUnit::kRecord;
  other.unit_field.clear();
  other.driver.max_records_per_unit = 0;
  EXPECT_THAT(refused(other, fresh->state), HasSubstr("this configuration says unit record"));
  auto record_bundle = BuildModel(other);
  ASSERT_TRUE(record_bundle.ok());
  auto record_level = PrepareState(other, *record_bundle, std::nullopt, "/s/ledger", true, true);
  ASSERT_TRUE(record_level.ok()) << record_level.status().ToString();
  EXPECT_EQ(record_level->state.unit, "record");
  EXPECT_THAT(refused(config, record_level->state),
              HasSubstr("protects unit record; this configuration says unit field"));
}

TEST(StartupCheckTest, FixedSeedNoiseIsReproducibleAndSaysItIsNotPrivate) {
  config::VipsdConfig config = Config();
  auto secure = NewNoiseSource(config);
  ASSERT_TRUE(secure.ok());
  EXPECT_TRUE((*secure)->is_private());
  config.noise_mode = config::NoiseMode::kFixedSeed;
  config.noise_seed = 7;
  auto a = NewNoiseSource(config);
  auto b = NewNoiseSource(config);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*a)->is_private());
  std::vector<double> x(4), y(4);
  (*a)->FillStandardNormal(x);
  (*b)->FillStandardNormal(y);
  EXPECT_EQ(x, y);
  // And the configuration key alone is refused without the flag.
  const Status refused = CheckFixedSeedFlag(config, DaemonOptions{});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("--insecure-fixed-seed-noise"));
  DaemonOptions flagged;
  flagged.allow_fixed_seed_noise = true;
  EXPECT_TRUE(CheckFixedSeedFlag(config, flagged).ok());
}

TEST(StartupCheckTest, ATakeoverModelIsUsedOnlyIfItIsOfTheRecordsRunAndAChargedStep) {
  config::VipsdConfig config = Config();
  config.model_type = "blr";
  config.blr.dim = 2;
  auto bundle = BuildModel(config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
  LedgerState state = State(ScheduleKind::kAdaptive, AccountingMode::kGlobal);
  state.next_step = 6;  // steps 1..5 charged
  Checkpoint model;
  model.run_id = state.run_id;
  model.step = 5;
  model.model_type = bundle->model->type();
  model.model_fingerprint = bundle->model_fingerprint;
  model.arrays = bundle->model->CheckpointArrays();
  const std::string bytes = *CheckpointStore::Encode(model);
  EXPECT_EQ(ContinueFromTakeoverModel(bytes, state, *bundle, 3), 5);
  EXPECT_EQ(ContinueFromTakeoverModel(bytes, state, *bundle, 5), 5);  // not newer
  model.step = 6;  // a step the record does not charge
  EXPECT_EQ(ContinueFromTakeoverModel(*CheckpointStore::Encode(model), state, *bundle, 3), 3);
  model.step = 5;
  model.run_id = std::string(32, 'd');  // another run
  EXPECT_EQ(ContinueFromTakeoverModel(*CheckpointStore::Encode(model), state, *bundle, 3), 3);
  EXPECT_EQ(ContinueFromTakeoverModel("not a checkpoint", state, *bundle, 3), 3);
}

}  // namespace
}  // namespace vipsd::daemon
