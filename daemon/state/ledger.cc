#include "daemon/state/ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "connectors/file/file_util.h"
#include "core/base/format.h"
#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/mechanisms/privacy_unit.h"
#include "core/release/release.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kHeaderV1 = "vipsd-ledger 1\n";
constexpr std::string_view kHeaderV2 = "vipsd-ledger 2\n";
constexpr std::string_view kHeaderV3 = "vipsd-ledger 3\n";
constexpr std::string_view kHeaderV4 = "vipsd-ledger 4\n";
constexpr std::string_view kHeaderV5 = "vipsd-ledger 5\n";
constexpr std::string_view kHeaderV6 = "vipsd-ledger 6\n";
constexpr std::string_view kHeaderV7 = "vipsd-ledger 7\n";
constexpr std::string_view kChecksumPrefix = "blake2b ";
constexpr std::string_view kRefuse = "; refusing to start from zero";




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

}  // namespace

std::string_view AccountingModeName(AccountingMode mode) {
  return mode == AccountingMode::kGlobal ? "global" : "residency";
}

std::string_view ScheduleKindName(ScheduleKind kind) {
  return kind == ScheduleKind::kFixed ? "fixed" : "adaptive";
}

std::string_view SourceKindName(SourceKind kind) {
  return kind == SourceKind::kKafka ? "kafka" : "file";
}

bool IsRunId(const std::string& id) { return IsLowerHex(id, 32); }

StatusOr<std::string> NewRunId() {
  unsigned char bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t got = ::getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(std::string("cannot draw a run id from getrandom: ") +
                              std::strerror(errno));
    }
    filled += static_cast<size_t>(got);
  }
  return LowerHex(bytes);
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
  // Version 7 adds the δ line and always has the unit line; version 6 adds
  // the unit line. A directory that records no δ (never private) is written
  // as before: version 6 for a unit, else version 5.
  const bool per_unit = state.unit != "record";
  const bool with_delta = state.delta > 0;
  std::string out(with_delta ? kHeaderV7 : per_unit ? kHeaderV6 : kHeaderV5);
  out += "run " + state.run_id + "\n";
  out += "model " + state.model_type + " " + state.model_fingerprint + "\n";
  out += "source " + std::string(SourceKindName(state.source)) + "\n";
  out += "next_step " + std::to_string(state.next_step) + "\n";
  out += "mode " + std::string(AccountingModeName(state.mode)) + "\n";
  out += "schedule " + std::string(ScheduleKindName(state.schedule));
  if (state.schedule == ScheduleKind::kFixed) {
    out += " " + HexDouble(state.fixed_step.sampling_rate) + " " +
           HexDouble(state.fixed_step.noise_multiplier);
  } else if (!state.accountant.filter_weights().empty()) {
    out += " weighted";
  }
  out += "\n";
  const NoiseHistory& n = state.noise;
  out += "noise " + std::to_string(n.private_steps) + " " + std::to_string(n.non_private_steps) +
         " " + std::to_string(n.first_non_private_step) + " " +
         std::to_string(n.fixed_seed_steps) + " " + std::to_string(n.first_fixed_seed_step) + "\n";
  out += "warning_level " + HexDouble(state.warning_level) + "\n";
  out += "ceiling " + HexDouble(state.epsilon_ceiling) + "\n";
  if (with_delta) out += "delta " + HexDouble(state.delta) + "\n";
  if (with_delta && !per_unit) {
    out += "unit record\n";
  } else if (per_unit) {
    out += "unit " + state.unit + (state.unit == "field" ? " " + state.unit_field : "") + " " +
           std::to_string(state.max_records_per_unit) + "\n";
  }
  if (with_delta && !state.federation_run.empty()) {
    out += "federation " + state.federation_run + "\n";
  }
  AppendSection(out, "slot-windows", state.windows.Serialize());
  AppendSection(out, "rdp-accountant", state.accountant.Serialize());
  if (state.schedule == ScheduleKind::kAdaptive && !state.accountant.filter_weights().empty()) {
    AppendSection(out, "filter-weights",
                  privacy::SerializeFilterWeights(state.accountant.orders(),
                                                  state.accountant.filter_weights()));
  }
  if (state.mode == AccountingMode::kResidency && state.residency.has_value()) {
    AppendSection(out, "residency-accountant", state.residency->Serialize());
  }
  out += std::string(kChecksumPrefix) + release::Blake2bHex(out) + "\n";
  return out;
}

