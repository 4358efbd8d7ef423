#include "daemon/step/holder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/base/format.h"
#include "core/base/log.h"
#include "core/privacy/mechanisms/distributed_noise.h"
#include "core/svi/step_driver.h"
#include "daemon/parts/publisher.h"
#include "daemon/setup/federation.h"
#include "daemon/setup/startup_check.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "holder";
// A holder that no plan names asks to join every kJoinInterval; after
// kSilence without any plan (the aggregator restarted, halted or is not up
// yet) every kSilence. A holder that plans keep naming does not ask.
constexpr auto kJoinInterval = std::chrono::seconds(3);
constexpr auto kSilence = std::chrono::seconds(30);

int64_t WallNowMs() { return static_cast<int64_t>(std::floor(WallNow() * 1000)); }

}  // namespace

StatusOr<std::unique_ptr<Holder>> Holder::Create(const config::VipsdConfig& config,
                                                 SourceFactory make_source,
                                                 std::unique_ptr<OutputSink> sink,
                                                 Metrics* metrics,
                                                 std::unique_ptr<WorkExchange> exchange,
                                                 DaemonOptions options) {
  if (metrics == nullptr || sink == nullptr || !make_source || exchange == nullptr ||
      config.federation.role != config::FederationRole::kHolder || !config.is_private()) {
    return InvalidArgumentError(
        "a holder needs federation.role: holder, a private configuration, a source factory, a "
        "sink, metrics and a work exchange");
  }
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  // The key first: a holder whose key is not the roster's entry for its id
  // stops before it reads anything.
  VIPSD_ASSIGN_OR_RETURN(privacy::Masker masker, HolderMaskerOf(config.federation));
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  VIPSD_ASSIGN_OR_RETURN(std::optional<LedgerState> previous, ledger.Load());
  VIPSD_ASSIGN_OR_RETURN(PreparedState prepared,
                         PrepareState(config, bundle, std::move(previous), ledger.path()));
  VIPSD_ASSIGN_OR_RETURN(auto noise, NewNoiseSource(config));
  // Rounds at or below the last one it masked are never answered again.
  masker.set_last_round(static_cast<uint64_t>(prepared.state.next_step - 1));
  auto keeper = std::make_unique<LedgerKeeper>(std::move(ledger), std::move(prepared.state),
                                               /*replica=*/nullptr, config.state_directory,
                                               metrics);
  VIPSD_RETURN_IF_ERROR(keeper->UseFixedSchedule(true));
  // A new directory's ledger exists before anything is read.
  VIPSD_RETURN_IF_ERROR(keeper->Commit(keeper->state().next_step));
  return std::unique_ptr<Holder>(new Holder(config, std::move(options), std::move(bundle),
                                            std::move(sink), metrics, std::move(keeper),
                                            std::move(noise),
                                            std::move(masker), std::move(exchange),
                                            std::move(make_source)));
}

Holder::Holder(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
               std::unique_ptr<OutputSink> sink, Metrics* metrics,
               std::unique_ptr<LedgerKeeper> keeper, std::unique_ptr<privacy::NoiseSource> noise,
               privacy::Masker masker, std::unique_ptr<WorkExchange> exchange,
               SourceFactory make_source)
    : WorkFollower(config, std::move(options), std::move(bundle), std::move(sink), metrics,
                   std::move(noise), std::move(exchange), std::move(make_source)),
      keeper_(std::move(keeper)),
      masker_(std::move(masker)) {
  terms_ = FederationTerms(config_, bundle_.record_settings);
  last_plan_ = std::chrono::steady_clock::now();  // the silence counts from the start
}

Holder::~Holder() { Shutdown(); }

Status Holder::Send(const FederatedPlan& plan, ShareKind kind, const std::string& reason,
                    std::vector<uint64_t> masked) {
  FederatedShare share;
  share.job = config_.ledger_key;
  share.epoch = plan.epoch;
  share.step = std::max<int64_t>(plan.step, 1);
  share.holder = config_.federation.holder_id;
  share.incarnation = keeper_->state().run_id;
  share.kind = kind;
  share.reason = reason;
  if (kind == ShareKind::kJoin) share.terms = terms_;
  share.noise_private = noise_->is_private();
  share.masked = std::move(masked);
  return work_.Append(EncodeFederatedShare(share)).status();
}

