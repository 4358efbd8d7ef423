#include "daemon/step/follower.h"

#include <utility>

namespace vipsd::daemon {

WorkFollower::WorkFollower(const config::VipsdConfig& config, DaemonOptions options,
                           ModelBundle bundle, std::unique_ptr<OutputSink> sink,
                           Metrics* metrics, std::unique_ptr<privacy::NoiseSource> noise,
                           std::unique_ptr<WorkExchange> exchange, SourceFactory make_source)
    : config_(config),
      options_(std::move(options)),
      bundle_(std::move(bundle)),
      sink_(std::move(sink)),
      metrics_(metrics),
      noise_(std::move(noise)),
      make_source_(std::move(make_source)),
      work_(std::move(exchange), &control_),
      ingest_(bundle_.decoder.get(), sink_.get(), metrics, &control_,
              /*cover_every_stream=*/true) {}

WorkFollower::~WorkFollower() { Shutdown(); }

void WorkFollower::RequestStop() {
  control_.RequestStop();
  ingest_.Stop();
}

void WorkFollower::Shutdown() {
  RequestStop();
  ingest_.Join();
}

}  // namespace vipsd::daemon
