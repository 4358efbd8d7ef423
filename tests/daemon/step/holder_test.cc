// A federated holder (daemon/step/holder.h) in one process, with the test as its
// aggregator on an in-memory work topic: when its messages leave, and what
// they carry (issue 49).
#include "daemon/step/holder.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "config/config.h"
#include "core/base/log.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/federation.h"
#include "daemon/setup/model_setup.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger.h"
#include "daemon/state/state_status.h"
#include "tests/testing/fake_io.h"
#include "tests/testing/memory_work_exchange.h"
#include "tests/testing/test_metrics.h"

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kShareDelayMs = 1000;

int64_t NowMs() { return static_cast<int64_t>(std::floor(WallNow() * 1000)); }

// The messages logged at one level while it lives (it replaces the log
// sink, and removes it when it goes, also when an assertion ends the test
// early).
class LevelLog {
 public:
  explicit LevelLog(LogLevel level) {
    SetLogSink([this, level](LogLevel at, std::string_view, std::string_view message) {
      if (at != level) return;
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.emplace_back(message);
    });
  }
  ~LevelLog() { SetLogSink(nullptr); }
  LevelLog(const LevelLog&) = delete;
  LevelLog& operator=(const LevelLog&) = delete;

  // The lines that contain `needle`.
  std::vector<std::string> With(std::string_view needle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.find(needle) != std::string::npos) found.push_back(line);
    }
    return found;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

// A source whose fetches stall: every poll reports the assignment and
// nothing else (no record, no end reached); the bounds are the log's.
class StalledSource final : public ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;
  StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds timeout) override {
    VIPSD_ASSIGN_OR_RETURN(PollBatch batch, ForwardingSource::Poll(max_records, timeout));
    PollBatch stalled;
    stalled.assignment = batch.assignment;
    std::this_thread::sleep_for(std::min(timeout, 5ms));
    return stalled;
  }
};

// One holder, h1 of the roster {h1, h2}, reading nine documents from a fake
// topic; `extra_pool` adds lines to the pool section (its capacity).
struct HolderFixture {
  std::string dir;
  config::VipsdConfig config;
  std::shared_ptr<FakeTopic> topic = std::make_shared<FakeTopic>();
  std::shared_ptr<MemoryWorkTopic> work = std::make_shared<MemoryWorkTopic>();
  std::unique_ptr<Metrics> metrics = NewTestMetrics();
  MemoryWorkExchange aggregator{work, WorkRole::kCoordinator};  // reads the shares
  MemoryWorkExchange plans{work, WorkRole::kCoordinator};       // unused reader end
  std::unique_ptr<Holder> holder;
  std::thread thread;
  Status result = Status::Ok();
  std::atomic<bool> done{false};

  explicit HolderFixture(const std::string& name, const std::string& extra = "",
                         const std::string& timestamps = "log_append_time") {
    dir = ::testing::TempDir() + "holder_" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/vocab.txt") << "apple\nbanana\ncherry\ndate\nelder\nfig\n";
    auto h1 = WriteNewHolderKey(dir + "/h1.key");
    auto h2 = WriteNewHolderKey(dir + "/h2.key");
    EXPECT_TRUE(h1.ok() && h2.ok());
    if (!h1.ok() || !h2.ok()) return;
    std::ofstream(dir + "/vipsd.yaml")
        << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
           "    alpha: 0.5\n    eta: 0.1\n    resample_length: 10\n"
           "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
           "  epsilon_ceiling: 1000\n  noise: fixed_seed\n  noise_seed: 7\n"
           "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 1\n  interval_seconds: 1\n"
           "  start_delay_seconds: 0\n  window_steps: 1000000000\n"
           "source:\n  type: kafka\n  topics: [docs]\n  timestamps: "
        << timestamps
        << "\nsink:\n  type: kafka\n  topic: releases\n"
           "dead_letter:\n  topic: dead\n"
           "kafka:\n  bootstrap_servers: unused:9092\n"
           "state:\n  directory: state\n  ledger_key: fedjob\n  work_topic: work\n"
           "metrics:\n  listen: \"\"\n"
        << extra
        << "federation:\n  role: holder\n  holder_id: h1\n  secret_key: {file: " << dir
        << "/h1.key}\n  tolerated_holders: 0\n  round_timeout_seconds: 5\n"
           "  share_delay_seconds: "
        << kShareDelayMs / 1000.0 << "\n  holders:\n    h1: " << *h1 << "\n    h2: " << *h2
        << "\n";
    auto loaded = config::LoadConfigFile(dir + "/vipsd.yaml");
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    if (loaded.ok()) config = *loaded;
    const char* texts[] = {"apple banana apple cherry", "date elder fig fig", "fig apple"};
    for (int i = 0; i < 9; ++i) {
      topic->Append(i % 2, "{\"id\": " + std::to_string(i) + ", \"text\": \"" + texts[i % 3] +
                               "\"}");
    }
  }

