#include "daemon/parts/publisher.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/base/format.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";

}  // namespace

Publisher::Publisher(OutputSink* sink, Metrics* metrics, RunControl* control, bool paced,
                     std::function<void(const release::Release&)> after_release)
    : sink_(sink),
      metrics_(metrics),
      control_(control),
      paced_(paced),
      after_release_(std::move(after_release)) {}

bool Publisher::WaitForDeadline(const SlotOutputs& out) {
  if (out.deadline <= 0) return true;
  return control_->SleepUntil(out.deadline);
}

void Publisher::CountOverrun(int64_t late_slot, int64_t at_slot) {
  metrics_->release_deadline_overruns_total().Increment();
  ++overruns_unreported_;
  if (WallNow() - last_overrun_log_ >= 10) {
    Log(LogLevel::kWarning, kComponent,
        std::to_string(overruns_unreported_) + " slot(s) up to slot " +
            std::to_string(late_slot) +
            " finished after their release deadline (slot time + release_delay_seconds; at "
            "start-up the consumer group join delays the first slots); their outputs and "
            "ledger commits waited for a later slot's deadline (slot " +
            std::to_string(at_slot) +
            " for the last), so only this line, vipsd_release_deadline_overruns_total and "
            "the release's slot reveal the overruns, not how long a step took. If it "
            "persists, raise schedule.release_delay_seconds up to "
            "schedule.interval_seconds, then the interval (steps run one after another: "
            "none gets more than one interval)");
    last_overrun_log_ = WallNow();
    overruns_unreported_ = 0;
  }
}

std::string Publisher::ReportStep(const SlotOutputs& out, const ReportContext& context) {
  for (const auto& [level, line] : out.log_lines) Log(level, kComponent, line);
  if (!out.stepped) return "";
  metrics_->steps_total().Increment();
  metrics_->step().Set(static_cast<double>(out.step));
  metrics_->step_size_rho().Set(out.rho);
  if (context.expose_step_timing) {
    metrics_->step_duration_seconds().Observe(out.step_seconds);
    metrics_->last_step_timestamp_seconds().Set(WallNow());
  }
  if (out.partials_local > 0) {
    metrics_->work_partials_merged_total("local")
        .Increment(static_cast<double>(out.partials_local));
  }
  if (out.partials_remote > 0) {
    metrics_->work_partials_merged_total("remote")
        .Increment(static_cast<double>(out.partials_remote));
  }
  std::string line = "step=" + std::to_string(out.step) + " slot=" + std::to_string(out.slot) +
                     " rho=" + FixedDecimal(out.rho, 4);
  if (!context.epsilon.empty()) line += " epsilon=" + context.epsilon;
  line += " window=" + std::to_string(out.window_offsets >= 0 ? out.window_offsets
                                      : out.pool_records >= 0 ? out.pool_records
                                                              : context.pool_size);
  if (context.coordinator) {
    line += " partials=" + std::to_string(out.partials_local) + "+" +
            std::to_string(out.partials_remote);
  }
  if (context.expose_step_timing && !out.phases.empty()) {
    // How long each phase took (issue 30's per-phase measurement), only
    // where step durations are exposed anyway.
    std::string phases;
    for (const auto& [name, seconds] : out.phases) {
      phases += (phases.empty() ? "" : ",") + std::string(name) + ":" +
                FixedDecimal(seconds * 1000, 1);
    }
    if (out.ledger_committed) {
      phases += ",commit:" + FixedDecimal(out.ledger_commit_seconds * 1000, 1);
    }
    line += " phase_ms=" + phases;
  }
  return line;
}

