#include "daemon/service/daemon.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "core/base/format.h"
#include "core/base/log.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/ledger_keeper.h"
#include "daemon/parts/publisher.h"
#include "daemon/parts/slot_clock.h"
#include "daemon/state/checkpoint.h"
#include "daemon/step/aggregator.h"
#include "daemon/step/coordinator.h"
#include "daemon/step/solo_step.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";


}  // namespace

svi::DriverConfig Daemon::DriverConfigFor(const config::VipsdConfig& config) const {
  svi::DriverConfig driver = config.driver;
  driver.adaptivity = AccountingAdaptivity();
  // The daemon checks the budget itself (LedgerKeeper::AdmitsStep) in residency mode
  // and for a fixed schedule; the driver's own check is the RDP filter.
  driver.enforce_ceiling = config.accounting == config::Accounting::kGlobal &&
                           keeper_->state().schedule == ScheduleKind::kAdaptive;
  return driver;
}

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const config::VipsdConfig& config,
                                                 SourceFactory make_source,
                                                 std::unique_ptr<OutputSink> sink,
                                                 Metrics* metrics, DaemonHooks hooks,
                                                 DaemonOptions options,
                                                 std::unique_ptr<LedgerReplica> replica,
                                                 std::unique_ptr<WorkExchange> exchange) {
  if (metrics == nullptr || sink == nullptr || !make_source) {
    return InvalidArgumentError("the daemon needs a source factory, a sink and metrics");
  }
  if (exchange != nullptr && (replica == nullptr || config.source_type != config::SourceType::kKafka)) {
    return InvalidArgumentError("shared work needs the ledger topic and a Kafka source");
  }
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));

  // Ledger: the budget of record.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  VIPSD_ASSIGN_OR_RETURN(PreparedState prepared,
                         PrepareStart(config, bundle, ledger, replica.get(), options));
  LedgerState state = std::move(prepared.state);
  const int64_t model_step = prepared.model_step;

  VIPSD_ASSIGN_OR_RETURN(std::unique_ptr<privacy::NoiseSource> noise, NewNoiseSource(config));
  if (replica != nullptr) metrics->ledger_owner_epoch().Set(static_cast<double>(replica->epoch()));
  auto keeper = std::make_unique<LedgerKeeper>(std::move(ledger), std::move(state),
                                               std::move(replica), config.state_directory,
                                               metrics, hooks.ledger_fault);
  VIPSD_RETURN_IF_ERROR(keeper->UseFixedSchedule(config.is_private()));
  if (hooks.ledger_edit) {
    hooks.ledger_edit(nullptr, keeper->state());
    keeper->set_edit_observer([observe = hooks.ledger_edit](const LedgerEdit& edit,
                                                            const LedgerState& after) {
      observe(&edit, after);
    });
  }
  keeper->PrefetchNextCheck(config.driver.delta);
  LedgerKeeper* keeper_ptr = keeper.get();
  std::unique_ptr<Daemon> daemon(new Daemon(config, options, std::move(bundle), std::move(sink),
                                            metrics, std::move(hooks), std::move(keeper),
                                            std::move(noise)));
  Daemon* self = daemon.get();
  keeper_ptr->set_on_fenced([self](const Status& error) { self->OnFenced(error); });
  daemon->model_step_ = model_step;
  if (config.federation.role == config::FederationRole::kAggregator) {
    if (exchange == nullptr) {
      return InvalidArgumentError(
          "a federated aggregator needs its work exchange (state.work_topic)");
    }
    auto aggregator = std::make_unique<Aggregator>(std::move(exchange), &daemon->control_);
    VIPSD_RETURN_IF_ERROR(aggregator->Configure(config.federation));
    daemon->step_ = std::move(aggregator);
  } else if (exchange != nullptr) {
    daemon->step_ = std::make_unique<Coordinator>(std::move(exchange), &daemon->control_);
  } else {
    daemon->step_ = std::make_unique<SoloStep>();
  }
  daemon->pool_.set_max_candidate_steps(daemon->paced_ ? config.window_steps : 0);
  // The driver charges through the keeper (svi::ChargeBook), the only
  // writer of the privacy record.
  VIPSD_ASSIGN_OR_RETURN(
      daemon->driver_,
      svi::StepDriver::Create(daemon->bundle_.model.get(), daemon->noise_.get(),
                              *daemon->keeper_, daemon->DriverConfigFor(config),
                              daemon->keeper_->state().next_step));
  if (daemon->hooks_.after_sample) daemon->driver_->set_sample_observer(daemon->hooks_.after_sample);
  {
    // Bound once: the step reads these parts of the daemon (which outlive
    // it), the configuration as the last reload left it.
    StepParts parts;
    parts.config = &daemon->config_;
    parts.driver = daemon->driver_.get();
    parts.ingest = daemon->ingest_.get();
    parts.keeper = daemon->keeper_.get();
    parts.bundle = &daemon->bundle_;
    parts.pool = &daemon->pool_;
    parts.secure_noise = daemon->noise_->is_private();
    parts.on_fenced = [self](const Status& error) { self->OnFenced(error); };
    daemon->step_->Bind(std::move(parts));
  }
  if (!daemon->paced_) {
    // The offline run: max_steps and max_epochs (one epoch = 1/q steps,
    // validated against overflow by the configuration) bound this run.
    int64_t limit = config.max_steps;
    if (config.max_epochs > 0) {
      const auto epochs = static_cast<int64_t>(
          std::ceil(config.max_epochs / config.driver.mechanism.sampling_rate));
      limit = limit > 0 ? std::min(limit, epochs) : epochs;
    }
    daemon->step_limit_ = limit;
  }

  // The source resumes each partition where the ledger's windows begin.
  daemon->PublishResumeOffsets();
  Ingest* ingest = daemon->ingest_.get();
  VIPSD_ASSIGN_OR_RETURN(auto source,
                         make_source([ingest](const std::string& topic, int32_t partition) {
                           return ingest->ResumeOffset(topic, partition);
                         }));
  daemon->source_ = std::move(source);
  return daemon;
}

