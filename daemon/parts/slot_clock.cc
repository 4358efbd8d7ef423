#include "daemon/parts/slot_clock.h"

#include <algorithm>
#include <chrono>

#include "core/base/log.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";

}  // namespace

SlotClock::SlotClock(RunControl* control) : control_(control) {}

SlotClock::~SlotClock() {
  Stop();
  Join();
}

void SlotClock::Schedule(int64_t next_slot, int64_t anchor_slot, double anchor_time,
                         double interval) {
  {
    MutexLock lock(&mutex_);
    next_slot_ = next_slot;
    anchor_slot_ = anchor_slot;
    anchor_time_ = anchor_time;
    interval_ = interval;
  }
  wake_.notify_all();
}

Status SlotClock::Retime(const std::function<StatusOr<Anchor>(int64_t next_slot)>& retime) {
  {
    MutexLock lock(&mutex_);
    VIPSD_ASSIGN_OR_RETURN(const Anchor anchor, retime(next_slot_));
    anchor_slot_ = anchor.slot;
    anchor_time_ = anchor.time;
    interval_ = anchor.interval;
  }
  wake_.notify_all();
  return Status::Ok();
}

void SlotClock::SetGrace(double grace_seconds) {
  {
    MutexLock lock(&mutex_);
    grace_ = grace_seconds;
  }
  wake_.notify_all();
}

int64_t SlotClock::next_slot() const {
  MutexLock lock(&mutex_);
  return next_slot_;
}

void SlotClock::Start(InputSource* source) {
  source_ = source;
  thread_ = std::thread([this] { Loop(); });
}

void SlotClock::Stop() {
  {
    MutexLock lock(&mutex_);
    stop_ = true;
  }
  wake_.notify_all();
}

void SlotClock::Join() {
  if (thread_.joinable()) thread_.join();
}

std::optional<SlotBounds> SlotClock::Take(int64_t slot, double* read_done) {
  MutexLock lock(&mutex_);
  auto it = observed_.find(slot);
  if (it == observed_.end()) return std::nullopt;
  SlotBounds bounds = std::move(it->second);
  observed_.erase(observed_.begin(), std::next(it));
  const auto done = read_done_.find(slot);
  if (read_done != nullptr) *read_done = done != read_done_.end() ? done->second : 0;
  read_done_.erase(read_done_.begin(), read_done_.upper_bound(slot));
  return bounds;
}

double SlotClock::DueLocked(int64_t slot) const {
  return anchor_time_ + static_cast<double>(slot - anchor_slot_) * interval_;
}

void SlotClock::Loop() {
  for (;;) {
    int64_t slot = 0;
    double due = 0;
    {
      MutexLock lock(&mutex_);
      for (;;) {
        if (stop_) return;
        slot = next_slot_;
        due = DueLocked(slot) + grace_;
        const double left = due - WallNow();
        if (left <= 0) break;
        lock.WaitFor(wake_, std::chrono::duration<double>(std::min(left, 1.0)));
      }
    }
    auto bounds = ObserveWithRetry(*source_, due);
    if (!bounds.ok()) return;  // stopping
    const double read_done = WallNow();
    {
      MutexLock lock(&mutex_);
      if (next_slot_ != slot || DueLocked(slot) + grace_ != due) {
        continue;  // a reload moved this slot's time meanwhile: observe it at its new time
      }
      observed_[slot] = std::move(*bounds);
      read_done_[slot] = read_done;
      ++next_slot_;
    }
    control_->Ring();
  }
}

StatusOr<SlotBounds> SlotClock::ObserveWithRetry(InputSource& source, double as_of) {
  auto backoff = std::chrono::milliseconds(250);
  int failures = 0;
  for (;;) {
    auto bounds = source.ObserveBounds(as_of);
    if (bounds.ok()) {
      if (failures > 0) {
        Log(LogLevel::kWarning, kComponent,
            "observed the input's end offsets after " + std::to_string(failures) +
                " failed attempts (the cut is still decided by record timestamps; a record "
                "appended before the slot time that was not readable yet falls into the "
                "next slot)");
      }
      return bounds;
    }
    if (failures++ == 0 || failures % 20 == 0) {
      Log(LogLevel::kWarning, kComponent,
          "cannot read the input's end offsets (retrying): " + bounds.status().ToString());
    }
    MutexLock lock(&mutex_);
    if (stop_) return CancelledError("stopping");
    lock.WaitFor(wake_, backoff);
    if (stop_) return CancelledError("stopping");
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

}  // namespace vipsd::daemon
