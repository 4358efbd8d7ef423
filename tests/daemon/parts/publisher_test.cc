// Publisher: what leaves at a slot's public deadline, and when
// (daemon/parts/publisher.h) — deadlines and overruns, releases retried byte for
// byte, the owed release, alerts, status.json.
#include "daemon/parts/publisher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "tests/testing/fake_io.h"
#include "tests/testing/test_metrics.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;

release::Release MakeRelease(int64_t step, double value) {
  release::Release r;
  release::ReleaseMetadata& m = r.metadata;
  m.release_id = "step-" + std::to_string(step);
  m.model_type = "lda";
  m.step = step;
  m.rho = 0.5;
  m.epsilon_spent = 1.0;
  m.delta = 1e-5;
  m.noise_multiplier = 1.0;
  m.sampling_rate = 0.1;
  m.accountant = "fixed_pld";
  m.schedule = "fixed";
  m.conversion = "pld_pessimistic";
  m.clip_bounds = {{"topic_word", 2.0}};
  m.dimensions = {{"K", 1}, {"V", 2}, {"N", 10}};
  m.vocabulary_fingerprint = std::string(64, 'a');
  m.config_fingerprint = std::string(64, 'b');
  m.is_private = true;
  m.noise_description = "test";
  m.created_at_utc = "2026-11-27T00:00:00Z";
  r.arrays.push_back({"lambda", {1, 2}, {value, value}});
  return r;
}

struct Fixture {
  std::shared_ptr<SinkLog> log = std::make_shared<SinkLog>();
  FakeSink sink{log};
  std::unique_ptr<Metrics> metrics = NewTestMetrics();
  RunControl control;
  std::vector<int64_t> confirmed;
  Publisher publisher{&sink, metrics.get(), &control, /*paced=*/true,
                      [this](const release::Release& r) { confirmed.push_back(r.metadata.step); }};
};

TEST(PublisherTest, OutputsWaitForTheirDeadlineAndAnOverrunIsCounted) {
  Fixture f;
  SlotOutputs out;
  out.slot = 7;
  out.deadline = WallNow() + 0.2;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(f.publisher.WaitForDeadline(out));
  EXPECT_GE(WallNow(), out.deadline);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
  EXPECT_EQ(f.metrics->release_deadline_overruns_total().Value(), 0);
  out.deadline = WallNow() - 1;  // past: at once, and not counted here
  EXPECT_TRUE(f.publisher.WaitForDeadline(out));
  EXPECT_EQ(f.metrics->release_deadline_overruns_total().Value(), 0);
  // The daemon counts a late slot when its outputs leave with a later one's.
  f.publisher.CountOverrun(7, 8);
  EXPECT_EQ(f.metrics->release_deadline_overruns_total().Value(), 1);
  out.deadline = 0;  // unpaced: at once
  EXPECT_TRUE(f.publisher.WaitForDeadline(out));
  // Stopping before a deadline: false, nothing waits.
  f.control.RequestStop();
  out.deadline = WallNow() + 30;
  EXPECT_FALSE(f.publisher.WaitForDeadline(out));
}

TEST(PublisherTest, AFailedReleaseIsRetriedWithTheSameBytesAndTimestampAndIsOwedMeanwhile) {
  Fixture f;
  f.log->fail_next_releases = 1;
  int builds = 0;
  auto build = [&](double value) {
    return [&builds, value]() -> StatusOr<release::Release> {
      ++builds;
      return MakeRelease(3, value);
    };
  };
  EXPECT_FALSE(f.publisher.PublishModel(3, 1000.0, build(1.0), Status::Ok()).ok());
  EXPECT_TRUE(f.publisher.owed());
  EXPECT_EQ(f.metrics->release_pending().Value(), 1);
  EXPECT_FALSE(f.publisher.retry_due(WallNow() - 100));  // backs off
  // The retry of the same step re-sends the failed attempt's bytes and
  // timestamp, even if the model changed meanwhile (the failed attempt may
  // have been delivered: a release id never carries two contents).
  ASSERT_TRUE(f.publisher.PublishModel(3, 2000.0, build(2.0), Status::Ok()).ok());
  EXPECT_EQ(builds, 1);
  ASSERT_EQ(f.log->attempts.size(), 2u);
  EXPECT_EQ(f.log->attempts[0].bytes, f.log->attempts[1].bytes);
  EXPECT_EQ(f.log->attempts[1].publish_time, 1000.0);
  EXPECT_FALSE(f.publisher.owed());
  EXPECT_EQ(f.publisher.published_step(), 3);
  EXPECT_EQ(f.confirmed, std::vector<int64_t>{3});
  // A later step is built afresh.
  ASSERT_TRUE(f.publisher.PublishModel(4, 3000.0, build(3.0), Status::Ok()).ok());
  EXPECT_EQ(builds, 2);
}

TEST(PublisherTest, AReleaseLeavesOnlyIfTheCallerStillOwnsTheJob) {
  Fixture f;
  auto build = []() -> StatusOr<release::Release> { return MakeRelease(5, 1.0); };
  const Status refused =
      f.publisher.PublishModel(5, 1000.0, build, UnavailableError("ledger topic unreachable"));
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(f.log->attempts.empty());  // nothing reached the sink
  EXPECT_TRUE(f.publisher.owed());
  EXPECT_EQ(f.metrics->releases_failed_total().Value(), 1);
}

TEST(PublisherTest, StoppingBeforeTheDeadlineWithholdsTheReleaseButSaysItsLines) {
  Fixture f;
  f.publisher.Owe();
  EXPECT_TRUE(f.publisher.owed());
  SlotOutputs out;
  out.step = 9;
  out.publish = true;
  out.log_lines.emplace_back(LogLevel::kInfo, "a line of the step");
  f.publisher.WithholdOnStop(out);
  EXPECT_FALSE(f.publisher.owed());
  EXPECT_TRUE(f.log->attempts.empty());
}