Daemon::Daemon(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
               std::unique_ptr<OutputSink> sink, Metrics* metrics, DaemonHooks hooks,
               std::unique_ptr<LedgerKeeper> keeper, std::unique_ptr<privacy::NoiseSource> noise)
    : options_(std::move(options)),
      paced_(config.source_type == config::SourceType::kKafka),
      config_(config),
      bundle_(std::move(bundle)),
      sink_(std::move(sink)),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      noise_(std::move(noise)),
      keeper_(std::move(keeper)),
      ingest_(std::make_unique<Ingest>(bundle_.decoder.get(), sink_.get(), metrics, &control_,
                                       /*cover_every_stream=*/false)),
      clock_(std::make_unique<SlotClock>(&control_)),
      publisher_(std::make_unique<Publisher>(sink_.get(), metrics, &control_, paced_,
                                             hooks_.after_release)) {}

Daemon::~Daemon() {
  RequestStop();
  clock_->Join();
  ingest_->Join();
}

void Daemon::RequestStop() {
  control_.RequestStop();
  ingest_->Stop();
  clock_->Stop();
}

void Daemon::RequestReload() { control_.RequestReload(); }

DaemonStatus Daemon::status() const {
  DaemonStatus status;
  {
    MutexLock lock(&status_mutex_);
    status = status_;
  }
  status.records_pooled = ingest_->records_pooled();
  status.records_rejected = ingest_->records_rejected();
  return status;
}

double Daemon::EpsilonSpent() const {
  return keeper_->EpsilonOf(keeper_->state(), config_.driver.delta, config_.is_private());
}

double Daemon::CommittedEpsilon() const {
  return keeper_->EpsilonOf(keeper_->committed(), config_.driver.delta, config_.is_private());
}

void Daemon::UpdateBudgetMetrics() {
  // What is durable, never a step whose ledger commit has not succeeded.
  const double spent = CommittedEpsilon();
  metrics_->SetPrivacyBudget(spent, config_.is_private() ? config_.driver.epsilon_ceiling : 0,
                             config_.is_private() ? config_.driver.delta : 0);
  // (q, σ) as the next step runs them: the driver's (one home for both).
  metrics_->noise_multiplier().Set(driver_->config().mechanism.noise_multiplier);
  metrics_->sampling_rate().Set(driver_->config().mechanism.sampling_rate);
  metrics_->step_interval_seconds().Set(config_.step_interval_seconds);
  metrics_->pool_capacity().Set(static_cast<double>(config_.pool_capacity));
  metrics_->privacy_halted().Set(halted_ ? 1 : 0);
  metrics_->window_overflow().Set(overflow_ ? 1 : 0);
  metrics_->privacy_budget_warning_level().Set(keeper_->state().warning_level);
  MutexLock lock(&status_mutex_);
  status_.epsilon_spent = spent;
  status_.halted = halted_;
  status_.window_overflow = overflow_;
  status_.next_step = keeper_->committed().next_step;
  status_.steps_run = steps_run_ - UncommittedSteps();
  status_.slots_skipped = slots_skipped_;
  status_.last_slot = keeper_->state().windows.last_slot();
  status_.pool_records = pool_.size();
}

InputSource* Daemon::source() const {
  return source_ != nullptr ? source_.get() : ingest_->source();
}

void Daemon::PublishResumeOffsets() {
  const LedgerState& state = keeper_->state();
  std::map<std::string, int64_t> resume;
  for (const std::string& stream : state.windows.Streams()) {
    resume[stream] = state.windows.ResumeOffset(stream);
  }
  ingest_->SetResumeOffsets(std::move(resume), /*covered=*/true);
}

// ---------------------------------------------------------------------------
// Start-up and the slot loop

Status Daemon::Initialize() {
  // Streams and their origins. A fresh state directory takes every input
  // stream from its start (or its end, start_position: latest); a stream
  // that appears later starts at its first retained record.
  const LedgerState& state = keeper_->state();
  const bool fresh = state.next_step == 1 && state.windows.Streams().empty() &&
                     state.windows.last_slot() == 0;
  VIPSD_ASSIGN_OR_RETURN(auto bounds, clock_->ObserveWithRetry(*source(), WallNow()));
  if (paced_) {
    for (const auto& [stream, b] : bounds) {
      if (state.windows.HasStream(stream)) continue;
      const int64_t origin = fresh && config_.start_position == "latest" ? b.end : b.start;
      VIPSD_RETURN_IF_ERROR(keeper_->AddStream(stream, origin));
    }
    // Slots whose time passed while no daemon observed them are missed: the
    // records appended meanwhile belong to the first slot observed now. The
    // first slot observed is the first due schedule.start_delay_seconds
    // after now (public: the start time and a configured delay), which
    // leaves the consumer group join and the initial read out of the first
    // slots' deadlines.
    const int64_t first = state.windows.FirstSlotAtOrAfter(WallNow() + config_.start_delay_seconds);
    if (first > state.windows.last_slot() + 1) {
      const int64_t missed = first - 1 - state.windows.last_slot();
      if (state.windows.last_slot() > 0) {
        Log(LogLevel::kInfo, kComponent,
            std::to_string(missed) +
                " slots passed while vipsd was not running or fall within "
                "schedule.start_delay_seconds of its start (" +
                std::to_string(state.windows.last_slot() + 1) + " to " +
                std::to_string(first - 1) + "); the first slot observed is " +
                std::to_string(first));
        slots_skipped_ += missed;
        metrics_->slots_skipped_total(SkipReason::kMissed).Increment(static_cast<double>(missed));
      }
      VIPSD_RETURN_IF_ERROR(keeper_->SkipTo(first - 1));
    }
    clock_->SetGrace(config_.cut_grace_seconds);
    clock_->Schedule(first, state.windows.anchor_slot(), state.windows.anchor_time(),
                     state.windows.interval_seconds());
  }
  VIPSD_RETURN_IF_ERROR(keeper_->Commit(driver_->next_step()));
  PublishResumeOffsets();
  if (!paced_) {
    std::vector<std::string> streams;
    for (const auto& [stream, b] : bounds) streams.push_back(stream);
    ingest_->Cover(streams);
  }
  return Status::Ok();
}

