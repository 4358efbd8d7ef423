#include "tools/eval/eval_common.h"

#include "connectors/file/file_util.h"
#include "connectors/file/release_reader.h"

namespace vipsd::tools {

int FailEval(std::ostream& err, const Status& status) {
  err << "vipsd-eval: " << status.message() << "\n";
  return 1;
}

StatusOr<release::ReleaseArray> ReadReleaseArray(const std::string& release_dir,
                                                 const std::string& name) {
  VIPSD_ASSIGN_OR_RETURN(std::string bytes,
                         connectors::ReadWholeFile(release_dir + "/" +
                                                   release::ArrayFileName(name)));
  return release::DecodeNpy(bytes, name);
}

std::optional<int> RunForModelType(const std::string& release_dir, const std::string& model_type,
                                   std::ostream& err,
                                   const std::function<int(const nlohmann::json&)>& run) {
  auto manifest_text =
      connectors::ReadWholeFile(release_dir + "/" + std::string(release::kManifestFileName));
  if (!manifest_text.ok()) return std::nullopt;
  const nlohmann::json manifest = nlohmann::json::parse(*manifest_text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("model_type") ||
      manifest["model_type"] != model_type) {
    return std::nullopt;
  }
  // The whole release, by the one C++ reader's rules, before any field is used.
  auto release = connectors::ReadReleaseDirectory(release_dir);
  if (!release.ok()) return FailEval(err, release.status());
  try {
    return run(manifest);
  } catch (const nlohmann::json::exception&) {
    return FailEval(err, InvalidArgumentError(release_dir +
                                              "/manifest.json has a field of the wrong type"));
  }
}

}  // namespace vipsd::tools
