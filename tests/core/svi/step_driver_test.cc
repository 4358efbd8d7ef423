#include "core/svi/step_driver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <map>

#include "core/models/lda.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::svi {
namespace {

models::LdaConfig Lda(int64_t resample_length) {
  models::LdaConfig config;
  config.num_topics = 4;
  config.vocabulary_size = 30;
  config.alpha = 0.25;
  config.eta = 0.1;
  config.resample_length = resample_length;
  config.init_seed = 3;
  return config;
}

std::vector<model::Record> Pool(size_t size, uint64_t seed = 9) {
  model::RecordRng rng(seed);
  std::vector<model::Record> pool(size);
  for (auto& record : pool) {
    record.word_ids.resize(5 + rng.Below(40));
    for (auto& id : record.word_ids) id = static_cast<int32_t>(rng.Below(30));
  }
  return pool;
}

DriverConfig Private(double ceiling = 100) {
  DriverConfig config;
  config.mechanism.sampling_rate = 0.2;
  config.mechanism.noise_multiplier = 1.5;
  config.tau0 = 1;
  config.kappa = 0.7;
  config.delta = 1e-5;
  config.epsilon_ceiling = ceiling;
  return config;
}

// Counts what the driver draws: a refused step must draw nothing.
class CountingNoise final : public privacy::NoiseSource {
 public:
  explicit CountingNoise(privacy::NoiseSource& inner) : inner_(inner) {}
  void FillStandardNormal(std::span<double> out) override {
    normals += out.size();
    inner_.FillStandardNormal(out);
  }
  Status FillDiscreteGaussian(const privacy::DiscreteGaussianSampler& sampler,
                              std::span<int64_t> out) override {
    normals += out.size();
    return inner_.FillDiscreteGaussian(sampler, out);
  }
  void FillUniformBits(std::span<uint64_t> out) override {
    bits += out.size();
    inner_.FillUniformBits(out);
  }
  bool is_private() const override { return inner_.is_private(); }
  std::string description() const override { return inner_.description(); }
  size_t normals = 0, bits = 0;

 private:
  privacy::NoiseSource& inner_;
};

TEST(StepDriverTest, ChargesTheAccountantExactlyOncePerStep) {
  auto model = models::LdaModel::Create(Lda(20));
  auto noise = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(model.ok() && noise.ok());
  privacy::RdpAccountant accountant;
  auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, Private());
  ASSERT_TRUE(driver.ok()) << driver.status().message();
  const auto pool = Pool(100);
  for (int t = 1; t <= 12; ++t) {
    auto result = (*driver)->Step(pool);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->outcome, StepResult::Outcome::kRan);
    EXPECT_EQ(result->step, t);
    EXPECT_DOUBLE_EQ(result->rho, std::pow(1.0 + t, -0.7));
    EXPECT_EQ(accountant.steps(), t);
  }
  // One charge per step, each at the step's own (q, sigma): the same sum of
  // twelve single-step curves, bit for bit.
  privacy::RdpAccountant expected;
  for (int t = 1; t <= 12; ++t) ASSERT_TRUE(expected.Compose({0.2, 1.5}, 1).ok());
  EXPECT_EQ(accountant.GetEpsilon(1e-5)->epsilon, expected.GetEpsilon(1e-5)->epsilon);
  // A thirteenth charge would show: twelve steps composed at once agree to
  // rounding, thirteen do not.
  privacy::RdpAccountant at_once;
  ASSERT_TRUE(at_once.Compose({0.2, 1.5}, 12).ok());
  EXPECT_NEAR(accountant.GetEpsilon(1e-5)->epsilon, at_once.GetEpsilon(1e-5)->epsilon, 1e-9);
  ASSERT_TRUE(at_once.Compose({0.2, 1.5}, 1).ok());
  EXPECT_GT(at_once.GetEpsilon(1e-5)->epsilon, accountant.GetEpsilon(1e-5)->epsilon + 1e-3);
}

