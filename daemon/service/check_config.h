// What `vipsd --config FILE --check-config` checks, and the part of it every
// start repeats before anything else: the configuration's warnings (legal
// but unwise values, the Kafka clients'), the start-up checks that need
// neither the network nor a write (daemon/setup/startup_check.h CheckStartUp and
// the librdkafka client configurations), and the worst-case step timed on
// public synthetic records against its slot (daemon/setup/step_calibration.h).
//
// Lines go to stderr as "vipsd: text", or, with log.format: json, as JSON
// log lines (a log shipper rejects anything else from the first line on).
#pragma once

#include <string>

#include "config/config.h"
#include "core/base/log.h"
#include "daemon/service/daemon.h"

namespace vipsd::daemon {

// One line of the checks, in the configuration's log format.
void SayCheck(const config::VipsdConfig& config, LogLevel level, const std::string& text);

// The configuration's warnings (with the Kafka clients' added) said once.
void SayConfigWarnings(config::VipsdConfig* config);

// What a start says when --no-step-time-check skipped the step timing.
std::string UntimedStartWarning();

// The worst-case step timed against its slot. False when the configuration
// is refused (said as an error naming the key and its line); a fit without
// margin, or only on a less busy machine, is said as a warning; a fit with
// margin goes to *fits_line (with what it bounds of β). A timing that fails
// to run is an error at --check-config (`check_only`) and left to the start
// otherwise (it says what is wrong itself).
bool TimeWorstCaseStep(const config::VipsdConfig& config, bool check_only,
                       std::string* fits_line);

// --check-config: everything above as a start with the same flags would
// check it, without network or writes; prints the verdict on stdout.
// Returns the exit status: 0 valid, 2 invalid.
int CheckConfigCommand(const config::VipsdConfig& config, const std::string& path,
                       const DaemonOptions& options, bool step_time_check);

}  // namespace vipsd::daemon
