// SlotClock: the public slot clock of a paced run (core/svi/slot_windows.h)
// — the CLOCK thread, the public anchor and interval it computes slot times
// from, and the cuts it has observed for slots the step thread has not taken
// yet.
//
// Slot k is due at t_k = anchor_time + (k − anchor_slot) · interval. At
// t_k + grace (schedule.cut_grace_seconds) the clock thread reads the end
// offset of every input partition (the source's ObserveBounds): an upper
// bound of slot k's cuts, which the records' timestamps then decide
// (Ingest::SetTargets; core/svi/slot_windows.h). It does no private work,
// and what it observes is stream volume. A reload that changes the interval moves
// the anchor (Retime) for slots not observed yet; a slot whose time moved
// while it was being observed is observed again at its new time.
//
// ObserveWithRetry is the one way anything reads the log's bounds: the
// clock thread at each slot, the step thread at start-up, for a new
// partition and in an unpaced (offline) run. A failed observation is retried
// with backoff (250 ms to 5 s) until it succeeds or the run stops.
//
// Thread-safety: every method may be called from any thread; the clock
// thread is the only one that observes on its own schedule. The source must
// outlive the clock thread (Join before the source goes).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "core/base/status.h"
#include "core/base/thread_annotations.h"
#include "daemon/io/io.h"
#include "daemon/parts/run_control.h"

namespace vipsd::daemon {

using SlotBounds = std::map<std::string, StreamBounds>;

class SlotClock {
 public:
  explicit SlotClock(RunControl* control);
  ~SlotClock();
  SlotClock(const SlotClock&) = delete;
  SlotClock& operator=(const SlotClock&) = delete;

  // The slot to observe next and the public anchor of slot times.
  void Schedule(int64_t next_slot, int64_t anchor_slot, double anchor_time, double interval)
      EXCLUDES(mutex_);
  // A new interval (a reload): `retime(next_slot)` — called with the clock
  // held, so that no slot is observed meanwhile — moves the slot times from
  // a slot it chooses at or after next_slot − 1 and returns the new anchor
  // {anchor_slot, anchor_time, interval}; slots already observed keep their
  // cuts. Its error is returned and nothing changes.
  struct Anchor {
    int64_t slot = 0;
    double time = 0;
    double interval = 0;
  };
  Status Retime(const std::function<StatusOr<Anchor>(int64_t next_slot)>& retime)
      EXCLUDES(mutex_);
  int64_t next_slot() const EXCLUDES(mutex_);
  // How long after a slot's time its observation is made (a reload may
  // change it; slots not observed yet use the new value).
  void SetGrace(double grace_seconds) EXCLUDES(mutex_);

  // Starts the clock thread over `source` (not owned).
  void Start(InputSource* source) EXCLUDES(mutex_);
  void Stop() EXCLUDES(mutex_);
  void Join();

  // Slot `slot`'s cuts once observed (and forgets every slot up to it);
  // nullopt if not yet. `read_done`, if given, is the wall time (unix
  // seconds) at which that observation's read completed: its ends bound the
  // next slot's cuts from below only if every record below them was
  // appended before the next slot's time (Daemon; core/svi/slot_windows.h).
  std::optional<SlotBounds> Take(int64_t slot, double* read_done = nullptr) EXCLUDES(mutex_);

  // The bounds of every stream of `source`, read now for public time
  // `as_of`; CANCELLED when the run stops first.
  StatusOr<SlotBounds> ObserveWithRetry(InputSource& source, double as_of) EXCLUDES(mutex_);

 private:
  void Loop() EXCLUDES(mutex_);
  double DueLocked(int64_t slot) const REQUIRES(mutex_);

  RunControl* const control_;
  InputSource* source_ = nullptr;  // set by Start, before the thread
  std::thread thread_;

  mutable Mutex mutex_;
  std::condition_variable wake_;  // the clock thread's and retries' waits
  bool stop_ GUARDED_BY(mutex_) = false;
  // Slot cuts observed, not yet taken by the step thread.
  std::map<int64_t, SlotBounds> observed_ GUARDED_BY(mutex_);
  std::map<int64_t, double> read_done_ GUARDED_BY(mutex_);  // by slot, as observed_
  int64_t next_slot_ GUARDED_BY(mutex_) = 0;
  double anchor_time_ GUARDED_BY(mutex_) = 0;
  int64_t anchor_slot_ GUARDED_BY(mutex_) = 0;
  double interval_ GUARDED_BY(mutex_) = 0;
  double grace_ GUARDED_BY(mutex_) = 0;
};

}  // namespace vipsd::daemon
