#include "connectors/kafka/dead_letter.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace vipsd::connectors {
namespace {

// What librdkafka adds per header beyond its name and value (two varint
// lengths), rounded up.
constexpr size_t kHeaderFraming = 10;
// A decimal size header's value is at most 20 digits.
constexpr size_t kSizeHeaderBytes = sizeof("vipsd-payload-truncated") - 1 + 20 + kHeaderFraming;

size_t HeaderBytes(const std::vector<std::pair<std::string, std::string>>& headers) {
  size_t bytes = 0;
  for (const auto& [name, value] : headers) bytes += name.size() + value.size() + kHeaderFraming;
  return bytes;
}

}  // namespace

OutMessage MakeDeadLetter(const SourceMessage& record, RejectReason reason,
                          const std::string& dead_letter_topic, size_t max_message_bytes) {
  OutMessage out;
  out.topic = dead_letter_topic;
  out.headers = {
      {"vipsd-reason", std::string(RejectReasonName(reason))},
      {"vipsd-reason-description", std::string(RejectReasonDescription(reason))},
      {"vipsd-source-topic", record.topic},
      {"vipsd-source-partition", std::to_string(record.partition)},
      {"vipsd-source-offset", std::to_string(record.offset)},
  };
  if (record.oversize) out.headers.emplace_back("vipsd-payload-omitted", kPayloadOmittedValue);
  // Room for key and value once the headers (and the two size headers a
  // cut may add) and the framing are counted.
  const size_t reserved = HeaderBytes(out.headers) + 2 * kSizeHeaderBytes + kDeadLetterFraming;
  size_t room = max_message_bytes > reserved ? max_message_bytes - reserved : 0;
  const std::string_view value = record.oversize ? std::string_view() : record.payload;
  if (record.key.size() > room) {
    out.key = record.key.substr(0, room);
    out.headers.emplace_back("vipsd-key-truncated", std::to_string(record.key.size()));
  } else {
    out.key = record.key;
  }
  room -= out.key.size();
  if (value.size() > room) {
    out.value = std::string(value.substr(0, room));
    out.headers.emplace_back("vipsd-payload-truncated", std::to_string(value.size()));
  } else {
    out.value = std::string(value);
  }
  return out;
}

size_t DeadLetterValueRoom(size_t max_message_bytes) {
  // The largest headers any dead letter carries: Kafka's longest topic
  // names, the widest position, the longest reason, the omitted marker.
  SourceMessage worst;
  worst.topic = std::string(249, 't');
  worst.partition = INT32_MAX;
  worst.offset = INT64_MAX;
  worst.oversize = true;
  size_t reserved = 0;
  for (size_t reason = 0; reason < kNumRejectReasons; ++reason) {
    const OutMessage probe = MakeDeadLetter(worst, static_cast<RejectReason>(reason),
                                            std::string(249, 't'), max_message_bytes);
    reserved = std::max(reserved, HeaderBytes(probe.headers));
  }
  reserved += 2 * kSizeHeaderBytes + kDeadLetterFraming;
  return max_message_bytes > reserved ? max_message_bytes - reserved : 0;
}

}  // namespace vipsd::connectors