TEST(StepDriverTest, AnAbandonedStepStaysChargedAndItsNumberIsNeverReused) {
  // Scale-out: a coordinator that charged a step but cannot finish it (it
  // stops, is fenced, a window does not fit) consumes the step's number, so
  // the ledger's step counter never falls below the accountant's step count
  // (which the ledger's loader refuses) and the number is never released.
  auto model = models::LdaModel::Create(Lda(20));
  auto noise = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(model.ok() && noise.ok());
  privacy::RdpAccountant accountant;
  auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, Private());
  ASSERT_TRUE(driver.ok());
  auto ticket = (*driver)->Begin();
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(accountant.steps(), 1);
  EXPECT_EQ((*driver)->next_step(), 1);  // charged, not finished
  (*driver)->Abandon(*ticket);
  EXPECT_EQ((*driver)->next_step(), 2);
  EXPECT_EQ(accountant.steps(), 1);
  (*driver)->Abandon(*ticket);  // not the current step any more: no-op
  EXPECT_EQ((*driver)->next_step(), 2);
  const auto pool = Pool(50);
  auto result = (*driver)->Step(pool);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->step, 2);
  EXPECT_EQ(accountant.steps(), 2);
  EXPECT_LE(accountant.steps(), (*driver)->next_step() - 1);
  // The abandoned ticket cannot be finished later.
  privacy::GaussianSumMechanism total((*model)->statistic_layout());
  EXPECT_FALSE((*driver)->Finish(*ticket, total).ok());
}

TEST(StepDriverTest, RefusesTheStepThatWouldCrossTheCeilingAndTouchesNothing) {
  auto model = models::LdaModel::Create(Lda(20));
  auto inner = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(model.ok() && inner.ok());
  CountingNoise noise(**inner);
  privacy::RdpAccountant accountant;
  auto driver = StepDriver::Create(model->get(), &noise, &accountant, Private(2.0));
  ASSERT_TRUE(driver.ok());
  const auto pool = Pool(50);
  int ran = 0;
  for (;;) {
    const Eigen::MatrixXd lambda = (*model)->lambda();
    const auto spent_before = accountant;
    const size_t normals = noise.normals, bits = noise.bits;
    auto result = (*driver)->Step(pool);
    ASSERT_TRUE(result.ok());
    if (result->outcome == StepResult::Outcome::kRefusedCeiling) {
      EXPECT_GT(result->epsilon_refused, 2.0);
      EXPECT_LE(result->epsilon_spent, 2.0);
      EXPECT_EQ(accountant, spent_before);
      EXPECT_EQ((*model)->lambda(), lambda);
      EXPECT_EQ(noise.normals, normals);
      EXPECT_EQ(noise.bits, bits);
      EXPECT_EQ((*driver)->next_step(), ran + 1);
      break;
    }
    EXPECT_LE(result->epsilon_spent, 2.0);
    ++ran;
    ASSERT_LT(ran, 100000);
  }
  EXPECT_GT(ran, 1);
  EXPECT_LE(accountant.GetEpsilon(1e-5)->epsilon, 2.0);
}

TEST(StepDriverTest, WithoutEnforcementEveryStepIsStillChargedButNoneRefused) {
  auto model = models::LdaModel::Create(Lda(20));
  auto noise = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(model.ok() && noise.ok());
  privacy::RdpAccountant accountant;
  DriverConfig config = Private(0.5);
  config.enforce_ceiling = false;  // the caller enforces another budget
  auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, config);
  ASSERT_TRUE(driver.ok());
  const auto pool = Pool(20);
  double last = 0;
  for (int t = 1; t <= 6; ++t) {
    auto result = (*driver)->Step(pool);
    ASSERT_TRUE(result.ok());
    ASSERT_EQ(result->outcome, StepResult::Outcome::kRan);
    EXPECT_EQ(accountant.steps(), t);
    EXPECT_GT(result->epsilon_spent, last);
    EXPECT_EQ(result->epsilon_spent, accountant.GetEpsilon(1e-5)->epsilon);
    last = result->epsilon_spent;
  }
  EXPECT_GT(last, 0.5);  // above the driver's ceiling: not the driver's to enforce
}

TEST(StepDriverTest, EmptyPoolIsStillAChargedNoisyStep) {
  auto model = models::LdaModel::Create(Lda(20));
  auto noise = privacy::SecureNoiseSource::CreateReproducible(4);
  ASSERT_TRUE(model.ok() && noise.ok());
  privacy::RdpAccountant accountant;
  auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, Private());
  ASSERT_TRUE(driver.ok());
  const Eigen::MatrixXd before = (*model)->lambda();
  auto result = (*driver)->Step(std::span<const model::Record>());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(accountant.steps(), 1);
  // Noise moved λ away from the noiseless update (1 − ρ)λ + ρ(η + 0).
  const double rho = result->rho;
  const Eigen::MatrixXd noiseless = ((1 - rho) * before.array() + rho * 0.1).matrix();
  EXPECT_GT(((*model)->lambda() - noiseless).cwiseAbs().maxCoeff(), 1e-3);
}

