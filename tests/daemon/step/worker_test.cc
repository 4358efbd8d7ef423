// Worker: a process that sums, for the coordinator's plans, the partitions
// it holds (daemon/step/worker.h) — and nothing else.
#include "daemon/step/worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "daemon/state/checkpoint.h"
#include "tests/testing/work_fixture.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

WorkPlan Plan(const WorkFixture& f, const ModelBundle& bundle, uint64_t epoch, int64_t step) {
  Checkpoint model;
  model.run_id = std::string(32, 'b');
  model.step = step - 1;
  model.model_type = bundle.model->type();
  model.model_fingerprint = bundle.model_fingerprint;
  model.arrays = bundle.model->CheckpointArrays();
  WorkPlan plan;
  plan.job = f.config.ledger_key;
  plan.epoch = epoch;
  plan.owner = std::string(32, 'a');
  plan.step = step;
  plan.slot = 5;
  plan.sampling_rate = 0.5;
  plan.is_private = true;
  for (size_t i = 0; i < plan.key.bytes.size(); ++i) plan.key.bytes[i] = static_cast<uint8_t>(i);
  // {name, low, floor, end}: the second window starts at 1; every record
  // is stamped before the slot time, so each cut is the end.
  plan.cut_time_ms = kNoCutTime;
  plan.streams = {{"docs:0", 0, 5, 5}, {"docs:1", 1, 1, 4}};
  plan.wanted = {"docs:0", "docs:1"};
  plan.model = *CheckpointStore::Encode(model);
  plan.record_settings = bundle.record_settings;
  return plan;
}

// The partial sums one process computes for `plan`, by stream, from the
// prior model or from `model` (checkpoint arrays).
std::map<std::string, std::string> Reference(
    const WorkFixture& f, const WorkPlan& plan,
    const std::vector<model::NamedArray>* model = nullptr) {
  ModelBundle bundle = std::move(BuildModel(f.config)).value();
  if (model != nullptr) {
    EXPECT_TRUE(bundle.model->RestoreCheckpoint(*model).ok());
  }
  std::vector<std::vector<model::Record>> records(2);
  std::vector<svi::StreamCandidates> streams(2);
  for (int partition = 0; partition < 2; ++partition) {
    const WorkStream& window = plan.streams[static_cast<size_t>(partition)];
    streams[partition].stream = window.name;
    const auto& log = f.topic->partitions.at(partition);
    for (int64_t offset = window.low; offset < window.high; ++offset) {
      auto decoded = bundle.decoder->Decode(log[static_cast<size_t>(offset)].payload);
      records[partition].push_back(std::get<model::Record>(std::move(decoded)));
    }
    for (size_t i = 0; i < records[partition].size(); ++i) {
      streams[partition].records.push_back(&records[partition][i]);
      streams[partition].offsets.push_back(window.low + static_cast<int64_t>(i));
    }
  }
  auto noise = privacy::SecureNoiseSource::CreateReproducible(1);
  privacy::RdpAccountant accountant;
  svi::DriverConfig driver_config = f.config.driver;
  driver_config.mechanism.sampling_rate = plan.sampling_rate;
  auto driver = svi::StepDriver::Create(bundle.model.get(), noise->get(), &accountant,
                                        driver_config, plan.step);
  std::map<std::string, std::string> sums;
  privacy::GaussianSumMechanism both(bundle.model->statistic_layout());
  EXPECT_TRUE((*driver)
                  ->SumStreams(plan.key, streams,
                               [&](size_t index, privacy::GaussianSumMechanism& partial) {
                                 sums[streams[index].stream] = *partial.EncodeUnreleased();
                                 return both.Merge(std::move(partial));
                               })
                  .ok());
  sums["both"] = *both.EncodeUnreleased();  // the two partitions' sums merged
  return sums;
}

// The messages on the work topic's partial log until `count` arrived: their
// offsets and bytes.
std::vector<std::pair<int64_t, std::string>> PartialMessages(MemoryWorkExchange& coordinator,
                                                             size_t count) {
  std::vector<std::pair<int64_t, std::string>> found;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (found.size() < count && std::chrono::steady_clock::now() < until) {
    auto messages = coordinator.Poll(50ms);
    for (auto& message : *messages) found.push_back(std::move(message));
  }
  return found;
}

