// The embedded Kafka of `kafka: {embedded: true}`: librdkafka's in-process
// mock cluster (a real Kafka protocol peer that kcat and other processes can
// connect to) with the daemon's topics created and, optionally, the bundled
// demo corpus produced into the first input topic. Used by the README's demo
// command and by tests; a deployment uses a real cluster instead.
//
// The cluster lives in this process: its data is gone when the process
// exits. Ports are random; the bootstrap address is returned, printed by
// main and written to `<state directory>/bootstrap`.
//
// Thread-safety: create and destroy from the main thread; destroy only after
// every client connected to it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "core/base/status.h"

namespace vipsd::connectors {
class MockCluster;
}

namespace vipsd::daemon {

class EmbeddedKafka {
 public:
  static StatusOr<std::unique_ptr<EmbeddedKafka>> Start(const config::VipsdConfig& config);
  ~EmbeddedKafka();

  const std::string& bootstrap_servers() const { return bootstrap_; }
  int64_t demo_records() const { return demo_records_; }

 private:
  EmbeddedKafka() = default;
  std::unique_ptr<connectors::MockCluster> cluster_;
  std::string bootstrap_;
  int64_t demo_records_ = 0;
};

}  // namespace vipsd::daemon
