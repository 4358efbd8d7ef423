#include "core/privacy/gaussian_mechanism.h"

#include <sodium.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace vipsd::privacy {
namespace {

// Noise std in the scaled space, σ·sqrt(B), rounded up: the two roundings
// (sqrt, product) are each below DBL_EPSILON/2 relative.
double ScaledNoiseStd(size_t num_blocks, double noise_multiplier) {
  return noise_multiplier * std::sqrt(static_cast<double>(num_blocks)) *
         (1.0 + 4.0 * DBL_EPSILON);
}

bool SameLayout(const BlockLayout& a, const BlockLayout& b) {
  if (a.num_blocks() != b.num_blocks()) return false;
  for (size_t index = 0; index < a.num_blocks(); ++index) {
    const Block& x = a.block(index);
    const Block& y = b.block(index);
    if (x.name != y.name || x.kind != y.kind || x.dim != y.dim || x.offset != y.offset ||
        x.size != y.size || x.clip_bound != y.clip_bound) {
      return false;
    }
  }
  return true;
}

Status AlreadyReleasedError() {
  return FailedPreconditionError(
      "this step's sum has already been released; call Reset() before the next step");
}

}  // namespace

StatusOr<std::vector<double>> NoiseStdPerBlock(const BlockLayout& layout,
                                               double noise_multiplier) {
  if (!std::isfinite(noise_multiplier) || noise_multiplier < 0) {
    return InvalidArgumentError("noise_multiplier must be finite and >= 0, got " +
                                std::to_string(noise_multiplier));
  }
  const double scaled_std = ScaledNoiseStd(layout.num_blocks(), noise_multiplier);
  std::vector<double> stds;
  stds.reserve(layout.num_blocks());
  for (const Block& block : layout.blocks()) stds.push_back(scaled_std * block.clip_bound);
  return stds;
}

GaussianSumMechanism::GaussianSumMechanism(BlockLayout layout)
    : layout_(std::move(layout)),
      scaled_sum_(Eigen::VectorXd::Zero(static_cast<Eigen::Index>(layout_.total_size()))) {}

Status GaussianSumMechanism::Add(std::span<const double> record) {
  if (released_) return AlreadyReleasedError();
  if (record.size() != layout_.total_size()) {
    ++counts_.rejected;
    return InvalidArgumentError("record statistic has " + std::to_string(record.size()) +
                                " coordinates but the block layout expects " +
                                std::to_string(layout_.total_size()));
  }
  // Allocated on first use: sparse-only accumulators never need it.
  scratch_.resize(static_cast<Eigen::Index>(layout_.total_size()));
  std::copy(record.begin(), record.end(), scratch_.data());
  const std::span<double> clipped(scratch_.data(), layout_.total_size());
  if (Status status = ClipRecordStatistic(layout_, clipped); !status.ok()) {
    ++counts_.rejected;
    return status;
  }
  for (const Block& block : layout_.blocks()) {
    auto segment = scratch_.segment(static_cast<Eigen::Index>(block.offset),
                                    static_cast<Eigen::Index>(block.size));
    // Correctly rounded division; |values| ≤ C_b so nothing overflows.
    segment /= block.clip_bound;
    // The division may round the scaled norm a few ulps above 1.
    ClipToL2Bound(clipped.subspan(block.offset, block.size), 1.0);
  }
  scaled_sum_ += scratch_;
  sum_is_zero_ = false;
  dense_ = true;
  ++counts_.accepted;
  return Status::Ok();
}

