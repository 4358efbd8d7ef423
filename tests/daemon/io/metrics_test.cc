#include "daemon/io/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

MetricsOptions RegistryOnly() {
  MetricsOptions options;
  options.listen_address = "";
  options.version = "1.2.3";
  options.model_type = "lda";
  options.input_topics = {"docs"};
  return options;
}

std::unique_ptr<Metrics> MakeMetrics(MetricsOptions options = RegistryOnly()) {
  auto metrics = Metrics::Create(options);
  EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
  return metrics.ok() ? std::move(metrics).value() : nullptr;
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "?";
}

// Names declared by "# TYPE <name> <type>" lines of an exposition.
std::set<std::string> ExposedNames(const std::string& text) {
  std::set<std::string> names;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      names.insert(line.substr(7, line.find(' ', 7) - 7));
    }
  }
  return names;
}

// Value of the sample line that starts with `series` followed by a space.
std::optional<double> SampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

TEST(MetricsTest, EveryTableRowIsExposedWithHelpAndType) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  const std::string text = metrics->SerializeText();
  std::set<std::string> declared;
  for (const MetricDescriptor& d : Metrics::Descriptors()) {
    const std::string name(d.name);
    EXPECT_TRUE(declared.insert(name).second) << "duplicate table row " << name;
    EXPECT_NE(text.find("# HELP " + name + " " + std::string(d.help) + "\n"), std::string::npos)
        << name;
    EXPECT_NE(text.find("# TYPE " + name + " " + std::string(TypeName(d.type)) + "\n"),
              std::string::npos)
        << name;
    EXPECT_FALSE(d.help.empty()) << name;
  }
  // Nothing is exposed that the table does not declare, besides the six
  // standard process_* metrics (docs/metrics.md).
  const std::set<std::string> process = {
      "process_cpu_seconds_total", "process_resident_memory_bytes",
      "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
      "process_start_time_seconds"};
  std::set<std::string> expected = declared;
  expected.insert(process.begin(), process.end());
  EXPECT_EQ(ExposedNames(text), expected);
  EXPECT_GE(declared.size(), 40u);
}

TEST(MetricsTest, NoMetricOrLabelSuggestsPrivateData) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->records_consumed_total("other").Increment();
  const std::string text = metrics->SerializeText();
  // A cheap guard for the privacy rule in metrics.h: per-batch sizes, clip
  // counts and training losses must never become metrics.
  const std::vector<std::string> forbidden = {"batch", "clip", "loss", "elbo", "perplexity",
                                              "likelihood", "gradient", "norm", "sampled"};
  std::set<std::string> names = ExposedNames(text);
  for (const MetricDescriptor& d : Metrics::Descriptors()) names.insert(std::string(d.name));
  for (const std::string& name : names) {
    for (const std::string& word : forbidden) {
      EXPECT_THAT(name, Not(HasSubstr(word))) << name << " suggests private data";
    }
  }
  // Label names form a small, fixed, public set.
  const std::set<std::string> allowed_labels = {"version", "model_type", "mode",  "topic",
                                                "reason",  "cause",      "result", "kind",
                                                "le",      "unit"};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // name{label="value",label="value"} number — label values here hold no '"'.
    const size_t open = line.find('{');
    if (open == std::string::npos) continue;
    const size_t close = line.find('}', open);
    ASSERT_NE(close, std::string::npos) << line;
    std::istringstream pairs(line.substr(open + 1, close - open - 1));
    std::string pair;
    while (std::getline(pairs, pair, ',')) {
      const std::string label = pair.substr(0, pair.find('='));
      EXPECT_TRUE(allowed_labels.count(label)) << label << " in " << line;
    }
  }
}

TEST(MetricsTest, DocsTableListsExactlyTheTableRows) {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/docs/metrics.md");
  ASSERT_TRUE(in) << "docs/metrics.md missing";
  std::set<std::string> documented;  // first cells "| `vipsd_…` |" of table rows
  std::string line;
  const std::string row_start = "| `vipsd_";
  while (std::getline(in, line)) {
    if (line.rfind(row_start, 0) != 0) continue;
    const size_t end = line.find('`', 3);
    ASSERT_NE(end, std::string::npos) << line;
    documented.insert(line.substr(3, end - 3));
  }
  std::set<std::string> declared;
  for (const MetricDescriptor& d : Metrics::Descriptors()) declared.insert(std::string(d.name));
  EXPECT_EQ(documented, declared);
}

