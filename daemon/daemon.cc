#include "daemon/daemon.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "connectors/file/file_util.h"
#include "core/base/log.h"
#include "core/privacy/secure_noise.h"
#include "core/release/release.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";
constexpr size_t kPollBatch = 512;
constexpr auto kPollTimeout = std::chrono::milliseconds(200);

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Fixed(double value, int digits = 4) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

std::string JsonNumber(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

privacy::Adaptivity Adaptive() {
  // (q, σ) may change by reload after releases were seen: always account as
  // an RDP privacy filter (docs/privacy_accounting.md §5), from the first
  // step, so that ε is consistent across restarts and reloads.
  return privacy::Adaptivity::kAdaptiveFilter;
}

// Files a fresh start may find in the state directory.
bool IsHarmlessStateFile(const std::string& name) {
  return name == "lock" || name == "bootstrap" || name == "ledger.tmp" ||
         name == "checkpoint.tmp";
}

}  // namespace

std::string StreamName(const std::string& topic, int32_t partition) {
  return topic + ":" + std::to_string(partition);
}

svi::DriverConfig Daemon::DriverConfigFor(const config::VipsdConfig& config) const {
  svi::DriverConfig driver = config.driver;
  driver.adaptivity = Adaptive();
  driver.enforce_ceiling = config.accounting == config::Accounting::kGlobal;
  return driver;
}

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const config::VipsdConfig& config,
                                                 SourceFactory make_source,
                                                 std::unique_ptr<OutputSink> sink,
                                                 Metrics* metrics, DaemonHooks hooks) {
  if (metrics == nullptr || sink == nullptr || !make_source) {
    return InvalidArgumentError("the daemon needs a source factory, a sink and metrics");
  }
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));

  // Ledger: the budget of record.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  VIPSD_ASSIGN_OR_RETURN(auto previous, ledger.Load());
  CheckpointStore checkpoints(config.state_directory);
  const AccountingMode mode = config.accounting == config::Accounting::kGlobal
                                  ? AccountingMode::kGlobal
                                  : AccountingMode::kResidency;
  LedgerState state;
  if (previous.has_value()) {
    state = std::move(*previous);
    if (state.mode != mode) {
      return FailedPreconditionError(
          config.file + ":" + std::to_string(config.line_of("privacy.accounting")) +
          ": privacy.accounting: the ledger in " + config.state_directory + " was written in " +
          std::string(AccountingModeName(state.mode)) +
          " mode; the accounting mode cannot change for a state directory (use a new one)");
    }
  } else {
    // No ledger: a fresh start only if nothing else of a previous run is
    // here (a missing ledger next to a checkpoint is lost state, not a new
    // budget).
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(config.state_directory, error)) {
      const std::string name = entry.path().filename().string();
      if (!IsHarmlessStateFile(name)) {
        return DataLossError("the state directory " + config.state_directory +
                             " holds " + name +
                             " but no ledger: the spent budget is unknown; refusing to start "
                             "from zero (restore the ledger or use an empty directory)");
      }
    }
    state.mode = mode;
    if (mode == AccountingMode::kResidency) {
      VIPSD_ASSIGN_OR_RETURN(auto residency,
                             privacy::ResidencyAccountant::Create(config.residency_steps));
      state.residency = std::move(residency);
      state.arrivals = svi::ArrivalHistory(config.residency_steps);
    }
  }
  if (mode == AccountingMode::kResidency) {
    // M may be lowered, never raised, against an existing ledger.
    VIPSD_RETURN_IF_ERROR(state.residency->SetMaxResidencySteps(config.residency_steps));
    state.arrivals.set_window(config.residency_steps);
    VIPSD_ASSIGN_OR_RETURN(
        auto check, privacy::ResidencyAccountant::CheckConfiguration(
                        config.residency_steps, config.driver.sampling_rate,
                        config.driver.noise_multiplier, config.driver.delta,
                        config.driver.epsilon_ceiling, Adaptive()));
    if (check.would_exceed) {
      return InvalidArgumentError(
          config.file + ":" + std::to_string(config.line_of("privacy.residency_steps")) +
          ": privacy.residency_steps: a record present for " +
          std::to_string(config.residency_steps) + " steps at sampling_rate " +
          JsonNumber(config.driver.sampling_rate) + " and noise_multiplier " +
          JsonNumber(config.driver.noise_multiplier) + " would spend epsilon " +
          Fixed(check.epsilon_after) + " > epsilon_ceiling " +
          JsonNumber(config.driver.epsilon_ceiling) +
          " (delta " + JsonNumber(config.driver.delta) +
          "); lower M or q, or raise sigma (vipsd-privacy steps ... gives the largest M)");
    }
  }

  // Model state.
  VIPSD_ASSIGN_OR_RETURN(auto checkpoint, checkpoints.Load());
  int64_t model_step = 0;
  if (checkpoint.has_value()) {
    if (checkpoint->model_fingerprint != bundle.model_fingerprint) {
      return FailedPreconditionError(
          checkpoints.path() + " was written for a different model (type, dimensions or "
                               "vocabulary); the model cannot change for a state directory");
    }
    const Status restored = bundle.model->RestoreCheckpoint(checkpoint->arrays);
    if (!restored.ok()) {
      return DataLossError(checkpoints.path() + ": " + std::string(restored.message()));
    }
    model_step = checkpoint->step;
  } else if (state.next_step > 1) {
    Log(LogLevel::kWarning, kComponent,
        "no model checkpoint in " + config.state_directory + ": the model restarts from its "
        "initial state; the spent budget continues from step " +
        std::to_string(state.next_step));
  }

  // Noise.
  std::unique_ptr<privacy::NoiseSource> noise;
  if (config.noise_mode == config::NoiseMode::kSecure) {
    VIPSD_ASSIGN_OR_RETURN(auto secure, privacy::SecureNoiseSource::Create());
    noise = std::move(secure);
  } else {
    VIPSD_ASSIGN_OR_RETURN(noise, privacy::SecureNoiseSource::CreateReproducible(config.noise_seed));
  }

  svi::PoolOptions pool_options = config.pool;
  pool_options.max_residency_steps = mode == AccountingMode::kResidency ? config.residency_steps : 0;
  VIPSD_ASSIGN_OR_RETURN(svi::RecordPool pool, svi::RecordPool::Create(pool_options));

  std::unique_ptr<Daemon> daemon(new Daemon(config, std::move(bundle), std::move(sink), metrics,
                                            std::move(hooks), std::move(ledger), std::move(state),
                                            std::move(noise), std::move(pool)));
  daemon->model_step_ = model_step;
  VIPSD_ASSIGN_OR_RETURN(
      daemon->driver_,
      svi::StepDriver::Create(daemon->bundle_.model.get(), daemon->noise_.get(),
                              config.is_private() ? &daemon->state_.accountant : nullptr,
                              daemon->DriverConfigFor(config), daemon->state_.next_step));

  // The source resumes each partition where the ledger says the pool began.
  const std::map<std::string, int64_t> resume = daemon->state_.resume_offsets;
  VIPSD_ASSIGN_OR_RETURN(daemon->source_,
                         make_source([resume](const std::string& topic, int32_t partition)
                                         -> std::optional<int64_t> {
                           const auto it = resume.find(StreamName(topic, partition));
                           if (it == resume.end()) return std::nullopt;
                           return it->second;
                         }));
  return daemon;
}

