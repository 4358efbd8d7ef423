// The empirical privacy audit's statistic, shared by privacy_audit_test (one
// step of the whole SVI pipeline) and federated_audit_test (one federated
// step from the aggregator's side).
//
// `score(with_canary)` runs one trial on D (+ canary) and returns the
// distinguisher's statistic. `calibration` trials per pool choose a
// threshold (the one maximising the estimate of ln(TPR/FPR), counting at
// least one false positive); `evaluation` fresh trials per pool give
// Clopper–Pearson bounds (95 % each side) and
//     ε_lb = ln((TPR_low − δ) / FPR_high),
// a lower bound on the ε of any (ε, δ) guarantee the trials satisfy.
#pragma once

#include <algorithm>
#include <boost/math/special_functions/beta.hpp>
#include <cmath>
#include <functional>
#include <vector>

namespace vipsd::testing {

inline double ClopperPearsonUpper(int successes, int trials, double alpha) {
  if (successes >= trials) return 1.0;
  return boost::math::ibeta_inv(successes + 1.0, static_cast<double>(trials - successes),
                                1.0 - alpha);
}

inline double ClopperPearsonLower(int successes, int trials, double alpha) {
  if (successes <= 0) return 0.0;
  return boost::math::ibeta_inv(static_cast<double>(successes),
                                static_cast<double>(trials - successes) + 1.0, alpha);
}

struct AuditResult {
  double epsilon_lb = 0;
  double threshold = 0;
  double fpr_high = 0;
  double tpr_low = 0;
};

inline AuditResult AuditEpsilonLowerBound(const std::function<double(bool)>& score,
                                          int calibration, int evaluation, double delta) {
  std::vector<double> calibration_out, calibration_in, evaluation_out, evaluation_in;
  for (int i = 0; i < calibration; ++i) {
    calibration_out.push_back(score(false));
    calibration_in.push_back(score(true));
  }
  for (int i = 0; i < evaluation; ++i) {
    evaluation_out.push_back(score(false));
    evaluation_in.push_back(score(true));
  }
  std::sort(calibration_out.begin(), calibration_out.end());
  double best = -1e300, threshold = 0;
  for (double t : calibration_in) {
    const auto fp = static_cast<double>(
        calibration_out.end() -
        std::upper_bound(calibration_out.begin(), calibration_out.end(), t));
    const auto tp = static_cast<double>(std::count_if(
        calibration_in.begin(), calibration_in.end(), [&](double x) { return x > t; }));
    const double estimate = std::log((tp + 0.5) / (fp + 1.0));
    if (estimate > best) {
      best = estimate;
      threshold = t;
    }
  }
  const int fp = static_cast<int>(std::count_if(evaluation_out.begin(), evaluation_out.end(),
                                                [&](double x) { return x > threshold; }));
  const int tp = static_cast<int>(std::count_if(evaluation_in.begin(), evaluation_in.end(),
                                                [&](double x) { return x > threshold; }));
  AuditResult result;
  result.threshold = threshold;
  result.fpr_high = ClopperPearsonUpper(fp, evaluation, 0.025);
  result.tpr_low = ClopperPearsonLower(tp, evaluation, 0.025);
  result.epsilon_lb =
      result.tpr_low > delta ? std::log((result.tpr_low - delta) / result.fpr_high) : 0.0;
  return result;
}

}  // namespace vipsd::testing
