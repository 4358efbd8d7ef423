// Throughput of the noise a release needs: N(0, 1) draws for a 50 × 8000
// statistic (an LDA topic-word block with K = 50, V = 8000), from the
// production ChaCha20 + ziggurat source versus the standard library's
// std::normal_distribution over std::mt19937_64 (NOT secure; the baseline).
// Compare the items_per_second of the two in the same run; the design target
// is secure ≥ 0.5 × baseline.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/privacy/secure_noise.h"

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

}  // namespace

BENCHMARK_MAIN();
