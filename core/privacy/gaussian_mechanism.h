// GaussianSumMechanism: the one Gaussian mechanism of a step (docs/privacy_accounting.md §1).
//
// Records enter only through Add(), which clips every block b of the record
// to its bound C_b (ClipRecordStatistic, block_layout.h), scales it by 1/C_b
// and re-checks that the scaled block has L2 norm ≤ 1 (shrinking it by a few
// ulps if rounding in the division pushed it over). Each accepted record
// therefore contributes a scaled vector of L2 norm ≤ sqrt(B), B = #blocks,
// and adding or removing one record changes the scaled sum by at most
// sqrt(B) in L2 (exact arithmetic; see "Rounding").
//
// Release(noise, σ) adds N(0, σ²·B) independently to every coordinate of the
// scaled sum and multiplies block b by C_b. The released block b therefore
// carries per-coordinate noise of standard deviation σ·sqrt(B)·C_b
// (NoiseStdPerBlock). Dividing the L2 sensitivity sqrt(B) by the noise std
// σ·sqrt(B) gives an effective noise multiplier of exactly σ, so one release
// is one Gaussian mechanism with noise multiplier σ: the accountant charges
// one step of SampledGaussianRdp(q, σ, ·) (rdp.h) per release. The release
// happens whether or not any record was added: an empty sum is noised just
// the same, since skipping it would reveal that the batch was empty.
//
// σ = 0 (the non-private SVI baseline, docs/models.md, "The stochastic step") is a separate method,
// ReleaseNonPrivate(); Release() refuses σ ≤ 0. Each release result says
// whether it is private (σ > 0 and a private NoiseSource).
//
// One mechanism instance = one step. After a release the accumulator refuses
// further Add/Release calls until Reset(), so the same sum can never be
// released twice with independent noise (which would be a second, uncharged
// mechanism). For the same reason the class cannot be copied, and Merge
// consumes its argument.
//
// What is private: the records, the running sum, and the counts of accepted
// and rejected records (the realised Poisson batch size and how many E-step
// outputs were non-finite). PrivateCounts exists for tests and internal
// invariants; it must never be exported as a metric, log field or release
// field (docs/architecture.md and README "Running as a service"). What is public: the layout, the bounds C_b, σ, the
// per-block noise std, and the noisy released sum.
//
// Rounding. Clipping is pessimistic (block_layout.h). The noise scale
// σ·sqrt(B) is rounded up by 4·DBL_EPSILON relative. The floating-point sum
// itself is not exactly order-independent: adding a record to a non-zero sum
// can change each coordinate by up to half an ulp of the running sum beyond
// the record's own value; this and the floating-point sampler caveat
// (secure_noise.h) are documented as known issues, not mitigated.
//
// Thread-safety: NOT thread-safe. Give each worker its own instance with the
// same layout and combine them with Merge() before releasing.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/block_layout.h"
#include "core/privacy/noise_source.h"

namespace vipsd::privacy {

// Per-coordinate noise std of each block, σ·sqrt(B)·C_b, in layout order
// (with the same upward rounding as Release). Depends only on public
// configuration. σ must be finite and ≥ 0.
StatusOr<std::vector<double>> NoiseStdPerBlock(const BlockLayout& layout,
                                               double noise_multiplier);

struct GaussianRelease {
  // The noisy sum in original units, in layout order (symmetric blocks
  // packed; mirror them with UnpackSymmetric).
  Eigen::VectorXd noisy_sum;
  double noise_multiplier = 0;  // σ used; 0 for ReleaseNonPrivate
  // True only if σ > 0 and the NoiseSource is private.
  bool is_private = false;
  // NoiseSource::description(), or "none (sigma = 0, NOT PRIVATE)".
  std::string noise_description;
};

class GaussianSumMechanism {
 public:
  explicit GaussianSumMechanism(BlockLayout layout);

  // Not copyable (a copy could be released a second time). Movable by
  // construction only; a moved-from mechanism has an empty layout.
  GaussianSumMechanism(const GaussianSumMechanism&) = delete;
  GaussianSumMechanism& operator=(const GaussianSumMechanism&) = delete;
  GaussianSumMechanism(GaussianSumMechanism&&) = default;
  GaussianSumMechanism& operator=(GaussianSumMechanism&&) = delete;

  const BlockLayout& layout() const { return layout_; }

  // Clips a copy of `record`, scales it and adds it to the sum. A rejected
  // record is not summed and is counted as rejected. Errors:
  //   INVALID_ARGUMENT     record.size() != layout().total_size()
  //   OUT_OF_RANGE         a NaN or infinite coordinate
  //   FAILED_PRECONDITION  already released (call Reset)
  Status Add(std::span<const double> record);