std::string Holder::Mismatch(const FederatedPlan& plan) const {
  std::string out;
  auto add = [&out](const std::string& text) { out += (out.empty() ? "" : "; ") + text; };
  if (plan.terms != terms_) {
    add(SettingsDifference(plan.terms, terms_, "aggregator", "this holder"));
  }
  if (static_cast<int64_t>(plan.tolerated) < config_.federation.tolerated_holders) {
    add("federation.tolerated_holders: aggregator " + std::to_string(plan.tolerated) +
        ", this holder requires at least " +
        std::to_string(config_.federation.tolerated_holders));
  }
  const double timeout = static_cast<double>(plan.due_ms - plan.issued_ms) / 1000;
  if (config_.federation.share_delay_seconds > timeout - 1) {
    add("federation.share_delay_seconds: this holder " +
        ShortestNumber(config_.federation.share_delay_seconds) +
        ", which leaves less than 1 s before the aggregator's federation.round_timeout_seconds " +
        ShortestNumber(timeout));
  }
  return out;
}

bool Holder::WaitUntil(int64_t at_ms) {
  for (;;) {
    if (control_.stopping()) return false;
    const int64_t left = at_ms - WallNowMs();
    if (left <= 0) return true;
    (void)control_.PauseFor(std::chrono::milliseconds(std::min<int64_t>(left, 100)));
  }
}

bool Holder::InputReady() {
  if (!ingest_.AssignmentReported()) return false;
  auto bounds = ingest_.source()->ObserveBounds(WallNow());
  if (!bounds.ok() || bounds->empty()) return false;
  for (const auto& [stream, b] : *bounds) {
    if (!ingest_.Assigned(stream)) return false;
  }
  return true;
}

Status Holder::StopForRun(const FederatedPlan& plan, int64_t share_at_ms, const std::string& why,
                          bool silent) {
  stopped_ = why;
  named_ = false;
  if (silent) {
    ++withheld_;
    metrics_->federation_rounds_total(RoundOutcome::kWithheld).Increment();
  }
  Log(LogLevel::kError, kComponent,
      "round " + std::to_string(plan.step) + ": " + why +
          "; this holder takes part in no further round of this run (what a data-dependent "
          "failure tells the aggregator is bounded to one per run: docs/federation.md); restart "
          "it once the cause is fixed");
  if (silent || !WaitUntil(share_at_ms)) return Status::Ok();
  // A fixed public reason: which failure it was stays in this log.
  ++declined_;
  metrics_->federation_rounds_total(RoundOutcome::kDeclined).Increment();
  return Send(plan, ShareKind::kDecline, "this holder stopped for this run");
}

bool Holder::CutWindows(const FederatedPlan& plan, int64_t deadline_ms, WorkPlan* local,
                        std::vector<LocalStream>* ready, std::map<std::string, int64_t>* cuts,
                        std::string* why) {
  auto bounds = ingest_.source()->ObserveBounds(WallNow());
  if (!bounds.ok()) {
    *why = "its input's log bounds could not be read";
    Log(LogLevel::kWarning, kComponent, "round " + std::to_string(plan.step) + ": " +
                                            bounds.status().ToString());
    return false;
  }
  const svi::SlotWindows& windows = keeper_->state().windows;
  for (const auto& [stream, b] : *bounds) {
    if (!windows.HasStream(stream)) (void)keeper_->AddStream(stream, b.start);
  }
  SlotTargets targets;
  targets.cut_time_ms = plan.cut_time_ms;
  local->streams.clear();
  std::vector<std::string> names = windows.Streams();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const svi::OffsetRange window = windows.Window(name, plan.slot);
    int64_t end = window.high;
    if (const auto it = bounds->find(name); it != bounds->end()) end = std::max(it->second.end, window.low);
    // No cut below the previous one. Unlike one vipsd, which also floors
    // the cut at the log end it observed at the previous slot's public
    // time, a holder observes when a plan arrives, which follows how fast
    // the aggregator ran: that end must not decide which records a slot
    // holds, so the cut here is decided by the records' timestamps alone.
    const int64_t floor = std::clamp(window.high, window.low, end);
    targets.streams[name] = {end, floor};
    local->streams.push_back({name, window.low, floor, end});
    ingest_.SetResumeOffset(name, window.low);
    DropLocalBelow(ingest_, pool_, name, window.low);
  }
  ingest_.SetTargets(targets);
  for (;;) {
    if (control_.stopping()) {
      *why = "stopping";
      return false;
    }
    bool complete = true;
    for (const WorkStream& stream : local->streams) {
      if (stream.high == stream.low) continue;
      if (ingest_.Overflowing(stream.name)) {
        *why = "its window of " + stream.name + " holds more than pool.capacity = " +
               std::to_string(config_.pool_capacity) + " records";
        return false;
      }
      complete = complete && ingest_.Assigned(stream.name) && ingest_.Complete(stream.name);
    }
    if (complete) {
      // As one vipsd: the window's records held, over every stream.
      const int64_t held = ingest_.Progress({}, [](const std::string&) { return int64_t{0}; }).held;
      if (config_.pool_capacity > 0 && held > config_.pool_capacity) {
        *why = "its window holds more than pool.capacity = " +
               std::to_string(config_.pool_capacity) + " records";
        return false;
      }
      break;
    }
    if (WallNowMs() >= deadline_ms) {
      *why = "its input was not read to the slot's cut by its share time";
      return false;
    }
    (void)control_.PauseFor(std::chrono::milliseconds(20));
  }
  ready->clear();
  cuts->clear();
  for (const WorkStream& stream : local->streams) {
    const int64_t cut = stream.high == stream.low ? stream.high : ingest_.Target(stream.name);
    (*cuts)[stream.name] = cut;
    if (cut > stream.low) ready->push_back({&stream, cut});
  }
  return true;
}

