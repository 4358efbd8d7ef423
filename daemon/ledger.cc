#include "daemon/ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "connectors/file/file_util.h"
#include "core/release/release.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kHeaderV1 = "vipsd-ledger 1\n";
constexpr std::string_view kHeaderV2 = "vipsd-ledger 2\n";
constexpr std::string_view kChecksumPrefix = "blake2b ";
constexpr std::string_view kRefuse = "; refusing to start from zero";

std::string Hex(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%a", value);
  return buffer;
}

void AppendSection(std::string& out, std::string_view name, const std::string& body) {
  out += "section ";
  out += name;
  out += " " + std::to_string(body.size()) + "\n";
  out += body;
}

// Reads "key value\n" lines and "section name length\n<bytes>" blocks.
class Reader {
 public:
  Reader(std::string_view text, std::string where) : text_(text), where_(std::move(where)) {}

  Status Line(std::string* line) {
    const size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) return Bad("truncated");
    *line = std::string(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }

  bool AtEnd() const { return pos_ == text_.size(); }
  std::string_view Peek() const { return text_.substr(pos_); }

  StatusOr<std::string> Section(std::string_view expected_name) {
    std::string line;
    VIPSD_RETURN_IF_ERROR(Line(&line));
    std::istringstream words(line);
    std::string word, name;
    size_t length = 0;
    if (!(words >> word >> name >> length) || word != "section" || name != expected_name) {
      return Bad("expected section " + std::string(expected_name));
    }
    if (length > text_.size() - pos_) return Bad("section " + name + " is truncated");
    std::string body(text_.substr(pos_, length));
    pos_ += length;
    return body;
  }

  Status Bad(const std::string& what) const {
    return DataLossError(where_ + ": " + what + std::string(kRefuse));
  }

 private:
  std::string_view text_;
  std::string where_;
  size_t pos_ = 0;
};

StatusOr<LedgerState> DecodeV1(std::string_view text, const std::string& where) {
  Reader reader(text.substr(kHeaderV1.size()), where);
  std::string line;
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  std::istringstream words(line);
  std::string word;
  LedgerState state;
  if (!(words >> word >> state.next_step) || word != "next_step" || state.next_step < 1) {
    return reader.Bad("bad next_step line");
  }
  auto accountant = privacy::RdpAccountant::Deserialize(reader.Peek());
  if (!accountant.ok()) return reader.Bad(std::string(accountant.status().message()));
  state.accountant = std::move(*accountant);
  return state;
}

}  // namespace

std::string_view AccountingModeName(AccountingMode mode) {
  return mode == AccountingMode::kGlobal ? "global" : "residency";
}

Ledger::Ledger(std::string directory, int lock_fd)
    : directory_(std::move(directory)), path_(directory_ + "/ledger"), lock_fd_(lock_fd) {}

Ledger::Ledger(Ledger&& other) noexcept
    : directory_(std::move(other.directory_)),
      path_(std::move(other.path_)),
      lock_fd_(other.lock_fd_) {
  other.lock_fd_ = -1;
}

Ledger& Ledger::operator=(Ledger&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    directory_ = std::move(other.directory_);
    path_ = std::move(other.path_);
    lock_fd_ = other.lock_fd_;
    other.lock_fd_ = -1;
  }
  return *this;
}

Ledger::~Ledger() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

StatusOr<Ledger> Ledger::Open(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return UnavailableError("cannot create state directory " + directory + ": " +
                            error.message());
  }
  ::chmod(directory.c_str(), 0700);
  const std::string lock_path = directory + "/lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return UnavailableError("cannot open " + lock_path + ": " + std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    ::close(fd);
    if (saved == EWOULDBLOCK) {
      return FailedPreconditionError("state directory " + directory +
                                     " is in use by another vipsd process (lock held on " +
                                     lock_path + ")");
    }
    return UnavailableError("cannot lock " + lock_path + ": " + std::strerror(saved));
  }
  return Ledger(directory, fd);
}

std::string Ledger::Encode(const LedgerState& state) {
  std::string out(kHeaderV2);
  out += "next_step " + std::to_string(state.next_step) + "\n";
  out += "mode " + std::string(AccountingModeName(state.mode)) + "\n";
  out += "warning_level " + Hex(state.warning_level) + "\n";
  for (const auto& [stream, offset] : state.resume_offsets) {
    out += "resume " + stream + " " + std::to_string(offset) + "\n";
  }
  AppendSection(out, "rdp-accountant", state.accountant.Serialize());
  if (state.mode == AccountingMode::kResidency && state.residency.has_value()) {
    AppendSection(out, "residency-accountant", state.residency->Serialize());
    AppendSection(out, "arrival-history", state.arrivals.Serialize());
  }
  out += std::string(kChecksumPrefix) + release::Blake2bHex(out) + "\n";
  return out;
}

