// Coordinator: the shared step (daemon/step/coordinator.h) — with a Worker over
// an in-memory work topic, the step is bit for bit the step one process
// takes; a partition no process can hold stops stepping; a coordinator that
// lost the job stops waiting.
#include "daemon/step/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "core/privacy/mechanisms/privacy_unit.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "daemon/setup/federation.h"
#include "daemon/step/aggregator.h"
#include "daemon/step/worker.h"
#include "tests/testing/memory_ledger_log.h"
#include "tests/testing/work_fixture.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// The coordinator's process: its ledger (claimed on an in-memory ledger
// topic), model, driver and the ingest of the partitions it holds.
struct CoordinatorProcess {
  RunControl control;
  ModelBundle bundle;
  std::unique_ptr<privacy::NoiseSource> noise;
  std::unique_ptr<LedgerKeeper> keeper;
  std::unique_ptr<svi::StepDriver> driver;
  std::shared_ptr<SinkLog> log = std::make_shared<SinkLog>();
  FakeSink sink{log};
  std::unique_ptr<Ingest> ingest;
  svi::RecordPool pool;  // as the daemon's (StepParts::pool)
  std::unique_ptr<Coordinator> coordinator;
  bool fenced = false;
  SlotTargets targets;
  std::map<std::string, int64_t> cuts_found;  // what the step's partials named
  int64_t model_step = 0;  // the step whose M-step the model includes

  CoordinatorProcess(WorkFixture& f, MemoryLog& ledger_log, std::set<int32_t> partitions) {
    bundle = std::move(BuildModel(f.config)).value();
    noise = std::move(privacy::SecureNoiseSource::CreateReproducible(7)).value();
    auto replica = std::move(LedgerReplica::Create(std::make_unique<MemoryLedgerLog>(&ledger_log),
                                                   f.config.ledger_key))
                       .value();
    EXPECT_TRUE(replica->Claim(std::nullopt, "ledger").ok());
    LedgerState state;
    state.run_id = std::string(32, 'c');
    state.model_type = bundle.model->type();
    state.model_fingerprint = bundle.model_fingerprint;
    state.windows = *svi::SlotWindows::Create(1000, 1, svi::kWindowAll);
    EXPECT_TRUE(state.windows.AddStream("docs:0", 0).ok());
    EXPECT_TRUE(state.windows.AddStream("docs:1", 0).ok());
    // Slot 1's cuts: everything in the log now.
    const std::map<std::string, int64_t> cuts{
        {"docs:0", static_cast<int64_t>(f.topic->partitions[0].size())},
        {"docs:1", static_cast<int64_t>(f.topic->partitions[1].size())}};
    EXPECT_TRUE(state.windows.RecordCuts(1, cuts).ok());
    keeper = std::make_unique<LedgerKeeper>(std::move(Ledger::Open(f.dir + "/state")).value(),
                                            std::move(state), std::move(replica),
                                            f.dir + "/state", f.metrics.get());
    svi::DriverConfig driver_config = f.config.driver;
    driver_config.adaptivity = AccountingAdaptivity();
    driver = std::move(svi::StepDriver::Create(bundle.model.get(), noise.get(), *keeper,
                                               driver_config, 1))
                 .value();
    ingest = std::make_unique<Ingest>(bundle.decoder.get(), &sink, f.metrics.get(), &control,
                                      /*cover_every_stream=*/true);
    ingest->SetResumeOffsets({{"docs:0", 0}, {"docs:1", 0}}, /*covered=*/true);
    // Every stream's cut is its end (no slot time to cut by).
    targets = SlotTargets::AtEnds(cuts);
    ingest->SetTargets(targets);
    Ingest* self = ingest.get();
    ingest->Start(std::make_unique<FakeSource>(
        f.topic, [self](const std::string& t, int32_t p) { return self->ResumeOffset(t, p); },
        partitions));
    coordinator = std::make_unique<Coordinator>(
        std::make_unique<MemoryWorkExchange>(f.work, WorkRole::kCoordinator), &control);
  }
  ~CoordinatorProcess() {
    control.RequestStop();
    ingest->Stop();
    ingest->Join();
  }
  StatusOr<svi::StepResult> Step(WorkFixture& f, SlotOutputs* out) {
    StepParts parts;
    parts.config = &f.config;
    parts.driver = driver.get();
    parts.ingest = ingest.get();
    parts.keeper = keeper.get();
    parts.bundle = &bundle;
    parts.pool = &pool;
    parts.on_fenced = [this](const Status&) { fenced = true; };
    coordinator->Bind(std::move(parts));
    auto result = coordinator->Step(1, targets, model_step, out);
    cuts_found = coordinator->TakeCuts();
    if (result.ok()) model_step = result->step;
    return result;
  }
};