// The same, decoded.
std::vector<WorkPartial> Partials(MemoryWorkExchange& coordinator, size_t count) {
  std::vector<WorkPartial> found;
  for (auto& [offset, bytes] : PartialMessages(coordinator, count)) {
    found.push_back(*DecodeWorkPartial(bytes));
  }
  return found;
}

// A worker of `f`'s job reading through `sources` (every partition by default).
StatusOr<std::unique_ptr<Worker>> NewWorker(WorkFixture& f, SourceFactory sources,
                                            const DaemonOptions& options) {
  return Worker::Create(f.config, std::move(sources),
                        std::make_unique<FakeSink>(std::make_shared<SinkLog>()), f.metrics.get(),
                        std::make_unique<MemoryWorkExchange>(f.work, WorkRole::kWorker), options);
}

// Issue 30: a plan may carry the previous step's released sum instead of
// the model. A released sum on the mechanism's grid (signs, zeros and a
// large value), as GaussianSumMechanism::ScaleBack forms one.
Eigen::VectorXd ReleasedSum(const privacy::BlockLayout& layout, uint64_t seed) {
  const double two_to_minus_g = std::ldexp(1.0, -privacy::GridExponent(layout.num_blocks()));
  std::mt19937_64 rng(seed);
  Eigen::VectorXd sum(static_cast<Eigen::Index>(layout.total_size()));
  for (const privacy::Block& block : layout.blocks()) {
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      const int64_t m = static_cast<int64_t>(rng() % 20000001) - 10000000;
      sum[static_cast<Eigen::Index>(i)] =
          privacy::ReleasedValue(i == block.offset ? int64_t{1} << 50 : m, two_to_minus_g,
                                 block.clip_bound);
    }
  }
  return sum;
}

// `base`'s step's plan followed by the released sum of step `base.step`.
WorkPlan DeltaPlan(const WorkPlan& base, int64_t base_offset, const ModelBundle& bundle,
                   const Eigen::VectorXd& released, double rho) {
  WorkPlan plan = base;
  plan.step = base.step + 1;
  plan.model.clear();
  plan.delta_sum = *privacy::GaussianSumMechanism::EncodeReleased(
      bundle.model->statistic_layout(), released);
  plan.delta_base = base.step;
  plan.delta_base_offset = base_offset;
  plan.delta_step = base.step;
  plan.delta_mechanism.sampling_rate = base.sampling_rate;
  plan.delta_rho = rho;
  return plan;
}

// What a coordinator appends after `plan`'s step: the released sum that
// `next` (a DeltaPlan of it) carries.
WorkRelease ReleaseAhead(const WorkPlan& plan, const WorkPlan& next) {
  WorkRelease release;
  release.job = plan.job;
  release.epoch = plan.epoch;
  release.owner = plan.owner;
  release.step = plan.step;
  release.slot = plan.slot;
  release.delta_step = next.delta_step;
  release.delta_mechanism.sampling_rate = next.delta_mechanism.sampling_rate;
  release.delta_rho = next.delta_rho;
  release.delta_mechanism.noise_multiplier = next.delta_mechanism.noise_multiplier;
  release.delta_sum = next.delta_sum;
  return release;
}

// The model after the M-steps of `released` (with ρ `rhos`) from the prior.
std::vector<model::NamedArray> MSteppedModel(const WorkFixture& f, double q,
                                             const std::vector<Eigen::VectorXd>& released,
                                             const std::vector<double>& rhos) {
  ModelBundle bundle = std::move(BuildModel(f.config)).value();
  for (size_t i = 0; i < released.size(); ++i) {
    EXPECT_TRUE(bundle.model->MStep(released[i], {q, 0.0}, rhos[i]).ok());
  }
  return bundle.model->CheckpointArrays();
}