Daemon::Daemon(const config::VipsdConfig& config, ModelBundle bundle,
               std::unique_ptr<OutputSink> sink, Metrics* metrics, DaemonHooks hooks,
               Ledger ledger, LedgerState state, std::unique_ptr<privacy::NoiseSource> noise,
               svi::RecordPool pool)
    : config_(config),
      bundle_(std::move(bundle)),
      sink_(std::move(sink)),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      ledger_(std::move(ledger)),
      state_(std::move(state)),
      checkpoints_(config.state_directory),
      noise_(std::move(noise)),
      pool_(std::move(pool)) {}

Daemon::~Daemon() {
  RequestStop();
  if (ingest_thread_.joinable()) ingest_thread_.join();
}

void Daemon::RequestStop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_ = true;
  wake_.notify_all();
}

void Daemon::RequestReload() {
  std::lock_guard<std::mutex> lock(mutex_);
  reload_ = true;
  wake_.notify_all();
}

DaemonStatus Daemon::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

double Daemon::EpsilonSpent() const {
  if (!config_.is_private()) return 0;
  if (state_.mode == AccountingMode::kResidency) return state_.residency->worst_epsilon();
  auto spent = state_.accountant.GetEpsilon(config_.driver.delta,
                                            privacy::RdpConversion::kImproved, Adaptive());
  return spent.ok() ? spent->epsilon : std::numeric_limits<double>::infinity();
}

void Daemon::UpdateBudgetMetrics() {
  const double spent = EpsilonSpent();
  metrics_->SetPrivacyBudget(spent, config_.is_private() ? config_.driver.epsilon_ceiling : 0,
                             config_.is_private() ? config_.driver.delta : 0);
  metrics_->noise_multiplier().Set(config_.driver.noise_multiplier);
  metrics_->sampling_rate().Set(config_.driver.sampling_rate);
  metrics_->step_interval_seconds().Set(config_.step_interval_seconds);
  metrics_->pool_capacity().Set(static_cast<double>(config_.pool.capacity));
  metrics_->privacy_halted().Set(halted_ ? 1 : 0);
  metrics_->privacy_budget_warning_level().Set(state_.warning_level);
  std::lock_guard<std::mutex> lock(mutex_);
  status_.epsilon_spent = spent;
  status_.halted = halted_;
  status_.next_step = driver_->next_step();
  status_.steps_run = steps_run_;
  status_.pool_records = pool_.size();
}

