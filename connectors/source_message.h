// SourceMessage: one record as a source hands it over — a Kafka message or
// a line of a JSON Lines file — with its stream position. The one record
// type at the connector seam: the Kafka consumer fills it, the daemon's
// InputSource returns it (daemon/io/io.h: InputRecord is this type), the
// dead-letter message is made from it.
//
// Privacy: key, payload and headers are private record content: never
// logged, counted or put into an error, never written to the daemon's
// disk. The position (topic, partition, offset) is stream volume.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vipsd::connectors {

// Who set a message's timestamp: the broker when it appended the message
// (Kafka message.timestamp.type=LogAppendTime; monotone per partition while
// the broker's clock is), the producer (CreateTime; any value it chose), or
// nobody (a file line; a pre-0.10 message format).
enum class TimestampType { kNone, kCreateTime, kLogAppendTime };

struct SourceMessage {
  std::string topic;
  int32_t partition = 0;
  int64_t offset = 0;
  std::string key;      // empty if the message has no key
  std::string payload;  // empty if oversize (or an empty/null value)
  std::vector<std::pair<std::string, std::string>> headers;  // in message order
  // Larger than the source's size limit: payload and headers are not kept.
  bool oversize = false;
  // The offset lies below the consumer group's committed offset of its
  // partition as it stood when the partition was assigned (resume offsets
  // re-read a window from its start): some member of the group already
  // pooled or dead-lettered this record, so a rejected one need not be
  // dead-lettered again. False when the committed offset is unknown.
  bool below_committed = false;
  // The message's timestamp (unix milliseconds) and who set it. Slot cuts
  // are decided by it (core/svi/slot_windows.h): like the position, it is
  // stream timing, not content.
  int64_t timestamp_ms = -1;
  TimestampType timestamp_type = TimestampType::kNone;
};

}  // namespace vipsd::connectors