Status Holder::Decline(const FederatedPlan& plan, const std::string& reason) {
  named_ = false;  // the aggregator drops it from the participants: it asks again
  ++declined_;
  metrics_->federation_rounds_total(RoundOutcome::kDeclined).Increment();
  return Send(plan, ShareKind::kDecline, reason);
}

void Holder::PrepareBudgetCheck() {
  // The next round's budget check (and, in the background, the one after):
  // a PLD composition that can take seconds at a new step count, computed
  // while no plan waits, so that a round's share time is not spent on it.
  // Public: a function of (q, σ, δ) and the number of rounds charged.
  if (halted_) return;
  double epsilon_after = 0, window_epsilon = 0;
  (void)keeper_->AdmitsStep(config_.driver.mechanism,
                            {config_.driver.epsilon_ceiling, config_.driver.delta}, &epsilon_after,
                            &window_epsilon);
}

void Holder::Observe() {
  // After the round's outcome left (its share time, or later): nothing here
  // tells when the round's work ended.
  const LedgerState& state = keeper_->state();
  const double delta = config_.driver.delta;
  metrics_->SetPrivacyBudget(keeper_->EpsilonOf(state, delta, true),
                             config_.driver.epsilon_ceiling, delta);
  metrics_->privacy_budget_warning_level().Set(state.warning_level);
  metrics_->privacy_halted().Set(halted_ ? 1 : 0);
  metrics_->federation_holder_stopped().Set(stopped_.empty() ? 0 : 1);
  metrics_->federation_last_round().Set(static_cast<double>(masker_.last_round()));
  metrics_->step().Set(static_cast<double>(state.next_step - 1));
  if (rounds_charged_unobserved_ > 0) {
    metrics_->steps_total().Increment(static_cast<double>(rounds_charged_unobserved_));
  }
  if (commits_unobserved_ > 0) {
    metrics_->ledger_commits_total().Increment(static_cast<double>(commits_unobserved_));
  }
  rounds_charged_unobserved_ = 0;
  commits_unobserved_ = 0;
  if (!pending_warning_.empty()) {
    Log(LogLevel::kWarning, kComponent, pending_warning_);
    pending_warning_.clear();
  }
  StatusFacts facts(&config_, halted_, false, state.windows.last_slot());
  facts.holder_stopped = stopped_;
  facts.holder_shares = shares_;
  facts.holder_declined = declined_;
  facts.holder_withheld = withheld_;
  WriteStatusFile(facts, 0, 0);
}

Status Holder::OnPlan(const FederatedPlan& plan) {
  if (std::optional<Status> ended = Admit(plan)) return *ended;
  return PlayRound(plan);
}