Status GaussianSumMechanism::AddSparse(std::span<const uint32_t> indices,
                                       std::span<const double> values) {
  if (released_) return AlreadyReleasedError();
  if (indices.size() != values.size()) {
    ++counts_.rejected;
    return InvalidArgumentError("sparse statistic: " + std::to_string(indices.size()) +
                                " indices but " + std::to_string(values.size()) + " values");
  }
  const size_t total = layout_.total_size();
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= total || (i > 0 && indices[i] <= indices[i - 1])) {
      ++counts_.rejected;
      return InvalidArgumentError(
          "sparse statistic: indices must be strictly increasing and below " +
          std::to_string(total));
    }
    if (!std::isfinite(values[i])) {
      ++counts_.rejected;
      return OutOfRangeError("sparse statistic: a coordinate is NaN or infinite");
    }
  }
  sparse_scratch_.assign(values.begin(), values.end());
  const std::span<double> scratch(sparse_scratch_);
  size_t begin = 0;
  for (const Block& block : layout_.blocks()) {
    // Indices are sorted and blocks are contiguous: this block's values are
    // the run of indices in [offset, offset + size).
    while (begin < indices.size() && indices[begin] < block.offset) ++begin;
    size_t end = begin;
    while (end < indices.size() && indices[end] < block.offset + block.size) ++end;
    if (end > begin) {
      const std::span<double> segment = scratch.subspan(begin, end - begin);
      ClipToL2Bound(segment, block.clip_bound);
      for (double& value : segment) value /= block.clip_bound;
      ClipToL2Bound(segment, 1.0);
    }
    begin = end;
  }
  for (size_t i = 0; i < indices.size(); ++i) {
    scaled_sum_[static_cast<Eigen::Index>(indices[i])] += sparse_scratch_[i];
  }
  if (!dense_) {
    for (const uint32_t index : indices) MarkPage(index / kPage);
  }
  if (!indices.empty()) sum_is_zero_ = false;
  ++counts_.accepted;
  return Status::Ok();
}

Status GaussianSumMechanism::Merge(GaussianSumMechanism&& other) {
  if (&other == this) return InvalidArgumentError("Merge: cannot merge a mechanism into itself");
  if (released_ || other.released_) return AlreadyReleasedError();
  if (!SameLayout(layout_, other.layout_)) {
    return InvalidArgumentError("Merge: the two mechanisms have different block layouts");
  }
  if (sum_is_zero_) {
    // 0 + x == x exactly: a running sum starts at +0.0 and, in
    // round-to-nearest, never becomes −0.0 (x + y is −0.0 only if both are),
    // so taking over the other buffer gives the same bits as adding it, and
    // the other side is left with our zeros (and our empty tracking).
    scaled_sum_.swap(other.scaled_sum_);
    sum_is_zero_ = other.sum_is_zero_;
    other.sum_is_zero_ = true;
    page_touched_.swap(other.page_touched_);
    touched_pages_.swap(other.touched_pages_);
    std::swap(dense_, other.dense_);
  } else if (!other.dense_ && !other.sum_is_zero_) {
    const auto size = static_cast<size_t>(scaled_sum_.size());
    for (const uint32_t page : other.touched_pages_) {
      const size_t begin = static_cast<size_t>(page) * kPage;
      const size_t end = std::min(size, begin + kPage);
      for (size_t i = begin; i < end; ++i) scaled_sum_.data()[i] += other.scaled_sum_.data()[i];
      if (!dense_) MarkPage(page);
    }
  } else if (!other.sum_is_zero_) {
    scaled_sum_ += other.scaled_sum_;
    dense_ = true;
  }
  counts_.accepted += other.counts_.accepted;
  counts_.rejected += other.counts_.rejected;
  other.Reset();
  other.released_ = true;
  return Status::Ok();
}

GaussianRelease GaussianSumMechanism::ScaleBack(Eigen::VectorXd scaled) const {
  for (const Block& block : layout_.blocks()) {
    scaled.segment(static_cast<Eigen::Index>(block.offset),
                   static_cast<Eigen::Index>(block.size)) *= block.clip_bound;
  }
  GaussianRelease release;
  release.noisy_sum = std::move(scaled);
  return release;
}

StatusOr<GaussianRelease> GaussianSumMechanism::Release(NoiseSource& noise,
                                                        double noise_multiplier) {
  if (released_) return AlreadyReleasedError();
  if (!std::isfinite(noise_multiplier) || noise_multiplier <= 0) {
    return InvalidArgumentError(
        "noise_multiplier must be finite and > 0, got " + std::to_string(noise_multiplier) +
        "; the sigma = 0 baseline must use ReleaseNonPrivate()");
  }
  // One buffer: the standard normals, then (in place) the noisy scaled sum.
  Eigen::VectorXd noisy(scaled_sum_.size());
  noise.FillStandardNormal(std::span<double>(noisy.data(), static_cast<size_t>(noisy.size())));
  const double scaled_std = ScaledNoiseStd(layout_.num_blocks(), noise_multiplier);
  noisy = scaled_sum_ + scaled_std * noisy;  // coefficient-wise: no aliasing problem
  released_ = true;
  ClearSum();  // the private sum is no longer needed
  GaussianRelease release = ScaleBack(std::move(noisy));
  release.noise_multiplier = noise_multiplier;
  release.is_private = noise.is_private();
  release.noise_description = noise.description();
  return release;
}

