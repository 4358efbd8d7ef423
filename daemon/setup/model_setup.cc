#include "daemon/setup/model_setup.h"

#include <filesystem>

#include <ctime>
#include <map>
#include <sstream>

#include "connectors/decode/blr_record_decoder.h"
#include "connectors/decode/sbn_record_decoder.h"
#include "connectors/decode/unit_decoder.h"
#include "connectors/file/file_util.h"
#include "connectors/file/release_reader.h"
#include "core/base/format.h"
#include "core/models/blr.h"
#include "core/models/lda.h"
#include "core/models/sbn.h"

namespace vipsd::daemon {
namespace {

// model.blr.prior_groups as fingerprints spell it: "1,5,9,".
std::string GroupSizes(const std::vector<double>& sizes) {
  std::string out;
  for (double size : sizes) out += std::to_string(static_cast<int64_t>(size)) + ",";
  return out;
}

std::string ModelFingerprint(const model::Model& model, const std::string& vocabulary_fp,
                             const std::string& public_prior_fp,
                             const config::VipsdConfig& config) {
  std::ostringstream text;
  text << "model " << model.type();
  for (const auto& [name, value] : model.dimensions()) text << " " << name << "=" << value;
  text << " vocabulary=" << vocabulary_fp;
  // A model that starts from a public prior has another history.
  if (!public_prior_fp.empty()) text << " public_prior=" << public_prior_fp;
  // And so does one that starts from another share of it (LDA's blend).
  if (!public_prior_fp.empty() && model.type() == "lda") {
    text << " public_start_weight=" << ShortestNumber(config.lda.public_start_weight);
  }
  // So does one whose coefficients share their prior precisions otherwise
  // (and its checkpoint holds one q(α) per group).
  if (!config.blr_prior_groups.empty()) {
    text << " prior_groups=" << GroupSizes(config.blr_prior_groups);
  }
  return release::Blake2bHex(text.str());
}

std::string AbsolutePath(const std::string& path) {
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

// model.public_prior: reads and checks the public release, sets it on the
// model, and fills the bundle's digest and source.
Status ApplyPublicPrior(const config::VipsdConfig& config, ModelBundle& bundle) {
  const std::string where = config.file + ":" +
                            std::to_string(config.line_of("model.public_prior.release")) +
                            ": model.public_prior.release: " + config.public_prior_path + ": ";
  auto manifest = connectors::ReadRegularFile(config.public_prior_path + "/manifest.json",
                                              connectors::kMaxManifestBytes);
  if (!manifest.ok()) {
    return InvalidArgumentError(where + "not a vipsd release directory (" +
                                std::string(manifest.status().message()) + ")");
  }
  // Decoded from the bytes that are hashed below (the manifest pins every
  // array by its BLAKE2b-256), so the digest names exactly what was read.
  const std::string directory = config.public_prior_path;
  auto release = connectors::DecodeReleaseFiles(
      *manifest,
      [&directory](const std::string& name) {
        return connectors::ReadWholeFile(directory + "/" + name);
      },
      directory);
  if (!release.ok()) return InvalidArgumentError(where + std::string(release.status().message()));
  const release::ReleaseMetadata& m = release->metadata;
  if (m.model_type != bundle.model->type()) {
    return InvalidArgumentError(where + "is a " + m.model_type + " release; the model is " +
                                bundle.model->type());
  }
  if (m.is_private) {
    return InvalidArgumentError(
        where + "is a private release (is_private: true): a model learnt from private records "
                "is not public knowledge, and this run's epsilon would not count what it "
                "spent; fit the public prior with a non-private run on public data");
  }
  for (const auto& [name, value] : bundle.model->dimensions()) {
    if (name == "N") continue;  // the words drawn per document may differ
    bool same = false;
    for (const auto& [their_name, their_value] : m.dimensions) {
      same = same || (their_name == name && their_value == value);
    }
    if (!same) {
      return InvalidArgumentError(where + "its dimensions differ from the model's (" + name +
                                  " = " + std::to_string(value) + ")");
    }
  }
  if (m.vocabulary_fingerprint != bundle.vocabulary_fingerprint) {
    return InvalidArgumentError(where + "was fitted with another vocabulary (fingerprint " +
                                m.vocabulary_fingerprint + ", model.lda.vocabulary " +
                                bundle.vocabulary_fingerprint + ")");
  }
  std::vector<model::NamedArray> arrays;
  for (auto& array : release->arrays) {
    arrays.push_back({array.name, array.shape, std::move(array.data)});
  }
  const Status set = bundle.model->SetPublicPrior(arrays);
  if (!set.ok()) return InvalidArgumentError(where + std::string(set.message()));
  bundle.public_prior_fingerprint = release::Blake2bHex(*manifest);
  bundle.public_prior_source = AbsolutePath(config.public_prior_path);
  return Status::Ok();
}

}  // namespace

std::string UtcNow() { return UtcTime(static_cast<double>(std::time(nullptr))); }

std::string UtcTime(double unix_seconds) {
  const auto now = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

StatusOr<ModelBundle> BuildModel(const config::VipsdConfig& config) {
  ModelBundle bundle;
  if (config.model_type == "lda") {
    const std::string where = config.file + ":" +
                              std::to_string(config.line_of("model.lda.vocabulary")) +
                              ": model.lda.vocabulary: ";
    auto vocabulary_text = connectors::ReadRegularFile(config.vocabulary_path, connectors::kMaxVocabularyBytes);
    if (!vocabulary_text.ok()) {
      return InvalidArgumentError(where + std::string(vocabulary_text.status().message()));
    }
    auto vocabulary = text::Vocabulary::Parse(*vocabulary_text);
    if (!vocabulary.ok()) {
      return InvalidArgumentError(where + config.vocabulary_path + ": " +
                                  std::string(vocabulary.status().message()));
    }
    bundle.vocabulary = std::make_unique<text::Vocabulary>(std::move(*vocabulary));
    models::LdaConfig lda = config.lda;
    lda.vocabulary_size = bundle.vocabulary->size();
    // The M-step uses the driver's workers (thread-count independent result).
    lda.mstep_threads = config.driver.threads;
    VIPSD_ASSIGN_OR_RETURN(auto model, models::LdaModel::Create(lda));
    bundle.model = std::move(model);
    bundle.decoder = connectors::NewLdaRecordDecoder(*bundle.vocabulary);
    bundle.vocabulary_fingerprint = bundle.vocabulary->Fingerprint();
  } else if (config.model_type == "blr") {
    VIPSD_ASSIGN_OR_RETURN(auto model, models::BlrModel::Create(config.blr));
    bundle.model = std::move(model);
    const auto rule = connectors::ParseNormRule(config.blr_norm_rule);
    if (!rule.has_value()) {
      return InvalidArgumentError("model.blr.norm_rule must be rescale or reject");
    }
    bundle.decoder = connectors::NewBlrRecordDecoder(config.blr.dim, *rule);
  } else if (config.model_type == "sbn") {
    VIPSD_ASSIGN_OR_RETURN(auto model, models::SbnModel::Create(config.sbn));
    bundle.model = std::move(model);
    bundle.decoder = connectors::NewSbnRecordDecoder(config.sbn.visible);
  } else {
    return InvalidArgumentError("model.type '" + config.model_type + "' is not supported");
  }
  if (config.privacy_unit != config::PrivacyUnit::kRecord) {
    // Unit-level privacy: every record also carries its unit's digest.
    bundle.decoder = connectors::NewUnitDecoder(std::move(bundle.decoder),
                                                config.privacy_unit == config::PrivacyUnit::kKey
                                                    ? connectors::UnitSource::kKey
                                                    : connectors::UnitSource::kField,
                                                config.unit_field, config.unit_partitioner);
  }
  if (!config.public_prior_path.empty()) {
    VIPSD_RETURN_IF_ERROR(ApplyPublicPrior(config, bundle));
  }
  bundle.model_fingerprint = ModelFingerprint(*bundle.model, bundle.vocabulary_fingerprint,
                                              bundle.public_prior_fingerprint, config);
  bundle.record_settings =
      RecordSettings(config, bundle.vocabulary_fingerprint, bundle.public_prior_fingerprint);
  return bundle;
}

std::string RecordSettings(const config::VipsdConfig& config,
                           const std::string& vocabulary_fingerprint,
                           const std::string& public_prior_fingerprint) {
  std::string out;
  for (const auto& [path, value] : config::AppliedKeyValues(config)) {
    if (path == "model.lda.vocabulary") {
      out += path + " (BLAKE2b-256 of its terms): " + vocabulary_fingerprint + "\n";
    } else if (path == "model.public_prior.release") {
      out += path + " (BLAKE2b-256 of its manifest): " + public_prior_fingerprint + "\n";
    } else if (path == "model.public_prior.weight" && config.public_prior_path.empty()) {
      continue;  // its default, and no public start to weigh
    } else if (path.rfind("model.", 0) == 0 || path == "source.max_record_bytes" ||
               path == "source.timestamps" ||
               path.rfind("privacy.unit", 0) == 0 || path == "privacy.max_records_per_unit") {
      out += path + ": " + value + "\n";
    }
  }
  return out;
}

namespace {

std::map<std::string, std::string> SettingsByKey(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(": ");
    out[line.substr(0, colon)] = colon == std::string::npos ? "" : line.substr(colon + 2);
  }
  return out;
}

}  // namespace

std::string SettingsDifference(const std::string& theirs, const std::string& ours,
                               const std::string& their_name, const std::string& our_name) {
  const auto a = SettingsByKey(theirs);
  const auto b = SettingsByKey(ours);
  std::string out;
  auto add = [&out](const std::string& text) { out += (out.empty() ? "" : "; ") + text; };
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    if (it == b.end()) {
      add(key + ": " + their_name + " " + value + ", not set by " + our_name);
    } else if (it->second != value) {
      add(key + ": " + their_name + " " + value + ", " + our_name + " " + it->second);
    }
  }
  for (const auto& [key, value] : b) {
    if (a.count(key) == 0) add(key + ": not set by " + their_name + ", " + our_name + " " + value);
  }
  return out.empty() ? "in their order" : out;
}

std::string ConfigFingerprint(const config::VipsdConfig& c) {
  std::ostringstream text;
  text.precision(17);
  text << "model=" << c.model_type;
  if (c.model_type == "lda") {
    text << " K=" << c.lda.num_topics << " alpha=" << c.lda.alpha << " eta=" << c.lda.eta
         << " N=" << c.lda.resample_length << " a=" << c.lda.clip_fraction
         << " iters=" << c.lda.estep_max_iterations << " tol=" << c.lda.estep_tolerance
         << " seed=" << c.lda.init_seed;
    // The public start's share (no public prior: the text of before it existed).
    if (!c.public_prior_path.empty()) text << " public_weight=" << c.lda.public_start_weight;
  } else if (c.model_type == "blr") {
    text << " d=" << c.blr.dim << " a0=" << c.blr.prior_shape << " b0=" << c.blr.prior_rate
         << " floor=" << c.blr.eigenvalue_floor << " norm_rule=" << c.blr_norm_rule;
    // One group: the text of before groups existed.
    if (!c.blr_prior_groups.empty()) text << " groups=" << GroupSizes(c.blr_prior_groups);
  } else if (c.model_type == "sbn") {
    const auto& f = c.sbn.clip_fractions;
    text << " J=" << c.sbn.visible << " K=" << c.sbn.hidden
         << " prior_w=" << c.sbn.weight_prior_precision
         << " prior_c=" << c.sbn.visible_bias_prior_precision
         << " prior_b=" << c.sbn.hidden_bias_prior_precision
         << " init_std=" << c.sbn.init_weight_std << " init_var=" << c.sbn.init_variance
         << " iters=" << c.sbn.estep_max_iterations << " tol=" << c.sbn.estep_tolerance
         << " seed=" << c.sbn.init_seed << " clip=" << f.count << "," << f.z << "," << f.y << ","
         << f.xi << "," << f.xi_z << "," << f.y_z << "," << f.xi_zz;
  }
  text << " q=" << c.driver.mechanism.sampling_rate
       << " sigma=" << c.driver.mechanism.noise_multiplier << " tau0=" << c.driver.tau0
       << " kappa=" << c.driver.kappa << " delta=" << c.driver.delta
       << " ceiling=" << c.driver.epsilon_ceiling
       << " accounting=" << (c.accounting == config::Accounting::kGlobal ? "global" : "residency")
       << " window=" << c.window_steps;
  if (c.privacy_unit != config::PrivacyUnit::kRecord) {  // record mode: as before units
    text << " unit=" << config::PrivacyUnitName(c.privacy_unit);
    if (!c.unit_field.empty()) text << ":" << c.unit_field;
    text << " max_records_per_unit=" << c.driver.max_records_per_unit;
  }
  return release::Blake2bHex(text.str());
}

release::Release MakeRelease(const ModelBundle& bundle, const config::VipsdConfig& config,
                             const ReleaseFacts& facts) {
  release::Release out;
  auto& m = out.metadata;
  const bool is_private = config.is_private();
  m.release_id = "step-" + std::to_string(facts.step);
  m.model_type = bundle.model->type();
  m.step = facts.step;
  m.rho = facts.rho;
  m.epsilon_spent = is_private ? facts.epsilon_spent : 0.0;
  m.delta = is_private ? config.driver.delta : 0.0;
  m.noise_multiplier = facts.mechanism.noise_multiplier;
  m.sampling_rate = facts.mechanism.sampling_rate;
  m.accountant = !is_private ? "none" : facts.accountant;
  m.schedule = !is_private ? "none" : facts.schedule;
  m.conversion = !is_private ? "none" : facts.conversion;
  for (const auto& block : bundle.model->statistic_layout().blocks()) {
    m.clip_bounds.emplace_back(block.name, is_private ? block.clip_bound : 0.0);
  }
  m.dimensions = bundle.model->dimensions();
  m.vocabulary_fingerprint = bundle.vocabulary_fingerprint;
  // What a consumer needs to use the model without side channels.
  if (m.model_type == "lda") {
    m.vocabulary_source = AbsolutePath(config.vocabulary_path);
    m.hyperparameters = {{"alpha", config.lda.alpha}, {"eta", config.lda.eta}};
  } else if (m.model_type == "blr") {
    m.hyperparameters = {{"prior_shape", config.blr.prior_shape},
                         {"prior_rate", config.blr.prior_rate}};
  } else if (m.model_type == "sbn") {
    m.hyperparameters = {{"weight_prior_precision", config.sbn.weight_prior_precision},
                         {"visible_bias_prior_precision", config.sbn.visible_bias_prior_precision},
                         {"hidden_bias_prior_precision", config.sbn.hidden_bias_prior_precision}};
  }
  // What the model started from (LDA) or its prior (BLR); empty without one.
  m.public_prior_fingerprint = bundle.public_prior_fingerprint;
  m.public_prior_source = bundle.public_prior_source;
  if (m.model_type == "lda" && !bundle.public_prior_fingerprint.empty()) {
    m.public_prior_weight = config.lda.public_start_weight;
  }
  if (config.privacy_unit != config::PrivacyUnit::kRecord) {
    m.privacy_unit = std::string(config::PrivacyUnitName(config.privacy_unit));
    if (config.privacy_unit == config::PrivacyUnit::kField) m.unit_field = config.unit_field;
    m.max_records_per_unit = config.driver.max_records_per_unit;
  }
  m.config_fingerprint = ConfigFingerprint(config);
  m.is_private = is_private && facts.noise_is_private;
  m.noise_description = is_private ? facts.noise_description : "none (sigma = 0, NOT PRIVATE)";
  m.created_at_utc = facts.created_at > 0 ? UtcTime(facts.created_at) : UtcNow();
  for (auto& array : bundle.model->ReleaseArrays()) {
    out.arrays.push_back({array.name, array.shape, std::move(array.data)});
  }
  return out;
}

}  // namespace vipsd::daemon
