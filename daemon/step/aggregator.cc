// Aggregator (aggregator.h; federation.role: aggregator; issue 31,
// docs/federation.md): one step is one ROUND.
//
//   1. The step is charged (svi::StepDriver::Begin, before anything else; the
//      key it draws is not used: every holder samples with a key of its own).
//   2. The plan goes to the work topic: the round (= the step number, so a
//      pad is never reused), the slot's cut time, q and σ, the participants,
//      tolerated_holders, the roster's fingerprint and the model.
//   3. Every participant appends its share: its clipped grid sum plus its
//      noise share N_Z(0, s²), s² = ⌈σ_g²/(n − t)⌉, masked with its pair
//      pads (core/privacy/mechanisms/secure_aggregation.h). The masks cancel only in
//      the sum of ALL participants' shares.
//   4. The sum is the noisy total; GaussianSumMechanism::ReleaseFederatedTotal
//      scales it back, and the M-step runs on it (StepDriver::FinishReleased).
//
// A round that misses a share within federation.round_timeout_seconds, or
// that a participant declines, is ABANDONED: nothing is released (the sum
// of an incomplete set of shares is a pad), the step stays charged on this
// ledger and on every holder's that sent its share, and the holders that
// declined (or, at the timeout, did not send) leave the participants until
// they ask to join again.
//
// Joins (TakeShare): a holder's join carries its FederationTerms; one whose
// terms are not this process's is refused (FederatedRefusal, naming the
// keys) and never planned, so a mismatch is never charged. A holder that
// stops sends a leave. Plans state when they were issued and when the
// shares are due: every holder's share leaves at issued + its
// share_delay_seconds (daemon/step/holder.h).
//
// Privacy: the aggregator sees only masked shares (uniform words) and their
// sum, which carries at least the configured σ whenever at most t holders
// collude with it (docs/privacy_accounting.md §1c). Which holders took part
// is public (the plan says so).
#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/base/log.h"
#include "core/privacy/mechanisms/distributed_noise.h"
#include "daemon/setup/federation.h"
#include "daemon/step/aggregator.h"

namespace vipsd::daemon {
namespace {

constexpr auto kSharePoll = std::chrono::milliseconds(50);
constexpr auto kOwnerCheckInterval = std::chrono::seconds(1);

std::string JoinIds(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ", ") + id;
  return out;
}

}  // namespace

Aggregator::Aggregator(std::unique_ptr<WorkExchange> exchange, RunControl* control)
    : work_(std::move(exchange), control), control_(control) {}

Status Aggregator::Configure(const config::FederationSettings& settings) {
  VIPSD_ASSIGN_OR_RETURN(roster_, RosterOf(settings));
  if (roster_.empty() || settings.tolerated_holders < 0 ||
      settings.tolerated_holders >= static_cast<int64_t>(roster_.size())) {
    roster_.clear();
    return InvalidArgumentError("federation: tolerated_holders must be below the number of holders");
  }
  roster_fingerprint_ = RosterFingerprint(roster_);
  tolerated_ = static_cast<uint32_t>(settings.tolerated_holders);
  round_timeout_ = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(settings.round_timeout_seconds * 1000)));
  // No participant yet: a round names only holders that asked to join (a
  // holder asks every few seconds until a plan names it), so that a holder
  // that is not running never makes a round abandoned, and charged.
  participants_.clear();
  return Status::Ok();
}

