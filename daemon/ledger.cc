#include "daemon/ledger.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace vipsd::daemon {
namespace {

constexpr std::string_view kHeader = "vipsd-ledger 1\n";

Status ErrnoError(const std::string& what, const std::string& path) {
  return UnavailableError(what + " " + path + ": " + std::strerror(errno));
}

Status WriteAllAndSync(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", path);
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const Status status = ErrnoError("cannot write", path);
      ::close(fd);
      return status;
    }
    written += static_cast<size_t>(n);
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
  if (result != 0) return ErrnoError("cannot fsync directory", directory);
  return Status::Ok();
}

}  // namespace

Ledger::Ledger(std::string directory)
    : directory_(std::move(directory)), path_(directory_ + "/ledger") {}

StatusOr<Ledger> Ledger::Open(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return UnavailableError("cannot create state directory " + directory + ": " +
                            error.message());
  }
  ::chmod(directory.c_str(), 0700);
  return Ledger(directory);
}

StatusOr<std::optional<LedgerState>> Ledger::Load() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path_)) return std::optional<LedgerState>();
    return UnavailableError("cannot read " + path_);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (text.compare(0, kHeader.size(), kHeader) != 0) {
    return DataLossError(path_ + ": not a vipsd ledger (bad header); refusing to start from zero");
  }
  std::istringstream lines(text.substr(kHeader.size()));
  std::string word;
  LedgerState state;
  if (!(lines >> word >> state.next_step) || word != "next_step" || state.next_step < 1) {
    return DataLossError(path_ + ": bad next_step line; refusing to start from zero");
  }
  std::string rest;
  std::getline(lines, rest);  // end of the next_step line
  std::ostringstream accountant_text;
  accountant_text << lines.rdbuf();
  auto accountant = privacy::RdpAccountant::Deserialize(accountant_text.str());
  if (!accountant.ok()) {
    return DataLossError(path_ + ": " + accountant.status().message() +
                         "; refusing to start from zero");
  }
  state.accountant = std::move(*accountant);
  return std::optional<LedgerState>(std::move(state));
}

Status Ledger::Commit(const LedgerState& state) const {
  std::string text(kHeader);
  text += "next_step " + std::to_string(state.next_step) + "\n";
  text += state.accountant.Serialize();
  const std::string temporary = path_ + ".tmp";
  VIPSD_RETURN_IF_ERROR(WriteAllAndSync(temporary, text));
  if (::rename(temporary.c_str(), path_.c_str()) != 0) {
    return ErrnoError("cannot rename onto", path_);
  }
  return SyncDirectory(directory_);
}

}  // namespace vipsd::daemon