// ---------------------------------------------------------------------------
// Ingest thread

void Daemon::IngestLoop() {
  std::vector<InputRecord> records;
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_) return;
      if (refuse_new_.load() &&
          pool_size_ + static_cast<int64_t>(staging_.size()) >= capacity_.load()) {
        // Back-pressure: leave records in Kafka until a step frees room.
        wake_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
    }
    auto polled = source_->Poll(kPollBatch, kPollTimeout);
    if (!polled.ok()) {
      Log(LogLevel::kError, kComponent, "input: " + polled.status().ToString());
      metrics_->kafka_errors_total(KafkaErrorKind::kConsume).Increment();
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, backoff, [&] { return stop_; });
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    records = std::move(*polled);
    if (records.empty()) continue;
    const Status status = IngestBatch(records);
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stop_) {
        ingest_error_ = status;
        stop_ = true;
        wake_.notify_all();
      }
      return;
    }
  }
}

Status Daemon::IngestBatch(std::vector<InputRecord>& records) {
  // Decode everything first; dead letters are delivered before any offset
  // of the batch is marked done, so a crash never skips a rejected record.
  std::vector<std::optional<model::Record>> decoded(records.size());
  std::vector<std::pair<size_t, connectors::RejectReason>> rejected;
  for (size_t i = 0; i < records.size(); ++i) {
    metrics_->records_consumed_total(records[i].topic).Increment();
    if (records[i].oversize) {
      rejected.emplace_back(i, connectors::RejectReason::kRecordTooLarge);
      continue;
    }
    connectors::RecordDecodeResult result = bundle_.decoder->Decode(records[i].payload);
    if (auto* failure = std::get_if<connectors::DecodeFailure>(&result)) {
      rejected.emplace_back(i, failure->reason);  // the bytes go to the dead-letter topic
    } else {
      decoded[i] = std::move(std::get<model::Record>(result));
      records[i].payload.clear();  // the decoded record is all the pool keeps
      records[i].payload.shrink_to_fit();
    }
  }
  for (const auto& [index, reason] : rejected) {
    auto backoff = std::chrono::milliseconds(200);
    for (;;) {
      const Status published = sink_->PublishDeadLetter(records[index], reason);
      if (published.ok()) break;
      metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
      Log(LogLevel::kWarning, kComponent,
          "dead-letter publish failed, retrying (the record stays unacknowledged): " +
              published.ToString());
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, backoff, [&] { return stop_; })) {
        // Stopping: leave this and later records unacknowledged; they are
        // read again at the next start.
        return Status::Ok();
      }
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
    }
    metrics_->records_rejected_total(reason).Increment();
    metrics_->dead_letters_published_total().Increment();
    records[index].payload.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < records.size(); ++i) {
      const std::string stream = StreamName(records[i].topic, records[i].partition);
      auto [it, inserted] = stream_ids_.emplace(stream, static_cast<uint32_t>(stream_names_.size()));
      if (inserted) {
        stream_names_.push_back(stream);
        new_stream_ = true;
        ++streams_seen_;
      }
      int64_t& next = next_unread_[stream];
      next = std::max(next, records[i].offset + 1);
      if (decoded[i].has_value()) {
        staging_.push_back({std::move(*decoded[i]), it->second, records[i].offset});
        ++new_records_;
      }
    }
    wake_.notify_all();
  }
  {
    // A new partition: wait until the ledger can re-read it after a crash.
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = streams_seen_;
    wake_.wait(lock, [&] { return stop_ || streams_covered_ >= generation; });
    if (streams_covered_ < generation) return Status::Ok();  // stopping: read again next start
  }
  for (const InputRecord& record : records) {
    const Status done = source_->MarkDone(record);
    if (!done.ok()) {
      metrics_->kafka_errors_total(KafkaErrorKind::kCommit).Increment();
      Log(LogLevel::kWarning, kComponent, "storing an input offset failed: " + done.ToString());
    }
  }
  metrics_->consumer_lag_records().Set(static_cast<double>(source_->Lag()));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Step thread

