#include "connectors/file/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

std::string NonRegularFileKind(unsigned mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device (such as /dev/zero or a terminal)";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

StatusOr<UniqueFile> OpenRegularFile(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer (or a tty) returns at once
  // instead of waiting; the kind check below then refuses it. O_NOCTTY: a
  // terminal never becomes the controlling one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    std::string message = "cannot open " + path + ": " + std::strerror(error);
    if (error == ENOENT) return NotFoundError(path + " does not exist");
    if (error == ENXIO) return InvalidArgumentError(path + " is not a regular file");
    return UnavailableError(std::move(message));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const Status status = ErrnoError("cannot stat", path);
    ::close(fd);
    return status;
  }
  if (const std::string kind = NonRegularFileKind(info.st_mode); !kind.empty()) {
    ::close(fd);
    return InvalidArgumentError(path + " is " + kind + ", not a regular file");
  }
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    ::close(fd);
    return InvalidArgumentError(path + " is " + std::to_string(info.st_size) +
                                " bytes, more than the " + std::to_string(max_bytes) +
                                " this file may have");
  }
  // Regular files ignore O_NONBLOCK; clear it all the same so that reads
  // behave as documented everywhere.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::FILE* file = ::fdopen(fd, "rb");
  if (file == nullptr) {
    const Status status = ErrnoError("cannot open", path);
    ::close(fd);
    return status;
  }
  return UniqueFile(file);
}

StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  VIPSD_ASSIGN_OR_RETURN(UniqueFile file, OpenRegularFile(path, max_bytes));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const size_t read = std::fread(buffer, 1, sizeof buffer, file.get());
    if (read > 0) {
      if (text.size() + read > max_bytes) {
        return InvalidArgumentError(path + " grew beyond " + std::to_string(max_bytes) +
                                    " bytes while it was read");
      }
      text.append(buffer, read);
    }
    if (read < sizeof buffer) break;
  }
  if (std::ferror(file.get())) return UnavailableError("cannot read " + path);
  return text;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  return ReadRegularFile(path, kMaxStateFileBytes);
}

}  // namespace vipsd::connectors