void Daemon::ServiceRequests() {
  if (control_.TakeReload()) Reload();
  if (ingest_->TakeCoverRequest()) CoverNewStreams();
}

void Daemon::CoverNewStreams() {
  // Records of a partition the ledger does not know would, after a crash,
  // be skipped once the source has stored their offsets. Adding the stream
  // (its origin is its first retained record) and committing the ledger
  // first makes a restart re-read them; the ingest thread acknowledges them
  // only after this.
  if (keeper_->sticky()) return;
  if (keeper_->backing_off(WallNow())) {
    ingest_->RequestCover();  // the ingest thread keeps waiting; asked again later
    return;
  }
  auto bounds = clock_->ObserveWithRetry(*source(), WallNow());
  if (!bounds.ok()) return;
  const LedgerState& state = keeper_->state();
  bool added = false;
  for (const auto& [stream, b] : *bounds) {
    if (paced_ && !state.windows.HasStream(stream)) {
      if (keeper_->AddStream(stream, b.start).ok()) added = true;
    }
  }
  if (added || keeper_->failing()) {
    SlotOutputs ignored;
    if (!CommitOrRetryLedger(&ignored)) {
      ingest_->RequestCover();
      return;
    }
  }
  PublishResumeOffsets();
  if (!paced_) {
    std::vector<std::string> streams;
    for (const auto& [stream, b] : *bounds) streams.push_back(stream);
    ingest_->Cover(streams);
  }
}

bool Daemon::WaitForCuts(int64_t slot, std::map<std::string, StreamBounds>* bounds) {
  if (!paced_) {
    // The offline run: the file is the whole data set; every step's window
    // is all of it.
    auto observed = clock_->ObserveWithRetry(*source(), WallNow());
    if (!observed.ok()) return false;
    *bounds = std::move(*observed);
    return true;
  }
  for (;;) {
    const uint64_t seen = control_.Generation();
    if (control_.stopping()) return false;
    ServiceRequests();
    if (auto taken = clock_->Take(slot, &cuts_read_at_)) {
      *bounds = std::move(*taken);
      return true;
    }
    control_.WaitAfter(seen, std::chrono::milliseconds(500));
  }
}

SlotTargets Daemon::TargetsFor(int64_t slot,
                               const std::map<std::string, StreamBounds>& bounds) const {
  // Slot k's cut of a stream: its first record after t_k by timestamp,
  // looked for from the previous cut (or the end observed for the previous
  // slot, whichever is higher) up to the end observed now
  // (core/svi/slot_windows.h).
  SlotTargets targets;
  const LedgerState& state = keeper_->state();
  if (paced_) {
    targets.cut_time_ms = state.windows.CutTimeMs(slot);
  }
  for (const auto& [stream, b] : bounds) {
    int64_t floor = b.end;
    if (paced_) {
      floor = state.windows.Cut(stream, state.windows.last_slot());
      if (const auto previous = previous_ends_.find(stream); previous != previous_ends_.end()) {
        floor = std::max(floor, previous->second);
      }
    }
    targets.streams[stream] = {b.end, std::min(floor, b.end)};
  }
  return targets;
}

bool Daemon::WaitForWindow(int64_t slot, const std::map<std::string, StreamBounds>& bounds,
                           bool* overflow, std::map<std::string, int64_t>* cuts) {
  *overflow = false;
  std::map<std::string, int64_t> ends;
  for (const auto& [stream, b] : bounds) ends[stream] = b.end;
  ingest_->SetTargets(TargetsFor(slot, bounds));
  const LedgerState& state = keeper_->state();
  auto window_start = [&](const std::string& stream) {
    return paced_ ? state.windows.ResumeOffset(stream) : int64_t{0};
  };
  const int64_t capacity = paced_ ? config_.pool_capacity : 0;
  bool logged = false;
  const auto wait_start = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t seen = control_.Generation();
    if (control_.stopping()) return false;
    ServiceRequests();
    const WindowProgress progress = ingest_->Progress(ends, window_start);
    // Overflow iff the window holds more records than pool.capacity: the
    // ingest thread reads at most capacity + 1 of them. Found before every
    // stream was read to its cut, a stream whose cut is not decided yet
    // takes the end observed for the slot: that depends on when the end was
    // read, but stepping stops here and a run with an overflow is outside
    // the claim (SECURITY.md). Recording the slot as missed instead would
    // keep the windows from advancing: the ingest thread, held at
    // pool.capacity + 1 records, would never read again.
    const bool over = capacity > 0 && progress.held > capacity;
    if (progress.behind.empty() || over) {
      *overflow = over;
      *cuts = ingest_->Cuts(ends);
      return true;
    }
    if (!logged && std::chrono::steady_clock::now() - wait_start > std::chrono::seconds(5)) {
      logged = true;
      // Once per wait, with what it waits for (offsets are stream volume).
      std::string names;
      for (const auto& [name, read] : progress.behind) {
        names += (names.empty() ? "" : ", ") + name + " read to offset " + std::to_string(read) +
                 " of " + std::to_string(ends.at(name));
      }
      Log(LogLevel::kInfo, kComponent,
          "waiting for input: the next slot needs the records below its cut of " + names +
              " (partitions not assigned to this process yet, or still being read)");
    }
    control_.WaitAfter(seen, std::chrono::milliseconds(200));
  }
}

