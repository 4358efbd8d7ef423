#include "connectors/kafka/kafka_common.h"

#include <librdkafka/rdkafka.h>

namespace vipsd::connectors::kafka_internal {

std::string ErrorName(RdKafka::ErrorCode code) {
  return rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(code));
}

std::string ErrorDescription(RdKafka::ErrorCode code) {
  return ErrorName(code) + " (" + RdKafka::err2str(code) + ")";
}

LogLevel LogLevelFromSyslog(int level) {
  if (level <= 3) return LogLevel::kError;
  if (level == 4) return LogLevel::kWarning;
  if (level <= 6) return LogLevel::kInfo;
  return LogLevel::kDebug;
}

namespace {

// Properties whose values are credentials: librdkafka's explanation of an
// invalid value may quote the value, so it is not passed on for these.
bool IsSecretProperty(const std::string& name) {
  for (const char* marker : {"password", "secret", "sasl.jaas", "oauthbearer.config", ".pem",
                             "ssl_key", "ssl.key"}) {
    if (name.find(marker) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

Status SetProperty(RdKafka::Conf& conf, std::string_view what, const std::string& name,
                   const std::string& value) {
  std::string explanation;
  switch (conf.set(name, value, explanation)) {
    case RdKafka::Conf::CONF_OK:
      return Status::Ok();
    case RdKafka::Conf::CONF_UNKNOWN:
      return InvalidArgumentError(std::string(what) + ": unknown librdkafka property '" + name +
                                  "'");
    case RdKafka::Conf::CONF_INVALID:
      break;
  }
  return InvalidArgumentError(std::string(what) + ": invalid value for librdkafka property '" +
                              name + "': " +
                              (IsSecretProperty(name)
                                   ? std::string("(librdkafka's explanation is not shown: the "
                                                 "value is a credential)")
                                   : explanation));
}

Status ApplyProperties(RdKafka::Conf& conf, std::string_view what,
                       std::span<const ManagedProperty> managed,
                       const std::map<std::string, std::string>& extra) {
  std::set<std::string> managed_names;
  for (const ManagedProperty& property : managed) {
    VIPSD_RETURN_IF_ERROR(SetProperty(conf, what, property.name, property.value));
    managed_names.insert(property.name);
  }
  for (const auto& [name, value] : extra) {
    if (managed_names.count(name) != 0) {
      return InvalidArgumentError(std::string(what) + ": librdkafka property '" + name +
                                  "' is set by vipsd and cannot be overridden");
    }
    VIPSD_RETURN_IF_ERROR(SetProperty(conf, what, name, value));
  }
  return Status::Ok();
}

void LogEventCb::event_cb(RdKafka::Event& event) {
  switch (event.type()) {
    case RdKafka::Event::EVENT_LOG:
      Log(LogLevelFromSyslog(static_cast<int>(event.severity())), component_,
          event.fac() + ": " + event.str());
      break;
    case RdKafka::Event::EVENT_ERROR:
      OnError(event.err(), event.fatal(), event.str());
      break;
    case RdKafka::Event::EVENT_STATS:
    case RdKafka::Event::EVENT_THROTTLE:
      break;
  }
}

void LogEventCb::OnError(RdKafka::ErrorCode code, bool fatal, const std::string& text) {
  Log(fatal ? LogLevel::kError : LogLevel::kWarning, component_,
      (fatal ? "fatal error " : "error ") + ErrorName(code) + ": " + text);
}

}  // namespace vipsd::connectors::kafka_internal
