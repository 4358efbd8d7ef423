// SlotWindows: which records each step may see (docs/architecture.md; issue 11).
//
// Steps run on a fixed public clock of slots: slot k is due at
//   time(k) = anchor_time + (k − anchor_slot) · interval
// (the anchor moves only when an operator changes the interval). Each input
// stream (Kafka partition) has a CUT per slot, cut(s, k): an offset that
// separates the records of slot k and before from later ones. Step k's
// candidates in stream s are exactly the records with offsets in
//   window(s, k) = [cut(s, k − M), cut(s, k))
// where M = window_slots, or [origin(s), cut(s, k)) when the window is "all".
//
// The cut rule (the daemon applies it, daemon/parts/ingest.h SlotTargets; this
// class records the result). A record's TIME is its Kafka timestamp in
// milliseconds; with source.timestamps: log_append_time only broker-set
// ones (LogAppendTime) are accepted, so it is when the broker appended it.
// Let T_k = floor(time(k) · 1000). At time(k) + grace
// (schedule.cut_grace_seconds) the daemon reads the end E(s, k) of every
// stream's log, reads the records below it, and sets
//   cut(s, k) = the offset of the first record at or above
//               F = max(cut(s, k − 1), E(s, k − 1)) whose time is > T_k,
//               or E(s, k) when no record in [F, E(s, k)) has one,
// where E(s, k − 1) counts only if its read completed by time(k) − grace
// (F = cut(s, k − 1) otherwise: a late read may include records appended
// after time(k); vipsd_slot_ends_read_late_total counts such slots).
//
// Why this is a function of the log. Append times are monotone in offset
// within a partition (one broker clock appends them in order). A record
// appended at or before T_k was appended before the broker's clock passed
// T_k, and is readable by time(k) + grace when grace covers the time a
// record takes to become readable (replication) plus the clock skew between
// broker and daemon; so every record with time ≤ T_k lies below E(s, k),
// and every record below an E(s, k − 1) whose read completed by
// time(k) − grace has time ≤ T_k. Then cut(s, k) is "one past the last record with
// time ≤ T_k": whatever E(s, k) the read returned, however late the thread
// that made it ran. So r is a candidate in slot k iff its time lies in
// (T_{k−M}, T_k] — a function of r's own time and public times. Adding or
// removing one record changes no other record's membership in any slot
// (adding a record shifts later offsets and the cuts above it by the same
// one), and r is a candidate in at most M slots. Nothing depends on how
// fast the daemon runs: a slot whose step starts late still uses its own
// T_k, and E only bounds where the cut is looked for.
//
// When the assumptions fail. A record that becomes readable only after
// time(k) + grace although stamped ≤ T_k (a replication stall longer than
// the grace, a broker clock ahead of the daemon's) falls into slot k + 1:
// its own membership moves by one slot and no other record's does (the
// records after it in its partition were appended after it, and are late
// too or stamped after T_k). A broker clock that runs backwards breaks
// monotonicity: a record stamped after T_k followed by ones stamped before
// it moves those into later slots, bounded by the floor: every record read
// for slot k is in slot k + 1 at the latest. With source.timestamps:
// create_time the producers' stamps are trusted instead, and a producer
// that stamps the future can move the records appended after its own, in
// its partition, by up to one slot (SECURITY.md states this weaker claim).
// Records whose timestamp is not trusted are dead-lettered before they can
// decide a cut (untrusted_timestamp).
//
// Missed slots. Slots whose time passed while no daemon observed them
// (downtime) have no observation; their cut is the last recorded one, so the
// records appended during the downtime belong to the first slot observed
// after it. Cuts never decrease.
//
// Origins. A stream's origin is the first offset that belongs to this state
// directory (the low watermark, or the end of the log with start_position
// "latest", when the stream was first seen). Windows never reach below it.
//
// What is private: nothing here. Cuts, origins and slot numbers are stream
// volume and public times. Serialize() is the ledger's "slot-windows"
// section (docs/ledger_format.md).
//
// Thread-safety: a value type; the daemon's step thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace vipsd::svi {

// window_slots value meaning "every record since the stream's origin".
inline constexpr int64_t kWindowAll = 0;
// Largest slot number, offset or count accepted anywhere (2^53: exact in a
// double, far from int64 overflow in every sum the daemon forms).
inline constexpr int64_t kMaxCounter = int64_t{1} << 53;

