// The un-noised partial-sum transfer (GaussianSumMechanism::DecodeUnreleased,
// the bytes workers put on the work topic) on arbitrary bytes: as given (the
// checksum must refuse nearly all of them) and re-signed so that the parser
// behind the checksum is reached. The fuzzed bytes replace the body after
// a valid header (magic, layout digest, size, counts) of a fixed two-block
// layout. A decoded partial encodes to the same bytes, merges into a fresh
// sum, and its non-private release is finite. The same bytes also go, as
// given and behind a valid header, to the released-sum decoder that plans
// use (DecodeReleased; no checksum of its own). Every input is also decoded
// without its trailing checksum (Checksum::kVerifiedByCaller), as the
// coordinator does.
#include <cstring>
#include <string>

#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

namespace {

constexpr size_t kDigestBytes = 32;

const privacy::BlockLayout& Layout() {
  static const privacy::BlockLayout layout = *privacy::BlockLayout::Create(
      {{"a", privacy::BlockKind::kVector, 40, 2.0},
       {"s", privacy::BlockKind::kSymmetricMatrix, 3, 0.5}});
  return layout;
}

// Magic, layout digest, total size, and the two counts of a real partial.
std::string Header(bool grid) {
  privacy::GaussianSumMechanism mechanism(
      Layout(), grid ? privacy::SumKind::kGrid : privacy::SumKind::kFloat);
  std::vector<double> record(Layout().total_size(), 0.25);
  (void)mechanism.Add(record);
  const std::string bytes = *mechanism.EncodeUnreleased();
  return bytes.substr(0, 4 + kDigestBytes + 8);  // counts come from the input
}


void Check(const std::string& bytes) {
  using Checksum = privacy::GaussianSumMechanism::Checksum;
  auto verified = privacy::GaussianSumMechanism::DecodeUnreleased(Layout(), bytes);
  // Without the trailing checksum (the coordinator's mode: the work
  // message's checksum covers the bytes) every other check still holds:
  // what it accepts must pass everything below, and it accepts whatever
  // the verifying decoder does, as the same sum.
  auto decoded =
      privacy::GaussianSumMechanism::DecodeUnreleased(Layout(), bytes, Checksum::kVerifiedByCaller);
  if (verified.ok() &&
      (!decoded.ok() || *(*verified)->EncodeUnreleased() != *(*decoded)->EncodeUnreleased())) {
    fuzz::Violated("a partial decodes differently without its checksum");
  }
  if (!decoded.ok()) return;
  const auto encoded = (*decoded)->EncodeUnreleased();
  if (!encoded.ok()) fuzz::Violated("a decoded partial does not encode");
  auto again = privacy::GaussianSumMechanism::DecodeUnreleased(Layout(), *encoded);
  if (!again.ok()) fuzz::Violated("a re-encoded partial does not decode");
  privacy::GaussianSumMechanism total(Layout(), (*decoded)->kind());
  if (!total.Merge(std::move(**decoded)).ok()) fuzz::Violated("a decoded partial does not merge");
  const auto release = total.ReleaseNonPrivate();
  if (!release.ok() || !release->noisy_sum.allFinite()) {
    fuzz::Violated("a decoded partial releases a non-finite sum");
  }
}

// A released sum as a plan carries it (GaussianSumMechanism::DecodeReleased):
// what decodes is finite, encodes again, and decodes to the same bits.
void CheckReleased(const std::string& bytes) {
  auto decoded = privacy::GaussianSumMechanism::DecodeReleased(Layout(), bytes);
  if (!decoded.ok()) return;
  if (!decoded->allFinite()) fuzz::Violated("a decoded released sum is not finite");
  const auto encoded = privacy::GaussianSumMechanism::EncodeReleased(Layout(), *decoded);
  if (!encoded.ok()) fuzz::Violated("a decoded released sum does not encode");
  const auto again = privacy::GaussianSumMechanism::DecodeReleased(Layout(), *encoded);
  if (!again.ok() || again->size() != decoded->size() ||
      std::memcmp(again->data(), decoded->data(),
                  sizeof(double) * static_cast<size_t>(decoded->size())) != 0) {
    fuzz::Violated("a re-encoded released sum decodes to other values");
  }
}

// Magic, layout digest and total size of a real released sum.
std::string ReleasedHeader() {
  const Eigen::VectorXd zero =
      Eigen::VectorXd::Zero(static_cast<Eigen::Index>(Layout().total_size()));
  return privacy::GaussianSumMechanism::EncodeReleased(Layout(), zero)
      ->substr(0, 4 + kDigestBytes + 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string grid_header = Header(true);
  static const std::string float_header = Header(false);
  static const std::string released_header = ReleasedHeader();
  const std::string input(fuzz::AsText(data + 1, size - 1));
  Check(input);
  Check(fuzz::Blake2bSigned((data[0] & 1 ? float_header : grid_header) + input));
  CheckReleased(input);
  CheckReleased(released_header + input);
  return 0;
}