  ~HolderFixture() { Stop(); }

  // `stalled_input`: the source reports its partitions but never delivers a
  // record or reaches an end (a broker that stopped answering fetches).
  void Start(std::chrono::milliseconds round_delay = 0ms, bool stalled_input = false) {
    DaemonOptions options;
    options.allow_fixed_seed_noise = true;
    options.test_holder_round_delay = round_delay;
    auto log = topic;
    SourceFactory sources = [log, stalled_input](
                                ResumeOffsetFn resume) -> StatusOr<std::unique_ptr<InputSource>> {
      // As a Kafka consumer, it reports the partitions the group gave it.
      auto source = std::make_unique<FakeSource>(log, std::move(resume), std::set<int32_t>{0, 1});
      if (!stalled_input) return std::unique_ptr<InputSource>(std::move(source));
      return std::unique_ptr<InputSource>(new StalledSource(std::move(source)));
    };
    auto created = Holder::Create(config, std::move(sources),
                                  std::make_unique<FakeSink>(std::make_shared<SinkLog>()),
                                  metrics.get(),
                                  std::make_unique<MemoryWorkExchange>(work, WorkRole::kWorker),
                                  options);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    holder = std::move(*created);
    thread = std::thread([this] {
      result = holder->Run();
      done = true;
    });
  }

  void Stop() {
    if (holder != nullptr) holder->RequestStop();
    if (thread.joinable()) thread.join();
  }

  // The holder's messages (decoded) that arrive within `wait`, each with its
  // arrival time; stops at the first of kind `until` if given.
  struct Arrived {
    FederatedShare share;
    int64_t at_ms;
  };
  std::vector<Arrived> Receive(std::chrono::milliseconds wait,
                               std::optional<ShareKind> until = std::nullopt) {
    std::vector<Arrived> out;
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      auto messages = aggregator.Poll(10ms);
      const int64_t at = NowMs();
      for (auto& [offset, bytes] : *messages) {
        auto share = DecodeFederatedShare(bytes);
        EXPECT_TRUE(share.ok()) << share.status().ToString();
        if (!share.ok()) continue;
        out.push_back({*share, at});
        if (until.has_value() && share->kind == *until) return out;
      }
    }
    return out;
  }

  // The plan of round `step` naming `named` (h1 with `incarnation`), issued
  // now, with this configuration's terms unless `terms` is given.
  FederatedPlan Plan(int64_t step, const std::string& incarnation, bool named = true,
                     const std::string& terms = "") {
    auto bundle = BuildModel(config);
    EXPECT_TRUE(bundle.ok());
    FederatedPlan plan;
    plan.job = "fedjob";
    plan.epoch = 1;
    plan.owner = std::string(32, 'a');
    plan.step = step;
    plan.slot = step;
    plan.mechanism.sampling_rate = 0.5;
    plan.mechanism.noise_multiplier = 1.0;
    plan.cut_time_ms = NowMs();
    plan.participants = {named ? "h1" : "h2"};
    plan.incarnations = {named ? incarnation : std::string(32, '2')};
    plan.tolerated = 0;
    plan.roster = RosterFingerprint(*RosterOf(config.federation));
    plan.run = std::string(32, 'b');
    Checkpoint model;
    model.run_id = plan.run;
    model.model_type = bundle->model->type();
    model.model_fingerprint = bundle->model_fingerprint;
    model.arrays = bundle->model->CheckpointArrays();
    plan.model = *CheckpointStore::Encode(model);
    plan.terms = terms.empty() ? FederationTerms(config, bundle->record_settings) : terms;
    plan.issued_ms = NowMs();
    plan.due_ms = plan.issued_ms + 5000;
    return plan;
  }

  void Append(const FederatedPlan& plan) {
    ASSERT_TRUE(plans.Append(EncodeFederatedPlan(plan)).ok());
  }

  // Its first join (with the incarnation every plan must name).
  FederatedShare Join() {
    auto joins = Receive(10s, ShareKind::kJoin);
    EXPECT_FALSE(joins.empty());
    return joins.empty() ? FederatedShare{} : joins.back().share;
  }

  // The holder's ledger as committed now.
  StatusOr<LedgerState> ReadLedger() {
    std::ifstream in(config.state_directory + "/ledger", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return Ledger::Decode(bytes, "ledger");
  }

  int64_t StepsCharged() {
    auto state = ReadLedger();
    return state.ok() ? state->accountant.steps() : -1;
  }
};