TEST(WorkerTest, ItSumsTheWindowsOfThePartitionsItHoldsAsOneProcessWould) {
  WorkFixture f("worker_sums");
  DaemonOptions options = f.options;
  options.instance_id = "worker-1";
  auto worker = NewWorker(f, f.Partitions({0, 1}), options);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  const WorkPlan plan = Plan(f, bundle, 3, 1);
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(plan)).ok());
  // A private run: ONE partial for the process, its partitions pre-summed.
  const std::vector<WorkPartial> partials = Partials(coordinator, 1);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(coordinator.Poll(0ms)->empty()) << "a second partial";
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_EQ(partials.size(), 1u);
  const auto reference = Reference(f, plan);
  const WorkPartial& partial = partials[0];
  EXPECT_EQ(partial.epoch, 3u);
  EXPECT_EQ(partial.owner, plan.owner);
  EXPECT_EQ(partial.step, 1);
  EXPECT_EQ(partial.slot, 5);
  EXPECT_FALSE(partial.overflow);
  ASSERT_EQ(partial.streams.size(), 2u);
  EXPECT_EQ(partial.streams[0].name, "docs:0");
  EXPECT_EQ(partial.streams[0].cut, 5);
  EXPECT_EQ(partial.streams[1].name, "docs:1");
  EXPECT_EQ(partial.streams[1].cut, 4);
  EXPECT_EQ(partial.instance, "worker-1");
  // Bit for bit the two partitions' sums merged, and not either one alone.
  EXPECT_EQ(partial.sum, reference.at("both"));
  EXPECT_NE(partial.sum, reference.at("docs:0"));
  EXPECT_NE(partial.sum, reference.at("docs:1"));
  EXPECT_FALSE((*worker)->latest_plan_model().empty());
  EXPECT_GT((*worker)->last_plan_seen_ns(), 0);
}

TEST(WorkerTest, APlanOfAReplacedCoordinatorIsIgnored) {
  WorkFixture f("worker_epochs");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(Plan(f, bundle, 4, 2))).ok());
  ASSERT_EQ(Partials(coordinator, 1).size(), 1u);
  // A coordinator of a lower epoch (fenced since) still appends: no partial.
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(Plan(f, bundle, 3, 3))).ok());
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(coordinator.Poll(0ms)->empty());
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
}

// Two processes that claimed the job at once share an epoch counter; the
// ledger orders them by owner id and fences the lower one at its first
// commit — after it may have planned steps ahead of the record (here step 3,
// with its windows starting later). The worker follows the winner's plan
// of an earlier step, reads the windows that now start lower again, and
// sends bit for bit what one process computes; the loser's plans are
// ignored from then on. (Seen on Apache Kafka: the worker kept the loser's
// higher step and the owner waited for ever.)
TEST(WorkerTest, TheWinnerOfAClaimRaceIsFollowedAndItsLowerWindowStartsReadAgain) {
  WorkFixture f("worker_claim_race");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  WorkPlan loser = Plan(f, bundle, 4, 3);
  loser.owner = std::string(32, '1');
  loser.streams = {{"docs:0", 2, 5, 5}, {"docs:1", 3, 4, 4}};
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(loser)).ok());
  ASSERT_EQ(Partials(coordinator, 1).size(), 1u);
  WorkPlan winner = Plan(f, bundle, 4, 2);  // {docs:0 from 0, docs:1 from 1}
  winner.owner = std::string(32, 'f');
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(winner)).ok());
  const std::vector<WorkPartial> partials = Partials(coordinator, 1);
  ASSERT_EQ(partials.size(), 1u) << "no partial for the winner's plan of a lower step";
  EXPECT_EQ(partials[0].owner, winner.owner);
  EXPECT_EQ(partials[0].step, 2);
  EXPECT_EQ(partials[0].sum, Reference(f, winner).at("both"));
  // The loser reminds: ignored.
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(loser)).ok());
  std::this_thread::sleep_for(400ms);
  EXPECT_TRUE(coordinator.Poll(0ms)->empty());
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
}

