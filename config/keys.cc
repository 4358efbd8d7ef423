#include "config/keys.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "config/checks.h"
#include "core/privacy/mechanisms/privacy_unit.h"

namespace vipsd::config {
namespace internal {
namespace {

// Enum values as a configuration file spells them, in the order the
// messages list them. ChoiceField reads and shows by these.
constexpr Named<NoiseMode> kNoiseModes[] = {{"secure", NoiseMode::kSecure},
                                            {"fixed_seed", NoiseMode::kFixedSeed}};
constexpr Named<Accounting> kAccountings[] = {{"global", Accounting::kGlobal},
                                              {"residency", Accounting::kResidency}};
constexpr Named<Schedule> kSchedules[] = {{"fixed", Schedule::kFixed},
                                          {"adaptive", Schedule::kAdaptive}};
constexpr Named<PrivacyUnit> kPrivacyUnits[] = {{"record", PrivacyUnit::kRecord},
                                                {"key", PrivacyUnit::kKey},
                                                {"field", PrivacyUnit::kField}};
constexpr Named<privacy::UnitPartitioner> kUnitPartitioners[] = {
    {"murmur2", privacy::UnitPartitioner::kMurmur2}, {"crc32", privacy::UnitPartitioner::kCrc32}};
constexpr Named<CeilingAction> kCeilingActions[] = {{"halt", CeilingAction::kHalt},
                                                    {"exit", CeilingAction::kExit}};
constexpr Named<OverrunAction> kOverrunActions[] = {{"stop", OverrunAction::kStop},
                                                    {"catch_up", OverrunAction::kCatchUp}};
constexpr Named<SourceType> kSourceTypes[] = {{"file", SourceType::kFile},
                                              {"kafka", SourceType::kKafka}};
constexpr Named<SinkType> kSinkTypes[] = {{"file", SinkType::kFile}, {"kafka", SinkType::kKafka}};
constexpr Named<FederationRole> kFederationRoles[] = {{"none", FederationRole::kNone},
                                                     {"holder", FederationRole::kHolder},
                                                     {"aggregator", FederationRole::kAggregator}};
constexpr Named<LogLevel> kLogLevels[] = {{"debug", LogLevel::kDebug},
                                          {"info", LogLevel::kInfo},
                                          {"warning", LogLevel::kWarning},
                                          {"error", LogLevel::kError}};
constexpr Named<LogFormat> kLogFormats[] = {{"logfmt", LogFormat::kLogfmt},
                                            {"json", LogFormat::kJson}};

// ---- Row builders ----------------------------------------------------------

// The accessor of a VipsdConfig member, for const and non-const configs.
#define VIPSD_MEMBER(member) \
  [](auto& c) -> auto& { return c.member; }

constexpr int64_t kSeedMax = int64_t{1} << 53;   // seeds are exact in a double
constexpr int64_t kCountMax = int64_t{1} << 40;  // steps, cadences

// Number rules; each key's allowed text says the same in words.
bool Positive(double x) { return x > 0; }
bool NonNegative(double x) { return x >= 0; }
// σ: the exact discrete sampler's range (privacy::kMaxNoiseMultiplier).
bool NoiseMultiplier(double x) { return x >= 0 && x <= 1024; }
bool StartDelay(double x) { return x >= 0 && x <= 3600; }
bool Fraction(double x) { return x > 0 && x <= 1; }     // (0, 1]
bool OpenFraction(double x) { return x > 0 && x < 1; }  // (0, 1)
bool UpToAMillion(double x) { return x > 0 && x <= 1e6; }
bool GroupSize(double x) { return x >= 1 && x <= 1024 && x == std::floor(x); }
bool DecayExponent(double x) { return x > 0.5 && x <= 1; }  // κ: Σρ_t = ∞, Σρ_t² < ∞
bool SlotInterval(double x) { return x >= 0.01 && x <= 86400 * 7; }
bool WithinTenIntervals(double x, const VipsdConfig& config) {
  return x >= 0 && x <= 10 * config.step_interval_seconds;
}
bool CutGrace(double x, const VipsdConfig& config) {
  return x >= 0 && x <= 60 && (x == 0 || x < config.step_interval_seconds) &&
         x <= config.release_delay_seconds;
}
void DefaultCutGrace(VipsdConfig& config) {
  config.cut_grace_seconds = std::min({1.0, config.step_interval_seconds / 4,
                                       config.release_delay_seconds / 4});
}
bool UnixTime(double x) { return x >= 1e9 && x <= 1e11; }
bool PublishTimeout(double x) { return x >= 1 && x <= 3600; }
bool UpToADay(double x) { return x >= 0 && x <= 86400; }
bool RoundTimeout(double x) { return x >= 1 && x <= 3600; }
bool ShareDelay(double x) { return x >= 0.05 && x <= 3600; }

Key Row(std::string path, std::shared_ptr<const Field> field) {
  Key key;
  key.path = std::move(path);
  key.field = std::move(field);
  return key;
}

Key SectionRow(std::string path) {
  Key key;
  key.path = std::move(path);
  key.is_section = true;
  return key;
}

// A key that existed once: refused with the reason it went away.
Key Removed(std::string path, std::string why) {
  Key key;
  key.path = std::move(path);
  key.removed = std::move(why);
  return key;
}

template <typename Get>
Key Number(std::string path, Get get, NumberRule ok, std::string allowed) {
  return Row(std::move(path),
             std::make_shared<NumberField<Get>>(std::move(get), std::move(ok), std::move(allowed)));
}
template <typename Get>
Key Number(std::string path, Get get, bool (*ok)(double), std::string allowed) {
  return Number(std::move(path), std::move(get),
                NumberRule([ok](double x, const VipsdConfig&) { return ok(x); }),
                std::move(allowed));
}
template <typename Get>
Key Integer(std::string path, Get get, int64_t low, int64_t high) {
  return Row(std::move(path), std::make_shared<IntegerField<Get>>(std::move(get), low, high));
}
template <typename Get>
Key IntegerOrKeyword(std::string path, Get get, std::string keyword, int64_t keyword_value,
                     int64_t low, int64_t high) {
  return Row(std::move(path), std::make_shared<IntegerField<Get>>(
                                  std::move(get), low, high, std::move(keyword), keyword_value));
}
template <typename Get>
Key StringRow(std::string path, Get get, typename StringField<Get>::Options options) {
  return Row(std::move(path),
             std::make_shared<StringField<Get>>(std::move(get), std::move(options)));
}
template <typename Get>
Key String(std::string path, Get get, std::vector<std::string> choices = {}) {
  typename StringField<Get>::Options options;
  options.choices = std::move(choices);
  return StringRow(std::move(path), std::move(get), std::move(options));
}
// A path, resolved against the configuration file's directory.
template <typename Get>
Key Path(std::string path, Get get) {
  typename StringField<Get>::Options options;
  options.is_path = true;
  return StringRow(std::move(path), std::move(get), std::move(options));
}
template <typename Get>
Key Topic(std::string path, Get get) {
  typename StringField<Get>::Options options;
  options.rule = IsTopicName;
  options.rule_text = kTopicRule;
  return StringRow(std::move(path), std::move(get), std::move(options));
}
template <typename Get>
Key OptionalString(std::string path, Get get, bool is_path = false) {
  return Row(std::move(path), std::make_shared<OptionalStringField<Get>>(std::move(get), is_path));
}
template <typename Get, typename E, size_t N>
Key Choice(std::string path, Get get, const Named<E> (&names)[N]) {
  return Row(std::move(path), std::make_shared<ChoiceField<Get, E>>(
                                  std::move(get), std::span<const Named<E>>(names)));
}
template <typename Get>
Key Bool(std::string path, Get get) {
  typename PlainField<Get>::Traits traits;
  traits.read = &Section::Bool;
  traits.kind = "bool";
  traits.allowed = "true | false";
  traits.choices = {"false", "true"};
  return Row(std::move(path), std::make_shared<PlainField<Get>>(std::move(get), std::move(traits)));
}
// librdkafka properties: values may be secret references, and no message
// shows them.
template <typename Get>
Key Properties(std::string path, Get get) {
  typename PlainField<Get>::Traits traits;
  traits.read = &Section::PropertyMap;
  traits.kind = "map";
  traits.allowed =
      "librdkafka properties, name: value or {file: PATH} | {env: NAME} | {credential: NAME}";
  traits.default_text = "{}";
  traits.secret = true;
  return Row(std::move(path), std::make_shared<PlainField<Get>>(std::move(get), std::move(traits)));
}
// federation.holders: id -> public key.
template <typename Get>
Key HolderKeys(std::string path, Get get) {
  typename PlainField<Get>::Traits traits;
  traits.read = &Section::PublicKeyMap;
  traits.kind = "map";
  traits.allowed = "holder id (1-64 of a-z A-Z 0-9 . _ -): X25519 public key (64 hex digits)";
  traits.default_text = "{}";
  return Row(std::move(path), std::make_shared<PlainField<Get>>(std::move(get), std::move(traits)));
}
// A secret read from a file or a systemd credential only; never shown.
template <typename Get>
Key SecretRef(std::string path, Get get) {
  typename PlainField<Get>::Traits traits;
  traits.read = &Section::SecretReference;
  traits.kind = "map";
  traits.allowed = "{file: PATH} | {credential: NAME} (never the value itself)";
  traits.default_text = "";
  traits.secret = true;
  return Row(std::move(path), std::make_shared<PlainField<Get>>(std::move(get), std::move(traits)));
}
template <typename Get>
Key StringList(std::string path, Get get, bool (*rule)(const std::string&), std::string rule_text) {
  return Row(std::move(path),
             std::make_shared<StringListField<Get>>(std::move(get), rule, std::move(rule_text)));
}
template <typename Get>
Key NumberList(std::string path, Get get, bool (*rule)(double), std::string rule_text) {
  return Row(std::move(path),
             std::make_shared<NumberListField<Get>>(std::move(get), rule, std::move(rule_text)));
}

// ---- The table: one function a group of top-level sections -----------------
// Row order is the order the parser reads a section's keys (a key that
// decides which others apply comes first) and the reference's order.

void AddPrivacy(std::vector<Key>& keys) {
  keys.push_back(SectionRow("privacy").Required());
  keys.push_back(Number("privacy.noise_multiplier", VIPSD_MEMBER(driver.mechanism.noise_multiplier),
                        NoiseMultiplier, "a number in [0, 1024] (0 = non-private)")
                     .Required()
                     .OnReload(Reload::kLiveWithinPrivacyMode));
  keys.push_back(Number("privacy.sampling_rate", VIPSD_MEMBER(driver.mechanism.sampling_rate),
                        Fraction,
                        "a number in (0, 1]")
                     .Required()
                     .Live());
  keys.push_back(
      Number("privacy.delta", VIPSD_MEMBER(driver.delta), OpenFraction,
             "a number in (0, 1), at most the delta the state directory is held to (it can "
             "only go down)")
          .RequiredWhenPrivate());
  keys.push_back(Number("privacy.epsilon_ceiling", VIPSD_MEMBER(driver.epsilon_ceiling), Positive,
                        "a number > 0, at most the ceiling the state directory is held to "
                        "(it can only go down)")
                     .RequiredWhenPrivate()
                     .Live());
  keys.push_back(Choice("privacy.noise", VIPSD_MEMBER(noise_mode), kNoiseModes)
                     .OnReload(Reload::kPrivacyMode));
  keys.push_back(
      Integer("privacy.noise_seed", VIPSD_MEMBER(noise_seed), 0, kSeedMax).Check(CheckNoiseSeed));
  keys.push_back(Choice("privacy.accounting", VIPSD_MEMBER(accounting), kAccountings)
                     .OnReload(Reload::kStateDirectory)
                     .Check(CheckResidencyIsPrivate));
  // Absent: the ledger's schedule for an existing state directory, fixed
  // for a new one. Ignored by a non-private run (nothing is charged).
  keys.push_back(Choice("privacy.schedule", VIPSD_MEMBER(schedule), kSchedules)
                     .DerivedDefault()
                     .OnReload(Reload::kStateDirectory));
  // The privacy unit and its cap: kept by the state directory (its ledger
  // records them), like the accounting mode.
  keys.push_back(Choice("privacy.unit", VIPSD_MEMBER(privacy_unit), kPrivacyUnits)
                     .OnReload(Reload::kStateDirectory));
  keys.push_back(
      String("privacy.unit_field", VIPSD_MEMBER(unit_field)).OnReload(Reload::kStateDirectory));
  keys.push_back(Integer("privacy.max_records_per_unit", VIPSD_MEMBER(driver.max_records_per_unit),
                         1, privacy::kMaxRecordsPerUnit)
                     .DerivedDefault()
                     .OnReload(Reload::kStateDirectory));
  // Shared work with a unit: the producers' key partitioner, which decides
  // a unit's home partition (core/privacy/mechanisms/privacy_unit.h).
  keys.push_back(Choice("privacy.unit_partitioner", VIPSD_MEMBER(unit_partitioner),
                        kUnitPartitioners)
                     .DerivedDefault()
                     .OnReload(Reload::kRestart));
  keys.push_back(
      Removed("privacy.residency_steps",
              "no longer a key: a record is a candidate in exactly the steps of its window, so its "
              "residency M is schedule.window_steps (set that instead)"));
  keys.push_back(Choice("privacy.on_ceiling", VIPSD_MEMBER(on_ceiling), kCeilingActions).Live());
  keys.push_back(NumberList("privacy.warn_at", VIPSD_MEMBER(warn_at), OpenFraction,
                            "numbers in (0, 1) (fractions of the ceiling)")
                     .Live()
                     .Check(CheckWarnAtIncreasing));
}

// The E-step and initialisation keys of the models that run an E-step
// loop (LDA, SBN); `model` reaches the model's config in VipsdConfig.
template <typename Get>
void AddEstep(std::vector<Key>& keys, const std::string& section, Get model) {
  keys.push_back(Integer(
      section + ".estep_max_iterations",
      [model](auto& c) -> auto& { return model(c).estep_max_iterations; }, 1, 100000));
  keys.push_back(Number(
      section + ".estep_tolerance", [model](auto& c) -> auto& { return model(c).estep_tolerance; },
      Positive, "a number > 0"));
  keys.push_back(Integer(
      section + ".init_seed", [model](auto& c) -> auto& { return model(c).init_seed; }, 0,
      kSeedMax));
}

// Every model key is kept by the state directory (its checkpoint is of
// that model).
void AddModel(std::vector<Key>& keys) {
  keys.push_back(SectionRow("model").Required().OnReload(Reload::kStateDirectory));
  keys.push_back(String("model.type", VIPSD_MEMBER(model_type), {"lda", "blr", "sbn"}).Required());

  keys.push_back(
      SectionRow("model.lda").Required().Only(Dimension::kModelType, "lda").Check(CheckLda));
  keys.push_back(Integer("model.lda.topics", VIPSD_MEMBER(lda.num_topics), 1, 100000).Required());
  keys.push_back(Path("model.lda.vocabulary", VIPSD_MEMBER(vocabulary_path)).Required());
  keys.push_back(
      Number("model.lda.alpha", VIPSD_MEMBER(lda.alpha), Positive, "a number > 0").Required());
  keys.push_back(
      Number("model.lda.eta", VIPSD_MEMBER(lda.eta), Positive, "a number > 0").Required());
  keys.push_back(
      Integer("model.lda.resample_length", VIPSD_MEMBER(lda.resample_length), 0, 1000000));
  keys.push_back(Number("model.lda.clip_fraction", VIPSD_MEMBER(lda.clip_fraction), Fraction,
                        "a number in (0, 1]"));
  AddEstep(keys, "model.lda", VIPSD_MEMBER(lda));

  keys.push_back(SectionRow("model.public_prior").Only(Dimension::kModelType, "lda|blr|sbn"));
  keys.push_back(Path("model.public_prior.release", VIPSD_MEMBER(public_prior_path)).Required());
  keys.push_back(Number("model.public_prior.weight", VIPSD_MEMBER(lda.public_start_weight),
                        Fraction, "a number in (0, 1] (the public start's share of λ₀)")
                     .Only(Dimension::kModelType, "lda"));

  keys.push_back(SectionRow("model.blr").Required().Only(Dimension::kModelType, "blr"));
  keys.push_back(Integer("model.blr.dimension", VIPSD_MEMBER(blr.dim), 1, 1024).Required());
  keys.push_back(Number("model.blr.prior_shape", VIPSD_MEMBER(blr.prior_shape), Positive,
                        "a number > 0 (a0)"));
  keys.push_back(
      Number("model.blr.prior_rate", VIPSD_MEMBER(blr.prior_rate), Positive, "a number > 0 (b0)"));
  keys.push_back(Number("model.blr.eigenvalue_floor", VIPSD_MEMBER(blr.eigenvalue_floor),
                        UpToAMillion, "a number in (0, 1e6]"));
  keys.push_back(String("model.blr.norm_rule", VIPSD_MEMBER(blr_norm_rule), {"rescale", "reject"})
                     .Check(CheckNormRule));
  keys.push_back(NumberList("model.blr.prior_groups", VIPSD_MEMBER(blr_prior_groups), GroupSize,
                            "integers in [1, 1024] (the sizes of consecutive groups of "
                            "coefficients with their own prior precision, summing to "
                            "model.blr.dimension)")
                     .Check(CheckBlrPriorGroups));

  keys.push_back(
      SectionRow("model.sbn").Required().Only(Dimension::kModelType, "sbn").Check(CheckSbn));
  keys.push_back(Integer("model.sbn.visible", VIPSD_MEMBER(sbn.visible), 1, 65536).Required());
  keys.push_back(Integer("model.sbn.hidden", VIPSD_MEMBER(sbn.hidden), 1, 1024).Required());
  keys.push_back(Number("model.sbn.weight_prior_precision",
                        VIPSD_MEMBER(sbn.weight_prior_precision), Positive, "a number > 0"));
  keys.push_back(Number("model.sbn.visible_bias_prior_precision",
                        VIPSD_MEMBER(sbn.visible_bias_prior_precision), Positive, "a number > 0"));
  keys.push_back(Number("model.sbn.hidden_bias_prior_precision",
                        VIPSD_MEMBER(sbn.hidden_bias_prior_precision), Positive, "a number > 0"));
  keys.push_back(Number("model.sbn.init_weight_std", VIPSD_MEMBER(sbn.init_weight_std), NonNegative,
                        "a number >= 0"));
  keys.push_back(Number("model.sbn.init_variance", VIPSD_MEMBER(sbn.init_variance), UpToAMillion,
                        "a number in (0, 1e6]"));
  AddEstep(keys, "model.sbn", VIPSD_MEMBER(sbn));
  keys.push_back(SectionRow("model.sbn.clip_fractions"));
  const std::string clip = "a number in (0, 1] (fraction of the block's proven bound)";
  const std::string at = "model.sbn.clip_fractions.";
  keys.push_back(Number(at + "count", VIPSD_MEMBER(sbn.clip_fractions.count), Fraction, clip));
  keys.push_back(Number(at + "z", VIPSD_MEMBER(sbn.clip_fractions.z), Fraction, clip));
  keys.push_back(Number(at + "y", VIPSD_MEMBER(sbn.clip_fractions.y), Fraction, clip));
  keys.push_back(Number(at + "xi", VIPSD_MEMBER(sbn.clip_fractions.xi), Fraction, clip));
  keys.push_back(Number(at + "xi_z", VIPSD_MEMBER(sbn.clip_fractions.xi_z), Fraction, clip));
  keys.push_back(Number(at + "y_z", VIPSD_MEMBER(sbn.clip_fractions.y_z), Fraction, clip));
  keys.push_back(Number(at + "xi_zz", VIPSD_MEMBER(sbn.clip_fractions.xi_zz), Fraction, clip));
}

void AddSchedule(std::vector<Key>& keys) {
  keys.push_back(SectionRow("schedule").Required());
  keys.push_back(
      Number("schedule.tau0", VIPSD_MEMBER(driver.tau0), NonNegative, "a number >= 0").Live());
  keys.push_back(
      Number("schedule.kappa", VIPSD_MEMBER(driver.kappa), DecayExponent, "a number in (0.5, 1]")
          .Live());
  keys.push_back(Integer("schedule.threads", VIPSD_MEMBER(driver.threads), 1, 256).Live());
  keys.push_back(Integer("schedule.max_steps", VIPSD_MEMBER(max_steps), 0, kCountMax).Live());
  keys.push_back(Integer("schedule.max_overruns", VIPSD_MEMBER(max_overruns), 0, 1000)
                     .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Choice("schedule.on_overrun", VIPSD_MEMBER(on_overrun), kOverrunActions)
                     .Only(Dimension::kSourceType, "kafka"));
  // Count-based triggers made one record's presence move every later step
  // (add/remove adjacency became substitution); steps now run on a public
  // clock only, in every mode.
  const std::string count_trigger =
      "removed: a step triggered by a record count lets one record shift which records every "
      "later step sees, which breaks the add/remove privacy claim; steps run on the public "
      "clock schedule.interval_seconds, and a step's candidates are the records of its "
      "window (schedule.window_steps)";
  keys.push_back(Removed("schedule.min_new_records", count_trigger));
  keys.push_back(Removed("schedule.min_pool_records", count_trigger));
  // The public clock (Kafka runs; core/svi/slot_windows.h).
  const std::string clock_only =
      "only allowed with source.type: kafka (a file run steps over the whole file, one step "
      "after the other)";
  keys.push_back(Number("schedule.interval_seconds", VIPSD_MEMBER(step_interval_seconds),
                        SlotInterval,
                        "a number of seconds in [0.01, 604800] (slot k is due at start_time + "
                        "k * interval_seconds)")
                     .Required()
                     .Only(Dimension::kSourceType, "kafka", clock_only)
                     .Live());
  keys.push_back(IntegerOrKeyword("schedule.window_steps", VIPSD_MEMBER(window_steps), "all",
                                  svi::kWindowAll, 1, kCountMax)
                     .Only(Dimension::kSourceType, "kafka", clock_only)
                     .Live());
  keys.push_back(Number("schedule.release_delay_seconds", VIPSD_MEMBER(release_delay_seconds),
                        WithinTenIntervals,
                        "a number of seconds in [0, 10 * interval_seconds] (a step's release "
                        "leaves at its slot time plus this; default interval_seconds)")
                     .Only(Dimension::kSourceType, "kafka", clock_only)
                     .DerivedDefault(DefaultReleaseDelay)
                     .Live());
  keys.push_back(Number("schedule.start_delay_seconds", VIPSD_MEMBER(start_delay_seconds),
                        StartDelay,
                        "a number of seconds in [0, 3600] (the first slot a run steps is the "
                        "first due at least this long after the daemon starts: room for the "
                        "consumer group join and the initial read; default 10)")
                     .Only(Dimension::kSourceType, "kafka", clock_only)
                     .Live());
  keys.push_back(Number("schedule.cut_grace_seconds", VIPSD_MEMBER(cut_grace_seconds), CutGrace,
                        "a number of seconds in [0, 60], below interval_seconds (or 0) and at "
                        "most release_delay_seconds (slot k's cut, by record timestamps, is read "
                        "this long after its slot time: room for records appended before it to "
                        "become readable; default min(1, interval_seconds / 4, "
                        "release_delay_seconds / 4))")
                     .Only(Dimension::kSourceType, "kafka", clock_only)
                     .DerivedDefault(DefaultCutGrace)
                     .Live());
  keys.push_back(Number("schedule.start_time", VIPSD_MEMBER(start_time), UnixTime,
                        "unix seconds in [1e9, 1e11] (the time of slot 0 of a new state "
                        "directory; default: when it is created)")
                     .Only(Dimension::kSourceType, "kafka", clock_only)
                     .DerivedDefault());
  keys.push_back(Number("schedule.max_epochs", VIPSD_MEMBER(max_epochs), NonNegative,
                        "a number >= 0 (0 = no limit)")
                     .Only(Dimension::kSourceType, "file")
                     .Live()
                     .Check(CheckOfflineStop));
}

void AddSourceAndSink(std::vector<Key>& keys) {
  keys.push_back(SectionRow("source").Required());
  keys.push_back(Choice("source.type", VIPSD_MEMBER(source_type), kSourceTypes).Required());
  // Required, except for a federated aggregator, which reads no input
  // (CheckWholeFile).
  keys.push_back(StringList("source.topics", VIPSD_MEMBER(source_topics), IsTopicName, kTopicRule)
                     .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(
      String("source.group_id", VIPSD_MEMBER(group_id)).Only(Dimension::kSourceType, "kafka"));
  keys.push_back(
      String("source.start_position", VIPSD_MEMBER(start_position), {"earliest", "latest"})
          .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(String("source.timestamps", VIPSD_MEMBER(source_timestamps),
                        {"log_append_time", "create_time"})
                     .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(
      Integer("source.max_record_bytes", VIPSD_MEMBER(max_record_bytes), 1, int64_t{1} << 30)
          .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Path("source.path", VIPSD_MEMBER(source_path))
                     .Required()
                     .Only(Dimension::kSourceType, "file"));

  keys.push_back(SectionRow("sink").Required());
  keys.push_back(Choice("sink.type", VIPSD_MEMBER(sink_type), kSinkTypes)
                     .Required()
                     .DerivedDefault(SinkTypeOfSource)
                     .ValueNeeds("kafka", Dimension::kSourceType, "kafka",
                                 "kafka sinks need source.type: kafka (the offline file run "
                                 "writes releases to a directory)"));
  keys.push_back(Topic("sink.topic", VIPSD_MEMBER(release_topic))
                     .Required()
                     .Only(Dimension::kSinkType, "kafka"));
  keys.push_back(Number("sink.publish_timeout_seconds", VIPSD_MEMBER(publish_timeout_seconds),
                        PublishTimeout, "a number of seconds in [1, 3600]")
                     .Only(Dimension::kSinkType, "kafka"));
  keys.push_back(OptionalString("sink.mirror_directory", VIPSD_MEMBER(sink_mirror_directory),
                                /*is_path=*/true)
                     .Only(Dimension::kSinkType, "kafka"));
  keys.push_back(Integer("sink.publish_every", VIPSD_MEMBER(publish_every), 1, kCountMax).Live());
  keys.push_back(Path("sink.directory", VIPSD_MEMBER(sink_directory))
                     .Required()
                     .Only(Dimension::kSinkType, "file"));

  keys.push_back(SectionRow("dead_letter").Required());
  keys.push_back(Topic("dead_letter.topic", VIPSD_MEMBER(dead_letter_topic))
                     .Required()
                     .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Path("dead_letter.path", VIPSD_MEMBER(dead_letter_path))
                     .Required()
                     .Only(Dimension::kSourceType, "file"));
}

// The sections of Kafka runs only.
void AddKafka(std::vector<Key>& keys) {
  keys.push_back(SectionRow("pool").Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Integer("pool.capacity", VIPSD_MEMBER(pool_capacity), 1, int64_t{1} << 32).Live());
  keys.push_back(
      Removed("pool.eviction",
              "removed: both policies let a count of other records decide a record's membership "
              "(oldest: a new record evicts an old one, so add/remove becomes substitution; "
              "refuse_new: a full pool leaves new records out of the steps they belong to); "
              "records leave the pool only when their window ends, and a window larger than "
              "pool.capacity stops stepping with an alert"));
  keys.push_back(
      Removed("pool.rebuild_lookback",
              "removed: capping a restart's re-read by a record count would drop records from "
              "windows depending on how many others arrived; a restart re-reads each window "
              "from its start"));

  keys.push_back(SectionRow("kafka").Required().Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Bool("kafka.embedded", VIPSD_MEMBER(kafka.embedded)));
  keys.push_back(String("kafka.bootstrap_servers", VIPSD_MEMBER(kafka.bootstrap_servers))
                     .Required()
                     .Only(Dimension::kKafkaEmbedded, "false",
                           "not allowed with embedded: true (the embedded cluster has random "
                           "ports; the daemon prints them)"));
  keys.push_back(String("kafka.client_id", VIPSD_MEMBER(kafka.client_id)));
  keys.push_back(Properties("kafka.properties", VIPSD_MEMBER(kafka.properties)));
  keys.push_back(Properties("kafka.consumer_properties", VIPSD_MEMBER(kafka.consumer_properties)));
  keys.push_back(Properties("kafka.producer_properties", VIPSD_MEMBER(kafka.producer_properties)));
  keys.push_back(Path("kafka.demo_corpus", VIPSD_MEMBER(kafka.demo_corpus))
                     .Only(Dimension::kKafkaEmbedded, "true", "only allowed with embedded: true"));
  keys.push_back(Integer("kafka.partitions", VIPSD_MEMBER(kafka.partitions), 1, 256)
                     .Only(Dimension::kKafkaEmbedded, "true", "only allowed with embedded: true"));

  keys.push_back(SectionRow("alerts").Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Topic("alerts.topic", VIPSD_MEMBER(alert_topic)).Required());
}

void AddFederation(std::vector<Key>& keys) {
  keys.push_back(SectionRow("federation").Only(Dimension::kSourceType, "kafka"));
  keys.push_back(Choice("federation.role", VIPSD_MEMBER(federation.role), kFederationRoles));
  keys.push_back(String("federation.holder_id", VIPSD_MEMBER(federation.holder_id)));
  keys.push_back(SecretRef("federation.secret_key", VIPSD_MEMBER(federation.secret_key)));
  keys.push_back(Integer("federation.tolerated_holders", VIPSD_MEMBER(federation.tolerated_holders),
                         0, 63));
  keys.push_back(Number("federation.round_timeout_seconds",
                        VIPSD_MEMBER(federation.round_timeout_seconds), RoundTimeout,
                        "a number of seconds in [1, 3600]"));
  keys.push_back(Number("federation.share_delay_seconds",
                        VIPSD_MEMBER(federation.share_delay_seconds), ShareDelay,
                        "a number of seconds in [0.05, 3600]"));
  keys.push_back(HolderKeys("federation.holders", VIPSD_MEMBER(federation.holders)));
}

void AddStateMetricsLog(std::vector<Key>& keys) {
  keys.push_back(SectionRow("state").Required());
  keys.push_back(Path("state.directory", VIPSD_MEMBER(state_directory)).Required());
  keys.push_back(
      Integer("state.checkpoint_every", VIPSD_MEMBER(checkpoint_every), 1, kCountMax).Live());
  keys.push_back(Topic("state.ledger_topic", VIPSD_MEMBER(ledger_topic))
                     .Only(Dimension::kSourceType, "kafka"));
  keys.push_back(String("state.ledger_key", VIPSD_MEMBER(ledger_key))
                     .Only(Dimension::kSourceType, "kafka")
                     .Check(CheckLedgerKey));
  keys.push_back(Number("state.standby_takeover_seconds", VIPSD_MEMBER(standby_takeover_seconds),
                        UpToADay,
                        "a number of seconds in [0, 86400] (0: take the job at start; otherwise "
                        "stand by until the job's ledger topic has been silent this long)")
                     .Only(Dimension::kSourceType, "kafka")
                     .Check(CheckStandby));
  keys.push_back(String("state.work_topic", VIPSD_MEMBER(work_topic))
                     .Only(Dimension::kSourceType, "kafka")
                     .Check(CheckWorkTopic));
  keys.push_back(Bool("state.work_partitions", VIPSD_MEMBER(work_partitions))
                     .Only(Dimension::kSourceType, "kafka")
                     .Check(CheckWorkPartitions));

  keys.push_back(SectionRow("metrics"));
  keys.push_back(OptionalString("metrics.listen", VIPSD_MEMBER(metrics_listen)));
  keys.push_back(Bool("metrics.expose_step_timing", VIPSD_MEMBER(expose_step_timing))
                     .DerivedDefault(DefaultStepTiming));

  keys.push_back(SectionRow("log"));
  keys.push_back(Choice("log.level", VIPSD_MEMBER(log_level), kLogLevels).Live());
  keys.push_back(Choice("log.format", VIPSD_MEMBER(log_format), kLogFormats).Live());
}

#undef VIPSD_MEMBER

std::vector<Key> BuildTable() {
  std::vector<Key> keys;
  AddPrivacy(keys);  // first: the model's checks depend on σ > 0
  AddModel(keys);
  AddSchedule(keys);
  // Before source (so that a reload names the role first) and state
  // (state.work_topic's check reads the role); source.type is read first.
  AddFederation(keys);
  AddSourceAndSink(keys);
  AddKafka(keys);
  AddStateMetricsLog(keys);
  return keys;
}

}  // namespace

// ---- Table queries ----------------------------------------------------------

bool IsLive(Reload reload) {
  return reload == Reload::kLive || reload == Reload::kLiveWithinPrivacyMode;
}

std::string_view Key::leaf() const {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string_view(path) : std::string_view(path).substr(dot + 1);
}

std::string_view Key::parent() const {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string_view() : std::string_view(path).substr(0, dot);
}

bool Key::required(const VipsdConfig& config) const {
  return need == Need::kRequired || (need == Need::kRequiredWhenPrivate && config.is_private());
}

const std::vector<Key>& Keys() {
  static const std::vector<Key> keys = BuildTable();
  return keys;
}

const Key* FindKey(std::string_view path) {
  for (const Key& key : Keys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

Reload ReloadOf(const Key& key) {
  for (const Key* at = &key; at != nullptr; at = FindKey(at->parent())) {
    if (at->reload.has_value()) return *at->reload;
    if (at->parent().empty()) break;
  }
  return Reload::kRestart;
}

std::string_view DimensionKey(Dimension dimension) {
  switch (dimension) {
    case Dimension::kModelType:
      return "model.type";
    case Dimension::kSourceType:
      return "source.type";
    case Dimension::kSinkType:
      return "sink.type";
    case Dimension::kKafkaEmbedded:
      return "kafka.embedded";
  }
  return "";
}

Choices ChoicesOf(const VipsdConfig& config) {
  Choices choices;
  for (size_t i = 0; i < kDimensions.size(); ++i) {
    const Key* key = FindKey(DimensionKey(kDimensions[i]));
    assert(key != nullptr && key->field != nullptr);
    choices[i] = key->field->Show(config);
  }
  return choices;
}

bool When::Holds(const Choices& choices) const {
  // `value` may list alternatives: "lda|blr".
  const std::string& choice = choices[static_cast<size_t>(dimension)];
  for (size_t start = 0;;) {
    const size_t bar = value.find('|', start);
    const size_t end = bar == std::string::npos ? value.size() : bar;
    if (value.compare(start, end - start, choice) == 0) return true;
    if (bar == std::string::npos) return false;
    start = bar + 1;
  }
}

std::string When::Refusal() const {
  if (!refusal.empty()) return refusal;
  std::string alternatives = value;
  for (size_t bar; (bar = alternatives.find('|')) != std::string::npos;) {
    alternatives.replace(bar, 1, " or ");
  }
  return "only allowed with " + std::string(DimensionKey(dimension)) + ": " + alternatives;
}

bool AppliesWith(const Key& key, const Choices& choices) {
  for (const Key* at = &key; at != nullptr; at = FindKey(at->parent())) {
    if (at->when.has_value() && !at->when->Holds(choices)) return false;
    if (at->parent().empty()) break;
  }
  return true;
}

}  // namespace internal

std::string DescribeProtection(std::string_view unit, const std::string& field, int64_t cap) {
  if (unit == "record") return "one record";
  return "every record of one unit (" +
         (unit == "key" ? std::string("one Kafka message key") : "one value of field " + field) +
         "), up to " + std::to_string(cap) + " of them per step";
}

std::string_view PrivacyUnitName(PrivacyUnit unit) {
  for (const auto& named : internal::kPrivacyUnits) {
    if (named.value == unit) return named.name;
  }
  return "record";
}

std::vector<std::pair<std::string, std::string>> AppliedKeyValues(const VipsdConfig& config) {
  const internal::Choices choices = internal::ChoicesOf(config);
  std::vector<std::pair<std::string, std::string>> out;
  for (const internal::Key& key : internal::Keys()) {
    if (key.is_section || key.field == nullptr || key.field->secret()) continue;
    if (internal::AppliesWith(key, choices)) out.emplace_back(key.path, key.field->Show(config));
  }
  return out;
}

}  // namespace vipsd::config
