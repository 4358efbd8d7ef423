#include "daemon/parts/ingest.h"

#include <algorithm>
#include <limits>

#include "core/base/log.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";
constexpr size_t kPollBatch = 512;
constexpr auto kPollTimeout = std::chrono::milliseconds(200);
constexpr int64_t kNoTarget = std::numeric_limits<int64_t>::max();

}  // namespace

Ingest::Ingest(const connectors::RecordDecoder* decoder, OutputSink* dead_letters,
               Metrics* metrics, RunControl* control, bool cover_every_stream)
    : decoder_(decoder),
      dead_letters_(dead_letters),
      metrics_(metrics),
      control_(control),
      cover_every_stream_(cover_every_stream) {}

Ingest::~Ingest() {
  Stop();
  Join();
}

void Ingest::Start(std::unique_ptr<InputSource> source) {
  source_ = std::move(source);
  thread_ = std::thread([this] { Loop(); });
}

void Ingest::Stop() {
  {
    MutexLock lock(&mutex_);
    stop_ = true;
  }
  wake_.notify_all();
}

void Ingest::Join() {
  if (thread_.joinable()) thread_.join();
}

void Ingest::Close() {
  if (source_ == nullptr) return;  // a worker that never saw a plan has none
  const Status committed = source_->Commit();
  if (!committed.ok()) {
    Log(LogLevel::kWarning, kComponent, "final offset commit: " + committed.ToString());
  }
  const Status closed = source_->Close();
  if (!closed.ok()) Log(LogLevel::kWarning, kComponent, "closing the source: " + closed.ToString());
}

std::optional<Status> Ingest::error() const {
  MutexLock lock(&mutex_);
  return error_;
}

void Ingest::Fail(const Status& error) {
  {
    MutexLock lock(&mutex_);
    if (!error_) error_ = error;
    stop_ = true;
  }
  wake_.notify_all();
  control_->RequestStop();
}

void Ingest::SetResumeOffsets(std::map<std::string, int64_t> offsets, bool covered) {
  {
    MutexLock lock(&mutex_);
    resume_offsets_ = std::move(offsets);
    if (covered) {
      for (const auto& [stream, offset] : resume_offsets_) covered_streams_.insert(stream);
    }
  }
  wake_.notify_all();  // a stream waiting to be covered may be now
}

void Ingest::SetResumeOffset(const std::string& stream, int64_t offset) {
  MutexLock lock(&mutex_);
  resume_offsets_[stream] = offset;
}

std::optional<int64_t> Ingest::ResumeOffset(const std::string& topic, int32_t partition) const {
  MutexLock lock(&mutex_);
  const auto it = resume_offsets_.find(StreamName(topic, partition));
  if (it == resume_offsets_.end()) return std::nullopt;
  return it->second;
}

bool Ingest::TakeCoverRequest() {
  MutexLock lock(&mutex_);
  const bool requested = cover_requested_;
  cover_requested_ = false;
  return requested;
}

void Ingest::Cover(const std::vector<std::string>& streams) {
  {
    MutexLock lock(&mutex_);
    covered_streams_.insert(streams.begin(), streams.end());
  }
  wake_.notify_all();
}

void Ingest::RequestCover() {
  MutexLock lock(&mutex_);
  cover_requested_ = true;
}

void Ingest::SetCapacity(int64_t capacity) {
  {
    MutexLock lock(&mutex_);
    capacity_ = capacity;
  }
  wake_.notify_all();
}

uint32_t Ingest::StreamIdLocked(const std::string& stream) {
  auto [it, inserted] = stream_ids_.emplace(stream, static_cast<uint32_t>(stream_names_.size()));
  if (inserted) {
    stream_names_.push_back(stream);
    staging_.emplace_back();
    next_unread_.push_back(0);
    kept_from_.push_back(-1);
    target_.push_back(kNoTarget);
    floor_.push_back(0);
  }
  return it->second;
}

