#include "daemon/ledger.h"

#include "connectors/file/file_util.h"

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
  VIPSD_RETURN_IF_ERROR(connectors::WriteFileDurably(temporary, text, /*exclusive=*/false, 0600));
  if (::rename(temporary.c_str(), path_.c_str()) != 0) {
    return UnavailableError("cannot rename onto " + path_ + ": " + std::strerror(errno));
  }
  return connectors::SyncDirectory(directory_);
}

}  // namespace vipsd::daemon