// A source whose first poll comes `delay` late: its process sums later.
class SlowStart final : public ForwardingSource {
 public:
  SlowStart(std::unique_ptr<InputSource> inner, std::chrono::milliseconds delay)
      : ForwardingSource(std::move(inner)), delay_(delay) {}
  StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds timeout) override {
    if (delay_ > 0ms) std::this_thread::sleep_for(std::exchange(delay_, 0ms));
    return ForwardingSource::Poll(max_records, timeout);
  }

 private:
  std::chrono::milliseconds delay_;
};

// A worker process reading `partitions`, in its own state directory.
struct WorkerProcess {
  std::unique_ptr<Worker> worker;
  std::thread thread;
  Status result = Status::Ok();
  WorkerProcess(WorkFixture& f, std::set<int32_t> partitions, int64_t pool_capacity = 100000,
                const std::string& name = "worker",
                std::chrono::milliseconds first_poll_delay = 0ms) {
    config::VipsdConfig config = f.config;
    config.state_directory = f.dir + "/" + name + "-state";
    config.pool_capacity = pool_capacity;
    SourceFactory sources = f.Partitions(std::move(partitions));
    if (first_poll_delay > 0ms) {
      sources = [sources, first_poll_delay](ResumeOffsetFn resume)
          -> StatusOr<std::unique_ptr<InputSource>> {
        VIPSD_ASSIGN_OR_RETURN(auto inner, sources(std::move(resume)));
        return std::unique_ptr<InputSource>(new SlowStart(std::move(inner), first_poll_delay));
      };
    }
    worker = std::move(Worker::Create(config, std::move(sources),
                                      std::make_unique<FakeSink>(std::make_shared<SinkLog>()),
                                      f.metrics.get(),
                                      std::make_unique<MemoryWorkExchange>(f.work,
                                                                           WorkRole::kWorker),
                                      f.options))
                 .value();
    thread = std::thread([this] { result = worker->Run(); });
  }
  ~WorkerProcess() {
    worker->RequestStop();
    thread.join();
  }
};

// Step 1 in one process on every record of `log`'s partitions 0 and 1 (with
// their message keys), with the fixture's configuration and noise seed.
struct SoloResult {
  std::vector<model::NamedArray> arrays;  // the model after the step
  double rho = 0;
  privacy::RdpAccountant accountant;
};
SoloResult SoloStep(const WorkFixture& f, const FakeTopic& log) {
  SoloResult result;
  ModelBundle solo = std::move(BuildModel(f.config)).value();
  auto noise = std::move(privacy::SecureNoiseSource::CreateReproducible(7)).value();
  svi::DriverConfig driver_config = f.config.driver;
  driver_config.adaptivity = AccountingAdaptivity();
  auto driver = std::move(svi::StepDriver::Create(solo.model.get(), noise.get(),
                                                  &result.accountant, driver_config, 1))
                    .value();
  std::vector<std::vector<model::Record>> records(2);
  std::vector<svi::StreamCandidates> streams(2);
  for (int partition = 0; partition < 2; ++partition) {
    streams[partition].stream = "docs:" + std::to_string(partition);
    for (const auto& entry : log.partitions.at(partition)) {
      records[partition].push_back(
          std::get<model::Record>(solo.decoder->DecodeKeyed(entry.payload, entry.key)));
    }
    for (size_t i = 0; i < records[partition].size(); ++i) {
      streams[partition].records.push_back(&records[partition][i]);
      streams[partition].offsets.push_back(static_cast<int64_t>(i));
    }
  }
  auto alone = driver->Step(streams);
  EXPECT_TRUE(alone.ok()) << alone.status().ToString();
  if (alone.ok()) result.rho = alone->rho;
  result.arrays = solo.model->CheckpointArrays();
  return result;
}

// The coordinator's model after its step is the solo step's, bit for bit.
void ExpectSameModel(const CoordinatorProcess& coordinator, const SoloResult& alone) {
  const auto a = coordinator.bundle.model->CheckpointArrays();
  ASSERT_EQ(a.size(), alone.arrays.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, alone.arrays[i].data) << a[i].name;
}

