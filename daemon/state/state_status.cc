#include "daemon/state/state_status.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "connectors/file/file_util.h"
#include "core/base/format.h"
#include "daemon/state/budget.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger.h"

namespace vipsd::daemon {
namespace {

// An ordered list of (name, JSON value text) printed as JSON or as lines.
class Report {
 public:
  void Add(const std::string& name, const std::string& json_value, const std::string& text) {
    rows_.push_back({name, json_value, text});
  }
  void Number(const std::string& name, double value) {
    const std::string v = std::isfinite(value) ? ShortestNumber(value) : "null";
    Add(name, v, std::isfinite(value) ? v : "unknown");
  }
  void Integer(const std::string& name, int64_t value) {
    Add(name, std::to_string(value), std::to_string(value));
  }
  void String(const std::string& name, const std::string& value) {
    Add(name, JsonString(value), value);
  }
  void Bool(const std::string& name, bool value) {
    Add(name, value ? "true" : "false", value ? "yes" : "no");
  }
  void Raw(const std::string& name, const std::string& json_value, const std::string& text) {
    Add(name, json_value, text);
  }
  std::string Json() const {
    std::string out = "{";
    for (size_t i = 0; i < rows_.size(); ++i) {
      out += (i ? ", " : "") + JsonString(rows_[i].name) + ": " + rows_[i].json;
    }
    return out + "}\n";
  }
  std::string Text() const {
    size_t width = 0;
    for (const Row& row : rows_) width = std::max(width, row.name.size());
    std::string out;
    for (const Row& row : rows_) {
      out += row.name + ":" + std::string(width + 2 - row.name.size(), ' ') + row.text + "\n";
    }
    return out;
  }

