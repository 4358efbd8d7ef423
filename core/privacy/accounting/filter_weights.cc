#include "core/privacy/accounting/filter_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/base/format.h"
#include "core/privacy/accounting/rdp.h"

namespace vipsd::privacy {
namespace {

constexpr std::string_view kMagic = "vipsd-filter-weights";
constexpr int kFormatVersion = 1;
constexpr int64_t kMaxHorizon = int64_t{1} << 40;
// Keeps the floating-point sum of the weights at or below 1.
constexpr double kShrink = 1.0 - 0x1p-40;

// ε of `steps` steps of a per-step curve, every order converted at δ/2.
StatusOr<EpsilonAtOrder> HalfDeltaEpsilon(std::span<const double> orders,
                                          const std::vector<double>& curve, int64_t steps,
                                          double delta) {
  std::vector<double> total(curve.size());
  for (size_t i = 0; i < curve.size(); ++i) total[i] = curve[i] * static_cast<double>(steps);
  return EpsilonFromRdp(orders, total, delta / 2, RdpConversion::kImproved);
}

}  // namespace

StatusOr<int64_t> FilterHorizonForCeiling(double sampling_rate, double noise_multiplier,
                                          double delta, double epsilon_ceiling) {
  if (!(epsilon_ceiling > 0) || !std::isfinite(epsilon_ceiling)) {
    return InvalidArgumentError("epsilon ceiling must be finite and > 0");
  }
  const auto& orders = DefaultRdpOrders();
  VIPSD_ASSIGN_OR_RETURN(auto curve,
                         SampledGaussianRdpCurve(sampling_rate, noise_multiplier, orders));
  auto fits = [&](int64_t steps) -> StatusOr<bool> {
    VIPSD_ASSIGN_OR_RETURN(auto at, HalfDeltaEpsilon(orders, curve, steps, delta));
    return at.epsilon <= epsilon_ceiling;
  };
  VIPSD_ASSIGN_OR_RETURN(bool one, fits(1));
  if (!one) return int64_t{1};
  int64_t low = 1;  // fits
  int64_t high = 2;
  while (high < kMaxHorizon) {
    VIPSD_ASSIGN_OR_RETURN(bool ok, fits(high));
    if (!ok) break;
    low = high;
    high *= 2;
  }
  if (high >= kMaxHorizon) return kMaxHorizon;
  while (high - low > 1) {  // fits(low), !fits(high)
    const int64_t mid = low + (high - low) / 2;
    VIPSD_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? low : high) = mid;
  }
  return low;
}

StatusOr<FilterWeights> ConcentratedFilterWeights(std::span<const double> orders,
                                                  double sampling_rate, double noise_multiplier,
                                                  double delta, int64_t horizon_steps) {
  if (orders.empty()) return InvalidArgumentError("the order list is empty");
  if (!std::is_sorted(orders.begin(), orders.end())) {
    return InvalidArgumentError("the orders must be sorted");
  }
  if (horizon_steps < 1) return InvalidArgumentError("the design horizon must be >= 1 step");
  if (!(delta > 0 && delta < 1)) return InvalidArgumentError("delta must be in (0, 1)");
  VIPSD_ASSIGN_OR_RETURN(auto curve,
                         SampledGaussianRdpCurve(sampling_rate, noise_multiplier, orders));
  VIPSD_ASSIGN_OR_RETURN(auto best, HalfDeltaEpsilon(orders, curve, horizon_steps, delta));
  const double peak = best.order;
  const size_t n = orders.size();
  std::vector<size_t> near;
  size_t peak_index = 0;
  for (size_t i = 0; i < n; ++i) {
    if (orders[i] == peak) {
      peak_index = i;
    } else if (orders[i] >= peak / 2 && orders[i] <= peak * 2) {
      near.push_back(i);
    }
  }
  FilterWeights weights(n, 0.25 / static_cast<double>(n));
  weights[peak_index] += near.empty() ? 0.75 : 0.5;
  for (size_t i : near) weights[i] += 0.25 / static_cast<double>(near.size());
  for (double& weight : weights) weight *= kShrink;
  VIPSD_RETURN_IF_ERROR(ValidateFilterWeights(weights, n));
  return weights;
}