int64_t Daemon::AdmitWindow(const std::map<std::string, int64_t>& cuts) {
  // Records below the slot's cut enter the pool; everything the window no
  // longer covers was evicted when the previous slot ended (AdvanceWindow).
  // A record stamped at or before the previous slot's time belonged to it
  // but was not readable when its cut was read: it is late (it joins this
  // slot; core/svi/slot_windows.h "When the assumptions fail").
  int64_t late = 0;
  for (auto& [id, taken] : ingest_->Admit(cuts)) {
    for (Staged& staged : taken) {
      if (staged.timestamp_ms >= 0 && staged.timestamp_ms <= previous_cut_time_ms_) ++late;
      pool_.Add(std::move(staged.record), {id, staged.offset});
    }
  }
  ingest_->SetPoolSize(pool_.size());
  return late;
}

void Daemon::AdvanceWindow() {
  // The next slot's window starts at cut(k + 1 − M): records below it are
  // never a candidate again and leave memory now.
  const LedgerState& state = keeper_->state();
  std::map<std::string, int64_t> low;
  std::map<uint32_t, int64_t> low_by_id;
  for (const std::string& stream : state.windows.Streams()) {
    low[stream] = state.windows.ResumeOffset(stream);
    low_by_id[ingest_->StreamId(stream)] = low[stream];
  }
  const int64_t evicted = paced_ ? pool_.EvictBelow(low_by_id) : 0;
  if (evicted > 0) metrics_->pool_evicted_total().Increment(static_cast<double>(evicted));
  ingest_->AdvanceTo(low);
  ingest_->SetPoolSize(pool_.size());
}

void Daemon::ProcessSlot(int64_t slot, const std::map<std::string, StreamBounds>& bounds) {
  SlotOutputs out;
  out.slot = slot;
  out.deadline =
      paced_ ? keeper_->state().windows.SlotTime(slot) + config_.release_delay_seconds : 0;
  if (!CutSlot(slot, bounds, out)) return;  // stopping
  const bool stepped = StepOrSkip(slot, out);
  RecordSharedCuts(slot, out);
  if (HoldIfLate(slot, out)) return;  // its outputs leave with a later slot's
  FinishSlot(out, stepped);
}

bool Daemon::CutSlot(int64_t slot, const std::map<std::string, StreamBounds>& bounds,
                     SlotOutputs& out) {
  const LedgerState& state = keeper_->state();
  // New partitions of the input: their records from the first retained one.
  if (paced_) {
    for (const auto& [stream, b] : bounds) {
      if (!state.windows.HasStream(stream)) (void)keeper_->AddStream(stream, b.start);
    }
  }
  bool overflow = false;
  std::map<std::string, int64_t> cuts;
  if (!step_->CutsLocally()) {
    // Shared work: the partitions are spread over the processes; the step
    // itself waits for every partition's partial sum (Coordinator::Step),
    // and each partial names the cut its process found. The cuts are
    // recorded after the step (below).
    slot_targets_ = TargetsFor(slot, bounds);
    shared_cuts_.clear();
    ingest_->SetTargets(slot_targets_);
  } else if (!WaitForWindow(slot, bounds, &overflow, &cuts)) {
    return false;  // stopping
  }
  if (paced_) {
    // E(k) bounds slot k + 1's cuts from below only if every record below
    // it was appended at or before t_{k+1}: its read must have completed by
    // then, less the grace (the clock skew the cut rule allows). A late read
    // (a slow broker, a starved clock thread) would force records stamped
    // after t_{k+1} into slot k + 1; its ends are not used, and slot k + 1
    // is cut by timestamps from its previous cut alone.
    const double latest = state.windows.SlotTime(slot + 1) - config_.cut_grace_seconds;
    if (cuts_read_at_ <= latest) {
      for (const auto& [stream, b] : bounds) previous_ends_[stream] = b.end;
    } else {
      previous_ends_.clear();
      metrics_->slot_ends_read_late_total().Increment();
      if (late_end_reads_++ % 100 == 0) {
        Log(LogLevel::kWarning, kComponent,
            "slot " + std::to_string(slot) + ": the log ends were read " +
                FixedDecimal(cuts_read_at_ - (latest + config_.cut_grace_seconds), 3) +
                " s after the next slot's time; they do not bound the next slot's cuts "
                "(vipsd_slot_ends_read_late_total counts such slots; this line repeats every "
                "100)");
      }
    }
  }
  if (paced_ && step_->CutsLocally()) {
    const Status recorded = keeper_->RecordCuts(slot, cuts);
    if (!recorded.ok()) {
      // A log end below an earlier cut (the topic was deleted and recreated,
      // or truncated): the windows would be wrong; stop stepping.
      keeper_->Stick(recorded);
      Log(LogLevel::kError, kComponent,
          "slot " + std::to_string(slot) + ": " + recorded.ToString() +
              "; no further step until an operator acts");
      (void)keeper_->SkipTo(slot);
    }
  } else if (!paced_) {
    (void)keeper_->SkipTo(slot);
  }
  if (overflow && !overflow_) {
    StopSteppingOnOverflow(slot,
                           "its window holds more than pool.capacity = " +
                               std::to_string(config_.pool_capacity) + " records",
                           &out);
  }
  if (!overflow && step_->CutsLocally()) {
    out.records_late = AdmitWindow(cuts);
    if (out.records_late > 0 && !late_records_logged_) {
      late_records_logged_ = true;  // once per run; vipsd_records_read_late_total counts them
      out.log_lines.emplace_back(
          LogLevel::kWarning,
          "slot " + std::to_string(slot) + ": " + std::to_string(out.records_late) +
              " record(s) stamped at or before the previous slot's time were readable only "
              "after its cut was read (slot time + schedule.cut_grace_seconds = " +
              ShortestNumber(config_.cut_grace_seconds) +
              " s); they joined this slot. Raise cut_grace_seconds above the brokers' "
              "replication lag plus their clock skew to this host "
              "(vipsd_records_read_late_total counts them)");
    }
  }
  if (paced_ && step_->CutsLocally()) {
    previous_cut_time_ms_ = state.windows.CutTimeMs(slot);
  }

  return true;
}