StatusOr<LedgerState> Ledger::Decode(const std::string& bytes, const std::string& where) {
  if (bytes.compare(0, kHeaderV1.size(), kHeaderV1) == 0) return DecodeV1(bytes, where);
  Reader whole(bytes, where);
  if (bytes.compare(0, kHeaderV2.size(), kHeaderV2) != 0) {
    return whole.Bad("not a vipsd ledger (bad header)");
  }
  // The checksum line is the last line and covers every byte before it.
  const size_t checksum_at = bytes.rfind(std::string("\n") + std::string(kChecksumPrefix));
  if (checksum_at == std::string::npos || bytes.empty() || bytes.back() != '\n') {
    return whole.Bad("checksum line missing (truncated write?)");
  }
  const std::string body = bytes.substr(0, checksum_at + 1);
  const std::string stored =
      bytes.substr(checksum_at + 1 + kChecksumPrefix.size(),
                   bytes.size() - (checksum_at + 1 + kChecksumPrefix.size()) - 1);
  if (stored != release::Blake2bHex(body)) return whole.Bad("checksum mismatch");

  Reader reader(std::string_view(body).substr(kHeaderV2.size()), where);
  LedgerState state;
  std::string line, word, value;
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> state.next_step) || word != "next_step" || state.next_step < 1) {
      return reader.Bad("bad next_step line");
    }
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> value) || word != "mode" ||
        (value != "global" && value != "residency")) {
      return reader.Bad("bad mode line");
    }
    state.mode = value == "global" ? AccountingMode::kGlobal : AccountingMode::kResidency;
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    char* end = nullptr;
    if (!(words >> word >> value) || word != "warning_level") {
      return reader.Bad("bad warning_level line");
    }
    state.warning_level = std::strtod(value.c_str(), &end);
    if (end != value.c_str() + value.size() || !std::isfinite(state.warning_level)) {
      return reader.Bad("bad warning_level value");
    }
  }
  while (reader.Peek().substr(0, 7) == "resume ") {
    VIPSD_RETURN_IF_ERROR(reader.Line(&line));
    std::istringstream words(line);
    std::string stream;
    int64_t offset = -1;
    if (!(words >> word >> stream >> offset) || offset < 0 ||
        !state.resume_offsets.emplace(stream, offset).second) {
      return reader.Bad("bad resume line");
    }
  }
  VIPSD_ASSIGN_OR_RETURN(std::string accountant_text, reader.Section("rdp-accountant"));
  auto accountant = privacy::RdpAccountant::Deserialize(accountant_text);
  if (!accountant.ok()) return reader.Bad(std::string(accountant.status().message()));
  state.accountant = std::move(*accountant);
  if (state.mode == AccountingMode::kResidency) {
    VIPSD_ASSIGN_OR_RETURN(std::string residency_text, reader.Section("residency-accountant"));
    auto residency = privacy::ResidencyAccountant::Deserialize(residency_text);
    if (!residency.ok()) return reader.Bad(std::string(residency.status().message()));
    state.residency = std::move(*residency);
    VIPSD_ASSIGN_OR_RETURN(std::string arrivals_text, reader.Section("arrival-history"));
    auto arrivals = svi::ArrivalHistory::Deserialize(arrivals_text);
    if (!arrivals.ok()) return reader.Bad(std::string(arrivals.status().message()));
    state.arrivals = std::move(*arrivals);
  }
  if (!reader.AtEnd()) return reader.Bad("unexpected data after the last section");
  return state;
}

StatusOr<std::optional<LedgerState>> Ledger::Load() const {
  if (!std::filesystem::exists(path_)) return std::optional<LedgerState>();
  VIPSD_ASSIGN_OR_RETURN(std::string bytes, connectors::ReadWholeFile(path_));
  VIPSD_ASSIGN_OR_RETURN(LedgerState state, Decode(bytes, path_));
  return std::optional<LedgerState>(std::move(state));
}

Status Ledger::Commit(const LedgerState& state) const {
  const std::string temporary = path_ + ".tmp";
  VIPSD_RETURN_IF_ERROR(
      connectors::WriteFileDurably(temporary, Encode(state), /*exclusive=*/false, 0600));
  if (::rename(temporary.c_str(), path_.c_str()) != 0) {
    return UnavailableError("cannot rename onto " + path_ + ": " + std::strerror(errno));
  }
  return connectors::SyncDirectory(directory_);
}

}  // namespace vipsd::daemon