  // Sparse form of Add for statistics with few non-zero coordinates (LDA: a
  // document touches K × (its distinct words) of a K × V block). `indices`
  // are flat layout coordinates, strictly increasing and < total_size();
  // `values` are the matching coordinates (same length). Equivalent to Add()
  // of the dense vector with zeros elsewhere: the same per-block clipping
  // (the norm of a block is the norm of its listed values), scaling and
  // re-check, with the same guarantee (every block ≤ its bound); results can
  // differ in the last bits because the rounding margin counts the listed
  // coordinates instead of the block size. Errors (nothing summed, counted as rejected):
  //   INVALID_ARGUMENT     length mismatch, index out of range or not
  //                        strictly increasing
  //   OUT_OF_RANGE         a NaN or infinite value
  //   FAILED_PRECONDITION  already released
  Status AddSparse(std::span<const uint32_t> indices, std::span<const double> values);

  // Adds another accumulator's sum and counts (same layout, neither
  // released). `other` is consumed: its sum and counts are cleared and it
  // refuses Add/Release until Reset(), so its records cannot be released
  // twice. On error neither side changes.
  Status Merge(GaussianSumMechanism&& other);

  // The private release: noise multiplier σ must be finite and > 0.
  // FAILED_PRECONDITION if already released.
  StatusOr<GaussianRelease> Release(NoiseSource& noise, double noise_multiplier);

  // NOT PRIVATE: the exact (clipped) sum, σ = 0, is_private = false. Only
  // for the explicit non-private baseline mode and for tests.
  StatusOr<GaussianRelease> ReleaseNonPrivate();

  // Empties the sum and the counts and allows a new step.
  void Reset();

  // ---- Moving an un-noised partial sum between processes (issue 16) ----
  // PRIVATE BYTES. The scaled sum and the private counts of an unreleased
  // mechanism, for the scale-out partial-sum transfer only: the bytes carry
  // exactly what the records contributed, un-noised, so they may travel
  // only where the input records may (the internal partial-sum topic, which
  // has the input topic's access control) and never into a log, metric,
  // release or error message. Encoding does not release or change the
  // mechanism; the receiver decodes it and Merges it into the one sum that
  // is released once. Format: "VPS1", BLAKE2b-256 of the layout (names,
  // kinds, dims, offsets, sizes, bounds), the counts, the touched pages (or
  // the dense sum), then BLAKE2b-256 of all of it; little-endian IEEE doubles,
  // so a decoded sum has the same bits. FAILED_PRECONDITION if released.
  StatusOr<std::string> EncodeUnreleased() const;
  // DATA_LOSS for anything malformed, truncated, of another layout or with a
  // non-finite coordinate; the decoded mechanism is unreleased.
  static StatusOr<std::unique_ptr<GaussianSumMechanism>> DecodeUnreleased(
      const BlockLayout& layout, std::string_view bytes);

  bool released() const { return released_; }

  // PRIVATE counts — never export (see header comment).
  struct PrivateCounts {
    uint64_t accepted = 0;
    uint64_t rejected = 0;
  };
  PrivateCounts private_counts() const { return counts_; }

 private:
  GaussianRelease ScaleBack(Eigen::VectorXd scaled) const;

  BlockLayout layout_;
  Eigen::VectorXd scaled_sum_;
  Eigen::VectorXd scratch_;  // the record being clipped (dense Add; allocated on first use)
  std::vector<double> sparse_scratch_;  // the sparse record being clipped
  bool sum_is_zero_ = true;  // scaled_sum_ is all zeros: Reset() need not refill it
  // Which coordinates may be non-zero, in pages of kPage coordinates, so that
  // Merge and Reset of a sparse sum (LDA: a chunk of documents touches a few
  // percent of K·V) cost the touched pages, not the whole vector. Valid while
  // !dense_; a dense Add (or merging a dense sum) sets dense_. Skipping
  // untouched pages gives the same bits: they hold +0.0, and x + (+0.0) == x
  // for every sum here (a sum that starts at +0.0 never becomes −0.0).
  static constexpr size_t kPage = 16;
  void MarkPage(size_t page);
  void ClearSum();  // zero the sum (touched pages only when tracked) and the tracking
  std::vector<uint8_t> page_touched_;   // per page; sized on first use
  std::vector<uint32_t> touched_pages_;  // the pages set in page_touched_
  bool dense_ = false;
  PrivateCounts counts_;
  bool released_ = false;
};

}  // namespace vipsd::privacy
