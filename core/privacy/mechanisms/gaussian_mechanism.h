// GaussianSumMechanism: the one noise mechanism of a step
// (docs/privacy_accounting.md §1 and §1a). It is a discrete Gaussian over an
// exact integer sum; the accountants charge it as the continuous Gaussian
// with noise multiplier σ, by the reduction proven below.
//
// Records enter only through Add(), which clips every block b of the record
// to its bound C_b (ClipRecordStatistic, block_layout.h), scales it by 1/C_b
// and re-checks that the scaled block has L2 norm ≤ 1 (shrinking it by a few
// ulps if rounding in the division pushed it over).
//
// The grid. Each scaled coordinate x is then rounded to the nearest integer
// multiple of 2^-g (n = nearbyint(x·2^g): x·2^g is exact, the rounding is
// round-half-even, deterministic), g = GridExponent(B), B = #blocks (20 for
// one to three blocks). The rounded block must satisfy, checked exactly in
// 128-bit integers,
//     Σ_i n_i² ≤ S_b = (2^g + 2^(g−10))²   (L2 ≤ (1 + 2^-10) grid-units·2^g),
// and if it does not (rounding adds at most sqrt(m)/2 for m coordinates, so
// only a block with m > 2^(2g−18) ≈ 4·10^6 coordinates can fail), the block
// is shrunk by (1 − (sqrt(m)/2 + 1)/2^g) and rounded again, which provably
// passes; the check is repeated and, as a last resort, the block is zeroed.
// So the sensitivity is exact in integers: adding or removing one record (or
// one unit's clipped sum) changes the integer sum by a vector v with
// ||v||₂² ≤ S = Σ_b S_b. The sum is accumulated in int64 (|n_i| ≤ 2^21;
// at most kMaxContributions records per sum, so no overflow), hence it is
// independent of the order in which records were added or partial sums
// merged.
//
// The noise. Release(noise, σ) adds Z ~ N_Z(0, σ_g²) independently to every
// coordinate of the integer sum (the exact CKS sampler, discrete_gaussian.h,
// no floating point in any sampling decision), with the integer
//     σ_g² = ⌈σ²·S·(1 + 2^-40)⌉ + τ²,   τ² = 100,
// and releases (sum + Z)·2^-g·C_b for block b (a deterministic function of
// the integer output: post-processing). Every output is on the grid 2^-g·C_b
// whatever the data, so no output is possible under one dataset and
// impossible under its neighbour (Mironov's low-order-bit attack has nothing
// to read).
//
// Why the accountant may charge the continuous Gaussian at σ. Let
// s² = σ_g² − τ² ≥ σ²·S. (1) The continuous mechanism v ↦ v + N(0, s²·I) on
// the integer sums has L2 sensitivity sqrt(S), so its noise multiplier
// s/sqrt(S) ≥ σ: it is at least as private as the subsampled Gaussian the
// PLD/RDP accountants charge at σ. (2) Post-process each coordinate y by the
// kernel K(k | y) ∝ exp(−(k − y)²/(2τ²)) on the integers k. K commutes with
// integer shifts, so the result is v + W with W independent of the data.
// (3) By Poisson summation, Σ_k exp(−(k − y)²/(2τ²)) = τ·sqrt(2π)·(1 ± ε_τ)
// with ε_τ = 2·Σ_{m≥1} exp(−2π²τ²m²), so W's pmf is within a factor
// (1 ± ε_τ)^±1 of the Gaussian density of variance s² + τ² = σ_g² at k, and
// N_Z(0, σ_g²)'s pmf is within (1 + ε_σg)^±1 of the same density. Hence the
// noise actually added and W have pmfs within a ratio e^{±η} per coordinate,
// η = 3ε_τ < 10^-856. (4) Over a whole run of T releases of D coordinates,
// any transcript's probability (every Poisson batch, adaptive choice and
// noise draw included) is within e^{±TDη} of the post-processed continuous
// mechanism's, so an (ε, δ) guarantee of the latter gives (ε + 2TDη,
// e^{TDη}·δ) for what vipsd samples: for any T, D < 10^12 that is
// (ε + 10^-832, δ·(1 + 10^-832)), below what a double can represent. The
// price is noise, not ε: the noise per scaled coordinate, sqrt(σ_g²)·2^-g,
// exceeds the σ·sqrt(B) of an exact mechanism by the rounding slack, a
// factor 1 + 2^-10 (0.098 %), and by τ²/(2σ²S) relative (5·10^-11 at
// σ = 1, g = 20, one block).
//
// // σ = 0 (the non-private SVI baseline, docs/models.md, "The stochastic step") is a separate method,
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
// Limits. σ ≤ kMaxNoiseMultiplier (1024), so that σ_g² < 2^62, the exact
// sampler's range; Release refuses a larger σ (the configuration does too).
// Per-record rounding to 2^-21 of a block's bound is a bias of at most that
// much per coordinate and record (a value below it becomes 0); at g = 20 and
// 10^6 records a step that is 0.5 of one bound, against noise of σ·sqrt(B)
// bounds.
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
#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/mechanisms/discrete_gaussian.h"
#include "core/privacy/mechanisms/noise_source.h"