uint32_t Ingest::StreamId(const std::string& stream) {
  MutexLock lock(&mutex_);
  return StreamIdLocked(stream);
}

std::vector<std::string> Ingest::StreamNames() const {
  MutexLock lock(&mutex_);
  return stream_names_;
}

SlotTargets SlotTargets::AtEnds(const std::map<std::string, int64_t>& ends) {
  SlotTargets targets;
  for (const auto& [stream, end] : ends) targets.streams[stream] = {end, end};
  return targets;
}

void Ingest::SetTimestampPolicy(TimestampPolicy policy) {
  MutexLock lock(&mutex_);
  timestamp_policy_ = policy;
}

void Ingest::LowerTargetLocked(uint32_t id, const Staged& staged) {
  // The first record at or above the floor stamped after the slot time
  // belongs to a later slot: the cut is its offset. Records are staged in
  // offset order, so the first one found is the lowest.
  // A stream without a target this slot (not observed for it) has no cut.
  if (cut_time_ms_ != kNoCutTime && target_[id] != kNoTarget && staged.offset >= floor_[id] &&
      staged.offset < target_[id] && staged.timestamp_ms > cut_time_ms_) {
    target_[id] = staged.offset;
  }
}

void Ingest::SetTargets(const SlotTargets& targets) {
  {
    MutexLock lock(&mutex_);
    // The ingest thread counts staged records below the new targets.
    for (uint32_t id = 0; id < stream_names_.size(); ++id) target_[id] = kNoTarget;
    cut_time_ms_ = targets.cut_time_ms;
    for (const auto& [stream, target] : targets.streams) {
      const uint32_t id = StreamIdLocked(stream);
      target_[id] = target.end;
      floor_[id] = std::min(target.floor, target.end);
      for (const Staged& staged : staging_[id]) {
        if (staged.offset >= target_[id]) break;
        LowerTargetLocked(id, staged);
      }
    }
    staged_in_window_ = 0;
    for (uint32_t id = 0; id < stream_names_.size(); ++id) {
      for (const Staged& staged : staging_[id]) {
        if (staged.offset < target_[id]) ++staged_in_window_;
      }
    }
  }
  wake_.notify_all();
}

WindowProgress Ingest::Progress(const std::map<std::string, int64_t>& streams,
                                const std::function<int64_t(const std::string&)>& window_start) {
  WindowProgress progress;
  MutexLock lock(&mutex_);
  for (const auto& [stream, end] : streams) {
    const uint32_t id = StreamIdLocked(stream);
    const int64_t target = std::min(target_[id], end);
    const int64_t low = window_start(stream);
    if (target > low && next_unread_[id] < target) {
      progress.behind.emplace_back(stream, std::max(next_unread_[id], low));
    }
  }
  progress.held = pool_size_ + staged_in_window_;
  return progress;
}

std::map<std::string, int64_t> Ingest::Cuts(const std::map<std::string, int64_t>& streams) {
  std::map<std::string, int64_t> cuts = streams;
  MutexLock lock(&mutex_);
  for (auto& [stream, cut] : cuts) {
    cut = std::min(cut, target_[StreamIdLocked(stream)]);
  }
  return cuts;
}

std::vector<std::pair<uint32_t, std::deque<Staged>>> Ingest::Admit(
    const std::map<std::string, int64_t>& cuts) {
  std::vector<std::pair<uint32_t, std::deque<Staged>>> admitted;
  MutexLock lock(&mutex_);
  for (const auto& [stream, cut] : cuts) {
    const uint32_t id = StreamIdLocked(stream);
    std::deque<Staged>& staged = staging_[id];
    std::deque<Staged> taken;
    while (!staged.empty() && staged.front().offset < cut) {
      taken.push_back(std::move(staged.front()));
      staged.pop_front();
    }
    staged_in_window_ -= static_cast<int64_t>(taken.size());
    if (!taken.empty()) admitted.emplace_back(id, std::move(taken));
  }
  staged_in_window_ = std::max<int64_t>(staged_in_window_, 0);
  return admitted;
}