StatusOr<svi::StepResult> Aggregator::Step(int64_t slot, const SlotTargets& targets,
                                           int64_t model_step, SlotOutputs* out) {
  if (parts_.driver == nullptr) return FailedPreconditionError("aggregator: no parts bound");
  round_unplanned_ = false;
  // A round needs more participants than tolerated_holders (the noise
  // shares are planned for n - t honest ones); checked before the charge.
  DrainJoins(out);
  if (participants_.size() <= tolerated_) {
    round_unplanned_ = true;
    const std::string why =
        "no round: " + std::to_string(participants_.size()) +
        " holder(s) ready, more than federation.tolerated_holders = " +
        std::to_string(tolerated_) + " needed (nothing charged; holders ask to join when "
        "they start)";
    // Said when the reason changes, not at every slot.
    if (why != no_round_said_) {
      no_round_said_ = why;
      out->log_lines.emplace_back(LogLevel::kWarning, "slot " + std::to_string(slot) + ": " + why);
    }
    return FailedPreconditionError(why);
  }
  StatusOr<svi::StepResult> result = [&]() -> StatusOr<svi::StepResult> {
    VIPSD_ASSIGN_OR_RETURN(svi::StepTicket ticket, parts_.driver->Begin());
    if (ticket.result.outcome == svi::StepResult::Outcome::kRefusedCeiling) return ticket.result;
    // From here the round is charged: if it does not finish, its number is
    // consumed (svi::StepDriver::Abandon), an overcount only.
    StatusOr<svi::StepResult> round = Round(ticket, slot, targets, model_step, out);
    if (!round.ok()) parts_.driver->Abandon(ticket);
    return round;
  }();
  if (result.ok() || Classify(result.status()) == StepFailure::kFailed) no_round_said_.clear();
  return result;
}

StepFailure Aggregator::Classify(const Status& error) const {
  // A round holds no window, so nothing it returns is an overflow (an
  // OUT_OF_RANGE comes from the M-step: a failed step).
  if (round_unplanned_ || error.code() == StatusCode::kCancelled) return StepFailure::kQuiet;
  return StepFailure::kFailed;
}

void Aggregator::DrainJoins(SlotOutputs* out) {
  auto messages = work_.Poll(std::chrono::milliseconds(0));
  if (!messages.has_value()) return;
  FederatedPlan none;  // no round: only joins and leaves count
  std::map<std::string, FederatedShare> shares;
  std::map<std::string, std::string> declined;
  for (auto& [offset, bytes] : *messages) {
    TakeShare(none, offset, bytes, &shares, &declined, out);
  }
  for (const std::string& id : joining_) participants_.insert(id);
  joining_.clear();
}