TEST(StepDriverTest, ResultDoesNotDependOnTheThreadCount) {
  // The pool is large enough for several 64-record accumulation chunks per
  // step, so chunks finish out of order when threads > 1.
  // Eight workers on 8 chunks: the merging worker hands chunks over often.
  const int thread_counts[] = {1, 2, 3, 8};
  Eigen::MatrixXd lambda[4];
  for (int i = 0; i < 4; ++i) {
    const int threads = thread_counts[i];
    auto model = models::LdaModel::Create(Lda(20));
    auto noise = privacy::SecureNoiseSource::CreateReproducible(77);
    ASSERT_TRUE(model.ok() && noise.ok());
    privacy::RdpAccountant accountant;
    DriverConfig config = Private();
    config.threads = threads;
    auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, config);
    ASSERT_TRUE(driver.ok());
    config.mechanism.sampling_rate = 0.5;
    ASSERT_TRUE((*driver)->Reconfigure(config).ok());
    const auto pool = Pool(1000);
    for (int t = 0; t < 5; ++t) ASSERT_TRUE((*driver)->Step(pool).ok());
    lambda[i] = (*model)->lambda();
  }
  EXPECT_EQ(lambda[0], lambda[1]);  // bit-for-bit
  EXPECT_EQ(lambda[0], lambda[2]);
  EXPECT_EQ(lambda[0], lambda[3]);
}

TEST(StepDriverTest, PhaseTimesSplitTheStep) {
  // Every phase is timed, and together they fit inside the Step() call.
  auto model = models::LdaModel::Create(Lda(20));
  auto noise = privacy::SecureNoiseSource::CreateReproducible(3);
  ASSERT_TRUE(model.ok() && noise.ok());
  privacy::RdpAccountant accountant;
  DriverConfig config = Private();
  config.mechanism.sampling_rate = 0.5;
  config.threads = 2;
  auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, config);
  ASSERT_TRUE(driver.ok());
  const auto pool = Pool(2000);
  const auto start = std::chrono::steady_clock::now();
  auto result = (*driver)->Step(pool);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(result.ok());
  const StepPhaseSeconds& p = result->phase_seconds;
  for (double seconds : {p.charge, p.sample, p.estep, p.noise, p.mstep}) EXPECT_GE(seconds, 0);
  EXPECT_GT(p.charge, 0);  // the accountant's RDP arithmetic
  EXPECT_GT(p.estep, 0);   // about 1000 documents
  EXPECT_GT(p.noise, 0);
  EXPECT_GT(p.mstep, 0);
  EXPECT_LE(p.charge + p.sample + p.estep + p.noise + p.mstep, wall);
}

TEST(StepDriverTest, AccumulatorsReusedAcrossStepsLeaveNoTrace) {
  // The driver keeps its accumulators from step to step. One driver for four
  // steps must give exactly what a fresh driver per step gives (same noise
  // stream, same step numbers), with one and with two threads.
  for (int threads : {1, 2}) {
    Eigen::MatrixXd lambda[2];
    for (int fresh : {0, 1}) {
      auto model = models::LdaModel::Create(Lda(20));
      auto noise = privacy::SecureNoiseSource::CreateReproducible(5);
      ASSERT_TRUE(model.ok() && noise.ok());
      privacy::RdpAccountant accountant;
      DriverConfig config = Private();
      config.mechanism.sampling_rate = 0.5;
      config.threads = threads;
      const auto pool = Pool(600);
      std::unique_ptr<StepDriver> driver;
      for (int64_t t = 1; t <= 4; ++t) {
        if (driver == nullptr || fresh == 1) {
          auto created = StepDriver::Create(model->get(), noise->get(), &accountant, config, t);
          ASSERT_TRUE(created.ok());
          driver = std::move(*created);
        }
        ASSERT_TRUE(driver->Step(pool).ok());
      }
      lambda[fresh] = (*model)->lambda();
    }
    EXPECT_EQ(lambda[0], lambda[1]) << threads << " threads";  // bit-for-bit
  }
}

