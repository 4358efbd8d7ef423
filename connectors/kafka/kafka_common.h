// Internal helpers shared by the Kafka connectors (mock cluster, source,
// producer). Not part of the connectors' public interface: include it only
// from connectors/kafka/*.cc. It includes librdkafka's headers, which must
// stay inside connectors/ (docs/style.md "Layout").
//
// Privacy: everything here handles configuration, error codes and librdkafka
// log lines, never message content. librdkafka's log lines name brokers,
// topics, partitions and offsets, not keys or payloads.
//
// Thread-safety: the functions are thread-safe; LogEventCb may be invoked by
// librdkafka from any thread that serves the handle.
#pragma once

#include <librdkafka/rdkafkacpp.h>

#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "core/base/log.h"
#include "core/base/status.h"

namespace vipsd::connectors::kafka_internal {

// Symbolic librdkafka error name, e.g. "_TRANSPORT", "_ALL_BROKERS_DOWN",
// "MSG_SIZE_TOO_LARGE" (rd_kafka_err2name): stable and low-cardinality, so
// it is used in stats keys and error messages.
std::string ErrorName(RdKafka::ErrorCode code);

// "_TRANSPORT (Local: Broker transport failure)".
std::string ErrorDescription(RdKafka::ErrorCode code);

// syslog level (0 emerg .. 7 debug) as used by librdkafka → our level.
LogLevel LogLevelFromSyslog(int level);

// Sets `name`=`value` on `conf`. An unknown name or a bad value is
// INVALID_ARGUMENT naming the property (`what` labels the client, e.g.
// "kafka source"), with librdkafka's explanation.
Status SetProperty(RdKafka::Conf& conf, std::string_view what, const std::string& name,
                   const std::string& value);

// A property the connector sets itself because its contract depends on it.
struct ManagedProperty {
  const char* name;
  std::string value;
};

// Sets the `managed` properties, then `extra` (operator-supplied properties)
// after checking that none of them names a managed property: such a name is
// INVALID_ARGUMENT naming it.
Status ApplyProperties(RdKafka::Conf& conf, std::string_view what,
                       std::span<const ManagedProperty> managed,
                       const std::map<std::string, std::string>& extra);

// The event callback every vipsd Kafka handle installs: librdkafka log lines
// go to vipsd::Log under `component` (the default handler would print them
// on stderr in its own format), and error events go to OnError, which the
// owner overrides to count them. librdkafka's own messages carry no record
// content (see above); nothing else is added here.
class LogEventCb : public RdKafka::EventCb {
 public:
  explicit LogEventCb(std::string component) : component_(std::move(component)) {}
  void event_cb(RdKafka::Event& event) override;

 protected:
  // Called for EVENT_ERROR; default: log a warning (error if fatal).
  virtual void OnError(RdKafka::ErrorCode code, bool fatal, const std::string& text);
  const std::string& component() const { return component_; }

 private:
  std::string component_;
};

}  // namespace vipsd::connectors::kafka_internal