bool Daemon::StepOrSkip(int64_t slot, SlotOutputs& out) {
  bool stepped = false;
  if (keeper_->failing()) {
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kError).Increment();
  } else if (keeper_->sticky()) {
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kError).Increment();
    // Said at the first slot it stops, then every 5 minutes (the skips are
    // counted in vipsd_slots_skipped_total{reason="error"}).
    if (sticky_logged_at_ == 0 || WallNow() - sticky_logged_at_ >= 300) {
      sticky_logged_at_ = WallNow();
      out.log_lines.emplace_back(LogLevel::kError,
                                 "slot " + std::to_string(slot) +
                                     ": not stepping after an earlier failure (" +
                                     keeper_->sticky()->ToString() +
                                     "); restart vipsd after fixing the cause");
    }
  } else if (overflow_) {
    // Stepping stopped at the first overflow (StopSteppingOnOverflow).
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kWindowOverflow).Increment();
  } else if (!overrun_stopped_.empty() || slot == overrun_skip_slot_ ||
             (paced_ && StopsAtOverruns() && out.deadline > 0 && WallNow() > out.deadline)) {
    // Stepping stopped by an overrun; the slot after a short one (its
    // deadline carries the late outputs, whatever the overrun's length); or
    // a slot begun only after its deadline (a step begun now would overrun:
    // the next slot's window still holds these records when
    // schedule.window_steps is above 1).
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kOverrun).Increment();
  } else {
    const bool was_halted = halted_;
    stepped = RunStep(slot, &out);
    if (stepped && was_halted) {
      out.log_lines.emplace_back(LogLevel::kInfo, "the budget admits the next step again; resuming");
    }
  }
  return stepped;
}

void Daemon::RecordSharedCuts(int64_t slot, SlotOutputs& out) {
  if (paced_ && !step_->CutsLocally()) {
    // Shared work: the cuts the step's partials named. A slot not stepped
    // to the end has none: it is recorded as missed (its records belong to
    // the next slot stepped, whose floors are at least this slot's ends).
    const Status recorded = shared_cuts_.empty() ? keeper_->SkipTo(slot)
                                                 : keeper_->RecordCuts(slot, shared_cuts_);
    if (!recorded.ok()) {
      keeper_->Stick(recorded);
      out.log_lines.emplace_back(LogLevel::kError,
                                 "slot " + std::to_string(slot) + ": " + recorded.ToString() +
                                     "; no further step until an operator acts");
      (void)keeper_->SkipTo(slot);
    }
  }
}

bool Daemon::HoldIfLate(int64_t slot, SlotOutputs& out) {
  const bool overran = out.deadline > 0 && WallNow() > out.deadline && !control_.stopping();
  if (overran && overrun_stopped_.empty() && StopsAtOverruns() &&
      (out.stepped || slot == overrun_skip_slot_)) {
    // A step ran past its deadline (its duration is the data's: batch size,
    // E-step iterations — this process's or, for a shared-work coordinator,
    // its workers', whose partial sums it waits for). Nothing about this slot
    // leaves now, not even the ledger commit, or its time would tell how
    // long the step took. What the release topic shows of an overrun is
    // bounded per run (SECURITY.md "Overruns"):
    //  * short (the slot was done by the NEXT slot's deadline d_{k+1}): its
    //    outputs leave at d_{k+1}, under one commit with the next slot's, and
    //    the next slot runs no step — so that slot is on time whatever the
    //    overrun's length, and the release times show only "slot k
    //    overran";
    //  * long (done after d_{k+1}, or the slot after an overrun late itself),
    //    or more than schedule.max_overruns in this run: stepping stops for
    //    the run, as at an overflow; the late slots' releases are withheld
    //    (charged, never published) and they are caught up below.
    const double interval = keeper_->state().windows.interval_seconds();
    ++overruns_;
    const bool long_overrun = !late_.empty() || WallNow() > out.deadline + interval;
    if (!long_overrun && overruns_ <= config_.max_overruns) {
      out.late = true;
      overrun_skip_slot_ = slot + 1;
      late_.push_back(std::move(out));
      AdvanceWindow();
      return true;
    }
    overrun_stopped_ =
        long_overrun ? "slot " + std::to_string(late_.empty() ? slot : late_.front().slot) +
                           " ran past the next slot's deadline"
                     : "slot " + std::to_string(slot) + " is overrun number " +
                           std::to_string(overruns_) + " of this run, more than "
                           "schedule.max_overruns = " + std::to_string(config_.max_overruns);
    out.log_lines.emplace_back(
        LogLevel::kError,
        "stepping stopped for this run: " + overrun_stopped_ +
            "; its release is withheld (charged, not published) so that the release times say "
            "nothing of how long it took. Restart vipsd once the machine keeps up "
            "(docs/operations.md \"Overruns\"; each restart may show one more overrun)");
    for (SlotOutputs& held : late_) held.publish = false;
    out.publish = false;
  }
  if (overran) {
    // Late otherwise — a federated aggregator's round (its holders' shares
    // leave at public times, so its length does not depend on their data),
    // a slot begun after its deadline (no step ran),
    // schedule.on_overrun: catch_up — or caught up after stepping stopped. Its outputs wait for the next slot's deadline
    // and leave with that slot's, under one commit; a second late slot in a
    // row waits for the next boundary itself (so that outputs never wait
    // for ever when steps keep overrunning). Under catch_up, how late it was
    // then shows in the release times (SECURITY.md "Overruns").
    if (late_.empty()) {
      out.late = true;
      late_.push_back(std::move(out));
      AdvanceWindow();
      return true;
    }
    out.late = true;
    out.deadline = NextBoundary(out.deadline, WallNow());
  }
  return false;
}

