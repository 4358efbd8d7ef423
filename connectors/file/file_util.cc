#include "connectors/file/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace vipsd::connectors {
namespace {

Status ErrnoError(const std::string& what, const std::string& path) {
  return UnavailableError(what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

Status WriteFileDurably(const std::string& path, const std::string& data, bool exclusive,
                        unsigned mode) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, static_cast<mode_t>(mode));
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

Status SyncDirectory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", directory);
  const int result = ::fsync(fd);
  ::close(fd);
  return result == 0 ? Status::Ok() : ErrnoError("cannot fsync directory", directory);
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return UnavailableError("cannot read " + path);
  return text.str();
}

}  // namespace vipsd::connectors