TEST(CoordinatorTest, ASharedStepIsBitForBitTheStepOfOneProcess) {
  WorkFixture f("coordinator_equal");
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {0});
  WorkerProcess worker(f, {1});
  SlotOutputs out;
  auto shared = coordinator.Step(f, &out);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared->step, 1);
  EXPECT_EQ(out.partials_local, 1);   // docs:0, summed here
  EXPECT_EQ(out.partials_remote, 1);  // docs:1, by the worker
  EXPECT_EQ(out.window_offsets, 9);
  EXPECT_EQ(shared->mechanism.sampling_rate, f.config.driver.mechanism.sampling_rate);

  // One process, the same seed, every record of both windows.
  const SoloResult alone = SoloStep(f, *f.topic);
  EXPECT_EQ(alone.rho, shared->rho);
  ExpectSameModel(coordinator, alone);
  EXPECT_EQ(coordinator.keeper->state().accountant, alone.accountant);  // the same charge
}

// Unit-level shared work (issue 28): unit u's records sit in both
// partitions, docs:0 summed here and docs:1 by a worker. u counts only in
// its home partition (the one its key's murmur2 hash sends it to), so it
// contributes one clipped vector, not one per process: the shared step
// equals, bit for bit, one process's step on the same log without u's
// records outside its home (appended last there, so no other offset moves).
TEST(CoordinatorTest, AUnitCountsOnlyInItsHomePartitionWhenTheWorkIsShared) {
  const std::string unit_lines =
      "  unit: key\n  max_records_per_unit: 3\n  unit_partitioner: murmur2\n";
  auto home = [](const std::string& key) {
    return privacy::UnitHomePartition(
        privacy::UnitKeyHash(privacy::UnitPartitioner::kMurmur2, key), 2);
  };
  // Keys by home partition: three units at home in each, and u.
  std::vector<std::string> at_home[2];
  for (int i = 0; at_home[0].size() < 4 || at_home[1].size() < 3; ++i) {
    const std::string key = "unit-" + std::to_string(i);
    if (at_home[home(key)].size() < (home(key) == 0 ? 4u : 3u)) at_home[home(key)].push_back(key);
  }
  const std::string u = at_home[0].back();  // home: docs:0
  const char* texts[] = {"apple banana apple cherry", "date elder fig fig", "fig apple"};
  auto fill = [&](FakeTopic& topic, bool strays) {
    int n = 0;
    for (int partition = 0; partition < 2; ++partition) {
      for (const std::string& key : at_home[partition]) {
        const int records = key == u ? 5 : 1 + n % 3;
        for (int r = 0; r < records; ++r, ++n) {
          topic.Append(partition, "{\"id\": " + std::to_string(n) + ", \"text\": \"" +
                                      texts[n % 3] + "\"}", 1.0, key);
        }
      }
    }
    // u's records outside its home partition, last in docs:1.
    for (int r = 0; strays && r < 4; ++r, ++n) {
      topic.Append(1, "{\"id\": " + std::to_string(n) + ", \"text\": \"" + texts[n % 3] + "\"}",
                   1.0, u);
    }
  };
  // q = 1: every unit, u included, is kept in the step.
  WorkFixture f("coordinator_unit", unit_lines, /*records=*/false, /*q=*/"1");
  fill(*f.topic, /*strays=*/true);
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {0});
  WorkerProcess worker(f, {1});
  SlotOutputs out;
  auto shared = coordinator.Step(f, &out);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(out.partials_local, 1);
  EXPECT_EQ(out.partials_remote, 1);

  // One process on the log without the strays, every unit in one partition.
  ASSERT_EQ(f.config.driver.max_records_per_unit, 3);
  FakeTopic alone_log;
  fill(alone_log, /*strays=*/false);
  const SoloResult alone = SoloStep(f, alone_log);
  ExpectSameModel(coordinator, alone);
}

// Issue 30: a coordinator that holds no partition (state.work_partitions:
// false) merges one pre-summed partial from the worker that holds both; the
// step is still bit for bit one process's.
TEST(CoordinatorTest, ACoordinatorWithoutPartitionsMergesOnePreSummedPartial) {
  WorkFixture f("coordinator_presummed");
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {});
  WorkerProcess worker(f, {0, 1});
  SlotOutputs out;
  auto shared = coordinator.Step(f, &out);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(out.partials_local, 0);
  EXPECT_EQ(out.partials_remote, 1);  // docs:0 and docs:1 in one partial
  EXPECT_EQ(coordinator.cuts_found.at("docs:0"), 5);
  EXPECT_EQ(coordinator.cuts_found.at("docs:1"), 4);
  const SoloResult alone = SoloStep(f, *f.topic);
  ExpectSameModel(coordinator, alone);
}