// Issue 30: a pre-summed partial that overlapped one merged first is
// refused whole; the coordinator's reminder says how far it has read the
// partial log, and a worker sums a still-wanted partition again only when
// its partial for it lies below that (refused), not while it may still be
// on its way.
TEST(WorkerTest, AReminderThatHasReadItsPartialAndStillWantsAPartitionGetsItAgain) {
  WorkFixture f("worker_resend");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  WorkPlan plan = Plan(f, bundle, 2, 1);
  const int64_t plan_offset = *coordinator.Append(EncodeWorkPlan(plan));
  const auto first = PartialMessages(coordinator, 1);
  ASSERT_EQ(first.size(), 1u);
  const int64_t sent_at = first[0].first;
  WorkPlan reminder = plan;
  reminder.model.clear();
  reminder.plan_offset = plan_offset;
  reminder.wanted = {"docs:1"};
  // Not read yet (partials_read at the partial's own offset): no resend.
  reminder.partials_read = sent_at;
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(reminder)).ok());
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(coordinator.Poll(0ms)->empty()) << "resent while possibly in flight";
  // Read and still wanted: refused, so docs:1 alone comes again, bit for
  // bit its own sum.
  reminder.partials_read = sent_at + 1;
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(reminder)).ok());
  const std::vector<WorkPartial> again = Partials(coordinator, 1);
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_EQ(again.size(), 1u);
  ASSERT_EQ(again[0].streams.size(), 1u);
  EXPECT_EQ(again[0].streams[0].name, "docs:1");
  EXPECT_EQ(again[0].sum, Reference(f, plan).at("docs:1"));
}

TEST(WorkerTest, AWorkerConfiguredForAnotherModelStopsBeforeItSumsAnything) {
  WorkFixture f("worker_other_model");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  config::VipsdConfig other = f.config;
  other.lda.num_topics = 3;
  const ModelBundle bundle = std::move(BuildModel(other)).value();
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(Plan(f, bundle, 1, 1))).ok());
  const Status result = (*worker)->Run();  // returns by itself
  EXPECT_EQ(result.code(), StatusCode::kInvalidArgument) << result.ToString();
  EXPECT_THAT(result.message(), HasSubstr("need one model configuration"));
  EXPECT_TRUE(coordinator.Poll(0ms)->empty());
}

// Issue 26: every setting that decides a record's statistic or its
// dead-lettering travels with the plan; a worker whose settings differ
// exits before it joins the consumer group, naming each difference.
TEST(WorkerTest, AWorkerWithOtherRecordSettingsExitsBeforeItJoinsTheGroup) {
  struct Case {
    const char* name;
    void (*change)(config::VipsdConfig&);
    const char* expected;
  };
  const Case cases[] = {
      {"decoder", [](config::VipsdConfig& c) { c.max_record_bytes = 4096; },
       "source.max_record_bytes: coordinator 4096, this process "},
      {"statistic", [](config::VipsdConfig& c) { c.lda.alpha *= 2; },
       "model.lda.alpha: coordinator "},
      {"clipping", [](config::VipsdConfig& c) { c.lda.clip_fraction /= 2; },
       "model.lda.clip_fraction: coordinator "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    WorkFixture f(std::string("worker_settings_") + c.name);
    int sources_made = 0;
    SourceFactory partitions = f.Partitions({0, 1});
    SourceFactory counted = [&](ResumeOffsetFn resume) {
      ++sources_made;
      return partitions(std::move(resume));
    };
    auto worker = NewWorker(f, counted, f.options);
    ASSERT_TRUE(worker.ok());
    MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
    config::VipsdConfig theirs = f.config;
    c.change(theirs);
    ModelBundle bundle = std::move(BuildModel(theirs)).value();
    ASSERT_NE(bundle.record_settings, std::move(BuildModel(f.config)).value().record_settings);
    ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(Plan(f, bundle, 1, 1))).ok());
    const Status result = (*worker)->Run();  // returns by itself
    EXPECT_EQ(result.code(), StatusCode::kInvalidArgument) << result.ToString();
    EXPECT_THAT(result.message(), HasSubstr("other settings than this process"));
    EXPECT_THAT(result.message(), HasSubstr(c.expected));
    EXPECT_EQ(sources_made, 0) << "it joined the consumer group";
    EXPECT_TRUE(coordinator.Poll(0ms)->empty());
    // The same when the first plan it sees carries a released sum (it
    // joined mid-run): named before the sum is applied, not taken for a
    // plan it cannot read.
    worker->reset();  // it holds the state directory's lock
    auto joining = NewWorker(f, counted, f.options);
    ASSERT_TRUE(joining.ok());
    const Eigen::VectorXd released = ReleasedSum(bundle.model->statistic_layout(), 4);
    const WorkPlan delta = DeltaPlan(Plan(f, bundle, 1, 1), 0, bundle, released, 0.5);
    ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(delta)).ok());
    const Status again = (*joining)->Run();
    EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.ToString();
    EXPECT_THAT(again.message(), HasSubstr(c.expected));
    EXPECT_EQ(sources_made, 0) << "it joined the consumer group";
  }
}

