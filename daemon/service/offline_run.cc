#include "daemon/service/offline_run.h"

#include <chrono>

#include "core/base/log.h"
#include "daemon/io/file_io.h"
#include "daemon/io/metrics.h"

namespace vipsd::daemon {

StatusOr<OfflineRunSummary> RunOffline(const config::VipsdConfig& config, DaemonOptions options,
                                       DaemonHooks hooks) {
  MetricsOptions metrics_options;
  metrics_options.listen_address = "";  // a file run serves no endpoint
  metrics_options.version = "offline";
  metrics_options.model_type = config.model_type;
  metrics_options.expose_step_timing = config.expose_step_timing;
  metrics_options.per_unit = config.privacy_unit != config::PrivacyUnit::kRecord;
  VIPSD_ASSIGN_OR_RETURN(auto metrics, Metrics::Create(metrics_options));
  VIPSD_ASSIGN_OR_RETURN(auto output, NewFileOutput(config));
  int64_t releases = 0;
  auto after_release = hooks.after_release;
  hooks.after_release = [&releases, after_release](const release::Release& release) {
    ++releases;
    if (after_release) after_release(release);
  };
  VIPSD_ASSIGN_OR_RETURN(
      auto daemon,
      Daemon::Create(
          config, [&config](ResumeOffsetFn) { return NewFileInput(config); }, std::move(output),
          metrics.get(), std::move(hooks), options));
  OfflineRunSummary summary;
  const auto start = std::chrono::steady_clock::now();
  const Status run = daemon->Run();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const DaemonStatus status = daemon->status();
  summary.steps_run = status.steps_run;
  summary.first_step = status.next_step - status.steps_run;
  summary.releases_written = releases;
  summary.stopped_at_ceiling = status.halted;
  summary.epsilon_spent = status.epsilon_spent;
  summary.records_pooled = status.records_pooled;
  summary.records_rejected = status.records_rejected;
  if (!run.ok()) return run;
  Log(LogLevel::kInfo, "offline",
      "run finished: steps=" + std::to_string(summary.steps_run) +
          " releases=" + std::to_string(summary.releases_written) +
          " records=" + std::to_string(summary.records_pooled) +
          " rejected=" + std::to_string(summary.records_rejected) +
          (config.is_private() ? " epsilon_spent=" + std::to_string(summary.epsilon_spent) : "") +
          (summary.stopped_at_ceiling ? " stopped_at_ceiling=true" : ""));
  return summary;
}

}  // namespace vipsd::daemon
