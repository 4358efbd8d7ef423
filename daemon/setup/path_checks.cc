#include "daemon/setup/path_checks.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>


namespace vipsd::daemon {
namespace {

namespace fs = std::filesystem;

struct FileId {
  dev_t device = 0;
  ino_t inode = 0;
  bool operator==(const FileId&) const = default;
};

// The file `path` names, following symlinks; nullopt if it does not exist.
std::optional<FileId> IdOf(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return std::nullopt;
  return FileId{info.st_dev, info.st_ino};
}

// Absolute, `..`-free and with every existing symlink resolved.
fs::path Real(const std::string& path) {
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  if (error) absolute = fs::path(path);
  fs::path real = fs::weakly_canonical(absolute, error);
  if (error) real = absolute.lexically_normal();
  if (!real.has_filename() && real.has_parent_path() && real != real.root_path()) {
    real = real.parent_path();  // "dir/" → "dir"
  }
  return real;
}

struct Place {
  std::string key;  // configuration key ("" for the configuration file itself)
  std::string path;
};

std::string Name(const config::VipsdConfig& config, const Place& place) {
  if (place.key.empty()) return "the configuration file " + place.path;
  return place.key + " (" + config.file + ":" + std::to_string(config.line_of(place.key)) +
         ") " + place.path;
}

std::string Where(const config::VipsdConfig& config, const Place& place) {
  return config::KeyWhere(config, place.key);
}

// `inner` is `directory` or lies below it (or_equal), or strictly below it.
bool Inside(const std::string& inner, const std::string& directory, bool or_equal) {
  const fs::path real_inner = Real(inner);
  const fs::path real_directory = Real(directory);
  // By identity: an existing parent of `inner` IS the directory (a second
  // name, a bind mount).
  if (const auto directory_id = IdOf(real_directory)) {
    fs::path at = or_equal ? real_inner : real_inner.parent_path();
    for (;;) {
      if (const auto id = IdOf(at); id && *id == *directory_id) return true;
      if (at == at.parent_path() || at.empty()) break;
      at = at.parent_path();
    }
  }
  // By path, for what does not exist yet.
  const auto [d, i] = std::mismatch(real_directory.begin(), real_directory.end(),
                                    real_inner.begin(), real_inner.end());
  if (d != real_directory.end()) return false;
  return i != real_inner.end() || or_equal;
}

}  // namespace

Status CheckInputsAndOutputsApart(const config::VipsdConfig& config) {
  std::vector<Place> inputs;
  if (!config.file.empty()) inputs.push_back({"", config.file});
  if (config.model_type == "lda" && !config.vocabulary_path.empty()) {
    inputs.push_back({"model.lda.vocabulary", config.vocabulary_path});
  }
  if (config.source_type == config::SourceType::kFile) {
    inputs.push_back({"source.path", config.source_path});
  }
  if (!config.kafka.demo_corpus.empty()) {
    inputs.push_back({"kafka.demo_corpus", config.kafka.demo_corpus});
  }
  std::vector<Place> output_files;
  if (config.source_type == config::SourceType::kFile && !config.dead_letter_path.empty()) {
    output_files.push_back({"dead_letter.path", config.dead_letter_path});
  }
  std::vector<Place> output_directories{{"state.directory", config.state_directory}};
  if (config.sink_type == config::SinkType::kFile && !config.sink_directory.empty()) {
    output_directories.push_back({"sink.directory", config.sink_directory});
  }
  if (!config.sink_mirror_directory.empty()) {
    output_directories.push_back({"sink.mirror_directory", config.sink_mirror_directory});
  }

  for (const Place& output : output_files) {
    const auto output_id = IdOf(output.path);
    for (const Place& input : inputs) {
      const auto input_id = IdOf(input.path);
      if (output_id && input_id && *output_id == *input_id) {
        return InvalidArgumentError(
            Where(config, output) + output.path + " is the same file as " + Name(config, input) +
            " (device " + std::to_string(output_id->device) + ", inode " +
            std::to_string(output_id->inode) +
            ", reached through a link or another name); vipsd would write into its own input. "
            "Give it a file of its own");
      }
    }
  }
  for (const Place& directory : output_directories) {
    for (const Place& input : inputs) {
      if (Inside(input.path, directory.path, /*or_equal=*/false)) {
        return InvalidArgumentError(
            Where(config, directory) + directory.path + " holds " + Name(config, input) +
            "; vipsd creates, replaces and removes files in its output directories, so an "
            "input must live elsewhere");
      }
    }
    for (const Place& output : output_files) {
      if (Inside(output.path, directory.path, /*or_equal=*/false)) {
        return InvalidArgumentError(
            Where(config, output) + output.path + " lies inside " + Name(config, directory) +
            "; keep dead letters out of vipsd's state and release directories");
      }
    }
  }
  for (size_t a = 0; a < output_directories.size(); ++a) {
    for (size_t b = a + 1; b < output_directories.size(); ++b) {
      const Place& first = output_directories[a];
      const Place& second = output_directories[b];
      if (Inside(first.path, second.path, /*or_equal=*/true) ||
          Inside(second.path, first.path, /*or_equal=*/true)) {
        return InvalidArgumentError(Where(config, second) + second.path +
                                    " is, contains or lies inside " + Name(config, first) +
                                    "; each output directory must be a directory of its own");
      }
    }
  }
  return Status::Ok();
}

}  // namespace vipsd::daemon