bool Daemon::WaitForNextStep() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::duration<double>(config_.step_interval_seconds);
  const auto due = Clock::now() + std::chrono::duration_cast<Clock::duration>(interval);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stop_) return false;
    if (reload_) return true;
    if (new_stream_) {
      new_stream_ = false;
      const uint64_t generation = streams_seen_;
      lock.unlock();  // committing the ledger takes mutex_ itself
      CoverNewStreams();
      lock.lock();
      streams_covered_ = std::max(streams_covered_, generation);
      wake_.notify_all();
      continue;
    }
    const bool by_count =
        config_.step_min_new_records > 0 && new_records_ >= config_.step_min_new_records;
    const bool by_time = config_.step_interval_seconds > 0 && Clock::now() >= due;
    if (by_count || by_time) return true;
    if (release_owed_ && Clock::now() >= release_retry_at_) {
      lock.unlock();  // publishing takes mutex_ itself
      RetryOwedRelease();
      lock.lock();
      continue;
    }
    Clock::time_point until = config_.step_interval_seconds > 0
                                  ? due
                                  : Clock::now() + std::chrono::seconds(1);
    if (release_owed_) until = std::min(until, release_retry_at_);
    wake_.wait_until(lock, until);
  }
}

void Daemon::CoverNewStreams() {
  // Records of a partition the ledger has no resume offset for would, after
  // a crash before the next step's commit, be skipped once the source has
  // stored their offsets (a restart would start at the group's committed
  // offset). Committing the ledger first (resume offsets only; t and the
  // accountants are unchanged) makes a restart re-read them; the ingest
  // thread stores their offsets only after this.
  if (sticky_error_) return;
  bool uncovered = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [stream, next] : next_unread_) {
      if (state_.resume_offsets.count(stream) == 0) uncovered = true;
    }
  }
  if (!uncovered) return;
  const Status committed = CommitLedger();
  if (!committed.ok()) {
    Log(LogLevel::kError, kComponent,
        "ledger commit of new resume offsets failed (a crash before the next step would "
        "skip those records): " + committed.ToString());
  }
}

void Daemon::RetryOwedRelease() {
  // A model that includes a step the ledger does not cover is never
  // published (sticky ledger error).
  if (sticky_error_ || model_step_ <= 0) {
    release_owed_ = false;
    metrics_->release_pending().Set(0);
    return;
  }
  const Status published = PublishModel(model_step_, last_rho_);
  if (published.ok()) {
    Log(LogLevel::kInfo, kComponent,
        "owed release published: release_id=step-" + std::to_string(model_step_));
  } else {
    Log(LogLevel::kWarning, kComponent,
        "release retry failed (" + std::to_string(release_attempts_failed_) +
            " failed attempts; next in " +
            JsonNumber(static_cast<double>(release_retry_backoff_.count()) / 2000.0) +
            " s): " + published.ToString());
  }
}

void Daemon::DrainStaging() {
  std::vector<Staged> staged;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    staged.swap(staging_);
    names = stream_names_;
    new_records_ = 0;
  }
  const bool residency = state_.mode == AccountingMode::kResidency;
  const int64_t limit = config_.residency_steps;
  size_t next = 0;
  for (; next < staged.size(); ++next) {
    Staged& item = staged[next];
    const std::string& stream = names[item.stream];
    int64_t present = 0;
    if (residency) {
      // A record read again after a restart keeps its candidate count.
      present = state_.arrivals.StepsPresent(stream, item.offset);
      if (present >= limit) {
        metrics_->pool_evicted_total(EvictionCause::kResidency).Increment();
        continue;
      }
    }
    // Under refuse_new a full pool leaves the rest staged (in memory, behind
    // the wall) until a step frees room; the ingest thread has stopped
    // polling meanwhile.
    if (pool_.full() && config_.pool.eviction == svi::EvictionPolicy::kRefuseNew) break;
    const int64_t evicted_before = pool_.evicted_by_capacity();
    auto added = pool_.Add(std::move(item.record), {item.stream, item.offset}, present);
    if (!added.ok() || !*added) {
      Log(LogLevel::kError, kComponent,
          "pool: " + (added.ok() ? std::string("record refused") : added.status().ToString()));
      continue;
    }
    const int64_t evicted = pool_.evicted_by_capacity() - evicted_before;
    if (evicted > 0) {
      metrics_->pool_evicted_total(EvictionCause::kCapacity).Increment(static_cast<double>(evicted));
    }
    int64_t& high = high_offsets_[stream];
    high = std::max(high, item.offset);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (next < staged.size()) {
      staging_.insert(staging_.begin(), std::make_move_iterator(staged.begin() + static_cast<std::ptrdiff_t>(next)),
                      std::make_move_iterator(staged.end()));
    }
    pool_size_ = pool_.size();
  }
  metrics_->pool_records().Set(static_cast<double>(pool_.size()));
}

