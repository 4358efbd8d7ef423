// Building the configured model and describing its releases: shared by the
// offline run and the streaming daemon so that both publish the same release
// for the same state.
//
// BuildModel reads the PUBLIC vocabulary (LDA) and creates the model named by
// model.type, its record decoder and two fingerprints:
//   vocabulary_fingerprint — BLAKE2b-256 of the canonical vocabulary ("" for
//                            models without one);
//   model_fingerprint      — BLAKE2b-256 of the model type, its public
//                            dimensions and the vocabulary fingerprint: a
//                            checkpoint is only restored into a model with
//                            the same fingerprint.
// and the record settings: every setting that decides a record's statistic
// or whether it is dead-lettered, one "key: value" line each (shared work
// compares them before a worker joins the consumer group).
// MakeRelease fills the release metadata from public values only: the
// configuration, t, ρ_t, (ε, δ) spent, fingerprints, a timestamp — never a
// batch size, a clip count or a loss (core/release/release.h).
//
// Thread-safety: plain functions; the bundle is owned by the step thread
// (its decoder may be used concurrently by the ingest thread: Decode is
// const and the vocabulary immutable).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "connectors/decode/record_decoder.h"
#include "core/base/status.h"
#include "core/model/model.h"
#include "core/privacy/accounting/sampled_gaussian.h"
#include "core/release/release.h"
#include "core/text/vocabulary.h"

namespace vipsd::daemon {

struct ModelBundle {
  std::unique_ptr<text::Vocabulary> vocabulary;  // LDA only; outlives the decoder
  std::unique_ptr<model::Model> model;
  std::unique_ptr<connectors::RecordDecoder> decoder;
  std::string vocabulary_fingerprint;
  // model.public_prior: BLAKE2b-256 of the public release's manifest (which
  // pins its arrays) and its absolute path; "" if none.
  std::string public_prior_fingerprint;
  std::string public_prior_source;
  // type, dimensions, vocabulary and public prior
  std::string model_fingerprint;
  std::string record_settings;  // RecordSettings(config, vocabulary, public prior)
};

// The settings that decide a record's statistic or whether it is
// dead-lettered, as "key: value" lines in the key table's order: every
// model.* key that applies to the configured model.type (the vocabulary and
// the public prior by their fingerprints, since two processes may keep one
// file at two paths),
// source.max_record_bytes, and the privacy unit's keys (privacy.unit*,
// privacy.max_records_per_unit: which records form one contribution, and
// in which partition). Public values only.
std::string RecordSettings(const config::VipsdConfig& config,
                           const std::string& vocabulary_fingerprint,
                           const std::string& public_prior_fingerprint = "");

// "key: THEIR_NAME X, OUR_NAME Y" for every key whose value differs between
// two such texts (or that one of them lacks), "; "-separated, in key order;
// "in their order" when only the order of the lines differs.
std::string SettingsDifference(const std::string& theirs, const std::string& ours,
                               const std::string& their_name, const std::string& our_name);

StatusOr<ModelBundle> BuildModel(const config::VipsdConfig& config);

// BLAKE2b-256 of the public configuration values that shape a release.
std::string ConfigFingerprint(const config::VipsdConfig& config);

struct ReleaseFacts {
  int64_t step = 0;
  double rho = 0;
  double epsilon_spent = 0;     // per the active accounting mode
  // How epsilon_spent was computed (release metadata `accountant`):
  // fixed_pld | fixed_rdp (fixed schedule, the smaller bound), rdp_filter
  // (adaptive), residency_fixed | residency_rdp_filter (per-record window).
  std::string accountant;
  std::string schedule;    // fixed | adaptive
  // pld_pessimistic | rdp_improved | pld_or_rdp_improved (residency, fixed:
  // each window's ε is the smaller of the two bounds).
  std::string conversion;
  bool noise_is_private = false;  // the noise source's own claim
  std::string noise_description;
  privacy::SampledGaussian mechanism;  // (q, σ) of the step (a reload may change them)
  // Unix seconds stamped as created_at_utc: the release's public deadline
  // (never the moment its step finished); 0 = now.
  double created_at = 0;
};

release::Release MakeRelease(const ModelBundle& bundle, const config::VipsdConfig& config,
                             const ReleaseFacts& facts);

// "2026-11-23T05:22:30Z".
std::string UtcNow();
std::string UtcTime(double unix_seconds);

}  // namespace vipsd::daemon
