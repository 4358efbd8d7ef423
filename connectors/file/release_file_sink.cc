#include "connectors/file/release_file_sink.h"

#include "connectors/file/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace vipsd::connectors {

StatusOr<ReleaseFileSink> ReleaseFileSink::Open(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return UnavailableError("cannot create release directory " + directory + ": " +
                            error.message());
  }
  return ReleaseFileSink(directory);
}

Status ReleaseFileSink::Write(const release::Release& release) {
  VIPSD_RETURN_IF_ERROR(release::Validate(release));
  const std::string& id = release.metadata.release_id;
  const std::string final_dir = directory_ + "/" + id;
  const std::string temp_dir = directory_ + "/." + id + ".tmp";
  std::error_code error;
  if (std::filesystem::exists(final_dir, error)) {
    return FailedPreconditionError("release " + id + " already exists in " + directory_);
  }
  std::filesystem::remove_all(temp_dir, error);  // a leftover from a crash
  if (!std::filesystem::create_directory(temp_dir, error)) {
    return UnavailableError("cannot create " + temp_dir + ": " + error.message());
  }
  std::vector<std::string> npy_files;
  for (const auto& array : release.arrays) {
    npy_files.push_back(release::EncodeNpy(array));
    VIPSD_RETURN_IF_ERROR(WriteFileDurably(temp_dir + "/" + array.name + ".npy", npy_files.back(), true));
  }
  VIPSD_RETURN_IF_ERROR(
      WriteFileDurably(temp_dir + "/manifest.json", release::ManifestJson(release, npy_files),
                       true));
  VIPSD_RETURN_IF_ERROR(SyncDirectory(temp_dir));
  if (::rename(temp_dir.c_str(), final_dir.c_str()) != 0) {
    return UnavailableError("cannot rename onto " + final_dir + ": " + std::strerror(errno));
  }
  return SyncDirectory(directory_);
}

}  // namespace vipsd::connectors
