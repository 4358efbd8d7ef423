// The work topic's messages (daemon/io/work_exchange.h): plans and partial sums
// round-trip exactly; anything altered, truncated or out of range is refused.
#include "daemon/io/work_exchange.h"

#include <gtest/gtest.h>

#include <cmath>

#include "connectors/kafka/mock_cluster.h"
#include "daemon/io/kafka_io.h"

namespace vipsd::daemon {
namespace {

WorkPlan SamplePlan() {
  WorkPlan plan;
  plan.job = "job-1";
  plan.epoch = 3;
  plan.owner = std::string(32, 'a');
  plan.step = 17;
  plan.slot = 40;
  plan.sampling_rate = 0.125;
  plan.is_private = true;
  for (size_t i = 0; i < plan.key.bytes.size(); ++i) plan.key.bytes[i] = static_cast<uint8_t>(i * 7);
  plan.cut_time_ms = 1790000000123;
  plan.streams = {{"docs:0", 10, 15, 20}, {"docs:1", 5, 5, 5}, {"docs:10", 0, 99, 99}};
  plan.wanted = {"docs:0", "docs:10"};
  plan.model = std::string("model\0bytes", 11);
  plan.plan_offset = -1;
  plan.record_settings = "model.type: lda\nsource.max_record_bytes: 65536\n";
  plan.partials_read = 12345;
  return plan;
}

TEST(WorkExchangeTest, APlanRoundTripsExactly) {
  const WorkPlan plan = SamplePlan();
  const std::string bytes = EncodeWorkPlan(plan);
  ASSERT_EQ(*WorkMessageKindOf(bytes), WorkMessageKind::kPlan);
  auto decoded = DecodeWorkPlan(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->job, plan.job);
  EXPECT_EQ(decoded->epoch, plan.epoch);
  EXPECT_EQ(decoded->owner, plan.owner);
  EXPECT_EQ(decoded->step, plan.step);
  EXPECT_EQ(decoded->slot, plan.slot);
  EXPECT_EQ(decoded->sampling_rate, plan.sampling_rate);
  EXPECT_TRUE(decoded->is_private);
  EXPECT_EQ(decoded->key, plan.key);
  ASSERT_EQ(decoded->streams.size(), 3u);
  EXPECT_EQ(decoded->streams[2].name, "docs:10");
  EXPECT_EQ(decoded->streams[2].high, 99);
  EXPECT_EQ(decoded->streams[0].floor, 15);
  EXPECT_EQ(decoded->cut_time_ms, plan.cut_time_ms);
  EXPECT_EQ(decoded->wanted, plan.wanted);
  EXPECT_EQ(decoded->model, plan.model);
  EXPECT_EQ(decoded->plan_offset, -1);
  EXPECT_EQ(decoded->record_settings, plan.record_settings);
  EXPECT_EQ(decoded->partials_read, plan.partials_read);
}

// A released sum sent ahead of the next plan (WorkRelease) round-trips;
// truncated or out-of-range ones are refused.
TEST(WorkExchangeTest, AReleaseRoundTripsAndOutOfRangeOnesAreRefused) {
  WorkRelease release;
  release.job = "job";
  release.epoch = 7;
  release.owner = std::string(32, 'a');
  release.step = 41;
  release.slot = 1234;
  release.delta_step = 41;
  release.delta_mechanism.sampling_rate = 0.25;
  release.delta_rho = 0.125;
  release.delta_mechanism.noise_multiplier = 2.5;
  release.delta_sum = std::string("sum\0bytes", 9);
  const std::string bytes = EncodeWorkRelease(release);
  ASSERT_EQ(*WorkMessageKindOf(bytes), WorkMessageKind::kRelease);
  EXPECT_TRUE(OnPlanLog(WorkMessageKind::kRelease));
  EXPECT_FALSE(DecodeWorkPlan(bytes).ok());
  auto decoded = DecodeWorkRelease(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->job, release.job);
  EXPECT_EQ(decoded->epoch, release.epoch);
  EXPECT_EQ(decoded->owner, release.owner);
  EXPECT_EQ(decoded->step, release.step);
  EXPECT_EQ(decoded->slot, release.slot);
  EXPECT_EQ(decoded->delta_step, release.delta_step);
  EXPECT_EQ(decoded->delta_mechanism.sampling_rate, release.delta_mechanism.sampling_rate);
  EXPECT_EQ(decoded->delta_rho, release.delta_rho);
  EXPECT_EQ(decoded->delta_mechanism.noise_multiplier, 2.5);
  EXPECT_EQ(decoded->delta_sum, release.delta_sum);
  EXPECT_FALSE(DecodeWorkRelease(bytes.substr(0, bytes.size() - 1)).ok());
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 1;
  EXPECT_FALSE(DecodeWorkRelease(flipped).ok());
  auto refused = [](WorkRelease r) { return !DecodeWorkRelease(EncodeWorkRelease(r)).ok(); };
  WorkRelease bad = release;
  bad.delta_step = release.step - 1;  // released before the plan's step
  EXPECT_TRUE(refused(bad));
  bad = release;
  bad.delta_rho = 0;
  EXPECT_TRUE(refused(bad));
  bad = release;
  bad.delta_mechanism.noise_multiplier = -1;
  EXPECT_TRUE(refused(bad));
  bad = release;
  bad.delta_mechanism.sampling_rate = 1.5;
  EXPECT_TRUE(refused(bad));
  bad = release;
  bad.delta_sum.clear();
  EXPECT_TRUE(refused(bad));
  bad = release;
  bad.step = 0;
  EXPECT_TRUE(refused(bad));
}

// A plan of a vipsd without record settings (magic VWP1) is named as such,
// not taken for junk: a worker says why it cannot follow it.
TEST(WorkExchangeTest, APlanOfAnOlderVersionIsRefusedByName) {
  std::string bytes = EncodeWorkPlan(SamplePlan());
  bytes[3] = '1';
  const auto kind = WorkMessageKindOf(bytes);
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(kind.status().message().find("older vipsd"), std::string::npos);
  EXPECT_FALSE(DecodeWorkPlan(bytes).ok());
  // VWP2 (cuts at observed log ends) and VWR1 partials likewise.
  bytes[3] = '2';
  ASSERT_FALSE(WorkMessageKindOf(bytes).ok());
  EXPECT_EQ(WorkMessageKindOf(bytes).status().code(), StatusCode::kFailedPrecondition);
  std::string partial = "VWR1";
  EXPECT_EQ(WorkMessageKindOf(partial).status().code(), StatusCode::kFailedPrecondition);
  // VWP3 plans and VWR2 partials (one partial per partition) likewise.
  bytes[3] = '3';
  EXPECT_EQ(WorkMessageKindOf(bytes).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(WorkMessageKindOf(bytes).status().message().find("one partial sum per partition"),
            std::string::npos);
  partial = "VWR2";
  EXPECT_EQ(WorkMessageKindOf(partial).status().code(), StatusCode::kFailedPrecondition);
  // VWP4 plans (the whole model in every plan) likewise.
  bytes[3] = '4';
  EXPECT_EQ(WorkMessageKindOf(bytes).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(WorkMessageKindOf(bytes).status().message().find("the whole model in every plan"),
            std::string::npos);
  // VWP5 plans (the released sum always inside the plan) likewise.
  bytes[3] = '5';
  EXPECT_EQ(WorkMessageKindOf(bytes).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(WorkMessageKindOf(bytes).status().message().find("always inside the plan"),
            std::string::npos);
  // VWP6 plans and VWL1 releases (without the released sum's sigma) likewise.
  bytes[3] = '6';
  EXPECT_EQ(WorkMessageKindOf(bytes).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(WorkMessageKindOf(bytes).status().message().find("noise multiplier"),
            std::string::npos);
  EXPECT_EQ(WorkMessageKindOf("VWL1").status().code(), StatusCode::kFailedPrecondition);
}

// Issue 30: a plan that carries a released sum instead of the model names
// the plan it follows (step and offset), the released step, q and ρ; a
// plan with both, or a sum without a base, is refused.
TEST(WorkExchangeTest, APlanWithAReleasedSumRoundTripsAndMustNameItsBase) {
  WorkPlan plan = SamplePlan();
  plan.model.clear();
  plan.delta_sum = std::string("VRS1\0sum", 8);
  plan.delta_base = 2;
  plan.delta_base_offset = 40;
  plan.delta_step = 2;
  plan.delta_mechanism.sampling_rate = 0.25;
  plan.delta_rho = 0.375;
  plan.delta_mechanism.noise_multiplier = 1.75;
  auto decoded = DecodeWorkPlan(EncodeWorkPlan(plan));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->model.empty());
  EXPECT_EQ(decoded->delta_sum, plan.delta_sum);
  EXPECT_EQ(decoded->delta_base, 2);
  EXPECT_EQ(decoded->delta_base_offset, 40);
  EXPECT_EQ(decoded->delta_step, 2);
  EXPECT_EQ(decoded->delta_mechanism.sampling_rate, 0.25);
  EXPECT_EQ(decoded->delta_rho, 0.375);
  EXPECT_EQ(decoded->delta_mechanism.noise_multiplier, 1.75);
  EXPECT_EQ(decoded->delta_release_offset, -1);
  // Or the sum by the offset of the release appended ahead of the plan.
  WorkPlan named = plan;
  named.delta_sum.clear();
  named.delta_release_offset = 41;
  auto by_offset = DecodeWorkPlan(EncodeWorkPlan(named));
  ASSERT_TRUE(by_offset.ok()) << by_offset.status().ToString();
  EXPECT_TRUE(by_offset->has_delta());
  EXPECT_TRUE(by_offset->delta_sum.empty());
  EXPECT_EQ(by_offset->delta_release_offset, 41);
  EXPECT_EQ(by_offset->delta_base_offset, 40);
  // A full plan names no base.
  const auto full = DecodeWorkPlan(EncodeWorkPlan(SamplePlan()));
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->delta_base, -1);
  EXPECT_EQ(full->delta_base_offset, -1);
  EXPECT_TRUE(full->delta_sum.empty());
  const std::vector<std::pair<const char*, void (*)(WorkPlan&)>> bad = {
      {"model too", [](WorkPlan& p) { p.model = "m"; }},
      {"a reminder", [](WorkPlan& p) { p.plan_offset = 3; }},
      {"no base step", [](WorkPlan& p) { p.delta_base = -1; }},
      {"no base offset", [](WorkPlan& p) { p.delta_base_offset = -1; }},
      {"released before its base", [](WorkPlan& p) { p.delta_step = 1; }},
      {"released at the plan's own step", [](WorkPlan& p) { p.delta_step = p.step; }},
      {"q of 0", [](WorkPlan& p) { p.delta_mechanism.sampling_rate = 0; }},
      {"rho above 1", [](WorkPlan& p) { p.delta_rho = 1.5; }},
      {"rho not finite", [](WorkPlan& p) { p.delta_rho = std::nan(""); }},
      {"negative sigma", [](WorkPlan& p) { p.delta_mechanism.noise_multiplier = -0.5; }},
      {"a base without a sum", [](WorkPlan& p) { p.delta_sum.clear(); p.model = "m"; }},
      {"the sum and a release", [](WorkPlan& p) { p.delta_release_offset = 41; }},
      {"a release before its base",
       [](WorkPlan& p) { p.delta_sum.clear(); p.delta_release_offset = 40; }},
      {"a release offset without a delta",
       [](WorkPlan& p) {
         p.delta_sum.clear();
         p.delta_release_offset = -2;
       }},
  };
  for (const auto& [name, change] : bad) {
    SCOPED_TRACE(name);
    WorkPlan changed = plan;
    change(changed);
    const auto refused = DecodeWorkPlan(EncodeWorkPlan(changed));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  }
}

// A partial names at least one partition, sorted by name, each once: the
// coordinator's overlap check relies on it.
TEST(WorkExchangeTest, APartialWithNoUnsortedOrRepeatedPartitionsIsRefused) {
  WorkPartial partial;
  partial.job = "job-1";
  partial.owner = std::string(32, 'b');
  partial.step = 2;
  partial.sum = "s";
  partial.streams = {{"docs:0", 1}, {"docs:1", 2}};
  ASSERT_TRUE(DecodeWorkPartial(EncodeWorkPartial(partial)).ok());
  for (const std::vector<PartialStream>& bad :
       {std::vector<PartialStream>{}, std::vector<PartialStream>{{"docs:1", 1}, {"docs:0", 2}},
        std::vector<PartialStream>{{"docs:0", 1}, {"docs:0", 2}},
        std::vector<PartialStream>{{"docs:0", -1}}}) {
    partial.streams = bad;
    const auto decoded = DecodeWorkPartial(EncodeWorkPartial(partial));
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  }
}

TEST(WorkExchangeTest, APartialRoundTripsExactly) {
  WorkPartial partial;
  partial.job = "job-1";
  partial.epoch = 3;
  partial.owner = std::string(32, 'b');
  partial.step = 17;
  partial.slot = 40;
  partial.streams = {{"docs:0", 1234}, {"docs:3", 7}};
  partial.sum = std::string("\x01\x00\xff sum", 7);
  partial.instance = "w1";
  const std::string bytes = EncodeWorkPartial(partial);
  ASSERT_EQ(*WorkMessageKindOf(bytes), WorkMessageKind::kPartial);
  auto decoded = DecodeWorkPartial(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->streams.size(), 2u);
  EXPECT_EQ(decoded->streams[0].name, "docs:0");
  EXPECT_EQ(decoded->streams[1].name, "docs:3");
  EXPECT_EQ(decoded->streams[1].cut, 7);
  EXPECT_EQ(decoded->sum, partial.sum);
  EXPECT_EQ(decoded->instance, "w1");
  EXPECT_FALSE(decoded->overflow);
  EXPECT_EQ(decoded->step, 17);
  EXPECT_EQ(decoded->streams[0].cut, 1234);
  // A plan is not a partial and the other way round.
  EXPECT_FALSE(DecodeWorkPlan(bytes).ok());
  EXPECT_FALSE(DecodeWorkPartial(EncodeWorkPlan(SamplePlan())).ok());
}

TEST(WorkExchangeTest, EveryFlippedBitAndEveryTruncationIsRefused) {
  const std::string bytes = EncodeWorkPlan(SamplePlan());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; bit += 3) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      EXPECT_FALSE(DecodeWorkPlan(bad).ok()) << "byte " << i << " bit " << bit;
    }
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeWorkPlan(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(WorkMessageKindOf("junk").ok());
}

TEST(WorkExchangeTest, OutOfRangeFieldsAreRefusedEvenWithAValidChecksum) {
  WorkPlan plan = SamplePlan();
  plan.sampling_rate = 1.5;
  EXPECT_FALSE(DecodeWorkPlan(EncodeWorkPlan(plan)).ok());
  plan = SamplePlan();
  plan.streams = {{"docs:1", 0, 1, 1}, {"docs:0", 0, 1, 1}};  // not sorted
  EXPECT_FALSE(DecodeWorkPlan(EncodeWorkPlan(plan)).ok());
  plan = SamplePlan();
  plan.streams = {{"docs:0", 10, 25, 20}};  // floor above the end
  EXPECT_FALSE(DecodeWorkPlan(EncodeWorkPlan(plan)).ok());
  plan = SamplePlan();
  plan.streams = {{"docs:0", 10, 5, 20}};  // floor below the window's start
  EXPECT_FALSE(DecodeWorkPlan(EncodeWorkPlan(plan)).ok());
  plan = SamplePlan();
  plan.streams[0].low = 30;  // low > high
  EXPECT_FALSE(DecodeWorkPlan(EncodeWorkPlan(plan)).ok());
  plan = SamplePlan();
  plan.step = 0;
  EXPECT_FALSE(DecodeWorkPlan(EncodeWorkPlan(plan)).ok());
}

// Ledger entries, plans and partial sums are appended one at a time and
// waited for: their producer lingers 0 ms (librdkafka's 5 ms default delayed
// every append on a step's critical path), unless the operator set a linger.
TEST(WaitedAppendProducerOptionsTest, LingerIsZeroUnlessTheOperatorSetsOne) {
  config::VipsdConfig config;
  config.kafka.properties["socket.keepalive.enable"] = "true";
  auto options = WaitedAppendProducerOptions(config, "broker:9092");
  EXPECT_EQ(options.bootstrap_servers, "broker:9092");
  EXPECT_EQ(options.properties.at("linger.ms"), "0");
  EXPECT_EQ(options.properties.at("socket.keepalive.enable"), "true");

  config.kafka.producer_properties["linger.ms"] = "20";
  EXPECT_EQ(WaitedAppendProducerOptions(config, "b:1").properties.at("linger.ms"), "20");

  config.kafka.producer_properties.erase("linger.ms");
  config.kafka.properties["queue.buffering.max.ms"] = "7";  // the alias
  options = WaitedAppendProducerOptions(config, "b:1");
  EXPECT_EQ(options.properties.count("linger.ms"), 0u);
  EXPECT_EQ(options.properties.at("queue.buffering.max.ms"), "7");
}

// The Kafka exchange on a mock cluster: a worker that rests (stops
// fetching while it sums) reads on with the plans appended meanwhile, in
// order, none twice, none lost; resting again or before any read changes
// nothing. The coordinator's end reads the partials the same way.
TEST(KafkaWorkExchangeTest, AnEndThatRestsReadsOnWithWhatCameMeanwhile) {
  auto cluster = connectors::MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  ASSERT_TRUE((*cluster)->CreateTopic("work", 2).ok());
  config::VipsdConfig config;
  config.work_topic = "work";
  config.ledger_key = "job-1";
  config.publish_timeout_seconds = 10;
  const std::string bootstrap = (*cluster)->bootstrap_servers();
  auto coordinator = NewKafkaWorkExchange(config, bootstrap, WorkRole::kCoordinator);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().message();
  auto worker = NewKafkaWorkExchange(config, bootstrap, WorkRole::kWorker);
  ASSERT_TRUE(worker.ok()) << worker.status().message();

  auto plan_of_step = [](int64_t step) {
    WorkPlan plan = SamplePlan();
    plan.step = step;
    return EncodeWorkPlan(plan);
  };
  // Polls until `count` messages came (a fetch may hold part of them).
  auto poll = [](WorkExchange& end, size_t count) {
    std::vector<std::pair<int64_t, std::string>> got;
    for (int tries = 0; tries < 100 && got.size() < count; ++tries) {
      auto more = end.Poll(std::chrono::milliseconds(100));
      EXPECT_TRUE(more.ok()) << more.status().message();
      if (!more.ok()) break;
      for (auto& m : *more) got.push_back(std::move(m));
    }
    return got;
  };
  auto steps = [](const std::vector<std::pair<int64_t, std::string>>& messages) {
    std::vector<int64_t> out;
    for (const auto& [offset, bytes] : messages) {
      auto plan = DecodeWorkPlan(bytes);
      out.push_back(plan.ok() ? plan->step : -1);
    }
    return out;
  };

  (*worker)->Rest();  // before any read: nothing to stop
  ASSERT_TRUE((*coordinator)->Append(plan_of_step(1)).ok());
  EXPECT_EQ(steps(poll(**worker, 1)), (std::vector<int64_t>{1}));
  (*worker)->Rest();
  (*worker)->Rest();
  ASSERT_TRUE((*coordinator)->Append(plan_of_step(2)).ok());
  ASSERT_TRUE((*coordinator)->Append(plan_of_step(3)).ok());
  auto after = poll(**worker, 2);
  EXPECT_EQ(steps(after), (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[1].first, after[0].first + 1);
  EXPECT_EQ((*worker)->read_position(), after[1].first + 1);
  (*worker)->Rest();
  auto none = (*worker)->Poll(std::chrono::milliseconds(200));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "a message was read twice";

  // The coordinator's end: partials, with a rest between two of them.
  WorkPartial partial;
  partial.job = "job-1";
  partial.epoch = 3;
  partial.owner = std::string(32, 'a');
  partial.slot = 40;
  partial.streams = {{"docs:0", 12}};
  partial.sum = "sum";
  partial.step = 1;
  ASSERT_TRUE((*worker)->Append(EncodeWorkPartial(partial)).ok());
  ASSERT_EQ(poll(**coordinator, 1).size(), 1u);
  (*coordinator)->Rest();
  partial.step = 2;
  ASSERT_TRUE((*worker)->Append(EncodeWorkPartial(partial)).ok());
  auto partials = poll(**coordinator, 1);
  ASSERT_EQ(partials.size(), 1u);
  auto decoded = DecodeWorkPartial(partials[0].second);
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_EQ(decoded->step, 2);
}

}  // namespace
}  // namespace vipsd::daemon