TEST(MetricsTest, ProcessMetricsDescribeThisProcess) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  const std::string text = metrics->SerializeText();
  const auto rss = SampleValue(text, "process_resident_memory_bytes");
  const auto cpu = SampleValue(text, "process_cpu_seconds_total");
  const auto start = SampleValue(text, "process_start_time_seconds");
  const auto fds = SampleValue(text, "process_open_fds");
  const auto max_fds = SampleValue(text, "process_max_fds");
  ASSERT_TRUE(rss && cpu && start && fds && max_fds) << text;
  // Independent oracles: VmRSS of /proc/self/status, the wall clock, getrlimit.
  std::ifstream status("/proc/self/status");
  double vm_rss_kib = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) vm_rss_kib = std::stod(line.substr(6));
  }
  EXPECT_NEAR(*rss, vm_rss_kib * 1024, vm_rss_kib * 1024 * 0.2);
  EXPECT_GE(*cpu, 0);
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(*start, now + 1);
  EXPECT_GT(*start, now - 3600);
  EXPECT_GE(*fds, 3);  // stdin, stdout, stderr at least
  EXPECT_GE(*max_fds, *fds);
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
}

TEST(MetricsTest, WithoutStepTimingNoProcessMetricFollowsTheStepsWork) {
  // CPU time and memory grow with each step's realised batch size: a
  // private run (expose_step_timing false) serves only the work-independent
  // process metrics.
  MetricsOptions options = RegistryOnly();
  options.expose_step_timing = false;
  auto metrics = MakeMetrics(options);
  ASSERT_NE(metrics, nullptr);
  const std::string text = metrics->SerializeText();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes"}) {
    EXPECT_EQ(text.find(name), std::string::npos) << name;
  }
  for (const char* name : {"process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    EXPECT_TRUE(SampleValue(text, name).has_value()) << name;
  }
}

TEST(MetricsTest, LabelledSeriesWithFixedValuesExistAtZero) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  const std::string text = metrics->SerializeText();
  // Reject reasons: a series for each reason the configured model (lda)
  // can produce, none for the others (BLR's, SBN's).
  for (size_t i = 0; i < connectors::kNumRejectReasons; ++i) {
    const auto reason = static_cast<connectors::RejectReason>(i);
    const std::string series = "vipsd_records_rejected_total{reason=\"" +
                               std::string(connectors::RejectReasonName(reason)) + "\"}";
    if (connectors::RejectReasonApplies(reason, "lda")) {
      EXPECT_EQ(SampleValue(text, series), 0.0) << series;
    } else {
      EXPECT_EQ(text.find(series), std::string::npos) << series;
    }
  }
  MetricsOptions per_unit = RegistryOnly();
  per_unit.per_unit = true;
  auto unit_metrics = MakeMetrics(per_unit);
  ASSERT_NE(unit_metrics, nullptr);
  const std::string unit_text = unit_metrics->SerializeText();
  EXPECT_EQ(SampleValue(unit_text, "vipsd_records_rejected_total{reason=\"missing_unit\"}"), 0.0);
  EXPECT_EQ(SampleValue(unit_text, "vipsd_records_rejected_total{reason=\"bad_unit\"}"), 0.0);
  // The unit the ε protects: one of three, and the cap.
  unit_metrics->SetPrivacyUnit(config::PrivacyUnit::kKey, 20);
  const std::string set_text = unit_metrics->SerializeText();
  EXPECT_EQ(SampleValue(set_text, "vipsd_privacy_unit{unit=\"key\"}"), 1.0);
  EXPECT_EQ(SampleValue(set_text, "vipsd_privacy_unit{unit=\"record\"}"), 0.0);
  EXPECT_EQ(SampleValue(set_text, "vipsd_privacy_unit{unit=\"field\"}"), 0.0);
  EXPECT_EQ(SampleValue(set_text, "vipsd_privacy_max_records_per_unit"), 20.0);
  EXPECT_NE(text.find("reason=\"bad_text\""), std::string::npos);
  EXPECT_EQ(text.find("reason=\"norm_too_large\""), std::string::npos);
  EXPECT_EQ(text.find("reason=\"not_binary\""), std::string::npos);
  for (const char* reason : {"window_overflow", "ceiling", "error", "missed"}) {
    EXPECT_EQ(
        SampleValue(text, std::string("vipsd_slots_skipped_total{reason=\"") + reason + "\"}"),
        0.0);
  }
  for (const char* kind : {"transport", "consume", "produce", "commit", "fatal", "other"}) {
    EXPECT_EQ(SampleValue(text, std::string("vipsd_kafka_errors_total{kind=\"") + kind + "\"}"),
              0.0);
  }
  for (const char* result : {"success", "failure"}) {
    EXPECT_EQ(
        SampleValue(text, std::string("vipsd_config_reloads_total{result=\"") + result + "\"}"),
        0.0);
  }
  for (const char* mode : {"global", "residency"}) {
    EXPECT_EQ(SampleValue(text, std::string("vipsd_privacy_accounting_mode{mode=\"") + mode + "\"}"),
              0.0);
  }
  // Configured topics exist at 0; others appear when first used.
  EXPECT_EQ(SampleValue(text, R"(vipsd_records_consumed_total{topic="docs"})"), 0.0);
  EXPECT_THAT(text, Not(HasSubstr(R"(vipsd_records_consumed_total{topic="other"})")));
}