StatusOr<GaussianRelease> GaussianSumMechanism::ReleaseNonPrivate() {
  if (released_) return AlreadyReleasedError();
  released_ = true;
  GaussianRelease release = ScaleBack(scaled_sum_);
  ClearSum();
  release.noise_multiplier = 0;
  release.is_private = false;
  release.noise_description = "none (sigma = 0, NOT PRIVATE)";
  return release;
}

void GaussianSumMechanism::Reset() {
  // Skipping the fill when nothing was added since the last one saves a
  // statistic-sized memset (e.g. Merge resets its argument, and the step
  // driver resets it again before reuse).
  ClearSum();
  counts_ = PrivateCounts{};
  released_ = false;
}

void GaussianSumMechanism::MarkPage(size_t page) {
  if (page_touched_.empty()) {
    page_touched_.assign((layout_.total_size() + kPage - 1) / kPage, 0);
  }
  if (page_touched_[page] == 0) {
    page_touched_[page] = 1;
    touched_pages_.push_back(static_cast<uint32_t>(page));
  }
}

void GaussianSumMechanism::ClearSum() {
  if (!sum_is_zero_) {
    if (dense_ || page_touched_.empty()) {
      scaled_sum_.setZero();
    } else {
      const auto size = static_cast<size_t>(scaled_sum_.size());
      for (const uint32_t page : touched_pages_) {
        const size_t begin = static_cast<size_t>(page) * kPage;
        std::fill(scaled_sum_.data() + begin, scaled_sum_.data() + std::min(size, begin + kPage), 0.0);
      }
    }
  }
  for (const uint32_t page : touched_pages_) page_touched_[page] = 0;
  touched_pages_.clear();
  sum_is_zero_ = true;
  dense_ = false;
}

namespace {

constexpr char kTransferMagic[4] = {'V', 'P', 'S', '1'};
constexpr size_t kDigestBytes = 32;
enum TransferKind : uint8_t { kTransferZero = 0, kTransferPages = 1, kTransferDense = 2 };

void PutU64(std::string& out, uint64_t v) {
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(v >> (8 * b)));
}
void PutF64(std::string& out, double d) {
  uint64_t v;
  std::memcpy(&v, &d, sizeof v);
  PutU64(out, v);
}

