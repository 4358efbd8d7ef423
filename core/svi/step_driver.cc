#include "core/svi/step_driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/privacy/gaussian_mechanism.h"

namespace vipsd::svi {
namespace {

// SplitMix64 finaliser, to derive independent per-record seeds.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Records per accumulation chunk (see Step). Part of the result's
// definition: changing it changes the floating-point summation order.
constexpr size_t kChunkRecords = 64;

// Seconds since `since`, and moves `since` to now.
double Lap(std::chrono::steady_clock::time_point& since) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - since).count();
  since = now;
  return seconds;
}

}  // namespace

Status ValidateDriverConfig(const DriverConfig& c) {
  if (!(c.sampling_rate > 0 && c.sampling_rate <= 1)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1]");
  }
  if (!(c.noise_multiplier >= 0) || !std::isfinite(c.noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and >= 0 (0 = non-private)");
  }
  if (!(c.tau0 >= 0) || !std::isfinite(c.tau0)) {
    return InvalidArgumentError("tau0 must be finite and >= 0");
  }
  if (!(c.kappa > 0.5 && c.kappa <= 1)) return InvalidArgumentError("kappa must be in (0.5, 1]");
  if (c.threads < 1 || c.threads > 256) return InvalidArgumentError("threads must be in [1, 256]");
  if (c.noise_multiplier > 0) {
    if (!(c.delta > 0 && c.delta < 1)) return InvalidArgumentError("delta must be in (0, 1)");
    if (!(c.epsilon_ceiling > 0) || !std::isfinite(c.epsilon_ceiling)) {
      return InvalidArgumentError("epsilon_ceiling must be finite and > 0");
    }
  }
  return Status::Ok();
}

double StepSize(double tau0, double kappa, int64_t t) {
  return std::pow(tau0 + static_cast<double>(t), -kappa);
}

StatusOr<std::unique_ptr<StepDriver>> StepDriver::Create(model::Model* model,
                                                         privacy::NoiseSource* noise,
                                                         privacy::RdpAccountant* accountant,
                                                         const DriverConfig& config,
                                                         int64_t next_step) {
  if (model == nullptr || noise == nullptr) {
    return InvalidArgumentError("step driver needs a model and a noise source");
  }
  VIPSD_RETURN_IF_ERROR(ValidateDriverConfig(config));
  if (next_step < 1) return InvalidArgumentError("the first step number must be >= 1");
  if (config.noise_multiplier > 0) {
    if (accountant == nullptr) {
      return InvalidArgumentError("a private driver (noise_multiplier > 0) needs an accountant");
    }
    if (!model->has_proven_bounds()) {
      return InvalidArgumentError(
          "this model configuration has no proven statistic bound (e.g. LDA with "
          "resample_length 0) and can only run with noise_multiplier 0");
    }
  }
  return std::unique_ptr<StepDriver>(
      new StepDriver(model, noise, accountant, config, next_step));
}

StepDriver::StepDriver(model::Model* model, privacy::NoiseSource* noise,
                       privacy::RdpAccountant* accountant, const DriverConfig& config,
                       int64_t next_step)
    : model_(model),
      noise_(noise),
      accountant_(accountant),
      config_(config),
      next_step_(next_step) {}

Status StepDriver::Reconfigure(const DriverConfig& config) {
  VIPSD_RETURN_IF_ERROR(ValidateDriverConfig(config));
  if ((config.noise_multiplier > 0) != (config_.noise_multiplier > 0)) {
    return InvalidArgumentError(
        "noise_multiplier cannot switch between 0 (non-private) and > 0 on a running driver");
  }
  config_ = config;
  return Status::Ok();
}

