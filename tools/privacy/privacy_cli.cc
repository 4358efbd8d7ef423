#include "tools/privacy/privacy_cli.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "core/base/format.h"
#include "core/base/log.h"
#include "core/models/sbn.h"
#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/mechanisms/distributed_noise.h"
#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp.h"

namespace vipsd::tools {
namespace {

using privacy::AccountantKind;

constexpr int kExitOk = 0;
constexpr int kExitNoAnswer = 1;
constexpr int kExitUsage = 2;

// Shortest decimal that reads back as the same double ("0.004", not
// "0.0040000000000000001").
std::string Number(double value) { return ShortestNumber(value); }

// Six significant digits for people.
std::string Human(double value) {
  if (std::isinf(value)) return "infinite";
  return SignificantDigits(value, 6);
}

// Ordered JSON object with number, boolean and string fields.
class JsonObject {
 public:
  void Add(std::string key, double value) {
    // JSON has no infinity; an unbounded ε is written as null.
    fields_.emplace_back(std::move(key), std::isfinite(value) ? Number(value) : "null");
  }
  void AddInt(std::string key, int64_t value) {
    fields_.emplace_back(std::move(key), std::to_string(value));
  }
  void AddBool(std::string key, bool value) {
    fields_.emplace_back(std::move(key), value ? "true" : "false");
  }
  // `json` is already JSON (an array).
  void AddRaw(std::string key, std::string json) {
    fields_.emplace_back(std::move(key), std::move(json));
  }
  void AddString(std::string key, const std::string& value) {
    // Values are fixed identifiers (no characters that need escaping).
    fields_.emplace_back(std::move(key), "\"" + value + "\"");
  }
  std::string ToString() const {
    std::string text = "{";
    for (size_t i = 0; i < fields_.size(); ++i) {
      if (i > 0) text += ", ";
      text += "\"" + fields_[i].first + "\": " + fields_[i].second;
    }
    return text + "}";
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

struct UsageError {
  std::string message;
};

struct Flags {
  std::map<std::string, std::string> values;  // flag name (with --) → text
  bool json = false;
  bool help = false;
};

struct CommandSpec {
  std::vector<std::string> required;
  std::vector<std::string> optional;
};

const std::map<std::string, CommandSpec>& Commands() {
  static const std::map<std::string, CommandSpec> commands = {
      {"epsilon",
       {{"--sampling-rate", "--noise-multiplier", "--steps", "--delta"}, {"--accountant"}}},
      {"sigma",
       {{"--target-epsilon", "--sampling-rate", "--steps", "--delta"}, {"--accountant"}}},
      {"steps",
       {{"--target-epsilon", "--sampling-rate", "--noise-multiplier", "--delta"},
        {"--accountant"}}},
      {"plan", {{"--config"}, {}}},
  };
  return commands;
}

std::optional<UsageError> ParseFlags(const std::string& command,
                                     std::span<const std::string> args, Flags* flags) {
  const CommandSpec& spec = Commands().at(command);
  std::set<std::string> allowed(spec.required.begin(), spec.required.end());
  allowed.insert(spec.optional.begin(), spec.optional.end());
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--json") {
      flags->json = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      flags->help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return UsageError{"unexpected argument '" + arg + "' (flags start with --)"};
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (!allowed.count(arg)) {
      std::string list;
      for (const auto& name : spec.required) list += " " + name;
      for (const auto& name : spec.optional) list += " " + name;
      return UsageError{"unknown flag " + arg + " for '" + command + "' (allowed:" + list +
                        " --json)"};
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return UsageError{arg + " needs a value"};
      value = args[++i];
    }
    if (flags->values.count(arg)) return UsageError{arg + " given twice"};
    flags->values[arg] = value;
  }
  if (flags->help) return std::nullopt;
  for (const auto& name : spec.required) {
    if (!flags->values.count(name)) {
      return UsageError{"missing " + name + " (required by '" + command + "')"};
    }
  }
  return std::nullopt;
}

// Parses a whole string as a finite double.
std::optional<double> ParseDouble(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// Each parser returns the value or a UsageError naming the flag and range.
struct Parsed {
  double sampling_rate = 0;
  double noise_multiplier = 0;
  double delta = 0;
  double target_epsilon = 0;
  int64_t steps = 0;
  AccountantKind accountant = AccountantKind::kFixed;
  std::string config_path;
};

std::optional<UsageError> ParseValues(const Flags& flags, Parsed* parsed) {
  auto bad = [](const std::string& flag, const std::string& allowed,
                const std::string& got) {
    return UsageError{flag + " must be " + allowed + ", got '" + got + "'"};
  };
  for (const auto& [flag, text] : flags.values) {
    if (flag == "--config") {
      parsed->config_path = text;
      continue;
    }
    if (flag == "--accountant") {
      auto kind = privacy::ParseAccountantName(text);
      if (!kind) return bad(flag, "one of fixed, filter, rdp, pld, strong", text);
      parsed->accountant = *kind;
      continue;
    }
    if (flag == "--steps") {
      auto value = ParseDouble(text);
      // Accept "100" and "1e7", but only whole numbers in range.
      if (!value || *value < 1 || *value > 1e15 || std::floor(*value) != *value) {
        return bad(flag, "a whole number in [1, 1e15]", text);
      }
      parsed->steps = static_cast<int64_t>(*value);
      continue;
    }
    auto value = ParseDouble(text);
    if (flag == "--sampling-rate") {
      if (!value || !(*value > 0 && *value <= 1)) return bad(flag, "a number in (0, 1]", text);
      parsed->sampling_rate = *value;
    } else if (flag == "--noise-multiplier") {
      if (!value || !(*value > 0)) return bad(flag, "a number > 0", text);
      parsed->noise_multiplier = *value;
    } else if (flag == "--delta") {
      if (!value || !(*value > 0 && *value < 1)) return bad(flag, "a number in (0, 1)", text);
      parsed->delta = *value;
    } else if (flag == "--target-epsilon") {
      if (!value || !(*value > 0)) return bad(flag, "a number > 0", text);
      parsed->target_epsilon = *value;
    }
  }
  return std::nullopt;
}

void AddSchedule(JsonObject* json, const Parsed& p, double epsilon, int64_t steps,
                 double noise_multiplier) {
  json->Add("epsilon", epsilon);
  json->Add("delta", p.delta);
  json->AddInt("steps", steps);
  json->Add("noise_multiplier", noise_multiplier);
  json->Add("sampling_rate", p.sampling_rate);
  json->AddString("accountant", privacy::AccountantName(p.accountant));
}

void AddEstimateDetails(JsonObject* json, const privacy::PrivacyEstimate& estimate) {
  if (estimate.order) {
    json->Add("order", *estimate.order);
    json->AddString("conversion", "improved");
  }
  if (estimate.epsilon_classic) json->Add("epsilon_classic", *estimate.epsilon_classic);
  if (estimate.fixed_pld) json->Add("epsilon_pld", *estimate.fixed_pld);
  if (estimate.fixed_rdp) json->Add("epsilon_rdp", *estimate.fixed_rdp);
}

std::string AccountantLine(const Parsed& p, const privacy::PrivacyEstimate& estimate) {
  std::string line = std::string("accountant: ") + privacy::AccountantName(p.accountant);
  switch (p.accountant) {
    case AccountantKind::kFixed:
      line += " (the daemon's charge for privacy.schedule: fixed: the smaller of PLD " +
              Human(*estimate.fixed_pld) + " and RDP " + Human(*estimate.fixed_rdp) + ")";
      break;
    case AccountantKind::kFilter:
      line += " (the daemon's charge for privacy.schedule: adaptive: RDP privacy filter, "
              "delta split over " + std::to_string(privacy::DefaultRdpOrders().size()) +
              " orders, half of it on the order where these steps end), order " +
              Human(*estimate.order);
      break;
    case AccountantKind::kRdp:
      line += " (improved conversion, Balle et al. 2020), optimal order " +
              Human(*estimate.order) + "; classic conversion gives epsilon = " +
              Human(*estimate.epsilon_classic);
      break;
    case AccountantKind::kPld:
      line += " (privacy-loss distribution, pessimistic discretisation)";
      break;
    case AccountantKind::kStrong:
      line += " (analytic Gaussian + amplification + Dwork-Rothblum-Vadhan; baseline only)";
      break;
  }
  return line;
}

}  // namespace

StatusOr<privacy::DistributedNoise> FederatedNoiseOf(const config::VipsdConfig& config) {
  size_t blocks = 0;
  if (config.model_type == "lda") {
    blocks = 1;  // the topic-word counts
  } else if (config.model_type == "blr") {
    blocks = 2;  // s1, s2
  } else if (config.model_type == "sbn") {
    blocks = models::kSbnNumBlocks;
  } else {
    return InvalidArgumentError("model.type " + config.model_type + " has no statistic layout");
  }
  std::vector<privacy::BlockSpec> specs;
  for (size_t b = 0; b < blocks; ++b) {
    specs.push_back(privacy::BlockSpec{"b" + std::to_string(b), privacy::BlockKind::kVector, 1, 1.0});
  }
  VIPSD_ASSIGN_OR_RETURN(auto layout, privacy::BlockLayout::Create(std::move(specs)));
  return privacy::DistributedNoiseFor(
      layout, config.driver.mechanism.noise_multiplier,
      static_cast<uint32_t>(config.federation.holders.size()),
      static_cast<uint32_t>(config.federation.tolerated_holders));
}

namespace {

int Fail(std::ostream& err, const Status& status) {
  err << "vipsd-privacy: " << status.message() << "\n";
  return status.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitNoAnswer;
}

// `plan --config FILE`: what the daemon will do with this configuration, by
// the daemon's own accountant: how many steps the ceiling allows (for a new
// state directory), the ε after them, and for residency mode whether the
// window is affordable and the largest that is.
int RunPlan(const Parsed& p, bool json_output, std::ostream& out, std::ostream& err) {
  auto config = config::LoadConfigFile(p.config_path);
  if (!config.ok()) {
    err << "vipsd-privacy: " << config.status().message() << "\n";
    return kExitUsage;
  }
  // The configuration's warnings, as the daemon says them: with log.format:
  // json one JSON object per line (a log shipper reads stderr).
  auto say = [&](LogLevel level, const std::string& text) {
    if (config->log_format == LogFormat::kJson) {
      err << FormatLogLineNow(LogFormat::kJson, level, "vipsd-privacy", text);
    } else {
      err << "vipsd-privacy: " << text << "\n";
    }
  };
  for (const std::string& warning : config->warnings) say(LogLevel::kWarning, warning);
  auto fail = [&](const Status& status) {
    say(LogLevel::kError, std::string(status.message()));
    return status.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitNoAnswer;
  };
  if (!config->is_private()) {
    say(LogLevel::kError, p.config_path +
                              ": privacy.noise_multiplier is 0: a non-private run has no budget "
                              "to plan");
    return kExitUsage;
  }
  const double q = config->driver.mechanism.sampling_rate;
  const double sigma = config->driver.mechanism.noise_multiplier;
  const double delta = config->driver.delta;
  const double ceiling = config->driver.epsilon_ceiling;
  const bool fixed = config->schedule.value_or(config::Schedule::kFixed) == config::Schedule::kFixed;
  const AccountantKind kind = fixed ? AccountantKind::kFixed : AccountantKind::kFilter;
  const bool residency = config->accounting == config::Accounting::kResidency;
  // Adaptive: the filter's split of δ that a new state directory gets —
  // the daemon's own function of these public settings. Global: the steps
  // the ceiling allows. Residency: the longest window a record may be a
  // candidate in (the daemon runs for ever).
  auto planned = privacy::PlanRun(fixed, residency, ceiling, q, sigma, delta, config->window_steps);
  if (!planned.ok()) return fail(planned.status());
  const std::vector<double>& weights = planned->filter_weights;
  auto epsilon_after = [&](int64_t n) -> StatusOr<privacy::PrivacyEstimate> {
    if (fixed) return privacy::EstimateEpsilon(kind, {q, sigma}, n, delta);
    return privacy::FilterEpsilon(q, sigma, n, delta, weights);
  };
  const int64_t steps = planned->steps;
  double epsilon = 0;
  if (steps > 0) {
    auto at = residency ? privacy::EstimateEpsilon(kind, {q, sigma}, steps, delta)
                        : epsilon_after(steps);
    if (!at.ok()) return fail(at.status());
    epsilon = at->epsilon;
  }
  std::optional<double> window_epsilon;
  if (residency) {
    auto at = epsilon_after(config->window_steps);
    if (!at.ok()) return fail(at.status());
    window_epsilon = at->epsilon;
  }
  const bool paced = config->source_type == config::SourceType::kKafka;
  const bool starts = steps > 0 && (!residency || *window_epsilon <= ceiling);
  // What the ε below protects (privacy.unit): per record, or per unit.
  const std::string unit(config::PrivacyUnitName(config->privacy_unit));
  const std::string protects = config::DescribeProtection(
      unit, config->unit_field, config->driver.max_records_per_unit);
  // Federated mode: the noise shares and the σ that h honest holders'
  // shares still give (the same function the daemon plans its rounds with).
  struct Federated {
    privacy::DistributedNoise noise;
    std::vector<double> honest;  // by h = 0..n
  };
  std::optional<Federated> federated;
  if (config->federated()) {
    auto noise = FederatedNoiseOf(*config);
    if (!noise.ok()) return fail(noise.status());
    Federated f{*noise, {}};
    for (uint32_t h = 0; h <= f.noise.holders; ++h) {
      auto sigma_h = privacy::HonestNoiseMultiplier(f.noise, h);
      if (!sigma_h.ok()) return fail(sigma_h.status());
      f.honest.push_back(*sigma_h);
    }
    federated = std::move(f);
  }
  if (json_output) {
    JsonObject json;
    json.AddString("command", "plan");
    if (federated.has_value()) {
      json.AddString("federation_role", config->federation.role == config::FederationRole::kHolder
                                            ? "holder"
                                            : "aggregator");
      json.AddInt("holders", federated->noise.holders);
      json.AddInt("tolerated_holders", federated->noise.tolerated);
      json.AddInt("share_sigma2_grid", static_cast<int64_t>(federated->noise.share_sigma2.numerator));
      std::string list = "[";
      for (size_t h = 0; h < federated->honest.size(); ++h) {
        list += (h > 0 ? ", " : "") + Number(federated->honest[h]);
      }
      json.AddRaw("honest_noise_multiplier", list + "]");
    }
    json.AddString("schedule", fixed ? "fixed" : "adaptive");
    json.AddString("accounting", residency ? "residency" : "global");
    json.AddString("unit", unit);
    if (config->privacy_unit == config::PrivacyUnit::kField) {
      json.AddString("unit_field", config->unit_field);
    }
    if (config->privacy_unit != config::PrivacyUnit::kRecord) {
      json.AddInt("max_records_per_unit", config->driver.max_records_per_unit);
    }
    json.AddString("protects", protects);
    json.AddString("accountant", privacy::AccountantName(kind));
    json.Add("sampling_rate", q);
    json.Add("noise_multiplier", sigma);
    json.Add("delta", delta);
    json.Add("epsilon_ceiling", ceiling);
    if (residency) {
      json.AddInt("max_window_steps", steps);
    } else {
      // steps_to_ceiling: the steps a new state directory runs before the
      // ceiling; `steps` and `max_steps` say the same (older scripts).
      json.AddInt("steps_to_ceiling", steps);
      json.AddInt("steps", steps);
      json.AddInt("max_steps", steps);
    }
    json.Add("epsilon", epsilon);
    if (residency) {
      json.AddInt("window_steps", config->window_steps);
      json.Add("window_epsilon", *window_epsilon);
    }
    if (paced && !residency) json.Add("hours", steps * config->step_interval_seconds / 3600.0);
    const config::CapacityMargin margin = config::CapacityMarginOf(*config);
    if (margin.applies) {
      json.AddInt("pool_capacity", margin.capacity);
      if (!margin.unbounded) {
        json.Add("window_seconds", margin.window_seconds);
        json.Add("capacity_records_per_second", margin.records_per_second);
      }
    }
    if (paced) {
      // (ε, δ + β): the steps whose timing a record's claim covers.
      json.Add("overrun_beta", planned->overrun_beta);
      json.Add("delta_plus_beta", delta + planned->overrun_beta);
      json.AddString("on_overrun", config->on_overrun == config::OverrunAction::kStop
                                       ? "stop"
                                       : "catch_up");
    }
    json.AddBool("starts", starts);
    out << json.ToString() << "\n";
    return starts ? kExitOk : kExitNoAnswer;
  }
  out << "plan for " << p.config_path << " (a new state directory; an existing one keeps its "
      << "ledger's schedule)\n"
      << "  schedule: " << (fixed ? "fixed" : "adaptive") << ", accounting: "
      << (residency ? "residency" : "global") << ", accountant: "
      << privacy::AccountantName(kind) << "\n"
      << "  sampling rate " << Human(q) << ", noise multiplier " << Human(sigma) << ", delta "
      << Human(delta) << ", epsilon ceiling " << Human(ceiling) << "\n"
      << "  protects: " << protects
      << (config->privacy_unit == config::PrivacyUnit::kRecord
              ? "\n"
              : " (the sampling rate is the rate at which units are sampled)\n");
  if (residency) {
    out << "  window: each record is a candidate in at most " << config->window_steps
        << " steps: epsilon per record " << Human(*window_epsilon)
        << (*window_epsilon <= ceiling ? " (within the ceiling)" : " (OVER the ceiling: the "
            "daemon refuses to start)") << "\n"
        << "  the longest affordable window is " << steps << " steps (epsilon "
        << Human(epsilon) << ")\n";
  } else {
    out << "  steps: the ceiling allows " << steps << " steps (epsilon " << Human(epsilon)
        << " after them)";
    if (paced) {
      out << ", about " << Human(steps * config->step_interval_seconds / 3600.0)
          << " hours at one step every " << Human(config->step_interval_seconds) << " s";
    }
    out << "\n";
    if (steps == 0) out << "  NOT ONE step fits under the ceiling: the daemon refuses to start\n";
  }
  const config::CapacityMargin margin = config::CapacityMarginOf(*config);
  if (margin.applies) out << "  capacity: " << margin.text << "\n";
  if (paced) {
    const int64_t timed_steps = planned->timed_steps;
    const double beta = planned->overrun_beta;
    out << "  overruns: the claim is (epsilon, delta + beta) = ("
        << Human(residency ? *window_epsilon : epsilon) << ", "
        << Human(delta + beta) << ") with beta = " << timed_steps << " x "
        << Human(privacy::kBatchTailProbability) << " = " << Human(beta)
        << ", the chance that a step's batch exceeds the one its worst-case time was "
           "measured at; it holds when `vipsd --check-config` on this machine finds that step "
           "fits its slot with margin (a private run that stops at overruns is refused at "
           "start when it does not)"
        << (config->on_overrun == config::OverrunAction::kStop
                ? " (schedule.on_overrun: stop: an overrun shows as one event per run)"
                : "; schedule.on_overrun: catch_up lets the release times show each overrun's "
                  "length")
        << "\n";
  }
  if (federated.has_value()) {
    const auto& f = *federated;
    out << "  federated: " << f.noise.holders << " holders, tolerated_holders " << f.noise.tolerated
        << ": each adds a noise share of variance " << f.noise.share_sigma2.numerator
        << " grid units^2 (the central noise's " << f.noise.central.sigma2.numerator
        << " over n - t); with every holder honest the total carries "
        << Human(static_cast<double>(f.noise.holders) / (f.noise.holders - f.noise.tolerated))
        << " x the central variance\n"
        << "  the sigma the steps above are charged at holds while at least "
        << f.noise.holders - f.noise.tolerated
        << " holders' shares are unknown to the adversary; with h honest holders:";
    for (size_t h = f.honest.size(); h-- > 0;) {
      out << (h + 1 == f.honest.size() ? " " : ", ") << "h=" << h << ": " << Human(f.honest[h]);
    }
    out << "\n";
  }
  return starts ? kExitOk : kExitNoAnswer;
}

int RunEpsilon(const Parsed& p, bool json_output, std::ostream& out, std::ostream& err) {
  auto estimate = privacy::EstimateEpsilon(p.accountant, {p.sampling_rate, p.noise_multiplier},
                                           p.steps, p.delta);
  if (!estimate.ok()) return Fail(err, estimate.status());
  if (json_output) {
    JsonObject json;
    json.AddString("command", "epsilon");
    AddSchedule(&json, p, estimate->epsilon, p.steps, p.noise_multiplier);
    AddEstimateDetails(&json, *estimate);
    out << json.ToString() << "\n";
    return kExitOk;
  }
  out << "epsilon = " << Human(estimate->epsilon) << " at delta = " << Human(p.delta) << "\n"
      << "  " << AccountantLine(p, *estimate) << "\n"
      << "  schedule: " << p.steps << " steps, sampling rate " << Human(p.sampling_rate)
      << ", noise multiplier " << Human(p.noise_multiplier) << "\n";
  return kExitOk;
}

int RunSigma(const Parsed& p, bool json_output, std::ostream& out, std::ostream& err) {
  auto sigma = privacy::NoiseMultiplierForEpsilon(p.accountant, p.target_epsilon,
                                                  p.sampling_rate, p.steps, p.delta);
  if (!sigma.ok()) return Fail(err, sigma.status());
  auto estimate =
      privacy::EstimateEpsilon(p.accountant, {p.sampling_rate, *sigma}, p.steps, p.delta);
  if (!estimate.ok()) return Fail(err, estimate.status());
  if (json_output) {
    JsonObject json;
    json.AddString("command", "sigma");
    AddSchedule(&json, p, estimate->epsilon, p.steps, *sigma);
    json.Add("target_epsilon", p.target_epsilon);
    AddEstimateDetails(&json, *estimate);
    out << json.ToString() << "\n";
    return kExitOk;
  }
  out << "noise multiplier = " << Human(*sigma)
      << " (smallest 3-significant-digit value with epsilon <= " << Human(p.target_epsilon)
      << ")\n"
      << "  gives epsilon = " << Human(estimate->epsilon) << " at delta = " << Human(p.delta)
      << " over " << p.steps << " steps at sampling rate " << Human(p.sampling_rate) << "\n"
      << "  " << AccountantLine(p, *estimate) << "\n";
  return kExitOk;
}

int RunSteps(const Parsed& p, bool json_output, std::ostream& out, std::ostream& err) {
  auto steps = privacy::MaxStepsForEpsilon(p.accountant, p.target_epsilon, p.sampling_rate,
                                           p.noise_multiplier, p.delta);
  if (!steps.ok()) return Fail(err, steps.status());
  privacy::PrivacyEstimate estimate;  // ε = 0 when no step fits
  if (*steps > 0) {
    // The filter: ε under the same split the step count was found with (the
    // daemon's for this ceiling).
    auto computed =
        p.accountant == AccountantKind::kFilter
            ? [&]() -> StatusOr<privacy::PrivacyEstimate> {
                auto weights = privacy::DesignFilterWeights(
                    p.sampling_rate, p.noise_multiplier, p.delta, p.target_epsilon, 0);
                if (!weights.ok()) return weights.status();
                return privacy::FilterEpsilon(p.sampling_rate, p.noise_multiplier, *steps,
                                              p.delta, *weights);
              }()
            : privacy::EstimateEpsilon(p.accountant, {p.sampling_rate, p.noise_multiplier},
                                       *steps, p.delta);
    if (!computed.ok()) return Fail(err, computed.status());
    estimate = *computed;
  }
  if (json_output) {
    JsonObject json;
    json.AddString("command", "steps");
    AddSchedule(&json, p, estimate.epsilon, *steps, p.noise_multiplier);
    json.Add("target_epsilon", p.target_epsilon);
    AddEstimateDetails(&json, estimate);
    out << json.ToString() << "\n";
    return kExitOk;
  }
  if (*steps == 0) {
    out << "steps = 0: a single step already exceeds epsilon = " << Human(p.target_epsilon)
        << " at delta = " << Human(p.delta) << "\n";
    return kExitOk;
  }
  out << "steps = " << *steps << " (largest count with epsilon <= " << Human(p.target_epsilon)
      << ")\n"
      << "  gives epsilon = " << Human(estimate.epsilon) << " at delta = " << Human(p.delta)
      << ", sampling rate " << Human(p.sampling_rate) << ", noise multiplier "
      << Human(p.noise_multiplier) << "\n"
      << "  " << AccountantLine(p, estimate) << "\n";
  return kExitOk;
}

}  // namespace

std::string PrivacyCliUsage() {
  return R"(vipsd-privacy: privacy planning for the Poisson-subsampled Gaussian mechanism

Usage:
  vipsd-privacy plan    --config FILE
  vipsd-privacy epsilon --sampling-rate Q --noise-multiplier S --steps T --delta D
  vipsd-privacy sigma   --target-epsilon E --sampling-rate Q --steps T --delta D
  vipsd-privacy steps   --target-epsilon E --sampling-rate Q --noise-multiplier S --delta D

  plan     what vipsd will do with the configuration FILE, by the daemon's own
           accountant: the steps its ceiling allows (global accounting) or
           whether its window is affordable and the longest that is
           (residency); exit 1 if the daemon would refuse to start
  epsilon  the epsilon spent by T steps
  sigma    the smallest noise multiplier (3 significant digits) that keeps
           epsilon <= E after T steps
  steps    the largest number of steps that keeps epsilon <= E

Options (all commands):
  --accountant fixed|filter|rdp|pld|strong   (epsilon, sigma, steps)
           fixed (default): what the daemon charges with privacy.schedule:
             fixed (its default): the smaller of PLD and RDP.
           filter: what the daemon charges with privacy.schedule: adaptive:
             the RDP privacy filter; delta is split over the orders, half on
             the order where the run ends (steps: the daemon's split for
             ceiling E; epsilon, sigma: the split designed for T steps).
           rdp: Renyi DP, improved conversion, for a fixed schedule.
           pld: privacy-loss distribution, pessimistic (grid 1e-4).
           strong: analytic Gaussian + amplification by sampling +
           Dwork-Rothblum-Vadhan composition (the VIPS paper's baseline).
  --json   print one JSON object (keys: command, epsilon, delta, steps,
           noise_multiplier, sampling_rate, accountant; order, conversion and
           epsilon_classic for rdp; order for filter; epsilon_pld and
           epsilon_rdp for fixed; target_epsilon for sigma and steps)
  --help   this text

Ranges: Q in (0, 1], S > 0, D in (0, 1), E > 0, T a whole number >= 1.
Adjacency: add/remove one record. Flags may be written --flag VALUE or --flag=VALUE.
Exit codes: 0 ok, 1 no answer in the searched range, 2 invalid arguments.
)";
}

int RunPrivacyCli(std::span<const std::string> args, std::ostream& out, std::ostream& err) {
  if (args.empty()) {
    err << "vipsd-privacy: missing command (plan, epsilon, sigma or steps); see --help\n";
    return kExitUsage;
  }
  const std::string& command = args[0];
  if (command == "--help" || command == "-h" || command == "help") {
    out << PrivacyCliUsage();
    return kExitOk;
  }
  if (!Commands().count(command)) {
    err << "vipsd-privacy: unknown command '" << command
        << "' (allowed: plan, epsilon, sigma, steps); see --help\n";
    return kExitUsage;
  }
  Flags flags;
  if (auto error = ParseFlags(command, args.subspan(1), &flags)) {
    err << "vipsd-privacy: " << error->message << "\n";
    return kExitUsage;
  }
  if (flags.help) {
    out << PrivacyCliUsage();
    return kExitOk;
  }
  Parsed parsed;
  if (auto error = ParseValues(flags, &parsed)) {
    err << "vipsd-privacy: " << error->message << "\n";
    return kExitUsage;
  }
  if (command == "plan") return RunPlan(parsed, flags.json, out, err);
  if (command == "epsilon") return RunEpsilon(parsed, flags.json, out, err);
  if (command == "sigma") return RunSigma(parsed, flags.json, out, err);
  return RunSteps(parsed, flags.json, out, err);
}

}  // namespace vipsd::tools