TEST(WorkerTest, RecordSettingsNameTheModelsKeysAndTheVocabularyByContent) {
  WorkFixture f("worker_settings_text");
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  const std::string& text = bundle.record_settings;
  EXPECT_THAT(text, HasSubstr("model.type: lda\n"));
  EXPECT_THAT(text, HasSubstr("model.lda.alpha: "));
  EXPECT_THAT(text, HasSubstr("source.max_record_bytes: "));
  EXPECT_THAT(text, HasSubstr("model.lda.vocabulary (BLAKE2b-256 of its terms): " +
                              bundle.vocabulary_fingerprint));
  EXPECT_EQ(text.find(f.config.vocabulary_path), std::string::npos);  // not its path
  EXPECT_EQ(text.find("model.blr."), std::string::npos);  // another model's keys
  // The privacy unit decides which records form one contribution: it is in.
  EXPECT_THAT(text, HasSubstr("privacy.unit: record\n"));
  // q, σ, δ and the ceiling are the coordinator's alone.
  EXPECT_EQ(text.find("privacy.sampling_rate"), std::string::npos);
  EXPECT_EQ(text.find("privacy.noise_multiplier"), std::string::npos);
  EXPECT_EQ(text.find("privacy.epsilon_ceiling"), std::string::npos);
}

TEST(WorkerTest, APlanWithAReleasedSumSumsWithTheModelOfThatMStepBitForBit) {
  WorkFixture f("worker_delta");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  const WorkPlan first = Plan(f, bundle, 2, 1);
  const int64_t first_offset = *coordinator.Append(EncodeWorkPlan(first));
  ASSERT_EQ(Partials(coordinator, 1).size(), 1u);
  const Eigen::VectorXd released = ReleasedSum(bundle.model->statistic_layout(), 11);
  const WorkPlan second = DeltaPlan(first, first_offset, bundle, released, 0.6);
  ASSERT_LT(second.delta_sum.size(), first.model.size() * 2 / 3);
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(second)).ok());
  const std::vector<WorkPartial> partials = Partials(coordinator, 1);
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].step, 2);
  const auto model = MSteppedModel(f, first.sampling_rate, {released}, {0.6});
  EXPECT_EQ(partials[0].sum, Reference(f, second, &model).at("both"));
  // Not the prior's sums: the model moved.
  EXPECT_NE(partials[0].sum, Reference(f, second).at("both"));
  // The model it would continue from as the job's owner: the M-stepped one,
  // at the released step.
  auto held = CheckpointStore::Decode((*worker)->latest_plan_model(), "test");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->step, 1);
  ASSERT_EQ(held->arrays.size(), model.size());
  EXPECT_EQ(held->arrays[0].data, model[0].data);
}

