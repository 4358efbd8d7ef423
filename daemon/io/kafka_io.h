// The daemon's production I/O (daemon/io/io.h) over Kafka: the input source is
// a connectors::KafkaSource in the configured consumer group; the output
// sends releases to the release topic (chunked, manifest last, confirmed by
// delivery reports) or, with sink.type: file, to a release directory, and
// dead letters and alerts to their topics through one idempotent producer.
//
// librdkafka client errors are classified for vipsd_kafka_errors_total
// (transport vs consume) from the source's counters after every poll.
//
// Privacy: see io.h. Dead letters carry the original record unchanged, so
// the dead-letter topic needs the input topic's access control (README
// "Threat model").
//
// Thread-safety: as io.h requires; the producer serialises its calls.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "connectors/kafka/kafka_producer.h"
#include "core/base/status.h"
#include "daemon/io/io.h"
#include "daemon/io/metrics.h"
#include "daemon/io/work_exchange.h"
#include "daemon/state/ledger_replica.h"

namespace vipsd::daemon {

// The librdkafka client configurations of `config` (consumer and producer:
// unknown properties, invalid values, properties vipsd manages), built
// without creating a client or connecting; errors name file:line: key.
Status CheckKafkaClients(const config::VipsdConfig& config);

// Legal but unwise client settings, as "file:line: key: warning: …" lines
// (said at --check-config and at every start): a source.max_record_bytes
// above what a dead letter can carry whole under the producer's
// message.max.bytes (such records are dead-lettered cut, with the
// vipsd-payload-truncated header; connectors/kafka/dead_letter.h).
std::vector<std::string> KafkaClientWarnings(const config::VipsdConfig& config);

StatusOr<std::unique_ptr<InputSource>> NewKafkaInput(const config::VipsdConfig& config,
                                                     const std::string& bootstrap_servers,
                                                     ResumeOffsetFn resume, Metrics* metrics);

StatusOr<std::unique_ptr<OutputSink>> NewDaemonOutput(const config::VipsdConfig& config,
                                                      const std::string& bootstrap_servers);

// The producer of the ledger and work topics, whose every append is waited
// for: the kafka.* and producer properties, with linger.ms 0 unless one of
// them sets linger.ms or queue.buffering.max.ms (librdkafka's 5 ms default
// would only delay each append: there is nothing to batch it with).
connectors::KafkaProducerOptions WaitedAppendProducerOptions(const config::VipsdConfig& config,
                                                             const std::string& bootstrap_servers);

// The ledger of record on state.ledger_topic (daemon/state/ledger_replica.h),
// keyed by state.ledger_key; producer and reader take the kafka.*
// properties. Appends and reads time out after sink.publish_timeout_seconds.
StatusOr<std::unique_ptr<LedgerReplica>> NewKafkaLedgerReplica(
    const config::VipsdConfig& config, const std::string& bootstrap_servers);

// The largest work-topic message (a plan with its model, a dense partial
// sum) the producer sends and the reader fetches: 64 MiB.
inline constexpr int64_t kWorkMessageMaxBytes = int64_t{64} << 20;

// state.work_topic (daemon/io/work_exchange.h), messages keyed by
// state.ledger_key: plans on partition 0, partial sums on partition 1. The
// coordinator reads partition 1, a worker partition 0, from its end at
// creation. The topic must have exactly two partitions (FAILED_PRECONDITION
// otherwise).
inline constexpr int32_t kWorkPlanPartition = 0;
inline constexpr int32_t kWorkPartialPartition = 1;
StatusOr<std::unique_ptr<WorkExchange>> NewKafkaWorkExchange(
    const config::VipsdConfig& config, const std::string& bootstrap_servers, WorkRole role);

}  // namespace vipsd::daemon