 private:
  struct Row {
    std::string name, json, text;
  };
  std::vector<Row> rows_;
};

bool ProcessAlive(int64_t pid) {
  if (pid <= 0 || pid > INT32_MAX) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

namespace {

using StatusNumber = std::function<std::optional<double>(const char* key)>;

// The ledger: its run, model, mode, noise history and ε (at the δ the ledger
// records; for an older ledger at --delta, or the δ the daemon last wrote to
// status.json).
void ReportLedger(const LedgerState& state, std::optional<double> delta,
                  const StatusNumber& number_in_status, Report& report) {
  report.String("run_id", state.run_id);
  report.String("model_type", state.model_type);
  report.String("source", std::string(SourceKindName(state.source)));
  report.String("mode", std::string(AccountingModeName(state.mode)));
  // What the ε protects (privacy.unit, docs/privacy_accounting.md §6d).
  report.String("unit", state.unit);
  if (state.unit != "record") {
    if (state.unit == "field") report.String("unit_field", state.unit_field);
    report.Integer("max_records_per_unit", state.max_records_per_unit);
  }
  report.String("protects", config::DescribeProtection(state.unit, state.unit_field,
                                                       state.max_records_per_unit));
  report.String("schedule", std::string(ScheduleKindName(state.schedule)));
  if (state.schedule == ScheduleKind::kFixed) {
    report.Number("sampling_rate", state.fixed_step.sampling_rate);
    report.Number("noise_multiplier", state.fixed_step.noise_multiplier);
  }
  report.Integer("next_step", state.next_step);
  report.Integer("private_steps", state.noise.private_steps);
  report.Integer("non_private_steps", state.noise.non_private_steps);
  report.Integer("fixed_seed_steps", state.noise.fixed_seed_steps);
  // The first step of each kind that is not private (null / "none": none
  // ran): where the directory's model stopped being private.
  auto first_step = [&](const std::string& name, int64_t step) {
    if (step > 0) {
      report.Integer(name, step);
    } else {
      report.Raw(name, "null", "none");
    }
  };
  first_step("first_non_private_step", state.noise.first_non_private_step);
  first_step("first_fixed_seed_step", state.noise.first_fixed_seed_step);
  const bool contaminated = state.noise.non_private_steps > 0 || state.noise.fixed_seed_steps > 0;
  // Every step so far ran with secure noise (a fresh directory counts).
  report.Bool("private", !contaminated);

  // The δ the ledger records is the directory's; --delta (or status.json's
  // δ) only for a ledger that records none (written before version 7).
  if (state.delta > 0) {
    if (delta.has_value() && *delta != state.delta) {
      report.String("delta_option", "ignored: the ledger records delta " +
                                        ShortestNumber(state.delta) +
                                        ", at which every epsilon of this directory is stated");
    }
    delta = state.delta;
  }
  if (!delta.has_value()) delta = number_in_status("delta");
  std::optional<double> ceiling = number_in_status("epsilon_ceiling");
  if (state.epsilon_ceiling > 0) ceiling = state.epsilon_ceiling;
  if (state.mode == AccountingMode::kResidency || (delta.has_value() && *delta > 0 && *delta < 1)) {
    auto spent = LedgerSpent(state, delta.value_or(0.5));
    if (spent.ok()) {
      report.Number("epsilon_spent", spent->epsilon);
      report.String("accountant", spent->accountant);
      report.String("conversion", spent->conversion);
    } else {
      report.Raw("epsilon_spent", "null", "unknown (" + std::string(spent.status().message()) + ")");
    }
  } else {
    report.Raw("epsilon_spent", "null",
               "unknown (no delta: pass --delta, or start the daemon once so that it writes "
               "status.json)");
  }
  if (delta.has_value()) report.Number("delta", *delta);
  if (ceiling.has_value()) report.Number("epsilon_ceiling", *ceiling);
  if (state.mode == AccountingMode::kResidency && state.residency.has_value()) {
    report.Integer("residency_window_steps", state.residency->max_residency_steps());
  }
  report.Number("warning_level", state.warning_level);

}

void ReportStreams(const LedgerState& state, Report& report) {
  // The slot clock and the streams (public: stream volume).
  report.Integer("last_slot", state.windows.last_slot());
  if (state.windows.paced()) report.Number("slot_interval_seconds", state.windows.interval_seconds());
  std::string streams_json = "{";
  std::string streams_text;
  bool first = true;
  for (const std::string& stream : state.windows.Streams()) {
    const int64_t cut = state.windows.Cut(stream, state.windows.last_slot());
    const int64_t resume = state.windows.ResumeOffset(stream);
    streams_json += (first ? "" : ", ") + JsonString(stream) + ": {\"cut\": " +
                    std::to_string(cut) + ", \"resume_offset\": " + std::to_string(resume) + "}";
    streams_text += (first ? "" : ", ") + stream + " cut " + std::to_string(cut) + " resume " +
                    std::to_string(resume);
    first = false;
  }
  report.Raw("streams", streams_json + "}", streams_text.empty() ? "none" : streams_text);

}

// The checkpoint, if any; false when it does not verify or belong.
bool ReportCheckpoint(const std::string& checkpoint_path, const LedgerState& state,
                      Report& report) {
  std::error_code error;
  bool verified = true;
  // The checkpoint.
  if (std::filesystem::exists(checkpoint_path, error)) {
    auto checkpoint_bytes = connectors::ReadWholeFile(checkpoint_path);
    auto checkpoint = checkpoint_bytes.ok()
                          ? CheckpointStore::Decode(*checkpoint_bytes, checkpoint_path)
                          : StatusOr<Checkpoint>(checkpoint_bytes.status());
    if (!checkpoint.ok()) {
      verified = false;
      report.Bool("checkpoint_verifies", false);
      report.String("checkpoint_error", std::string(checkpoint.status().message()));
    } else {
      const bool belongs = checkpoint->run_id == state.run_id &&
                           checkpoint->model_type == state.model_type &&
                           checkpoint->model_fingerprint == state.model_fingerprint &&
                           checkpoint->step < state.next_step;
      if (!belongs) verified = false;
      report.Bool("checkpoint_verifies", belongs);
      report.Integer("checkpoint_step", checkpoint->step);
    }
  }

  return verified;
}

// What the directory serves: one vipsd (or a job's coordinator), a
// federated aggregator or a holder — from status.json, else from the ledger
// (a holder's records its aggregator run). A holder's rounds: the last one
// it masked and those charged (the ledger), and this process's by outcome
// (status.json).
void ReportRole(const LedgerState& state, const std::optional<nlohmann::json>& daemon_status,
                const StatusNumber& number_in_status, Report& report) {
  auto text_in_status = [&](const char* key) -> std::optional<std::string> {
    if (!daemon_status.has_value()) return std::nullopt;
    auto it = daemon_status->find(key);
    if (it == daemon_status->end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  std::string role = text_in_status("role").value_or(
      state.federation_run.empty() ? "unknown (no status.json)" : "holder");
  report.String("role", role);
  if (role != "holder") return;
  if (auto id = text_in_status("holder_id")) report.String("holder_id", *id);
  if (!state.federation_run.empty()) report.String("aggregator_run", state.federation_run);
  report.Integer("last_round_masked", state.next_step - 1);
  report.Integer("rounds_charged", state.accountant.steps());
  if (auto stopped = text_in_status("holder_stopped"); stopped.has_value() && !stopped->empty()) {
    report.String("stopped_for_run", *stopped);
  }
  for (const char* key : {"rounds_shared", "rounds_declined", "rounds_withheld"}) {
    if (auto n = number_in_status(key)) {
      report.Integer(std::string(key) + "_this_run", static_cast<int64_t>(*n));
    }
  }
}

// The running daemon's public view (status.json).
void ReportDaemon(const nlohmann::json& daemon_status, const StatusNumber& number_in_status,
                  Report& report) {
  // The running daemon (status.json).
  {
    const auto pid = number_in_status("pid");
    const bool alive = pid.has_value() && ProcessAlive(static_cast<int64_t>(*pid));
    report.Bool("daemon_running", alive);
    if (alive) report.Integer("daemon_pid", static_cast<int64_t>(*pid));
    if (auto step = number_in_status("last_release_step"); step.has_value() && *step > 0) {
      report.Integer("last_release_step", static_cast<int64_t>(*step));
      if (auto time = number_in_status("last_release_time")) report.Number("last_release_time", *time);
    }
    if (auto it = daemon_status.find("halted"); it != daemon_status.end() && it->is_boolean()) {
      report.Bool("halted", it->get<bool>());
    }
    if (auto it = daemon_status.find("ledger_failing");
        it != daemon_status.end() && it->is_boolean()) {
      report.Bool("ledger_failing", it->get<bool>());
    }
  }
}

}  // namespace

StatusOr<StateStatusOutput> StateStatus(const StateStatusOptions& options) {
  if (options.delta.has_value() && !(*options.delta > 0 && *options.delta < 1)) {
    return InvalidArgumentError("--delta must be in (0, 1)");
  }
  const std::string& dir = options.directory;
  const std::string ledger_path = dir + "/ledger";
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    return NotFoundError(dir + " is not a directory");
  }
  if (!std::filesystem::exists(ledger_path, error)) {
    return NotFoundError(dir + " holds no ledger (not a vipsd state directory, or no start "
                               "has committed one yet)");
  }
  Report report;
  StateStatusOutput output;
  report.String("state_directory", dir);

  // status.json: the running daemon's public view (optional).
  std::optional<nlohmann::json> daemon_status;
  if (auto bytes = connectors::ReadWholeFile(dir + "/status.json"); bytes.ok()) {
    auto parsed = nlohmann::json::parse(*bytes, nullptr, false);
    if (parsed.is_object()) daemon_status = std::move(parsed);
  }
  auto number_in_status = [&](const char* key) -> std::optional<double> {
    if (!daemon_status.has_value()) return std::nullopt;
    auto it = daemon_status->find(key);
    if (it == daemon_status->end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };

  auto bytes = connectors::ReadWholeFile(ledger_path);
  StatusOr<LedgerState> decoded =
      bytes.ok() ? Ledger::Decode(*bytes, ledger_path) : StatusOr<LedgerState>(bytes.status());
  report.Bool("ledger_verifies", decoded.ok());
  if (!decoded.ok()) {
    report.String("ledger_error", std::string(decoded.status().message()));
    output.text = options.json ? report.Json() : report.Text();
    return output;
  }
  const LedgerState& state = *decoded;
  bool verified = true;
  ReportRole(state, daemon_status, number_in_status, report);
  ReportLedger(state, options.delta, number_in_status, report);
  ReportStreams(state, report);
  if (!ReportCheckpoint(dir + "/checkpoint", state, report)) verified = false;
  if (daemon_status.has_value()) ReportDaemon(*daemon_status, number_in_status, report);
  output.verified = verified;
  output.text = options.json ? report.Json() : report.Text();
  return output;
}

}  // namespace vipsd::daemon
