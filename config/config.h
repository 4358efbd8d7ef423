// vipsd's YAML configuration: schema, validation, defaults.
//
// Every key is checked: unknown keys, duplicate keys, wrong types and
// out-of-range values are rejected with a message that names the file, the
// line, the key path and the allowed values, e.g.
//   vipsd.yaml:14: privacy.sampling_rate: must be a number in (0, 1], got '1.5'
// (yaml-cpp alone reports neither missing keys by name nor duplicates; the
// walker here does). Relative paths are resolved against the directory of
// the configuration file. config/examples/ holds commented examples; the
// reference of every key is in README "Configuration".
//
// Thread-safety: parsing is pure; a VipsdConfig is a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/status.h"
#include "core/models/lda.h"
#include "core/svi/step_driver.h"

namespace vipsd::config {

enum class NoiseMode { kSecure, kFixedSeed };

struct VipsdConfig {
  std::string file;  // where it was read from (for messages)

  // model
  std::string model_type = "lda";
  models::LdaConfig lda;       // vocabulary_size is filled from the file
  std::string vocabulary_path;

  // privacy + schedule → the step driver
  svi::DriverConfig driver;
  NoiseMode noise_mode = NoiseMode::kSecure;
  uint64_t noise_seed = 0;
  int64_t max_steps = 0;   // 0 = no limit
  double max_epochs = 0;   // 0 = no limit; one epoch = 1/q steps

  // I/O
  std::string source_path;           // JSON Lines
  std::string sink_directory;        // releases
  int64_t publish_every = 1;         // publish every k-th step
  std::string state_directory;       // ledger
  std::string dead_letter_path;      // rejected-record reasons (no content)

  bool is_private() const { return driver.noise_multiplier > 0; }
};

// Parses and validates `yaml_text`; `file` is used in messages and to
// resolve relative paths.
StatusOr<VipsdConfig> ParseConfig(std::string_view yaml_text, const std::string& file);

// Reads the file and parses it.
StatusOr<VipsdConfig> LoadConfigFile(const std::string& path);

}  // namespace vipsd::config