namespace {

// Version 6's unit line: "unit key CAP" or "unit field NAME CAP".
Status DecodeUnitLine(Reader& reader, int version, LedgerState& state) {
  std::string line, word;
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  std::istringstream words(line);
  std::string kind, field, cap, extra;
  if (version >= 7 && line == "unit record") return Status::Ok();  // the default
  if (!(words >> word >> kind) || word != "unit" || (kind != "key" && kind != "field")) {
    return reader.Bad("bad unit line (unit key CAP | unit field NAME CAP)");
  }
  if (kind == "field" && (!(words >> field) || !privacy::IsUnitFieldName(field))) {
    return reader.Bad("bad unit line (no field, or not 1-128 of A-Z a-z 0-9 _ . -)");
  }
  if (!(words >> cap) || (words >> extra)) return reader.Bad("bad unit line");
  int64_t parsed = 0;
  const auto [end, error] = std::from_chars(cap.data(), cap.data() + cap.size(), parsed);
  if (error != std::errc() || end != cap.data() + cap.size() || parsed < 1 ||
      parsed > privacy::kMaxRecordsPerUnit) {
    return reader.Bad("bad unit cap (must be an integer in [1, 1000000])");
  }
  state.unit = kind;
  state.unit_field = field;
  state.max_records_per_unit = parsed;
  return Status::Ok();
}

// A "key <hex float>" line: exactly that key and one finite value.
Status HexLine(Reader& reader, std::string_view key, double* value) {
  std::string line, word, text, extra;
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  std::istringstream words(line);
  if (!(words >> word >> text) || word != key || (words >> extra)) {
    return reader.Bad("bad " + std::string(key) + " line");
  }
  if (!ParseHexDouble(text, value)) {
    return reader.Bad("bad " + std::string(key) + " value (not a finite hex float)");
  }
  return Status::Ok();
}

// The lines before the sections (run, model, source, next_step, mode,
// schedule (from v4), noise, warning_level, ceiling (from v5), delta (from v7), unit (from
// v6; always from v7)); `weighted`:
// a filter-weights section follows ("schedule adaptive weighted").
Status DecodeLines(Reader& reader, int version, LedgerState& state, bool* weighted) {
  std::string line, word, value;
  auto counter = [](int64_t v) { return v >= 0 && v <= svi::kMaxCounter; };
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> state.run_id) || word != "run" || !IsRunId(state.run_id) ||
        (words >> value)) {
      return reader.Bad("bad run line");
    }
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> state.model_type >> state.model_fingerprint) || word != "model" ||
        (state.model_type != "lda" && state.model_type != "blr" && state.model_type != "sbn") ||
        !IsLowerHex(state.model_fingerprint, 64) || (words >> value)) {
      return reader.Bad("bad model line");
    }
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> value) || word != "source" || (value != "kafka" && value != "file")) {
      return reader.Bad("bad source line");
    }
    state.source = value == "kafka" ? SourceKind::kKafka : SourceKind::kFile;
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> state.next_step) || word != "next_step" || state.next_step < 1 ||
        !counter(state.next_step)) {
      return reader.Bad("bad next_step line (must be in [1, 2^53])");
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
  if (version >= 4) {
    VIPSD_RETURN_IF_ERROR(reader.Line(&line));
    std::istringstream words(line);
    if (!(words >> word >> value) || word != "schedule" ||
        (value != "fixed" && value != "adaptive")) {
      return reader.Bad("bad schedule line");
    }
    state.schedule = value == "fixed" ? ScheduleKind::kFixed : ScheduleKind::kAdaptive;
    if (state.schedule == ScheduleKind::kFixed) {
      std::string q, sigma;
      if (!(words >> q >> sigma)) return reader.Bad("bad schedule line");
      if (!ParseHexDouble(q, &state.fixed_step.sampling_rate) ||
          !ParseHexDouble(sigma, &state.fixed_step.noise_multiplier) ||
          !privacy::ValidateSampledGaussian(state.fixed_step, /*require_noise=*/true).ok()) {
        return reader.Bad("bad schedule values (q must be in (0, 1], sigma finite and > 0)");
      }
    } else if (words >> value) {
      if (value != "weighted") return reader.Bad("bad schedule line");
      *weighted = true;
    }
    if (words >> value) return reader.Bad("bad schedule line");
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    NoiseHistory& n = state.noise;
    if (!(words >> word >> n.private_steps >> n.non_private_steps >> n.first_non_private_step >>
          n.fixed_seed_steps >> n.first_fixed_seed_step) ||
        word != "noise" || !counter(n.private_steps) || !counter(n.non_private_steps) ||
        !counter(n.first_non_private_step) || !counter(n.fixed_seed_steps) ||
        !counter(n.first_fixed_seed_step) ||
        (n.non_private_steps > 0) != (n.first_non_private_step > 0) ||
        (n.fixed_seed_steps > 0) != (n.first_fixed_seed_step > 0) ||
        n.private_steps + n.non_private_steps + n.fixed_seed_steps > state.next_step - 1) {
      return reader.Bad("bad noise line");
    }
  }
  VIPSD_RETURN_IF_ERROR(reader.Line(&line));
  {
    std::istringstream words(line);
    if (!(words >> word >> value) || word != "warning_level") {
      return reader.Bad("bad warning_level line");
    }
    if (!ParseHexDouble(value, &state.warning_level) || state.warning_level < 0 ||
        state.warning_level >= 1) {
      return reader.Bad("bad warning_level value");
    }
  }
  if (version >= 5) {
    VIPSD_RETURN_IF_ERROR(HexLine(reader, "ceiling", &state.epsilon_ceiling));
    if (state.epsilon_ceiling < 0) {
      return reader.Bad("bad ceiling value (must be a finite number >= 0)");
    }
  }
  if (version >= 7) {
    VIPSD_RETURN_IF_ERROR(HexLine(reader, "delta", &state.delta));
    if (!(state.delta > 0 && state.delta < 1)) {
      return reader.Bad("bad delta value (must be a number in (0, 1))");
    }
  }
  if (version >= 6) VIPSD_RETURN_IF_ERROR(DecodeUnitLine(reader, version, state));
  if (version >= 7 && reader.Peek().substr(0, 11) == "federation ") {
    VIPSD_RETURN_IF_ERROR(reader.Line(&line));
    std::istringstream words(line);
    std::string extra;
    if (!(words >> word >> state.federation_run) || !IsRunId(state.federation_run) ||
        (words >> extra)) {
      return reader.Bad("bad federation line (federation <32 lowercase hex>)");
    }
  }
  return Status::Ok();
}