TEST(StepDriverTest, PublicResultIsTheSameWhateverTheBatchSize) {
  // The step result carries only public values: pools of very different
  // sizes (so very different realised batches) give identical results.
  StepResult results[2];
  for (int i = 0; i < 2; ++i) {
    auto model = models::LdaModel::Create(Lda(20));
    auto noise = privacy::SecureNoiseSource::Create();
    privacy::RdpAccountant accountant;
    auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, Private());
    ASSERT_TRUE(driver.ok());
    results[i] = *(*driver)->Step(Pool(i == 0 ? 0 : 2000));
  }
  EXPECT_EQ(results[0].step, results[1].step);
  EXPECT_EQ(results[0].rho, results[1].rho);
  EXPECT_EQ(results[0].epsilon_spent, results[1].epsilon_spent);
  EXPECT_EQ(results[0].outcome, results[1].outcome);
}

// A probe model that counts E-step calls (i.e. sampled records).
class ProbeModel final : public model::Model {
 public:
  ProbeModel() : layout_(*privacy::BlockLayout::Create({{"x", privacy::BlockKind::kVector, 1, 1.0}})) {}
  std::string type() const override { return "probe"; }
  const privacy::BlockLayout& statistic_layout() const override { return layout_; }
  bool has_proven_bounds() const override { return true; }
  std::vector<std::pair<std::string, int64_t>> dimensions() const override { return {}; }
  std::unique_ptr<model::EStepScratch> NewScratch() const override {
    return std::make_unique<model::EStepScratch>();
  }
  Status EStep(const model::Record&, model::RecordRng&, model::EStepScratch&,
               model::SparseStatistic& out) const override {
    calls.fetch_add(1);
    out.indices = {0};
    out.values = {1.0};
    return Status::Ok();
  }
  Status MStep(const Eigen::VectorXd& sum, const privacy::SampledGaussian&, double) override {
    last_sum = sum[0];
    return Status::Ok();
  }
  std::vector<model::NamedArray> ReleaseArrays() const override { return {}; }
  std::vector<model::NamedArray> CheckpointArrays() const override { return {}; }
  Status RestoreCheckpoint(std::span<const model::NamedArray>) override { return Status::Ok(); }
  mutable std::atomic<int64_t> calls{0};
  double last_sum = 0;

 private:
  privacy::BlockLayout layout_;
};

TEST(StepDriverTest, PoissonSamplingIncludesEachRecordWithProbabilityQ) {
  ProbeModel model;
  testing::ZeroNoiseSource noise(5);
  DriverConfig config;
  config.mechanism.sampling_rate = 0.1;
  config.mechanism.noise_multiplier = 0;  // non-private: no accountant needed
  config.threads = 2;
  auto driver = StepDriver::Create(&model, &noise, nullptr, config);
  ASSERT_TRUE(driver.ok()) << driver.status().message();
  const std::vector<model::Record> pool(1000);
  const int steps = 400;
  for (int t = 0; t < steps; ++t) {
    const int64_t before = model.calls.load();
    ASSERT_TRUE((*driver)->Step(pool).ok());
    // Non-private mode: the M-step sees the exact batch sum (= batch size; a
    // value exactly at its bound may lose a few ulps to pessimistic clipping).
    const auto batch = static_cast<double>(model.calls.load() - before);
    EXPECT_NEAR(model.last_sum, batch, 1e-12 * (batch + 1));
  }
  // Binomial(400·1000, 0.1): mean 40000, sd 190.
  EXPECT_NEAR(static_cast<double>(model.calls.load()), 40000.0, 6 * 190.0);
  config.mechanism.sampling_rate = 1.0;
  ASSERT_TRUE((*driver)->Reconfigure(config).ok());
  const int64_t before = model.calls.load();
  ASSERT_TRUE((*driver)->Step(pool).ok());
  EXPECT_EQ(model.calls.load() - before, 1000);
}

TEST(StepDriverTest, RefusesUnsafeConfigurations) {
  auto bounded = models::LdaModel::Create(Lda(20));
  auto unbounded = models::LdaModel::Create(Lda(0));
  auto noise = privacy::SecureNoiseSource::Create();
  privacy::RdpAccountant accountant;
  // σ > 0 on a model without proven bounds.
  EXPECT_FALSE(StepDriver::Create(unbounded->get(), noise->get(), &accountant, Private()).ok());
  // σ > 0 without an accountant.
  EXPECT_FALSE(StepDriver::Create(bounded->get(), noise->get(), nullptr, Private()).ok());
  DriverConfig config = Private();
  config.kappa = 0.5;
  EXPECT_FALSE(StepDriver::Create(bounded->get(), noise->get(), &accountant, config).ok());
  config = Private();
  config.kappa = 1.0;
  EXPECT_TRUE(StepDriver::Create(bounded->get(), noise->get(), &accountant, config).ok());
  config.tau0 = -1;
  EXPECT_FALSE(StepDriver::Create(bounded->get(), noise->get(), &accountant, config).ok());
  config = Private();
  config.threads = 0;
  EXPECT_FALSE(StepDriver::Create(bounded->get(), noise->get(), &accountant, config).ok());
  EXPECT_FALSE(StepDriver::Create(bounded->get(), noise->get(), &accountant, Private(), 0).ok());
  // A running private driver cannot be switched to σ = 0.
  auto driver = StepDriver::Create(bounded->get(), noise->get(), &accountant, Private());
  ASSERT_TRUE(driver.ok());
  config = Private();
  config.mechanism.noise_multiplier = 0;
  EXPECT_FALSE((*driver)->Reconfigure(config).ok());
  config.mechanism.noise_multiplier = 2.0;
  EXPECT_TRUE((*driver)->Reconfigure(config).ok());
}


