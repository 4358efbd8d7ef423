// Dead-letter messages: what the daemon sends to the dead-letter topic for an
// input record it rejects (the record decoder refused it, or it is larger
// than the source's max_record_bytes). Sending it, then storing the
// record's offset, is how a rejected record is "processed" (DESIGN.md 5).
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

// The dead-letter message for `record`, rejected for `reason`, to
// `dead_letter_topic`. If record.oversize, the value is empty and the
// vipsd-payload-omitted header is added (whatever `reason` is; the daemon
// passes RejectReason::kRecordTooLarge).
OutMessage MakeDeadLetter(const SourceMessage& record, RejectReason reason,
                          const std::string& dead_letter_topic);

}  // namespace vipsd::connectors