std::map<std::string, int64_t> Daemon::ResumeOffsets() {
  std::map<std::string, int64_t> resume;
  std::vector<std::string> names;
  std::map<std::string, int64_t> next_unread;
  std::vector<std::pair<uint32_t, int64_t>> staged;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    names = stream_names_;
    next_unread = next_unread_;
    for (const Staged& item : staging_) staged.emplace_back(item.stream, item.offset);
  }
  // Streams seen in this process: re-read from the oldest record still
  // pooled or staged, else from the first unread record. pool.rebuild_lookback
  // caps how far behind the first unread record the pooled part reaches;
  // staged records (read, not yet moved into the pool) are always re-read.
  const int64_t lookback = config_.pool_rebuild_lookback;
  for (const auto& [stream, next] : next_unread) resume[stream] = next;
  for (const auto& [stream_id, offset] : pool_.LowestOffsets()) {
    int64_t& at = resume[names[stream_id]];
    at = std::min(at, lookback < 0 ? offset : std::max(offset, at - lookback));
  }
  for (const auto& [stream_id, offset] : staged) {
    int64_t& at = resume[names[stream_id]];
    at = std::min(at, offset);
  }
  // Streams not (yet) seen since the restart keep their previous position.
  for (const auto& [stream, offset] : state_.resume_offsets) resume.emplace(stream, offset);
  return resume;
}

Status Daemon::CommitLedger() {
  state_.next_step = driver_->next_step();
  state_.resume_offsets = ResumeOffsets();
  const auto start = std::chrono::steady_clock::now();
  const Status committed = ledger_.Commit(state_);
  metrics_->ledger_commit_duration_seconds().Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (!committed.ok()) {
    metrics_->ledger_commit_failures_total().Increment();
    return committed;
  }
  metrics_->ledger_commits_total().Increment();
  return Status::Ok();
}

Status Daemon::PublishModel(int64_t step, double rho) {
  ReleaseFacts facts;
  facts.step = step;
  facts.rho = rho;
  facts.epsilon_spent = EpsilonSpent();
  facts.noise_is_private = noise_->is_private();
  facts.noise_description = noise_->description();
  facts.noise_multiplier =
      last_step_sigma_ >= 0 ? last_step_sigma_ : config_.driver.noise_multiplier;
  facts.sampling_rate = last_step_q_ >= 0 ? last_step_q_ : config_.driver.sampling_rate;
  if (facts.rho <= 0) facts.rho = svi::StepSize(config_.driver.tau0, config_.driver.kappa, std::max<int64_t>(step, 1));
  const release::Release out = MakeRelease(bundle_, config_, facts);
  VIPSD_ASSIGN_OR_RETURN(release::EncodedRelease encoded, release::EncodeRelease(out));
  size_t bytes = 0;
  for (const auto& file : encoded.files) bytes += file.bytes.size();
  const auto start = std::chrono::steady_clock::now();
  const Status published = sink_->PublishRelease(out, encoded);
  if (!published.ok()) {
    metrics_->releases_failed_total().Increment();
    metrics_->release_pending().Set(1);
    ++release_attempts_failed_;
    release_owed_ = true;
    release_retry_at_ = std::chrono::steady_clock::now() + release_retry_backoff_;
    release_retry_backoff_ = std::min(release_retry_backoff_ * 2, std::chrono::milliseconds(60000));
    return published;
  }
  release_owed_ = false;
  release_retry_backoff_ = std::chrono::milliseconds(1000);
  release_attempts_failed_ = 0;
  metrics_->release_pending().Set(0);
  metrics_->release_publish_duration_seconds().Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  metrics_->releases_published_total().Increment();
  metrics_->last_release_step().Set(static_cast<double>(step));
  metrics_->last_release_timestamp_seconds().Set(UnixNow());
  metrics_->release_bytes().Set(static_cast<double>(bytes));
  published_model_step_ = step;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status_.last_published_step = step;
  }
  if (hooks_.after_release) hooks_.after_release(out);
  return Status::Ok();
}

void Daemon::PublishAlertJson(const std::string& json) {
  if (config_.alert_topic.empty()) return;
  const Status published = sink_->PublishAlert(json);
  if (published.ok()) {
    metrics_->alerts_published_total().Increment();
  } else {
    metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
    Log(LogLevel::kWarning, kComponent, "alert publish failed: " + published.ToString());
  }
}

void Daemon::CheckWarnings() {
  if (!config_.is_private()) return;
  const double spent = EpsilonSpent();
  const double ceiling = config_.driver.epsilon_ceiling;
  double level = 0;
  for (double fraction : config_.warn_at) {
    if (spent >= fraction * ceiling) level = fraction;
  }
  if (level <= state_.warning_level) return;
  state_.warning_level = level;
  Log(LogLevel::kWarning, kComponent,
      "privacy budget warning: epsilon_spent=" + Fixed(spent) + " of ceiling=" +
          JsonNumber(ceiling) + " crossed warn_at=" + JsonNumber(level));
  PublishAlertJson("{\"event\": \"budget_warning\", \"fraction\": " + JsonNumber(level) +
                   ", \"epsilon_spent\": " + JsonNumber(spent) +
                   ", \"epsilon_ceiling\": " + JsonNumber(ceiling) +
                   ", \"delta\": " + JsonNumber(config_.driver.delta) +
                   ", \"step\": " + std::to_string(driver_->next_step() - 1) +
                   ", \"time\": \"" + UtcNow() + "\"}");
}

