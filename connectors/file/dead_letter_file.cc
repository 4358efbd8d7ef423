#include "connectors/file/dead_letter_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      quoted_source_name_(std::move(other.quoted_source_name_)),
      counts_by_reason_(std::move(other.counts_by_reason_)),
      total_(std::exchange(other.total_, 0)) {}

DeadLetterFile& DeadLetterFile::operator=(DeadLetterFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
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

StatusOr<DeadLetterFile> DeadLetterFile::Open(const std::string& path, std::string source_name) {
  // The source name is operator configuration; escape it as a JSON string,
  // replacing invalid UTF-8 rather than failing.
  const std::string quoted = nlohmann::json(std::move(source_name))
                                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot open", path);
  return DeadLetterFile(path, fd, quoted);
}

Status DeadLetterFile::Append(const Rejection& rejection) {
  if (fd_ < 0) return FailedPreconditionError("dead-letter file was moved from");
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
  if (fd_ < 0) return FailedPreconditionError("dead-letter file was moved from");
  if (::fdatasync(fd_) != 0) return ErrnoError("cannot sync", path_);
  return Status::Ok();
}

}  // namespace vipsd::connectors