TEST(HolderTest, ItsJoinCarriesItsTermsAndStopsOnceAPlanNamesIt) {
  HolderFixture f("terms");
  f.Start();
  const FederatedShare join = f.Join();
  ASSERT_EQ(join.kind, ShareKind::kJoin);
  auto bundle = BuildModel(f.config);
  ASSERT_TRUE(bundle.ok());
  EXPECT_EQ(join.terms, FederationTerms(f.config, bundle->record_settings));
  EXPECT_NE(join.terms.find("source.timestamps: log_append_time"), std::string::npos);
  EXPECT_NE(join.terms.find("privacy.sampling_rate: 0.5"), std::string::npos);
  f.Append(f.Plan(1, join.incarnation));
  auto answered = f.Receive(5s, ShareKind::kShare);
  ASSERT_FALSE(answered.empty());
  EXPECT_EQ(answered.back().share.kind, ShareKind::kShare);
  // Named: it no longer asks (it used to every 3 s, a liveness signal).
  for (const auto& message : f.Receive(4s)) {
    EXPECT_NE(message.share.kind, ShareKind::kJoin);
  }
  // A plan that does not name it: it asks again, at once.
  f.Append(f.Plan(2, join.incarnation, /*named=*/false));
  auto again = f.Receive(3s, ShareKind::kJoin);
  ASSERT_FALSE(again.empty());
  EXPECT_EQ(again.back().share.kind, ShareKind::kJoin);
  // Stopping, it leaves.
  f.Stop();
  auto left = f.Receive(1s, ShareKind::kLeave);
  ASSERT_FALSE(left.empty());
  EXPECT_EQ(left.back().share.kind, ShareKind::kLeave);
  EXPECT_TRUE(f.result.ok()) << f.result.ToString();
}

TEST(HolderTest, AMessageOfAnOlderVipsdIsIgnoredAndSaidOnce) {
  // An aggregator of an older vipsd (VFP2 plans): the holder cannot follow
  // them, says so once (they repeat every round), and answers the plans of
  // its own version as before.
  LevelLog warnings(LogLevel::kWarning);
  {
    HolderFixture f("older");
    f.Start();
    const FederatedShare join = f.Join();
    {
      // Straight into the log: the exchange's Append refuses what this
      // version cannot decode, as the Kafka one does.
      std::lock_guard<std::mutex> lock(f.work->mutex);
      f.work->plans.push_back("VFP2 an older aggregator's plan");
      f.work->plans.push_back("VFP2 and its next one");
    }
    f.Append(f.Plan(1, join.incarnation));
    auto answered = f.Receive(5s, ShareKind::kShare);
    ASSERT_FALSE(answered.empty());
    EXPECT_EQ(answered.back().share.kind, ShareKind::kShare);
    f.Stop();
  }
  const auto said = warnings.With("a federated message of an older vipsd (VFP2/VFS2");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("answers only plans of its own version (said once per run)"),
            std::string::npos)
      << said[0];
}

