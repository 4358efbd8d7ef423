// An empirical privacy audit of the whole step: Poisson sampling, the
// model's E-step, clipping, one Gaussian mechanism and the M-step
// (svi::StepDriver), for LDA and Bayesian logistic regression.
//
// Two neighbouring pools, D and D + canary, where the canary is chosen to
// saturate (LDA: exceed and be clipped to) its statistic's bound in a
// coordinate no other record touches. The step runs many times on each; a
// distinguisher reads the canary's coordinate from the released model
// (post-processing, as an attacker of the release topic would). Its false
// and true positive rates at a threshold chosen on a calibration half give,
// on the evaluation half with Clopper–Pearson bounds (95 % each side), an
// empirical lower bound
//     ε_lb = ln((TPR_low − δ) / FPR_high)
// that a correct mechanism keeps below the accountant's ε for one step.
//
// The same source is built twice (tests/CMakeLists.txt):
//   * privacy_audit_test: the production code; asserts ε_lb < ε claimed;
//   * privacy_audit_no_clip_test: with core/privacy/mechanisms/block_layout.cc and
//     core/models/blr.cc compiled with VIPSD_AUDIT_BUILD_WITHOUT_CLIPPING,
//     which removes clipping and BLR's ||x|| <= 1 refusal (the two places
//     that enforce the bounds); asserts ε_lb > ε claimed — the audit is
//     strong enough to catch a mechanism that does not bound its input;
//   * privacy_audit_per_record_unit_test: with core/svi/step_driver.cc
//     compiled with VIPSD_AUDIT_BUILD_PER_RECORD_UNIT_CLIPPING, which clips
//     each record of a unit on its own instead of the unit's sum; the unit
//     test asserts ε_lb > ε claimed there (the record tests pass as in
//     production).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/models/blr.h"
#include "core/models/lda.h"
#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/svi/step_driver.h"
#include "core/svi/step_randomness.h"
#include "tests/testing/privacy_audit.h"