TEST(MetricsTest, BuildInfoStartTimeAndInitialReloadState) {
  const double before = std::chrono::duration<double>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  const std::string text = metrics->SerializeText();
  EXPECT_EQ(SampleValue(text, R"(vipsd_build_info{model_type="lda",version="1.2.3"})"), 1.0);
  const double start = metrics->start_time_seconds().Value();
  EXPECT_GE(start, before);
  EXPECT_LT(start, before + 60);
  EXPECT_EQ(metrics->config_last_reload_successful().Value(), 1.0);
  EXPECT_EQ(metrics->config_last_reload_success_timestamp_seconds().Value(), start);
  EXPECT_EQ(metrics->last_step_timestamp_seconds().Value(), 0.0);
  EXPECT_EQ(metrics->port(), 0);
}

TEST(MetricsTest, HandlesUpdateTheExposition) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->steps_total().Increment();
  metrics->steps_total().Increment(2);
  metrics->step().Set(41);
  metrics->step().Increment();
  metrics->pool_records().Set(10);
  metrics->pool_records().Decrement(3);
  metrics->records_rejected_total(connectors::RejectReason::kBadText).Increment(4);
  metrics->pool_evicted_total().Increment(5);
  metrics->slots_skipped_total(SkipReason::kWindowOverflow).Increment(2);
  metrics->kafka_errors_total(KafkaErrorKind::kFatal).Increment();
  metrics->release_bytes().Set(123456);
  metrics->step_duration_seconds().Observe(0.003);
  metrics->step_duration_seconds().Observe(90);  // above the last bucket

  const std::string text = metrics->SerializeText();
  EXPECT_EQ(SampleValue(text, "vipsd_steps_total"), 3.0);
  EXPECT_EQ(metrics->steps_total().Value(), 3.0);
  EXPECT_EQ(SampleValue(text, "vipsd_step"), 42.0);
  EXPECT_EQ(SampleValue(text, "vipsd_pool_records"), 7.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_records_rejected_total{reason="bad_text"})"), 4.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_records_rejected_total{reason="invalid_json"})"), 0.0);
  EXPECT_EQ(SampleValue(text, "vipsd_pool_evicted_total"), 5.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_slots_skipped_total{reason="window_overflow"})"), 2.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_slots_skipped_total{reason="missed"})"), 0.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_kafka_errors_total{kind="fatal"})"), 1.0);
  EXPECT_EQ(SampleValue(text, "vipsd_release_bytes"), 123456.0);
  // Histogram: cumulative buckets from 1 ms to 60 s.
  EXPECT_EQ(SampleValue(text, R"(vipsd_step_duration_seconds_bucket{le="0.0025"})"), 0.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_step_duration_seconds_bucket{le="0.005"})"), 1.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_step_duration_seconds_bucket{le="60"})"), 1.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_step_duration_seconds_bucket{le="+Inf"})"), 2.0);
  EXPECT_EQ(SampleValue(text, "vipsd_step_duration_seconds_count"), 2.0);
  EXPECT_DOUBLE_EQ(*SampleValue(text, "vipsd_step_duration_seconds_sum"), 90.003);
  EXPECT_TRUE(SampleValue(text, R"(vipsd_step_duration_seconds_bucket{le="0.001"})"));
  EXPECT_TRUE(SampleValue(text, R"(vipsd_ledger_commit_duration_seconds_bucket{le="0.0001"})"));
  EXPECT_TRUE(SampleValue(text, R"(vipsd_release_publish_duration_seconds_bucket{le="30"})"));
}

TEST(MetricsTest, StepTimingIsNotExportedUnlessAskedFor) {
  MetricsOptions options;
  options.listen_address = "";
  options.version = "1.2.3";
  options.model_type = "lda";
  options.expose_step_timing = false;
  auto metrics = Metrics::Create(options);
  ASSERT_TRUE(metrics.ok());
  (*metrics)->step_duration_seconds().Observe(0.5);       // a no-op handle
  (*metrics)->last_step_timestamp_seconds().Set(1.0e9);   // likewise
  const std::string text = (*metrics)->SerializeText();
  EXPECT_THAT(text, Not(HasSubstr("vipsd_step_duration_seconds")));
  EXPECT_THAT(text, Not(HasSubstr("vipsd_last_step_timestamp_seconds")));
  EXPECT_EQ((*metrics)->last_step_timestamp_seconds().Value(), 0.0);
  EXPECT_THAT(text, HasSubstr("vipsd_last_slot_timestamp_seconds"));
}

