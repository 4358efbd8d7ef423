// Prometheus metrics of the vipsd daemon: every metric declared once, in the
// table VIPSD_METRICS_TABLE below, with its name, type, unit and help text.
//
// What it is: `Metrics` owns a prometheus-cpp registry holding every metric
// of the table and, unless the listen address is empty, an HTTP endpoint
// serving it at /metrics in the Prometheus text format. Each metric has a
// typed, named accessor (`steps_total()`, `records_rejected_total(reason)`)
// returning a small handle; handles are resolved once in Create(), so the hot
// path never looks a metric up by name. docs/metrics.md documents the table
// for operators; a test checks that every entry appears there and in the
// exposition with HELP and TYPE.
//
// PRIVACY RULE — nothing derived from private records may become a metric.
// Forbidden: the realised Poisson batch size, clip counts or clipped
// fractions, per-record norms, training loss/ELBO/perplexity, anything about
// record contents. Allowed: public configuration (σ, q, ceiling, capacity),
// the accountant's (ε, δ) (a function of public parameters only), step and
// release counters, sizes that depend only on model dimensions, and stream
// volume (records consumed, rejected by reason, evicted, pool occupancy and
// consumer lag), which the threat model treats as public. Timing metrics
// (step duration) are a side channel the DP guarantee does not cover; see
// docs/metrics.md. A test rejects any metric whose name suggests batch, clip
// or loss; reviewers must reject new table rows that break the rule.
//
// Naming (enforced at compile time where possible): `vipsd_` prefix, base
// units (seconds, bytes), `_total` on counters and only on counters,
// `*_timestamp_seconds` gauges for points in time, low-cardinality labels
// (fixed enums; the only open label is the input topic, bounded by config).
//
// The endpoint also serves the standard process_* metrics (open and
// maximum file descriptors, start time; CPU seconds and resident and virtual
// memory only with expose_step_timing, since they follow each step's work —
// a timing-like side channel; read from /proc/self at each scrape) and prometheus-cpp's own
// exposer_* metrics (bytes transferred, scrapes, request latency), which
// carry nothing of ours; docs/metrics.md lists them.
//
// Ownership: Metrics owns the registry and the endpoint; handles and label
// children it returns stay valid while the Metrics object lives. Destroying
// it stops the endpoint; once it has served a request, civetweb's listener
// takes up to 2 s to notice.
// Thread-safety: after Create() returns, every accessor, handle operation,
// SerializeText() and scrapes by the endpoint may run concurrently
// (prometheus-cpp metrics are atomic; label families lock internally).
// Failure: Create() returns INVALID_ARGUMENT for a malformed option and
// UNAVAILABLE when the address cannot be bound (message names the address);
// no exception escapes this module.
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"  // PrivacyUnit, PrivacyUnitName
#include "connectors/decode/json_document.h"
#include "core/base/status.h"
#include "daemon/state/ledger.h"  // AccountingMode, AccountingModeName

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Collectable;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace vipsd::daemon {

// ---- Label value sets (fixed, low cardinality) ------------------------------

// Why a slot passed without a step.
enum class SkipReason {
  kWindowOverflow,  // the slot's window held more records than pool.capacity
  kCeiling,         // the step would have crossed the epsilon ceiling
  kError,           // an earlier failure (ledger commit, window invariant) stopped stepping
  kMissed,          // the slot's time passed while vipsd was not running
  kOverrun,         // the slot after an overrun, or stepping stopped by one (daemon.h)
};
enum class ReloadResult { kSuccess, kFailure };
// What became of a federated round, as one process saw it (daemon/step/holder.h,
// daemon/step/aggregator.cc).
enum class RoundOutcome {
  kShare,      // holder: its share left at its share time
  kDeclined,   // holder: it declined (a public reason, or its stop for the run)
  kWithheld,   // holder: charged, its share not ready at its share time, never sent
  kAbandoned,  // aggregator: the round released nothing (a share missing or declined)
};
// Why a rejected record was not (again) published to the dead-letter topic.
enum class DeadLetterSkip {
  kDeliveredBefore,  // re-read below the group's committed offset: dead-lettered already
  kUndeliverable,    // the dead letter can never be delivered (e.g. the topic's size limit)
};
// Kafka client errors, coarsely classified by the connector.
enum class KafkaErrorKind {
  kTransport,  // broker connection, name resolution, all brokers down
  kConsume,    // fetch/consume errors reported on the consumer
  kProduce,    // delivery reports with an error (releases, dead letters, alerts)
  kCommit,     // offset commit failures
  kFatal,      // fatal client errors (e.g. idempotent producer); needs restart
  kOther,      // anything the connector does not classify above
};

std::string_view SkipReasonName(SkipReason reason);             // "window_overflow", ...
std::string_view ReloadResultName(ReloadResult result);        // "success", "failure"
std::string_view DeadLetterSkipName(DeadLetterSkip skip);      // "delivered_before", ...
std::string_view KafkaErrorKindName(KafkaErrorKind kind);      // "transport", ...
std::string_view RoundOutcomeName(RoundOutcome outcome);        // "share", ...

// Number of values and label text of each enum used as a label.
template <typename Enum>
struct MetricLabelValues;
template <>
struct MetricLabelValues<AccountingMode> {
  static constexpr size_t kCount = 2;
  static std::string_view Name(AccountingMode v) { return AccountingModeName(v); }
};
template <>
struct MetricLabelValues<config::PrivacyUnit> {
  static constexpr size_t kCount = 3;
  static std::string_view Name(config::PrivacyUnit v) { return config::PrivacyUnitName(v); }
};
template <>
struct MetricLabelValues<SkipReason> {
  static constexpr size_t kCount = 5;
  static std::string_view Name(SkipReason v) { return SkipReasonName(v); }
};
template <>
struct MetricLabelValues<RoundOutcome> {
  static constexpr size_t kCount = 4;
  static std::string_view Name(RoundOutcome v) { return RoundOutcomeName(v); }
};
template <>
struct MetricLabelValues<ReloadResult> {
  static constexpr size_t kCount = 2;
  static std::string_view Name(ReloadResult v) { return ReloadResultName(v); }
};
template <>
struct MetricLabelValues<DeadLetterSkip> {
  static constexpr size_t kCount = 2;
  static std::string_view Name(DeadLetterSkip v) { return DeadLetterSkipName(v); }
};
template <>
struct MetricLabelValues<KafkaErrorKind> {
  static constexpr size_t kCount = 6;
  static std::string_view Name(KafkaErrorKind v) { return KafkaErrorKindName(v); }
};
template <>
struct MetricLabelValues<connectors::RejectReason> {
  static constexpr size_t kCount = connectors::kNumRejectReasons;
  static std::string_view Name(connectors::RejectReason v) {
    return connectors::RejectReasonName(v);
  }
};

// ---- Histogram buckets (seconds) --------------------------------------------

// A step: 1 ms (tiny pool) … 60 s (large LDA batch on few cores).
inline constexpr std::array<double, 15> kStepDurationBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
// Publishing a release until its delivery is confirmed.
inline constexpr std::array<double, 14> kReleasePublishDurationBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
// One ledger commit: write, fsync, rename, directory fsync.
inline constexpr std::array<double, 15> kLedgerCommitDurationBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
// One checkpoint: the model arrays (tens of MB for a large LDA), written,
// fsynced and renamed.
inline constexpr std::array<double, 14> kCheckpointWriteDurationBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

// ---- The table ---------------------------------------------------------------
//
// Each row names the metric `vipsd_<id>` and generates the accessor `<id>()`.
//   INFO(id, help)                                  gauge = 1, labels version, model_type
//   COUNTER(id, unit, help)                         counter, no labels
//   GAUGE(id, unit, help)                           gauge, no labels
//   HISTOGRAM(id, unit, help, buckets)              histogram, no labels
//   COUNTER_BY(id, unit, help, label, Enum)         one series per Enum value, created at 0
//   GAUGE_BY(id, unit, help, label, Enum)           one series per Enum value, created at 0
//   COUNTER_PER(id, unit, help, label)              series added on first use of a label value
#define VIPSD_METRICS_TABLE(INFO, COUNTER, GAUGE, HISTOGRAM, COUNTER_BY, GAUGE_BY, COUNTER_PER)   \
  INFO(build_info,                                                                               \
       "Always 1; the labels carry the vipsd version and the configured model type.")            \
  GAUGE(start_time_seconds, "seconds", "Unix time at which the process started.")                \
  /* Privacy budget (functions of public parameters only) */                                     \
  GAUGE(privacy_epsilon_spent, "epsilon",                                                        \
        "Privacy loss epsilon spent so far at delta = vipsd_privacy_delta, under the active "    \
        "accounting mode; never reset by a restart or a reload.")                                \
  GAUGE(privacy_epsilon_ceiling, "epsilon",                                                      \
        "Configured epsilon ceiling; a step that would cross it does not run.")                  \
  GAUGE(privacy_epsilon_remaining, "epsilon",                                                    \
        "Epsilon ceiling minus epsilon spent, floored at 0.")                                    \
  GAUGE(privacy_delta, "", "Delta at which epsilon is reported.")                                \
  GAUGE(privacy_budget_warning_level, "ratio",                                                   \
        "Highest configured warning fraction of the ceiling that epsilon spent has crossed "     \
        "(0 if none).")                                                                          \
  GAUGE(privacy_halted, "",                                                                      \
        "1 when updates stopped because the next step would cross the epsilon ceiling, else 0.") \
  GAUGE_BY(privacy_accounting_mode, "",                                                          \
           "1 for the active privacy accounting mode, 0 for the other.", "mode", AccountingMode) \
  GAUGE_BY(privacy_unit, "",                                                                     \
           "1 for what epsilon protects (record: one record; key: every record of one Kafka "    \
           "message key; field: every record with one value of privacy.unit_field), 0 for the "  \
           "others.",                                                                            \
           "unit", config::PrivacyUnit)                                                          \
  GAUGE(privacy_max_records_per_unit, "records",                                                 \
        "Records of one unit a step may use (privacy.max_records_per_unit); 0 when the unit is " \
        "one record.")                                                                           \
  GAUGE(noise_multiplier, "",                                                                    \
        "Configured noise multiplier sigma: Gaussian noise standard deviation per unit of L2 "   \
        "clip bound.")                                                                           \
  GAUGE(sampling_rate, "ratio",                                                                  \
        "Configured Poisson sampling probability q of each pooled record at each step.")         \
  /* Steps */                                                                                    \
  COUNTER(steps_total, "steps",                                                                  \
          "Private steps run, each charged to the accountant (empty batches included).")         \
  COUNTER(steps_refused_total, "steps",                                                          \
          "Steps not run because they would have crossed the epsilon ceiling.")                  \
  GAUGE(step, "", "Step counter t of the last step run; persists across restarts.")              \
  GAUGE(step_size_rho, "", "Step size rho_t = (tau0 + t)^-kappa of the last step.")              \
  GAUGE(step_interval_seconds, "seconds",                                                        \
        "Configured time between slots: slot k is due at a public time t_k.")                    \
  GAUGE(slot, "", "Last slot processed (stepped or skipped); persists across restarts.")         \
  GAUGE(last_slot_timestamp_seconds, "seconds",                                                  \
        "Public due time of the last slot processed (its slot time, not when its step "         \
        "finished); 0 before the first.")                                                        \
  COUNTER_BY(slots_skipped_total, "slots", "Slots that passed without a step, by reason.",       \
             "reason", SkipReason)                                                               \
  COUNTER(release_deadline_overruns_total, "slots",                                              \
          "Slots whose step finished after the public release deadline (slot time + "           \
          "release_delay_seconds); their outputs left at a later slot's deadline; each one "    \
          "reveals that its step ran past its deadline.")                                       \
  COUNTER(slot_ends_read_late_total, "slots",                                                    \
          "Slots whose log ends were read after the next slot's time less the grace, so that "  \
          "they did not bound the next slot's cuts from below (a slow broker or clock thread).") \
  /* Federated mode */                                                                           \
  COUNTER_BY(federation_rounds_total, "rounds",                                                  \
             "Federated rounds by outcome: a holder's shares sent, declines, and rounds charged " \
             "whose share was not ready at its share time (withheld); the aggregator's abandoned " \
             "rounds.",                                                                           \
             "result", RoundOutcome)                                                            \
  GAUGE(federation_holder_stopped, "",                                                           \
        "1 when this federated holder stopped taking part for the rest of the run after a "     \
        "data-dependent failure (a window over pool.capacity, input not read in time, a share "  \
        "not ready in time), else 0.")                                                           \
  GAUGE(federation_last_round, "",                                                               \
        "A federated holder's last round masked (no round at or below it is answered again); "   \
        "persists across restarts.")                                                             \
  HISTOGRAM(step_duration_seconds, "seconds",                                                    \
            "Wall-clock duration of one step, sampling to M-step. Exported only with "           \
            "metrics.expose_step_timing: it reveals how long each step took.",                   \
            kStepDurationBuckets)                                                                \
  GAUGE(last_step_timestamp_seconds, "seconds",                                                  \
        "Unix time at which the last step finished. Exported only with "                         \
        "metrics.expose_step_timing.")                                                           \
  /* Records: stream volume is public; nothing per batch */                                      \
  COUNTER_PER(records_consumed_total, "records",                                                 \
              "Records read from an input topic, accepted or rejected.", "topic")                \
  COUNTER_PER(records_lost_total, "records",                                                     \
              "Offsets of an input topic that left the log (retention or deleted records) "      \
              "before they were read.", "topic")                                                 \
  COUNTER_BY(records_rejected_total, "records",                                                  \
             "Records rejected before the pool (never pooled), by reason.", "reason",            \
             connectors::RejectReason)                                                           \
  GAUGE(pool_records, "records",                                                                 \
        "Records in the last slot's window (the pool the step sampled from).")                   \
  GAUGE(pool_capacity, "records",                                                                \
        "Configured pool capacity: a window with more records stops stepping.")                  \
  GAUGE(window_overflow, "",                                                                     \
        "1 while stepping is stopped by a window over pool.capacity, else 0.")                   \
  COUNTER(pool_evicted_total, "records",                                                         \
          "Records that left the pool because the window moved past them.")                      \
  COUNTER(records_read_late_total, "records",                                                    \
          "Records that joined a later slot than their timestamp: stamped at or before a slot's " \
          "time but readable only after its cut was read (raise schedule.cut_grace_seconds).")   \
  GAUGE(consumer_lag_records, "records",                                                         \
        "Records on the assigned input partitions not yet consumed (high watermark minus "       \
        "position, summed).")                                                                    \
  /* Releases */                                                                                 \
  COUNTER(releases_published_total, "releases", "Releases whose publication was confirmed.")     \
  COUNTER(releases_failed_total, "releases",                                                     \
          "Releases that could not be published; their step's budget is spent regardless.")     \
  GAUGE(release_pending, "",                                                                     \
        "1 while a due release is undelivered and being retried with backoff, else 0.")         \
  HISTOGRAM(release_publish_duration_seconds, "seconds",                                         \
            "Time from the start of publishing a release to its confirmation.",                  \
            kReleasePublishDurationBuckets)                                                      \
  GAUGE(last_release_step, "", "Step t of the last published release.")                          \
  GAUGE(last_release_timestamp_seconds, "seconds",                                               \
        "Unix time at which the last release was confirmed (0 before the first).")               \
  GAUGE(release_bytes, "bytes",                                                                  \
        "Size of the last published release; depends only on model dimensions.")                \
  /* Durability */                                                                               \
  COUNTER(ledger_commits_total, "commits", "Durable privacy-ledger commits.")                    \
  COUNTER(ledger_commit_failures_total, "commits",                                               \
          "Failed privacy-ledger commits (no step or release until a retry succeeds).")          \
  GAUGE(ledger_failing, "",                                                                      \
        "1 while the ledger cannot be committed (stepping and releases paused, retried with "   \
        "backoff), else 0.")                                                                     \
  HISTOGRAM(ledger_commit_duration_seconds, "seconds",                                           \
            "Duration of one ledger commit (write, fsync, rename, directory fsync; with "        \
            "state.ledger_topic also the append and read-back on the topic).",                   \
            kLedgerCommitDurationBuckets)                                                        \
  GAUGE(standby, "",                                                                             \
        "1 while this process is a hot standby for its job (state.standby_takeover_seconds: "   \
        "nothing consumed, stepped or released), else 0.")                                       \
  GAUGE(ledger_owner_epoch, "",                                                                  \
        "Epoch counter under which this process owns its job on state.ledger_topic (0: no "     \
        "ledger topic, or not the owner yet).")                                                  \
  /* Shared work (state.work_topic); counted at plan times, never when a partial is done */     \
  GAUGE(worker, "",                                                                              \
        "1 while this process works for its job's coordinator (state.work_topic): it sums the "  \
        "partitions the consumer group gives it and charges or releases nothing, else 0.")       \
  COUNTER(work_partials_published_total, "partials",                                             \
          "Partial sums this worker appended to the work topic (counted when the next plan "    \
          "arrives).")                                                                           \
  COUNTER_PER(work_partials_merged_total, "partials",                                            \
              "Partial sums the coordinator merged into its steps, by who computed them "        \
              "(local: this process's own partitions, one per summing pass; remote: another "    \
              "process's, one per process and step when private, one per partition when not); "  \
              "counted at the step's deadline.",                                                 \
              "kind")                                                                            \
  COUNTER(checkpoint_writes_total, "checkpoints", "Model checkpoints written durably.")           \
  COUNTER(checkpoint_failures_total, "checkpoints", "Model checkpoint writes that failed.")      \
  HISTOGRAM(checkpoint_write_duration_seconds, "seconds",                                        \
            "Duration of one durable model checkpoint write; depends only on model dimensions "  \
            "and the disk.",                                                                     \
            kCheckpointWriteDurationBuckets)                                                     \
  /* Configuration */                                                                            \
  GAUGE(config_last_reload_successful, "",                                                       \
        "1 if the last configuration reload succeeded (or none was attempted), 0 if it failed.") \
  GAUGE(config_last_reload_success_timestamp_seconds, "seconds",                                 \
        "Unix time of the last successful configuration load (start-up or reload).")             \
  COUNTER_BY(config_reloads_total, "reloads", "Configuration reloads attempted, by result.",     \
             "result", ReloadResult)                                                             \
  /* Kafka */                                                                                    \
  COUNTER_BY(kafka_errors_total, "errors", "Kafka client errors, by kind.", "kind",              \
             KafkaErrorKind)                                                                     \
  COUNTER(dead_letters_published_total, "records",                                               \
          "Rejected records published to the dead-letter topic (reason and position only).")     \
  COUNTER_BY(dead_letters_skipped_total, "records",                                              \
             "Rejected records not published to the dead-letter topic: dead-lettered before a "  \
             "restart or rebalance (below the committed offset), or undeliverable (refused "     \
             "for good, e.g. by a size limit; the record stays in the input topic).",            \
             "cause", DeadLetterSkip)                                                            \
  COUNTER(alerts_published_total, "alerts",                                                      \
          "Operator alerts (budget warnings, halt) published to the alert topic.")

// ---- Handles -------------------------------------------------------------------

// A counter series. Cheap to copy; valid while its Metrics lives. Handles of
// metrics that are not exported (see MetricsOptions) do nothing.
class CounterHandle {
 public:
  // `amount` must be >= 0 (prometheus-cpp ignores negative increments).
  void Increment(double amount = 1.0) const;
  double Value() const;

 private:
  friend class Metrics;
  explicit CounterHandle(prometheus::Counter* counter) : counter_(counter) {}
  prometheus::Counter* counter_;
};

// A gauge series. Cheap to copy; valid while its Metrics lives.
class GaugeHandle {
 public:
  void Set(double value) const;
  void Increment(double amount = 1.0) const;
  void Decrement(double amount = 1.0) const;
  double Value() const;

 private:
  friend class Metrics;
  explicit GaugeHandle(prometheus::Gauge* gauge) : gauge_(gauge) {}
  prometheus::Gauge* gauge_;
};

// A histogram. Cheap to copy; valid while its Metrics lives.
class HistogramHandle {
 public:
  void Observe(double value) const;

 private:
  friend class Metrics;
  explicit HistogramHandle(prometheus::Histogram* histogram) : histogram_(histogram) {}
  prometheus::Histogram* histogram_;
};

// ---- Metrics ---------------------------------------------------------------------

enum class MetricType { kCounter, kGauge, kHistogram };

// One row of the table, for documentation checks and debugging.
struct MetricDescriptor {
  std::string_view name;    // full name, e.g. "vipsd_steps_total"
  MetricType type;
  std::string_view unit;    // "seconds", "records", … or "" when dimensionless
  std::string_view help;
  std::string_view labels;  // label names, comma-separated; "" for none
};

struct MetricsOptions {
  // Numeric "IPv4:port"; port 0 picks a free port (tests). Empty: no HTTP
  // endpoint, registry only (tests, --check-config).
  std::string listen_address = "127.0.0.1:9464";
  std::string version;     // build version for vipsd_build_info; non-empty
  std::string model_type;  // configured model, e.g. "lda"; non-empty
  // Input topics whose vipsd_records_consumed_total series are created at 0
  // (so that rate() works from the first scrape); others appear on first use.
  std::vector<std::string> input_topics;
  // Whether vipsd_step_duration_seconds and vipsd_last_step_timestamp_seconds
  // are exported (metrics.expose_step_timing). When false they are not
  // registered and their handles do nothing.
  bool expose_step_timing = true;
  // privacy.unit is not record: the unit's reject reasons (missing_unit,
  // bad_unit) get series too.
  bool per_unit = false;
};

// OK if `address` is "" or a numeric "IPv4:port" with port in [0, 65535];
// INVALID_ARGUMENT naming the address otherwise. Host names, port lists,
// civetweb's port suffixes (s, r) and IPv6 are refused (Debian 12 builds
// civetweb, prometheus-cpp's HTTP server, without IPv6 support).
Status ValidateMetricsListenAddress(std::string_view address);

class Metrics {
 public:
  static StatusOr<std::unique_ptr<Metrics>> Create(const MetricsOptions& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Port the endpoint listens on (the real one when 0 was asked); 0 if none.
  int port() const { return port_; }

  // The exposition in the Prometheus text format, as /metrics serves it.
  std::string SerializeText() const;

  // Every row of VIPSD_METRICS_TABLE, in table order.
  static std::span<const MetricDescriptor> Descriptors();

  // ---- Accessors, one per table row -----------------------------------------
#define VIPSD_METRICS_DECLARE_INFO_(id, help)
#define VIPSD_METRICS_DECLARE_COUNTER_(id, unit, help) \
  CounterHandle id() const { return CounterHandle(id##_); }
#define VIPSD_METRICS_DECLARE_GAUGE_(id, unit, help) \
  GaugeHandle id() const { return GaugeHandle(id##_); }
#define VIPSD_METRICS_DECLARE_HISTOGRAM_(id, unit, help, buckets) \
  HistogramHandle id() const { return HistogramHandle(id##_); }
#define VIPSD_METRICS_DECLARE_COUNTER_BY_(id, unit, help, label, Enum) \
  CounterHandle id(Enum value) const { return CounterHandle(Child(id##_, value)); }
#define VIPSD_METRICS_DECLARE_GAUGE_BY_(id, unit, help, label, Enum) \
  GaugeHandle id(Enum value) const { return GaugeHandle(Child(id##_, value)); }
  // Adds the series for `label_value` on first use (a locked map lookup):
  // resolve once per value, e.g. per topic at subscription, and keep the
  // handle; do not call per record.
#define VIPSD_METRICS_DECLARE_COUNTER_PER_(id, unit, help, label) \
  CounterHandle id(std::string_view label_value) const;

  VIPSD_METRICS_TABLE(VIPSD_METRICS_DECLARE_INFO_, VIPSD_METRICS_DECLARE_COUNTER_,
                      VIPSD_METRICS_DECLARE_GAUGE_, VIPSD_METRICS_DECLARE_HISTOGRAM_,
                      VIPSD_METRICS_DECLARE_COUNTER_BY_, VIPSD_METRICS_DECLARE_GAUGE_BY_,
                      VIPSD_METRICS_DECLARE_COUNTER_PER_)
#undef VIPSD_METRICS_DECLARE_INFO_
#undef VIPSD_METRICS_DECLARE_COUNTER_
#undef VIPSD_METRICS_DECLARE_GAUGE_
#undef VIPSD_METRICS_DECLARE_HISTOGRAM_
#undef VIPSD_METRICS_DECLARE_COUNTER_BY_
#undef VIPSD_METRICS_DECLARE_GAUGE_BY_
#undef VIPSD_METRICS_DECLARE_COUNTER_PER_

  // ---- Updates that keep related metrics consistent -------------------------

  // Sets spent, ceiling, remaining = max(0, ceiling − spent) and delta.
  void SetPrivacyBudget(double epsilon_spent, double epsilon_ceiling, double delta) const;
  // 1 for `mode`, 0 for the other mode.
  void SetAccountingMode(AccountingMode mode) const;
  // vipsd_privacy_unit and vipsd_privacy_max_records_per_unit.
  void SetPrivacyUnit(config::PrivacyUnit unit, int64_t max_records_per_unit) const;
  // Counts the reload, sets vipsd_config_last_reload_successful and, on
  // success, the success timestamp to `unix_seconds`.
  void RecordReload(ReloadResult result, double unix_seconds) const;

 private:
  Metrics();

  template <typename T, size_t N, typename Enum>
  static T* Child(const std::array<T*, N>& children, Enum value) {
    const auto index = static_cast<size_t>(value);
    assert(index < N && "label enum value out of range");
    return children[index];
  }

  std::shared_ptr<prometheus::Registry> registry_;
  // process_* metrics read from /proc/self at each scrape (CPU and memory
  // only with expose_step_timing: they follow each step's work).
  std::shared_ptr<prometheus::Collectable> process_;
  // Declared after registry_ so that it stops serving before the registry goes.
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;

#define VIPSD_METRICS_MEMBER_INFO_(id, help) prometheus::Gauge* id##_ = nullptr;
#define VIPSD_METRICS_MEMBER_COUNTER_(id, unit, help) prometheus::Counter* id##_ = nullptr;
#define VIPSD_METRICS_MEMBER_GAUGE_(id, unit, help) prometheus::Gauge* id##_ = nullptr;
#define VIPSD_METRICS_MEMBER_HISTOGRAM_(id, unit, help, buckets) \
  prometheus::Histogram* id##_ = nullptr;
#define VIPSD_METRICS_MEMBER_COUNTER_BY_(id, unit, help, label, Enum) \
  std::array<prometheus::Counter*, MetricLabelValues<Enum>::kCount> id##_{};
#define VIPSD_METRICS_MEMBER_GAUGE_BY_(id, unit, help, label, Enum) \
  std::array<prometheus::Gauge*, MetricLabelValues<Enum>::kCount> id##_{};
#define VIPSD_METRICS_MEMBER_COUNTER_PER_(id, unit, help, label) \
  prometheus::Family<prometheus::Counter>* id##_ = nullptr;

  VIPSD_METRICS_TABLE(VIPSD_METRICS_MEMBER_INFO_, VIPSD_METRICS_MEMBER_COUNTER_,
                      VIPSD_METRICS_MEMBER_GAUGE_, VIPSD_METRICS_MEMBER_HISTOGRAM_,
                      VIPSD_METRICS_MEMBER_COUNTER_BY_, VIPSD_METRICS_MEMBER_GAUGE_BY_,
                      VIPSD_METRICS_MEMBER_COUNTER_PER_)
#undef VIPSD_METRICS_MEMBER_INFO_
#undef VIPSD_METRICS_MEMBER_COUNTER_
#undef VIPSD_METRICS_MEMBER_GAUGE_
#undef VIPSD_METRICS_MEMBER_HISTOGRAM_
#undef VIPSD_METRICS_MEMBER_COUNTER_BY_
#undef VIPSD_METRICS_MEMBER_GAUGE_BY_
#undef VIPSD_METRICS_MEMBER_COUNTER_PER_
};

}  // namespace vipsd::daemon
