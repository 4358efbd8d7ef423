#include "core/privacy/accounting/residency_accountant.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/base/format.h"
#include "core/privacy/accounting/filter_weights.h"

namespace vipsd::privacy {
namespace {

constexpr size_t kCurveCacheSize = 8;

// Step counters stay at most 2^53 (exact as doubles; far from int64
// overflow), the bound every ledger counter obeys (daemon/state/ledger.h).
constexpr int64_t kMaxSteps = int64_t{1} << 53;

Status ValidateResidency(int64_t max_residency_steps) {
  if (max_residency_steps < 1 || max_residency_steps > kMaxSteps) {
    return InvalidArgumentError("max_residency_steps (M) must be in [1, 2^53]");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ResidencyAccountant> ResidencyAccountant::Create(int64_t max_residency_steps) {
  return Create(max_residency_steps, DefaultRdpOrders());
}

StatusOr<ResidencyAccountant> ResidencyAccountant::Create(int64_t max_residency_steps,
                                                          std::vector<double> orders) {
  VIPSD_RETURN_IF_ERROR(ValidateResidency(max_residency_steps));
  // Reuse RdpAccountant's validation of the order grid.
  VIPSD_ASSIGN_OR_RETURN(RdpAccountant probe, RdpAccountant::Create(orders));
  return ResidencyAccountant(max_residency_steps, probe.orders());
}

StatusOr<CeilingCheck> ResidencyAccountant::CheckConfiguration(
    int64_t max_residency_steps, const SampledGaussian& step, const EpsilonDelta& ceiling,
    Adaptivity adaptivity, std::span<const double> filter_weights) {
  if (filter_weights.empty()) {
    return CheckConfiguration(max_residency_steps, step, ceiling, adaptivity, DefaultRdpOrders(),
                              filter_weights);
  }
  const std::optional<RdpOrderGrid> grid = RdpOrderGridWithCount(filter_weights.size());
  if (!grid.has_value()) {
    return InvalidArgumentError("filter weights: no order grid has " +
                                std::to_string(filter_weights.size()) + " orders");
  }
  return CheckConfiguration(max_residency_steps, step, ceiling, adaptivity, RdpOrders(*grid),
                            filter_weights);
}

StatusOr<CeilingCheck> ResidencyAccountant::CheckConfiguration(
    int64_t max_residency_steps, const SampledGaussian& step, const EpsilonDelta& ceiling,
    Adaptivity adaptivity, std::span<const double> orders,
    std::span<const double> filter_weights) {
  VIPSD_RETURN_IF_ERROR(ValidateResidency(max_residency_steps));
  VIPSD_ASSIGN_OR_RETURN(RdpAccountant fresh,
                         RdpAccountant::Create(std::vector<double>(orders.begin(), orders.end())));
  VIPSD_RETURN_IF_ERROR(
      fresh.SetFilterWeights(std::vector<double>(filter_weights.begin(), filter_weights.end())));
  return fresh.CheckCeiling(step, max_residency_steps, ceiling, RdpConversion::kImproved,
                            adaptivity);
}

StatusOr<const std::vector<double>*> ResidencyAccountant::Curve(const SampledGaussian& step) {
  for (auto it = curve_cache_.begin(); it != curve_cache_.end(); ++it) {
    if (it->step == step) {
      if (std::next(it) != curve_cache_.end()) {
        CachedCurve hit = std::move(*it);
        curve_cache_.erase(it);
        curve_cache_.push_back(std::move(hit));
      }
      return &curve_cache_.back().curve;
    }
  }
  VIPSD_ASSIGN_OR_RETURN(auto curve,
                         SampledGaussianRdpCurve(step.sampling_rate, step.noise_multiplier,
                                                 orders_));
  if (curve_cache_.size() >= kCurveCacheSize) curve_cache_.erase(curve_cache_.begin());
  curve_cache_.push_back({step, std::move(curve)});
  return &curve_cache_.back().curve;
}

StatusOr<CeilingCheck> ResidencyAccountant::CheckCeiling(const SampledGaussian& step,
                                                         const EpsilonDelta& ceiling,
                                                         Adaptivity adaptivity) {
  if (!(ceiling.epsilon > 0.0) || !std::isfinite(ceiling.epsilon)) {
    return InvalidArgumentError("epsilon ceiling must be finite and > 0");
  }
  if (!(ceiling.delta > 0.0 && ceiling.delta < 1.0)) {
    return InvalidArgumentError("delta must be in (0, 1)");
  }
  VIPSD_ASSIGN_OR_RETURN(const std::vector<double>* next, Curve(step));
  std::vector<double> window = *next;
  for (const Segment& segment : window_) {
    VIPSD_ASSIGN_OR_RETURN(const std::vector<double>* curve,
                           Curve(segment.step));
    for (size_t i = 0; i < window.size(); ++i) {
      window[i] += (*curve)[i] * static_cast<double>(segment.count);
    }
  }
  VIPSD_ASSIGN_OR_RETURN(auto at_order,
                         ConvertForAdaptivity(orders_, window, ceiling.delta,
                                              RdpConversion::kImproved,
                                              adaptivity, filter_weights_));
  CeilingCheck check;
  check.epsilon_after = at_order.epsilon;
  check.order = at_order.order;
  check.would_exceed = !(at_order.epsilon <= ceiling.epsilon);
  return check;
}

Status ResidencyAccountant::SetFilterWeights(std::vector<double> weights) {
  VIPSD_RETURN_IF_ERROR(ValidateFilterWeights(weights, orders_.size()));
  filter_weights_ = std::move(weights);
  return Status::Ok();
}

Status ResidencyAccountant::RecordStep(const SampledGaussian& step, double window_epsilon) {
  if (const Status valid = ValidateSampledGaussian(step, /*require_noise=*/true); !valid.ok()) {
    return InvalidArgumentError("RecordStep: " + std::string(valid.message()));
  }
  if (!(window_epsilon >= 0) || !std::isfinite(window_epsilon)) {
    return InvalidArgumentError("RecordStep needs a finite window epsilon >= 0");
  }
  if (!window_.empty() && window_.back().step == step) {
    ++window_.back().count;
  } else {
    window_.push_back({step, 1});
  }
  ++steps_;
  worst_epsilon_ = std::max(worst_epsilon_, window_epsilon);
  TrimWindow();
  return Status::Ok();
}

void ResidencyAccountant::TrimWindow() {
  int64_t total = 0;
  for (const Segment& segment : window_) total += segment.count;
  int64_t excess = total - (max_residency_steps_ - 1);
  while (excess > 0 && !window_.empty()) {
    Segment& oldest = window_.front();
    const int64_t drop = std::min(excess, oldest.count);
    oldest.count -= drop;
    excess -= drop;
    if (oldest.count == 0) window_.pop_front();
  }
}

Status ResidencyAccountant::SetMaxResidencySteps(int64_t max_residency_steps) {
  VIPSD_RETURN_IF_ERROR(ValidateResidency(max_residency_steps));
  if (max_residency_steps > max_residency_steps_) {
    return InvalidArgumentError(
        "max_residency_steps can only be lowered while the ledger exists (from " +
        std::to_string(max_residency_steps_) + " to " + std::to_string(max_residency_steps) +
        " was asked): the steps before the current window are not kept");
  }
  max_residency_steps_ = max_residency_steps;
  TrimWindow();
  return Status::Ok();
}

std::string ResidencyAccountant::Serialize() const {
  std::ostringstream out;
  out << "residency-accountant 1\n";
  out << "max_residency_steps " << max_residency_steps_ << "\n";
  out << "steps " << steps_ << "\n";
  out << "worst_epsilon " << HexDouble(worst_epsilon_) << "\n";
  out << "orders " << orders_.size();
  for (double order : orders_) out << " " << HexDouble(order);
  out << "\nsegments " << window_.size() << "\n";
  for (const Segment& segment : window_) {
    out << HexDouble(segment.step.sampling_rate) << " " << HexDouble(segment.step.noise_multiplier)
        << " " << segment.count << "\n";
  }
  out << "end\n";
  return out.str();
}

StatusOr<ResidencyAccountant> ResidencyAccountant::Deserialize(std::string_view text) {
  std::istringstream in{std::string(text)};
  auto bad = [](const std::string& what) {
    return DataLossError("residency accountant state: " + what);
  };
  std::string word, token;
  int version = 0;
  if (!(in >> word >> version) || word != "residency-accountant" || version != 1) {
    return bad("bad header");
  }
  int64_t max_residency = 0, steps = 0;
  if (!(in >> word >> max_residency) || word != "max_residency_steps" || max_residency < 1 ||
      max_residency > kMaxSteps) {
    return bad("bad max_residency_steps line (must be in [1, 2^53])");
  }
  if (!(in >> word >> steps) || word != "steps" || steps < 0 || steps > kMaxSteps) {
    return bad("bad steps line (must be in [0, 2^53])");
  }
  double worst = 0;
  if (!(in >> word >> token) || word != "worst_epsilon" || !ParseHexDouble(token, &worst) ||
      worst < 0) {
    return bad("bad worst_epsilon line");
  }
  size_t num_orders = 0;
  if (!(in >> word >> num_orders) || word != "orders" || num_orders == 0 ||
      num_orders > 100000) {
    return bad("bad orders line");
  }
  std::vector<double> orders(num_orders);
  for (double& order : orders) {
    if (!(in >> token) || !ParseHexDouble(token, &order)) return bad("bad order value");
  }
  auto created = Create(max_residency, orders);
  if (!created.ok()) return bad(created.status().message());
  ResidencyAccountant accountant = std::move(*created);
  size_t num_segments = 0;
  if (!(in >> word >> num_segments) || word != "segments" ||
      num_segments > static_cast<size_t>(max_residency)) {
    return bad("bad segments line");
  }
  int64_t in_window = 0;
  for (size_t i = 0; i < num_segments; ++i) {
    std::string q_text, sigma_text;
    Segment segment{};
    if (!(in >> q_text >> sigma_text >> segment.count) ||
        !ParseHexDouble(q_text, &segment.step.sampling_rate) ||
        !ParseHexDouble(sigma_text, &segment.step.noise_multiplier) ||
        !ValidateSampledGaussian(segment.step, /*require_noise=*/true).ok() || segment.count < 1 ||
        segment.count > max_residency) {
      return bad("bad segment " + std::to_string(i));
    }
    // Each count is at most M <= 2^53 and there are at most M segments, but
    // their sum is compared before it is formed so that it cannot overflow.
    if (segment.count > max_residency - 1 - in_window) {
      return bad("the window holds more steps than M - 1");
    }
    in_window += segment.count;
    accountant.window_.push_back(segment);
  }
  if (in_window > max_residency - 1 || in_window > steps) {
    return bad("the window holds more steps than M - 1 or than were recorded");
  }
  if (!(in >> word) || word != "end") return bad("missing end line");
  if (in >> word) return bad("trailing data after end");
  accountant.steps_ = steps;
  accountant.worst_epsilon_ = worst;
  return accountant;
}

}  // namespace vipsd::privacy