TEST(MetricsTest, TopicSeriesAreAddedOnFirstUseAndShared) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  const CounterHandle docs = metrics->records_consumed_total("docs");
  docs.Increment(5);
  metrics->records_consumed_total("docs").Increment(2);  // same series
  metrics->records_consumed_total("other").Increment();
  EXPECT_EQ(docs.Value(), 7.0);
  const std::string text = metrics->SerializeText();
  EXPECT_EQ(SampleValue(text, R"(vipsd_records_consumed_total{topic="docs"})"), 7.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_records_consumed_total{topic="other"})"), 1.0);
}

TEST(MetricsTest, BudgetRemainingIsCeilingMinusSpentFlooredAtZero) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->SetPrivacyBudget(0.75, 2.0, 1e-5);
  EXPECT_EQ(metrics->privacy_epsilon_spent().Value(), 0.75);
  EXPECT_EQ(metrics->privacy_epsilon_ceiling().Value(), 2.0);
  EXPECT_EQ(metrics->privacy_epsilon_remaining().Value(), 1.25);
  EXPECT_EQ(metrics->privacy_delta().Value(), 1e-5);
  // A lowered ceiling (reload) can leave spent above it: remaining is 0.
  metrics->SetPrivacyBudget(0.75, 0.5, 1e-6);
  EXPECT_EQ(metrics->privacy_epsilon_remaining().Value(), 0.0);
  EXPECT_EQ(SampleValue(metrics->SerializeText(), "vipsd_privacy_delta"), 1e-6);
}

TEST(MetricsTest, AccountingModeIsOneHot) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->SetAccountingMode(AccountingMode::kResidency);
  EXPECT_EQ(metrics->privacy_accounting_mode(AccountingMode::kResidency).Value(), 1.0);
  EXPECT_EQ(metrics->privacy_accounting_mode(AccountingMode::kGlobal).Value(), 0.0);
  metrics->SetAccountingMode(AccountingMode::kGlobal);
  const std::string text = metrics->SerializeText();
  EXPECT_EQ(SampleValue(text, R"(vipsd_privacy_accounting_mode{mode="global"})"), 1.0);
  EXPECT_EQ(SampleValue(text, R"(vipsd_privacy_accounting_mode{mode="residency"})"), 0.0);
}

TEST(MetricsTest, ReloadOutcomesMoveTheReloadMetricsTogether) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  const double loaded_at = metrics->config_last_reload_success_timestamp_seconds().Value();
  metrics->RecordReload(ReloadResult::kFailure, loaded_at + 10);
  EXPECT_EQ(metrics->config_last_reload_successful().Value(), 0.0);
  EXPECT_EQ(metrics->config_last_reload_success_timestamp_seconds().Value(), loaded_at);
  EXPECT_EQ(metrics->config_reloads_total(ReloadResult::kFailure).Value(), 1.0);
  metrics->RecordReload(ReloadResult::kSuccess, loaded_at + 20);
  EXPECT_EQ(metrics->config_last_reload_successful().Value(), 1.0);
  EXPECT_EQ(metrics->config_last_reload_success_timestamp_seconds().Value(), loaded_at + 20);
  EXPECT_EQ(metrics->config_reloads_total(ReloadResult::kSuccess).Value(), 1.0);
  EXPECT_EQ(metrics->config_reloads_total(ReloadResult::kFailure).Value(), 1.0);
}

