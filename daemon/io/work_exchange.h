// Shared work (issue 16, state.work_topic): several vipsd processes compute
// one step. The process that owns the job's ledger (the COORDINATOR,
// daemon/state/ledger_replica.h) observes slot k's cuts, charges the step and
// draws its key exactly as one process would (svi::StepDriver::Begin), then
// appends a PLAN to the work topic: the step, the slot, the key, q, the
// window of every input partition (its start, and the log end and slot time
// its cut is found by), and the model the step starts from. Every WORKER
// sums the partitions it holds once it has read their windows completely:
// the clipped, un-noised sums, pre-summed into ONE PARTIAL per process and
// step in a private run (one per partition in a non-private one). The
// coordinator sums the partitions it holds itself (none with
// state.work_partitions: false) straight into the step's total, merges each
// partial into it as it arrives, adds the one Gaussian noise draw, runs the
// M-step, commits the ledger and releases: svi::StepDriver::Finish, as for
// one process.
//
// Why the step is the same whoever computes it: a record's Poisson bit and
// E-step seed depend only on the key and the record's own (partition,
// offset) (svi/step_randomness.h); the window depends only on the log and
// the plan's ends, floors and slot time (the cut rule of
// core/svi/slot_windows.h: every process that reads a partition finds the
// same cut, and the partial names it); the model is the plan's. A private
// run's sums are integers on the noise grid, so neither pre-summing nor the
// order of merges changes a bit; a non-private run's float partials are
// added in partition-name order, one process's order. The coordinator
// counts every partition once: a partial naming a partition already covered
// (two processes held it across a rebalance) is refused whole, and the
// reminder's partials_read tells its sender to sum what is still missing
// again. So the step's sum is bit for bit the sum one process would form.
// Which process holds a partition, and how fast it is, decides only WHEN a
// sum arrives, never what it contains; the coordinator waits for every
// partition.
//
// Plans go to partition 0 of the work topic and partials to partition 1, so
// that a worker reads the plans only and the coordinator the partials only.
// Plans are repeated (REMINDERS: no model, the offset of the full plan, and
// the partitions still missing) every second while partials are missing,
// so a process that joins or takes a partition over mid-step finds the
// step. A private run's plan carries the previous step's released sum
// instead of the model when it follows a plan of the same epoch (workers
// apply the M-step themselves; one that lacks the model the sum applies to
// reads the plans back to one with the model, at most kPlanModelEvery).
// Every message names the job (state.ledger_key) and the coordinator's
// epoch: a process follows the plans of the highest epoch it has seen, and
// the coordinator merges only partials of its own epoch and step.
//
// Privacy: a plan's key decides which records are sampled and a partial is
// an un-noised sum of records: both are PRIVATE, like the input records.
// The work topic needs the input topic's access control and must stay
// inside the cluster's trust boundary (README "Threat model"); nothing of
// it goes to a log, metric or error message. The plan's model is
// post-processing of released noisy sums (public).
//
// Format: "VWP6" (plan), "VWR3" (partial) or "VWL1" (release), then fields (little-endian
// integers, length-prefixed strings), then BLAKE2b-256 of everything
// before; Decode refuses anything else with DATA_LOSS.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/accounting/sampled_gaussian.h"
#include "core/svi/step_randomness.h"