// Partials that arrive together are decoded on the coordinator's threads
// (schedule.threads), then merged in log order: still bit for bit one
// process's step, with one partial from each of two workers.
TEST(CoordinatorTest, PartialsDecodedOnSeveralThreadsGiveOneProcesssStep) {
  WorkFixture f("coordinator_parallel_decode");
  f.config.driver.threads = 4;
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {});
  WorkerProcess zero(f, {0}, 100000, "zero");
  WorkerProcess one(f, {1}, 100000, "one");
  SlotOutputs out;
  auto shared = coordinator.Step(f, &out);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(out.partials_remote, 2);
  EXPECT_EQ(coordinator.cuts_found.at("docs:0"), 5);
  EXPECT_EQ(coordinator.cuts_found.at("docs:1"), 4);
  const SoloResult alone = SoloStep(f, *f.topic);
  ExpectSameModel(coordinator, alone);
}

// Two processes hold docs:1 at once (as during a rebalance): their
// pre-summed partials overlap. The coordinator merges the first ({docs:1},
// from the process that starts reading at once) and refuses the other
// ({docs:0, docs:1}, 400 ms later) whole; its reminder (partials_read past
// the refused partial) makes that worker send docs:0 on its own. The step
// counts docs:1 once: bit for bit one process's.
TEST(CoordinatorTest, OverlappingPartialsAreRefusedWholeAndTheMissingPartitionComesAgain) {
  WorkFixture f("coordinator_overlap");
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {});
  WorkerProcess one(f, {1}, 100000, "one");
  WorkerProcess both(f, {0, 1}, 100000, "both", /*first_poll_delay=*/400ms);
  SlotOutputs out;
  const auto start = std::chrono::steady_clock::now();
  auto shared = coordinator.Step(f, &out);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(out.partials_local, 0);
  EXPECT_EQ(out.partials_remote, 2);  // {docs:1}, then {docs:0} after the refusal
  // The resend waited for a reminder (one a second).
  EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms);
  const SoloResult alone = SoloStep(f, *f.topic);
  ExpectSameModel(coordinator, alone);
}

// Stops `coordinator` after `limit` (its Step then returns CANCELLED), so
// that a step that would wait for ever fails the test instead of hanging it.
class Watchdog {
 public:
  Watchdog(RunControl* control, std::chrono::milliseconds limit)
      : thread_([this, control, limit] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_cv_.wait_for(lock, limit, [this] { return done_; })) control->RequestStop();
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// The coordinator's step, cancelled if it is still waiting after `limit`.
StatusOr<svi::StepResult> StepWithin(CoordinatorProcess& coordinator, WorkFixture& f,
                                     SlotOutputs* out, std::chrono::milliseconds limit) {
  Watchdog watchdog(&coordinator.control, limit);
  return coordinator.Step(f, out);
}

// Retention took the worker's partial before the coordinator read it (a
// work topic over its retention.bytes): the coordinator counts it as read,
// its reminder's partials_read says so, and the worker sums its partitions
// again. Before, the step waited for ever.
TEST(CoordinatorTest, APartialThatRetentionTookBeforeItWasReadIsSummedAgain) {
  WorkFixture f("coordinator_partial_lost");
  f.work->partials_lost_on_append = 1;
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {});
  WorkerProcess worker(f, {0, 1});
  SlotOutputs out;
  auto shared = StepWithin(coordinator, f, &out, 20s);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(out.partials_remote, 1);  // the second copy; the first was never read
  EXPECT_EQ(f.work->partials.size(), 2u);
  const SoloResult alone = SoloStep(f, *f.topic);
  ExpectSameModel(coordinator, alone);
}

