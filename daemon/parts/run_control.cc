#include "daemon/parts/run_control.h"

#include <algorithm>

namespace vipsd::daemon {

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void RunControl::RequestStop() {
  {
    MutexLock lock(&mutex_);
    stop_ = true;
    ++generation_;
  }
  wake_.notify_all();
}

bool RunControl::stopping() const {
  MutexLock lock(&mutex_);
  return stop_;
}

void RunControl::RequestReload() {
  {
    MutexLock lock(&mutex_);
    reload_ = true;
    ++generation_;
  }
  wake_.notify_all();
}

bool RunControl::TakeReload() {
  MutexLock lock(&mutex_);
  const bool requested = reload_;
  reload_ = false;
  return requested;
}

uint64_t RunControl::Generation() const {
  MutexLock lock(&mutex_);
  return generation_;
}

void RunControl::Ring() {
  {
    MutexLock lock(&mutex_);
    ++generation_;
  }
  wake_.notify_all();
}

void RunControl::WaitAfter(uint64_t seen, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mutex_);
  while (!stop_ && generation_ == seen) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return;
    lock.WaitFor(wake_, left);
  }
}

bool RunControl::PauseFor(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mutex_);
  while (!stop_) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return true;
    lock.WaitFor(wake_, left);
  }
  return false;
}

bool RunControl::SleepUntil(double unix_time) {
  MutexLock lock(&mutex_);
  for (;;) {
    if (stop_) return false;
    const double left = unix_time - WallNow();
    if (left <= 0) return true;
    lock.WaitFor(wake_, std::chrono::duration<double>(std::min(left, 1.0)));
  }
}

}  // namespace vipsd::daemon