namespace vipsd {
namespace {

constexpr double kDelta = 1e-5;
constexpr double kSigma = 2.0;
constexpr int kCalibration = 1500;  // trials per pool for choosing the threshold
constexpr int kEvaluation = 3000;   // trials per pool for the bound

// ε of one step at (q = 1, σ), fixed schedule, improved conversion: the
// daemon's claim for a single release.
double ClaimedEpsilon() {
  privacy::RdpAccountant accountant;
  EXPECT_TRUE(accountant.Compose({1.0, kSigma}, 1).ok());
  auto spent = accountant.GetEpsilon(kDelta, privacy::RdpConversion::kImproved,
                                     privacy::Adaptivity::kFixedSchedule);
  EXPECT_TRUE(spent.ok());
  return spent->epsilon;
}

using testing::AuditResult;

// `score(with_canary)` runs one step on D (+ canary) and returns the
// distinguisher's statistic.
AuditResult Audit(const std::function<double(bool)>& score) {
  return testing::AuditEpsilonLowerBound(score, kCalibration, kEvaluation, kDelta);
}

void Report(const char* model, const AuditResult& result, double claimed) {
  std::printf("privacy audit %s: epsilon_lb=%.3f (threshold %.4g, TPR >= %.4f, FPR <= %.5f) "
              "claimed epsilon=%.3f (q=1, sigma=%.1f, delta=%.0e, one step)\n",
              model, result.epsilon_lb, result.threshold, result.tpr_low, result.fpr_high,
              claimed, kSigma, kDelta);
}

// One step, q = 1, σ = kSigma, charged but never refused (the audit runs
// thousands of them).
svi::DriverConfig AuditDriver() {
  svi::DriverConfig driver;
  driver.mechanism.sampling_rate = 1.0;
  driver.mechanism.noise_multiplier = kSigma;
  driver.delta = kDelta;
  driver.epsilon_ceiling = 1e9;
  driver.enforce_ceiling = false;
  return driver;
}

// D for the BLR audits: 12 records with x in dimensions 0 and 1 (d = 3),
// record i of unit "unit-i" (read only by the unit-level step).
std::vector<model::Record> BlrPool() {
  std::vector<model::Record> pool;
  for (int i = 0; i < 12; ++i) {
    model::Record record;
    const double angle = 0.5 * i;
    record.features = {0.7 * std::cos(angle), 0.7 * std::sin(angle), 0.0};
    record.label = i % 2;
    record.unit = svi::UnitDigest("unit-" + std::to_string(i));
    pool.push_back(record);
  }
  return pool;
}

// The one-step BLR audit of `pool` against `with_canary`: the distinguisher
// reads h = Σ⁻¹μ's coordinate 2 after the step, which is affine in the
// noisy s1 sum there (only the canary touches dimension 2).
AuditResult AuditBlr(const std::vector<model::Record>& pool,
                     const std::vector<model::Record>& with_canary,
                     const svi::DriverConfig& driver) {
  models::BlrConfig config;
  config.dim = 3;
  auto model = models::BlrModel::Create(config);
  EXPECT_TRUE(model.ok());
  const std::vector<model::NamedArray> initial = (*model)->CheckpointArrays();
  auto noise = privacy::SecureNoiseSource::Create();
  EXPECT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;
  size_t precision_mean = 0;
  for (size_t i = 0; i < initial.size(); ++i) {
    if (initial[i].name == "precision_mean") precision_mean = i;
  }
  return Audit([&](bool canary_in) {
    EXPECT_TRUE((*model)->RestoreCheckpoint(initial).ok());
    auto step = svi::StepDriver::Create(model->get(), noise->get(), &accountant, driver);
    EXPECT_TRUE(step.ok());
    EXPECT_TRUE((*step)->Step(canary_in ? with_canary : pool).ok());
    return (*model)->CheckpointArrays().at(precision_mean).data[2];
  });
}

#ifdef VIPSD_AUDIT_BUILD_WITHOUT_CLIPPING
constexpr bool kClippingDisabled = true;
#else
constexpr bool kClippingDisabled = false;
#endif

TEST(PrivacyAuditTest, TheBuildClipsExactlyWhenItShould) {
  // Guards the audit itself: the production build clips, the test-only
  // build does not (so the "violation" test really runs without clipping).
  std::vector<double> big = {30.0, 40.0};
  const bool clipped = privacy::ClipToL2Bound(big, 1.0);
  EXPECT_EQ(clipped, !kClippingDisabled);
  EXPECT_EQ(big[0] == 30.0, kClippingDisabled);
}

TEST(PrivacyAuditTest, LdaStepAgainstASaturatingCanaryDocument) {
  // K = 2 topics, V = 8 words; D uses words 0..6, the canary is N copies of
  // word 7: its statistic (norm >= N / sqrt(K)) exceeds C = a·N and is
  // clipped to C in column 7, where no other record contributes.
  models::LdaConfig config;
  config.num_topics = 2;
  config.vocabulary_size = 8;
  config.alpha = 0.5;
  config.eta = 0.1;
  config.resample_length = 20;
  config.clip_fraction = 0.1;
  config.init_seed = 3;
  auto model = models::LdaModel::Create(config);
  ASSERT_TRUE(model.ok());
  const std::vector<model::NamedArray> initial = (*model)->CheckpointArrays();
  std::vector<model::Record> pool;
  for (int d = 0; d < 12; ++d) {
    model::Record record;
    for (int n = 0; n < 6; ++n) record.word_ids.push_back((d + n) % 7);
    pool.push_back(record);
  }
  std::vector<model::Record> with_canary = pool;
  model::Record canary;
  canary.word_ids.assign(20, 7);
  with_canary.push_back(canary);
  auto noise = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;  // charged by every trial; never enforced here
  const svi::DriverConfig driver = AuditDriver();
  auto score = [&](bool canary_in) {
    EXPECT_TRUE((*model)->RestoreCheckpoint(initial).ok());
    auto step = svi::StepDriver::Create(model->get(), noise->get(), &accountant, driver);
    EXPECT_TRUE(step.ok());
    EXPECT_TRUE((*step)->Step(canary_in ? with_canary : pool).ok());
    // The released λ's column 7, summed over topics: increasing in the
    // (clamped) noisy sums of that column.
    const model::NamedArray lambda = (*model)->CheckpointArrays().at(0);
    return lambda.data[7] + lambda.data[8 + 7];
  };
  const AuditResult result = Audit(score);
  const double claimed = ClaimedEpsilon();
  Report("LDA", result, claimed);
  if (kClippingDisabled) {
    EXPECT_GT(result.epsilon_lb, claimed) << "the audit missed an unclipped canary";
  } else {
    EXPECT_LT(result.epsilon_lb, claimed);
  }
}

TEST(PrivacyAuditTest, LogisticRegressionStepAgainstASaturatingCanaryRecord) {
  // d = 3; D lives in dimensions 0 and 1, the canary is y = 1 with x along
  // dimension 2: with ||x|| = 1, the largest the model accepts,
  // s1 = (y - 1/2) x saturates its bound 1/2 there. The audit build without
  // bounds gets a canary with ||x|| = 10, which the production model refuses
  // and the production mechanism would clip.
  const std::vector<model::Record> pool = BlrPool();
  std::vector<model::Record> with_canary = pool;
  model::Record canary;
  canary.features = {0.0, 0.0, kClippingDisabled ? 10.0 : 1.0};
  canary.label = 1;
  with_canary.push_back(canary);
  const AuditResult result = AuditBlr(pool, with_canary, AuditDriver());
  const double claimed = ClaimedEpsilon();
  Report("BLR", result, claimed);
  if (kClippingDisabled) {
    EXPECT_GT(result.epsilon_lb, claimed) << "the audit missed an unbounded canary";
  } else {
    EXPECT_LT(result.epsilon_lb, claimed);
  }
}

#ifdef VIPSD_AUDIT_BUILD_PER_RECORD_UNIT_CLIPPING
constexpr bool kUnitClipsPerRecord = true;
#else
constexpr bool kUnitClipsPerRecord = false;
#endif

TEST(PrivacyAuditTest, UnitLevelStepAgainstACanaryUnitOfTwentySaturatingRecords) {
  // Unit-level privacy (DriverConfig::max_records_per_unit): D is 12 units
  // of one BLR record each in dimensions 0 and 1; the canary is ONE unit of
  // 20 records, each saturating s1's bound along dimension 2 (as the
  // record-level canary above). Its records' statistics are summed and
  // clipped as one vector, so the canary unit moves the release no more
  // than one saturating record does: ε_lb stays below the one-step ε. The
  // test-only build privacy_audit_per_record_unit_test clips each record of
  // a unit on its own (VIPSD_AUDIT_BUILD_PER_RECORD_UNIT_CLIPPING in
  // step_driver.cc): the canary then moves it 20 times as far, and the
  // audit must catch that.
  const std::vector<model::Record> pool = BlrPool();
  std::vector<model::Record> with_canary = pool;
  for (int i = 0; i < 20; ++i) {
    model::Record canary;
    canary.features = {0.0, 0.0, kClippingDisabled ? 10.0 : 1.0};
    canary.label = 1;
    canary.unit = svi::UnitDigest("canary");
    with_canary.push_back(canary);
  }
  svi::DriverConfig driver = AuditDriver();
  driver.max_records_per_unit = 20;
  const AuditResult result = AuditBlr(pool, with_canary, driver);
  const double claimed = ClaimedEpsilon();
  Report("BLR, a unit of 20 records", result, claimed);
  if (kClippingDisabled || kUnitClipsPerRecord) {
    EXPECT_GT(result.epsilon_lb, claimed) << "the audit missed a unit clipped per record";
  } else {
    EXPECT_LT(result.epsilon_lb, claimed);
  }
}

}  // namespace
}  // namespace vipsd