// Retention took the step's plan before the worker read it: a reminder
// names the full plan's offset for the model, which no process could read
// any more. The coordinator appends the plan again with the model, and the
// step finishes, bit for bit one process's.
TEST(CoordinatorTest, APlanThatRetentionTookIsAppendedAgainWithTheModel) {
  WorkFixture f("coordinator_plan_lost");
  f.work->plans_lost_on_append = 1;
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {});
  WorkerProcess worker(f, {0, 1});
  SlotOutputs out;
  auto shared = StepWithin(coordinator, f, &out, 20s);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(out.partials_remote, 1);
  bool said = false;
  for (const auto& [level, line] : out.log_lines) {
    said = said || line.find("no longer held its plan (retention)") != std::string::npos;
  }
  EXPECT_TRUE(said);
  {
    std::lock_guard<std::mutex> lock(f.work->mutex);
    // The plan (lost), then the plan again (and, once the step's M-step
    // ran, perhaps its released sum: WorkRelease).
    ASSERT_GE(f.work->plans.size(), 2u);
    EXPECT_EQ(*WorkMessageKindOf(f.work->plans[0]), WorkMessageKind::kPlan);
    ASSERT_EQ(*WorkMessageKindOf(f.work->plans[1]), WorkMessageKind::kPlan);
    for (size_t i = 2; i < f.work->plans.size(); ++i) {
      EXPECT_EQ(*WorkMessageKindOf(f.work->plans[i]), WorkMessageKind::kRelease);
    }
    auto again = DecodeWorkPlan(f.work->plans[1]);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->model.empty());
  }
  const SoloResult alone = SoloStep(f, *f.topic);
  ExpectSameModel(coordinator, alone);
}

// Issue 30: after the first plan, a plan carries the previous step's
// released sum instead of the model, and the worker's M-step on it gives the
// coordinator's model: three shared steps are bit for bit three steps of one
// process (a worker that summed with another model would change the sums).
// For each model: the worker M-steps each released sum as the coordinator
// does (the model's MStep on the same doubles, q and ρ_t); a worker model
// that differed would change its partials of steps 2 and 3 (every model's
// E-step reads the model), and the final model would not be one process's.
class CoordinatorDeltaTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CoordinatorDeltaTest, PlansCarryTheReleasedSumAfterTheFirstAndTheRunStaysOneProcesss) {
  WorkFixture f("coordinator_delta_" + GetParam(), "", /*records=*/true, /*q=*/"0.5", GetParam());
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {0});
  WorkerProcess worker(f, {1});
  for (int t = 1; t <= 3; ++t) {
    SlotOutputs out;
    auto shared = StepWithin(coordinator, f, &out, 20s);
    ASSERT_TRUE(shared.ok()) << shared.status().ToString();
    EXPECT_EQ(shared->step, t);
    EXPECT_EQ(out.partials_remote, 1);
  }
  // The plan log: each plan, then (a worker took part) that step's released
  // sum as soon as it was drawn, which the next plan names by its offset.
  std::vector<WorkPlan> plans;
  std::vector<int64_t> plan_offsets;
  std::vector<WorkRelease> releases;
  std::vector<int64_t> release_offsets;
  {
    std::lock_guard<std::mutex> lock(f.work->mutex);
    for (size_t offset = 0; offset < f.work->plans.size(); ++offset) {
      const std::string& bytes = f.work->plans[offset];
      if (*WorkMessageKindOf(bytes) == WorkMessageKind::kRelease) {
        releases.push_back(*DecodeWorkRelease(bytes));
        release_offsets.push_back(static_cast<int64_t>(offset));
      } else {
        plans.push_back(*DecodeWorkPlan(bytes));
        plan_offsets.push_back(static_cast<int64_t>(offset));
      }
    }
  }
  ASSERT_EQ(plans.size(), 3u);  // no reminder: every partial came within a second
  // The third step's release may still be on its way (the next plan or the
  // coordinator's end waits for it); the first two came before plans 2, 3.
  ASSERT_GE(releases.size(), 2u);
  ASSERT_LE(releases.size(), 3u);
  EXPECT_FALSE(plans[0].model.empty());
  EXPECT_TRUE(plans[0].delta_sum.empty());
  for (size_t i = 1; i < plans.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(plans[i].model.empty());
    // The sum appended ahead is named, not sent again.
    EXPECT_TRUE(plans[i].has_delta());
    EXPECT_TRUE(plans[i].delta_sum.empty());
    EXPECT_EQ(plans[i].delta_release_offset, release_offsets[i - 1]);
    EXPECT_EQ(plans[i].delta_base, plans[i - 1].step);
    EXPECT_EQ(plans[i].delta_base_offset, plan_offsets[i - 1]);
    EXPECT_EQ(plans[i].delta_step, plans[i - 1].step);
    EXPECT_EQ(plans[i].delta_mechanism.sampling_rate, f.config.driver.mechanism.sampling_rate);
    const WorkRelease& release = releases[i - 1];
    EXPECT_GT(release_offsets[i - 1], plan_offsets[i - 1]);
    EXPECT_LT(release_offsets[i - 1], plan_offsets[i]);
    EXPECT_EQ(release.job, plans[i].job);
    EXPECT_EQ(release.epoch, plans[i].epoch);
    EXPECT_EQ(release.owner, plans[i].owner);
    EXPECT_EQ(release.step, plans[i].delta_base);
    EXPECT_EQ(release.slot, plans[i - 1].slot);
    EXPECT_EQ(release.delta_step, plans[i].delta_step);
    EXPECT_EQ(release.delta_mechanism.sampling_rate, plans[i].delta_mechanism.sampling_rate);
    EXPECT_EQ(release.delta_rho, plans[i].delta_rho);
    EXPECT_LT(release.delta_sum.size(), plans[0].model.size());
  }
  // The worker had applied both ahead when plans 2 and 3 came: its partials
  // of those steps were summed with that model.
  EXPECT_EQ(worker.worker->releases_applied_ahead(), 2);
  // One process, the same seed, three steps on the same windows.
  ModelBundle solo = std::move(BuildModel(f.config)).value();
  auto noise = std::move(privacy::SecureNoiseSource::CreateReproducible(7)).value();
  privacy::RdpAccountant accountant;
  svi::DriverConfig driver_config = f.config.driver;
  driver_config.adaptivity = AccountingAdaptivity();
  auto driver = std::move(svi::StepDriver::Create(solo.model.get(), noise.get(), &accountant,
                                                  driver_config, 1))
                    .value();
  std::vector<std::vector<model::Record>> records(2);
  std::vector<svi::StreamCandidates> streams(2);
  for (int partition = 0; partition < 2; ++partition) {
    streams[partition].stream = "docs:" + std::to_string(partition);
    for (const auto& entry : f.topic->partitions.at(partition)) {
      records[partition].push_back(
          std::get<model::Record>(solo.decoder->DecodeKeyed(entry.payload, entry.key)));
    }
    for (size_t i = 0; i < records[partition].size(); ++i) {
      streams[partition].records.push_back(&records[partition][i]);
      streams[partition].offsets.push_back(static_cast<int64_t>(i));
    }
  }
  std::vector<double> rhos;
  for (int t = 1; t <= 3; ++t) {
    auto alone = driver->Step(streams);
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    rhos.push_back(alone->rho);
  }
  EXPECT_EQ(plans[1].delta_rho, rhos[0]);
  EXPECT_EQ(plans[2].delta_rho, rhos[1]);
  SoloResult alone;
  alone.arrays = solo.model->CheckpointArrays();
  ExpectSameModel(coordinator, alone);
}