namespace vipsd::privacy {

// A released coordinate from its grid integer: m·2^-g·C_b, the power of
// two exact (|m| ≤ 2^62, g ≤ 20: never subnormal), then one rounding for
// C_b. The one formula of a release (ScaleBack) and of a plan's released
// sum (DecodeReleased), so that both give the same bits.
inline double ReleasedValue(int64_t m, double two_to_minus_g, double clip_bound) {
  return static_cast<double>(m) * two_to_minus_g * clip_bound;
}

// The largest noise multiplier a release accepts (see "Limits").
inline constexpr double kMaxNoiseMultiplier = 1024;
// The rounding slack of a block's integer bound: 2^-kGridSlackBits.
inline constexpr int kGridSlackBits = 10;
// τ² of the reduction (grid units²).
inline constexpr uint64_t kReductionTau2 = 100;
// At most this many records (or unit sums) in one sum (int64 headroom).
inline constexpr uint64_t kMaxContributions = uint64_t{1} << 40;

// g for a layout of `num_blocks` blocks: the largest g in [10, 20] with
// kMaxNoiseMultiplier²·B·(2^g + 2^(g−10))² ≤ 2^62 − 2^23 (so σ_g² < 2^62;
// g = 20 for B ≤ 3, 19 for B ≤ 15); 10 if
// none (such a layout, B > 2^21, then refuses large σ at release).
int GridExponent(size_t num_blocks);

// The public parameters of a release's discrete noise (all integers in grid
// units; the grid of block b is 2^-g·C_b).
struct DiscreteNoise {
  int grid_exponent = 0;                     // g
  std::vector<uint64_t> block_bound_squared;  // S_b = (2^g + 2^(g−10))²
  uint64_t bound_squared = 0;                // S = Σ_b S_b
  Rational sigma2;                           // σ_g² (denominator 1)
  double noise_multiplier = 0;               // σ
};
// InvalidArgument for σ not finite or ≤ 0; OutOfRange above
// kMaxNoiseMultiplier or when σ_g² leaves the sampler's range.
StatusOr<DiscreteNoise> DiscreteNoiseFor(const BlockLayout& layout, double noise_multiplier);

// One line for release manifests (noise_description) and status, e.g.
// "discrete-gaussian grid=2^-20 S=2203322695680 sigma_g^2=2203322695780".
std::string DescribeDiscreteNoise(const DiscreteNoise& noise);

// Per-coordinate noise scale of each block, sqrt(σ_g²)·2^-g·C_b (rounded
// up; the discrete Gaussian's std is slightly below its parameter), in layout
// order. About σ·sqrt(B)·(1 + 2^-10)·C_b. Depends only on public
// configuration. σ must be finite and ≥ 0 (0 gives zeros).
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
  // The discrete noise's parameters (DiscreteNoiseFor). A non-private
  // release of a grid sum sets only grid_exponent; of a kFloat sum, nothing.
  DiscreteNoise noise;
};

