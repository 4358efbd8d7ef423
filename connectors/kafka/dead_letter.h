// Dead-letter messages: what the daemon sends to the dead-letter topic for an
// input record it rejects (the record decoder refused it, or it is larger
// than the source's max_record_bytes). Sending it, then storing the
// record's offset, is how a rejected record is "processed" (docs/architecture.md).
//
// Format (one message per rejected record):
//   key    = the original record's key (empty if it had none)
//   value  = the original payload bytes, unchanged, so that an operator can
//            fix the record and replay it into the input topic;
//            EMPTY for an oversize record (its bytes were never kept)
//   headers, in this order:
//     vipsd-reason               RejectReasonName, e.g. "invalid_json"
//     vipsd-reason-description   RejectReasonDescription (fixed text naming
//                                at most a JSON key)
//     vipsd-source-topic         input topic
//     vipsd-source-partition     input partition, decimal
//     vipsd-source-offset        input offset, decimal
//     vipsd-payload-omitted      "record_too_large" — only for an oversize
//                                record (the value is then empty)
//     vipsd-payload-truncated    the record's value size in bytes, decimal —
//                                only when the value was cut (see below)
//     vipsd-key-truncated        the record's key size in bytes, decimal —
//                                only when the key was cut
//
// Size. A dead letter never exceeds what the producer can send: librdkafka
// refuses (MSG_SIZE_TOO_LARGE, for ever) a message whose key, value and
// headers exceed its message.max.bytes, and a record just under
// source.max_record_bytes would otherwise stop consumption at that record,
// restart after restart. MakeDeadLetter therefore keeps the copied key and
// value within max_message_bytes minus the headers and kDeadLetterFraming
// (room for the record's framing in the batch): the key first (cut to the
// room if it alone is larger), then the value's first bytes, and says what
// it cut in the headers above. The decoder rejected the record anyway, so a
// cut copy loses nothing the daemon could use; the original stays in the
// input topic at the offset the headers name.
//
// Privacy: the value is private record content. The dead-letter topic must
// therefore get exactly the access control of the input topic (the same
// ACL principals for read, nothing wider), and its retention should not
// exceed the input topic's. The headers hold only the reason code, fixed
// text and the record's position, none of which is derived from content.
// The daemon itself never writes dead letters to disk or to logs.
//
// Thread-safety: pure function.
#pragma once

#include <string>

#include "connectors/decode/json_document.h"
#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/kafka_source.h"

namespace vipsd::connectors {

inline constexpr char kPayloadOmittedValue[] = "record_too_large";
// librdkafka's default message.max.bytes.
inline constexpr size_t kDefaultMaxMessageBytes = 1000000;
// Bytes kept free of key, value and headers for a record's framing.
inline constexpr size_t kDeadLetterFraming = 512;

// The dead-letter message for `record`, rejected for `reason`, to
// `dead_letter_topic`, at most `max_message_bytes` (the producer's
// effective message.max.bytes) as librdkafka counts it. If record.oversize,
// the value is empty and the vipsd-payload-omitted header is added
// (whatever `reason` is; the daemon passes RejectReason::kRecordTooLarge).
OutMessage MakeDeadLetter(const SourceMessage& record, RejectReason reason,
                          const std::string& dead_letter_topic,
                          size_t max_message_bytes = kDefaultMaxMessageBytes);

// The largest record value a dead letter copies whole when the producer
// sends at most `max_message_bytes` and the record has no key (for
// --check-config's comparison with source.max_record_bytes).
size_t DeadLetterValueRoom(size_t max_message_bytes);

}  // namespace vipsd::connectors