struct OffsetRange {
  int64_t low = 0;   // inclusive
  int64_t high = 0;  // exclusive
  bool Contains(int64_t offset) const { return offset >= low && offset < high; }
};

class SlotWindows {
 public:
  // `interval_seconds` > 0 and finite; `anchor_time` is slot `anchor_slot`'s
  // time (unix seconds); window_slots ≥ 1 or kWindowAll. An unpaced clock
  // (interval 0) is the offline run's: slots have no wall time.
  static StatusOr<SlotWindows> Create(double anchor_time, double interval_seconds,
                                      int64_t window_slots);

  // ---- The clock ----
  double interval_seconds() const { return interval_; }
  bool paced() const { return interval_ > 0; }
  // Time of slot k (paced clocks only).
  double SlotTime(int64_t slot) const;
  // T_k = floor(1000 · SlotTime(k)): records stamped (in Kafka milliseconds)
  // at or before it belong to slot k or earlier (the cut rule above).
  int64_t CutTimeMs(int64_t slot) const;
  // The first slot whose time is >= `time` (and > last_slot()).
  int64_t FirstSlotAtOrAfter(double time) const;
  // Changes the interval for the slots after `from_slot` (>= last_slot()):
  // the anchor moves to from_slot, whose time (and every earlier slot's)
  // stays as it was.
  Status SetInterval(double interval_seconds, int64_t from_slot);
  int64_t anchor_slot() const { return anchor_slot_; }
  double anchor_time() const { return anchor_time_; }

  // ---- Streams and cuts ----
  int64_t window_slots() const { return window_slots_; }
  // Changing the window applies to every slot after last_slot().
  Status SetWindowSlots(int64_t window_slots);

  // A stream seen for the first time: its records from `origin` on belong to
  // this state directory. Known streams keep their origin (returns OK).
  Status AddStream(const std::string& stream, int64_t origin);
  bool HasStream(const std::string& stream) const { return streams_.count(stream) > 0; }
  std::vector<std::string> Streams() const;

  // Records the cuts observed for `slot` (> last_slot()); slots in between
  // are missed and keep the previous cuts. Every stream must be known; a
  // stream missing from `cuts` keeps its previous cut; a cut below the
  // previous one or below the origin is refused (cuts never decrease).
  Status RecordCuts(int64_t slot, const std::map<std::string, int64_t>& cuts);
  // Records `slot` without observations (a slot that was missed): the last
  // cuts carry over.
  Status SkipTo(int64_t slot);

  int64_t last_slot() const { return last_slot_; }
  // cut(s, slot): exact for slot >= last_slot() − M (older history is
  // pruned); the origin before the stream's first cut. Unknown stream: 0.
  int64_t Cut(const std::string& stream, int64_t slot) const;
  // window(s, slot) for last_slot() <= slot: [cut(s, slot − M), cut(s, slot)),
  // with cut(s, slot) = cut(s, last_slot()) for a slot not yet recorded.
  OffsetRange Window(const std::string& stream, int64_t slot) const;
  // The lowest offset any slot after last_slot() can need: where a restarted
  // daemon resumes reading (cut(s, last_slot() + 1 − M), or the origin).
  int64_t ResumeOffset(const std::string& stream) const;

  // Versioned text (docs/ledger_format.md); Deserialize refuses anything
  // malformed or out of range with DATA_LOSS.
  std::string Serialize() const;
  static StatusOr<SlotWindows> Deserialize(std::string_view text);

  bool operator==(const SlotWindows& other) const = default;

  // An unpaced clock with window "all" and no streams (the offline run's).
  SlotWindows() = default;

 private:
  void Prune();

  double anchor_time_ = 0;
  int64_t anchor_slot_ = 0;
  double interval_ = 0;
  int64_t window_slots_ = kWindowAll;
  int64_t last_slot_ = 0;
  struct StreamCuts {
    int64_t origin = 0;
    // (first slot with this cut, cut), increasing in both. The entry in force
    // at the oldest slot a future window can reach is kept.
    std::vector<std::pair<int64_t, int64_t>> changes;
    bool operator==(const StreamCuts& other) const = default;
  };
  std::map<std::string, StreamCuts> streams_;
};

}  // namespace vipsd::svi