INSTANTIATE_TEST_SUITE_P(Models, CoordinatorDeltaTest, ::testing::Values("lda", "blr", "sbn"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param;
                         });

// One pool whatever the mode (core/svi/record_pool.h): a process's own
// partitions are summed from its RecordPool, the records moving there out
// of ingest's staging as it sums them; they count as held for
// pool.capacity, a window's start evicts them, and a window that goes back
// below an earlier start reads the partition again into an emptied pool
// stream, so that its sum is the same.
TEST(CoordinatorTest, AProcessSumsItsOwnPartitionsFromItsPool) {
  WorkFixture f("coordinator_pool");
  MemoryLog ledger_log;
  CoordinatorProcess p(f, ledger_log, {0, 1});
  auto complete = [&](const std::string& stream) {
    for (int i = 0; i < 1000 && !p.ingest->Complete(stream); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return p.ingest->Complete(stream);
  };
  ASSERT_TRUE(complete("docs:0") && complete("docs:1"));
  auto held = [&] {
    return p.ingest->Progress({}, [](const std::string&) { return int64_t{0}; }).held;
  };
  EXPECT_EQ(p.pool.size(), 0);
  EXPECT_EQ(held(), 9);  // staged
  auto ticket = p.driver->Begin();
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  WorkPlan plan;
  plan.key = ticket->key;
  plan.streams = {{"docs:0", 0, 5, 5}, {"docs:1", 0, 4, 4}};
  auto sum = [&](const std::vector<LocalStream>& streams) {
    std::vector<std::string> sums(streams.size());
    const Status summed = SumLocalStreams(
        *p.ingest, p.pool, *p.driver, plan, streams,
        [&](size_t index, privacy::GaussianSumMechanism& partial) -> Status {
          VIPSD_ASSIGN_OR_RETURN(sums[index], partial.EncodeUnreleased());
          return Status::Ok();
        });
    EXPECT_TRUE(summed.ok()) << summed.ToString();
    return sums;
  };
  const std::vector<std::string> both = sum({{&plan.streams[0], 5}, {&plan.streams[1], 4}});
  EXPECT_EQ(p.pool.size(), 9);
  EXPECT_EQ(held(), 9);  // pooled now
  EXPECT_NE(both[0], both[1]);
  EXPECT_EQ(sum({{&plan.streams[0], 5}, {&plan.streams[1], 4}}), both);  // summed again
  DropLocalBelow(*p.ingest, p.pool, "docs:0", 2);
  EXPECT_EQ(p.pool.size(), 7);
  EXPECT_EQ(held(), 7);
  p.pool.ForEach([](const model::Record&, const svi::RecordOrigin& origin, int64_t) {
    EXPECT_TRUE(origin.stream != 0 || origin.offset >= 2) << origin.offset;
  });
  // The window goes back to 0: docs:0 is read again, and summed whole once.
  DropLocalBelow(*p.ingest, p.pool, "docs:0", 0);
  EXPECT_EQ(p.pool.size(), 4);
  ASSERT_TRUE(complete("docs:0"));
  const std::vector<std::string> again = sum({{&plan.streams[0], 5}});
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0], both[0]);
  EXPECT_EQ(p.pool.size(), 9);
  EXPECT_EQ(held(), 9);
  p.driver->Abandon(*ticket);
}

