// BlockLayout: how a per-record sufficient statistic is laid out as one flat
// vector of named blocks, each with its own L2 clipping bound, and the
// clipping that enforces those bounds (docs/privacy_accounting.md §1).
//
// A block is either a vector of dimension d (d coordinates) or a symmetric
// d×d matrix stored as its packed upper triangle including the diagonal
// (d(d+1)/2 coordinates, LAPACK 'U' packed order: column by column,
// packed[i + j(j+1)/2] = A(i, j) for i ≤ j). Blocks are contiguous in the
// order given; `offset` is where a block starts in the flat vector.
//
// Norm convention for symmetric blocks. The bound C_b applies to the L2 norm
// of the PACKED vector (each diagonal entry once, each off-diagonal pair
// once), because the packed vector is what the Gaussian mechanism perturbs
// and releases; the mirrored lower triangle is post-processing. The Frobenius
// norm of the full matrix is always ≥ the packed norm (off-diagonals count
// twice), so a bound derived for the Frobenius norm is also a valid, looser
// bound here.
//
// Clipping (ClipRecordStatistic). A record with the wrong size or with any
// NaN/±Inf coordinate is rejected and left untouched. Otherwise each block
// whose L2 norm may exceed C_b is scaled by ≈ C_b / norm. Norms are computed
// overflow- and underflow-safely (values up to DBL_MAX and down to the
// smallest subnormal; the sum of squares is rescaled by a power of two when
// it would leave the normal range, as in LAPACK's dnrm2). Rounding is
// pessimistic: the norm used is a rigorous upper bound on the exact norm
// (a forward error bound (n + 4)·DBL_EPSILON is added for an n-coordinate
// block), and after scaling the result is re-checked with the same bound and
// shrunk again if needed (as a last resort the block is zeroed). Hence, in
// exact arithmetic, every block of an accepted record has L2 norm ≤ C_b. The
// price: a block whose norm is within a relative ~(n + 4)·DBL_EPSILON of C_b
// may be shrunk by that relative amount, and a clipped block ends within that
// relative distance below C_b. Blocks clearly under their bound are left
// bit-for-bit unchanged.
//
// Privacy: the records and whether a block was clipped are PRIVATE. The
// ClipReport exists for tests and debugging only; clip counts must never be
// exported as metrics, logs or release metadata (docs/architecture.md and README "Running as a service"). Error messages
// never contain values from the record.
//
// Thread-safety: a BlockLayout is immutable after Create and may be shared
// between threads. The clipping functions are pure apart from writing their
// `record`/`values` argument.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"

namespace vipsd::privacy {

enum class BlockKind {
  kVector,           // dim coordinates
  kSymmetricMatrix,  // dim × dim, released as dim(dim+1)/2 packed coordinates
};

std::string_view BlockKindName(BlockKind kind);

// What a model declares for one block.
struct BlockSpec {
  std::string name;
  BlockKind kind = BlockKind::kVector;
  size_t dim = 0;           // ≥ 1
  double clip_bound = 0;    // C_b: finite, > 0 and not subnormal
};

// A block placed in the flat vector.
struct Block {
  std::string name;
  BlockKind kind = BlockKind::kVector;
  size_t dim = 0;
  size_t offset = 0;      // first coordinate in the flat vector
  size_t size = 0;        // coordinates: dim, or dim(dim+1)/2
  double clip_bound = 0;  // C_b, on the L2 norm of the `size` coordinates
};

// d(d+1)/2.
size_t PackedSymmetricSize(size_t dim);

class BlockLayout {
 public:
  // Validates: at least one block, names non-empty and unique, dim ≥ 1,
  // clip_bound finite, > 0 and normal, total size without overflow.
  static StatusOr<BlockLayout> Create(std::vector<BlockSpec> specs);

  size_t num_blocks() const { return blocks_.size(); }
  // Derived from the blocks, so a moved-from layout is consistently empty.
  size_t total_size() const {
    return blocks_.empty() ? 0 : blocks_.back().offset + blocks_.back().size;
  }
  const std::vector<Block>& blocks() const { return blocks_; }
  const Block& block(size_t index) const { return blocks_[index]; }
  // Index of the block called `name`, or NotFound.
  StatusOr<size_t> FindBlock(std::string_view name) const;

 private:
  explicit BlockLayout(std::vector<Block> blocks) : blocks_(std::move(blocks)) {}

  std::vector<Block> blocks_;
};

// Writes the upper triangle (incl. diagonal) of the square matrix `matrix`
// into `packed` in LAPACK 'U' order; the strict lower triangle is ignored.
// Fails if `matrix` is not square or `packed` has the wrong size.
Status PackUpperTriangle(const Eigen::Ref<const Eigen::MatrixXd>& matrix,
                         std::span<double> packed);

// Inverse of PackUpperTriangle: a full dim × dim matrix whose lower triangle
// mirrors the upper. Fails if packed.size() != dim(dim+1)/2.
StatusOr<Eigen::MatrixXd> UnpackSymmetric(std::span<const double> packed, size_t dim);

// Which blocks ClipRecordStatistic scaled down. PRIVATE: tests/debug only.
struct ClipReport {
  std::vector<bool> block_clipped;  // one entry per block
};

// Clips every block of `record` (layout.total_size() coordinates) to its
// bound in place, as described above. Errors (record unchanged):
//   INVALID_ARGUMENT  record.size() != layout.total_size()
//   OUT_OF_RANGE      some coordinate is NaN or ±Inf
// `report`, if not null, is filled on success.
Status ClipRecordStatistic(const BlockLayout& layout, std::span<double> record,
                           ClipReport* report = nullptr);

// Clips one block of finite values to L2 norm ≤ bound (same guarantee as
// above). Returns true if the values were changed. Preconditions: all values
// finite; bound finite, > 0 and normal.
bool ClipToL2Bound(std::span<double> values, double bound);

}  // namespace vipsd::privacy
