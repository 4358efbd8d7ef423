// A Metrics registry for tests: no listener, version "test", model "lda".
#pragma once

#include <memory>
#include <utility>

#include "daemon/io/metrics.h"

namespace vipsd::daemon {

inline std::unique_ptr<Metrics> NewTestMetrics() {
  MetricsOptions options;
  options.listen_address = "";
  options.version = "test";
  options.model_type = "lda";
  return std::move(Metrics::Create(options)).value();
}

}  // namespace vipsd::daemon