void Ingest::SetPoolSize(int64_t size) {
  {
    MutexLock lock(&mutex_);
    pool_size_ = size;
  }
  wake_.notify_all();
}

void Ingest::AdvanceTo(const std::map<std::string, int64_t>& low) {
  {
    MutexLock lock(&mutex_);
    for (const auto& [stream, offset] : low) {
      // Staged records below the new window start (possible only after a
      // skipped slot) are dropped too.
      std::deque<Staged>& staged = staging_[StreamIdLocked(stream)];
      while (!staged.empty() && staged.front().offset < offset) staged.pop_front();
    }
    // The next slot's cut is not known yet: every staged record counts.
    int64_t staged = 0;
    cut_time_ms_ = kNoCutTime;
    for (uint32_t id = 0; id < stream_names_.size(); ++id) {
      target_[id] = kNoTarget;
      staged += static_cast<int64_t>(staging_[id].size());
    }
    staged_in_window_ = staged;
  }
  wake_.notify_all();
}

bool Ingest::CompleteLocked(const std::string& stream) {
  // Reading starts at a window's start (the resume offsets are windows'
  // lows, which never decrease), and re-delivered offsets are dropped, so
  // everything in [low, next_unread) has been read here.
  const uint32_t id = StreamIdLocked(stream);
  return target_[id] != kNoTarget && next_unread_[id] >= target_[id];
}

bool Ingest::Complete(const std::string& stream) {
  MutexLock lock(&mutex_);
  return CompleteLocked(stream);
}

int64_t Ingest::Target(const std::string& stream) {
  MutexLock lock(&mutex_);
  return target_[StreamIdLocked(stream)];
}

bool Ingest::AssignedLocked(const std::string& stream) const {
  // Only the partition's current holder sums it: a process that read a
  // partition before a rebalance moved it away could (its records are still
  // staged), but would then do the new holder's work twice.
  return !assigned_.has_value() || assigned_->count(stream) > 0;
}

bool Ingest::AssignmentReported() const {
  MutexLock lock(&mutex_);
  return assigned_.has_value();
}

bool Ingest::Assigned(const std::string& stream) const {
  MutexLock lock(&mutex_);
  return AssignedLocked(stream);
}

bool Ingest::Overflowing(const std::string& stream) {
  MutexLock lock(&mutex_);
  if (capacity_ <= 0 || pool_size_ + staged_in_window_ <= capacity_) return false;
  return AssignedLocked(stream) && !CompleteLocked(stream);
}

bool Ingest::DropBelow(const std::string& stream, int64_t low) {
  MutexLock lock(&mutex_);
  const uint32_t id = StreamIdLocked(stream);
  std::deque<Staged>& staged = staging_[id];
  if (kept_from_[id] >= 0 && low < kept_from_[id] && next_unread_[id] > low) {
    // Records in [low, kept_from_) were read and dropped: read them again.
    for (const Staged& record : staged) {
      if (record.offset < target_[id]) --staged_in_window_;
    }
    staged_in_window_ = std::max<int64_t>(staged_in_window_, 0);
    staged.clear();
    Log(LogLevel::kWarning, kComponent,
        stream + ": the window now starts at offset " + std::to_string(low) + ", below " +
            std::to_string(kept_from_[id]) + " where an earlier plan started it (that "
            "coordinator was replaced); reading the stream again from " + std::to_string(low));
    next_unread_[id] = low;
    kept_from_[id] = low;
    rewinds_[id] = low;
    rewinding_.insert(id);
    return true;
  }
  while (!staged.empty() && staged.front().offset < low) staged.pop_front();
  kept_from_[id] = std::max(kept_from_[id], low);
  return false;
}

int64_t Ingest::records_pooled() const {
  MutexLock lock(&mutex_);
  return records_pooled_;
}

int64_t Ingest::records_rejected() const {
  MutexLock lock(&mutex_);
  return records_rejected_;
}

