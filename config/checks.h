// Checks across keys: the rules that one key's Field cannot check alone.
//
// What it is: the functions the key table (config/keys.h) runs after a key
// or section is read (each named in its row), the derived defaults, and the
// checks of the whole file run after every key is read (CheckWholeFile).
// Each says why the rule exists; the messages are part of the interface
// (tests and operators match them).
//
// Ownership: none; each works on the VipsdConfig being parsed and reports
// through the Section (or Diagnostics) it is given.
// Thread-safety: thread-safe (no state).
// Failure: errors and warnings are recorded, never returned; parsing goes
// on so that every problem of a file is reported at once.
#pragma once

#include <string>

#include "config/config.h"
#include "config/section.h"

namespace vipsd::config::internal {

// Kafka topic names: 1..249 of [a-zA-Z0-9._-] (Kafka's own rule).
bool IsTopicName(const std::string& name);
inline constexpr const char* kTopicRule = "a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)";

// Derived defaults (Key::derive), set before the key is read.
void DefaultReleaseDelay(VipsdConfig& config);  // schedule.interval_seconds
void DefaultStepTiming(VipsdConfig& config);    // off in private runs
// sink.type, when unreadable, is taken to be the source's type, so that
// the sink's other keys are checked against the likely intent.
void SinkTypeOfSource(VipsdConfig& config);

// Key checks (Key::check), run after the key is read; `section` is the
// key's section.
void CheckNoiseSeed(Section& privacy, VipsdConfig& config);
void CheckResidencyIsPrivate(Section& privacy, VipsdConfig& config);
void CheckWarnAtIncreasing(Section& privacy, VipsdConfig& config);
void CheckNormRule(Section& blr, VipsdConfig& config);
void CheckBlrPriorGroups(Section& blr, VipsdConfig& config);
void CheckOfflineStop(Section& schedule, VipsdConfig& config);
void CheckLedgerKey(Section& state, VipsdConfig& config);
void CheckStandby(Section& state, VipsdConfig& config);
void CheckWorkTopic(Section& state, VipsdConfig& config);
void CheckWorkPartitions(Section& state, VipsdConfig& config);
// Section checks, run after the section's keys are read.
void CheckLda(Section& lda, VipsdConfig& config);
void CheckSbn(Section& sbn, VipsdConfig& config);

// Rules across sections and warnings of legal but unwise values, after
// every key is read.
void CheckWholeFile(const VipsdConfig& config, Diagnostics* diag);

}  // namespace vipsd::config::internal