// The step's released sum appended ahead of the next plan (WorkRelease):
// the worker applies it while it waits, sums nothing more for the plan in
// hand, and the next plan that names that release finds its model ready.
// A plan that names another release than the one applied ahead is followed
// from the plans instead (read back to the one with the model, each sum
// read at the offset its plan names), bit for bit.
TEST(WorkerTest, AReleaseAppliedAheadIsTheNextPlansModelAndAnotherSumIsReadBack) {
  WorkFixture f("worker_release_ahead");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  const privacy::BlockLayout& layout = bundle.model->statistic_layout();
  const WorkPlan first = Plan(f, bundle, 2, 1);
  const int64_t first_offset = *coordinator.Append(EncodeWorkPlan(first));
  ASSERT_EQ(Partials(coordinator, 1).size(), 1u);
  const Eigen::VectorXd one = ReleasedSum(layout, 21), two = ReleasedSum(layout, 22),
                        other = ReleasedSum(layout, 23);
  const WorkPlan second = DeltaPlan(first, first_offset, bundle, one, 0.6);
  // Another plan's release (a step it does not hold) changes nothing.
  WorkRelease stray = ReleaseAhead(first, second);
  stray.step = 5;
  stray.delta_step = 5;
  ASSERT_TRUE(coordinator.Append(EncodeWorkRelease(stray)).ok());
  const int64_t one_offset = *coordinator.Append(EncodeWorkRelease(ReleaseAhead(first, second)));
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(coordinator.Poll(0ms)->empty()) << "summed the finished plan again";
  // The plan names the release instead of carrying its sum.
  WorkPlan second_named = second;
  second_named.delta_sum.clear();
  second_named.delta_release_offset = one_offset;
  const int64_t second_offset = *coordinator.Append(EncodeWorkPlan(second_named));
  std::vector<WorkPartial> partials = Partials(coordinator, 1);
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].step, 2);
  const auto after_one = MSteppedModel(f, first.sampling_rate, {one}, {0.6});
  EXPECT_EQ(partials[0].sum, Reference(f, second, &after_one).at("both"));
  EXPECT_EQ((*worker)->releases_applied_ahead(), 1);
  // Ahead: the release of sum `two`; then a second release of the same
  // step with sum `other` (not applied: the model held is no plan's any
  // more), which the plan names: the worker reads back to the first plan's
  // model and forward through the release of `one` and that of `other`,
  // both read at their offsets.
  const WorkPlan third_announced = DeltaPlan(second, second_offset, bundle, two, 0.8);
  ASSERT_TRUE(coordinator.Append(EncodeWorkRelease(ReleaseAhead(second, third_announced))).ok());
  const WorkPlan third = DeltaPlan(second, second_offset, bundle, other, 0.8);
  const int64_t other_offset = *coordinator.Append(EncodeWorkRelease(ReleaseAhead(second, third)));
  std::this_thread::sleep_for(300ms);
  WorkPlan third_named = third;
  third_named.delta_sum.clear();
  third_named.delta_release_offset = other_offset;
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(third_named)).ok());
  partials = Partials(coordinator, 1);
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].step, 3);
  const auto after_other = MSteppedModel(f, first.sampling_rate, {one, other}, {0.6, 0.8});
  EXPECT_EQ(partials[0].sum, Reference(f, third, &after_other).at("both"));
  EXPECT_EQ((*worker)->releases_applied_ahead(), 1);
  auto held = CheckpointStore::Decode((*worker)->latest_plan_model(), "test");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->step, 2);
  EXPECT_EQ(held->arrays[0].data, after_other[0].data);
}

// A worker that applied a release ahead and then stopped (its coordinator
// died before the next plan) hands over the plan's model, not the model of
// the released step: that step may not be in the ledger yet, and a standby
// continues only from a model of a step the ledger charges.
TEST(WorkerTest, AfterAReleaseAppliedAheadTheTakeoverModelIsStillThePlans) {
  WorkFixture f("worker_release_takeover");
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  Status result = Status::Ok();
  std::thread run([&] { result = (*worker)->Run(); });
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  const privacy::BlockLayout& layout = bundle.model->statistic_layout();
  const WorkPlan first = Plan(f, bundle, 2, 1);
  const int64_t first_offset = *coordinator.Append(EncodeWorkPlan(first));
  ASSERT_EQ(Partials(coordinator, 1).size(), 1u);
  // Step 1's release, applied ahead; the plan of step 2 names it.
  const Eigen::VectorXd one = ReleasedSum(layout, 31), two = ReleasedSum(layout, 32);
  const WorkPlan second = DeltaPlan(first, first_offset, bundle, one, 0.6);
  const int64_t one_offset = *coordinator.Append(EncodeWorkRelease(ReleaseAhead(first, second)));
  std::this_thread::sleep_for(300ms);
  WorkPlan second_named = second;
  second_named.delta_sum.clear();
  second_named.delta_release_offset = one_offset;
  const int64_t second_offset = *coordinator.Append(EncodeWorkPlan(second_named));
  ASSERT_EQ(Partials(coordinator, 1).size(), 1u);
  EXPECT_EQ((*worker)->releases_applied_ahead(), 1);
  // Step 2's release, applied ahead; then the coordinator is gone.
  const WorkPlan third = DeltaPlan(second, second_offset, bundle, two, 0.8);
  ASSERT_TRUE(coordinator.Append(EncodeWorkRelease(ReleaseAhead(second, third))).ok());
  std::this_thread::sleep_for(300ms);
  (*worker)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  // Step 2's plan's model (after step 1's M-step), read back through the
  // plan log: not the model after step 2's release.
  auto held = CheckpointStore::Decode((*worker)->latest_plan_model(), "test");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->step, 1);
  const auto after_one = MSteppedModel(f, first.sampling_rate, {one}, {0.6});
  ASSERT_EQ(held->arrays.size(), after_one.size());
  EXPECT_EQ(held->arrays[0].data, after_one[0].data);
}