// How a mechanism sums. kGrid is the private mechanism above. kFloat sums
// the clipped, scaled records in doubles without rounding them: only for the
// non-private baseline (σ = 0), whose models may declare no proven bound (a
// placeholder 2^400, far beyond what a grid can resolve); Release() refuses
// a kFloat sum.
enum class SumKind { kGrid, kFloat };

// The kind a step with noise multiplier σ sums in: kGrid when σ > 0.
inline SumKind SumKindFor(double noise_multiplier) {
  return noise_multiplier > 0 ? SumKind::kGrid : SumKind::kFloat;
}

struct DistributedNoise;  // distributed_noise.h

class GaussianSumMechanism {
 public:
  explicit GaussianSumMechanism(BlockLayout layout, SumKind kind = SumKind::kGrid);

  // Not copyable (a copy could be released a second time). Movable by
  // construction only; a moved-from mechanism has an empty layout.
  GaussianSumMechanism(const GaussianSumMechanism&) = delete;
  GaussianSumMechanism& operator=(const GaussianSumMechanism&) = delete;
  GaussianSumMechanism(GaussianSumMechanism&&) = default;
  GaussianSumMechanism& operator=(GaussianSumMechanism&&) = delete;

  const BlockLayout& layout() const { return layout_; }
  SumKind kind() const { return kind_; }

  // Clips a copy of `record`, scales it, rounds it to the grid and adds it
  // to the integer sum. A rejected record is not summed and is counted as
  // rejected. Errors:
  //   INVALID_ARGUMENT     record.size() != layout().total_size()
  //   OUT_OF_RANGE         a NaN or infinite coordinate
  //   RESOURCE_EXHAUSTED   kMaxContributions records already summed
  //   FAILED_PRECONDITION  already released (call Reset)
  Status Add(std::span<const double> record);

  // Sparse form of Add for statistics with few non-zero coordinates (LDA: a
  // document touches K × (its distinct words) of a K × V block). `indices`
  // are flat layout coordinates, strictly increasing and < total_size();
  // `values` are the matching coordinates (same length). Equivalent to Add()
  // of the dense vector with zeros elsewhere: the same per-block clipping
  // (the norm of a block is the norm of its listed values), scaling and
  // re-check and grid rounding, with the same guarantee (every block's
  // integer norm² ≤ S_b); results can differ by a grid step because the
  // clipping margin counts the listed coordinates instead of the block size.
  // Errors (nothing summed, counted as rejected):
  //   INVALID_ARGUMENT     length mismatch, index out of range or not
  //                        strictly increasing
  //   OUT_OF_RANGE         a NaN or infinite value
  //   FAILED_PRECONDITION  already released
  Status AddSparse(std::span<const uint32_t> indices, std::span<const double> values);

  // Adds another accumulator's sum and counts (same layout, neither
  // released). `other` is consumed: its sum and counts are cleared and it
  // refuses Add/Release until Reset(), so its records cannot be released
  // twice. Integer addition: the result does not depend on the order of
  // merges. On error (another layout or kind, or more than
  // kMaxContributions records together) neither side changes.
  Status Merge(GaussianSumMechanism&& other);

  // The private release (see the header comment): σ must be finite, > 0
  // and ≤ kMaxNoiseMultiplier. FAILED_PRECONDITION if already released or
  // a kFloat sum;
  // a sampler error (never expected; discrete_gaussian.h) releases nothing
  // and leaves the sum unreleased.
  StatusOr<GaussianRelease> Release(NoiseSource& noise, double noise_multiplier);

