#include "core/privacy/accounting/rdp_accountant.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <utility>

#include "core/base/format.h"
#include "core/privacy/accounting/filter_weights.h"

namespace vipsd::privacy {
namespace {

constexpr std::string_view kMagic = "vipsd-rdp-accountant";
constexpr int kFormatVersion = 1;

Status ValidateSteps(int64_t steps) {
  if (steps < 1) return InvalidArgumentError("steps must be >= 1");
  return Status::Ok();
}

}  // namespace

StatusOr<EpsilonAtOrder> ConvertForAdaptivity(std::span<const double> orders,
                                              std::span<const double> rdp, double delta,
                                              RdpConversion conversion, Adaptivity adaptivity,
                                              std::span<const double> filter_weights) {
  if (adaptivity == Adaptivity::kFixedSchedule) {
    return EpsilonFromRdp(orders, rdp, delta, conversion);
  }
  return EpsilonFromRdpFilter(orders, rdp, delta, filter_weights, conversion);
}

Status RdpAccountant::SetFilterWeights(std::vector<double> weights) {
  VIPSD_RETURN_IF_ERROR(ValidateFilterWeights(weights, orders_.size()));
  filter_weights_ = std::move(weights);
  return Status::Ok();
}

RdpAccountant::RdpAccountant()
    : RdpAccountant(DefaultRdpOrders(),
                    std::vector<double>(DefaultRdpOrders().size(), 0.0), 0) {}

RdpAccountant::RdpAccountant(std::vector<double> orders, std::vector<double> rdp,
                             int64_t steps)
    : orders_(std::move(orders)), rdp_(std::move(rdp)), steps_(steps) {}

StatusOr<RdpAccountant> RdpAccountant::Create(std::vector<double> orders) {
  if (orders.empty()) return InvalidArgumentError("the order list is empty");
  for (double order : orders) {
    if (!(order > 1.0) || !std::isfinite(order)) {
      return InvalidArgumentError("every Rényi order must be finite and > 1");
    }
  }
  std::sort(orders.begin(), orders.end());
  if (std::adjacent_find(orders.begin(), orders.end()) != orders.end()) {
    return InvalidArgumentError("the order list has duplicates");
  }
  const size_t n = orders.size();
  return RdpAccountant(std::move(orders), std::vector<double>(n, 0.0), 0);
}

StatusOr<std::vector<double>> RdpAccountant::StepCurve(const SampledGaussian& step) const {
  for (size_t i = 0; i < curve_cache_.size(); ++i) {
    if (curve_cache_[i].step == step) {
      std::rotate(curve_cache_.begin() + i, curve_cache_.begin() + i + 1,
                  curve_cache_.end());
      return curve_cache_.back().curve;
    }
  }
  VIPSD_ASSIGN_OR_RETURN(auto curve, SampledGaussianRdpCurve(step.sampling_rate,
                                                            step.noise_multiplier, orders_));
  if (curve_cache_.size() == kCurveCacheSize) curve_cache_.erase(curve_cache_.begin());
  curve_cache_.push_back({step, curve});
  return curve;
}

Status RdpAccountant::Compose(const SampledGaussian& step, int64_t steps) {
  VIPSD_RETURN_IF_ERROR(ValidateSteps(steps));
  if (steps_ > std::numeric_limits<int64_t>::max() - steps) {
    return OutOfRangeError("step counter would overflow");
  }
  VIPSD_ASSIGN_OR_RETURN(auto curve, StepCurve(step));
  for (size_t i = 0; i < rdp_.size(); ++i) {
    rdp_[i] += curve[i] * static_cast<double>(steps);
  }
  steps_ += steps;
  return Status::Ok();
}

StatusOr<EpsilonAtOrder> RdpAccountant::GetEpsilon(double delta,
                                                   RdpConversion conversion,
                                                   Adaptivity adaptivity) const {
  if (!(delta > 0.0 && delta < 1.0)) {
    return InvalidArgumentError("delta must be in (0, 1)");
  }
  // Nothing composed: nothing spent (the conversion's constant terms would
  // otherwise report a tiny positive ε at the largest orders).
  if (steps_ == 0) return EpsilonAtOrder{0.0, orders_.back()};
  return ConvertForAdaptivity(orders_, rdp_, delta, conversion, adaptivity, filter_weights_);
}

StatusOr<DeltaAtOrder> RdpAccountant::GetDelta(double epsilon,
                                               RdpConversion conversion) const {
  return DeltaFromRdp(orders_, rdp_, epsilon, conversion);
}

StatusOr<EpsilonAtOrder> RdpAccountant::EpsilonIfComposed(
    const SampledGaussian& step, int64_t steps, double delta, RdpConversion conversion,
    Adaptivity adaptivity) const {
  VIPSD_RETURN_IF_ERROR(ValidateSteps(steps));
  VIPSD_ASSIGN_OR_RETURN(auto curve, StepCurve(step));
  for (size_t i = 0; i < curve.size(); ++i) {
    curve[i] = rdp_[i] + curve[i] * static_cast<double>(steps);
  }
  if (!(delta > 0.0 && delta < 1.0)) {
    return InvalidArgumentError("delta must be in (0, 1)");
  }
  return ConvertForAdaptivity(orders_, curve, delta, conversion, adaptivity, filter_weights_);
}

StatusOr<CeilingCheck> RdpAccountant::CheckCeiling(
    const SampledGaussian& step, int64_t steps, const EpsilonDelta& ceiling,
    RdpConversion conversion, Adaptivity adaptivity) const {
  if (!(ceiling.epsilon > 0.0) || !std::isfinite(ceiling.epsilon)) {
    return InvalidArgumentError("epsilon ceiling must be finite and > 0");
  }
  VIPSD_ASSIGN_OR_RETURN(auto after,
                         EpsilonIfComposed(step, steps, ceiling.delta, conversion, adaptivity));
  return CeilingCheck{after.epsilon > ceiling.epsilon, after.epsilon, after.order};
}

std::string RdpAccountant::Serialize() const {
  std::ostringstream out;
  out << kMagic << " " << kFormatVersion << "\n";
  out << "steps " << steps_ << "\n";
  out << "orders " << orders_.size() << "\n";
  for (size_t i = 0; i < orders_.size(); ++i) {
    out << HexDouble(orders_[i]) << " " << HexDouble(rdp_[i]) << "\n";
  }
  out << "end\n";
  return out.str();
}

StatusOr<RdpAccountant> RdpAccountant::Deserialize(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string magic, word;
  int version = 0;
  if (!(in >> magic >> version) || magic != kMagic) {
    return DataLossError("accountant state: missing 'vipsd-rdp-accountant' header");
  }
  if (version != kFormatVersion) {
    return DataLossError("accountant state: unsupported format version " +
                         std::to_string(version) + " (this build reads version " +
                         std::to_string(kFormatVersion) + ")");
  }
  int64_t steps = -1;
  if (!(in >> word >> steps) || word != "steps" || steps < 0) {
    return DataLossError("accountant state: bad 'steps' line");
  }
  size_t count = 0;
  if (!(in >> word >> count) || word != "orders" || count == 0 || count > 100000) {
    return DataLossError("accountant state: bad 'orders' line");
  }
  std::vector<double> orders(count), rdp(count);
  for (size_t i = 0; i < count; ++i) {
    std::string order_token, rdp_token;
    if (!(in >> order_token >> rdp_token) || !ParseHexDouble(order_token, &orders[i]) ||
        !ParseHexDouble(rdp_token, &rdp[i], NonFinite::kAllowInfinity)) {
      return DataLossError("accountant state: bad entry " + std::to_string(i));
    }
    if (!(orders[i] > 1.0) || !std::isfinite(orders[i]) || !(rdp[i] >= 0.0)) {
      return DataLossError("accountant state: out-of-range entry " + std::to_string(i));
    }
    if (i > 0 && !(orders[i] > orders[i - 1])) {
      return DataLossError("accountant state: orders not strictly increasing");
    }
  }
  if (!(in >> word) || word != "end") {
    return DataLossError("accountant state: missing 'end' (truncated?)");
  }
  if (in >> word) return DataLossError("accountant state: trailing data after 'end'");
  return RdpAccountant(std::move(orders), std::move(rdp), steps);
}

}  // namespace vipsd::privacy