TEST(HolderTest, ItsShareLeavesAtThePlansTimePlusItsDelayHoweverLongTheRoundTook) {
  // Issue 49 item 3: the arrival time of a share must not tell the
  // aggregator how long the holder's round took (its batch, its E-step's
  // iterations). A round slowed by 400 ms (a test switch standing in for a
  // slow E-step) sends at the same public time as a fast one.
  int64_t after_issue[2] = {0, 0};
  for (int slow = 0; slow < 2; ++slow) {
    HolderFixture f(slow ? "timing_slow" : "timing_fast");
    f.Start(slow ? 400ms : 0ms);
    const FederatedShare join = f.Join();
    const FederatedPlan plan = f.Plan(1, join.incarnation);
    f.Append(plan);
    auto answered = f.Receive(5s, ShareKind::kShare);
    ASSERT_FALSE(answered.empty());
    ASSERT_EQ(answered.back().share.kind, ShareKind::kShare);
    after_issue[slow] = answered.back().at_ms - plan.issued_ms;
    EXPECT_EQ(f.StepsCharged(), 1);
    if (slow == 0) {
      // As observable as one vipsd: the step and commit counters, σ, the
      // round's outcome, its last round; `vipsd status` names its role.
      for (int i = 0; i < 100 && f.metrics->steps_total().Value() < 1; ++i) {
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_EQ(f.metrics->steps_total().Value(), 1);
      EXPECT_GE(f.metrics->ledger_commits_total().Value(), 2);  // start-up, round 1
      EXPECT_EQ(f.metrics->noise_multiplier().Value(), 1.0);
      EXPECT_EQ(f.metrics->sampling_rate().Value(), 0.5);
      EXPECT_EQ(f.metrics->federation_rounds_total(RoundOutcome::kShare).Value(), 1);
      EXPECT_EQ(f.metrics->federation_last_round().Value(), 1);
      EXPECT_EQ(f.metrics->federation_holder_stopped().Value(), 0);
      EXPECT_GT(f.metrics->privacy_epsilon_spent().Value(), 0);
      StateStatusOptions options;
      options.directory = f.config.state_directory;
      auto status = StateStatus(options);
      ASSERT_TRUE(status.ok()) << status.status().ToString();
      EXPECT_NE(status->text.find("role:"), std::string::npos) << status->text;
      EXPECT_NE(status->text.find("holder\n"), std::string::npos) << status->text;
      EXPECT_NE(status->text.find("holder_id:"), std::string::npos) << status->text;
      EXPECT_NE(status->text.find("last_round_masked:"), std::string::npos) << status->text;
      EXPECT_NE(status->text.find("rounds_shared_this_run:"), std::string::npos) << status->text;
      // private_steps counts charged steps, as on every role.
      options.json = true;
      auto json = StateStatus(options);
      ASSERT_TRUE(json.ok());
      EXPECT_NE(json->text.find("\"private_steps\": 0"), std::string::npos)
          << "fixed-seed noise: " << json->text;
      EXPECT_NE(json->text.find("\"fixed_seed_steps\": 1"), std::string::npos) << json->text;
      EXPECT_NE(json->text.find("\"rounds_charged\": 1"), std::string::npos) << json->text;
      EXPECT_NE(json->text.find("\"last_round_masked\": 1"), std::string::npos) << json->text;
    }
  }
  // Never before its time, and not much after (the poll and the scheduler).
  for (int64_t t : after_issue) {
    EXPECT_GE(t, kShareDelayMs);
    EXPECT_LT(t, kShareDelayMs + 250);
  }
  EXPECT_LT(std::abs(after_issue[1] - after_issue[0]), 250)
      << "fast " << after_issue[0] << " ms, slow " << after_issue[1] << " ms";
}

TEST(HolderTest, AShareNotReadyAtItsTimeIsNeverSentAndTheHolderStopsForTheRun) {
  HolderFixture f("overrun");
  f.Start(1500ms);  // past its share time (1 s after the plan)
  const FederatedShare join = f.Join();
  f.Append(f.Plan(1, join.incarnation));
  // Nothing at all: sent late, its time would tell how long the round took.
  for (const auto& message : f.Receive(3s)) {
    ADD_FAILURE() << "a message of kind " << static_cast<int>(message.share.kind) << " at "
                  << message.at_ms;
  }
  EXPECT_EQ(f.StepsCharged(), 1);  // charged all the same: it read and noised
  EXPECT_EQ(f.metrics->federation_rounds_total(RoundOutcome::kWithheld).Value(), 1);
  EXPECT_EQ(f.metrics->federation_holder_stopped().Value(), 1);
  EXPECT_EQ(f.metrics->steps_total().Value(), 1);
  // Stopped for the run: a plan that does not name it brings no join.
  f.Append(f.Plan(2, join.incarnation, /*named=*/false));
  for (const auto& message : f.Receive(4s)) {
    EXPECT_NE(message.share.kind, ShareKind::kJoin);
  }
  EXPECT_FALSE(f.done);  // it keeps running (an operator restarts it)
}

TEST(HolderTest, AWindowOverCapacityDeclinesAtTheShareTimeOnceAndStopsTheRun) {
  // Issue 49 item 4: a decline that depends on the data (how many records
  // the window holds) used to repeat every round, one bit each time. Now:
  // once per run, at the share time, with a reason that does not say which
  // failure it was.
  HolderFixture f("overflow", "pool:\n  capacity: 2\n");
  f.Start();
  const FederatedShare join = f.Join();
  const FederatedPlan plan = f.Plan(1, join.incarnation);
  f.Append(plan);
  auto answered = f.Receive(5s, ShareKind::kDecline);
  ASSERT_FALSE(answered.empty());
  EXPECT_EQ(answered.back().share.kind, ShareKind::kDecline);
  EXPECT_EQ(answered.back().share.reason, "this holder stopped for this run");
  EXPECT_GE(answered.back().at_ms - plan.issued_ms, kShareDelayMs);
  EXPECT_EQ(f.StepsCharged(), 0);
  f.Append(f.Plan(2, join.incarnation, /*named=*/false));
  for (const auto& message : f.Receive(4s)) {
    EXPECT_NE(message.share.kind, ShareKind::kJoin);
  }
}

TEST(HolderTest, InputNotReadToTheCutByTheShareTimeDeclinesOnceUnchargedAndStopsTheRun) {
  // Issue 49 item 4, the other data-dependent failure: how fast the input is
  // read. The decline leaves at the share time with the fixed reason (which
  // failure it was stays in the holder's log), nothing is charged, and the
  // holder asks to join no more this run.
  LevelLog errors(LogLevel::kError);
  {
    HolderFixture f("stalled");
    f.Start(0ms, /*stalled_input=*/true);
    const FederatedShare join = f.Join();
    const FederatedPlan plan = f.Plan(1, join.incarnation);
    f.Append(plan);
    auto answered = f.Receive(5s, ShareKind::kDecline);
    ASSERT_FALSE(answered.empty());
    EXPECT_EQ(answered.back().share.kind, ShareKind::kDecline);
    EXPECT_EQ(answered.back().share.reason, "this holder stopped for this run");
    EXPECT_GE(answered.back().at_ms - plan.issued_ms, kShareDelayMs);
    EXPECT_EQ(f.StepsCharged(), 0);
    EXPECT_EQ(f.metrics->federation_holder_stopped().Value(), 1);
    f.Append(f.Plan(2, join.incarnation, /*named=*/false));
    for (const auto& message : f.Receive(3s)) {
      EXPECT_NE(message.share.kind, ShareKind::kJoin);
    }
    f.Stop();
  }
  EXPECT_EQ(errors
                .With("its input was not read to the slot's cut by its share time "
                      "(nothing charged)")
                .size(),
            1u);
}

TEST(HolderTest, ABudgetWarningIsRecordedWithItsRoundsCommitAndSaidOncePerLevel) {
  // A holder warns of its own budget as one vipsd does: the first round
  // whose charge crosses a warn_at fraction records the level in its ledger
  // with that round's commit, shows it on the metric and says it once; a
  // later round below the next fraction says nothing more.
  LevelLog warnings(LogLevel::kWarning);
  double level_after[2] = {-1, -1};
  {
    HolderFixture f("warning");
    // One round at q = 0.5, σ = 1 spends far more than 1e-6 of a ceiling of
    // 1000 and far less than half of it.
    f.config.warn_at = {1e-6, 0.5};
    f.Start();
    const FederatedShare join = f.Join();
    for (int64_t round = 1; round <= 2; ++round) {
      f.Append(f.Plan(round, join.incarnation));
      auto answered = f.Receive(5s, ShareKind::kShare);
      ASSERT_FALSE(answered.empty());
      ASSERT_EQ(answered.back().share.kind, ShareKind::kShare);
      for (int i = 0; i < 100 && f.metrics->steps_total().Value() < round; ++i) {
        std::this_thread::sleep_for(10ms);
      }
      auto state = f.ReadLedger();
      ASSERT_TRUE(state.ok()) << state.status().ToString();
      EXPECT_EQ(state->accountant.steps(), round);
      level_after[round - 1] = state->warning_level;
      EXPECT_EQ(f.metrics->privacy_budget_warning_level().Value(), 1e-6);
      EXPECT_LT(f.metrics->privacy_epsilon_spent().Value(), 500);
    }
    f.Stop();
  }
  EXPECT_EQ(level_after[0], 1e-6);
  EXPECT_EQ(level_after[1], 1e-6);
  const auto said = warnings.With("privacy budget warning");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("of ceiling=1000 crossed warn_at=1e-06 for this holder's records"),
            std::string::npos)
      << said[0];
}