  // ---- Noise drawn ahead (issue 30) ----
  // The discrete Gaussian noise of one release of a sum with a given layout
  // and σ, drawn before the sum is complete: the noise does not depend on
  // the records, so a step's owner can draw it while the E-step runs or
  // while it waits for other processes' partial sums. PRIVATE (whoever knows
  // it can subtract it from the release): it never leaves the process, it
  // is zeroed when destroyed, and Release(PreparedNoise) consumes it, so one
  // draw covers exactly one release. The draws are the ones Release(noise,
  // σ) would take from `noise` at that point of its stream.
  class PreparedNoise {
   public:
    PreparedNoise() = default;
    PreparedNoise(PreparedNoise&& other) noexcept;
    PreparedNoise& operator=(PreparedNoise&& other) noexcept;
    PreparedNoise(const PreparedNoise&) = delete;
    PreparedNoise& operator=(const PreparedNoise&) = delete;
    ~PreparedNoise();
    // False once consumed (or moved from, or default-constructed).
    bool ready() const { return ready_; }

   private:
    friend class GaussianSumMechanism;
    void Wipe();
    std::vector<int64_t> draws_;  // grid units, one per coordinate
    DiscreteNoise parameters_;
    double noise_multiplier_ = 0;
    bool is_private_ = false;
    std::string description_;
    bool ready_ = false;
  };
  // Errors as DiscreteNoiseFor and the sampler's; nothing is drawn then.
  // Drawn on up to `threads` threads (NoiseSource::FillDiscreteGaussianParallel:
  // the draws do not depend on how many).
  static StatusOr<PreparedNoise> PrepareNoise(const BlockLayout& layout, NoiseSource& noise,
                                              double noise_multiplier, int threads = 1);
  // Release() with noise drawn ahead for this layout (FAILED_PRECONDITION
  // for noise of another layout or grid, or consumed already; nothing is
  // released then and the noise is wiped). Consumes `noise` either way.
  StatusOr<GaussianRelease> Release(PreparedNoise noise);

  // ---- Federated shares (issue 31: distributed_noise.h, secure_aggregation.h) ----
  // A data holder's part of a federated step: the integer sum plus its noise
  // share, N_Z(0, s²) per coordinate (s² = shares.share_sigma2), in grid
  // units. NOT a release and not private on its own (one share covers only
  // σ_g²/(n − t)): it may leave the process only masked (Masker::Mask), and
  // the aggregator's ReleaseFederatedTotal of all holders' shares is the
  // release. Consumes the sum as Release does, so a sum yields one share.
  // FAILED_PRECONDITION if released, a kFloat sum, or `shares` is for
  // another grid; the sampler's errors (nothing consumed then).
  StatusOr<std::vector<int64_t>> ReleaseShare(NoiseSource& noise, const DistributedNoise& shares);

  // The aggregator's release: the holders' shares summed (SumMasked of the
  // masked messages), scaled back exactly as Release scales its noisy sum
  // (post-processing of integers). `shares_private`: every holder drew its
  // share from a private NoiseSource (what the holders declare; a
  // reproducible test source makes the release not private).
  // INVALID_ARGUMENT for a total of another length or grid.
  static StatusOr<GaussianRelease> ReleaseFederatedTotal(const BlockLayout& layout,
                                                         std::span<const int64_t> total,
                                                         const DistributedNoise& shares,
                                                         bool shares_private);

