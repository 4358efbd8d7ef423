#include "core/svi/slot_windows.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/base/format.h"

namespace vipsd::svi {
namespace {

bool ValidStreamName(const std::string& name) {
  if (name.empty() || name.size() > 512) return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return c <= ' ' || c == 0x7f;  // no whitespace or control bytes: one token in the ledger
  });
}

Status ValidateClock(double anchor_time, double interval_seconds) {
  if (!std::isfinite(anchor_time) || anchor_time < 0 || anchor_time > 1e11) {
    return InvalidArgumentError("slot clock: the anchor time must be unix seconds in [0, 1e11]");
  }
  if (!std::isfinite(interval_seconds) || interval_seconds < 0 || interval_seconds > 1e7) {
    return InvalidArgumentError("slot clock: the interval must be in [0, 1e7] seconds");
  }
  return Status::Ok();
}

Status ValidateWindow(int64_t window_slots) {
  if (window_slots < 0 || window_slots > kMaxCounter) {
    return InvalidArgumentError("slot windows: window_slots must be >= 1 or all (0)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<SlotWindows> SlotWindows::Create(double anchor_time, double interval_seconds,
                                          int64_t window_slots) {
  VIPSD_RETURN_IF_ERROR(ValidateClock(anchor_time, interval_seconds));
  VIPSD_RETURN_IF_ERROR(ValidateWindow(window_slots));
  SlotWindows windows;
  windows.anchor_time_ = anchor_time;
  windows.interval_ = interval_seconds;
  windows.window_slots_ = window_slots;
  return windows;
}

double SlotWindows::SlotTime(int64_t slot) const {
  return anchor_time_ + static_cast<double>(slot - anchor_slot_) * interval_;
}

int64_t SlotWindows::CutTimeMs(int64_t slot) const {
  return static_cast<int64_t>(std::floor(SlotTime(slot) * 1000));
}

int64_t SlotWindows::FirstSlotAtOrAfter(double time) const {
  int64_t slot = last_slot_ + 1;
  if (!paced()) return slot;
  const double steps = std::ceil((time - anchor_time_) / interval_);
  if (std::isfinite(steps) && steps < static_cast<double>(kMaxCounter)) {
    slot = std::max(slot, anchor_slot_ + static_cast<int64_t>(std::max(steps, 0.0)));
  }
  // Guard against rounding in the division: the answer's time is >= time.
  while (SlotTime(slot) < time && slot < kMaxCounter) ++slot;
  return slot;
}

Status SlotWindows::SetInterval(double interval_seconds, int64_t from_slot) {
  VIPSD_RETURN_IF_ERROR(ValidateClock(anchor_time_, interval_seconds));
  if ((interval_seconds > 0) != paced()) {
    return InvalidArgumentError("slot clock: cannot switch between paced and unpaced");
  }
  if (from_slot < last_slot_ || from_slot > kMaxCounter) {
    return InvalidArgumentError("slot clock: the interval can only change after the last slot");
  }
  const double from_time = SlotTime(from_slot);
  if (!std::isfinite(from_time) || from_time > 1e11) {
    return InvalidArgumentError("slot clock: slot time out of range");
  }
  anchor_time_ = from_time;
  anchor_slot_ = from_slot;
  interval_ = interval_seconds;
  return Status::Ok();
}

Status SlotWindows::SetWindowSlots(int64_t window_slots) {
  VIPSD_RETURN_IF_ERROR(ValidateWindow(window_slots));
  if (window_slots_ != kWindowAll && (window_slots == kWindowAll || window_slots > window_slots_)) {
    // Older cuts were pruned: a longer window would need history we no
    // longer have. (A longer residency would also change what every pooled
    // record was promised.)
    return InvalidArgumentError(
        "slot windows: the window can only be shortened on a running state directory");
  }
  window_slots_ = window_slots;
  Prune();
  return Status::Ok();
}

Status SlotWindows::AddStream(const std::string& stream, int64_t origin) {
  if (!ValidStreamName(stream)) {
    return InvalidArgumentError("slot windows: stream names must be 1-512 printable bytes "
                                "without spaces");
  }
  if (origin < 0 || origin > kMaxCounter) {
    return InvalidArgumentError("slot windows: the origin of " + stream + " is out of range");
  }
  streams_.emplace(stream, StreamCuts{origin, {}});
  return Status::Ok();
}

std::vector<std::string> SlotWindows::Streams() const {
  std::vector<std::string> names;
  for (const auto& [name, cuts] : streams_) names.push_back(name);
  return names;
}

Status SlotWindows::SkipTo(int64_t slot) { return RecordCuts(slot, {}); }

Status SlotWindows::RecordCuts(int64_t slot, const std::map<std::string, int64_t>& cuts) {
  if (slot <= last_slot_ || slot > kMaxCounter) {
    return InvalidArgumentError("slot windows: slot " + std::to_string(slot) +
                                " is not after the last recorded slot " +
                                std::to_string(last_slot_));
  }
  for (const auto& [stream, cut] : cuts) {
    const auto it = streams_.find(stream);
    if (it == streams_.end()) {
      return InvalidArgumentError("slot windows: cut for unknown stream " + stream);
    }
    const int64_t previous = Cut(stream, last_slot_);
    if (cut < previous || cut > kMaxCounter) {
      return InvalidArgumentError("slot windows: the cut of " + stream + " at slot " +
                                  std::to_string(slot) + " (" + std::to_string(cut) +
                                  ") is below its previous cut " + std::to_string(previous) +
                                  " or out of range");
    }
  }
  for (const auto& [stream, cut] : cuts) {
    auto& changes = streams_[stream].changes;
    if (cut > Cut(stream, last_slot_)) changes.emplace_back(slot, cut);
  }
  last_slot_ = slot;
  Prune();
  return Status::Ok();
}

int64_t SlotWindows::Cut(const std::string& stream, int64_t slot) const {
  const auto it = streams_.find(stream);
  if (it == streams_.end()) return 0;
  int64_t cut = it->second.origin;
  for (const auto& [first, value] : it->second.changes) {
    if (first > slot) break;
    cut = value;
  }
  return cut;
}

OffsetRange SlotWindows::Window(const std::string& stream, int64_t slot) const {
  OffsetRange range;
  const auto it = streams_.find(stream);
  if (it == streams_.end()) return range;
  range.high = Cut(stream, slot);
  range.low = window_slots_ == kWindowAll ? it->second.origin : Cut(stream, slot - window_slots_);
  range.low = std::min(range.low, range.high);
  return range;
}

int64_t SlotWindows::ResumeOffset(const std::string& stream) const {
  const auto it = streams_.find(stream);
  if (it == streams_.end()) return 0;
  if (window_slots_ == kWindowAll) return it->second.origin;
  return Cut(stream, last_slot_ + 1 - window_slots_);
}

void SlotWindows::Prune() {
  if (window_slots_ == kWindowAll) {
    // Windows start at the origin: only the latest cut matters.
    for (auto& [stream, cuts] : streams_) {
      if (cuts.changes.size() > 1) cuts.changes.erase(cuts.changes.begin(), cuts.changes.end() - 1);
    }
    return;
  }
  // Window(last_slot) needs cut(last_slot − M): keep the entry in force there.
  const int64_t oldest = last_slot_ - window_slots_;
  for (auto& [stream, cuts] : streams_) {
    size_t first_kept = 0;
    while (first_kept + 1 < cuts.changes.size() && cuts.changes[first_kept + 1].first <= oldest) {
      ++first_kept;
    }
    cuts.changes.erase(cuts.changes.begin(),
                       cuts.changes.begin() + static_cast<std::ptrdiff_t>(first_kept));
  }
}

std::string SlotWindows::Serialize() const {
  std::ostringstream out;
  out << "slot-windows 1\n";
  out << "clock " << anchor_slot_ << " " << HexDouble(anchor_time_) << " " << HexDouble(interval_)
      << "\n";
  out << "window " << window_slots_ << "\n";
  out << "last_slot " << last_slot_ << "\n";
  for (const auto& [stream, cuts] : streams_) {
    out << "stream " << stream << " " << cuts.origin << " " << cuts.changes.size();
    for (const auto& [slot, cut] : cuts.changes) out << " " << slot << " " << cut;
    out << "\n";
  }
  out << "end\n";
  return out.str();
}

StatusOr<SlotWindows> SlotWindows::Deserialize(std::string_view text) {
  auto bad = [](const std::string& what) { return DataLossError("slot windows: " + what); };
  auto in_range = [](int64_t value) { return value >= 0 && value <= kMaxCounter; };
  std::istringstream in{std::string(text)};
  std::string word, anchor_text, interval_text;
  int version = 0;
  SlotWindows windows;
  if (!(in >> word >> version) || word != "slot-windows" || version != 1) return bad("bad header");
  if (!(in >> word >> windows.anchor_slot_ >> anchor_text >> interval_text) || word != "clock" ||
      !in_range(windows.anchor_slot_) || !ParseHexDouble(anchor_text, &windows.anchor_time_) ||
      !ParseHexDouble(interval_text, &windows.interval_) ||
      !ValidateClock(windows.anchor_time_, windows.interval_).ok()) {
    return bad("bad clock line");
  }
  if (!(in >> word >> windows.window_slots_) || word != "window" ||
      !ValidateWindow(windows.window_slots_).ok()) {
    return bad("bad window line");
  }
  // The anchor may lie ahead of the last recorded slot: an interval change
  // anchors at the last slot the clock observed, which the step thread may
  // not have recorded when the state is next committed.
  if (!(in >> word >> windows.last_slot_) || word != "last_slot" ||
      !in_range(windows.last_slot_)) {
    return bad("bad last_slot line");
  }
  for (;;) {
    if (!(in >> word)) return bad("missing end line");
    if (word == "end") break;
    std::string stream;
    StreamCuts cuts;
    size_t count = 0;
    if (word != "stream" || !(in >> stream >> cuts.origin >> count) ||
        !ValidStreamName(stream) || !in_range(cuts.origin) || count > (size_t{1} << 24)) {
      return bad("bad stream line");
    }
    if (windows.streams_.count(stream) > 0) return bad("stream " + stream + " listed twice");
    int64_t previous_slot = 0, previous_cut = cuts.origin;
    for (size_t i = 0; i < count; ++i) {
      int64_t slot = 0, cut = 0;
      if (!(in >> slot >> cut) || slot < 1 || slot > windows.last_slot_ || !in_range(cut)) {
        return bad("bad cut of stream " + stream);
      }
      if (slot <= previous_slot || cut <= previous_cut) {
        return bad("cuts of stream " + stream + " are not increasing");
      }
      cuts.changes.emplace_back(slot, cut);
      previous_slot = slot;
      previous_cut = cut;
    }
    windows.streams_.emplace(stream, std::move(cuts));
  }
  if (in >> word) return bad("trailing data after end");
  return windows;
}

}  // namespace vipsd::svi
