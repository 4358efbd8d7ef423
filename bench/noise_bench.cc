// Throughput of the noise a release needs: N(0, 1) draws for a 50 × 8000
// statistic (an LDA topic-word block with K = 50, V = 8000), from the
// production ChaCha20 + ziggurat source versus the standard library's
// std::normal_distribution over std::mt19937_64 (NOT secure; the baseline).
// Compare the items_per_second of the two in the same run; the design target
// is secure ≥ 0.5 × baseline.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/privacy/mechanisms/discrete_gaussian.h"
#include "core/privacy/mechanisms/secure_noise.h"

namespace {

constexpr size_t kDraws = 50 * 8000;

void BM_SecureGaussian_50x8000(benchmark::State& state) {
  auto source = vipsd::privacy::SecureNoiseSource::Create();
  if (!source.ok()) {
    state.SkipWithError(source.status().ToString().c_str());
    return;
  }
  std::vector<double> draws(kDraws);
  for (auto _ : state) {
    (*source)->FillStandardNormal(draws);
    benchmark::DoNotOptimize(draws.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kDraws);
}
BENCHMARK(BM_SecureGaussian_50x8000)->Unit(benchmark::kMillisecond);

void BM_Mt19937NormalDistribution_50x8000(benchmark::State& state) {
  std::mt19937_64 engine(12345);
  std::normal_distribution<double> normal;
  std::vector<double> draws(kDraws);
  for (auto _ : state) {
    for (double& draw : draws) draw = normal(engine);
    benchmark::DoNotOptimize(draws.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kDraws);
}
BENCHMARK(BM_Mt19937NormalDistribution_50x8000)->Unit(benchmark::kMillisecond);

// The raw keystream rate, for context: an upper bound on any sampler built
// on this source.
void BM_SecureUniformBits_50x8000(benchmark::State& state) {
  auto source = vipsd::privacy::SecureNoiseSource::Create();
  if (!source.ok()) {
    state.SkipWithError(source.status().ToString().c_str());
    return;
  }
  std::vector<uint64_t> words(kDraws);
  for (auto _ : state) {
    (*source)->FillUniformBits(words);
    benchmark::DoNotOptimize(words.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kDraws);
}
BENCHMARK(BM_SecureUniformBits_50x8000)->Unit(benchmark::kMillisecond);

// The exact discrete Gaussian N_Z(0, σ²) (discrete_gaussian.h) on the same
// ChaCha20 source, σ = 2·2^k grid units (σ² = 4^(k+1), an integer), for the
// same 50 × 8000 draws: compare items_per_second with BM_SecureGaussian.
void BM_SecureDiscreteGaussian_50x8000(benchmark::State& state) {
  auto source = vipsd::privacy::SecureNoiseSource::Create();
  const int k = static_cast<int>(state.range(0));
  auto sampler = vipsd::privacy::DiscreteGaussianSampler::Create(
      {uint64_t{1} << (2 * (k + 1)), 1});
  if (!source.ok() || !sampler.ok()) {
    state.SkipWithError("cannot create the source or the sampler");
    return;
  }
  std::vector<int64_t> draws(kDraws);
  for (auto _ : state) {
    const vipsd::Status status = sampler->Fill(**source, draws);
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(draws.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kDraws);
  state.SetLabel("sigma = 2^" + std::to_string(k + 1));
}
BENCHMARK(BM_SecureDiscreteGaussian_50x8000)
    ->Arg(0)
    ->Arg(10)
    ->Arg(20)
    ->Arg(30)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