void Aggregator::TakeShare(const FederatedPlan& plan, int64_t offset, const std::string& bytes,
                           std::map<std::string, FederatedShare>* shares,
                           std::map<std::string, std::string>* declined, SlotOutputs* out) {
  auto kind = WorkMessageKindOf(bytes);
  if (!kind.ok() && kind.status().code() == StatusCode::kFailedPrecondition &&
      !warned_old_message_) {
    // A holder running an older vipsd: its joins are never planned. Said
    // once per run (it asks again every few seconds); the version is public.
    warned_old_message_ = true;
    out->log_lines.emplace_back(LogLevel::kWarning,
                                work_.Describe() + " offset " + std::to_string(offset) + ": " +
                                    kind.status().ToString() +
                                    "; ignored, and no round names its sender (said once per run)");
  }
  if (!kind.ok() || *kind != WorkMessageKind::kFederatedShare) return;
  auto share = DecodeFederatedShare(bytes);
  if (!share.ok()) {
    out->log_lines.emplace_back(LogLevel::kWarning, work_.Describe() + " offset " +
                                                        std::to_string(offset) + ": " +
                                                        share.status().ToString() + "; ignored");
    return;
  }
  if (share->job != parts_.config->ledger_key) return;  // another federation's
  const bool known = std::any_of(roster_.begin(), roster_.end(),
                                 [&](const privacy::RosterEntry& e) { return e.id == share->holder; });
  if (!known) {
    out->log_lines.emplace_back(LogLevel::kWarning,
                                work_.Describe() + " offset " + std::to_string(offset) +
                                    ": a message from '" + share->holder +
                                    "', which is not in federation.holders; ignored");
    return;
  }
  if (share->kind == ShareKind::kJoin) {
    // Its terms first: a holder that would decode, clip, sample or noise
    // otherwise is never planned, so no round is charged for it.
    const std::string terms = FederationTerms(*parts_.config, parts_.bundle->record_settings);
    if (share->terms != terms) {
      const std::string why = SettingsDifference(terms, share->terms, "aggregator", "holder");
      if (refused_[share->holder] != share->incarnation + why) {
        refused_[share->holder] = share->incarnation + why;  // said once per incarnation
        out->log_lines.emplace_back(LogLevel::kWarning,
                                    "holder '" + share->holder +
                                        "' asked to join with other settings (" + why +
                                        "): refused, never planned");
        FederatedRefusal refusal{parts_.config->ledger_key, parts_.keeper->replica()->epoch(),
                                 parts_.keeper->replica()->owner(), share->holder,
                                 share->incarnation, why};
        const auto appended = work_.Append(EncodeFederatedRefusal(refusal));
        if (!appended.ok()) {
          out->log_lines.emplace_back(LogLevel::kWarning, "refusing holder '" + share->holder +
                                                              "': " +
                                                              appended.status().ToString());
        }
      }
      return;
    }
    // The incarnation it joins with (its state directory's run id) names
    // it in the next plans: a holder that restarted with a new state
    // directory joins again and is planned with its new one.
    incarnations_[share->holder] = share->incarnation;
    if (participants_.count(share->holder) == 0) joining_.insert(share->holder);
    return;
  }
  if (share->kind == ShareKind::kLeave) {
    // It stops: no later plan names it, and a round that names it now is
    // abandoned at once (as for a decline).
    if (incarnations_[share->holder] == share->incarnation) {
      participants_.erase(share->holder);
      joining_.erase(share->holder);
    }
    // Only the incarnation the plan names can end the round: a leave of
    // another (an earlier process of the same holder that stopped late)
    // would abandon a charged round for nothing.
    const auto named = std::lower_bound(plan.participants.begin(), plan.participants.end(),
                                        share->holder);
    if (plan.step != 0 && named != plan.participants.end() && *named == share->holder &&
        plan.incarnations[static_cast<size_t>(named - plan.participants.begin())] ==
            share->incarnation &&
        shares->count(share->holder) == 0) {
      (*declined)[share->holder] = "it stopped";
    }
    return;
  }
  if (plan.step == 0 || share->epoch != plan.epoch || share->step != plan.step) {
    return;  // another round's
  }
  const auto named = std::lower_bound(plan.participants.begin(), plan.participants.end(),
                                      share->holder);
  if (named == plan.participants.end() || *named != share->holder ||
      plan.incarnations[static_cast<size_t>(named - plan.participants.begin())] !=
          share->incarnation) {
    return;  // not a participant, or another incarnation of one
  }
  if (shares->count(share->holder) > 0 || declined->count(share->holder) > 0) return;  // first wins
  if (share->kind == ShareKind::kDecline) {
    (*declined)[share->holder] = share->reason;
    return;
  }
  if (!share->noise_private && parts_.secure_noise) {
    (*declined)[share->holder] =
        "its share was drawn from a non-private (fixed-seed) source, and this aggregator's "
        "releases are stated private";
    return;
  }
  const size_t dimension = parts_.bundle->model->statistic_layout().total_size();
  if (share->masked.size() != dimension) {
    (*declined)[share->holder] = "a share of " + std::to_string(share->masked.size()) +
                                 " coordinates, not " + std::to_string(dimension);
    return;
  }
  (*shares)[share->holder] = std::move(*share);
}