void Daemon::FinishSlot(SlotOutputs& out, bool stepped) {
  // Nothing about this slot happens before its public deadline, not even
  // the ledger commit: the ledger file's times and its ledger-topic entry
  // would otherwise tell when the step finished, hence its batch size.
  const bool on_time = publisher_->WaitForDeadline(out);
  // Durable BEFORE anything about this slot leaves the process.
  const bool committed = CommitOrRetryLedger(&out);
  if (!committed) {
    out.publish = false;
    if (out.stepped || !late_.empty()) HoldUntilCommitted(out);
  }
  // A checkpoint is due if this slot's step or a late one it commits is a
  // multiple of checkpoint_every.
  bool checkpoint_due = stepped && out.step % config_.checkpoint_every == 0;
  for (const SlotOutputs& late : late_) {
    checkpoint_due = checkpoint_due || (late.stepped && late.step % config_.checkpoint_every == 0);
  }
  if (on_time) {
    Emit(out);
  } else {
    WithholdLateOnStop();
    publisher_->WithholdOnStop(out);
  }
  // After the release: the checkpoint's write time depends on the model's
  // size and the disk only, but it need not delay the release.
  if (checkpoint_due && committed) SaveCheckpointNow();
  AdvanceWindow();
}

void Daemon::WithholdLateOnStop() {
  for (const SlotOutputs& late : late_) publisher_->WithholdOnStop(late);
  late_.clear();
}

// ---------------------------------------------------------------------------
// The ledger and what follows it

bool Daemon::CommitOrRetryLedger(SlotOutputs* out) {
  const LedgerKeeper::CommitResult result = keeper_->CommitOrRetry(driver_->next_step(), WallNow());
  if (result == LedgerKeeper::CommitResult::kFailed) return false;
  out->ledger_committed = true;
  out->ledger_commit_seconds = keeper_->last_commit_seconds();
  PublishResumeOffsets();
  if (result == LedgerKeeper::CommitResult::kRecovered && model_step_ > 0 &&
      publisher_->published_step() != model_step_) {
    // A step that ran before the failure was never released; its charge is
    // durable now, so its model may leave.
    publisher_->Owe();
  }
  return true;
}

void Daemon::OnFenced(const Status& error) {
  // Another process owns the budget now: nothing of this process may leave
  // any more, and it stops (Run returns this error).
  keeper_->Stick(error);
  run_error_ = error;
  Log(LogLevel::kError, kComponent, error.ToString());
  RequestStop();
}

void Daemon::HoldUntilCommitted(SlotOutputs& out) {
  // Nothing about a step appears before its charge is durable: its log
  // lines, alerts and metrics wait for the commit that covers it (a retry's,
  // which then reports it); a restart before that runs the step again. The
  // late slots this commit was to cover wait with it, oldest first.
  std::vector<SlotOutputs> held;
  for (SlotOutputs& late : late_) held.push_back(std::move(late));
  late_.clear();
  if (out.stepped) {
    held.push_back(out);
    out.records_late = 0;  // counted when the held copy is reported
  }
  out.stepped = false;
  out.partials_local = out.partials_remote = 0;
  out.alerts.clear();
  out.log_lines.clear();
  for (SlotOutputs& step_out : held) {
    step_out.publish = false;  // the publisher owes its model once committed
    if (step_out.stepped) {
      out.log_lines.emplace_back(
          LogLevel::kError,
          "slot " + std::to_string(step_out.slot) + ": step " + std::to_string(step_out.step) +
              " ran but its ledger commit failed; nothing about it is released or reported "
              "until a commit succeeds (a restart before then runs step " +
              std::to_string(step_out.step) + " again)");
    }
    uncommitted_.push_back(std::move(step_out));
  }
}

int64_t Daemon::UncommittedSteps() const {
  int64_t steps = 0;
  for (const SlotOutputs& held : uncommitted_) steps += held.stepped ? 1 : 0;
  for (const SlotOutputs& late : late_) steps += late.stepped ? 1 : 0;
  return steps;
}

void Daemon::SaveCheckpointNow() {
  const LedgerState& state = keeper_->state();
  double seconds = 0;
  const Status saved = keeper_->SaveCheckpoint({state.run_id, model_step_, bundle_.model->type(),
                                                bundle_.model_fingerprint,
                                                bundle_.model->CheckpointArrays()},
                                               &seconds);
  if (saved.ok()) {
    metrics_->checkpoint_writes_total().Increment();
    metrics_->checkpoint_write_duration_seconds().Observe(seconds);
  } else {
    metrics_->checkpoint_failures_total().Increment();
    Log(LogLevel::kError, kComponent, "checkpoint failed: " + saved.ToString());
  }
}

// ---------------------------------------------------------------------------
// A slot's outputs

