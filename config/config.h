// vipsd's YAML configuration: schema, validation, defaults.
//
// Every key is checked: unknown keys, duplicate keys, wrong types and
// out-of-range values are rejected with a message that names the file, the
// line, the key path and the allowed values, e.g.
//   vipsd.yaml:14: privacy.sampling_rate: must be a number in (0, 1], got '1.5'
// (yaml-cpp alone reports neither missing keys by name nor duplicates; the
// walker here does). Keys that do not apply to the chosen source/sink type
// are rejected too, so a typo in a section's choice cannot silently leave a
// setting unused. Relative paths are resolved against the directory of the
// configuration file. config/examples/ holds commented examples; README
// "Configuration" is the reference of every key.
//
// Every key is declared once, in the key table (config/keys.h): the parser,
// the reload diff and the reference configuration are all derived from it
// (config/README.md lists the files).
//
// Two run modes follow from source.type:
//   file   — the offline run (daemon/service/offline_run.h): read a JSON Lines file
//            into the pool, step until max_steps/max_epochs or the ceiling.
//   kafka  — the daemon (daemon/service/daemon.h): consume topics, step on a
//            schedule, run until stopped.
//
// Thread-safety: parsing is pure; a VipsdConfig is a value. Failure: a
// Status (INVALID_ARGUMENT, NOT_FOUND); no exception leaves config/.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/where.h"
#include "core/base/log.h"
#include "core/base/status.h"
#include "core/models/blr.h"
#include "core/models/lda.h"
#include "core/models/sbn.h"
#include "core/privacy/mechanisms/privacy_unit.h"
#include "core/svi/slot_windows.h"
#include "core/svi/step_driver.h"

namespace vipsd::config {

enum class NoiseMode { kSecure, kFixedSeed };
enum class Accounting { kGlobal, kResidency };
// privacy.schedule (docs/privacy_accounting.md §5): kFixed pins (q, σ) for the
// state directory and charges the fixed-schedule bound (PLD or RDP, the
// smaller); kAdaptive lets a reload change them and charges through the RDP
// privacy filter.
enum class Schedule { kFixed, kAdaptive };
enum class CeilingAction { kHalt, kExit };
// schedule.on_overrun (daemon/service/daemon.h): what a step that ran past the next
// slot's deadline, or one overrun more than schedule.max_overruns, does.
// kStop: stepping stops for the run (the release topic shows one event);
// kCatchUp: its outputs leave at the next public boundary and the next
// slots catch up (the release times show ⌈overrun / interval⌉).
enum class OverrunAction { kStop, kCatchUp };
// privacy.unit (docs/privacy_accounting.md "The privacy unit"): what one
// guarantee protects. kRecord: one record. kKey: every record with one Kafka
// message key. kField: every record with one value of the JSON field
// privacy.unit_field (file sources).
enum class PrivacyUnit { kRecord, kKey, kField };
std::string_view PrivacyUnitName(PrivacyUnit unit);  // "record" | "key" | "field"
// What one guarantee protects, in words, for `vipsd status`, `vipsd-privacy
// plan` and the docs: "one record", or "every record of one unit (one Kafka
// message key), up to 20 of them per step". `unit` is a PrivacyUnitName.
std::string DescribeProtection(std::string_view unit, const std::string& field, int64_t cap);
enum class SourceType { kFile, kKafka };
enum class SinkType { kFile, kKafka };

struct KafkaSettings {
  bool embedded = false;               // in-process mock cluster (demo, tests)
  std::string bootstrap_servers;       // required unless embedded
  std::string client_id = "vipsd";
  // Extra librdkafka properties: for both clients, the consumer only, the
  // producer only (validated by librdkafka at start-up).
  std::map<std::string, std::string> properties;
  std::map<std::string, std::string> consumer_properties;
  std::map<std::string, std::string> producer_properties;
  // Embedded mode only:
  std::string demo_corpus;             // JSONL produced into the first input topic
  int64_t partitions = 4;              // partitions of each topic it creates
};

// Federated mode (issue 31; docs/federation.md): data holders that do not
// trust the aggregator.
enum class FederationRole { kNone, kHolder, kAggregator };

struct FederationSettings {
  FederationRole role = FederationRole::kNone;
  // Holder: its id in `holders`, and its X25519 secret key (64 hex), read
  // from {file: PATH} or {credential: NAME} only, never written in the YAML.
  std::string holder_id;
  std::string secret_key;  // SECRET: no message shows it
  // t: holders that may collude with the aggregator (or drop out) while
  // the total still carries the configured sigma; every round needs more
  // than t participants.
  int64_t tolerated_holders = 0;
  // How long the aggregator waits for a round's shares before it abandons
  // the round (charged, never released).
  double round_timeout_seconds = 30;
  // Holder: its share (or its decline) leaves at the plan's public time plus
  // this delay, whatever its data; a share not ready then is never sent and
  // the holder stops for the run (docs/federation.md "Timing"). Sized by its
  // worst-case step calibration; below round_timeout_seconds − 1.
  double share_delay_seconds = 5;
  // Every holder: id -> X25519 public key (64 lowercase hex).
  std::map<std::string, std::string> holders;
};

struct VipsdConfig {
  std::string file;  // where it was read from (for messages)
  // Line of every key that was present, by dotted path ("privacy.sampling_rate").
  std::map<std::string, int> lines;