namespace vipsd::daemon {

struct WorkStream {
  std::string name;  // "topic:partition"
  // window(s, slot) = [low, cut), where the cut is the first record at or
  // above `floor` stamped after the plan's cut_time_ms, or `high` (the log
  // end observed for the slot) when none is below it
  // (core/svi/slot_windows.h). low <= floor <= high.
  int64_t low = 0;
  int64_t floor = 0;
  int64_t high = 0;
};

// A plan carries the whole model at least this often (the first plan of an
// epoch always does): a process that joins reads at most this many plans
// back to find a model (WorkPlan::delta_sum).
inline constexpr int kPlanModelEvery = 16;

struct WorkPlan {
  std::string job;    // state.ledger_key
  uint64_t epoch = 0; // the coordinator's ledger epoch
  std::string owner;  // its owner id (32 lowercase hex)
  int64_t step = 0;
  int64_t slot = 0;
  double sampling_rate = 0;  // q of this step (what the accountant charged)
  bool is_private = true;    // σ > 0
  svi::StepKey key;          // PRIVATE
  // floor(t_slot · 1000): records stamped at or before it are the slot's.
  int64_t cut_time_ms = 0;
  // Every input partition with its window, sorted by name: where a process
  // that takes a partition over resumes reading (low), and what it sums.
  std::vector<WorkStream> streams;
  // The partitions whose partial the coordinator still waits for.
  std::vector<std::string> wanted;
  // The model the step starts from: CheckpointStore::Encode bytes. Empty in
  // a reminder, which names the full plan's offset on the work topic, and in
  // a plan that carries a delta instead (below).
  std::string model;
  // Instead of the model (issue 30): the released noisy sum of step
  // delta_step (GaussianSumMechanism::EncodeReleased: public) with the q and
  // ρ_t its M-step used. Applied through that M-step to the model of this
  // epoch's plan of step delta_base (at delta_base_offset of the work
  // topic), it gives this plan's model bit for bit. A process that does not
  // hold that model reads the plans back to one that carries the model (the
  // coordinator sends the model at least every kPlanModelEvery plans).
  // Empty, with delta_base −1, in a plan with the model and in a reminder.
  // Or, in place of delta_sum (then empty): the offset in the plan log of
  // the WorkRelease that carries it (the coordinator appended it ahead of
  // this plan), −1 otherwise.
  std::string delta_sum;
  int64_t delta_release_offset = -1;
  int64_t delta_base = -1;
  int64_t delta_base_offset = -1;
  int64_t delta_step = 0;
  // q of that step and σ of its release (0: an exact sum).
  privacy::SampledGaussian delta_mechanism;
  double delta_rho = 0;
  // Whether the plan follows from an earlier plan's model by a released sum
  // (inline or by reference) rather than carrying the model or nothing.
  bool has_delta() const { return !delta_sum.empty() || delta_release_offset >= 0; }
  int64_t plan_offset = -1;
  // In a reminder: the coordinator has read (merged or refused) every
  // partial below this offset of the partial log. A worker whose partial
  // for a still-wanted partition lies below it was refused (it overlapped a
  // partial merged first, after a rebalance) and sums the partition again;
  // one above it is still on its way.
  int64_t partials_read = 0;
  // The coordinator's record settings (daemon/setup/model_setup.h RecordSettings):
  // a worker whose own differ would sum different statistics or dead-letter
  // other records, so it exits before it joins the consumer group.
  std::string record_settings;
};

// The released noisy sum of a shared step, appended by the coordinator to
// the plan log as soon as the step's M-step succeeded (issue 30): a worker
// idle after its partials applies it through the same M-step while the
// coordinator commits its ledger and plans the next step, and the next
// plan names by its offset (WorkPlan::delta_release_offset) instead of
// carrying the bytes again, then finds its model ready. A worker that did
// not read it, or holds another model, reads it at that offset.
//
// Public: what the next plan carries (post-processing of a release); the
// step's partials are all merged when it is appended, so the worker's work
// for plan `step` is over. It is on the work topic, inside the cluster's
// trust boundary, where the next plan would put it a little later. Takeover
// keeps its rule: a standby continues from a model only of a step the
// ledger record charges (startup_check.cc ContinueFromTakeoverModel).
struct WorkRelease {
  std::string job;
  uint64_t epoch = 0;
  std::string owner;
  int64_t step = 0;  // the plan whose step released the sum (WorkPlan::step)
  int64_t slot = 0;
  int64_t delta_step = 0;  // the released step (the model's step after it)
  // q of that step and σ of its release (0: an exact sum).
  privacy::SampledGaussian delta_mechanism;
  double delta_rho = 0;
  std::string delta_sum;  // GaussianSumMechanism::EncodeReleased (public)
};

// One partition a partial covers.
struct PartialStream {
  std::string name;
  // The stream's cut for the plan's slot, as the process that read it
  // found it: the window summed is [low, cut).
  int64_t cut = 0;
};

struct WorkPartial {
  std::string job;
  uint64_t epoch = 0;
  std::string owner;
  int64_t step = 0;
  int64_t slot = 0;
  // The partitions summed, sorted by name, each once. A private run's
  // partial pre-sums every partition a process holds (grid sums are
  // integers: the order of additions does not matter); a non-private run's
  // (floating-point sums) covers one partition, so that the coordinator
  // adds them in partition-name order as one process does.
  std::vector<PartialStream> streams;
  // The process could not hold these partitions' windows (pool.capacity):
  // the coordinator skips the slot, as one process would.
  bool overflow = false;
  std::string sum;       // GaussianSumMechanism::EncodeUnreleased (PRIVATE)
  std::string instance;  // who computed it (--instance-id)
};

// ---- Federated mode (issue 31; daemon/step/holder.h, Coordinator's federated
// step) ----
// The aggregator's plan of one round (= its step): NO sampling key (each
// holder samples its own records with a key of its own) and NO windows (each
// holder cuts its own partitions at cut_time_ms); the holders whose masked
// shares the round sums, and what the shares are planned for. Public: all
// of it is a function of the schedule, the configuration and released
// models.
struct FederatedPlan {
  std::string job;
  uint64_t epoch = 0;
  std::string owner;
  int64_t step = 0;  // the round: pads are keyed by it, so it never repeats
  int64_t slot = 0;
  // q the aggregator charged, σ the release is charged at.
  privacy::SampledGaussian mechanism;
  int64_t cut_time_ms = 0;  // records stamped at or before it are the slot's
  // Holder ids, sorted, each once: exactly these shares are summed.
  std::vector<std::string> participants;
  // Each participant's incarnation (the run id of its state directory, from
  // its join), in the same order: the pads of a pair are bound to both
  // (secure_aggregation.h), so a holder whose state directory was reset
  // never masks with a pad it used before; a holder answers only a plan
  // that names its own.
  std::vector<std::string> incarnations;
  uint32_t tolerated = 0;  // t: shares are s² = ⌈σ_g²/(n − t)⌉ with n = |participants|
  std::string roster;      // RosterFingerprint of the configured holders
  // The aggregator's run id (its ledger's; 32 lowercase hex): the job the
  // holders' pads are bound to, with the roster (secure_aggregation.h). A
  // new aggregator state directory draws a new one, so rounds that start at
  // 1 again never reuse a pad.
  std::string run;
  std::string model;       // CheckpointStore::Encode bytes of the model the round starts from
  // What every process of the federation must share (FederationTerms,
  // daemon/setup/federation.h): "key: value" lines — the record settings (model,
  // vocabulary, clipping, timestamps, privacy unit), q, σ, the noise source
  // and the roster. A holder whose own differ names the keys and stops.
  std::string terms;
  // Public times (ms since the epoch, the aggregator's clock): when the plan
  // was appended, and when the aggregator stops waiting for its shares
  // (issued + federation.round_timeout_seconds). A holder's share leaves at
  // issued + its federation.share_delay_seconds, whatever its data.
  int64_t issued_ms = 0;
  int64_t due_ms = 0;
};

// What a holder appends for a round. kShare: its masked, noised sum;
// kDecline: it will not contribute to this round (a public reason: its own
// ceiling, a plan it cannot follow, it has stopped for this run); kJoin: its
// input is assigned and read, and it asks to be a participant of the next
// plan (with its terms); kLeave: it stops, and asks not to be planned.
enum class ShareKind : uint8_t { kShare = 0, kDecline = 1, kJoin = 2, kLeave = 3 };
struct FederatedShare {
  std::string job;
  uint64_t epoch = 0;
  int64_t step = 0;
  std::string holder;
  std::string incarnation;     // the run id of the holder's state directory
  ShareKind kind = ShareKind::kShare;
  std::string reason;          // kDecline: public text
  std::string terms;           // kJoin: the holder's FederationTerms
  bool noise_private = true;   // the share was drawn from a private source
  std::vector<uint64_t> masked;  // kShare: one word per coordinate (mod 2^64)
};

// The aggregator's answer to a join whose terms are not its own (on the plan
// log): the holder named is never planned; it stops with `reason` (which
// names every differing key, public configuration only) and exit 2.
struct FederatedRefusal {
  std::string job;
  uint64_t epoch = 0;
  std::string owner;
  std::string holder;
  std::string incarnation;
  std::string reason;
};

std::string EncodeFederatedPlan(const FederatedPlan& plan);
std::string EncodeFederatedShare(const FederatedShare& share);
std::string EncodeFederatedRefusal(const FederatedRefusal& refusal);
StatusOr<FederatedPlan> DecodeFederatedPlan(std::string_view bytes);
StatusOr<FederatedShare> DecodeFederatedShare(std::string_view bytes);
StatusOr<FederatedRefusal> DecodeFederatedRefusal(std::string_view bytes);

std::string EncodeWorkPlan(const WorkPlan& plan);
std::string EncodeWorkPartial(const WorkPartial& partial);
std::string EncodeWorkRelease(const WorkRelease& release);
// What one work-topic message holds. Plans, releases and federated plans go
// to the plan log, partials and shares to the partial log.
enum class WorkMessageKind {
  kPlan,
  kPartial,
  kFederatedPlan,
  kFederatedShare,
  kRelease,
  kFederatedRefusal
};
inline bool OnPlanLog(WorkMessageKind kind) {
  return kind == WorkMessageKind::kPlan || kind == WorkMessageKind::kFederatedPlan ||
         kind == WorkMessageKind::kRelease || kind == WorkMessageKind::kFederatedRefusal;
}
StatusOr<WorkMessageKind> WorkMessageKindOf(std::string_view bytes);
StatusOr<WorkPlan> DecodeWorkPlan(std::string_view bytes);
StatusOr<WorkPartial> DecodeWorkPartial(std::string_view bytes);
StatusOr<WorkRelease> DecodeWorkRelease(std::string_view bytes);

// Which log an end reads: a worker the plans, the coordinator the partials.
enum class WorkRole { kCoordinator, kWorker };

// The transport: two totally ordered logs, one for plans and one for
// partial sums (partitions 0 and 1 of state.work_topic). A process reads
// the one its role needs: a worker the plans, the coordinator the partials.
class WorkExchange {
 public:
  virtual ~WorkExchange() = default;
  virtual std::string Describe() const = 0;
  // Appends durably (acks=all) to the log of its kind (a plan or a partial);
  // returns the message's offset there.
  virtual StatusOr<int64_t> Append(const std::string& bytes) = 0;
  // The messages of the log this process reads appended after everything
  // returned so far (the first call: after the log's end when the exchange
  // was created), waiting up to `wait` when there are none; it returns as
  // soon as one arrives (the Kafka exchange long-polls in the client:
  // KafkaPartitionReader::ReadAvailable). Pairs of (offset, bytes).
  virtual StatusOr<std::vector<std::pair<int64_t, std::string>>> Poll(
      std::chrono::milliseconds wait) = 0;
  // The message at `offset` of the log this process reads (a worker: the
  // plans); NOT_FOUND if the log no longer holds it.
  virtual StatusOr<std::string> ReadAt(int64_t offset) = 0;
  // Every offset of the log this process reads below this one was returned
  // by Poll or is no longer in the log (retention passed it before it was
  // read): the coordinator's WorkPlan::partials_read, so that a partial lost
  // that way is summed again.
  virtual int64_t read_position() const = 0;
  // Whether the plan log still holds `offset` (a plan's; the coordinator
  // appends its plan again, with the model, once retention took it).
  virtual StatusOr<bool> HoldsPlan(int64_t offset) = 0;
  // The process will not Poll for a while (a worker sums its partitions, the
  // coordinator has every partial of its step): the Kafka exchange stops
  // fetching until the next Poll (KafkaPartitionReader::Pause), which reads
  // on from the same position. Nothing is lost or read twice.
  virtual void Rest() {}
};

}  // namespace vipsd::daemon