// A process that joins after plans with released sums reads back to the
// plan with the model and forward through each sum; one whose way back is
// broken sums nothing until a plan brings the model.
TEST(WorkerTest, AWorkerThatLacksTheModelReadsThePlansBackToIt) {
  WorkFixture f("worker_delta_chain");
  MemoryWorkExchange coordinator(f.work, WorkRole::kCoordinator);
  // Made before the plans (a worker reads from the log's end at its start),
  // running after them: it sees the third plan, whose base it lacks.
  auto worker = NewWorker(f, f.Partitions({0, 1}), f.options);
  ASSERT_TRUE(worker.ok());
  const ModelBundle bundle = std::move(BuildModel(f.config)).value();
  const privacy::BlockLayout& layout = bundle.model->statistic_layout();
  const WorkPlan first = Plan(f, bundle, 2, 1);
  const int64_t first_offset = *coordinator.Append(EncodeWorkPlan(first));
  const Eigen::VectorXd one = ReleasedSum(layout, 1), two = ReleasedSum(layout, 2);
  const WorkPlan second = DeltaPlan(first, first_offset, bundle, one, 0.9);
  const int64_t second_offset = *coordinator.Append(EncodeWorkPlan(second));
  const WorkPlan third = DeltaPlan(second, second_offset, bundle, two, 0.8);
  ASSERT_TRUE(coordinator.Append(EncodeWorkPlan(third)).ok());
  {
    Status result = Status::Ok();
    std::thread run([&] { result = (*worker)->Run(); });
    const std::vector<WorkPartial> partials = Partials(coordinator, 1);
    (*worker)->RequestStop();
    run.join();
    EXPECT_TRUE(result.ok()) << result.ToString();
    ASSERT_EQ(partials.size(), 1u);
    EXPECT_EQ(partials[0].step, 3);
    const auto model = MSteppedModel(f, first.sampling_rate, {one, two}, {0.9, 0.8});
    EXPECT_EQ(partials[0].sum, Reference(f, third, &model).at("both"));
  }
  // The fourth plan names, as its base, an offset that holds the second
  // plan, not the third: nothing is summed from a model it cannot verify.
  const Eigen::VectorXd three = ReleasedSum(layout, 3);
  const WorkPlan fourth = DeltaPlan(third, second_offset, bundle, three, 0.7);
  WorkFixture g("worker_delta_broken");
  MemoryWorkExchange other(g.work, WorkRole::kCoordinator);
  auto joining = NewWorker(g, g.Partitions({0, 1}), g.options);
  ASSERT_TRUE(joining.ok());
  for (const WorkPlan* plan : {&first, &second, &third, &fourth}) {
    ASSERT_TRUE(other.Append(EncodeWorkPlan(*plan)).ok());
  }
  Status result = Status::Ok();
  std::thread run([&] { result = (*joining)->Run(); });
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(other.Poll(0ms)->empty()) << "summed without the plan's model";
  // The step's plan again with the model (as a reminder sends it when the
  // model's plan is gone): now it sums, with that model.
  const auto model = MSteppedModel(g, first.sampling_rate, {one, two, three}, {0.9, 0.8, 0.7});
  WorkPlan whole = fourth;
  whole.delta_sum.clear();
  whole.delta_base = whole.delta_base_offset = -1;
  Checkpoint checkpoint;
  checkpoint.run_id = std::string(32, 'b');
  checkpoint.step = 3;
  checkpoint.model_type = bundle.model->type();
  checkpoint.model_fingerprint = bundle.model_fingerprint;
  checkpoint.arrays = model;
  whole.model = *CheckpointStore::Encode(checkpoint);
  whole.plan_offset = 0;
  ASSERT_TRUE(other.Append(EncodeWorkPlan(whole)).ok());
  const std::vector<WorkPartial> partials = Partials(other, 1);
  (*joining)->RequestStop();
  run.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].step, 4);
  EXPECT_EQ(partials[0].sum, Reference(g, fourth, &model).at("both"));
}

}  // namespace
}  // namespace vipsd::daemon