bool Ingest::WaitLocked(MutexLock& lock, std::chrono::milliseconds timeout) {
  if (stop_) return false;
  lock.WaitFor(wake_, timeout);
  return !stop_;
}

// ---------------------------------------------------------------------------
// The ingest thread

void Ingest::Loop() {
  auto backoff = std::chrono::milliseconds(100);
  std::set<std::string> paused;
  for (;;) {
    std::set<std::string> pause, resume;
    std::map<std::string, int64_t> rewind;
    {
      MutexLock lock(&mutex_);
      if (stop_) return;
      for (const auto& [id, offset] : rewinds_) rewind[stream_names_[id]] = offset;
      rewinds_.clear();
      // A stream read up to the cut the step thread gathers for is paused,
      // so that records of later slots do not crowd the window's.
      for (uint32_t id = 0; id < stream_names_.size(); ++id) {
        const bool done = target_[id] != kNoTarget && next_unread_[id] >= target_[id];
        const std::string& name = stream_names_[id];
        if (done && paused.count(name) == 0) pause.insert(name);
        if (!done && paused.count(name) > 0) resume.insert(name);
      }
      if (pause.empty() && resume.empty() && capacity_ > 0 &&
          pool_size_ + staged_in_window_ > capacity_) {
        // Back-pressure: the window's records fill pool.capacity and one
        // more was read (so an overflow is a fact, never a guess about
        // unread offsets that may be dead letters or transaction markers);
        // leave the rest in Kafka. The step thread decides whether the slot
        // overflows.
        WaitLocked(lock, std::chrono::milliseconds(100));
        continue;
      }
    }
    if (!rewind.empty()) {
      // Before the next poll: what that returns comes from the new position.
      for (const auto& [stream, offset] : rewind) {
        const Status rewound = source_->Rewind(stream, offset);
        if (!rewound.ok()) {
          // The window could not be read whole: stop rather than sum it
          // with records missing (a restart reads from the window starts).
          Fail(rewound);
          return;
        }
      }
      MutexLock lock(&mutex_);
      for (const auto& [stream, offset] : rewind) rewinding_.erase(StreamIdLocked(stream));
    }
    if (!pause.empty()) {
      const Status paused_ok = source_->Pause(pause);
      if (!paused_ok.ok()) Log(LogLevel::kWarning, kComponent, "pause: " + paused_ok.ToString());
      paused.insert(pause.begin(), pause.end());
    }
    if (!resume.empty()) {
      const Status resumed = source_->Resume(resume);
      if (!resumed.ok()) Log(LogLevel::kWarning, kComponent, "resume: " + resumed.ToString());
      for (const auto& name : resume) paused.erase(name);
    }
    auto polled = source_->Poll(kPollBatch, kPollTimeout);
    if (!polled.ok()) {
      Log(LogLevel::kError, kComponent, "input: " + polled.status().ToString());
      metrics_->kafka_errors_total(KafkaErrorKind::kConsume).Increment();
      MutexLock lock(&mutex_);
      if (!WaitLocked(lock, backoff)) return;
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    if (polled->assignment.has_value()) {
      bool changed = false;
      {
        MutexLock lock(&mutex_);
        if (assigned_ != polled->assignment) {
          assigned_ = std::move(polled->assignment);
          changed = true;
        }
      }
      if (changed) control_->Ring();
    }
    if (polled->records.empty() && polled->reached_end.empty()) continue;
    const Status status = IngestBatch(*polled);
    if (!status.ok()) {
      Fail(status);
      return;
    }
  }
}

bool Ingest::DeadLetter(const InputRecord& record, connectors::RejectReason reason) {
  if (record.below_committed) {
    // Re-read below the group's committed offset (a restart re-reads each
    // window from its start): dead-lettered before.
    metrics_->records_rejected_total(reason).Increment();
    metrics_->dead_letters_skipped_total(DeadLetterSkip::kDeliveredBefore).Increment();
    return true;
  }
  auto backoff = std::chrono::milliseconds(200);
  for (;;) {
    const Status published = dead_letters_->PublishDeadLetter(record, reason);
    if (published.ok()) {
      metrics_->records_rejected_total(reason).Increment();
      metrics_->dead_letters_published_total().Increment();
      return true;
    }
    metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
    if (published.code() == StatusCode::kInvalidArgument) {
      metrics_->records_rejected_total(reason).Increment();
      metrics_->dead_letters_skipped_total(DeadLetterSkip::kUndeliverable).Increment();
      if (!undeliverable_logged_) {
        undeliverable_logged_ = true;
        Log(LogLevel::kError, kComponent,
            "a dead letter can never be delivered; it is skipped and the record's offset "
            "committed, so that consumption goes on (the record stays in the input topic at " +
                StreamName(record.topic, record.partition) + " offset " +
                std::to_string(record.offset) +
                "); further ones are only counted in "
                "vipsd_dead_letters_skipped_total{cause=\"undeliverable\"}: " +
                published.ToString());
      }
      return true;
    }
    Log(LogLevel::kWarning, kComponent,
        "dead-letter publish failed, retrying (the record stays unacknowledged): " +
            published.ToString());
    MutexLock lock(&mutex_);
    // Stopping: leave this and later records unacknowledged; they are read
    // again at the next start.
    if (!WaitLocked(lock, backoff)) return false;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

void Ingest::DecodeBatch(std::vector<InputRecord>& records, const std::vector<bool>& duplicate,
                         TimestampPolicy policy,
                         std::vector<std::optional<model::Record>>* decoded,
                         std::vector<std::pair<size_t, connectors::RejectReason>>* rejected) {
  for (size_t i = 0; i < records.size(); ++i) {
    metrics_->records_consumed_total(records[i].topic).Increment();
    if (duplicate[i]) continue;
    // A timestamp the cuts may not trust: the record would decide a cut
    // (core/svi/slot_windows.h) with a time its producer chose, or none.
    const connectors::TimestampType type = records[i].timestamp_type;
    if ((policy == TimestampPolicy::kLogAppendTime &&
         type != connectors::TimestampType::kLogAppendTime) ||
        (policy == TimestampPolicy::kAny &&
         (type == connectors::TimestampType::kNone || records[i].timestamp_ms < 0))) {
      rejected->emplace_back(i, connectors::RejectReason::kUntrustedTimestamp);
      if (!untrusted_logged_) {
        // Once per run: a topic without LogAppendTime sends every record
        // here. The topic and the timestamp type are configuration, not
        // content.
        untrusted_logged_ = true;
        Log(LogLevel::kWarning, kComponent,
            "topic " + records[i].topic + ": a message " +
                (type == connectors::TimestampType::kCreateTime
                     ? std::string("with a producer's timestamp (CreateTime)")
                     : std::string("without a timestamp")) +
                " was dead-lettered (untrusted_timestamp): slot cuts trust only the broker's "
                "append times. Create the topic with message.timestamp.type=LogAppendTime, or "
                "set source.timestamps: create_time (a weaker claim, SECURITY.md); "
                "vipsd_records_rejected_total{reason=\"untrusted_timestamp\"} counts them");
      }
      continue;
    }
    if (records[i].oversize) {
      rejected->emplace_back(i, connectors::RejectReason::kRecordTooLarge);
      continue;
    }
    connectors::RecordDecodeResult result =
        decoder_->DecodeKeyed(records[i].payload, records[i].key);
    if (auto* failure = std::get_if<connectors::DecodeFailure>(&result)) {
      rejected->emplace_back(i, failure->reason);  // the bytes go to the dead-letter topic
    } else {
      (*decoded)[i] = std::move(std::get<model::Record>(result));
      records[i].payload.clear();  // the decoded record is all the pool keeps
      records[i].payload.shrink_to_fit();
    }
  }
}

Status Ingest::IngestBatch(PollBatch& batch) {
  std::vector<InputRecord>& records = batch.records;
  // Re-delivered records (a rebalance or a restart re-reads from an earlier
  // offset) are dropped before they are decoded: the pool holds each offset
  // once.
  std::vector<bool> duplicate(records.size(), false);
  std::set<std::string> uncovered;
  {
    MutexLock lock(&mutex_);
    std::map<uint32_t, int64_t> seen;
    for (size_t i = 0; i < records.size(); ++i) {
      const std::string stream = StreamName(records[i].topic, records[i].partition);
      const uint32_t id = StreamIdLocked(stream);
      int64_t& next = seen.try_emplace(id, next_unread_[id]).first->second;
      duplicate[i] = records[i].offset < next;
      next = std::max(next, records[i].offset + 1);
      if (cover_every_stream_) covered_streams_.insert(stream);
      if (covered_streams_.count(stream) == 0) uncovered.insert(stream);
    }
  }
  TimestampPolicy policy;
  {
    MutexLock lock(&mutex_);
    policy = timestamp_policy_;
  }
  std::vector<std::optional<model::Record>> decoded(records.size());
  std::vector<std::pair<size_t, connectors::RejectReason>> rejected;
  DecodeBatch(records, duplicate, policy, &decoded, &rejected);
  // Dead letters are delivered before any offset of the batch is marked
  // done, so a crash never skips a rejected record.
  for (const auto& [index, reason] : rejected) {
    if (!DeadLetter(records[index], reason)) return Status::Ok();  // stopping
    records[index].payload.clear();
  }
  {
    MutexLock lock(&mutex_);
    for (size_t i = 0; i < records.size(); ++i) {
      const uint32_t id = stream_ids_.at(StreamName(records[i].topic, records[i].partition));
      if (rewinding_.count(id) > 0) continue;  // fetched before the stream's seek
      if (records[i].offset < next_unread_[id]) continue;  // duplicate
      next_unread_[id] = records[i].offset + 1;
      if (decoded[i].has_value()) {
        staging_[id].push_back(
            {std::move(*decoded[i]), records[i].offset, records[i].timestamp_ms});
        LowerTargetLocked(id, staging_[id].back());
        if (records[i].offset < target_[id]) ++staged_in_window_;
        ++records_pooled_;
      } else {
        ++records_rejected_;
      }
    }
    for (const auto& [stream, end] : batch.reached_end) {
      const uint32_t id = StreamIdLocked(stream);
      if (rewinding_.count(id) > 0) continue;
      next_unread_[id] = std::max(next_unread_[id], end);
    }
    if (!uncovered.empty()) cover_requested_ = true;
  }
  control_->Ring();
  if (!uncovered.empty()) {
    // A partition the ledger does not know yet: acknowledge its records only
    // once the ledger can re-read them after a crash.
    MutexLock lock(&mutex_);
    for (;;) {
      bool covered = true;
      for (const std::string& stream : uncovered) covered = covered && covered_streams_.count(stream) > 0;
      if (covered) break;
      if (!WaitLocked(lock, std::chrono::milliseconds(200))) {
        return Status::Ok();  // stopping: read again at the next start
      }
    }
  }
  for (const InputRecord& record : records) {
    const Status done = source_->MarkDone(record);
    if (!done.ok()) {
      metrics_->kafka_errors_total(KafkaErrorKind::kCommit).Increment();
      Log(LogLevel::kWarning, kComponent, "storing an input offset failed: " + done.ToString());
    }
  }
  if (!rejected.empty()) {
    // Commit the dead-lettered offsets now rather than at the next
    // auto-commit: a crash before it would dead-letter them once more.
    const Status committed = source_->Commit();
    if (!committed.ok()) {
      metrics_->kafka_errors_total(KafkaErrorKind::kCommit).Increment();
      Log(LogLevel::kWarning, kComponent,
          "committing dead-lettered offsets failed (they are committed later; a crash before "
          "then dead-letters them again): " + committed.ToString());
    }
  }
  metrics_->consumer_lag_records().Set(static_cast<double>(source_->Lag()));
  return Status::Ok();
}

}  // namespace vipsd::daemon
