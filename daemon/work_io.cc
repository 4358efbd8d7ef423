#include "daemon/work_io.h"

#include <algorithm>

#include "core/base/log.h"
#include "core/privacy/gaussian_mechanism.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";

}  // namespace

WorkIo::WorkIo(std::unique_ptr<WorkExchange> exchange, RunControl* control)
    : exchange_(std::move(exchange)), control_(control) {}

StatusOr<int64_t> WorkIo::Append(const std::string& bytes) {
  auto backoff = std::chrono::milliseconds(200);
  int failures = 0;
  for (;;) {
    auto appended = exchange_->Append(bytes);
    if (appended.ok()) return appended;
    if (failures++ == 0 || failures % 10 == 0) {
      Log(LogLevel::kWarning, kComponent,
          "cannot append to the " + exchange_->Describe() + " (retrying): " +
              appended.status().ToString());
    }
    if (!control_->PauseFor(backoff)) return CancelledError("stopping");
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

std::optional<std::vector<std::pair<int64_t, std::string>>> WorkIo::Poll(
    std::chrono::milliseconds wait) {
  auto messages = exchange_->Poll(wait);
  if (messages.ok()) return std::move(*messages);
  if (poll_failures_++ % 20 == 0) {
    Log(LogLevel::kWarning, kComponent,
        "cannot read the " + exchange_->Describe() + " (retrying): " +
            messages.status().ToString());
  }
  (void)control_->PauseFor(std::chrono::milliseconds(300));
  return std::nullopt;
}

StatusOr<std::string> LocalPartial(Ingest& ingest, svi::StepDriver& driver,
                                   const svi::StepKey& key, const WorkStream& stream) {
  std::vector<svi::StreamCandidates> one{ingest.Candidates(stream.name, stream.low, stream.high)};
  std::string encoded;
  VIPSD_RETURN_IF_ERROR(driver.SumStreams(
      key, one, [&encoded](size_t, privacy::GaussianSumMechanism& partial) -> Status {
        VIPSD_ASSIGN_OR_RETURN(encoded, partial.EncodeUnreleased());
        return Status::Ok();
      }));
  return encoded;
}

const WorkStream* FindStream(const WorkPlan& plan, const std::string& name) {
  const auto it = std::lower_bound(plan.streams.begin(), plan.streams.end(), name,
                                   [](const WorkStream& s, const std::string& n) { return s.name < n; });
  return it != plan.streams.end() && it->name == name ? &*it : nullptr;
}

}  // namespace vipsd::daemon