StatusOr<FilterWeights> DesignFilterWeights(double sampling_rate, double noise_multiplier,
                                            double delta, double epsilon_ceiling,
                                            int64_t window_steps) {
  if (window_steps < 0) return InvalidArgumentError("the window must be >= 0 steps");
  int64_t horizon = window_steps;
  if (horizon == 0) {
    VIPSD_ASSIGN_OR_RETURN(horizon, FilterHorizonForCeiling(sampling_rate, noise_multiplier,
                                                            delta, epsilon_ceiling));
  }
  return ConcentratedFilterWeights(DefaultRdpOrders(), sampling_rate, noise_multiplier, delta,
                                   horizon);
}

Status ValidateFilterWeights(std::span<const double> weights, size_t num_orders) {
  if (weights.empty()) return Status::Ok();
  if (weights.size() != num_orders) {
    return InvalidArgumentError("filter weights: " + std::to_string(weights.size()) +
                                " weights for " + std::to_string(num_orders) + " orders");
  }
  double sum = 0;
  for (double weight : weights) {
    if (!(weight > 0 && weight <= 1) || !std::isfinite(weight)) {
      return InvalidArgumentError("filter weights: every weight must be in (0, 1]");
    }
    sum += weight;
  }
  // Rounding of this sum is at most n·2^-53 relative; require a margin.
  if (!(sum <= 1.0 - static_cast<double>(num_orders) * 0x1p-52)) {
    return InvalidArgumentError("filter weights: they sum to more than 1 (δ would be overspent)");
  }
  return Status::Ok();
}

double PeakFilterOrder(std::span<const double> orders, std::span<const double> weights) {
  if (weights.empty() || weights.size() != orders.size()) return 0;
  return orders[static_cast<size_t>(std::max_element(weights.begin(), weights.end()) -
                                    weights.begin())];
}

std::string SerializeFilterWeights(std::span<const double> orders,
                                   std::span<const double> weights) {
  std::ostringstream out;
  out << kMagic << " " << kFormatVersion << "\n";
  out << "orders " << weights.size() << "\n";
  for (size_t i = 0; i < weights.size() && i < orders.size(); ++i) {
    out << HexDouble(orders[i]) << " " << HexDouble(weights[i]) << "\n";
  }
  out << "end\n";
  return out.str();
}

StatusOr<FilterWeights> DeserializeFilterWeights(std::string_view text,
                                                 std::span<const double> orders) {
  std::istringstream in{std::string(text)};
  std::string magic, word;
  int version = 0;
  if (!(in >> magic >> version) || magic != kMagic) {
    return DataLossError("filter weights: missing 'vipsd-filter-weights' header");
  }
  if (version != kFormatVersion) {
    return DataLossError("filter weights: unsupported format version " + std::to_string(version));
  }
  size_t count = 0;
  if (!(in >> word >> count) || word != "orders" || count != orders.size()) {
    return DataLossError("filter weights: the order count does not match the accountant's (" +
                         std::to_string(orders.size()) + ")");
  }
  FilterWeights weights(count);
  for (size_t i = 0; i < count; ++i) {
    std::string order_text, weight_text;
    double order = 0;
    if (!(in >> order_text >> weight_text) || !ParseHexDouble(order_text, &order) ||
        !ParseHexDouble(weight_text, &weights[i])) {
      return DataLossError("filter weights: bad line " + std::to_string(i + 1));
    }
    if (order != orders[i]) {
      return DataLossError("filter weights: order " + std::to_string(i + 1) +
                           " differs from the accountant's");
    }
  }
  if (!(in >> word) || word != "end" || (in >> word)) {
    return DataLossError("filter weights: missing 'end' or data after it");
  }
  const Status valid = ValidateFilterWeights(weights, orders.size());
  if (!valid.ok()) return DataLossError(std::string(valid.message()));
  return weights;
}

}  // namespace vipsd::privacy
