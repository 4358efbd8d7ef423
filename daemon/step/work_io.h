// The work topic (daemon/io/work_exchange.h) as both shared-work roles use it:
// appending with retry, polling with logged failures, and a process's own
// partial sums, sampled from its RecordPool (core/svi/record_pool.h) as one
// vipsd's step is.
//
// Privacy: a partial sum is an un-noised sum of private records; it leaves
// the process only on the work topic (the cluster's trust boundary).
//
// Thread-safety: step thread only (not thread-safe).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/svi/record_pool.h"
#include "core/svi/step_driver.h"
#include "daemon/io/work_exchange.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/model_setup.h"
#include "daemon/state/checkpoint.h"

namespace vipsd::daemon {

class WorkIo {
 public:
  WorkIo(std::unique_ptr<WorkExchange> exchange, RunControl* control);

  // Appends, retrying with backoff (200 ms to 5 s) until it succeeds;
  // CANCELLED when the run stops first. Returns the message's offset.
  StatusOr<int64_t> Append(const std::string& bytes);
  // The messages that arrived within `wait`; nullopt after a failed read
  // (logged at the first and every 20th failure, then a 300 ms pause).
  std::optional<std::vector<std::pair<int64_t, std::string>>> Poll(
      std::chrono::milliseconds wait);
  WorkExchange& exchange() { return *exchange_; }
  std::string Describe() const { return exchange_->Describe(); }

 private:
  std::unique_ptr<WorkExchange> exchange_;
  RunControl* const control_;
  int poll_failures_ = 0;
};

// A partition whose window [low, cut) this process sums for `plan`, with
// the cut its ingest found.
struct LocalStream {
  const WorkStream* stream = nullptr;  // one of the plan's
  int64_t cut = 0;
};

// The clipped, un-noised partial sums of `streams` (sorted by name, each
// once), with the plan's key: each stream's staged records below its cut
// move from `ingest` into `pool` (the one pool every step path samples
// from), and its candidates are the pool's records in [low, cut); one
// StepDriver::SumStreams call, so the driver's threads share all of them;
// `sink` gets each stream's sum in that order (PRIVATE). Unit level: only
// the units whose home partition a stream is count there
// (core/privacy/mechanisms/privacy_unit.h), with the topic's partition count taken
// from the plan, so that every process agrees.
Status SumLocalStreams(Ingest& ingest, svi::RecordPool& pool, svi::StepDriver& driver,
                       const WorkPlan& plan, const std::vector<LocalStream>& streams,
                       const svi::PartialSink& sink);

// A plan starts `stream`'s window at `low`: its records below leave `ingest`
// and `pool` for good (Ingest::DropBelow); when the window went back below
// where an earlier plan started it, the stream is read again, and the pool
// drops all of it.
void DropLocalBelow(Ingest& ingest, svi::RecordPool& pool, const std::string& stream,
                    int64_t low);

// The model a plan carries (CheckpointStore bytes; public: post-processing
// of releases), checked against this process's model: INVALID_ARGUMENT
// naming both when `whose` ("the coordinator's", "the aggregator's") model
// type or fingerprint is not `bundle`'s; the decoder's errors otherwise.
// The caller restores the arrays.
StatusOr<Checkpoint> DecodePlanModel(const std::string& bytes, const std::string& where,
                                     const ModelBundle& bundle, const std::string& whose);

// `plan`'s stream named `name` (plans keep them sorted), or null.
const WorkStream* FindStream(const WorkPlan& plan, const std::string& name);

}  // namespace vipsd::daemon