void Daemon::Emit(SlotOutputs& out) {
  // Called at the slot's deadline (WaitForDeadline): everything is at a
  // public time.
  Publisher::ReportContext context;
  context.pool_size = pool_.size();
  context.coordinator = !step_->CutsLocally();
  context.expose_step_timing = config_.expose_step_timing;
  auto report = [&](const SlotOutputs& step_out) {
    if (config_.is_private()) {
      context.epsilon = FixedDecimal(CommittedEpsilon(), 4) + "/" + ShortestNumber(config_.driver.epsilon_ceiling);
    }
    std::string line = publisher_->ReportStep(step_out, context);
    if (step_out.partials_local + step_out.partials_remote > 0) {
      MutexLock lock(&status_mutex_);
      status_.partials_merged_local += step_out.partials_local;
      status_.partials_merged_remote += step_out.partials_remote;
    }
    return line;
  };
  // Slots this slot's commit also covers, reported now: steps whose own
  // commit failed (their model leaves through the owed release), then late
  // slots (ProcessSlot; their release is this slot's: the latest model).
  bool late_publish = false;
  if (out.ledger_committed) {
    for (std::vector<SlotOutputs>* held : {&uncommitted_, &late_}) {
      const std::string suffix = held == &uncommitted_ ? " committed_at_slot=" : " reported_at_slot=";
      for (const SlotOutputs& step_out : *held) {
        if (step_out.late) publisher_->CountOverrun(step_out.slot, out.slot);
        if (step_out.records_late > 0) {
          metrics_->records_read_late_total().Increment(static_cast<double>(step_out.records_late));
        }
        const std::string line = report(step_out);
        for (const std::string& alert : step_out.alerts) {
          publisher_->PublishAlert(alert, !config_.alert_topic.empty());
        }
        if (!line.empty()) {
          Log(LogLevel::kInfo, kComponent, line + suffix + std::to_string(out.slot));
        }
        late_publish = late_publish || step_out.publish;
      }
      held->clear();
    }
  }
  if (out.late) publisher_->CountOverrun(out.slot, out.slot);
  if (out.charged_unfinished && config_.federation.role == config::FederationRole::kAggregator) {
    metrics_->federation_rounds_total(RoundOutcome::kAbandoned).Increment();
  }
  if (out.ledger_committed) {
    metrics_->ledger_commits_total().Increment();
    metrics_->ledger_commit_duration_seconds().Observe(out.ledger_commit_seconds);
  }
  metrics_->slot().Set(static_cast<double>(out.slot));
  metrics_->last_slot_timestamp_seconds().Set(
      paced_ ? keeper_->state().windows.SlotTime(out.slot) : WallNow());
  if (out.records_late > 0) {
    metrics_->records_read_late_total().Increment(static_cast<double>(out.records_late));
  }
  metrics_->pool_records().Set(static_cast<double>(
      out.window_offsets >= 0 ? out.window_offsets : static_cast<int64_t>(pool_.size())));
  // An unpaced (offline) run has no public clock: its releases carry the
  // time the run started, never the moment a step finished.
  const double publish_time = out.deadline > 0 ? out.deadline : run_started_at_;
  std::string line = report(out);
  UpdateBudgetMetrics();
  const bool retry_due = publisher_->retry_due(WallNow());
  if (!keeper_->sticky() && !keeper_->failing() && model_step_ > 0 &&
      (out.publish || late_publish || retry_due)) {
    const Status published = PublishModel(publish_time);
    if (published.ok()) {
      if (out.stepped) line += " released=step-" + std::to_string(model_step_);
    } else {
      Log(LogLevel::kError, kComponent, "release failed: " + published.ToString());
    }
  }
  for (const std::string& alert : out.alerts) {
    publisher_->PublishAlert(alert, !config_.alert_topic.empty());
  }
  if (!line.empty()) Log(LogLevel::kInfo, kComponent, line);
  publisher_->WriteStatus({&config_, halted_, keeper_->failing(),
                           keeper_->committed().windows.last_slot()});
}

StatusOr<release::Release> Daemon::BuildRelease(double publish_time) const {
  ReleaseFacts facts;
  facts.step = model_step_;
  facts.rho = model_step_result_.has_value() ? model_step_result_->rho : 0;
  // ε, accountant and conversion from one evaluation of the ledger
  // (MakeRelease writes "none" / 0 for non-private runs).
  const LedgerState& state = keeper_->state();
  auto spent = LedgerSpent(state, config_.driver.delta, keeper_->fixed_schedule());
  facts.epsilon_spent = spent.ok() ? spent->epsilon : std::numeric_limits<double>::infinity();
  facts.accountant = spent.ok() ? spent->accountant : keeper_->AccountantName(config_.driver.delta);
  facts.conversion = spent.ok() ? spent->conversion : "rdp_improved";
  facts.schedule = ScheduleKindName(state.schedule);
  facts.noise_is_private = noise_->is_private();
  facts.noise_description = noise_->description();
  // The step's own (q, σ); before any step in this process, the configured.
  facts.mechanism = model_step_result_.has_value() ? model_step_result_->mechanism
                                                   : driver_->config().mechanism;
  // The grid and the discrete noise (public: functions of the layout and σ).
  if (facts.mechanism.is_private()) {
    auto discrete =
        privacy::DiscreteNoiseFor(bundle_.model->statistic_layout(),
                                  facts.mechanism.noise_multiplier);
    if (discrete.ok()) {
      facts.noise_description += "; " + privacy::DescribeDiscreteNoise(*discrete);
    }
  }
  facts.created_at = publish_time;
  if (facts.rho <= 0) {
    facts.rho = svi::StepSize(config_.driver.tau0, config_.driver.kappa,
                              std::max<int64_t>(model_step_, 1));
  }
  return MakeRelease(bundle_, config_, facts);
}

Status Daemon::PublishModel(double publish_time) {
  // Right before the release leaves: still the owner? A process paused
  // since its commit may have been replaced meanwhile (the standby took
  // over); then nothing more leaves. This narrows, but cannot close, the
  // window in which a paused owner publishes late (README "Several
  // instances").
  const Status owner = keeper_->ConfirmOwner();
  if (!owner.ok() && keeper_->fenced()) {
    OnFenced(owner);
    return owner;
  }
  const Status published = publisher_->PublishModel(
      model_step_, publish_time, [&] { return BuildRelease(publish_time); }, owner);
  if (published.ok()) {
    MutexLock lock(&status_mutex_);
    status_.last_published_step = model_step_;
  }
  return published;
}

// ---------------------------------------------------------------------------
// Run

double Daemon::NextBoundary(double deadline, double now) const {
  const double interval = keeper_->state().windows.interval_seconds();
  if (now <= deadline || interval <= 0) return deadline;
  return deadline + std::ceil((now - deadline) / interval) * interval;
}

double Daemon::WaitForFinalReleaseTime() {
  const svi::SlotWindows& windows = keeper_->state().windows;
  // Late (a slow disk, a late step): the next public boundary after now,
  // t + j × interval.
  const double at = NextBoundary(
      windows.SlotTime(windows.last_slot() + 1) + config_.release_delay_seconds, WallNow());
  // A stop request ends the wait: its time is the operator's, not the data's.
  (void)control_.SleepUntil(at);
  return at;
}