TEST(MetricsTest, CreateRejectsMissingBuildInfo) {
  MetricsOptions options = RegistryOnly();
  options.input_topics = {"docs", ""};
  EXPECT_EQ(Metrics::Create(options).status().code(), StatusCode::kInvalidArgument);
  options = RegistryOnly();
  options.version = "";
  auto metrics = Metrics::Create(options);
  ASSERT_FALSE(metrics.ok());
  EXPECT_EQ(metrics.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(metrics.status().message(), HasSubstr("version"));
  options = RegistryOnly();
  options.model_type = "";
  metrics = Metrics::Create(options);
  ASSERT_FALSE(metrics.ok());
  EXPECT_THAT(metrics.status().message(), HasSubstr("model type"));
}

TEST(MetricsTest, ListenAddressMustBeNumericHostAndPort) {
  for (const char* good : {"", "127.0.0.1:9464", "0.0.0.0:0", "10.1.2.3:65535"}) {
    EXPECT_TRUE(ValidateMetricsListenAddress(good).ok()) << good;
  }
  for (const char* bad : {"9464", "localhost:9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536",
                          "127.0.0.1:9464s", "127.0.0.1:9464,8080", "127.0.0.1:-1",
                          "256.0.0.1:9464", "::1:9464", "[::1]:9464", "[::]:0", "[127.0.0.1]:80",
                          ":9464", "127.0.0.1:99999999999"}) {
    const Status status = ValidateMetricsListenAddress(bad);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr(std::string("\"") + bad + "\"")) << bad;
    MetricsOptions options = RegistryOnly();
    options.listen_address = bad;
    auto metrics = Metrics::Create(options);
    EXPECT_FALSE(metrics.ok()) << bad;
  }
}

// Minimal HTTP/1.0 GET against 127.0.0.1; returns the whole response.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

TEST(MetricsTest, EndpointServesTheExpositionOnAnEphemeralPort) {
  MetricsOptions options = RegistryOnly();
  options.listen_address = "127.0.0.1:0";
  auto metrics = MakeMetrics(options);
  ASSERT_NE(metrics, nullptr);
  ASSERT_GT(metrics->port(), 0);
  metrics->steps_total().Increment(7);
  const std::string response = HttpGet(metrics->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("\nvipsd_steps_total 7\n"));
  EXPECT_THAT(response, HasSubstr("vipsd_build_info{"));
  // Besides the table, only prometheus-cpp's own exposer_* metrics and the
  // standard process_* metrics are served (docs/metrics.md lists them).
  std::set<std::string> declared;
  for (const MetricDescriptor& d : Metrics::Descriptors()) declared.insert(std::string(d.name));
  for (const std::string& name : ExposedNames(response)) {
    EXPECT_TRUE(declared.count(name) || name.rfind("exposer_", 0) == 0 ||
                name.rfind("process_", 0) == 0)
        << name;
  }
  // Only /metrics is served.
  EXPECT_THAT(HttpGet(metrics->port(), "/"), Not(HasSubstr("200 OK")));
  EXPECT_THAT(HttpGet(metrics->port(), "/metrics/../etc/passwd"), Not(HasSubstr("root:")));
}

TEST(MetricsTest, BusyAddressIsAnErrorNamingTheAddress) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string busy = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));

  MetricsOptions options = RegistryOnly();
  options.listen_address = busy;
  auto metrics = Metrics::Create(options);
  close(fd);
  ASSERT_FALSE(metrics.ok());
  EXPECT_EQ(metrics.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(metrics.status().message(), HasSubstr(busy));
}

TEST(MetricsTest, ConcurrentUpdatesAndScrapesLoseNothing) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  constexpr int kThreads = 4;
  constexpr int kIncrements = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      const CounterHandle topic = metrics->records_consumed_total("topic" + std::to_string(t % 2));
      for (int i = 0; i < kIncrements; ++i) {
        metrics->steps_total().Increment();
        topic.Increment();
        metrics->step_duration_seconds().Observe(0.01);
        if (i % 1000 == 0) (void)metrics->SerializeText();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const std::string text = metrics->SerializeText();
  EXPECT_EQ(SampleValue(text, "vipsd_steps_total"), kThreads * kIncrements);
  EXPECT_EQ(SampleValue(text, "vipsd_step_duration_seconds_count"), kThreads * kIncrements);
  EXPECT_EQ(SampleValue(text, R"(vipsd_records_consumed_total{topic="topic0"})"),
            kThreads / 2 * kIncrements);
}

// promtool (the Prometheus project's own linter) accepts the full exposition,
// with every kind of series populated.
TEST(MetricsTest, PromtoolCheckMetricsAcceptsTheExposition) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->SetAccountingMode(AccountingMode::kGlobal);
  metrics->SetPrivacyBudget(0.5, 1.0, 1e-5);
  metrics->records_consumed_total("docs").Increment(3);
  metrics->step_duration_seconds().Observe(0.2);
  metrics->release_publish_duration_seconds().Observe(0.02);
  metrics->ledger_commit_duration_seconds().Observe(0.002);
  const std::string path = ::testing::TempDir() + "metrics_test_exposition.txt";
  std::ofstream(path) << metrics->SerializeText();
  const std::string command =
      std::string(VIPSD_PROMTOOL) + " check metrics < " + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_EQ(output, "");
}

}  // namespace
}  // namespace vipsd::daemon