void Daemon::OnCeiling(double epsilon_refused) {
  metrics_->steps_refused_total().Increment();
  if (halted_) return;
  halted_ = true;
  const double spent = EpsilonSpent();
  Log(LogLevel::kWarning, kComponent,
      "epsilon ceiling reached: the next step (t=" + std::to_string(driver_->next_step()) +
          ") would spend epsilon=" + Fixed(epsilon_refused) + " > ceiling=" +
          JsonNumber(config_.driver.epsilon_ceiling) + "; epsilon_spent=" + Fixed(spent) +
          "; halting updates (on_ceiling=" +
          (config_.on_ceiling == config::CeilingAction::kHalt ? "halt" : "exit") + ")");
  if (model_step_ > 0 && published_model_step_ != model_step_ && !sticky_error_) {
    const Status final_release = PublishModel(model_step_, last_rho_);
    if (!final_release.ok()) {
      Log(LogLevel::kError, kComponent, "final release failed: " + final_release.ToString());
    } else {
      Log(LogLevel::kInfo, kComponent,
          "final release published: release_id=step-" + std::to_string(model_step_));
    }
  }
  PublishAlertJson("{\"event\": \"halted\", \"epsilon_spent\": " + JsonNumber(spent) +
                   ", \"epsilon_ceiling\": " + JsonNumber(config_.driver.epsilon_ceiling) +
                   ", \"delta\": " + JsonNumber(config_.driver.delta) +
                   ", \"next_step\": " + std::to_string(driver_->next_step()) +
                   ", \"time\": \"" + UtcNow() + "\"}");
  UpdateBudgetMetrics();
  if (config_.on_ceiling == config::CeilingAction::kExit) RequestStop();
}