std::optional<Status> Holder::Admit(const FederatedPlan& plan) {
  const std::string& id = config_.federation.holder_id;
  // The pads are bound to the aggregator's run and the roster
  // (core/privacy/mechanisms/secure_aggregation.h), and this state directory serves one
  // run: its rounds, counted from 1 by that run's ledger, are the only
  // ones its last masked round refers to. Another run (another job with the
  // same key files, or an aggregator whose state was reset) is refused.
  if (!keeper_->state().federation_run.empty() && keeper_->state().federation_run != plan.run) {
    const std::string why =
        "this holder's state directory " + config_.state_directory +
        " serves the aggregator run " + keeper_->state().federation_run + " and the plan is of run " +
        plan.run + " (another job, or an aggregator whose state directory was reset): a holder's "
        "state directory serves one aggregator run, so that no pad is used twice; give this "
        "job a new state directory";
    (void)Send(plan, ShareKind::kDecline, "another aggregator run than this holder's");
    return InvalidArgumentError("cannot follow the aggregator's plans: " + why);
  }
  last_plan_ = std::chrono::steady_clock::now();
  if (plan.step <= static_cast<int64_t>(masker_.last_round())) return Status::Ok();
  // Any plan of the job, naming this holder or not: one it could not follow
  // stops it before anything is charged.
  const std::string mismatch = Mismatch(plan);
  // Named as this incarnation (this state directory's run id): a plan that
  // names an earlier one — made before this directory was reset — is not
  // this holder's to answer; it asks to join as it is now.
  const auto at = std::lower_bound(plan.participants.begin(), plan.participants.end(), id);
  const bool named = at != plan.participants.end() && *at == id &&
                     plan.incarnations[static_cast<size_t>(at - plan.participants.begin())] ==
                         keeper_->state().run_id;
  if (!mismatch.empty()) {
    if (named) (void)Send(plan, ShareKind::kDecline, "configuration differs: " + mismatch);
    return InvalidArgumentError("cannot follow the aggregator's plans: " + mismatch);
  }
  named_ = named && stopped_.empty();
  if (!named) {
    if (!halted_ && stopped_.empty() && joined_for_step_ != plan.step && InputReady()) {
      joined_for_step_ = plan.step;
      last_join_ = std::chrono::steady_clock::now();
      join_sent_ = true;
      VIPSD_RETURN_IF_ERROR(Send(plan, ShareKind::kJoin, ""));
      Log(LogLevel::kInfo, kComponent,
          "round " + std::to_string(plan.step) + " does not name this holder: asked to join");
    }
    return Status::Ok();
  }
  if (!stopped_.empty()) return Decline(plan, "this holder stopped for this run");
  if (!join_sent_) {
    // Named as it was before this process started (the same state
    // directory): it has not joined since, and its input may not be
    // assigned yet. Declined at once (a public reason: joins are public),
    // so that a restart costs at most this one round; it joins when its
    // input is assigned.
    Log(LogLevel::kInfo, kComponent,
        "round " + std::to_string(plan.step) +
            " names this holder as it was before it started: declined (nothing charged); it "
            "asks to join once its input is assigned");
    return Decline(plan, "restarted; it joins when its input is assigned");
  }
  VIPSD_RETURN_IF_ERROR(masker_.Bind(plan.run + ":" + plan.roster));
  // Recorded with this round's commit, before its share leaves.
  VIPSD_RETURN_IF_ERROR(keeper_->BindFederationRun(plan.run));
  // The model the round starts from (public: post-processing of releases).
  auto model =
      DecodePlanModel(plan.model, work_.Describe() + " plan", bundle_, "the aggregator's");
  Status restored = model.status();
  if (restored.ok()) restored = bundle_.model->RestoreCheckpoint(model->arrays);
  if (!restored.ok()) {
    (void)Send(plan, ShareKind::kDecline, "the plan's model cannot be used");
    return InvalidArgumentError("cannot follow the aggregator's plans: " +
                                std::string(restored.message()));
  }
  return std::nullopt;  // it takes part
}