  // model
  std::string model_type = "lda";
  models::LdaConfig lda;       // vocabulary_size is filled from the file
  std::string vocabulary_path;  // LDA only
  // model.public_prior (docs/models.md, "Public priors"): a vipsd release of
  // a model of the same type and dimensions fitted on public data only, the
  // start of the run (LDA) or the prior (BLR); "" = none. LDA and BLR.
  std::string public_prior_path;
  models::BlrConfig blr;  // blr.prior_group is filled from blr_prior_groups
  std::string blr_norm_rule = "rescale";  // rescale | reject (non-private only)
  // model.blr.prior_groups: the sizes of consecutive groups of coefficients
  // that share a prior precision (docs/models.md, "Prior groups"); empty =
  // one group.
  std::vector<double> blr_prior_groups;
  models::SbnConfig sbn;

  // privacy + schedule → the step driver
  svi::DriverConfig driver;
  NoiseMode noise_mode = NoiseMode::kSecure;
  uint64_t noise_seed = 0;
  Accounting accounting = Accounting::kGlobal;
  // The privacy unit; the cap is driver.max_records_per_unit (0 = record).
  PrivacyUnit privacy_unit = PrivacyUnit::kRecord;
  std::string unit_field;  // kField: the JSON key holding the unit id
  // Shared work with privacy.unit: key: the producers' key partitioner (a
  // unit counts only in the partition its key goes to); kNone otherwise.
  privacy::UnitPartitioner unit_partitioner = privacy::UnitPartitioner::kNone;
  // Unset: the ledger's schedule for an existing state directory, kFixed
  // for a new one.
  std::optional<Schedule> schedule;
  CeilingAction on_ceiling = CeilingAction::kHalt;
  std::vector<double> warn_at = {0.5, 0.8, 0.95};  // fractions of the ceiling
  // Kafka: the public clock. Slot k is due at start_time + k·interval; its
  // step samples the records appended in the window_steps slot intervals
  // before it (core/svi/slot_windows.h).
  double step_interval_seconds = 0;       // > 0 (kafka)
  int64_t window_steps = 0;               // M >= 1, or 0 = all (svi::kWindowAll)
  double release_delay_seconds = 0;       // a step's outputs leave at slot time + this
  double start_time = 0;                  // unix seconds of slot 0; 0 = ledger creation
  // The first slot a run observes is the first due at least this long after
  // the daemon starts (a public time: room for the group join and the
  // initial read, so that start-up does not make the first slots late).
  double start_delay_seconds = 10;
  // Slot k's cut is taken by record timestamps (source_timestamps), read
  // once the clock is this long past t_k: the time a record appended before
  // t_k may take to become readable, plus the broker's clock skew
  // (core/svi/slot_windows.h). Default min(1, interval/4, release_delay/4).
  double cut_grace_seconds = 1;
  int64_t max_steps = 0;                  // 0 = no limit
  // Overruns a run tolerates (each skips the next slot's step so that its
  // outputs leave at that slot's deadline); one more, or one that runs past
  // the next slot's deadline, stops stepping for the run (daemon.h).
  int64_t max_overruns = 3;
  OverrunAction on_overrun = OverrunAction::kStop;
  double max_epochs = 0;                  // file source; 0 = no limit; one epoch = 1/q steps

  // pool (kafka source): the most window records held in memory; a window
  // with more records stops stepping until a reload raises this (an alert,
  // never a dropped record).
  int64_t pool_capacity = 100000;