// ---- Scale-out: one step split across processes (issue 16) ----

// Six streams ("input/0" … "input/5") with gaps in their offsets.
struct Streams {
  std::vector<std::vector<model::Record>> records;
  std::vector<StreamCandidates> candidates;  // sorted by name
};
Streams MakeStreams(size_t per_stream) {
  Streams s;
  s.records.resize(6);
  for (size_t p = 0; p < 6; ++p) s.records[p] = Pool(per_stream, 100 + p);
  for (size_t p = 0; p < 6; ++p) {
    StreamCandidates c;
    c.stream = "input/" + std::to_string(p);
    for (size_t i = 0; i < per_stream; ++i) {
      c.records.push_back(&s.records[p][i]);
      c.offsets.push_back(static_cast<int64_t>(1000 * p + 3 * i + i / 5 * 40));
    }
    s.candidates.push_back(std::move(c));
  }
  return s;
}

// The coordinator's side of a split step: Begin, the key to the workers,
// their partials over the wire format, merged in stream order, one noise
// draw, M-step; the released sum back to every worker replica.
struct SplitRun {
  std::unique_ptr<models::LdaModel> model;
  std::unique_ptr<privacy::NoiseSource> noise;
  privacy::RdpAccountant accountant;
  std::unique_ptr<StepDriver> driver;
  std::vector<std::unique_ptr<models::LdaModel>> worker_models;
  std::unique_ptr<privacy::NoiseSource> worker_inner;
  std::unique_ptr<CountingNoise> worker_noise;  // must never be drawn from
  std::vector<std::unique_ptr<privacy::RdpAccountant>> worker_accountants;  // never charged
  std::vector<std::unique_ptr<StepDriver>> workers;
};