void Digest(std::string_view bytes, unsigned char (&out)[kDigestBytes]) {
  crypto_generichash(out, kDigestBytes, reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
}

// BLAKE2b of everything that defines the layout, so that a partial made
// under another configuration (another K, V, block or bound) is refused.
std::string LayoutDigest(const BlockLayout& layout) {
  std::string text;
  PutU64(text, layout.num_blocks());
  for (size_t index = 0; index < layout.num_blocks(); ++index) {
    const Block& block = layout.block(index);
    PutU64(text, block.name.size());
    text += block.name;
    PutU64(text, static_cast<uint64_t>(block.kind));
    PutU64(text, block.dim);
    PutU64(text, block.offset);
    PutU64(text, block.size);
    PutF64(text, block.clip_bound);
  }
  unsigned char digest[kDigestBytes];
  Digest(text, digest);
  return std::string(reinterpret_cast<const char*>(digest), kDigestBytes);
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool U64(uint64_t* v) {
    if (bytes_.size() - pos_ < 8) return false;
    *v = 0;
    for (int b = 7; b >= 0; --b) *v = (*v << 8) | static_cast<unsigned char>(bytes_[pos_ + b]);
    pos_ += 8;
    return true;
  }
  bool F64(double* d) {
    uint64_t v;
    if (!U64(&v)) return false;
    std::memcpy(d, &v, sizeof v);
    return true;
  }
  bool Bytes(size_t n, std::string_view* out) {
    if (bytes_.size() - pos_ < n) return false;
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::string> GaussianSumMechanism::EncodeUnreleased() const {
  if (released_) return AlreadyReleasedError();
  std::string out(kTransferMagic, sizeof kTransferMagic);
  out += LayoutDigest(layout_);
  PutU64(out, layout_.total_size());
  PutU64(out, counts_.accepted);
  PutU64(out, counts_.rejected);
  const auto size = static_cast<size_t>(scaled_sum_.size());
  if (sum_is_zero_) {
    out.push_back(static_cast<char>(kTransferZero));
  } else if (!dense_ && !page_touched_.empty()) {
    out.push_back(static_cast<char>(kTransferPages));
    std::vector<uint32_t> pages = touched_pages_;
    std::sort(pages.begin(), pages.end());
    PutU64(out, pages.size());
    for (const uint32_t page : pages) {
      PutU64(out, page);
      const size_t begin = static_cast<size_t>(page) * kPage;
      for (size_t i = begin; i < std::min(size, begin + kPage); ++i) {
        PutF64(out, scaled_sum_.data()[i]);
      }
    }
  } else {
    out.push_back(static_cast<char>(kTransferDense));
    for (size_t i = 0; i < size; ++i) PutF64(out, scaled_sum_.data()[i]);
  }
  unsigned char digest[kDigestBytes];
  Digest(out, digest);
  out.append(reinterpret_cast<const char*>(digest), kDigestBytes);
  return out;
}

StatusOr<std::unique_ptr<GaussianSumMechanism>> GaussianSumMechanism::DecodeUnreleased(
    const BlockLayout& layout, std::string_view bytes) {
  auto bad = [](const std::string& what) {
    return DataLossError("partial sum transfer: " + what);
  };
  if (bytes.size() < sizeof kTransferMagic + 2 * kDigestBytes + 3 * 8 + 1) {
    return bad("truncated");
  }
  if (std::memcmp(bytes.data(), kTransferMagic, sizeof kTransferMagic) != 0) {
    return bad("not a VPS1 partial sum");
  }
  unsigned char digest[kDigestBytes];
  Digest(bytes.substr(0, bytes.size() - kDigestBytes), digest);
  if (std::memcmp(digest, bytes.data() + bytes.size() - kDigestBytes, kDigestBytes) != 0) {
    return bad("checksum mismatch");
  }
  Reader in(bytes.substr(sizeof kTransferMagic, bytes.size() - sizeof kTransferMagic - kDigestBytes));
  std::string_view layout_digest;
  uint64_t total = 0, accepted = 0, rejected = 0;
  if (!in.Bytes(kDigestBytes, &layout_digest) || !in.U64(&total) || !in.U64(&accepted) ||
      !in.U64(&rejected)) {
    return bad("truncated header");
  }
  if (layout_digest != LayoutDigest(layout) || total != layout.total_size()) {
    return bad("made under another statistic layout (model or clip configuration)");
  }
  auto mechanism = std::make_unique<GaussianSumMechanism>(layout);
  mechanism->counts_.accepted = accepted;
  mechanism->counts_.rejected = rejected;
  std::string_view kind_byte;
  if (!in.Bytes(1, &kind_byte)) return bad("truncated");
  const auto size = static_cast<size_t>(layout.total_size());
  double* sum = mechanism->scaled_sum_.data();
  auto read_value = [&](size_t i) -> bool {
    double v;
    if (!in.F64(&v) || !std::isfinite(v)) return false;
    sum[i] = v;
    return true;
  };
  switch (static_cast<uint8_t>(kind_byte[0])) {
    case kTransferZero:
      break;
    case kTransferPages: {
      uint64_t count = 0;
      if (!in.U64(&count)) return bad("truncated page count");
      const size_t num_pages = (size + kPage - 1) / kPage;
      if (count > num_pages) return bad("more pages than the layout has");
      uint64_t previous = 0;
      for (uint64_t p = 0; p < count; ++p) {
        uint64_t page = 0;
        if (!in.U64(&page) || page >= num_pages || (p > 0 && page <= previous)) {
          return bad("page index out of order or out of range");
        }
        previous = page;
        const size_t begin = static_cast<size_t>(page) * kPage;
        for (size_t i = begin; i < std::min(size, begin + kPage); ++i) {
          if (!read_value(i)) return bad("truncated or non-finite coordinate");
        }
        mechanism->MarkPage(static_cast<size_t>(page));
      }
      mechanism->sum_is_zero_ = count == 0;
      break;
    }
    case kTransferDense:
      for (size_t i = 0; i < size; ++i) {
        if (!read_value(i)) return bad("truncated or non-finite coordinate");
      }
      mechanism->dense_ = true;
      mechanism->sum_is_zero_ = false;
      break;
    default:
      return bad("unknown sum encoding");
  }
  if (!in.done()) return bad("trailing bytes");
  return mechanism;
}

}  // namespace vipsd::privacy