  // I/O
  SourceType source_type = SourceType::kFile;
  std::string source_path;                // file: JSON Lines
  std::vector<std::string> source_topics; // kafka
  std::string group_id = "vipsd";
  std::string start_position = "earliest";  // earliest | latest
  // Whose timestamps decide slot cuts: "log_append_time" (the broker's; a
  // message with another type is dead-lettered) or "create_time" (the
  // producers' too: the weaker claim of SECURITY.md).
  std::string source_timestamps = "log_append_time";
  // 960 KiB: a rejected record of this size still fits whole in a dead
  // letter under librdkafka's default message.max.bytes (1,000,000).
  int64_t max_record_bytes = 960 << 10;
  SinkType sink_type = SinkType::kFile;
  std::string sink_directory;             // file
  std::string release_topic;              // kafka
  std::string sink_mirror_directory;      // kafka: optional local copy of each release
  int64_t publish_every = 1;              // publish every k-th step
  double publish_timeout_seconds = 30;
  std::string dead_letter_path;           // file source: reasons only, no content
  std::string dead_letter_topic;          // kafka source: original record + reason
  std::string alert_topic;                // kafka: optional budget alerts
  KafkaSettings kafka;
  std::string state_directory;            // ledger, checkpoint
  // kafka: the ledger of record also on this one-partition topic
  // (daemon/state/ledger_replica.h), entries keyed by ledger_key (default: the
  // consumer group id). "" = the local file only.
  std::string ledger_topic;
  std::string ledger_key;
  // > 0: a hot standby — wait until the job's ledger topic has had no entry
  // for this long (the running daemon commits every slot), then take over.
  double standby_takeover_seconds = 0;
  // kafka, with ledger_topic: the process that owns the job coordinates
  // and the standbys (standby_takeover_seconds > 0) work for it — plans and
  // partial sums on this two-partition topic (daemon/io/work_exchange.h).
  // "" = no shared work.
  std::string work_topic;
  // With work_topic: whether this process reads input partitions (joins the
  // input's consumer group). false: it coordinates only — it observes the
  // logs' ends for the slot cuts and merges the others' partial sums, so
  // its serial work (merge, noise, M-step, ledger) never waits behind an
  // E-step of its own; as a standby it does not work either.
  bool work_partitions = true;
  // federation: several data holders and one aggregator (kafka only; the
  // plans and masked shares travel on state.work_topic).
  FederationSettings federation;
  int64_t checkpoint_every = 1;
  std::string metrics_listen = "127.0.0.1:9464";  // "" = no endpoint
  // Export step durations (they reveal how long each step took). Default:
  // off in private runs, on in non-private ones.
  bool expose_step_timing = false;
  LogLevel log_level = LogLevel::kInfo;
  LogFormat log_format = LogFormat::kLogfmt;  // log.format: logfmt | json (live)

  // Legal but unwise values, "file:line: key: warning: why" (printed at
  // start-up and by --check-config).
  std::vector<std::string> warnings;

  bool is_private() const { return driver.mechanism.noise_multiplier > 0; }
  bool federated() const { return federation.role != FederationRole::kNone; }
  // Line of `key` in the file, or 0 if it was not given.
  int line_of(const std::string& key) const;
};

// Parses and validates `yaml_text`; `file` is used in messages and to
// resolve relative paths. Every error of the file is reported, one per line
// of the message, sorted by line; unknown keys and misspelt values name the
// closest valid one ("did you mean ..."). An empty file, CR-only line ends
// and tabs in the indentation get messages of their own.
StatusOr<VipsdConfig> ParseConfig(std::string_view yaml_text, const std::string& file);

// Reads the file and parses it. A missing path, a directory, a FIFO or
// device, or a file above 4 MiB is refused with a message that says so.
StatusOr<VipsdConfig> LoadConfigFile(const std::string& path);

// What a reload (SIGHUP) may change: σ (not between 0 and > 0), q, the
// ceiling and its action, warning fractions, τ0, κ, threads, the slot
// interval and release delay, the window (shorter only — checked by the
// daemon), max_steps, pool capacity, publish cadence, checkpoint cadence,
// log level and format. Anything else (model, vocabulary, accounting mode,
// δ, noise mode, start time, I/O, Kafka, state, metrics) is refused.
// Returns the dotted keys that change (empty: nothing to do) — and, in
// `described`, one "key: old -> new" per change for the reload log — or
// INVALID_ARGUMENT naming the first key (in the key table's order) that
// may not change, its line in `next` and both values (never the values of
// librdkafka properties, which may hold credentials). Values are spelt as
// in a configuration file: enums by name ("running: fixed, file:
// adaptive"), booleans as true/false, window_steps "all".
StatusOr<std::vector<std::string>> ChangedReloadableKeys(
    const VipsdConfig& running, const VipsdConfig& next,
    std::vector<std::string>* described = nullptr);

// The reference configuration: every key of the key table (the keys the
// parser reads), with its default, kind, allowed values, whether it is
// required, whether a reload applies it live, and when it applies.
// `vipsd --print-reference-config` prints it; config/vipsd.reference.yaml is
// its output, kept equal by a test.
std::string ReferenceConfig();

// KeyWhere(file, line, key) (config/where.h) for `key` in `config`: its
// line in config.file (0 when the file leaves it out).
std::string KeyWhere(const VipsdConfig& config, const std::string& key);

// The keys a reload applies live (ChangedReloadableKeys' live changes).
const std::vector<std::string>& LiveReloadKeys();

// The pool's capacity margin of a Kafka run (one text for --check-config
// and `vipsd-privacy plan --config`): a window over pool.capacity records
// stops stepping (what that stop reveals is outside epsilon, SECURITY.md).
struct CapacityMargin {
  bool applies = false;    // a Kafka source (a file run has no window)
  bool unbounded = false;  // window_steps: all
  int64_t capacity = 0;
  double window_seconds = 0;       // window_steps × interval_seconds
  double records_per_second = 0;   // capacity / window_seconds (the average rate it holds)
  std::string text;                // one sentence, "" when !applies
};
CapacityMargin CapacityMarginOf(const VipsdConfig& config);

// Every key that applies to `config`'s choices (model.type, source.type,
// ...; its section's too), in the key table's order, with its value spelt
// as a configuration file spells it. librdkafka properties (which may hold
// credentials) are left out.
std::vector<std::pair<std::string, std::string>> AppliedKeyValues(const VipsdConfig& config);

}  // namespace vipsd::config
