#include "connectors/kafka/dead_letter.h"

namespace vipsd::connectors {

OutMessage MakeDeadLetter(const SourceMessage& record, RejectReason reason,
                          const std::string& dead_letter_topic) {
  OutMessage out;
  out.topic = dead_letter_topic;
  out.key = record.key;
  if (!record.oversize) out.value = record.payload;
  out.headers = {
      {"vipsd-reason", std::string(RejectReasonName(reason))},
      {"vipsd-reason-description", std::string(RejectReasonDescription(reason))},
      {"vipsd-source-topic", record.topic},
      {"vipsd-source-partition", std::to_string(record.partition)},
      {"vipsd-source-offset", std::to_string(record.offset)},
  };
  if (record.oversize) out.headers.emplace_back("vipsd-payload-omitted", kPayloadOmittedValue);
  return out;
}

}  // namespace vipsd::connectors
