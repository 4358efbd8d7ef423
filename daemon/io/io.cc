#include "daemon/io/io.h"

#include <algorithm>
#include <thread>

namespace vipsd::daemon {

std::string StreamName(const std::string& topic, int32_t partition) {
  return topic + ":" + std::to_string(partition);
}

StatusOr<PollBatch> NoInputSource::Poll(size_t, std::chrono::milliseconds timeout) {
  // Nothing to read; the ingest thread's loop must not spin.
  std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(200)));
  PollBatch batch;
  batch.assignment = std::set<std::string>{};
  return batch;
}

}  // namespace vipsd::daemon