Status Holder::PlayRound(const FederatedPlan& plan) {
  const LedgerState& state = keeper_->state();
  svi::DriverConfig driver_config = config_.driver;
  driver_config.adaptivity = AccountingAdaptivity();
  // As the daemon: the keeper checks a fixed schedule's budget, the driver
  // the RDP filter's as it charges.
  driver_config.enforce_ceiling = state.schedule == ScheduleKind::kAdaptive;
  VIPSD_ASSIGN_OR_RETURN(auto driver,
                         svi::StepDriver::Create(bundle_.model.get(), noise_.get(), *keeper_,
                                                 driver_config, plan.step));
  // Its own budget, on public parameters, before anything is read.
  double epsilon_after = 0, window_epsilon = 0;
  if (!keeper_->AdmitsStep(driver_config.mechanism,
                           {driver_config.epsilon_ceiling, driver_config.delta}, &epsilon_after,
                           &window_epsilon)) {
    if (!halted_) {
      Log(LogLevel::kWarning, kComponent,
          "epsilon ceiling reached: round " + std::to_string(plan.step) + " would spend epsilon=" +
              FixedDecimal(epsilon_after, 4) + " > privacy.epsilon_ceiling=" +
              ShortestNumber(driver_config.epsilon_ceiling) +
              " for this holder's records; it declines every further round");
    }
    halted_ = true;
    return Decline(plan, "this holder's epsilon ceiling is reached");
  }
  // The share's public time: the plan's, plus this holder's configured
  // delay. Nothing it sends for this round leaves before it, and the share
  // leaves exactly then or never: its timing says nothing of its data.
  const int64_t share_at =
      plan.issued_ms +
      static_cast<int64_t>(std::llround(config_.federation.share_delay_seconds * 1000));
  if (const int64_t late_ms = WallNowMs() - share_at; late_ms >= 0) {
    // When the plan arrived is not the data's doing (the previous round's
    // share left at its own public time): declined at once, not stopped.
    Log(LogLevel::kWarning, kComponent,
        "round " + std::to_string(plan.step) + ": the plan arrived " + std::to_string(late_ms) +
            " ms after this holder's share time (federation.share_delay_seconds after the plan "
            "was issued; check the clocks and the work topic's latency); declined, nothing "
            "charged");
    return Decline(plan, "the plan arrived after its share time");
  }
  WorkPlan local;
  std::vector<LocalStream> ready;
  std::map<std::string, int64_t> cuts;
  std::string why;
  if (!CutWindows(plan, share_at, &local, &ready, &cuts, &why)) {
    if (control_.stopping()) return Status::Ok();
    // How many records there are, and how fast they were read, is the
    // data's: nothing charged, and one bit per run.
    return StopForRun(plan, share_at, why + " (nothing charged)", /*silent=*/false);
  }
  // Charged here, before any record is touched, with this holder's own
  // step key (the aggregator never sees it).
  VIPSD_ASSIGN_OR_RETURN(svi::StepTicket ticket, driver->Begin());
  if (ticket.result.outcome == svi::StepResult::Outcome::kRefusedCeiling) {
    halted_ = true;
    return Decline(plan, "this holder's epsilon ceiling is reached");
  }
  local.key = ticket.key;
  std::vector<uint64_t> masked;
  Status result = MaskedShare(plan, *driver, local, ready, &masked);
  if (options_.test_holder_round_delay.count() > 0) {
    (void)control_.PauseFor(options_.test_holder_round_delay);
  }
  driver->Abandon(ticket);  // the aggregator runs the step to its end
  // The charge, the cuts and the round are durable BEFORE the share leaves
  // (a failed round is charged too: the step key was drawn and records
  // read).
  const Status noted = keeper_->RecordStep(ticket.result, true, noise_->is_private(), window_epsilon);
  if (!noted.ok() && result.ok()) result = noted;
  if (plan.slot > state.windows.last_slot()) {
    const Status recorded = keeper_->RecordCuts(plan.slot, cuts);
    if (!recorded.ok() && result.ok()) result = recorded;
  }
  // The budget warning this round crosses, recorded with its commit (as one
  // vipsd records it with its slot's), said when the round's outcome is.
  const double spent = keeper_->EpsilonOf(state, driver_config.delta, true);
  double level = 0;
  for (double fraction : config_.warn_at) {
    if (spent >= fraction * driver_config.epsilon_ceiling) level = fraction;
  }
  if (level > state.warning_level) {
    (void)keeper_->RaiseWarningLevel(level);  // rises, within (0, 1]: cannot fail
    pending_warning_ = "privacy budget warning: epsilon_spent=" + FixedDecimal(spent, 4) +
                       " of ceiling=" + ShortestNumber(driver_config.epsilon_ceiling) +
                       " crossed warn_at=" + ShortestNumber(level) + " for this holder's records";
  }
  VIPSD_RETURN_IF_ERROR(keeper_->Commit(plan.step + 1));
  ++commits_unobserved_;
  ++rounds_charged_unobserved_;
  for (const WorkStream& stream : local.streams) {
    DropLocalBelow(ingest_, pool_, stream.name, state.windows.ResumeOffset(stream.name));
  }
  if (!result.ok()) {
    return StopForRun(plan, share_at, "its share failed: " + result.ToString() + " (charged)",
                      /*silent=*/false);
  }
  if (WallNowMs() > share_at) {
    // Late: sent now, its time would tell how long the round took. Never
    // sent: the aggregator abandons the round at its timeout.
    return StopForRun(plan, share_at,
                      "its share was not ready at its share time (federation.share_delay_seconds "
                      "= " + ShortestNumber(config_.federation.share_delay_seconds) +
                          " after the plan; charged, never sent)",
                      /*silent=*/true);
  }
  if (!WaitUntil(share_at)) return Status::Ok();  // stopping: nothing sent
  VIPSD_RETURN_IF_ERROR(Send(plan, ShareKind::kShare, "", std::move(masked)));
  ++shares_;
  metrics_->federation_rounds_total(RoundOutcome::kShare).Increment();
  Log(LogLevel::kInfo, kComponent,
      "round " + std::to_string(plan.step) + ": share sent (" +
          std::to_string(plan.participants.size()) + " participants, tolerated " +
          std::to_string(plan.tolerated) + "); this holder's epsilon_spent=" +
          FixedDecimal(spent, 4));
  return Status::Ok();
}