  // NOT PRIVATE: the exact (clipped, grid-rounded) sum, σ = 0, is_private = false. Only
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
  // is released once. Format: "VPS3", BLAKE2b-256 of the layout (names,
  // kinds, dims, offsets, sizes, bounds, grid exponent), the counts, the
  // touched pages (or the dense sum), then BLAKE2b-256 of all of it; grid
  // units as zigzag LEB128 varints ("VPSF" and little-endian IEEE doubles
  // for a kFloat sum; the decoded mechanism has the kind of its bytes).
  // "VPS2" (fixed 8-byte integers, earlier versions) is refused by name.
  // FAILED_PRECONDITION if released.
  StatusOr<std::string> EncodeUnreleased() const;
  // DATA_LOSS for anything malformed, truncated, of another layout, with
  // more than kMaxContributions records or a coordinate no such sum can
  // reach; the decoded mechanism is unreleased.
  //
  // kVerifiedByCaller skips the check of the trailing BLAKE2b (every other
  // check stays), for a caller that has verified a checksum covering these
  // bytes already: shared work's partials travel inside a work message
  // whose own BLAKE2b-256 covers the whole sum (DecodeWorkPartial), and a
  // second pass over a dense partial's 1.2 MB cost about 0.7 ms of the step
  // owner's serial time per partial (bench/partial_sum_bench).
  enum class Checksum { kVerify, kVerifiedByCaller };
  static StatusOr<std::unique_ptr<GaussianSumMechanism>> DecodeUnreleased(
      const BlockLayout& layout, std::string_view bytes, Checksum checksum = Checksum::kVerify);

  // A released (noisy, public) grid sum in few bytes, for shared work's
  // plans (issue 30: a plan carries the released sum instead of the whole
  // model when the workers hold the model it applies to). Each coordinate
  // goes as the integer m with value == ReleasedValue(m, g, C_b) bit for
  // bit: zigzag LEB128 as in a partial, mostly 3-4 bytes at σ ≥ 1 against 8
  // for a double. Format: "VRS1", the layout's digest (as a partial's), the
  // total size, the varints.
  // No checksum of its own: the plan that carries it has one.
  // FAILED_PRECONDITION when a coordinate is not such a value (a
  // non-private release, or any other vector): send the model instead.
  static StatusOr<std::string> EncodeReleased(const BlockLayout& layout,
                                              const Eigen::VectorXd& noisy_sum);
  // The exact doubles EncodeReleased was given. DATA_LOSS for another
  // layout, a truncated or overlong varint, or trailing bytes.
  static StatusOr<Eigen::VectorXd> DecodeReleased(const BlockLayout& layout,
                                                  std::string_view bytes);

  bool released() const { return released_; }

  // PRIVATE counts — never export (see header comment).
  struct PrivateCounts {
    uint64_t accepted = 0;
    uint64_t rejected = 0;
  };
  PrivateCounts private_counts() const { return counts_; }

 private:
  // The released vector: (sum_[i] + noise[i])·2^-g·C_b (noise may be empty).
  GaussianRelease ScaleBack(std::span<const int64_t> noise) const;
  // Rounds the scaled block values to the grid into grid_scratch_ (same
  // length) with Σ n² ≤ S_b guaranteed (see the header comment).
  void RoundToGrid(std::span<double> scaled, size_t block_index);

  BlockLayout layout_;
  SumKind kind_ = SumKind::kGrid;
  int grid_exponent_ = 0;
  std::vector<uint64_t> block_bound_squared_;  // S_b
  std::vector<int64_t> sum_;        // grid units (kGrid)
  std::vector<double> float_sum_;   // scaled units (kFloat)
  Eigen::VectorXd scratch_;  // the record being clipped (dense Add; allocated on first use)
  std::vector<double> sparse_scratch_;  // the sparse record being clipped
  std::vector<int64_t> grid_scratch_;   // its rounded values
  bool sum_is_zero_ = true;  // sum_ is all zeros: Reset() need not refill it
  // Which coordinates may be non-zero, in pages of kPage coordinates, so that
  // Merge and Reset of a sparse sum (LDA: a chunk of documents touches a few
  // percent of K·V) cost the touched pages, not the whole vector. Valid while
  // !dense_; a dense Add (or merging a dense sum) sets dense_. Untouched
  // pages hold 0.
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
