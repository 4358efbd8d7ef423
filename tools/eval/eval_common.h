// What the per-model vipsd-eval commands (blr_eval_command, sbn_eval_command)
// share: the error line, reading one array of a release directory, and the
// dispatch on the manifest's model_type.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::tools {

// Prints "vipsd-eval: <message>" on `err`; returns exit status 1.
int FailEval(std::ostream& err, const Status& status);

// The array `name` of the release in `release_dir` (release::ArrayFileName).
StatusOr<release::ReleaseArray> ReadReleaseArray(const std::string& release_dir,
                                                 const std::string& name);

// When `release_dir` holds a readable manifest whose model_type is
// `model_type`, runs `run(manifest)` and returns its exit status (a manifest
// field of the wrong type is reported on `err`, status 1). Otherwise nullopt,
// so that the caller can try the next model.
std::optional<int> RunForModelType(const std::string& release_dir, const std::string& model_type,
                                   std::ostream& err,
                                   const std::function<int(const nlohmann::json&)>& run);

}  // namespace vipsd::tools
