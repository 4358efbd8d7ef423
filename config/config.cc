#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

namespace vipsd::config {
namespace {

// A mapping node with its path, whose keys are consumed as they are read;
// whatever is left at the end is an unknown key.
class Section {
 public:
  Section(const std::string& file, YAML::Node node, std::string path)
      : file_(file), node_(std::move(node)), path_(std::move(path)) {}

  Status Check() {
    if (!node_.IsMap()) return Error(node_, path_.empty() ? "the file" : path_, "must be a mapping");
    std::set<std::string> seen;
    for (const auto& entry : node_) {
      if (!entry.first.IsScalar()) return Error(entry.first, path_, "keys must be plain names");
      const std::string key = entry.first.Scalar();
      if (!seen.insert(key).second) {
        return Error(entry.first, Join(key), "duplicate key");
      }
      unread_[key] = entry.first.Mark().line + 1;
    }
    return Status::Ok();
  }

  bool Has(const std::string& key) const { return node_[key].IsDefined() && !node_[key].IsNull(); }

  Status Sub(const std::string& key, bool required, std::optional<Section>* out) {
    unread_.erase(key);
    if (!Has(key)) {
      if (required) return Missing(key);
      return Status::Ok();
    }
    out->emplace(file_, node_[key], Join(key));
    return (*out)->Check();
  }

  Status Number(const std::string& key, bool required, const std::function<bool(double)>& ok,
                const std::string& allowed, double* out) {
    unread_.erase(key);
    if (!Has(key)) return required ? Missing(key) : Status::Ok();
    const YAML::Node value = node_[key];
    if (!value.IsScalar()) return Error(value, Join(key), "must be " + allowed);
    const std::string text = value.Scalar();
    char* end = nullptr;
    errno = 0;
    const double parsed = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE ||
        !std::isfinite(parsed) || !ok(parsed)) {
      return Error(value, Join(key), "must be " + allowed + ", got '" + text + "'");
    }
    *out = parsed;
    return Status::Ok();
  }

  Status Integer(const std::string& key, bool required, int64_t low, int64_t high,
                 int64_t* out) {
    const std::string allowed =
        "a whole number in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
    double value = static_cast<double>(*out);
    VIPSD_RETURN_IF_ERROR(Number(
        key, required,
        [&](double x) {
          return std::floor(x) == x && x >= static_cast<double>(low) &&
                 x <= static_cast<double>(high);
        },
        allowed, &value));
    *out = static_cast<int64_t>(value);
    return Status::Ok();
  }

  Status String(const std::string& key, bool required, const std::vector<std::string>& choices,
                std::string* out) {
    unread_.erase(key);
    if (!Has(key)) return required ? Missing(key) : Status::Ok();
    const YAML::Node value = node_[key];
    std::string allowed;
    for (const auto& choice : choices) allowed += (allowed.empty() ? "" : ", ") + choice;
    if (!value.IsScalar() || value.Scalar().empty()) {
      return Error(value, Join(key),
                   choices.empty() ? "must be a non-empty string" : "must be one of " + allowed);
    }
    if (!choices.empty() &&
        std::find(choices.begin(), choices.end(), value.Scalar()) == choices.end()) {
      return Error(value, Join(key),
                   "must be one of " + allowed + ", got '" + value.Scalar() + "'");
    }
    *out = value.Scalar();
    return Status::Ok();
  }

  // Unknown keys: everything not read.
  Status Finish() {
    if (unread_.empty()) return Status::Ok();
    const auto& [key, line] = *unread_.begin();
    std::ostringstream message;
    message << file_ << ":" << line << ": " << Join(key) << ": unknown key";
    return InvalidArgumentError(message.str());
  }

  Status Error(const YAML::Node& node, const std::string& key, const std::string& what) const {
    std::ostringstream message;
    message << file_ << ":" << node.Mark().line + 1 << ": " << key << ": " << what;
    return InvalidArgumentError(message.str());
  }

  Status Missing(const std::string& key) const {
    std::ostringstream message;
    message << file_ << ":" << node_.Mark().line + 1 << ": " << Join(key)
            << ": required key is missing";
    return InvalidArgumentError(message.str());
  }