TEST(CoordinatorTest, APartitionNoProcessCanHoldStopsStepping) {
  WorkFixture f("coordinator_overflow");
  MemoryLog ledger_log;
  // More of docs:1's window than one poll brings, and more than the
  // worker's pool.capacity: it cannot complete the window.
  for (int i = 0; i < 600; ++i) f.topic->Append(1, "{\"id\": 1, \"text\": \"fig\"}");
  CoordinatorProcess coordinator(f, ledger_log, {0});
  WorkerProcess worker(f, {1}, /*pool_capacity=*/100);
  SlotOutputs out;
  auto result = coordinator.Step(f, &out);
  EXPECT_EQ(result.status().code(), StatusCode::kOutOfRange) << result.status().ToString();
  EXPECT_THAT(result.status().message(), HasSubstr("docs:1"));
  EXPECT_THAT(result.status().message(), HasSubstr("the step was charged"));
  // Charged and its number consumed: an overcount, never an undercount.
  EXPECT_EQ(coordinator.driver->next_step(), 2);
  EXPECT_EQ(coordinator.keeper->state().accountant.steps(), 1);
  // The slot loop stops stepping as one process's overflow stops it.
  EXPECT_EQ(coordinator.coordinator->Classify(result.status()), StepFailure::kWindowOverflow);
}

TEST(CoordinatorTest, OnlyAWindowNoProcessCanHoldIsAnOverflow) {
  WorkFixture f("coordinator_classify");
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {0, 1});
  SlotOutputs out;
  ASSERT_TRUE(coordinator.Step(f, &out).ok());
  // An OUT_OF_RANGE from the M-step (a statistic sum that is not finite)
  // after a step whose windows all fitted is a failed step: said as such,
  // its charge recorded, stepping not stopped for pool.capacity.
  EXPECT_EQ(coordinator.coordinator->Classify(OutOfRangeError("blr statistics are not finite")),
            StepFailure::kFailed);
  EXPECT_EQ(coordinator.coordinator->Classify(CancelledError("stopping")), StepFailure::kQuiet);
  EXPECT_EQ(coordinator.coordinator->Classify(UnavailableError("no partial")),
            StepFailure::kFailed);
}

