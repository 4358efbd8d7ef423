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
#include "daemon/checkpoint.h"
#include "daemon/ledger.h"
#include "daemon/model_setup.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "offline";

}  // namespace

StatusOr<OfflineRunSummary> RunOffline(const config::VipsdConfig& config) {
  // 1. Vocabulary and model.
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));
  model::Model* model = bundle.model.get();

  // 2. Ledger: spent budget and step counter survive restarts.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  VIPSD_ASSIGN_OR_RETURN(auto previous, ledger.Load());
  LedgerState state;
  if (previous.has_value()) state = std::move(*previous);
  if (state.mode != AccountingMode::kGlobal) {
    return FailedPreconditionError(ledger.path() +
                                   " records residency accounting; the offline run accounts "
                                   "globally. Use another state directory.");
  }
  // The model resumes from its checkpoint (steps charged after it are lost
  // progress, never lost budget).
  CheckpointStore checkpoints(config.state_directory);
  VIPSD_ASSIGN_OR_RETURN(auto checkpoint, checkpoints.Load());
  if (checkpoint.has_value()) {
    if (checkpoint->model_fingerprint != bundle.model_fingerprint) {
      return FailedPreconditionError(
          checkpoints.path() + " was written for a different model (type, dimensions or "
                               "vocabulary); use another state directory");
    }
    const Status restored = model->RestoreCheckpoint(checkpoint->arrays);
    if (!restored.ok()) {
      return DataLossError(checkpoints.path() + ": " + std::string(restored.message()));
    }
  }
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
                         connectors::JsonlDocumentSource::OpenForRecords(config.source_path));
  VIPSD_ASSIGN_OR_RETURN(auto dead_letters,
                         connectors::DeadLetterFile::Open(
                             config.dead_letter_path,
                             std::filesystem::path(config.source_path).filename().string()));
  std::vector<model::Record> pool;
  OfflineRunSummary summary;
  for (;;) {
    VIPSD_ASSIGN_OR_RETURN(auto line, source.NextRecord(*bundle.decoder));
    if (!line.has_value()) break;
    if (auto* record = std::get_if<model::Record>(&*line)) {
      pool.push_back(std::move(*record));
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
                         svi::StepDriver::Create(model, noise.get(),
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
    ReleaseFacts facts;
    facts.step = result.step;
    facts.rho = result.rho;
    facts.epsilon_spent = result.epsilon_spent;
    facts.noise_is_private = noise->is_private();
    facts.noise_description = noise->description();
    facts.noise_multiplier = config.driver.noise_multiplier;
    facts.sampling_rate = config.driver.sampling_rate;
    const release::Release out = MakeRelease(bundle, config, facts);
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
    if (result.step % config.checkpoint_every == 0) {
      VIPSD_RETURN_IF_ERROR(checkpoints.Save(
          {result.step, model->type(), bundle.model_fingerprint, model->CheckpointArrays()}));
    }
    ++summary.steps_run;
    last = result;
    if (result.step % config.publish_every == 0) VIPSD_RETURN_IF_ERROR(publish(result));
  }
  summary.estep_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (summary.steps_run > 0 && last.step % config.checkpoint_every != 0) {
    VIPSD_RETURN_IF_ERROR(checkpoints.Save(
        {last.step, model->type(), bundle.model_fingerprint, model->CheckpointArrays()}));
  }
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
