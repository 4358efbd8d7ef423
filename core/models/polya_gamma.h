// The Pólya-Gamma mean shared by the models that use PG augmentation
// (Bayesian logistic regression, the sigmoid belief network).
//
// E[ω] for ω ~ PG(1, c): tanh(c/2) / (2c) (Polson, Scott, Windle 2013,
// Section 3), evaluated for |c| (the PG(1, c) law depends on |c| only). For
// |c| < 1e-3 the Taylor series ¼(1 − c²/12 + c⁴/120) is used (truncation
// error below 1e-20 relative), so c = 0 gives exactly ¼. The result is
// clamped to [0, ¼] against rounding — the statistic bounds of both models
// rely on ⟨ω⟩ ≤ ¼ —; +inf gives 0, NaN gives ¼ (the bound-safe value; the
// E-steps never pass NaN). Pure and thread-safe.
#pragma once

namespace vipsd::models {

double PolyaGammaMean(double c);

}  // namespace vipsd::models
