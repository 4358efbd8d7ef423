#include "connectors/file/dead_letter_file.h"

#include "connectors/file/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

namespace vipsd::connectors {
namespace {

Status ErrnoError(const char* what, const std::string& path) {
  return UnavailableError(std::string(what) + " dead-letter file " + path + ": " +
                          std::strerror(errno));
}

}  // namespace

DeadLetterFile::DeadLetterFile(std::string path, int fd, std::string quoted_source_name)
    : path_(std::move(path)), fd_(fd), quoted_source_name_(std::move(quoted_source_name)) {}

DeadLetterFile::DeadLetterFile(DeadLetterFile&& other) noexcept
    : path_(std::exchange(other.path_, std::string())),
      fd_(std::exchange(other.fd_, -1)),
      quoted_source_name_(std::move(other.quoted_source_name_)),
      counts_by_reason_(std::move(other.counts_by_reason_)),
      total_(std::exchange(other.total_, 0)) {}

DeadLetterFile& DeadLetterFile::operator=(DeadLetterFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::exchange(other.path_, std::string());
    fd_ = std::exchange(other.fd_, -1);
    quoted_source_name_ = std::move(other.quoted_source_name_);
    counts_by_reason_ = std::move(other.counts_by_reason_);
    total_ = std::exchange(other.total_, 0);
  }
  return *this;
}

DeadLetterFile::~DeadLetterFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// Opens the dead-letter file for appending: never blocks (a FIFO without a
// reader is ENXIO, not a hang) and refuses anything but a regular file (a
// device such as /dev/null would lose the dead letters). `create`: create
// it (0600) when absent.
StatusOr<int> OpenForAppend(const std::string& path, bool create) {
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC |
                            (create ? O_CREAT : 0),
                        0600);
  if (fd < 0) {
    if (errno == ENXIO) {
      return InvalidArgumentError("dead-letter file " + path + " is a FIFO, not a regular file");
    }
    return ErrnoError("cannot open", path);
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const Status status = ErrnoError("cannot stat", path);
    ::close(fd);
    return status;
  }
  if (const std::string kind = NonRegularFileKind(info.st_mode); !kind.empty()) {
    ::close(fd);
    return InvalidArgumentError("dead-letter file " + path + " is " + kind +
                                ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

StatusOr<DeadLetterFile> DeadLetterFile::Open(const std::string& path, std::string source_name) {
  // The source name is operator configuration; escape it as a JSON string,
  // replacing invalid UTF-8 rather than failing.
  const std::string quoted = nlohmann::json(std::move(source_name))
                                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // An existing file is opened (and checked) now; a missing one is created
  // by the first Append, so that a run refused at start-up creates nothing.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 && errno == ENOENT) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    if (::access(parent.empty() ? "." : parent.c_str(), W_OK | X_OK) != 0) {
      return ErrnoError("cannot create", path);
    }
    return DeadLetterFile(path, -1, quoted);
  }
  VIPSD_ASSIGN_OR_RETURN(const int fd, OpenForAppend(path, /*create=*/false));
  return DeadLetterFile(path, fd, quoted);
}

Status DeadLetterFile::Append(const Rejection& rejection) {
  if (path_.empty()) return FailedPreconditionError("dead-letter file was moved from");
  if (fd_ < 0) {
    VIPSD_ASSIGN_OR_RETURN(fd_, OpenForAppend(path_, /*create=*/true));
  }
  std::string line = "{\"line\": " + std::to_string(rejection.line_number) + ", \"reason\": \"";
  line += RejectReasonName(rejection.reason_code);
  line += "\", \"source\": ";
  line += quoted_source_name_;
  line += "}\n";
  // O_APPEND writes of a regular file are whole; a short write only happens
  // on a full disk, which is an error.
  while (true) {
    const ssize_t written = ::write(fd_, line.data(), line.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return ErrnoError("cannot append to", path_);
    if (static_cast<size_t>(written) != line.size()) {
      return UnavailableError("short write to dead-letter file " + path_ +
                              " (disk full?); the last line is partial");
    }
    break;
  }
  ++counts_by_reason_[rejection.reason_code];
  ++total_;
  return Status::Ok();
}

Status DeadLetterFile::Sync() {
  if (path_.empty()) return FailedPreconditionError("dead-letter file was moved from");
  if (fd_ < 0) return Status::Ok();  // nothing appended yet
  if (::fdatasync(fd_) != 0) return ErrnoError("cannot sync", path_);
  return Status::Ok();
}

}  // namespace vipsd::connectors
