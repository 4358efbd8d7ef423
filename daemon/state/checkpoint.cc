#include "daemon/state/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "connectors/file/file_util.h"
#include "core/base/format.h"
#include "core/release/release.h"
#include "daemon/state/ledger.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kHeader = "vipsd-checkpoint 2\n";
constexpr std::string_view kHeaderV1 = "vipsd-checkpoint 1\n";
// Step numbers above this are refused (kept far from int64 overflow).
constexpr int64_t kMaxStep = int64_t{1} << 53;
constexpr std::string_view kChecksumPrefix = "blake2b ";
constexpr size_t kMaxArrays = 64;
constexpr int kMaxRank = 8;

bool IsName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// Little-endian IEEE-754 bits, written into room made once (a plan carries
// the model every step: byte-at-a-time appends cost 20 ms at K·V = 500,000).
void AppendDoubles(std::string& out, const std::vector<double>& data) {
  const size_t at = out.size();
  out.resize(at + 8 * data.size());
  char* p = out.data() + at;
  for (double value : data) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    for (int byte = 0; byte < 8; ++byte) *p++ = static_cast<char>((bits >> (8 * byte)) & 0xFF);
  }
}

double ReadDouble(const char* bytes) {
  uint64_t bits = 0;
  for (int byte = 0; byte < 8; ++byte) {
    bits |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[byte])) << (8 * byte);
  }
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string directory)
    : directory_(std::move(directory)), path_(directory_ + "/checkpoint") {}

StatusOr<std::string> CheckpointStore::Encode(const Checkpoint& checkpoint) {
  if (checkpoint.step < 0 || checkpoint.step > kMaxStep) {
    return InvalidArgumentError("checkpoint step must be in [0, 2^53]");
  }
  if (!IsRunId(checkpoint.run_id)) {
    return InvalidArgumentError("checkpoint run id must be 32 lowercase hex characters");
  }
  if (!IsName(checkpoint.model_type)) return InvalidArgumentError("bad checkpoint model type");
  if (!IsLowerHex(checkpoint.model_fingerprint, 64)) {
    return InvalidArgumentError("checkpoint fingerprint must be 64 lowercase hex characters");
  }
  if (checkpoint.arrays.empty() || checkpoint.arrays.size() > kMaxArrays) {
    return InvalidArgumentError("a checkpoint holds 1 to 64 arrays");
  }
  std::string out(kHeader);
  out += "run " + checkpoint.run_id + "\n";
  out += "step " + std::to_string(checkpoint.step) + "\n";
  out += "model " + checkpoint.model_type + "\n";
  out += "fingerprint " + checkpoint.model_fingerprint + "\n";
  out += "arrays " + std::to_string(checkpoint.arrays.size()) + "\n";
  for (const auto& array : checkpoint.arrays) {
    if (!IsName(array.name)) return InvalidArgumentError("bad checkpoint array name");
    if (array.shape.size() > static_cast<size_t>(kMaxRank)) {
      return InvalidArgumentError("checkpoint array " + array.name + " must have rank 0 to 8");
    }
    size_t count = 1;
    out += "array " + array.name + " " + std::to_string(array.shape.size());
    for (int64_t dim : array.shape) {
      if (dim < 0) return InvalidArgumentError("checkpoint array " + array.name + ": negative dim");
      count *= static_cast<size_t>(dim);
      out += " " + std::to_string(dim);
    }
    if (count != array.data.size()) {
      return InvalidArgumentError("checkpoint array " + array.name + ": shape does not match data");
    }
    for (double value : array.data) {
      if (!std::isfinite(value)) {
        return InvalidArgumentError("checkpoint array " + array.name + " has a non-finite value");
      }
    }
    out += "\n";
  }
  out += "data\n";
  size_t values = 0;
  for (const auto& array : checkpoint.arrays) values += array.data.size();
  out.reserve(out.size() + 8 * values + kChecksumPrefix.size() + 66);
  for (const auto& array : checkpoint.arrays) AppendDoubles(out, array.data);
  out += "\n" + std::string(kChecksumPrefix) + release::Blake2bHex(out) + "\n";
  return out;
}