// The sections, checked against the lines (no accountant holds more steps
// than the step counter).
Status DecodeSections(Reader& reader, bool weighted, LedgerState& state) {
  VIPSD_ASSIGN_OR_RETURN(std::string windows_text, reader.Section("slot-windows"));
  auto windows = svi::SlotWindows::Deserialize(windows_text);
  if (!windows.ok()) return reader.Bad(std::string(windows.status().message()));
  state.windows = std::move(*windows);
  VIPSD_ASSIGN_OR_RETURN(std::string accountant_text, reader.Section("rdp-accountant"));
  auto accountant = privacy::RdpAccountant::Deserialize(accountant_text);
  if (!accountant.ok()) return reader.Bad(std::string(accountant.status().message()));
  state.accountant = std::move(*accountant);
  if (state.accountant.steps() > state.next_step - 1) {
    return reader.Bad("the accountant holds more steps than the ledger's step counter");
  }
  privacy::FilterWeights weights;
  if (weighted) {
    VIPSD_ASSIGN_OR_RETURN(std::string weights_text, reader.Section("filter-weights"));
    auto decoded = privacy::DeserializeFilterWeights(weights_text, state.accountant.orders());
    if (!decoded.ok()) return reader.Bad(std::string(decoded.status().message()));
    weights = std::move(*decoded);
    VIPSD_RETURN_IF_ERROR(state.accountant.SetFilterWeights(weights));
  }
  if (state.mode == AccountingMode::kResidency) {
    VIPSD_ASSIGN_OR_RETURN(std::string residency_text, reader.Section("residency-accountant"));
    auto residency = privacy::ResidencyAccountant::Deserialize(residency_text);
    if (!residency.ok()) return reader.Bad(std::string(residency.status().message()));
    state.residency = std::move(*residency);
    if (state.residency->steps() > state.next_step - 1) {
      return reader.Bad("the residency accountant holds more steps than the ledger's step counter");
    }
    if (weighted) {
      if (state.residency->orders() != state.accountant.orders()) {
        return reader.Bad("the residency accountant's orders differ from the filter weights'");
      }
      VIPSD_RETURN_IF_ERROR(state.residency->SetFilterWeights(weights));
    }
  }
  if (!reader.AtEnd()) return reader.Bad("unexpected data after the last section");
  return Status::Ok();
}

}  // namespace

