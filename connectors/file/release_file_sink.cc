#include "connectors/file/release_file_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace vipsd::connectors {
namespace {

Status ErrnoError(const std::string& what, const std::string& path) {
  return UnavailableError(what + " " + path + ": " + std::strerror(errno));
}

Status WriteFileSynced(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const Status status = ErrnoError("cannot write", path);
      ::close(fd);
      return status;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const Status status = ErrnoError("cannot fsync", path);
    ::close(fd);
    return status;
  }
  if (::close(fd) != 0) return ErrnoError("cannot close", path);
  return Status::Ok();
}

Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", path);
  const int result = ::fsync(fd);
  ::close(fd);
  return result == 0 ? Status::Ok() : ErrnoError("cannot fsync directory", path);
}

}  // namespace

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
    VIPSD_RETURN_IF_ERROR(WriteFileSynced(temp_dir + "/" + array.name + ".npy", npy_files.back()));
  }
  VIPSD_RETURN_IF_ERROR(
      WriteFileSynced(temp_dir + "/manifest.json", release::ManifestJson(release, npy_files)));
  VIPSD_RETURN_IF_ERROR(SyncDirectory(temp_dir));
  if (::rename(temp_dir.c_str(), final_dir.c_str()) != 0) {
    return ErrnoError("cannot rename onto", final_dir);
  }
  return SyncDirectory(directory_);
}

}  // namespace vipsd::connectors