  Status ErrorAt(const std::string& key, const std::string& what) const {
    const YAML::Node value = node_[key];
    return Error(value.IsDefined() ? value : node_, Join(key), what);
  }

  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  std::string file_;
  YAML::Node node_;
  std::string path_;
  std::map<std::string, int> unread_;  // key → line
};

auto Positive = [](double x) { return x > 0; };

std::string Resolve(const std::string& file, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(file).parent_path() / p).lexically_normal().string();
}

}  // namespace

StatusOr<VipsdConfig> ParseConfig(std::string_view yaml_text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    std::ostringstream message;
    message << file << ":" << e.mark.line + 1 << ": YAML syntax error: " << e.msg;
    return InvalidArgumentError(message.str());
  }
  VipsdConfig config;
  config.file = file;
  Section top(file, root, "");
  VIPSD_RETURN_IF_ERROR(top.Check());

  // model
  std::optional<Section> model, lda;
  VIPSD_RETURN_IF_ERROR(top.Sub("model", true, &model));
  VIPSD_RETURN_IF_ERROR(model->String("type", true, {"lda"}, &config.model_type));
  VIPSD_RETURN_IF_ERROR(model->Sub("lda", true, &lda));
  models::LdaConfig& l = config.lda;
  VIPSD_RETURN_IF_ERROR(lda->Integer("topics", true, 1, 100000, &l.num_topics));
  VIPSD_RETURN_IF_ERROR(lda->String("vocabulary", true, {}, &config.vocabulary_path));
  config.vocabulary_path = Resolve(file, config.vocabulary_path);
  VIPSD_RETURN_IF_ERROR(lda->Number("alpha", true, Positive, "a number > 0", &l.alpha));
  VIPSD_RETURN_IF_ERROR(lda->Number("eta", true, Positive, "a number > 0", &l.eta));
  VIPSD_RETURN_IF_ERROR(lda->Integer("resample_length", false, 0, 1000000, &l.resample_length));
  VIPSD_RETURN_IF_ERROR(lda->Number("clip_fraction", false,
                                    [](double x) { return x > 0 && x <= 1; }, "a number in (0, 1]",
                                    &l.clip_fraction));
  int64_t iterations = l.estep_max_iterations;
  VIPSD_RETURN_IF_ERROR(lda->Integer("estep_max_iterations", false, 1, 100000, &iterations));
  l.estep_max_iterations = static_cast<int>(iterations);
  VIPSD_RETURN_IF_ERROR(lda->Number("estep_tolerance", false, Positive, "a number > 0",
                                    &l.estep_tolerance));
  int64_t init_seed = 0;
  VIPSD_RETURN_IF_ERROR(lda->Integer("init_seed", false, 0, int64_t{1} << 53, &init_seed));
  l.init_seed = static_cast<uint64_t>(init_seed);
  VIPSD_RETURN_IF_ERROR(lda->Finish());
  VIPSD_RETURN_IF_ERROR(model->Finish());

  // privacy
  std::optional<Section> privacy;
  svi::DriverConfig& d = config.driver;
  VIPSD_RETURN_IF_ERROR(top.Sub("privacy", true, &privacy));
  VIPSD_RETURN_IF_ERROR(privacy->Number("noise_multiplier", true,
                                        [](double x) { return x >= 0; },
                                        "a number >= 0 (0 = non-private)", &d.noise_multiplier));
  VIPSD_RETURN_IF_ERROR(privacy->Number("sampling_rate", true,
                                        [](double x) { return x > 0 && x <= 1; },
                                        "a number in (0, 1]", &d.sampling_rate));
  VIPSD_RETURN_IF_ERROR(privacy->Number("delta", config.is_private(),
                                        [](double x) { return x > 0 && x < 1; },
                                        "a number in (0, 1)", &d.delta));
  VIPSD_RETURN_IF_ERROR(privacy->Number("epsilon_ceiling", config.is_private(), Positive,
                                        "a number > 0", &d.epsilon_ceiling));
  std::string noise = "secure";
  VIPSD_RETURN_IF_ERROR(privacy->String("noise", false, {"secure", "fixed_seed"}, &noise));
  config.noise_mode = noise == "secure" ? NoiseMode::kSecure : NoiseMode::kFixedSeed;
  int64_t noise_seed = 0;
  VIPSD_RETURN_IF_ERROR(privacy->Integer("noise_seed", false, 0, int64_t{1} << 53, &noise_seed));
  config.noise_seed = static_cast<uint64_t>(noise_seed);
  if (privacy->Has("noise_seed") && config.noise_mode == NoiseMode::kSecure) {
    return privacy->ErrorAt("noise_seed", "only allowed with noise: fixed_seed");
  }
  if (config.is_private() && config.lda.resample_length == 0) {
    return lda->ErrorAt("resample_length",
                        "must be >= 1 when privacy.noise_multiplier > 0 (0 has no "
                        "sensitivity bound)");
  }
  VIPSD_RETURN_IF_ERROR(privacy->Finish());

  // schedule
  std::optional<Section> schedule;
  VIPSD_RETURN_IF_ERROR(top.Sub("schedule", true, &schedule));
  VIPSD_RETURN_IF_ERROR(schedule->Number("tau0", false, [](double x) { return x >= 0; },
                                         "a number >= 0", &d.tau0));
  VIPSD_RETURN_IF_ERROR(schedule->Number("kappa", false,
                                         [](double x) { return x > 0.5 && x <= 1; },
                                         "a number in (0.5, 1]", &d.kappa));
  int64_t threads = d.threads;
  VIPSD_RETURN_IF_ERROR(schedule->Integer("threads", false, 1, 256, &threads));
  d.threads = static_cast<int>(threads);
  VIPSD_RETURN_IF_ERROR(schedule->Integer("max_steps", false, 0, int64_t{1} << 40,
                                          &config.max_steps));
  VIPSD_RETURN_IF_ERROR(schedule->Number("max_epochs", false, [](double x) { return x >= 0; },
                                         "a number >= 0 (0 = no limit)", &config.max_epochs));
  if (config.max_steps == 0 && config.max_epochs == 0 && !config.is_private()) {
    return schedule->ErrorAt("max_steps",
                             "a non-private run needs max_steps or max_epochs > 0 (no "
                             "privacy ceiling stops it)");
  }
  VIPSD_RETURN_IF_ERROR(schedule->Finish());

  // source, sink, state, dead letters
  std::optional<Section> source, sink, state, dead_letter;
  std::string type;
  VIPSD_RETURN_IF_ERROR(top.Sub("source", true, &source));
  VIPSD_RETURN_IF_ERROR(source->String("type", true, {"file"}, &type));
  VIPSD_RETURN_IF_ERROR(source->String("path", true, {}, &config.source_path));
  config.source_path = Resolve(file, config.source_path);
  VIPSD_RETURN_IF_ERROR(source->Finish());
  VIPSD_RETURN_IF_ERROR(top.Sub("sink", true, &sink));
  VIPSD_RETURN_IF_ERROR(sink->String("type", true, {"file"}, &type));
  VIPSD_RETURN_IF_ERROR(sink->String("directory", true, {}, &config.sink_directory));
  config.sink_directory = Resolve(file, config.sink_directory);
  VIPSD_RETURN_IF_ERROR(sink->Integer("publish_every", false, 1, int64_t{1} << 40,
                                      &config.publish_every));
  VIPSD_RETURN_IF_ERROR(sink->Finish());
  VIPSD_RETURN_IF_ERROR(top.Sub("state", true, &state));
  VIPSD_RETURN_IF_ERROR(state->String("directory", true, {}, &config.state_directory));
  config.state_directory = Resolve(file, config.state_directory);
  VIPSD_RETURN_IF_ERROR(state->Finish());
  VIPSD_RETURN_IF_ERROR(top.Sub("dead_letter", true, &dead_letter));
  VIPSD_RETURN_IF_ERROR(dead_letter->String("path", true, {}, &config.dead_letter_path));
  config.dead_letter_path = Resolve(file, config.dead_letter_path);
  VIPSD_RETURN_IF_ERROR(dead_letter->Finish());
  VIPSD_RETURN_IF_ERROR(top.Finish());
  return config;
}

StatusOr<VipsdConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open the configuration file");
  std::ostringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path);
}

}  // namespace vipsd::config