StatusOr<svi::StepResult> Aggregator::Round(const svi::StepTicket& ticket, int64_t slot,
                                            const SlotTargets& targets, int64_t model_step,
                                            SlotOutputs* out) {
  const config::VipsdConfig& config = *parts_.config;
  LedgerKeeper& keeper = *parts_.keeper;
  FederatedPlan plan;
  plan.job = config.ledger_key;
  plan.epoch = keeper.replica()->epoch();
  plan.owner = keeper.replica()->owner();
  plan.step = ticket.result.step;
  plan.slot = slot;
  plan.mechanism.sampling_rate = ticket.result.mechanism.sampling_rate;
  plan.mechanism.noise_multiplier = ticket.result.mechanism.noise_multiplier;
  plan.cut_time_ms = targets.cut_time_ms;
  plan.participants.assign(participants_.begin(), participants_.end());
  for (const std::string& id : plan.participants) plan.incarnations.push_back(incarnations_[id]);
  plan.tolerated = tolerated_;
  plan.roster = roster_fingerprint_;
  plan.run = keeper.state().run_id;  // the holders' pads are bound to it
  plan.terms = FederationTerms(config, parts_.bundle->record_settings);
  VIPSD_ASSIGN_OR_RETURN(plan.model, EncodePlanModel(parts_, model_step));
  // Public times: the holders' shares leave at issued_ms + their
  // federation.share_delay_seconds, and this process waits until due_ms.
  plan.issued_ms = static_cast<int64_t>(std::floor(WallNow() * 1000));
  plan.due_ms = plan.issued_ms + round_timeout_.count();
  VIPSD_RETURN_IF_ERROR(work_.Append(EncodeFederatedPlan(plan)).status());
  plan.model.clear();

  std::map<std::string, FederatedShare> shares;  // masked: uniform words to this process
  std::map<std::string, std::string> declined;
  const auto start = std::chrono::steady_clock::now();
  auto last_owner_check = start;
  bool timed_out = false;
  // Between the plan's append and start above lies only the append itself;
  // the wait ends at start + round_timeout, no earlier than due_ms.
  while (shares.size() + declined.size() < plan.participants.size() && declined.empty()) {
    if (control_->stopping()) return CancelledError("stopping");
    const auto now = std::chrono::steady_clock::now();
    if (now - start >= round_timeout_) {
      timed_out = true;
      break;
    }
    if (now - last_owner_check >= kOwnerCheckInterval) {
      last_owner_check = now;
      const Status owner = keeper.ConfirmOwner();
      if (!owner.ok() && keeper.fenced()) {
        parts_.on_fenced(owner);
        return CancelledError("fenced");
      }
    }
    auto messages = work_.Poll(kSharePoll);
    if (!messages.has_value()) continue;
    for (auto& [offset, bytes] : *messages) {
      TakeShare(plan, offset, bytes, &shares, &declined, out);
    }
  }
  // Who answers next time: this round's participants that sent a share —
  // and, when a decline ended the round early, those that had not answered
  // yet (still at work: their share for this round is ignored) — and every
  // holder that asked to join meanwhile. A holder that declined or was
  // silent until the timeout leaves until it asks to join again.
  std::set<std::string> next;
  for (const auto& [id, share] : shares) next.insert(id);
  if (!timed_out) {
    for (const std::string& id : plan.participants) {
      if (declined.count(id) == 0) next.insert(id);
    }
  }
  for (const std::string& id : joining_) next.insert(id);
  joining_.clear();
  if (shares.size() < plan.participants.size()) {
    participants_ = std::move(next);
    std::vector<std::string> missing;
    std::string declines;
    for (const std::string& id : plan.participants) {
      if (shares.count(id) > 0) continue;
      if (const auto it = declined.find(id); it != declined.end()) {
        declines += (declines.empty() ? "" : "; ") + id + " declined: " + it->second;
      } else {
        missing.push_back(id);
      }
    }
    std::string why;
    if (!declines.empty()) why = declines;
    if (!missing.empty()) {
      why += (why.empty() ? "" : "; ") + std::string("no share from ") + JoinIds(missing) +
             (timed_out ? " within federation.round_timeout_seconds" : "");
    }
    return UnavailableError("round " + std::to_string(plan.step) + " abandoned (" + why +
                            "): nothing released; the step stays charged here and on every "
                            "holder that sent its share; the holders that declined or did not "
                            "answer in time leave the participants until they ask to join");
  }
  participants_ = std::move(next);
  // Every participant's share is in: the masks cancel in the sum.
  std::vector<std::span<const uint64_t>> masked;
  bool shares_private = true;
  for (const auto& [id, share] : shares) {
    masked.emplace_back(share.masked);
    shares_private = shares_private && share.noise_private;
  }
  VIPSD_ASSIGN_OR_RETURN(std::vector<int64_t> total, privacy::SumMasked(masked));
  const privacy::BlockLayout& layout = parts_.bundle->model->statistic_layout();
  VIPSD_ASSIGN_OR_RETURN(
      privacy::DistributedNoise noise,
      privacy::DistributedNoiseFor(layout, plan.mechanism.noise_multiplier,
                                   static_cast<uint32_t>(plan.participants.size()), plan.tolerated));
  VIPSD_ASSIGN_OR_RETURN(
      privacy::GaussianRelease release,
      privacy::GaussianSumMechanism::ReleaseFederatedTotal(layout, total, noise, shares_private));
  out->partials_remote += static_cast<int64_t>(shares.size());
  return parts_.driver->FinishReleased(ticket, release);
}

}  // namespace vipsd::daemon