TEST(CoordinatorTest, ACoordinatorThatLostTheJobStopsWaitingForPartials) {
  WorkFixture f("coordinator_fenced");
  MemoryLog ledger_log;
  CoordinatorProcess coordinator(f, ledger_log, {0});
  // Nobody holds docs:1; meanwhile another process claims the job.
  auto other = std::move(LedgerReplica::Create(std::make_unique<MemoryLedgerLog>(&ledger_log),
                                               f.config.ledger_key))
                   .value();
  ASSERT_TRUE(other->Claim(std::nullopt, "other/ledger").ok());
  SlotOutputs out;
  const auto start = std::chrono::steady_clock::now();
  auto result = coordinator.Step(f, &out);
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
  EXPECT_TRUE(coordinator.fenced);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

// A federation's aggregator (daemon/step/aggregator.h) on the coordinator's
// process (ledger, driver, model; it reads no partition), with holders h1
// and h2 whose messages the test appends to the share log.
struct AggregatorRounds {
  WorkFixture f{"aggregator_leave"};
  MemoryLog ledger_log;
  std::unique_ptr<CoordinatorProcess> process;
  std::unique_ptr<Aggregator> aggregator;
  MemoryWorkExchange holders{f.work, WorkRole::kWorker};
  std::string terms;

  AggregatorRounds() {
    auto h1 = WriteNewHolderKey(f.dir + "/h1.key");
    auto h2 = WriteNewHolderKey(f.dir + "/h2.key");
    EXPECT_TRUE(h1.ok() && h2.ok());
    f.config.federation.role = config::FederationRole::kAggregator;
    f.config.federation.tolerated_holders = 1;  // a round needs both
    f.config.federation.round_timeout_seconds = 1;
    f.config.federation.holders = {{"h1", h1.ok() ? *h1 : ""}, {"h2", h2.ok() ? *h2 : ""}};
    process = std::make_unique<CoordinatorProcess>(f, ledger_log, std::set<int32_t>{});
    aggregator = std::make_unique<Aggregator>(
        std::make_unique<MemoryWorkExchange>(f.work, WorkRole::kCoordinator), &process->control);
    EXPECT_TRUE(aggregator->Configure(f.config.federation).ok());
    StepParts parts;
    parts.config = &f.config;
    parts.driver = process->driver.get();
    parts.ingest = process->ingest.get();
    parts.keeper = process->keeper.get();
    parts.bundle = &process->bundle;
    parts.on_fenced = [](const Status&) {};
    aggregator->Bind(std::move(parts));
    terms = FederationTerms(f.config, process->bundle.record_settings);
  }
  void Send(const std::string& holder, const std::string& incarnation, ShareKind kind) {
    FederatedShare share;
    share.job = f.config.ledger_key;
    share.step = 1;  // a join or leave names no round; the format wants one
    share.holder = holder;
    share.incarnation = incarnation;
    share.kind = kind;
    if (kind == ShareKind::kJoin) share.terms = terms;
    ASSERT_TRUE(holders.Append(EncodeFederatedShare(share)).ok());
  }
  // A round with both holders joined, during which `holder` of
  // `incarnation` sends a leave.
  StatusOr<svi::StepResult> RoundWithALeave(int64_t slot, const std::string& incarnation) {
    Send("h1", std::string(32, 'a'), ShareKind::kJoin);
    Send("h2", std::string(32, 'b'), ShareKind::kJoin);
    std::thread leave([&] {
      std::this_thread::sleep_for(300ms);
      Send("h1", incarnation, ShareKind::kLeave);
    });
    SlotOutputs out;
    auto result = aggregator->Step(slot, process->targets, 0, &out);
    leave.join();
    return result;
  }
};

TEST(AggregatorTest, OnlyTheNamedIncarnationsLeaveAbandonsARound) {
  AggregatorRounds rounds;
  // h1's leave from an earlier incarnation: the round waits for the shares
  // of the incarnations it named (none come: it times out).
  auto stale = rounds.RoundWithALeave(1, std::string(32, '0'));
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable) << stale.status().ToString();
  EXPECT_THAT(stale.status().message(), HasSubstr("no share from h1, h2 within"));
  EXPECT_THAT(stale.status().message(), Not(HasSubstr("it stopped")));
  // The named incarnation's leave ends the round at once, as a decline.
  auto named = rounds.RoundWithALeave(2, std::string(32, 'a'));
  EXPECT_EQ(named.status().code(), StatusCode::kUnavailable) << named.status().ToString();
  EXPECT_THAT(named.status().message(), HasSubstr("h1 declined: it stopped"));
  EXPECT_EQ(rounds.aggregator->Classify(named.status()), StepFailure::kFailed);
  // Both rounds were charged (abandoned, never released).
  EXPECT_EQ(rounds.process->keeper->state().accountant.steps(), 2);
}

}  // namespace
}  // namespace vipsd::daemon
