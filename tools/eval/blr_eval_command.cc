#include "tools/eval/blr_eval_command.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <sstream>
#include <ostream>
#include <variant>
#include <vector>

#include "connectors/decode/blr_record_decoder.h"
#include "connectors/file/file_util.h"
#include "core/models/blr_eval.h"
#include "core/release/release.h"
#include "tools/eval/eval_common.h"

namespace vipsd::tools {
namespace {

int RunBlrEval(const std::string& release_dir, const nlohmann::json& manifest,
               const std::map<std::string, std::string>& flags, std::ostream& out,
               std::ostream& err) {
  for (const auto& [flag, value] : flags) {
    if (flag != "--test" && flag != "--norm-rule" && flag != "--reference") {
      err << "vipsd-eval: unknown flag " << flag << " for a blr release\n"
          << "usage: vipsd-eval RELEASE_DIR --test FILE [--norm-rule reject|rescale] "
             "[--reference RELEASE_DIR]\n";
      return 2;
    }
  }
  const auto test = flags.find("--test");
  if (test == flags.end()) {
    err << "vipsd-eval: --test is required for a blr release\n";
    return 2;
  }
  connectors::NormRule rule = connectors::NormRule::kReject;
  if (const auto it = flags.find("--norm-rule"); it != flags.end()) {
    const auto parsed = connectors::ParseNormRule(it->second);
    if (!parsed.has_value()) {
      err << "vipsd-eval: --norm-rule must be reject or rescale\n";
      return 2;
    }
    rule = *parsed;
  }

  std::vector<release::ReleaseArray> arrays;
  for (const char* name : {"mean", "covariance"}) {
    auto array = ReadReleaseArray(release_dir, name);
    if (!array.ok()) return FailEval(err, array.status());
    arrays.push_back(std::move(*array));
  }
  auto posterior = models::BlrPosteriorFromArrays(arrays);
  if (!posterior.ok()) return FailEval(err, posterior.status());
  std::optional<models::BlrCoverage> coverage;
  if (const auto it = flags.find("--reference"); it != flags.end()) {
    std::vector<release::ReleaseArray> reference_arrays;
    for (const char* name : {"mean", "covariance"}) {
      auto array = ReadReleaseArray(it->second, name);
      if (!array.ok()) return FailEval(err, array.status());
      reference_arrays.push_back(std::move(*array));
    }
    auto reference = models::BlrPosteriorFromArrays(reference_arrays);
    if (!reference.ok()) {
      return FailEval(err, Status(reference.status().code(),
                                  it->second + ": " + reference.status().message()));
    }
    auto compared = models::CoverageOfReference(*posterior, *reference);
    if (!compared.ok()) {
      return FailEval(err, Status(compared.status().code(),
                                  it->second + ": " + compared.status().message()));
    }
    coverage = *compared;
  }
  const int64_t dim = posterior->mean.size();
  if (manifest.contains("dimensions") && manifest["dimensions"].is_object() &&
      manifest["dimensions"].value("d", dim) != dim) {
    return FailEval(err, InvalidArgumentError(release_dir +
                                          "/manifest.json: dimensions.d differs from mean.npy"));
  }

  auto test_text = connectors::ReadRegularFile(test->second, connectors::kMaxDataFileBytes);
  if (!test_text.ok()) return FailEval(err, test_text.status());
  std::istringstream file(std::move(*test_text));
  const auto decoder = connectors::NewBlrRecordDecoder(dim, rule);
  std::vector<std::vector<double>> features;
  std::vector<double> labels;
  int64_t rejected = 0;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    connectors::RecordDecodeResult decoded = decoder->Decode(line);
    if (auto* record = std::get_if<model::Record>(&decoded)) {
      features.push_back(std::move(record->features));
      labels.push_back(record->label);
    } else {
      ++rejected;
    }
  }
  if (file.bad()) return FailEval(err, UnavailableError("error reading " + test->second));
  auto evaluation = models::EvaluateBlr(*posterior, features, labels);
  if (!evaluation.ok()) {
    return FailEval(err, Status(evaluation.status().code(),
                            test->second + ": " + evaluation.status().message()));
  }
  nlohmann::json result = {
      {"model_type", "blr"},
      {"release_id", manifest.value("release_id", "")},
      {"step", manifest.value("step", 0)},
      {"epsilon_spent", manifest.value("epsilon_spent", 0.0)},
      {"predictive", "probit_approximation"},
      {"auc", evaluation->auc},
      {"log_loss", evaluation->log_loss},
      {"accuracy", evaluation->accuracy},
      {"records", evaluation->records},
      {"positives", evaluation->positives},
      {"rejected_records", rejected},
  };
  if (coverage.has_value()) {
    result["reference"] = {{"release_dir", flags.at("--reference")},
                           {"coverage_50", coverage->coverage_50},
                           {"coverage_95", coverage->coverage_95},
                           {"sd_ratio_median", coverage->sd_ratio_median},
                           {"coefficients", coverage->coefficients}};
  }
  out << result.dump() << "\n";
  return 0;
}

}  // namespace

std::optional<int> MaybeRunBlrEval(const std::string& release_dir,
                                   const std::map<std::string, std::string>& flags,
                                   std::ostream& out, std::ostream& err) {
  return RunForModelType(release_dir, "blr", err, [&](const nlohmann::json& manifest) {
    return RunBlrEval(release_dir, manifest, flags, out, err);
  });
}

}  // namespace vipsd::tools