TEST(StepDriverTest, AStepSplitAcrossThreeProcessesEqualsTheWholeStepBitForBit) {
  const Streams streams = MakeStreams(120);
  DriverConfig config = Private();
  config.mechanism.sampling_rate = 0.4;
  // One process holding every stream.
  auto one_model = models::LdaModel::Create(Lda(20));
  auto one_noise = privacy::SecureNoiseSource::CreateReproducible(77);
  ASSERT_TRUE(one_model.ok() && one_noise.ok());
  privacy::RdpAccountant one_accountant;
  auto one = StepDriver::Create(one_model->get(), one_noise->get(), &one_accountant, config);
  ASSERT_TRUE(one.ok());
  std::vector<Eigen::VectorXd> one_sums;
  (*one)->set_release_observer(
      [&](const Eigen::VectorXd& sum, int64_t, const privacy::SampledGaussian&,
          double) { one_sums.push_back(sum); });

  // A coordinator and three workers, each with its own model replica.
  SplitRun split;
  {
    auto model = models::LdaModel::Create(Lda(20));
    auto noise = privacy::SecureNoiseSource::CreateReproducible(77);
    auto inner = privacy::SecureNoiseSource::Create();
    ASSERT_TRUE(model.ok() && noise.ok() && inner.ok());
    split.model = std::move(model).value();
    split.noise = std::move(noise).value();
    split.worker_inner = std::move(inner).value();
    split.worker_noise = std::make_unique<CountingNoise>(*split.worker_inner);
    auto driver = StepDriver::Create(split.model.get(), split.noise.get(), &split.accountant,
                                     config);
    ASSERT_TRUE(driver.ok());
    split.driver = std::move(driver).value();
    for (int w = 0; w < 3; ++w) {
      auto worker_model = models::LdaModel::Create(Lda(20));
      ASSERT_TRUE(worker_model.ok());
      split.worker_models.push_back(std::move(worker_model).value());
      DriverConfig worker_config = config;
      worker_config.threads = 1 + w;  // thread counts differ too
      split.worker_accountants.push_back(std::make_unique<privacy::RdpAccountant>());
      auto worker = StepDriver::Create(split.worker_models.back().get(), split.worker_noise.get(),
                                       split.worker_accountants.back().get(), worker_config);
      ASSERT_TRUE(worker.ok());
      split.workers.push_back(std::move(worker).value());
    }
  }
  std::vector<Eigen::VectorXd> split_sums;
  split.driver->set_release_observer(
      [&](const Eigen::VectorXd& sum, int64_t, const privacy::SampledGaussian&,
          double) { split_sums.push_back(sum); });

  const privacy::BlockLayout& layout = split.model->statistic_layout();
  for (int t = 1; t <= 6; ++t) {
    auto whole = (*one)->Step(streams.candidates);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();

    auto ticket = split.driver->Begin();
    ASSERT_TRUE(ticket.ok());
    // Partition ownership changes between steps (a rebalance): worker w
    // owns the streams p with (p + t) % 3 == w.
    std::map<std::string, std::string> wire;  // stream → encoded partial
    for (size_t w = 0; w < 3; ++w) {
      std::vector<StreamCandidates> owned;
      for (size_t p = 0; p < 6; ++p) {
        if ((p + static_cast<size_t>(t)) % 3 == w) owned.push_back(streams.candidates[p]);
      }
      const Status summed = split.workers[w]->SumStreams(
          ticket->key, owned, [&](size_t i, privacy::GaussianSumMechanism& partial) -> Status {
            VIPSD_ASSIGN_OR_RETURN(std::string bytes, partial.EncodeUnreleased());
            wire[owned[i].stream] = std::move(bytes);
            return Status::Ok();
          });
      ASSERT_TRUE(summed.ok()) << summed.ToString();
    }
    ASSERT_EQ(wire.size(), 6u);
    privacy::GaussianSumMechanism total(layout);
    for (const auto& [stream, bytes] : wire) {  // std::map: stream-name order
      auto partial = privacy::GaussianSumMechanism::DecodeUnreleased(layout, bytes);
      ASSERT_TRUE(partial.ok());
      ASSERT_TRUE(total.Merge(std::move(**partial)).ok());
    }
    auto finished = split.driver->Finish(*ticket, total);
    ASSERT_TRUE(finished.ok()) << finished.status().ToString();
    for (auto& worker : split.workers) {
      ASSERT_TRUE(worker->Advance(split_sums.back(), t).ok());
    }
    EXPECT_EQ(finished->epsilon_spent, whole->epsilon_spent);
    EXPECT_EQ(finished->rho, whole->rho);
  }
  ASSERT_EQ(one_sums.size(), 6u);
  ASSERT_EQ(split_sums.size(), 6u);
  for (size_t t = 0; t < 6; ++t) {
    ASSERT_EQ(one_sums[t].size(), split_sums[t].size());
    EXPECT_TRUE(one_sums[t] == split_sums[t]) << "step " << t + 1 << " differs";
  }
  EXPECT_TRUE((*one_model)->lambda() == split.model->lambda());
  for (const auto& replica : split.worker_models) {
    EXPECT_TRUE(replica->lambda() == split.model->lambda());
  }
  EXPECT_EQ(one_accountant, split.accountant);
  // Workers draw no randomness of their own: the step key decides.
  EXPECT_EQ(split.worker_noise->bits, 0u);
  EXPECT_EQ(split.worker_noise->normals, 0u);
  for (const auto& accountant : split.worker_accountants) EXPECT_EQ(accountant->steps(), 0);
}

TEST(StepDriverTest, StepCandidatesMustBeSortedAndGroupedByStream) {
  auto model = models::LdaModel::Create(Lda(20));
  auto noise = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(model.ok() && noise.ok());
  privacy::RdpAccountant accountant;
  auto driver = StepDriver::Create(model->get(), noise->get(), &accountant, Private());
  ASSERT_TRUE(driver.ok());
  Streams streams = MakeStreams(10);
  std::swap(streams.candidates[0], streams.candidates[1]);
  EXPECT_EQ((*driver)->Step(streams.candidates).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(accountant.steps(), 0);  // refused before the charge
  std::swap(streams.candidates[0], streams.candidates[1]);
  streams.candidates[2].offsets[3] = streams.candidates[2].offsets[2];  // a repeated offset
  EXPECT_EQ((*driver)->Step(streams.candidates).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vipsd::svi
