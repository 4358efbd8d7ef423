#include "config/checks.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/base/format.h"
#include "core/privacy/mechanisms/privacy_unit.h"

namespace vipsd::config::internal {

bool IsTopicName(const std::string& name) {
  if (name.empty() || name.size() > 249 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

void DefaultReleaseDelay(VipsdConfig& config) {
  config.release_delay_seconds = config.step_interval_seconds;
}

void DefaultStepTiming(VipsdConfig& config) { config.expose_step_timing = !config.is_private(); }

void SinkTypeOfSource(VipsdConfig& config) {
  config.sink_type = config.source_type == SourceType::kKafka ? SinkType::kKafka : SinkType::kFile;
}

void CheckNoiseSeed(Section& privacy, VipsdConfig& config) {
  if (privacy.Has("noise_seed") && config.noise_mode == NoiseMode::kSecure) {
    privacy.ErrorAt("noise_seed", "only allowed with noise: fixed_seed");
  }
}

void CheckResidencyIsPrivate(Section& privacy, VipsdConfig& config) {
  if (config.accounting == Accounting::kResidency && !config.is_private()) {
    privacy.ErrorAt("accounting",
                    "residency accounting needs noise_multiplier > 0 (a non-private run has no "
                    "budget)");
  }
}

void CheckWarnAtIncreasing(Section& privacy, VipsdConfig& config) {
  if (!std::is_sorted(config.warn_at.begin(), config.warn_at.end()) ||
      std::adjacent_find(config.warn_at.begin(), config.warn_at.end()) != config.warn_at.end()) {
    privacy.ErrorAt("warn_at", "must be strictly increasing");
  }
}

void CheckNormRule(Section& blr, VipsdConfig& config) {
  if (config.is_private() && config.blr_norm_rule == "reject") {
    blr.ErrorAt(
        "norm_rule",
        "reject is not allowed when privacy.noise_multiplier > 0: it would drop well-formed "
        "records for their content, outside the mechanism; use rescale (the default), which "
        "keeps every record and bounds ||x|| <= 1");
  }
}

// model.blr.prior_groups → blr.prior_group: group g is the g-th run of
// consecutive coefficients; the sizes must cover blr.dimension exactly.
void CheckBlrPriorGroups(Section& blr, VipsdConfig& config) {
  config.blr.prior_group.clear();
  if (config.blr_prior_groups.empty()) return;
  if (!config.public_prior_path.empty()) {
    blr.ErrorAt("prior_groups",
                "cannot be combined with model.public_prior: the public prior's precision has one "
                "scale, learned from the data; remove one of them");
    return;
  }
  double total = 0;
  for (double size : config.blr_prior_groups) total += size;
  if (total != static_cast<double>(config.blr.dim)) {
    blr.ErrorAt("prior_groups", "the group sizes sum to " + ShortestNumber(total) +
                                    "; they must sum to model.blr.dimension (" +
                                    std::to_string(config.blr.dim) + ")");
    return;
  }
  for (size_t g = 0; g < config.blr_prior_groups.size(); ++g) {
    config.blr.prior_group.insert(config.blr.prior_group.end(),
                                  static_cast<size_t>(config.blr_prior_groups[g]),
                                  static_cast<int32_t>(g));
  }
}

// A file run stops at max_steps, max_epochs or the privacy ceiling.
void CheckOfflineStop(Section& schedule, VipsdConfig& config) {
  if (config.max_epochs / config.driver.mechanism.sampling_rate > 1e12) {
    schedule.ErrorAt("max_epochs",
                     "max_epochs / privacy.sampling_rate is " +
                         ShortestNumber(config.max_epochs / config.driver.mechanism.sampling_rate) +
                         " steps; at most 1e12 steps are allowed (one epoch is 1/q steps)");
  }
  if (config.max_steps == 0 && config.max_epochs == 0 && !config.is_private()) {
    schedule.ErrorAt("max_steps",
                     "a non-private run needs max_steps or max_epochs > 0 (no privacy ceiling "
                     "stops it)");
  }
}

// The ledger key defaults to the consumer group id.
void CheckLedgerKey(Section& state, VipsdConfig& config) {
  if (config.ledger_key.empty()) {
    config.ledger_key = config.group_id;
  } else if (config.ledger_topic.empty() &&
             config.federation.role != FederationRole::kHolder) {
    state.ErrorAt("ledger_key",
                  "only allowed together with state.ledger_topic (or federation.role: holder)");
  }
}

void CheckStandby(Section& state, VipsdConfig& config) {
  if (config.standby_takeover_seconds <= 0) return;
  if (config.ledger_topic.empty()) {
    state.ErrorAt("standby_takeover_seconds", "only allowed together with state.ledger_topic");
  } else if (config.standby_takeover_seconds < 3 * config.step_interval_seconds + 5) {
    state.WarnAt("standby_takeover_seconds",
                 "below 3 * schedule.interval_seconds + 5 s: the running daemon commits once "
                 "per slot, and not at all while it starts (the consumer-group join takes 3 s "
                 "and more), so a standby may take over (and fence it) while it is healthy");
  }
}

void CheckWorkTopic(Section& state, VipsdConfig& config) {
  if (config.work_topic.empty()) return;
  if (!IsTopicName(config.work_topic)) {
    state.ErrorAt("work_topic", std::string("must be ") + kTopicRule);
  } else if (config.ledger_topic.empty() &&
             config.federation.role != FederationRole::kHolder) {
    state.ErrorAt("work_topic",
                  "only allowed together with state.ledger_topic (the process that owns the "
                  "job's ledger coordinates; with state.standby_takeover_seconds > 0 the others "
                  "work for it)");
  } else if (config.work_topic == config.ledger_topic ||
             std::find(config.source_topics.begin(), config.source_topics.end(),
                       config.work_topic) != config.source_topics.end()) {
    state.ErrorAt("work_topic", "must differ from state.ledger_topic and from the input topics");
  }
}

void CheckWorkPartitions(Section& state, VipsdConfig& config) {
  if (config.work_partitions || !config.work_topic.empty()) return;
  state.ErrorAt("work_partitions",
                "false is only allowed together with state.work_topic (a process that reads "
                "no partition needs others that do)");
}

void CheckLda(Section& lda, VipsdConfig& config) {
  if (config.is_private() && config.lda.resample_length == 0) {
    lda.ErrorAt("resample_length",
                "must be >= 1 when privacy.noise_multiplier > 0 (0 has no sensitivity bound)");
  }
}

void CheckSbn(Section& sbn, VipsdConfig& config) {
  const Status valid = models::ValidateSbnConfig(config.sbn);
  if (!valid.ok()) sbn.ErrorAt("hidden", std::string(valid.message()));
}

namespace {

// An error or warning at the line of `key` (0 if the file leaves it out).
Diagnostics::Entry At(const VipsdConfig& config, const std::string& key, const std::string& what) {
  int line = config.line_of(key);
  // An absent key (its default is refused): the line of its section.
  for (std::string prefix = key; line == 0 && prefix.find('.') != std::string::npos;) {
    prefix.erase(prefix.rfind('.'));
    line = config.line_of(prefix);
  }
  return {line, KeyWhere(config.file, line, key) + what};
}

// privacy.unit, its field and its cap, and what a unit cannot be combined
// with (docs/privacy_accounting.md "The privacy unit").
void CheckPrivacyUnit(const VipsdConfig& config, Diagnostics* diag) {
  const bool per_unit = config.privacy_unit != PrivacyUnit::kRecord;
  const auto error = [&](const std::string& key, const std::string& what) {
    diag->errors.push_back(At(config, key, what));
  };
  const bool shared = !config.work_topic.empty();
  if (config.line_of("privacy.unit_partitioner") > 0 &&
      (config.privacy_unit != PrivacyUnit::kKey || !shared)) {
    error("privacy.unit_partitioner",
          "only allowed with privacy.unit: key and state.work_topic (shared work)");
  }
  if (!per_unit) {
    if (config.line_of("privacy.max_records_per_unit") > 0) {
      error("privacy.max_records_per_unit", "only allowed with privacy.unit: key or field");
    }
    if (config.line_of("privacy.unit_field") > 0) {
      error("privacy.unit_field", "only allowed with privacy.unit: field");
    }
    return;
  }
  if (config.driver.max_records_per_unit <= 0) {
    error("privacy.unit",
          "a unit needs privacy.max_records_per_unit (an integer in [1, 1000000]: how many of "
          "one unit's records a step may use; their statistics are clipped together)");
  }
  if (config.privacy_unit == PrivacyUnit::kKey && config.source_type != SourceType::kKafka) {
    error("privacy.unit",
          "key needs source.type: kafka (the message key is the unit id); a file source names "
          "its unit with privacy.unit: field and privacy.unit_field");
  }
  if (config.privacy_unit == PrivacyUnit::kField) {
    if (config.source_type != SourceType::kFile) {
      error("privacy.unit",
            "field is for source.type: file; a Kafka source's unit is its message key "
            "(privacy.unit: key)");
    }
    if (config.unit_field.empty()) {
      error("privacy.unit", "field needs privacy.unit_field (the JSON key of the unit id)");
    } else if (!privacy::IsUnitFieldName(config.unit_field)) {
      error("privacy.unit_field",
            "must be 1 to 128 characters of A-Z, a-z, 0-9, '_', '.' and '-' (a JSON key)");
    }
  } else if (config.line_of("privacy.unit_field") > 0) {
    error("privacy.unit_field", "only allowed with privacy.unit: field");
  }
  if (config.accounting == Accounting::kResidency) {
    const std::string unit(PrivacyUnitName(config.privacy_unit));
    error("privacy.accounting",
          "residency cannot be used with privacy.unit " + unit +
              ": it bounds how many steps one record is a candidate in, and a unit can keep "
              "sending new records (use global)");
  }
  if (shared && config.privacy_unit == PrivacyUnit::kKey &&
      config.unit_partitioner == privacy::UnitPartitioner::kNone) {
    error("privacy.unit",
          "shared work with privacy.unit: key needs privacy.unit_partitioner: murmur2 | crc32, "
          "the partitioner your producers send keys with (murmur2: Java clients' default and "
          "librdkafka's murmur2_random; crc32: librdkafka's default, consistent_random): a unit "
          "counts only in the partition its key goes to, so that processes summing different "
          "partitions never clip one unit twice");
  }
}

// source.topics (required but for an aggregator) and the federation
// section (docs/federation.md).
void CheckFederation(const VipsdConfig& config, Diagnostics* diag) {
  if (config.source_type != SourceType::kKafka) return;
  const auto error = [&](const std::string& key, const std::string& what) {
    diag->errors.push_back(At(config, key, what));
  };
  const FederationSettings& f = config.federation;
  const bool aggregator = f.role == FederationRole::kAggregator;
  if (!aggregator && config.source_topics.empty() && config.line_of("source.topics") == 0) {
    error("source.topics", "required key is missing");
  }
  if (f.role == FederationRole::kNone) {
    for (const char* key : {"federation.holder_id", "federation.secret_key",
                            "federation.tolerated_holders", "federation.round_timeout_seconds",
                            "federation.share_delay_seconds", "federation.holders"}) {
      if (config.line_of(key) > 0) error(key, "only allowed with federation.role: holder | aggregator");
    }
    return;
  }
  const std::string role = aggregator ? "an aggregator" : "a holder";
  if (!config.is_private()) {
    error("federation.role",
          "federated mode needs privacy.noise_multiplier > 0: the holders' noise shares are "
          "what protects their data from the aggregator");
  }
  if (config.work_topic.empty()) {
    error("federation.role",
          "federated mode needs state.work_topic (a two-partition topic: the aggregator's "
          "plans, the holders' masked shares)");
  }
  if (config.privacy_unit != PrivacyUnit::kRecord) {
    error("privacy.unit",
          "federated mode protects one record of a holder (privacy.unit: record): a unit's "
          "records may sit with several holders, whose clipping would not bound it");
  }
  if (config.accounting != Accounting::kGlobal) {
    error("privacy.accounting", "federated mode needs global accounting");
  }
  if (config.standby_takeover_seconds > 0) {
    error("state.standby_takeover_seconds", "not allowed with federation.role (" + role +
                                                " has no standby)");
  }
  if (f.holders.empty()) {
    error("federation.holders",
          "required with federation.role: every holder's id and X25519 public key");
  } else if (f.holders.size() > 64) {
    error("federation.holders", "at most 64 holders (the integer headroom of the masked sums)");
  } else if (f.tolerated_holders >= static_cast<int64_t>(f.holders.size())) {
    error("federation.tolerated_holders",
          "must be below the number of holders (" + std::to_string(f.holders.size()) +
              "): every round needs more than tolerated_holders participants");
  }
  if (aggregator) {
    if (!config.source_topics.empty()) {
      error("source.topics",
            "an aggregator reads no input: leave source.topics out (each holder names its own)");
    }
    for (const char* key :
         {"federation.holder_id", "federation.secret_key", "federation.share_delay_seconds"}) {
      if (config.line_of(key) > 0) error(key, "only allowed with federation.role: holder");
    }
    return;
  }
  if (f.share_delay_seconds > f.round_timeout_seconds - 1) {
    error("federation.share_delay_seconds",
          ShortestNumber(f.share_delay_seconds) + " leaves less than 1 s before "
          "federation.round_timeout_seconds = " + ShortestNumber(f.round_timeout_seconds) +
          " (the aggregator's, which every holder must configure alike): shares would arrive "
          "after the aggregator gave up");
  }
  if (f.holder_id.empty()) {
    error("federation.holder_id", "required with federation.role: holder (its id in federation.holders)");
  } else if (!f.holders.empty() && f.holders.count(f.holder_id) == 0) {
    error("federation.holder_id",
          "'" + f.holder_id + "' is not one of federation.holders");
  }
  if (f.secret_key.empty() && config.line_of("federation.secret_key") == 0) {
    error("federation.secret_key",
          "required with federation.role: holder ({file: PATH} or {credential: NAME}; "
          "`vipsd federation-keygen` makes one)");
  }
  if (config.line_of("state.ledger_key") == 0) {
    error("state.ledger_key",
          "required with federation.role: holder: the federation's job, the aggregator's "
          "state.ledger_key (plans of other jobs on the topic are ignored)");
  }
  if (!config.ledger_topic.empty()) {
    error("state.ledger_topic",
          "not allowed with federation.role: holder (a holder's ledger is its state directory's; "
          "the job's ledger is the aggregator's)");
  }
}

}  // namespace

void CheckWholeFile(const VipsdConfig& config, Diagnostics* diag) {
  CheckFederation(config, diag);
  if (config.accounting == Accounting::kResidency && config.source_type != SourceType::kKafka) {
    diag->errors.push_back(
        At(config, "privacy.accounting",
           "residency needs source.type: kafka (a file run has a fixed data set: use global)"));
  }
  if (config.accounting == Accounting::kResidency && config.source_type == SourceType::kKafka &&
      config.window_steps == svi::kWindowAll) {
    diag->errors.push_back(
        At(config,
           config.line_of("schedule.window_steps") > 0 ? "schedule.window_steps"
                                                       : "privacy.accounting",
           "residency accounting needs a finite window (a whole number >= 1: each record is a "
           "candidate in at most that many steps), got all"));
  }
  // An unbounded window on a stream makes the capacity stop certain: once
  // more than pool.capacity records have arrived, stepping stops for good,
  // and when that happens depends on the data and is not in epsilon.
  if (config.is_private() && config.source_type == SourceType::kKafka &&
      config.window_steps == svi::kWindowAll &&
      config.accounting != Accounting::kResidency) {
    diag->errors.push_back(At(
        config, "schedule.window_steps",
        std::string(config.line_of("schedule.window_steps") > 0 ? "all" : "all (the default)") +
            " is refused for a private run on a Kafka stream: every step's candidates would be "
        "all the records ever appended, so stepping would stop for good once more than "
        "pool.capacity (" + std::to_string(config.pool_capacity) +
            ") records had arrived, at a time that depends on the data and is not covered by "
            "epsilon; set a whole number >= 1 (each step then sees the records of the last "
            "window_steps slot intervals)"));
  }
  CheckPrivacyUnit(config, diag);
  if (config.source_type == SourceType::kFile && !config.dead_letter_path.empty() &&
      std::filesystem::path(config.dead_letter_path).lexically_normal() ==
          std::filesystem::path(config.source_path).lexically_normal()) {
    diag->errors.push_back(
        At(config, "dead_letter.path",
           "must not be the source file itself (dead letters would be appended to the input "
           "being read)"));
  }
  // Legal but unwise values: warnings with the reason.
  if (!config.is_private()) return;

  if (config.driver.delta > 1e-3) {
    diag->warnings.push_back(
        At(config, "privacy.delta",
           "warning: " + ShortestNumber(config.driver.delta) +
               " is large; (epsilon, delta)-DP allows a delta-probability total failure, so "
               "delta should be well below 1/(number of records), typically 1e-5 or less"));
  }
  if (config.driver.epsilon_ceiling > 10) {
    diag->warnings.push_back(
        At(config, "privacy.epsilon_ceiling",
           "warning: an epsilon above 10 gives little protection (e^epsilon bounds how much a "
           "release may change an adversary's odds)"));
  }
  if (config.source_type == SourceType::kKafka && config.source_timestamps == "create_time") {
    diag->warnings.push_back(At(
        config, "source.timestamps",
        "warning: create_time trusts the producers' timestamps to decide which slot a record "
        "belongs to: a producer that stamps the future can move the records sent after its own "
        "in its partition by one slot (SECURITY.md); create the input topics with "
        "message.timestamp.type=LogAppendTime and use log_append_time (the default)"));
  }
  if (config.driver.mechanism.noise_multiplier < 0.5) {
    diag->warnings.push_back(
        At(config, "privacy.noise_multiplier",
           "warning: below 0.5 each step spends a large epsilon (one step at q = 1 costs more "
           "than 10 at delta 1e-5)"));
  }
}

}  // namespace vipsd::config::internal

namespace vipsd::config {
namespace {

// A rate for people: four significant digits ("444.4", "20", "0.01667").
std::string FourDigits(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

}  // namespace

CapacityMargin CapacityMarginOf(const VipsdConfig& config) {
  CapacityMargin margin;
  if (config.source_type != SourceType::kKafka) return margin;
  margin.applies = true;
  margin.capacity = config.pool_capacity;
  const std::string capacity = "pool.capacity " + std::to_string(config.pool_capacity);
  if (config.window_steps == 0) {
    margin.unbounded = true;
    margin.text = capacity + " against window_steps: all: stepping stops for good once more "
                             "than " + std::to_string(config.pool_capacity) +
                  " records have arrived in all (certain on a stream that keeps growing)";
    return margin;
  }
  margin.window_seconds =
      static_cast<double>(config.window_steps) * config.step_interval_seconds;
  margin.records_per_second = static_cast<double>(config.pool_capacity) / margin.window_seconds;
  margin.text = capacity + " holds a window of " + std::to_string(config.window_steps) +
                " slots of " + ShortestNumber(config.step_interval_seconds) +
                " s: stepping stops if more than " + std::to_string(config.pool_capacity) +
                " records arrive within " + ShortestNumber(margin.window_seconds) +
                " s (on average more than " + FourDigits(margin.records_per_second) +
                " records/s)";
  return margin;
}

std::string KeyWhere(const VipsdConfig& config, const std::string& key) {
  return KeyWhere(config.file, config.line_of(key), key);
}

}  // namespace vipsd::config
