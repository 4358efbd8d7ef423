// The ledger and checkpoint readers on arbitrary bytes, both as given (the
// checksum must refuse nearly all of them) and re-signed with a valid
// checksum so that the parsers behind it are reached. A decoded ledger or
// checkpoint encodes to bytes that decode to the same state again. The
// first byte picks the reader.
#include <string>

#include "core/release/release.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

namespace {

void Ledger(const std::string& bytes) {
  const auto state = daemon::Ledger::Decode(bytes, "ledger");
  if (!state.ok()) return;
  const std::string encoded = daemon::Ledger::Encode(*state);
  const auto again = daemon::Ledger::Decode(encoded, "ledger");
  if (!again.ok()) fuzz::Violated("a decoded ledger does not decode after re-encoding");
  if (daemon::Ledger::Encode(*again) != encoded) fuzz::Violated("ledger encoding is not stable");
}

void Checkpoint(const std::string& bytes) {
  const auto checkpoint = daemon::CheckpointStore::Decode(bytes, "checkpoint");
  if (!checkpoint.ok()) return;
  const auto encoded = daemon::CheckpointStore::Encode(*checkpoint);
  if (!encoded.ok()) fuzz::Violated("a decoded checkpoint does not encode");
  const auto again = daemon::CheckpointStore::Decode(*encoded, "checkpoint");
  if (!again.ok()) fuzz::Violated("a decoded checkpoint does not decode after re-encoding");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  const std::string body(fuzz::AsText(data + 1, size - 1));
  if (data[0] % 2 == 0) {
    Ledger(body);
    // The ledger's checksum covers every byte before the checksum line.
    Ledger(body + "blake2b " + release::Blake2bHex(body) + "\n");
  } else {
    Checkpoint(body);
    // The checkpoint's covers every byte before the '\n' that precedes it.
    Checkpoint(body + "\nblake2b " + release::Blake2bHex(body) + "\n");
  }
  return 0;
}