StatusOr<Checkpoint> CheckpointStore::Decode(const std::string& bytes, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return DataLossError(where + ": " + what + "; refusing to start from a fresh model");
  };
  if (bytes.compare(0, kHeaderV1.size(), kHeaderV1) == 0) {
    return bad("written by an older vipsd (checkpoint version 1, without the run id that ties "
               "it to its ledger)");
  }
  if (bytes.compare(0, kHeader.size(), kHeader) != 0) return bad("not a vipsd checkpoint");
  const size_t checksum_at = bytes.rfind(std::string("\n") + std::string(kChecksumPrefix));
  if (checksum_at == std::string::npos || bytes.back() != '\n') return bad("truncated");
  const std::string_view body = std::string_view(bytes).substr(0, checksum_at);
  const size_t hex_at = checksum_at + 1 + kChecksumPrefix.size();
  if (bytes.substr(hex_at, bytes.size() - hex_at - 1) != release::Blake2bHex(body)) {
    return bad("checksum mismatch");
  }
  const size_t data_at = body.find("\ndata\n");
  if (data_at == std::string::npos) return bad("no data section");
  std::istringstream header(std::string(body.substr(kHeader.size(), data_at + 1 - kHeader.size())));
  Checkpoint checkpoint;
  std::string word;
  size_t num_arrays = 0;
  if (!(header >> word >> checkpoint.run_id) || word != "run" || !IsRunId(checkpoint.run_id)) {
    return bad("bad run line");
  }
  if (!(header >> word >> checkpoint.step) || word != "step" || checkpoint.step < 0 ||
      checkpoint.step > kMaxStep) {
    return bad("bad step line");
  }
  if (!(header >> word >> checkpoint.model_type) || word != "model" ||
      !IsName(checkpoint.model_type)) {
    return bad("bad model line");
  }
  if (!(header >> word >> checkpoint.model_fingerprint) || word != "fingerprint" ||
      !IsLowerHex(checkpoint.model_fingerprint, 64)) {
    return bad("bad fingerprint line");
  }
  if (!(header >> word >> num_arrays) || word != "arrays" || num_arrays == 0 ||
      num_arrays > kMaxArrays) {
    return bad("bad arrays line");
  }
  size_t offset = data_at + 6;
  for (size_t i = 0; i < num_arrays; ++i) {
    model::NamedArray array;
    int rank = 0;
    if (!(header >> word >> array.name >> rank) || word != "array" || !IsName(array.name) ||
        rank < 0 || rank > kMaxRank) {
      return bad("bad array line " + std::to_string(i));
    }
    size_t count = 1;
    for (int d = 0; d < rank; ++d) {
      int64_t dim = -1;
      if (!(header >> dim) || dim < 0 || dim > (int64_t{1} << 32)) return bad("bad array shape");
      array.shape.push_back(dim);
      // Found by fuzz/fuzz_state: eight dimensions of 2^32 wrapped the
      // product to a small count that passed the size check below.
      if (__builtin_mul_overflow(count, static_cast<size_t>(dim), &count)) {
        return bad("array " + array.name + " is too large");
      }
    }
    if (count > (body.size() - offset) / 8) return bad("array " + array.name + " is truncated");
    array.data.resize(count);
    for (size_t k = 0; k < count; ++k) {
      array.data[k] = ReadDouble(body.data() + offset + 8 * k);
      if (!std::isfinite(array.data[k])) {
        return bad("array " + array.name + " holds a non-finite value");
      }
    }
    offset += 8 * count;
    checkpoint.arrays.push_back(std::move(array));
  }
  if (header >> word) return bad("unexpected header data");
  if (offset != body.size()) return bad("unexpected data after the arrays");
  return checkpoint;
}

Status CheckpointStore::Save(const Checkpoint& checkpoint) const {
  VIPSD_ASSIGN_OR_RETURN(std::string bytes, Encode(checkpoint));
  const std::string temporary = path_ + ".tmp";
  VIPSD_RETURN_IF_ERROR(connectors::WriteFileDurably(temporary, bytes, /*exclusive=*/false, 0600));
  if (std::rename(temporary.c_str(), path_.c_str()) != 0) {
    return UnavailableError("cannot rename onto " + path_ + ": " + std::strerror(errno));
  }
  return connectors::SyncDirectory(directory_);
}

StatusOr<std::optional<Checkpoint>> CheckpointStore::Load() const {
  if (!std::filesystem::exists(path_)) return std::optional<Checkpoint>();
  VIPSD_ASSIGN_OR_RETURN(std::string bytes, connectors::ReadWholeFile(path_));
  VIPSD_ASSIGN_OR_RETURN(Checkpoint checkpoint, Decode(bytes, path_));
  return std::optional<Checkpoint>(std::move(checkpoint));
}

}  // namespace vipsd::daemon