Status Publisher::PublishModel(int64_t step, double publish_time,
                               const std::function<StatusOr<release::Release>()>& build,
                               const Status& owner) {
  if (!unconfirmed_.has_value() || unconfirmed_->step != step) {
    unconfirmed_.reset();
    VIPSD_ASSIGN_OR_RETURN(release::Release out, build());
    VIPSD_ASSIGN_OR_RETURN(release::EncodedRelease encoded, release::EncodeRelease(out));
    unconfirmed_ = UnconfirmedRelease{step, publish_time, std::move(out), std::move(encoded)};
  }
  const release::Release& out = unconfirmed_->release;
  const release::EncodedRelease& encoded = unconfirmed_->encoded;
  publish_time = unconfirmed_->publish_time;
  size_t bytes = 0;
  for (const auto& file : encoded.files) bytes += file.bytes.size();
  // A ledger topic that cannot be read now (owner not confirmed) is retried
  // like a failed publish.
  const auto start = std::chrono::steady_clock::now();
  const Status published = owner.ok() ? sink_->PublishRelease(out, encoded, publish_time) : owner;
  if (!published.ok()) {
    metrics_->releases_failed_total().Increment();
    if (owner.ok()) metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
    owed_ = true;
    metrics_->release_pending().Set(1);
    retry_at_ = WallNow() + retry_backoff_;
    retry_backoff_ = std::min(retry_backoff_ * 2, 60.0);
    return published;
  }
  metrics_->release_publish_duration_seconds().Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  metrics_->releases_published_total().Increment();
  metrics_->last_release_step().Set(static_cast<double>(step));
  metrics_->last_release_timestamp_seconds().Set(WallNow());
  metrics_->release_bytes().Set(static_cast<double>(bytes));
  published_step_ = step;
  published_time_ = publish_time;
  owed_ = false;
  retry_backoff_ = 1;
  metrics_->release_pending().Set(0);
  if (after_release_) after_release_(out);
  unconfirmed_.reset();
  return Status::Ok();
}

void Publisher::Owe() {
  owed_ = true;
  retry_at_ = 0;
}

void Publisher::WithholdOnStop(const SlotOutputs& out) {
  // Stopping before the deadline: publishing now would reveal when the step
  // finished. The ledger is committed; the next release includes the step.
  if (out.publish) {
    Log(LogLevel::kInfo, kComponent,
        "stopping before the release deadline of step " + std::to_string(out.step) +
            "; its release is withheld (the next release includes it)");
    owed_ = false;
  }
  for (const auto& [level, line] : out.log_lines) Log(level, kComponent, line);
}

void Publisher::PublishAlert(const std::string& json, bool alert_topic_configured) {
  if (paced_ && !alert_topic_configured) return;
  const Status published = sink_->PublishAlert(json);
  if (published.ok()) {
    metrics_->alerts_published_total().Increment();
  } else {
    metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
    Log(LogLevel::kWarning, kComponent, "alert publish failed: " + published.ToString());
  }
}

void Publisher::WriteStatus(const StatusFacts& facts) const {
  WriteStatusFile(facts, published_step_, published_time_);
}

void WriteStatusFile(const StatusFacts& facts, int64_t published_step, double published_time) {
  const config::VipsdConfig& config = *facts.config;
  const bool is_private = config.is_private();
  std::string json = "{\"schema_version\": 1, \"pid\": " + std::to_string(getpid()) +
                     ", \"config\": " + JsonString(config.file) +
                     ", \"private\": " + (is_private ? "true" : "false") +
                     ", \"delta\": " + ShortestNumber(config.driver.delta) +
                     ", \"epsilon_ceiling\": " + ShortestNumber(config.driver.epsilon_ceiling) +
                     ", \"halted\": " + (facts.halted ? "true" : "false") +
                     ", \"ledger_failing\": " + (facts.ledger_failing ? "true" : "false") +
                     ", \"last_slot\": " + std::to_string(facts.last_slot) +
                     ", \"last_release_step\": " +
                     std::to_string(std::max<int64_t>(published_step, 0)) +
                     ", \"last_release_time\": " + ShortestNumber(published_time);
  switch (config.federation.role) {
    case config::FederationRole::kNone: json += ", \"role\": \"single\""; break;
    case config::FederationRole::kAggregator: json += ", \"role\": \"aggregator\""; break;
    case config::FederationRole::kHolder:
      json += ", \"role\": \"holder\", \"holder_id\": " + JsonString(config.federation.holder_id) +
              ", \"holder_stopped\": " + JsonString(facts.holder_stopped) +
              ", \"rounds_shared\": " + std::to_string(facts.holder_shares) +
              ", \"rounds_declined\": " + std::to_string(facts.holder_declined) +
              ", \"rounds_withheld\": " + std::to_string(facts.holder_withheld);
      break;
  }
  json += "}\n";
  // Informational (the ledger is the record): renamed into place, not
  // fsync'd, so that the slot path pays no extra disk flush.
  const std::string path = config.state_directory + "/status.json";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << json;
    if (!out) return;
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
}

}  // namespace vipsd::daemon