bool Daemon::IsFinished() const {
  if (config_.max_steps > 0 && paced_ && steps_run_ >= config_.max_steps) return true;
  if (!paced_ && step_limit_ > 0 && steps_run_ >= step_limit_) return true;
  if (halted_ && (config_.on_ceiling == config::CeilingAction::kExit || !paced_)) return true;
  if (!paced_ && (keeper_->sticky() || keeper_->failing())) return true;
  return false;
}

Status Daemon::Run() {
  run_started_at_ = std::floor(WallNow());
  ingest_->SetCapacity(paced_ ? config_.pool_capacity : 0);
  if (paced_) {
    ingest_->SetTimestampPolicy(config_.source_timestamps == "create_time"
                                    ? TimestampPolicy::kAny
                                    : TimestampPolicy::kLogAppendTime);
  }
  metrics_->SetAccountingMode(keeper_->state().mode);
  // The start-up check made the ledger's unit and cap the configured ones.
  metrics_->SetPrivacyUnit(config_.privacy_unit, config_.driver.max_records_per_unit);
  metrics_->step().Set(static_cast<double>(driver_->next_step() - 1));
  const Status initialized = Initialize();
  if (!initialized.ok()) {
    if (initialized.code() == StatusCode::kCancelled) return Status::Ok();
    return initialized;
  }
  UpdateBudgetMetrics();
  Log(LogLevel::kInfo, kComponent,
      "started: model=" + bundle_.model->type() + " next_step=" +
          std::to_string(driver_->next_step()) + " accounting=" +
          std::string(AccountingModeName(keeper_->state().mode)) +
          (config_.is_private() ? " epsilon_spent=" + FixedDecimal(EpsilonSpent(), 4) + "/" +
                                      ShortestNumber(config_.driver.epsilon_ceiling)
                                : " NOT PRIVATE (noise_multiplier 0)") +
          " model_step=" + std::to_string(model_step_) +
          (paced_ ? " slot_interval=" + ShortestNumber(config_.step_interval_seconds) +
                        "s window_steps=" +
                        (config_.window_steps == svi::kWindowAll
                             ? std::string("all")
                             : std::to_string(config_.window_steps))
                  : std::string(" source=file")));
  InputSource* source = source_.get();
  ingest_->Start(std::move(source_));
  if (paced_) clock_->Start(source);
  int64_t slot = paced_ ? clock_->next_slot() : keeper_->state().windows.last_slot() + 1;
  while (!IsFinished()) {
    std::map<std::string, StreamBounds> bounds;
    if (!WaitForCuts(slot, &bounds)) break;
    ProcessSlot(slot, bounds);
    if (control_.stopping()) break;
    ++slot;
  }
  if (!late_.empty()) {
    // The loop ended right after a late slot. Its charge is committed
    // first; then its outputs leave at the next public boundary if the run
    // ended by itself, or are withheld (log lines said) on a stop.
    SlotOutputs out;
    out.slot = late_.back().slot;
    const bool ended = IsFinished() && !control_.stopping();
    out.deadline = ended && paced_ ? WaitForFinalReleaseTime() : 0;
    const bool committed = CommitOrRetryLedger(&out);
    if (committed && ended && !control_.stopping()) {
      Emit(out);
    } else if (committed) {
      WithholdLateOnStop();
    } else {
      HoldUntilCommitted(out);  // not durable: said, and not counted as run
      for (const auto& [level, line] : out.log_lines) Log(level, kComponent, line);
    }
  }
  if (config_.max_steps > 0 && steps_run_ >= config_.max_steps) {
    Log(LogLevel::kInfo, kComponent, "schedule.max_steps reached; stopping");
  }
  if (!keeper_->sticky() && !keeper_->failing() && model_step_ > keeper_->checkpoint_step() &&
      steps_run_ > 0) {
    // The model of the last step (checkpoint_every > 1): kept for a restart.
    SaveCheckpointNow();
  }
  const bool completed = IsFinished();
  if (completed && !keeper_->sticky() && !keeper_->failing() && steps_run_ > 0 &&
      publisher_->published_step() != model_step_ && (!halted_ || !paced_)) {
    // The run ended by itself (max_steps, max_epochs, an offline ceiling):
    // its last model is the final release, at the end of the run — on the
    // public clock, like every release: the next slot's deadline, not when
    // the last step, the checkpoint and the eviction happened to finish.
    const Status published = PublishModel(paced_ ? WaitForFinalReleaseTime() : run_started_at_);
    if (!published.ok()) Log(LogLevel::kError, kComponent, "final release failed: " + published.ToString());
    publisher_->WriteStatus({&config_, halted_, keeper_->failing(),
                             keeper_->committed().windows.last_slot()});
  }
  if (publisher_->owed() && !keeper_->sticky()) {
    Log(LogLevel::kWarning, kComponent,
        "stopping with the release of step " + std::to_string(model_step_) +
            " undelivered (the sink kept failing); the next release will include it");
  }
  RequestStop();
  clock_->Join();
  ingest_->Join();
  Status result = ingest_->error().value_or(Status::Ok());
  if (result.ok() && run_error_) result = *run_error_;
  if (result.ok() && !paced_ && keeper_->sticky()) result = *keeper_->sticky();
  if (result.ok() && keeper_->failing()) result = keeper_->FailingError(WallNow());
  ingest_->Close();
  const Status flushed = sink_->Close();
  if (!flushed.ok()) Log(LogLevel::kWarning, kComponent, "closing the sink: " + flushed.ToString());
  UpdateBudgetMetrics();
  // What is durable: a step whose commit never succeeded is not counted.
  Log(LogLevel::kInfo, kComponent,
      "stopped: next_step=" + std::to_string(keeper_->committed().next_step) + " steps_this_run=" +
          std::to_string(steps_run_ - UncommittedSteps()) +
          (config_.is_private() ? " epsilon_spent=" + FixedDecimal(CommittedEpsilon(), 4) : ""));
  return result;
}

}  // namespace vipsd::daemon
