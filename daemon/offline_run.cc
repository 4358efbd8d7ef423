#include "daemon/offline_run.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <variant>

#include "connectors/file/dead_letter_file.h"
#include "connectors/file/file_util.h"
#include "connectors/file/jsonl_source.h"
#include "connectors/file/release_file_sink.h"
#include "core/base/log.h"
#include "core/models/lda.h"
#include "core/privacy/secure_noise.h"
#include "core/release/release.h"
#include "core/svi/step_driver.h"
#include "core/text/vocabulary.h"
#include "daemon/ledger.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "offline";

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

// BLAKE2b-256 of the public configuration values that shape a release.
std::string ConfigFingerprint(const config::VipsdConfig& c) {
  std::ostringstream text;
  text.precision(17);
  text << "lda K=" << c.lda.num_topics << " alpha=" << c.lda.alpha << " eta=" << c.lda.eta
       << " N=" << c.lda.resample_length << " a=" << c.lda.clip_fraction
       << " iters=" << c.lda.estep_max_iterations << " tol=" << c.lda.estep_tolerance
       << " seed=" << c.lda.init_seed << " q=" << c.driver.sampling_rate
       << " sigma=" << c.driver.noise_multiplier << " tau0=" << c.driver.tau0
       << " kappa=" << c.driver.kappa << " delta=" << c.driver.delta
       << " ceiling=" << c.driver.epsilon_ceiling;
  return release::Blake2bHex(text.str());
}

}  // namespace