Status Holder::MaskedShare(const FederatedPlan& plan, svi::StepDriver& driver,
                           const WorkPlan& local, const std::vector<LocalStream>& ready,
                           std::vector<uint64_t>* masked) {
  const privacy::BlockLayout& layout = bundle_.model->statistic_layout();
  if (sum_ == nullptr) {
    sum_ = std::make_unique<privacy::GaussianSumMechanism>(layout, privacy::SumKind::kGrid);
  } else {
    sum_->Reset();
  }
  if (!ready.empty()) {
    VIPSD_RETURN_IF_ERROR(SumLocalStreams(ingest_, pool_, driver, local, ready,
                                          [&](size_t, privacy::GaussianSumMechanism& partial) {
                                            return sum_->Merge(std::move(partial));
                                          }));
  }
  VIPSD_ASSIGN_OR_RETURN(const privacy::DistributedNoise shares,
                         privacy::DistributedNoiseFor(
                             layout, plan.mechanism.noise_multiplier,
                             static_cast<uint32_t>(plan.participants.size()), plan.tolerated));
  VIPSD_ASSIGN_OR_RETURN(const std::vector<int64_t> values, sum_->ReleaseShare(*noise_, shares));
  masked->resize(values.size());
  return masker_.Mask(static_cast<uint64_t>(plan.step), plan.participants, values, *masked,
                      plan.incarnations);
}