StatusOr<StepResult> StepDriver::Step(std::span<const model::Record> pool) {
  const bool is_private = config_.noise_multiplier > 0;
  const double q = config_.sampling_rate;
  const double sigma = config_.noise_multiplier;
  StepResult result;
  result.step = next_step_;
  auto clock = std::chrono::steady_clock::now();

  // 1. Ceiling check and charge, on public parameters only.
  if (is_private) {
    if (config_.enforce_ceiling) {
      VIPSD_ASSIGN_OR_RETURN(
          auto check, accountant_->CheckCeiling(q, sigma, 1, config_.delta,
                                                config_.epsilon_ceiling,
                                                privacy::RdpConversion::kImproved,
                                                config_.adaptivity));
      if (check.would_exceed) {
        result.outcome = StepResult::Outcome::kRefusedCeiling;
        result.epsilon_refused = check.epsilon_after;
        VIPSD_ASSIGN_OR_RETURN(auto spent,
                               accountant_->GetEpsilon(config_.delta,
                                                       privacy::RdpConversion::kImproved,
                                                       config_.adaptivity));
        result.epsilon_spent = spent.epsilon;
        return result;
      }
    }
    VIPSD_RETURN_IF_ERROR(accountant_->Compose(q, sigma, 1));
    VIPSD_ASSIGN_OR_RETURN(auto spent,
                           accountant_->GetEpsilon(config_.delta, privacy::RdpConversion::kImproved,
                                                   config_.adaptivity));
    result.epsilon_spent = spent.epsilon;
  }
  result.phase_seconds.charge = Lap(clock);

  // 2. Poisson sampling with secure randomness. P(include) = ⌊q·2^64⌋/2^64
  // ≤ q, which the accountant's q bounds (RDP grows with q).
  std::vector<uint64_t> bits(pool.size() + 1);
  noise_->FillUniformBits(bits);
  const uint64_t step_seed = bits.back();
  std::vector<size_t> batch;
  if (q >= 1.0) {
    batch.resize(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) batch[i] = i;
  } else {
    const auto threshold = static_cast<uint64_t>(std::ldexp(q, 64));
    for (size_t i = 0; i < pool.size(); ++i) {
      if (bits[i] < threshold) batch.push_back(i);
    }
  }
  result.phase_seconds.sample = Lap(clock);

  // 3 + 4. E-step, clip and sum, in parallel over fixed chunks of the batch.
  // Each chunk is summed in batch order into its own accumulator; chunk sums
  // are merged into the step total in chunk order. Chunk boundaries do not
  // depend on the thread count, so neither does the result. Memory stays
  // bounded (a few accumulators per worker) even when a record's statistic
  // is dense and large.
  const privacy::BlockLayout& layout = model_->statistic_layout();
  if (total_ == nullptr) {
    total_ = std::make_unique<privacy::GaussianSumMechanism>(layout);
  } else {
    total_->Reset();
  }
  privacy::GaussianSumMechanism& total = *total_;
  const size_t num_chunks = (batch.size() + kChunkRecords - 1) / kChunkRecords;
  const size_t num_workers =
      std::min<size_t>(static_cast<size_t>(config_.threads), std::max<size_t>(num_chunks, 1));
  const size_t max_pending = 2 * num_workers;
  std::mutex mutex;
  std::condition_variable merged;
  size_t next_chunk = 0;  // guarded by mutex
  size_t next_merge = 0;  // guarded by mutex
  bool merging = false;   // guarded by mutex: a worker is merging into `total`
  std::vector<std::unique_ptr<privacy::GaussianSumMechanism>> finished(num_chunks);
  std::vector<std::unique_ptr<privacy::GaussianSumMechanism>>& spare = spare_;  // guarded by mutex
  Status merge_status = Status::Ok();                                   // guarded by mutex
  auto worker = [&]() {
    auto scratch = model_->NewScratch();
    model::SparseStatistic statistic;
    for (;;) {
      size_t chunk;
      std::unique_ptr<privacy::GaussianSumMechanism> sum;
      {
        std::unique_lock<std::mutex> lock(mutex);
        // Do not run too far ahead of the merge point: bounds memory.
        merged.wait(lock, [&] { return next_chunk - next_merge < max_pending; });
        if (next_chunk >= num_chunks) return;
        chunk = next_chunk++;
        if (!spare.empty()) {
          sum = std::move(spare.back());
          spare.pop_back();
        }
      }
      if (!sum) sum = std::make_unique<privacy::GaussianSumMechanism>(layout);
      const size_t end = std::min(batch.size(), (chunk + 1) * kChunkRecords);
      for (size_t i = chunk * kChunkRecords; i < end; ++i) {
        model::RecordRng rng(Mix(step_seed ^ Mix(static_cast<uint64_t>(i))));
        statistic.Clear();
        // A record the model rejects (malformed) or whose statistic is not
        // finite is not summed; that is a PRIVATE fact and is not reported.
        if (model_->EStep(pool[batch[i]], rng, *scratch, statistic).ok()) {
          (void)sum->AddSparse(statistic.indices, statistic.values);
        }
      }
      std::unique_lock<std::mutex> lock(mutex);
      finished[chunk] = std::move(sum);
      if (merging) continue;  // the merging worker will pick this chunk up
      // This worker merges every chunk that is due, in chunk order, outside
      // the lock so that the others keep running E-steps meanwhile. Only the
      // worker that set `merging` touches `total`; the flag changes under
      // the lock, which orders one merger's writes before the next one's.
      merging = true;
      while (next_merge < num_chunks && finished[next_merge]) {
        std::unique_ptr<privacy::GaussianSumMechanism> piece = std::move(finished[next_merge]);
        lock.unlock();
        Status status = total.Merge(std::move(*piece));
        piece->Reset();
        lock.lock();
        if (!status.ok() && merge_status.ok()) merge_status = status;
        spare.push_back(std::move(piece));
        ++next_merge;
        merged.notify_all();
      }
      merging = false;
    }
  };
  if (num_workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> threads;
    threads.reserve(num_workers);
    for (size_t w = 0; w < num_workers; ++w) threads.emplace_back(worker);
    for (auto& thread : threads) thread.join();
  }
  VIPSD_RETURN_IF_ERROR(merge_status);
  result.phase_seconds.estep = Lap(clock);
  StatusOr<privacy::GaussianRelease> release =
      is_private ? total.Release(*noise_, sigma) : total.ReleaseNonPrivate();
  if (!release.ok()) return release.status();
  result.phase_seconds.noise = Lap(clock);

  // 5. M-step on the released sum.
  result.rho = StepSize(config_.tau0, config_.kappa, next_step_);
  VIPSD_RETURN_IF_ERROR(model_->MStep(release->noisy_sum, q, result.rho));
  result.phase_seconds.mstep = Lap(clock);
  ++next_step_;
  return result;
}

}  // namespace vipsd::svi