TEST(PublisherTest, AlertsGoToTheAlertTopicOnlyWhenOneIsConfigured) {
  Fixture f;
  f.publisher.PublishAlert("{\"event\": \"halted\"}", /*alert_topic_configured=*/false);
  EXPECT_TRUE(f.log->alerts.empty());
  f.publisher.PublishAlert("{\"event\": \"halted\"}", /*alert_topic_configured=*/true);
  ASSERT_EQ(f.log->alerts.size(), 1u);
  EXPECT_EQ(f.metrics->alerts_published_total().Value(), 1);
  // An offline run's sink takes every alert.
  Publisher offline(&f.sink, f.metrics.get(), &f.control, /*paced=*/false, nullptr);
  offline.PublishAlert("{\"event\": \"halted\"}", /*alert_topic_configured=*/false);
  EXPECT_EQ(f.log->alerts.size(), 2u);
}

TEST(PublisherTest, TheStepLineCarriesPublicValuesOnly) {
  Fixture f;
  SlotOutputs out;
  out.stepped = true;
  out.step = 12;
  out.slot = 40;
  out.rho = 0.25;
  out.window_offsets = -1;
  Publisher::ReportContext context;
  context.epsilon = "1.2345/4";
  context.pool_size = 77;
  EXPECT_EQ(f.publisher.ReportStep(out, context),
            "step=12 slot=40 rho=0.2500 epsilon=1.2345/4 window=77");
  EXPECT_EQ(f.metrics->step().Value(), 12);
  EXPECT_EQ(f.metrics->steps_total().Value(), 1);
  out.partials_local = 2;
  out.partials_remote = 3;
  out.window_offsets = 500;
  context.coordinator = true;
  context.epsilon.clear();  // not private
  EXPECT_EQ(f.publisher.ReportStep(out, context), "step=12 slot=40 rho=0.2500 window=500 partials=2+3");
  out.stepped = false;
  EXPECT_EQ(f.publisher.ReportStep(out, context), "");
}

// A late slot is reported at a later slot's deadline, when the pool holds
// that slot's window: its line states the window its own step sampled from.
TEST(PublisherTest, ALateSlotsLineStatesTheWindowItsStepSampledFrom) {
  Fixture f;
  SlotOutputs late;
  late.stepped = true;
  late.step = 7;
  late.slot = 7;
  late.rho = 0.5;
  late.pool_records = 1680;
  Publisher::ReportContext context;
  context.pool_size = 1920;  // slot 8's window, when slot 7 is reported
  EXPECT_EQ(f.publisher.ReportStep(late, context), "step=7 slot=7 rho=0.5000 window=1680");
}

// Per-phase step timing (issue 30): work-dependent, so it is on the step
// line only where step timing is exposed, never otherwise.
TEST(PublisherTest, PhaseTimesAreOnTheStepLineOnlyWithExposedStepTiming) {
  Fixture f;
  SlotOutputs out;
  out.stepped = true;
  out.step = 3;
  out.slot = 9;
  out.rho = 0.5;
  out.window_offsets = 10;
  out.phases = {{"charge", 0.0001}, {"plan", 0.00475}, {"own", 0.2581}, {"wait", 0.0485}};
  out.ledger_committed = true;
  out.ledger_commit_seconds = 0.008;
  Publisher::ReportContext context;
  context.coordinator = true;
  EXPECT_EQ(f.publisher.ReportStep(out, context),
            "step=3 slot=9 rho=0.5000 window=10 partials=0+0");
  context.expose_step_timing = true;
  EXPECT_EQ(f.publisher.ReportStep(out, context),
            "step=3 slot=9 rho=0.5000 window=10 partials=0+0 "
            "phase_ms=charge:0.1,plan:4.8,own:258.1,wait:48.5,commit:8.0");
  out.ledger_committed = false;  // a late slot reported before its commit: no commit phase
  out.phases.resize(1);
  EXPECT_EQ(f.publisher.ReportStep(out, context),
            "step=3 slot=9 rho=0.5000 window=10 partials=0+0 phase_ms=charge:0.1");
}

TEST(PublisherTest, StatusJsonStatesTheLastReleaseAndTheRunsPublicSettings) {
  Fixture f;
  const std::string dir = ::testing::TempDir() + "publisher_status";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  config::VipsdConfig config;
  config.file = "/etc/vipsd.yaml";
  config.state_directory = dir;
  config.driver.mechanism.noise_multiplier = 1.0;
  config.driver.delta = 1e-5;
  config.driver.epsilon_ceiling = 4;
  ASSERT_TRUE(f.publisher
                  .PublishModel(6, 1234.5, [] { return StatusOr<release::Release>(MakeRelease(6, 1)); },
                                Status::Ok())
                  .ok());
  f.publisher.WriteStatus({&config, /*halted=*/true, /*ledger_failing=*/false, /*last_slot=*/41});
  std::ifstream in(dir + "/status.json");
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(json, HasSubstr("\"config\": \"/etc/vipsd.yaml\""));
  EXPECT_THAT(json, HasSubstr("\"halted\": true"));
  EXPECT_THAT(json, HasSubstr("\"last_slot\": 41"));
  EXPECT_THAT(json, HasSubstr("\"last_release_step\": 6"));
  EXPECT_THAT(json, HasSubstr("\"last_release_time\": 1234.5"));
  EXPECT_THAT(json, HasSubstr("\"epsilon_ceiling\": 4"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/status.json.tmp"));
}

}  // namespace
}  // namespace vipsd::daemon
