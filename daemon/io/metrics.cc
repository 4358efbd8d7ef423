#include "daemon/io/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace vipsd::daemon {
namespace {

constexpr bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.substr(text.size() - suffix.size()) == suffix;
}

// Prometheus naming rules the table must follow; checked at compile time.
constexpr bool NameFollowsConventions(MetricType type, bool info, std::string_view id) {
  if (id.empty() || id.front() == '_' || id.back() == '_') return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  const bool is_total = EndsWith(id, "_total");
  if ((type == MetricType::kCounter) != is_total) return false;
  if (info != EndsWith(id, "_info")) return false;
  if (id.find("timestamp") != std::string_view::npos && !EndsWith(id, "_timestamp_seconds")) {
    return false;
  }
  // Base units only.
  for (std::string_view non_base : {"milliseconds", "microseconds", "minutes", "hours",
                                    "kilobytes", "megabytes", "_ms", "_us"}) {
    if (id.find(non_base) != std::string_view::npos) return false;
  }
  return true;
}

#define VIPSD_CHECK_INFO_(id, help)                                                     \
  static_assert(NameFollowsConventions(MetricType::kGauge, true, #id),                 \
                "vipsd_" #id " breaks the naming conventions in metrics.h");
#define VIPSD_CHECK_COUNTER_(id, unit, help)                                            \
  static_assert(NameFollowsConventions(MetricType::kCounter, false, #id),              \
                "vipsd_" #id " breaks the naming conventions in metrics.h");
#define VIPSD_CHECK_GAUGE_(id, unit, help)                                              \
  static_assert(NameFollowsConventions(MetricType::kGauge, false, #id),                \
                "vipsd_" #id " breaks the naming conventions in metrics.h");
#define VIPSD_CHECK_HISTOGRAM_(id, unit, help, buckets)                                 \
  static_assert(NameFollowsConventions(MetricType::kHistogram, false, #id),            \
                "vipsd_" #id " breaks the naming conventions in metrics.h");           \
  static_assert(std::is_sorted(buckets.begin(), buckets.end()) && buckets.front() > 0, \
                "buckets of vipsd_" #id " must be positive and increasing");
#define VIPSD_CHECK_COUNTER_BY_(id, unit, help, label, Enum) VIPSD_CHECK_COUNTER_(id, unit, help)
#define VIPSD_CHECK_GAUGE_BY_(id, unit, help, label, Enum) VIPSD_CHECK_GAUGE_(id, unit, help)
#define VIPSD_CHECK_COUNTER_PER_(id, unit, help, label) VIPSD_CHECK_COUNTER_(id, unit, help)
VIPSD_METRICS_TABLE(VIPSD_CHECK_INFO_, VIPSD_CHECK_COUNTER_, VIPSD_CHECK_GAUGE_,
                    VIPSD_CHECK_HISTOGRAM_, VIPSD_CHECK_COUNTER_BY_, VIPSD_CHECK_GAUGE_BY_,
                    VIPSD_CHECK_COUNTER_PER_)

#define VIPSD_DESCRIBE_INFO_(id, help) \
  {"vipsd_" #id, MetricType::kGauge, "", help, "version,model_type"},
#define VIPSD_DESCRIBE_COUNTER_(id, unit, help) {"vipsd_" #id, MetricType::kCounter, unit, help, ""},
#define VIPSD_DESCRIBE_GAUGE_(id, unit, help) {"vipsd_" #id, MetricType::kGauge, unit, help, ""},
#define VIPSD_DESCRIBE_HISTOGRAM_(id, unit, help, buckets) \
  {"vipsd_" #id, MetricType::kHistogram, unit, help, ""},
#define VIPSD_DESCRIBE_COUNTER_BY_(id, unit, help, label, Enum) \
  {"vipsd_" #id, MetricType::kCounter, unit, help, label},
#define VIPSD_DESCRIBE_GAUGE_BY_(id, unit, help, label, Enum) \
  {"vipsd_" #id, MetricType::kGauge, unit, help, label},
#define VIPSD_DESCRIBE_COUNTER_PER_(id, unit, help, label) \
  {"vipsd_" #id, MetricType::kCounter, unit, help, label},
constexpr MetricDescriptor kDescriptors[] = {VIPSD_METRICS_TABLE(
    VIPSD_DESCRIBE_INFO_, VIPSD_DESCRIBE_COUNTER_, VIPSD_DESCRIBE_GAUGE_,
    VIPSD_DESCRIBE_HISTOGRAM_, VIPSD_DESCRIBE_COUNTER_BY_, VIPSD_DESCRIBE_GAUGE_BY_,
    VIPSD_DESCRIBE_COUNTER_PER_)};

double UnixNowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status BadAddress(std::string_view address, std::string_view why) {
  return InvalidArgumentError("metrics listen address \"" + std::string(address) +
                              "\": " + std::string(why) +
                              "; expected \"IPv4:port\" with port in [0, 65535], or \"\" "
                              "for no endpoint");
}

// Step timing reveals how long each step took (hence something about its
// batch): exported only when the operator asks for it.
bool Exported(std::string_view id, const MetricsOptions& options) {
  if (id == "step_duration_seconds" || id == "last_step_timestamp_seconds") {
    return options.expose_step_timing;
  }
  return true;
}

// The standard process_* metrics of Prometheus client libraries, from
// /proc/self (Linux). A value that cannot be read is left out of the scrape.
// CPU seconds and resident/virtual memory follow the work of each step (its
// realised batch size): like step durations they are a side channel the DP
// guarantee does not cover, so they are served only with
// metrics.expose_step_timing (`work_dependent`); start time and file
// descriptors always.
class ProcessCollector final : public prometheus::Collectable {
 public:
  explicit ProcessCollector(bool work_dependent) : work_dependent_(work_dependent) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    auto add = [&](const char* name, const char* help, prometheus::MetricType type,
                   double value) {
      prometheus::MetricFamily family;
      family.name = name;
      family.help = help;
      family.type = type;
      prometheus::ClientMetric metric;
      if (type == prometheus::MetricType::Counter) {
        metric.counter.value = value;
      } else {
        metric.gauge.value = value;
      }
      family.metric.push_back(std::move(metric));
      families.push_back(std::move(family));
    };
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    // Fields after the command name (which may hold spaces) start at field 3.
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && ticks > 0) {
      const bool work = work_dependent_;
      std::istringstream fields(stat.substr(close + 2));
      std::vector<std::string> f;
      for (std::string x; fields >> x;) f.push_back(x);
      // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
      if (f.size() > 21) {
        try {
          if (work) {
            add("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                prometheus::MetricType::Counter,
                (std::stod(f[11]) + std::stod(f[12])) / ticks);
            add("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                prometheus::MetricType::Gauge, std::stod(f[20]));
            add("process_resident_memory_bytes", "Resident memory size in bytes.",
                prometheus::MetricType::Gauge, std::stod(f[21]) * page);
          }
          if (const double boot = BootTime(); boot > 0) {
            add("process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                prometheus::MetricType::Gauge, boot + std::stod(f[19]) / ticks);
          }
        } catch (const std::exception&) {
        }
      }
    }
    if (DIR* dir = opendir("/proc/self/fd")) {
      double open = 0;
      while (const dirent* entry = readdir(dir)) {
        if (entry->d_name[0] != '.') ++open;
      }
      closedir(dir);
      add("process_open_fds", "Number of open file descriptors.", prometheus::MetricType::Gauge,
          open - 1);  // without the one opendir holds
    }
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
      add("process_max_fds", "Maximum number of open file descriptors.",
          prometheus::MetricType::Gauge, static_cast<double>(limit.rlim_cur));
    }
    return families;
  }

 private:
  bool work_dependent_;

  static double BootTime() {
    std::ifstream in("/proc/stat");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("btime ", 0) == 0) {
        try {
          return std::stod(line.substr(6));
        } catch (const std::exception&) {
          return 0;
        }
      }
    }
    return 0;
  }
};

template <typename Enum>
std::string LabelText(size_t index) {
  return std::string(MetricLabelValues<Enum>::Name(static_cast<Enum>(index)));
}

// Label values that get a series: every value, except reject reasons that
// the configured model's input path cannot produce (their handles do nothing).
template <typename Enum>
bool LabelApplies(size_t, const MetricsOptions&) {
  return true;
}
template <>
bool LabelApplies<connectors::RejectReason>(size_t index, const MetricsOptions& options) {
  return connectors::RejectReasonApplies(static_cast<connectors::RejectReason>(index),
                                         options.model_type, options.per_unit);
}

}  // namespace


std::string_view SkipReasonName(SkipReason reason) {
  switch (reason) {
    case SkipReason::kWindowOverflow: return "window_overflow";
    case SkipReason::kCeiling: return "ceiling";
    case SkipReason::kError: return "error";
    case SkipReason::kMissed: return "missed";
    case SkipReason::kOverrun: return "overrun";
  }
  return "unknown";
}

std::string_view RoundOutcomeName(RoundOutcome outcome) {
  switch (outcome) {
    case RoundOutcome::kShare: return "share";
    case RoundOutcome::kDeclined: return "declined";
    case RoundOutcome::kWithheld: return "withheld";
    case RoundOutcome::kAbandoned: return "abandoned";
  }
  return "unknown";
}

std::string_view ReloadResultName(ReloadResult result) {
  switch (result) {
    case ReloadResult::kSuccess: return "success";
    case ReloadResult::kFailure: return "failure";
  }
  return "unknown";
}

std::string_view DeadLetterSkipName(DeadLetterSkip skip) {
  switch (skip) {
    case DeadLetterSkip::kDeliveredBefore: return "delivered_before";
    case DeadLetterSkip::kUndeliverable: return "undeliverable";
  }
  return "unknown";
}

std::string_view KafkaErrorKindName(KafkaErrorKind kind) {
  switch (kind) {
    case KafkaErrorKind::kTransport: return "transport";
    case KafkaErrorKind::kConsume: return "consume";
    case KafkaErrorKind::kProduce: return "produce";
    case KafkaErrorKind::kCommit: return "commit";
    case KafkaErrorKind::kFatal: return "fatal";
    case KafkaErrorKind::kOther: return "other";
  }
  return "unknown";
}

Status ValidateMetricsListenAddress(std::string_view address) {
  if (address.empty()) return Status::Ok();
  if (address.front() == '[') {
    // Debian 12's civetweb (under prometheus-cpp) is built without IPv6.
    return BadAddress(address, "IPv6 is not supported by the HTTP server library");
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return BadAddress(address, "missing \":port\"");
  const std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(std::string(port)) > 65535) {
    return BadAddress(address, "port must be a number in [0, 65535]");
  }
  in_addr parsed{};
  if (inet_pton(AF_INET, std::string(host).c_str(), &parsed) != 1) {
    return BadAddress(address, "host is not a numeric IPv4 address");
  }
  return Status::Ok();
}

// ---- Handles ---------------------------------------------------------------------

// Handles of metrics that are not exported (MetricsOptions) hold nullptr.
void CounterHandle::Increment(double amount) const {
  if (counter_ != nullptr) counter_->Increment(amount);
}
double CounterHandle::Value() const { return counter_ != nullptr ? counter_->Value() : 0; }

void GaugeHandle::Set(double value) const {
  if (gauge_ != nullptr) gauge_->Set(value);
}
void GaugeHandle::Increment(double amount) const {
  if (gauge_ != nullptr) gauge_->Increment(amount);
}
void GaugeHandle::Decrement(double amount) const {
  if (gauge_ != nullptr) gauge_->Decrement(amount);
}
double GaugeHandle::Value() const { return gauge_ != nullptr ? gauge_->Value() : 0; }

void HistogramHandle::Observe(double value) const {
  if (histogram_ != nullptr) histogram_->Observe(value);
}

// ---- Metrics ---------------------------------------------------------------------

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>(
          prometheus::Registry::InsertBehavior::Throw)) {}

Metrics::~Metrics() = default;

std::span<const MetricDescriptor> Metrics::Descriptors() { return kDescriptors; }

StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsOptions& options) {
  VIPSD_RETURN_IF_ERROR(ValidateMetricsListenAddress(options.listen_address));
  if (options.version.empty()) {
    return InvalidArgumentError("metrics: build version (label of vipsd_build_info) is empty");
  }
  if (options.model_type.empty()) {
    return InvalidArgumentError("metrics: model type (label of vipsd_build_info) is empty");
  }
  for (const std::string& topic : options.input_topics) {
    if (topic.empty()) return InvalidArgumentError("metrics: an input topic name is empty");
  }
  std::unique_ptr<Metrics> metrics(new Metrics());
  metrics->process_ = std::make_shared<ProcessCollector>(options.expose_step_timing);
  prometheus::Registry& registry = *metrics->registry_;
  Metrics& m = *metrics;

  // Registration throws only for a malformed or duplicate table row: a bug.
  try {
#define VIPSD_REGISTER_INFO_(id, help)                                                  \
  m.id##_ = &prometheus::BuildGauge()                                                   \
                 .Name("vipsd_" #id)                                                    \
                 .Help(help)                                                            \
                 .Register(registry)                                                    \
                 .Add({{"version", options.version}, {"model_type", options.model_type}}); \
  m.id##_->Set(1);
#define VIPSD_REGISTER_COUNTER_(id, unit, help) \
  m.id##_ = &prometheus::BuildCounter().Name("vipsd_" #id).Help(help).Register(registry).Add({});
#define VIPSD_REGISTER_GAUGE_(id, unit, help)                                                  \
  if (Exported(#id, options)) {                                                                 \
    m.id##_ = &prometheus::BuildGauge().Name("vipsd_" #id).Help(help).Register(registry).Add({}); \
  }
#define VIPSD_REGISTER_HISTOGRAM_(id, unit, help, buckets)                                  \
  if (Exported(#id, options)) {                                                             \
    m.id##_ = &prometheus::BuildHistogram()                                                 \
                   .Name("vipsd_" #id)                                                      \
                   .Help(help)                                                              \
                   .Register(registry)                                                      \
                   .Add({}, prometheus::Histogram::BucketBoundaries(buckets.begin(),       \
                                                                    buckets.end()));       \
  }
#define VIPSD_REGISTER_COUNTER_BY_(id, unit, help, label, Enum)                               \
  {                                                                                           \
    auto& family = prometheus::BuildCounter().Name("vipsd_" #id).Help(help).Register(registry); \
    for (size_t i = 0; i < m.id##_.size(); ++i) {                                             \
      if (!LabelApplies<Enum>(i, options)) continue;                                          \
      m.id##_[i] = &family.Add({{label, LabelText<Enum>(i)}});                                \
    }                                                                                         \
  }
#define VIPSD_REGISTER_GAUGE_BY_(id, unit, help, label, Enum)                                \
  {                                                                                         \
    auto& family = prometheus::BuildGauge().Name("vipsd_" #id).Help(help).Register(registry); \
    for (size_t i = 0; i < m.id##_.size(); ++i) {                                           \
      m.id##_[i] = &family.Add({{label, LabelText<Enum>(i)}});                              \
    }                                                                                       \
  }
#define VIPSD_REGISTER_COUNTER_PER_(id, unit, help, label) \
  m.id##_ = &prometheus::BuildCounter().Name("vipsd_" #id).Help(help).Register(registry);

    VIPSD_METRICS_TABLE(VIPSD_REGISTER_INFO_, VIPSD_REGISTER_COUNTER_, VIPSD_REGISTER_GAUGE_,
                        VIPSD_REGISTER_HISTOGRAM_, VIPSD_REGISTER_COUNTER_BY_,
                        VIPSD_REGISTER_GAUGE_BY_, VIPSD_REGISTER_COUNTER_PER_)
    for (const std::string& topic : options.input_topics) {
      m.records_consumed_total(topic);
      m.records_lost_total(topic);
    }
    for (const char* who : {"local", "remote"}) m.work_partials_merged_total(who);
  } catch (const std::exception& e) {
    return InternalError(std::string("metrics: registering the metric table failed: ") +
                         e.what());
  }

  const double now = UnixNowSeconds();
  m.start_time_seconds().Set(now);
  // The configuration the daemon starts with has just loaded successfully.
  m.config_last_reload_successful().Set(1);
  m.config_last_reload_success_timestamp_seconds().Set(now);

  if (!options.listen_address.empty()) {
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(options.listen_address,
                                                                /*num_threads=*/2);
    } catch (const std::exception& e) {
      return UnavailableError("metrics endpoint: cannot listen on " + options.listen_address +
                              " (address in use, or not an address of this host): " +
                              e.what());
    }
    metrics->exposer_->RegisterCollectable(metrics->registry_);
    metrics->exposer_->RegisterCollectable(metrics->process_);
    const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
    if (ports.empty()) {
      return InternalError("metrics endpoint on " + options.listen_address +
                           " reports no listening port");
    }
    metrics->port_ = ports.front();
  }
  return metrics;
}

#define VIPSD_DEFINE_NOTHING_(...)
#define VIPSD_DEFINE_COUNTER_PER_(id, unit, help, label)                              \
  CounterHandle Metrics::id(std::string_view label_value) const {                     \
    return CounterHandle(&id##_->Add({{label, std::string(label_value)}}));           \
  }
VIPSD_METRICS_TABLE(VIPSD_DEFINE_NOTHING_, VIPSD_DEFINE_NOTHING_, VIPSD_DEFINE_NOTHING_,
                    VIPSD_DEFINE_NOTHING_, VIPSD_DEFINE_NOTHING_, VIPSD_DEFINE_NOTHING_,
                    VIPSD_DEFINE_COUNTER_PER_)

std::string Metrics::SerializeText() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& family : process_->Collect()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::SetPrivacyBudget(double epsilon_spent, double epsilon_ceiling,
                               double delta) const {
  privacy_epsilon_spent().Set(epsilon_spent);
  privacy_epsilon_ceiling().Set(epsilon_ceiling);
  privacy_epsilon_remaining().Set(std::max(0.0, epsilon_ceiling - epsilon_spent));
  privacy_delta().Set(delta);
}

void Metrics::SetAccountingMode(AccountingMode mode) const {
  for (size_t i = 0; i < MetricLabelValues<AccountingMode>::kCount; ++i) {
    const auto candidate = static_cast<AccountingMode>(i);
    privacy_accounting_mode(candidate).Set(candidate == mode ? 1 : 0);
  }
}

void Metrics::SetPrivacyUnit(config::PrivacyUnit unit, int64_t max_records_per_unit) const {
  for (size_t i = 0; i < MetricLabelValues<config::PrivacyUnit>::kCount; ++i) {
    const auto candidate = static_cast<config::PrivacyUnit>(i);
    privacy_unit(candidate).Set(candidate == unit ? 1 : 0);
  }
  privacy_max_records_per_unit().Set(static_cast<double>(max_records_per_unit));
}

void Metrics::RecordReload(ReloadResult result, double unix_seconds) const {
  config_reloads_total(result).Increment();
  config_last_reload_successful().Set(result == ReloadResult::kSuccess ? 1 : 0);
  if (result == ReloadResult::kSuccess) {
    config_last_reload_success_timestamp_seconds().Set(unix_seconds);
  }
}

}  // namespace vipsd::daemon