void Daemon::RunOneStep() {
  const auto start = std::chrono::steady_clock::now();
  DrainStaging();
  if (pool_.size() < config_.step_min_pool_records) {
    // Public rule on stream volume: not a step, nothing charged.
    Log(LogLevel::kDebug, kComponent,
        "waiting for the pool: " + std::to_string(pool_.size()) + " of " +
            std::to_string(config_.step_min_pool_records) + " records");
    UpdateBudgetMetrics();
    return;
  }
  if (sticky_error_) {
    Log(LogLevel::kError, kComponent,
        "not stepping: an earlier ledger commit failed (" + sticky_error_->ToString() +
            "); restart vipsd after fixing the state directory");
    return;
  }
  const bool residency = state_.mode == AccountingMode::kResidency;
  const double q = config_.driver.sampling_rate;
  const double sigma = config_.driver.noise_multiplier;
  double window_epsilon = 0;
  if (config_.is_private() && residency) {
    auto check = state_.residency->CheckCeiling(q, sigma, config_.driver.delta,
                                                config_.driver.epsilon_ceiling, Adaptive());
    if (!check.ok()) {
      Log(LogLevel::kError, kComponent, "budget check failed: " + check.status().ToString());
      return;
    }
    if (check->would_exceed) {
      OnCeiling(check->epsilon_after);
      return;
    }
    window_epsilon = check->epsilon_after;
  }
  if (hooks_.before_step) hooks_.before_step(driver_->next_step(), pool_);
  auto result = driver_->Step(pool_.records());
  if (!result.ok()) {
    // Nothing about this step leaves the process; the charge (if any) is in
    // memory and goes to the ledger with the next commit.
    Log(LogLevel::kError, kComponent, "step failed: " + result.status().ToString());
    return;
  }
  if (result->outcome == svi::StepResult::Outcome::kRefusedCeiling) {
    OnCeiling(result->epsilon_refused);
    return;
  }
  halted_ = false;
  const int64_t evicted = pool_.CompleteStep();
  if (evicted > 0) {
    metrics_->pool_evicted_total(EvictionCause::kResidency).Increment(static_cast<double>(evicted));
  }
  if (config_.is_private() && residency) {
    Status recorded = state_.arrivals.RecordStep(result->step, high_offsets_);
    if (recorded.ok()) recorded = state_.residency->RecordStep(q, sigma, window_epsilon);
    if (!recorded.ok()) {
      sticky_error_ = recorded;
      Log(LogLevel::kError, kComponent, "residency bookkeeping failed: " + recorded.ToString());
      return;
    }
  }
  model_step_ = result->step;
  last_rho_ = result->rho;
  last_step_q_ = q;
  last_step_sigma_ = sigma;
  ++steps_run_;
  CheckWarnings();
  // Durable BEFORE anything about this step leaves the process.
  const Status committed = CommitLedger();
  if (!committed.ok()) {
    sticky_error_ = committed;
    Log(LogLevel::kError, kComponent,
        "ledger commit failed; no further step or release until restart: " +
            committed.ToString());
    return;
  }
  if (result->step % config_.checkpoint_every == 0) {
    const Status saved = checkpoints_.Save({result->step, bundle_.model->type(),
                                            bundle_.model_fingerprint,
                                            bundle_.model->CheckpointArrays()});
    if (saved.ok()) {
      metrics_->checkpoint_writes_total().Increment();
    } else {
      metrics_->checkpoint_failures_total().Increment();
      Log(LogLevel::kError, kComponent, "checkpoint failed: " + saved.ToString());
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_->steps_total().Increment();
  metrics_->step().Set(static_cast<double>(result->step));
  metrics_->step_size_rho().Set(result->rho);
  metrics_->step_duration_seconds().Observe(seconds);
  metrics_->last_step_timestamp_seconds().Set(UnixNow());
  metrics_->pool_records().Set(static_cast<double>(pool_.size()));
  UpdateBudgetMetrics();
  std::string line = "step=" + std::to_string(result->step) + " rho=" + Fixed(result->rho);
  if (config_.is_private()) {
    line += " epsilon=" + Fixed(EpsilonSpent()) + "/" + JsonNumber(config_.driver.epsilon_ceiling);
  }
  line += " pool=" + std::to_string(pool_.size());
  if (result->step % config_.publish_every == 0) {
    const Status published = PublishModel(result->step, result->rho);
    if (published.ok()) {
      line += " released=step-" + std::to_string(result->step);
    } else {
      Log(LogLevel::kError, kComponent, "release failed: " + published.ToString());
    }
  }
  Log(LogLevel::kInfo, kComponent, line);
  if (config_.max_steps > 0 && steps_run_ >= config_.max_steps) {
    Log(LogLevel::kInfo, kComponent, "schedule.max_steps reached; stopping");
    if (published_model_step_ != model_step_) (void)PublishModel(model_step_, last_rho_);
    RequestStop();
  }
}

void Daemon::Reload() {
  const double now = UnixNow();
  auto fail = [&](const Status& status) {
    Log(LogLevel::kError, kComponent,
        "reload refused, the running configuration stays: " + std::string(status.message()));
    metrics_->RecordReload(ReloadResult::kFailure, now);
  };
  auto next = config::LoadConfigFile(config_.file);
  if (!next.ok()) return fail(next.status());
  auto changed = config::ChangedReloadableKeys(config_, *next);
  if (!changed.ok()) return fail(changed.status());
  // The vocabulary file itself must not change either.
  if (bundle_.vocabulary != nullptr) {
    auto text = connectors::ReadWholeFile(next->vocabulary_path);
    if (!text.ok()) return fail(text.status());
    auto vocabulary = text::Vocabulary::Parse(*text);
    if (!vocabulary.ok() || vocabulary->Fingerprint() != bundle_.vocabulary_fingerprint) {
      return fail(InvalidArgumentError(
          next->file + ":" + std::to_string(next->line_of("model.lda.vocabulary")) +
          ": model.lda.vocabulary: the vocabulary file's content changed; it cannot change on "
          "reload (restart with a new state directory)"));
    }
  }
  if (changed->empty()) {
    Log(LogLevel::kInfo, kComponent, "reload: nothing changed");
    metrics_->RecordReload(ReloadResult::kSuccess, now);
    return;
  }
  // Residency: the new (q, σ, M) must be affordable, and M may only drop.
  std::optional<privacy::ResidencyAccountant> residency = state_.residency;
  if (state_.mode == AccountingMode::kResidency) {
    auto check = privacy::ResidencyAccountant::CheckConfiguration(
        next->residency_steps, next->driver.sampling_rate, next->driver.noise_multiplier,
        next->driver.delta, next->driver.epsilon_ceiling, Adaptive());
    if (!check.ok()) return fail(check.status());
    if (check->would_exceed) {
      return fail(InvalidArgumentError(
          next->file + ":" + std::to_string(next->line_of("privacy.residency_steps")) +
          ": privacy.residency_steps: " + std::to_string(next->residency_steps) +
          " steps at the new sampling_rate/noise_multiplier would spend epsilon " +
          Fixed(check->epsilon_after) + " > epsilon_ceiling " +
          JsonNumber(next->driver.epsilon_ceiling)));
    }
    const Status lowered = residency->SetMaxResidencySteps(next->residency_steps);
    if (!lowered.ok()) {
      return fail(InvalidArgumentError(
          next->file + ":" + std::to_string(next->line_of("privacy.residency_steps")) +
          ": privacy.residency_steps: " + std::string(lowered.message())));
    }
  }
  const Status driver_ok = driver_->Reconfigure(DriverConfigFor(*next));
  if (!driver_ok.ok()) return fail(driver_ok);
  svi::PoolOptions pool_options = next->pool;
  pool_options.max_residency_steps =
      state_.mode == AccountingMode::kResidency ? next->residency_steps : 0;
  const Status pool_ok = pool_.Reconfigure(pool_options);
  if (!pool_ok.ok()) {
    (void)driver_->Reconfigure(DriverConfigFor(config_));
    return fail(pool_ok);
  }
  if (state_.mode == AccountingMode::kResidency) {
    state_.residency = std::move(residency);
    state_.arrivals.set_window(next->residency_steps);
  }
  std::string keys;
  for (const auto& key : *changed) keys += (keys.empty() ? "" : ",") + key;
  config_ = std::move(*next);
  SetMinLogLevel(config_.log_level);
  refuse_new_.store(config_.pool.eviction == svi::EvictionPolicy::kRefuseNew);
  capacity_.store(config_.pool.capacity);
  wake_.notify_all();
  metrics_->RecordReload(ReloadResult::kSuccess, now);
  Log(LogLevel::kInfo, kComponent, "reload applied: changed=" + keys);
  UpdateBudgetMetrics();
}

Status Daemon::Run() {
  refuse_new_.store(config_.pool.eviction == svi::EvictionPolicy::kRefuseNew);
  capacity_.store(config_.pool.capacity);
  metrics_->SetAccountingMode(state_.mode);
  metrics_->step().Set(static_cast<double>(driver_->next_step() - 1));
  UpdateBudgetMetrics();
  Log(LogLevel::kInfo, kComponent,
      "started: model=" + bundle_.model->type() + " next_step=" +
          std::to_string(driver_->next_step()) + " accounting=" +
          std::string(AccountingModeName(state_.mode)) +
          (config_.is_private() ? " epsilon_spent=" + Fixed(EpsilonSpent()) + "/" +
                                      JsonNumber(config_.driver.epsilon_ceiling)
                                : " NOT PRIVATE (noise_multiplier 0)") +
          " model_step=" + std::to_string(model_step_));
  ingest_thread_ = std::thread([this] { IngestLoop(); });
  for (;;) {
    if (!WaitForNextStep()) break;
    bool reload = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reload = reload_;
      reload_ = false;
    }
    if (reload) {
      Reload();
      continue;
    }
    if (halted_) {
      // Re-check the budget (a reload may have raised the ceiling); the
      // check itself reads only public parameters.
      DrainStaging();
      const bool residency = state_.mode == AccountingMode::kResidency;
      bool still = true;
      if (residency) {
        auto check = state_.residency->CheckCeiling(
            config_.driver.sampling_rate, config_.driver.noise_multiplier, config_.driver.delta,
            config_.driver.epsilon_ceiling, Adaptive());
        still = !check.ok() || check->would_exceed;
      } else if (config_.is_private()) {
        auto check = state_.accountant.CheckCeiling(
            config_.driver.sampling_rate, config_.driver.noise_multiplier, 1,
            config_.driver.delta, config_.driver.epsilon_ceiling,
            privacy::RdpConversion::kImproved, Adaptive());
        still = !check.ok() || check->would_exceed;
      }
      if (still) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          new_records_ = 0;
        }
        UpdateBudgetMetrics();
        continue;
      }
      Log(LogLevel::kInfo, kComponent, "the budget admits the next step again; resuming");
      halted_ = false;
    }
    RunOneStep();
  }
  if (release_owed_ && !sticky_error_) {
    Log(LogLevel::kWarning, kComponent,
        "stopping with the release of step " + std::to_string(model_step_) +
            " undelivered (the sink kept failing); the next release will include it");
  }
  // Stop: the ingest thread ends its current batch.
  RequestStop();
  if (ingest_thread_.joinable()) ingest_thread_.join();
  Status result = Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ingest_error_) result = *ingest_error_;
  }
  const Status committed = source_->Commit();
  if (!committed.ok()) Log(LogLevel::kWarning, kComponent, "final offset commit: " + committed.ToString());
  const Status closed = source_->Close();
  if (!closed.ok()) Log(LogLevel::kWarning, kComponent, "closing the source: " + closed.ToString());
  const Status flushed = sink_->Close();
  if (!flushed.ok()) Log(LogLevel::kWarning, kComponent, "closing the sink: " + flushed.ToString());
  Log(LogLevel::kInfo, kComponent,
      "stopped: next_step=" + std::to_string(driver_->next_step()) + " steps_this_run=" +
          std::to_string(steps_run_) +
          (config_.is_private() ? " epsilon_spent=" + Fixed(EpsilonSpent()) : ""));
  return result;
}

}  // namespace vipsd::daemon
