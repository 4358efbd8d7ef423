// RunControl: how the daemon's threads tell the step thread that something
// changed, and how anyone asks the run to stop or to reload.
//
// The step thread waits for several things at once — a slot's cuts (the
// clock thread), records up to a cut (the ingest thread), a stop or reload
// request (a signal thread), a deadline (the wall clock). Each component
// guards its own state with its own mutex; none of them can notify a
// condition variable the others wait on without reaching into their state.
// RunControl is the one thing they share: an event count. A waiter reads
// Generation(), checks its conditions (each through its component, under
// that component's lock), and if none holds calls WaitAfter(generation):
// it returns as soon as anyone Ring()s after that generation, on a stop
// request, or at the timeout. Reading the generation before checking makes
// a change between the check and the wait impossible to miss.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>

#include "core/base/thread_annotations.h"

namespace vipsd::daemon {

class RunControl {
 public:
  void RequestStop() EXCLUDES(mutex_);
  bool stopping() const EXCLUDES(mutex_);
  void RequestReload() EXCLUDES(mutex_);
  // True once per RequestReload (the step thread applies it).
  bool TakeReload() EXCLUDES(mutex_);

  uint64_t Generation() const EXCLUDES(mutex_);
  // Something a waiter may be waiting for changed.
  void Ring() EXCLUDES(mutex_);
  // Returns after a Ring() later than `seen`, a stop request, or `timeout`.
  void WaitAfter(uint64_t seen, std::chrono::milliseconds timeout) EXCLUDES(mutex_);
  // Waits `timeout` unless a stop is requested first; false when stopping.
  bool PauseFor(std::chrono::milliseconds timeout) EXCLUDES(mutex_);
  // Waits until the wall clock reaches `unix_time` (seconds); false when a
  // stop is requested first.
  bool SleepUntil(double unix_time) EXCLUDES(mutex_);

 private:
  mutable Mutex mutex_;
  std::condition_variable wake_;
  bool stop_ GUARDED_BY(mutex_) = false;
  bool reload_ GUARDED_BY(mutex_) = false;
  uint64_t generation_ GUARDED_BY(mutex_) = 0;
};

// Seconds since the Unix epoch (the public clock's time base).
double WallNow();

}  // namespace vipsd::daemon