StatusOr<OfflineRunSummary> RunOffline(const config::VipsdConfig& config) {
  // 1. Vocabulary and model.
  VIPSD_ASSIGN_OR_RETURN(std::string vocabulary_text,
                         connectors::ReadWholeFile(config.vocabulary_path));
  auto vocabulary = text::Vocabulary::Parse(vocabulary_text);
  if (!vocabulary.ok()) {
    return InvalidArgumentError(config.vocabulary_path + ": " + vocabulary.status().message());
  }
  models::LdaConfig lda = config.lda;
  lda.vocabulary_size = vocabulary->size();
  VIPSD_ASSIGN_OR_RETURN(auto model, models::LdaModel::Create(lda));

  // 2. Ledger: spent budget and step counter survive restarts.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  VIPSD_ASSIGN_OR_RETURN(auto previous, ledger.Load());
  LedgerState state;
  if (previous.has_value()) state = std::move(*previous);
  // A run may be resumed with different (q, σ) chosen after seeing earlier
  // releases, so the budget is always accounted as an RDP privacy filter
  // (docs/privacy_accounting.md §5); using the same mode from the first
  // step keeps ε consistent across restarts.
  svi::DriverConfig driver_config = config.driver;
  driver_config.adaptivity = privacy::Adaptivity::kAdaptiveFilter;

  // 3. Noise and the pool.
  std::unique_ptr<privacy::NoiseSource> noise;
  if (config.noise_mode == config::NoiseMode::kSecure) {
    VIPSD_ASSIGN_OR_RETURN(auto secure, privacy::SecureNoiseSource::Create());
    noise = std::move(secure);
  } else {
    VIPSD_ASSIGN_OR_RETURN(noise, privacy::SecureNoiseSource::CreateReproducible(config.noise_seed));
  }
  VIPSD_ASSIGN_OR_RETURN(auto source,
                         connectors::JsonlDocumentSource::Open(config.source_path, *vocabulary));
  VIPSD_ASSIGN_OR_RETURN(auto dead_letters,
                         connectors::DeadLetterFile::Open(
                             config.dead_letter_path,
                             std::filesystem::path(config.source_path).filename().string()));
  std::vector<model::Record> pool;
  OfflineRunSummary summary;
  for (;;) {
    VIPSD_ASSIGN_OR_RETURN(auto line, source.Next());
    if (!line.has_value()) break;
    if (auto* document = std::get_if<text::Document>(&*line)) {
      model::Record record;
      record.word_ids = std::move(document->word_ids);
      pool.push_back(std::move(record));
      ++summary.records_pooled;
    } else {
      VIPSD_RETURN_IF_ERROR(dead_letters.Append(std::get<connectors::Rejection>(*line)));
      ++summary.records_rejected;
    }
  }
  VIPSD_RETURN_IF_ERROR(dead_letters.Sync());
  Log(LogLevel::kInfo, kComponent,
      "source read: records=" + std::to_string(summary.records_pooled) +
          " rejected=" + std::to_string(summary.records_rejected) +
          " resumed_from_step=" + std::to_string(state.next_step));

  // 4. Steps, ledger before release.
  VIPSD_ASSIGN_OR_RETURN(auto driver,
                         svi::StepDriver::Create(model.get(), noise.get(),
                                                 config.is_private() ? &state.accountant : nullptr,
                                                 driver_config, state.next_step));
  VIPSD_ASSIGN_OR_RETURN(auto sink, connectors::ReleaseFileSink::Open(config.sink_directory));
  int64_t limit = config.max_steps > 0 ? config.max_steps : INT64_MAX;
  if (config.max_epochs > 0) {
    limit = std::min<int64_t>(
        limit, static_cast<int64_t>(std::ceil(config.max_epochs / config.driver.sampling_rate)));
  }
  summary.first_step = state.next_step;
  int64_t last_published = 0;
  svi::StepResult last{};
  auto publish = [&](const svi::StepResult& result) -> Status {
    release::Release out;
    auto& m = out.metadata;
    m.release_id = "step-" + std::to_string(result.step);
    m.model_type = model->type();
    m.step = result.step;
    m.rho = result.rho;
    m.epsilon_spent = config.is_private() ? result.epsilon_spent : 0.0;
    m.delta = config.is_private() ? config.driver.delta : 0.0;
    m.noise_multiplier = config.driver.noise_multiplier;
    m.sampling_rate = config.driver.sampling_rate;
    m.accountant = config.is_private() ? "rdp" : "none";
    for (const auto& block : model->statistic_layout().blocks()) {
      m.clip_bounds.emplace_back(block.name, config.is_private() ? block.clip_bound : 0.0);
    }
    m.dimensions = model->dimensions();
    m.vocabulary_fingerprint = vocabulary->Fingerprint();
    m.config_fingerprint = ConfigFingerprint(config);
    m.is_private = config.is_private() && noise->is_private();
    m.noise_description = config.is_private() ? noise->description() : "none (sigma = 0, NOT PRIVATE)";
    m.created_at_utc = UtcNow();
    for (auto& array : model->ReleaseArrays()) {
      out.arrays.push_back({array.name, array.shape, std::move(array.data)});
    }
    VIPSD_RETURN_IF_ERROR(sink.Write(out));
    ++summary.releases_written;
    last_published = result.step;
    return Status::Ok();
  };
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < limit; ++i) {
    VIPSD_ASSIGN_OR_RETURN(auto result, driver->Step(pool));
    if (result.outcome == svi::StepResult::Outcome::kRefusedCeiling) {
      summary.stopped_at_ceiling = true;
      Log(LogLevel::kWarning, kComponent,
          "epsilon ceiling reached: step=" + std::to_string(result.step) +
              " epsilon_spent=" + std::to_string(result.epsilon_spent) +
              " would_reach=" + std::to_string(result.epsilon_refused));
      break;
    }
    state.next_step = driver->next_step();
    // Durable BEFORE any release of this step leaves the process.
    VIPSD_RETURN_IF_ERROR(ledger.Commit(state));
    ++summary.steps_run;
    last = result;
    if (result.step % config.publish_every == 0) VIPSD_RETURN_IF_ERROR(publish(result));
  }
  summary.estep_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (summary.steps_run > 0 && last_published != last.step) VIPSD_RETURN_IF_ERROR(publish(last));
  if (config.is_private()) {
    VIPSD_ASSIGN_OR_RETURN(auto spent, state.accountant.GetEpsilon(
                                           config.driver.delta, privacy::RdpConversion::kImproved,
                                           driver_config.adaptivity));
    summary.epsilon_spent = spent.epsilon;
  }
  Log(LogLevel::kInfo, kComponent,
      "run finished: steps=" + std::to_string(summary.steps_run) +
          " releases=" + std::to_string(summary.releases_written) +
          " epsilon_spent=" + std::to_string(summary.epsilon_spent) +
          (summary.stopped_at_ceiling ? " stopped_at_ceiling=true" : ""));
  return summary;
}

}  // namespace vipsd::daemon
