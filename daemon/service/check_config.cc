#include "daemon/service/check_config.h"

#include <iostream>
#include <string>
#include <utility>

#include "config/where.h"
#include "core/base/format.h"
#include "core/privacy/accounting/planner.h"
#include "daemon/io/kafka_io.h"
#include "daemon/setup/startup_check.h"
#include "daemon/setup/step_calibration.h"

namespace vipsd::daemon {

void SayCheck(const config::VipsdConfig& config, LogLevel level, const std::string& text) {
  if (config.log_format == LogFormat::kJson) {
    Log(level, "main", text);
  } else {
    std::cerr << "vipsd: " << text << "\n";
  }
}

void SayConfigWarnings(config::VipsdConfig* config) {
  if (config->source_type == config::SourceType::kKafka) {
    for (std::string& warning : KafkaClientWarnings(*config)) {
      config->warnings.push_back(std::move(warning));
    }
  }
  for (const std::string& warning : config->warnings) {
    SayCheck(*config, LogLevel::kWarning, warning);
  }
}

std::string UntimedStartWarning() {
  return "--no-step-time-check: the worst-case step was not timed against the slot, so the "
         "chance of an overrun (beta in (epsilon, delta + beta)) is not bounded; each overrun "
         "shows on the release topic (SECURITY.md \"Overruns\")";
}

bool TimeWorstCaseStep(const config::VipsdConfig& config, bool check_only,
                       std::string* fits_line) {
  auto timing = CalibrateWorstCaseStep(config);
  if (!timing.ok()) {
    if (!check_only) return true;  // the start itself says what is wrong
    SayCheck(config, LogLevel::kError,
             "timing a worst-case step: " + std::string(timing.status().message()));
    return false;
  }
  const std::string where = config::KeyWhere(config, timing->budget_key);
  if (timing->refused) {
    SayCheck(config, LogLevel::kError, where + timing->text);
    return false;
  }
  // What a step's timing adds to δ (core/privacy/accounting/planner.h OverrunBeta):
  // bounded only when the worst-case step fits its slot with margin (a run
  // whose claim needs it was refused above without it).
  std::string beta =
      "; overruns: beta is NOT bounded on this machine (the worst-case step does not fit with "
      "margin): the claim holds only for runs without an overrun";
  if (timing->fits) {
    beta = "; overruns: beta = " + ShortestNumber(privacy::kBatchTailProbability) +
           " per step (the chance of a batch above the one timed)";
    if (!check_only) {
      // A start says where to read the total: the planner's search for the
      // steps to a large ceiling takes seconds.
      beta += "; `vipsd --check-config` and `vipsd-privacy plan` give beta x steps and delta + "
              "beta for this file";
    } else if (auto planned = privacy::PlanRun(
                   config.schedule.value_or(config::Schedule::kFixed) == config::Schedule::kFixed,
                   config.accounting == config::Accounting::kResidency,
                   config.driver.epsilon_ceiling, config.driver.mechanism.sampling_rate,
                   config.driver.mechanism.noise_multiplier, config.driver.delta,
                   config.window_steps);
               planned.ok()) {
      // The steps a record's claim covers, as `vipsd-privacy plan` counts them.
      beta += " x " + std::to_string(planned->timed_steps) + " steps = " +
              SignificantDigits(planned->overrun_beta, 6) +
              ", so the claim is (epsilon, delta + beta) with delta + beta = " +
              SignificantDigits(config.driver.delta + planned->overrun_beta, 6);
    }
  }
  if (!timing->fits || timing->busy) {
    SayCheck(config, LogLevel::kWarning, where + "warning: " + timing->text + beta);
  } else {
    *fits_line = timing->text + beta;
  }
  return true;
}

int CheckConfigCommand(const config::VipsdConfig& config, const std::string& path,
                       const DaemonOptions& options, bool step_time_check) {
  // Everything a start checks that needs neither the network nor a write:
  // model and vocabulary, metrics address, state directory, ledger and
  // checkpoint against this file, the privacy start-up checks, and the
  // librdkafka client configurations.
  Status checked = CheckStartUp(config, options);
  if (checked.ok() && config.source_type == config::SourceType::kKafka) {
    checked = CheckKafkaClients(config);
  }
  if (!checked.ok()) {
    SayCheck(config, LogLevel::kError, std::string(checked.message()));
    return 2;
  }
  std::string timing;
  if (config.source_type == config::SourceType::kKafka) {
    // As a start with the same flags would: timed unless
    // --no-step-time-check, which is said.
    if (!step_time_check) {
      SayCheck(config, LogLevel::kWarning, UntimedStartWarning());
    } else if (!TimeWorstCaseStep(config, /*check_only=*/true, &timing)) {
      return 2;
    }
  }
  std::cout << "vipsd: " << path << " is valid\n";
  const config::CapacityMargin margin = config::CapacityMarginOf(config);
  if (margin.applies) std::cout << "vipsd: " << margin.text << "\n";
  if (!timing.empty()) std::cout << "vipsd: " << timing << "\n";
  return 0;
}

}  // namespace vipsd::daemon