Status Holder::Run() {
  ingest_.SetCapacity(config_.pool_capacity);
  ingest_.SetTimestampPolicy(config_.source_timestamps == "create_time"
                                 ? TimestampPolicy::kAny
                                 : TimestampPolicy::kLogAppendTime);
  const svi::SlotWindows& windows = keeper_->state().windows;
  for (const std::string& stream : windows.Streams()) {
    ingest_.SetResumeOffset(stream, windows.ResumeOffset(stream));
  }
  Ingest* ingest = &ingest_;
  auto source = make_source_(
      [ingest](const std::string& topic, int32_t partition) -> std::optional<int64_t> {
        return ingest->ResumeOffset(topic, partition).value_or(0);
      });
  if (!source.ok()) return source.status();
  ingest_.Start(std::move(*source));
  // As one vipsd: what it is configured to charge, and its record so far.
  metrics_->noise_multiplier().Set(config_.driver.mechanism.noise_multiplier);
  metrics_->sampling_rate().Set(config_.driver.mechanism.sampling_rate);
  metrics_->SetAccountingMode(keeper_->state().mode);
  metrics_->SetPrivacyUnit(config_.privacy_unit, config_.driver.max_records_per_unit);
  ++commits_unobserved_;  // the one Create made
  Observe();
  PrepareBudgetCheck();  // before its first join
  Log(LogLevel::kInfo, kComponent,
      "holder '" + config_.federation.holder_id + "' of job '" + config_.ledger_key + "' on " +
          work_.Describe() + ": last round answered " + std::to_string(masker_.last_round()) +
          "; it asks to join once its input partitions are assigned to it");
  FederatedPlan none;
  Status result = Status::Ok();
  while (result.ok() && !control_.stopping()) {
    if (ingest_.error().has_value()) break;
    const auto now = std::chrono::steady_clock::now();
    const bool silence = now - last_plan_ >= kSilence;
    if (named_ && silence) named_ = false;  // the aggregator may have forgotten it
    // Asked at the cadence, from the first poll at which the group assigned
    // its partitions (AssignmentReported is a cheap check; InputReady asks
    // the brokers, so it runs at most once per cadence).
    if (!halted_ && stopped_.empty() && !named_ && ingest_.AssignmentReported() &&
        now - last_join_ >= (silence ? kSilence : kJoinInterval)) {
      last_join_ = now;
      if (InputReady()) {
        join_sent_ = true;
        result = Send(none, ShareKind::kJoin, "");
        if (!result.ok()) break;
      }
    }
    auto messages = work_.Poll(std::chrono::milliseconds(100));
    if (!messages.has_value()) continue;
    std::optional<FederatedPlan> newest;
    for (auto& [offset, bytes] : *messages) {
      auto kind = WorkMessageKindOf(bytes);
      if (kind.ok() && *kind == WorkMessageKind::kFederatedRefusal) {
        auto refusal = DecodeFederatedRefusal(bytes);
        if (refusal.ok() && refusal->job == config_.ledger_key &&
            refusal->holder == config_.federation.holder_id &&
            refusal->incarnation == keeper_->state().run_id) {
          result = InvalidArgumentError("the aggregator refused this holder's join: " +
                                        refusal->reason);
          break;
        }
        continue;
      }
      if (!kind.ok() && kind.status().code() == StatusCode::kFailedPrecondition &&
          !warned_old_message_) {
        // A process of the federation running an older vipsd (an old
        // aggregator's plans are never answered). Said once per run: such
        // messages repeat every round.
        warned_old_message_ = true;
        Log(LogLevel::kWarning, kComponent,
            work_.Describe() + " offset " + std::to_string(offset) + ": " +
                kind.status().ToString() +
                "; ignored: this holder answers only plans of its own version (said once per "
                "run)");
      }
      if (!kind.ok() || *kind != WorkMessageKind::kFederatedPlan) continue;
      auto plan = DecodeFederatedPlan(bytes);
      if (!plan.ok()) {
        Log(LogLevel::kWarning, kComponent,
            work_.Describe() + " offset " + std::to_string(offset) + ": " +
                plan.status().ToString() + "; ignored");
        continue;
      }
      // Aggregators are ordered as the ledger orders owners: epoch, then
      // owner id (a claim race leaves two under one counter; the lower one
      // is fenced, and its rounds must not hide the winner's).
      const std::pair<uint64_t, std::string> aggregator{plan->epoch, plan->owner};
      if (plan->job != config_.ledger_key || aggregator < highest_aggregator_) continue;
      highest_aggregator_ = aggregator;
      if (newest.has_value() && newest->epoch == plan->epoch && newest->owner == plan->owner &&
          plan->step < newest->step) {
        continue;
      }
      newest = std::move(*plan);
    }
    if (result.ok() && newest.has_value()) {
      const int64_t charged = keeper_->state().accountant.steps();
      result = OnPlan(*newest);
      Observe();
      if (keeper_->state().accountant.steps() != charged) PrepareBudgetCheck();
    }
  }
  if (join_sent_ && result.code() != StatusCode::kInvalidArgument) {
    // No later round names it (a round that names it now is abandoned
    // without waiting for its timeout).
    const Status left = Send(none, ShareKind::kLeave, "stopping");
    if (!left.ok()) Log(LogLevel::kWarning, kComponent, "leaving: " + left.ToString());
  }
  RequestStop();
  ingest_.Join();
  if (result.ok() && ingest_.error().has_value()) result = *ingest_.error();
  ingest_.Close();
  const Status flushed = sink_->Close();
  if (!flushed.ok()) Log(LogLevel::kWarning, kComponent, "closing the sink: " + flushed.ToString());
  Log(LogLevel::kInfo, kComponent, "holder stopped");
  return result.code() == StatusCode::kCancelled ? Status::Ok() : result;
}

}  // namespace vipsd::daemon
