// WorkFollower: what a process that follows another process's plans on the
// work topic has, whichever plans they are — a shared-work worker
// (daemon/step/worker.h: the coordinator's steps) and a federated holder
// (daemon/step/holder.h: the aggregator's rounds): its configuration and
// options, the model, its noise source, its own ingest of the input
// partitions it holds (with the sink its dead letters go to), the pool its
// sums sample from (core/svi/record_pool.h, as every step's), the work
// topic, and the run control that stops them. Neither releases anything;
// a holder keeps a ledger of its own, a worker none.
//
// Thread-safety: RequestStop from any thread; the rest is the follower's
// run thread's.
#pragma once

#include <memory>

#include "config/config.h"
#include "core/privacy/mechanisms/noise_source.h"
#include "core/svi/record_pool.h"
#include "daemon/io/io.h"
#include "daemon/io/metrics.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/model_setup.h"
#include "daemon/setup/startup_check.h"
#include "daemon/step/work_io.h"

namespace vipsd::daemon {

class WorkFollower {
 public:
  WorkFollower(const WorkFollower&) = delete;
  WorkFollower& operator=(const WorkFollower&) = delete;
  virtual ~WorkFollower();

  // Stops the run and the ingest thread (Run returns OK).
  void RequestStop();

 protected:
  WorkFollower(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
               std::unique_ptr<OutputSink> sink, Metrics* metrics,
               std::unique_ptr<privacy::NoiseSource> noise,
               std::unique_ptr<WorkExchange> exchange, SourceFactory make_source);
  // RequestStop, then waits for the ingest thread (a derived class's
  // destructor calls it first, before its own members go).
  void Shutdown();

  const config::VipsdConfig config_;
  const DaemonOptions options_;
  ModelBundle bundle_;
  std::unique_ptr<OutputSink> sink_;  // dead letters of the input it reads
  Metrics* const metrics_;
  std::unique_ptr<privacy::NoiseSource> noise_;
  SourceFactory make_source_;  // the source is made once it has work
  RunControl control_;
  WorkIo work_;
  Ingest ingest_;
  // Each partition's records below the cut it last summed, down to the
  // window's start: filled by SumLocalStreams, evicted by DropLocalBelow.
  svi::RecordPool pool_;
};

}  // namespace vipsd::daemon
