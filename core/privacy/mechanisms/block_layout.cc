#include "core/privacy/mechanisms/block_layout.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>

namespace vipsd::privacy {
namespace {

// A sum of squares at least this large, computed directly, loses nothing to
// underflow that the error bound below does not cover (each underflowed
// square is off by < 2^-1074, i.e. a relative n·2^-174 of the sum).
constexpr double kMinDirectSumOfSquares = 0x1.0p-900;

// Relative bound on (computed norm − exact norm) / exact norm for an
// n-coordinate block: the sum of n squares is within γ_n = n·u/(1 − n·u) of
// the exact value in any summation order (Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., §3.1 and eq. 3.5), the square root halves
// it, and the square root, underflow and the final multiplication add a few
// units u = DBL_EPSILON/2. (n + 4)·DBL_EPSILON = 2(n + 4)u covers all of this
// with a factor of about 4 to spare for n·u ≤ 0.01.
double RelativeNormErrorBound(size_t n) {
  return (static_cast<double>(n) + 4.0) * DBL_EPSILON;
}

// An upper bound on the exact L2 norm, represented as mantissa·2^exponent
// with mantissa in [0.5, 1) (or mantissa == 0 for an all-zero block) so that
// norms above DBL_MAX or below the subnormal range are representable.
struct NormUpperBound {
  double mantissa = 0;
  int exponent = 0;
};

NormUpperBound L2NormUpperBound(std::span<const double> values) {
  const size_t n = values.size();
  if (n == 0) return {};
  const Eigen::Map<const Eigen::VectorXd> vec(values.data(), static_cast<Eigen::Index>(n));
  double sum_of_squares = vec.squaredNorm();
  int scale_exponent = 0;
  if (!(std::isfinite(sum_of_squares) && sum_of_squares >= kMinDirectSumOfSquares)) {
    // Overflow or underflow: rescale by 2^-scale_exponent so that the
    // largest magnitude lies in [0.5, 1). Multiplying by a power of two is
    // exact except for elements that become subnormal, which are negligible
    // against the largest one. Two factors keep each representable.
    const double max_abs = vec.cwiseAbs().maxCoeff();
    if (max_abs == 0) return {};
    scale_exponent = std::ilogb(max_abs) + 1;
    const int first = -scale_exponent / 2;
    const int second = -scale_exponent - first;
    const double first_factor = std::ldexp(1.0, first);
    const double second_factor = std::ldexp(1.0, second);
    sum_of_squares = 0;
    for (const double value : values) {
      const double scaled = (value * first_factor) * second_factor;
      sum_of_squares += scaled * scaled;
    }
  }
  if (sum_of_squares == 0) return {};
  const double norm = std::sqrt(sum_of_squares) * (1.0 + RelativeNormErrorBound(n));
  NormUpperBound bound;
  bound.mantissa = std::frexp(norm, &bound.exponent);
  bound.exponent += scale_exponent;
  return bound;
}

// Exact comparison of the represented norm with `bound` (finite, > 0).
bool ExceedsBound(const NormUpperBound& norm, double bound) {
  if (norm.mantissa == 0) return false;
  int bound_exponent = 0;
  const double bound_mantissa = std::frexp(bound, &bound_exponent);
  return norm.exponent > bound_exponent ||
         (norm.exponent == bound_exponent && norm.mantissa > bound_mantissa);
}

// values *= 2^power, in steps that keep every factor a normal double.
void ScaleByPowerOfTwo(Eigen::Map<Eigen::VectorXd>& vec, int power) {
  while (power != 0) {
    const int step = std::clamp(power, -1000, 1000);
    vec *= std::ldexp(1.0, step);
    power -= step;
  }
}

// Scales `values` by shrink · bound / norm, where norm > bound.
void ScaleTowardsBound(std::span<double> values, const NormUpperBound& norm, double bound,
                       double shrink) {
  int bound_exponent = 0;
  const double bound_mantissa = std::frexp(bound, &bound_exponent);
  Eigen::Map<Eigen::VectorXd> vec(values.data(), static_cast<Eigen::Index>(values.size()));
  // norm > bound implies bound_exponent − norm.exponent ≤ 0 (mantissas are in
  // [0.5, 1)), so scaling down by the power of two first cannot overflow, and
  // the remaining factor (< 2) cannot overflow what is left.
  ScaleByPowerOfTwo(vec, bound_exponent - norm.exponent);
  vec *= (bound_mantissa / norm.mantissa) * shrink;
}

bool IsValidClipBound(double bound) { return std::isnormal(bound) && bound > 0; }

}  // namespace

std::string_view BlockKindName(BlockKind kind) {
  switch (kind) {
    case BlockKind::kVector: return "vector";
    case BlockKind::kSymmetricMatrix: return "symmetric_matrix";
  }
  return "unknown";
}

size_t PackedSymmetricSize(size_t dim) { return dim * (dim + 1) / 2; }

StatusOr<BlockLayout> BlockLayout::Create(std::vector<BlockSpec> specs) {
  if (specs.empty()) return InvalidArgumentError("block layout must have at least one block");
  // Eigen indexes with a signed type; stay well inside it.
  constexpr size_t kMaxTotal = static_cast<size_t>(std::numeric_limits<int32_t>::max()) * 64;
  std::set<std::string, std::less<>> names;
  std::vector<Block> blocks;
  blocks.reserve(specs.size());
  size_t offset = 0;
  for (BlockSpec& spec : specs) {
    if (spec.name.empty()) return InvalidArgumentError("block name must not be empty");
    if (!names.insert(spec.name).second) {
      return InvalidArgumentError("duplicate block name '" + spec.name + "'");
    }
    if (spec.dim == 0) {
      return InvalidArgumentError("block '" + spec.name + "': dim must be >= 1");
    }
    if (!IsValidClipBound(spec.clip_bound)) {
      return InvalidArgumentError("block '" + spec.name +
                                  "': clip_bound must be finite, > 0 and not subnormal");
    }
    size_t size = spec.dim;
    if (spec.kind == BlockKind::kSymmetricMatrix) {
      if (spec.dim >= (size_t{1} << 31)) {  // keeps dim(dim+1)/2 from overflowing
        return InvalidArgumentError("block '" + spec.name + "': dim too large");
      }
      size = PackedSymmetricSize(spec.dim);
    }
    if (size > kMaxTotal || offset > kMaxTotal - size) {
      return InvalidArgumentError("block '" + spec.name + "': layout has more than " +
                                  std::to_string(kMaxTotal) + " coordinates");
    }
    Block block;
    block.name = std::move(spec.name);
    block.kind = spec.kind;
    block.dim = spec.dim;
    block.offset = offset;
    block.size = size;
    block.clip_bound = spec.clip_bound;
    blocks.push_back(std::move(block));
    offset += size;
  }
  return BlockLayout(std::move(blocks));
}

StatusOr<size_t> BlockLayout::FindBlock(std::string_view name) const {
  for (size_t index = 0; index < blocks_.size(); ++index) {
    if (blocks_[index].name == name) return index;
  }
  return NotFoundError("no block named '" + std::string(name) + "'");
}

Status PackUpperTriangle(const Eigen::Ref<const Eigen::MatrixXd>& matrix,
                         std::span<double> packed) {
  if (matrix.rows() != matrix.cols()) {
    return InvalidArgumentError("PackUpperTriangle: matrix is " +
                                std::to_string(matrix.rows()) + "x" +
                                std::to_string(matrix.cols()) + ", not square");
  }
  const auto dim = static_cast<size_t>(matrix.rows());
  if (packed.size() != PackedSymmetricSize(dim)) {
    return InvalidArgumentError("PackUpperTriangle: output has " +
                                std::to_string(packed.size()) + " entries, expected " +
                                std::to_string(PackedSymmetricSize(dim)));
  }
  size_t next = 0;
  for (Eigen::Index col = 0; col < matrix.cols(); ++col) {
    for (Eigen::Index row = 0; row <= col; ++row) packed[next++] = matrix(row, col);
  }
  return Status::Ok();
}

StatusOr<Eigen::MatrixXd> UnpackSymmetric(std::span<const double> packed, size_t dim) {
  if (packed.size() != PackedSymmetricSize(dim)) {
    return InvalidArgumentError("UnpackSymmetric: " + std::to_string(packed.size()) +
                                " packed entries, expected " +
                                std::to_string(PackedSymmetricSize(dim)) + " for dim " +
                                std::to_string(dim));
  }
  const auto n = static_cast<Eigen::Index>(dim);
  Eigen::MatrixXd matrix(n, n);
  size_t next = 0;
  for (Eigen::Index col = 0; col < n; ++col) {
    for (Eigen::Index row = 0; row <= col; ++row) {
      matrix(row, col) = packed[next];
      matrix(col, row) = packed[next];
      ++next;
    }
  }
  return matrix;
}

bool ClipToL2Bound(std::span<double> values, double bound) {
#ifdef VIPSD_AUDIT_BUILD_WITHOUT_CLIPPING
  // NOT PRIVATE. Compiled only into the test executable
  // privacy_audit_no_clip_test (tests/CMakeLists.txt), which shows that the
  // empirical privacy audit detects a mechanism that does not clip.
  (void)values;
  (void)bound;
  return false;
#endif
  NormUpperBound norm = L2NormUpperBound(values);
  if (!ExceedsBound(norm, bound)) return false;
  // Aim below the bound by the error of the norm before and after scaling
  // and of the scaling itself, so that the re-check normally passes at once.
  const double shrink = std::max(0.5, 1.0 - 3.0 * RelativeNormErrorBound(values.size()));
  for (int attempt = 0; attempt < 4; ++attempt) {
    ScaleTowardsBound(values, norm, bound, shrink);
    norm = L2NormUpperBound(values);
    if (!ExceedsBound(norm, bound)) return true;
  }
  // Not reachable with the error bound above; zero has norm 0 ≤ bound.
  std::fill(values.begin(), values.end(), 0.0);
  return true;
}

Status ClipRecordStatistic(const BlockLayout& layout, std::span<double> record,
                           ClipReport* report) {
  if (record.size() != layout.total_size()) {
    return InvalidArgumentError("record statistic has " + std::to_string(record.size()) +
                                " coordinates but the block layout expects " +
                                std::to_string(layout.total_size()));
  }
  for (const double value : record) {
    if (!std::isfinite(value)) {
      return OutOfRangeError("record statistic has a NaN or infinite coordinate; "
                             "the record is rejected");
    }
  }
  if (report != nullptr) report->block_clipped.assign(layout.num_blocks(), false);
  for (size_t index = 0; index < layout.num_blocks(); ++index) {
    const Block& block = layout.block(index);
    const bool clipped =
        ClipToL2Bound(record.subspan(block.offset, block.size), block.clip_bound);
    if (report != nullptr) report->block_clipped[index] = clipped;
  }
  return Status::Ok();
}

}  // namespace vipsd::privacy