StatusOr<LedgerState> Ledger::Decode(const std::string& bytes, const std::string& where) {
  Reader whole(bytes, where);
  if (bytes.compare(0, kHeaderV1.size(), kHeaderV1) == 0) {
    return whole.Bad("version-1 ledger: it carries no checksum, so a damaged budget could not "
                     "be told from a real one; vipsd no longer reads it (start a new state "
                     "directory; the old one records what was spent)");
  }
  if (bytes.compare(0, kHeaderV2.size(), kHeaderV2) == 0) {
    return whole.Bad("version-2 ledger: it does not record the run id, the model or whether a "
                     "non-private or fixed-seed step ever ran, and its pool bookkeeping is "
                     "count-based; vipsd no longer resumes from it (start a new state "
                     "directory; the old one records what was spent)");
  }
  int version = 0;
  if (bytes.compare(0, kHeaderV3.size(), kHeaderV3) == 0) version = 3;
  if (bytes.compare(0, kHeaderV4.size(), kHeaderV4) == 0) version = 4;
  if (bytes.compare(0, kHeaderV5.size(), kHeaderV5) == 0) version = 5;
  if (bytes.compare(0, kHeaderV6.size(), kHeaderV6) == 0) version = 6;
  if (bytes.compare(0, kHeaderV7.size(), kHeaderV7) == 0) version = 7;
  if (version == 0) return whole.Bad("not a vipsd ledger (bad header)");
  // The checksum line is the last line and covers every byte before it.
  const size_t checksum_at = bytes.rfind(std::string("\n") + std::string(kChecksumPrefix));
  if (checksum_at == std::string::npos || bytes.back() != '\n') {
    return whole.Bad("checksum line missing (truncated write?)");
  }
  const std::string body = bytes.substr(0, checksum_at + 1);
  const size_t hex_at = checksum_at + 1 + kChecksumPrefix.size();
  const std::string stored = bytes.substr(hex_at, bytes.size() - hex_at - 1);
  if (stored != release::Blake2bHex(body)) return whole.Bad("checksum mismatch");

  // Every header from v3 on has the same length.
  Reader reader(std::string_view(body).substr(kHeaderV5.size()), where);
  LedgerState state;
  bool weighted = false;
  VIPSD_RETURN_IF_ERROR(DecodeLines(reader, version, state, &weighted));
  VIPSD_RETURN_IF_ERROR(DecodeSections(reader, weighted, state));
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