TEST(HolderTest, APlanOfOtherTermsStopsTheHolderNamingTheKeyBeforeAnythingIsCharged) {
  HolderFixture f("mismatch");
  f.Start();
  const FederatedShare join = f.Join();
  std::string terms = join.terms;
  const std::string from = "source.timestamps: log_append_time";
  terms.replace(terms.find(from), from.size(), "source.timestamps: create_time");
  f.Append(f.Plan(1, join.incarnation, /*named=*/false, terms));
  for (int i = 0; i < 200 && !f.done; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(f.done);
  EXPECT_EQ(f.result.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.result.message().find(
                "source.timestamps: aggregator create_time, this holder log_append_time"),
            std::string::npos)
      << f.result.ToString();
  EXPECT_EQ(f.StepsCharged(), 0);
}

TEST(HolderTest, TheAggregatorsRefusalOfItsJoinStopsItWithTheReason) {
  HolderFixture f("refused");
  f.Start();
  const FederatedShare join = f.Join();
  FederatedRefusal refusal{"fedjob", 1, std::string(32, 'a'), "h1", join.incarnation,
                           "privacy.noise_multiplier: aggregator 2, holder 1"};
  ASSERT_TRUE(f.plans.Append(EncodeFederatedRefusal(refusal)).ok());
  for (int i = 0; i < 200 && !f.done; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(f.done);
  EXPECT_EQ(f.result.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.result.message().find("privacy.noise_multiplier: aggregator 2, holder 1"),
            std::string::npos);
}

}  // namespace
}  // namespace vipsd::daemon
