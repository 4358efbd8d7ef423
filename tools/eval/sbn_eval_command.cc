#include "tools/eval/sbn_eval_command.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <ostream>
#include <set>
#include <stdexcept>
#include <variant>
#include <vector>

#include "connectors/decode/sbn_record_decoder.h"
#include "connectors/file/file_util.h"
#include "core/models/sbn.h"
#include "core/models/sbn_eval.h"
#include "core/release/release.h"
#include "tools/eval/eval_common.h"

namespace vipsd::tools {
namespace {

constexpr const char* kUsage =
    "usage: vipsd-eval RELEASE_DIR --test FILE [--train FILE] [--samples S] [--seed N] "
    "[--threads T] [--estep-iterations I] [--estep-tolerance E]\n";

int BadFlag(std::ostream& err, const std::string& message) {
  err << "vipsd-eval: " << message << "\n" << kUsage;
  return 2;
}

struct ReadResult {
  std::vector<std::vector<double>> records;
  int64_t rejected = 0;
};

StatusOr<ReadResult> ReadRecords(const std::string& path, int64_t visible) {
  VIPSD_ASSIGN_OR_RETURN(std::string text,
                         connectors::ReadRegularFile(path, connectors::kMaxDataFileBytes));
  std::istringstream file(std::move(text));
  const auto decoder = connectors::NewSbnRecordDecoder(visible);
  ReadResult result;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    connectors::RecordDecodeResult decoded = decoder->Decode(line);
    if (auto* record = std::get_if<model::Record>(&decoded)) {
      result.records.push_back(std::move(record->features));
    } else {
      ++result.rejected;
    }
  }
  if (file.bad()) return UnavailableError("error reading " + path);
  return result;
}

// Parses an integer flag into `value` if present; false if it is not an
// integer in [low, high]. Absent: true, `value` unchanged.
bool ParseInt(const std::map<std::string, std::string>& flags, const std::string& flag,
              int64_t low, int64_t high, int64_t& value) {
  const auto it = flags.find(flag);
  if (it == flags.end()) return true;
  try {
    size_t used = 0;
    value = std::stoll(it->second, &used);
    return used == it->second.size() && value >= low && value <= high;
  } catch (...) {
    return false;
  }
}

int RunSbnEval(const std::string& release_dir, const nlohmann::json& manifest,
               const std::map<std::string, std::string>& flags, std::ostream& out,
               std::ostream& err) {
  static const std::set<std::string> kFlags = {"--test",    "--train",   "--samples",
                                               "--seed",    "--threads", "--estep-iterations",
                                               "--estep-tolerance"};
  for (const auto& [flag, value] : flags) {
    if (!kFlags.count(flag)) return BadFlag(err, "unknown flag " + flag + " for an sbn release");
  }
  const auto test_flag = flags.find("--test");
  if (test_flag == flags.end()) return BadFlag(err, "--test is required for an sbn release");
  models::SbnEvalOptions options;
  int64_t samples = options.importance_samples, seed = 0, threads = 1,
          iterations = options.estep_max_iterations;
  if (!ParseInt(flags, "--samples", 0, 1000000, samples)) {
    return BadFlag(err, "--samples must be an integer in [0, 1000000]");
  }
  if (!ParseInt(flags, "--seed", 0, INT64_MAX, seed)) {
    return BadFlag(err, "--seed must be a non-negative integer");
  }
  if (!ParseInt(flags, "--threads", 1, 256, threads)) {
    return BadFlag(err, "--threads must be an integer in [1, 256]");
  }
  if (!ParseInt(flags, "--estep-iterations", 1, 100000, iterations)) {
    return BadFlag(err, "--estep-iterations must be an integer in [1, 100000]");
  }
  if (const auto it = flags.find("--estep-tolerance"); it != flags.end()) {
    try {
      size_t used = 0;
      options.estep_tolerance = std::stod(it->second, &used);
      if (used != it->second.size() || !(options.estep_tolerance > 0) ||
          !std::isfinite(options.estep_tolerance)) {
        throw std::invalid_argument("tolerance");
      }
    } catch (...) {
      return BadFlag(err, "--estep-tolerance must be a finite number > 0");
    }
  }
  options.importance_samples = static_cast<int>(samples);
  options.seed = static_cast<uint64_t>(seed);
  options.threads = static_cast<int>(threads);
  options.estep_max_iterations = static_cast<int>(iterations);

  std::vector<model::NamedArray> arrays;
  for (const char* name : {"w_mean", "w_covariance", "b_mean", "c_mean", "c_variance"}) {
    auto array = ReadReleaseArray(release_dir, name);
    if (!array.ok()) return FailEval(err, array.status());
    arrays.push_back({array->name, array->shape, std::move(array->data)});
  }
  auto expectations = models::SbnExpectationsFromRelease(arrays);
  if (!expectations.ok()) {
    return FailEval(err, Status(expectations.status().code(),
                            release_dir + ": " + expectations.status().message()));
  }
  const int64_t visible = expectations->visible;
  if (manifest.contains("dimensions") && manifest["dimensions"].is_object() &&
      (manifest["dimensions"].value("J", visible) != visible ||
       manifest["dimensions"].value("K", expectations->hidden) != expectations->hidden)) {
    return FailEval(err, InvalidArgumentError(release_dir +
                                          "/manifest.json: dimensions J, K differ from w_mean.npy"));
  }

  auto test = ReadRecords(test_flag->second, visible);
  if (!test.ok()) return FailEval(err, test.status());
  auto evaluation = models::EvaluateSbnHeldOut(*expectations, test->records, options);
  if (!evaluation.ok()) {
    return FailEval(err, Status(evaluation.status().code(),
                            test_flag->second + ": " + evaluation.status().message()));
  }
  std::string marginal_source = "test";
  ReadResult train;
  if (const auto it = flags.find("--train"); it != flags.end()) {
    auto read = ReadRecords(it->second, visible);
    if (!read.ok()) return FailEval(err, read.status());
    train = std::move(*read);
    marginal_source = "train";
    if (train.records.empty()) {
      return FailEval(err, InvalidArgumentError(it->second + ": no valid records"));
    }
  }
  auto baseline = models::SbnMarginalBaseline(
      marginal_source == "train" ? train.records : test->records, test->records);
  if (!baseline.ok()) return FailEval(err, baseline.status());

  nlohmann::json result = {
      {"model_type", "sbn"},
      {"release_id", manifest.value("release_id", "")},
      {"step", manifest.value("step", 0)},
      {"epsilon_spent", manifest.value("epsilon_spent", 0.0)},
      {"reconstruction", "sampled_z"},
      {"reconstruction_accuracy", evaluation->accuracy_sampled},
      {"reconstruction_accuracy_mean_z", evaluation->accuracy_mean},
      {"importance_samples", evaluation->importance_samples},
      {"marginal_baseline_accuracy", baseline->accuracy},
      {"marginal_baseline_loglik_per_record", baseline->loglik_per_record},
      {"marginal_source", marginal_source},
      {"records", evaluation->records},
      {"rejected_records", test->rejected},
      {"train_records", marginal_source == "train" ? baseline->train_records : 0},
  };
  if (evaluation->importance_samples > 0) {
    result["loglik_estimator"] = "importance_sampling_plugin";
    result["heldout_loglik_per_record"] = evaluation->loglik_per_record;
    result["heldout_loglik_per_pixel"] = evaluation->loglik_per_pixel;
  }
  out << result.dump() << "\n";
  return 0;
}

}  // namespace

std::optional<int> MaybeRunSbnEval(const std::string& release_dir,
                                   const std::map<std::string, std::string>& flags,
                                   std::ostream& out, std::ostream& err) {
  return RunForModelType(release_dir, "sbn", err, [&](const nlohmann::json& manifest) {
    return RunSbnEval(release_dir, manifest, flags, out, err);
  });
}

}  // namespace vipsd::tools
