// What moving one un-noised partial sum between processes costs (issue 16,
// docs/privacy_accounting.md §6c): GaussianSumMechanism::EncodeUnreleased on
// the worker, DecodeUnreleased + Merge on the step's owner (BM_DecodeMerge
// that side alone), for an LDA topic-word statistic of K × V = 50 × 10,000
// (500,000 coordinates) whose
// partial touches 1 %, 10 % or 100 % of its coordinates (a partition's
// sampled documents at small, medium and Wikipedia-scale batches). The
// baseline is merging the same partial in-process (what one process does):
// compare the ns of the two in the same run. Counters: wire_bytes per
// partial. BM_PlanModel (issue 30) is what a plan's model costs on the same
// statistic: CheckpointStore::Encode of the LDA model on the coordinator,
// Decode and RestoreCheckpoint on a worker, every step; BM_PlanShipping the
// whole plan with the model against the plan with the released sum instead.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/models/lda.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "daemon/io/work_exchange.h"
#include "daemon/setup/model_setup.h"
#include "daemon/state/checkpoint.h"

namespace {

using vipsd::privacy::BlockKind;
using vipsd::privacy::BlockLayout;
using vipsd::privacy::GaussianSumMechanism;

constexpr size_t kTopics = 50, kVocabulary = 10000;

BlockLayout Layout() {
  auto layout = BlockLayout::Create({{"lambda", BlockKind::kVector, kTopics * kVocabulary, 1.0}});
  return std::move(layout).value();
}

// A partial whose non-zero coordinates are a `percent` share of the
// statistic, in runs of K (a document touches K × its distinct words).
void Fill(GaussianSumMechanism& sum, int percent) {
  std::mt19937_64 rng(7);
  const size_t words = kVocabulary * static_cast<size_t>(percent) / 100;
  std::vector<uint32_t> chosen(kVocabulary);
  for (uint32_t w = 0; w < kVocabulary; ++w) chosen[w] = w;
  std::shuffle(chosen.begin(), chosen.end(), rng);
  chosen.resize(words);
  std::sort(chosen.begin(), chosen.end());
  std::vector<uint32_t> indices;
  std::vector<double> values;
  for (const uint32_t w : chosen) {
    for (uint32_t k = 0; k < kTopics; ++k) {
      indices.push_back(w * kTopics + k);
      values.push_back(1e-4 * static_cast<double>(rng() % 1000));
    }
  }
  (void)sum.AddSparse(indices, values);
}

void BM_MergeInProcess(benchmark::State& state) {
  const BlockLayout layout = Layout();
  GaussianSumMechanism total(layout), partial(layout);
  Fill(total, 100);
  for (auto _ : state) {
    state.PauseTiming();
    partial.Reset();
    Fill(partial, static_cast<int>(state.range(0)));
    state.ResumeTiming();
    (void)total.Merge(std::move(partial));
  }
}
BENCHMARK(BM_MergeInProcess)->Arg(1)->Arg(10)->Arg(100)->Unit(benchmark::kMillisecond);

void BM_EncodeDecodeMerge(benchmark::State& state) {
  const BlockLayout layout = Layout();
  GaussianSumMechanism total(layout), partial(layout);
  Fill(total, 100);
  Fill(partial, static_cast<int>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    auto encoded = partial.EncodeUnreleased();
    auto decoded = GaussianSumMechanism::DecodeUnreleased(layout, *encoded);
    (void)total.Merge(std::move(**decoded));
    bytes = encoded->size();
  }
  state.counters["wire_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_EncodeDecodeMerge)->Arg(1)->Arg(10)->Arg(100)->Unit(benchmark::kMillisecond);

// The step owner's side alone (what it does for each partial that arrives):
// DecodeUnreleased and Merge of a partial encoded once.
void BM_DecodeMerge(benchmark::State& state) {
  const BlockLayout layout = Layout();
  GaussianSumMechanism total(layout), partial(layout);
  Fill(total, 100);
  Fill(partial, static_cast<int>(state.range(0)));
  const auto encoded = partial.EncodeUnreleased();
  for (auto _ : state) {
    auto decoded = GaussianSumMechanism::DecodeUnreleased(layout, *encoded);
    (void)total.Merge(std::move(**decoded));
  }
  state.counters["wire_bytes"] = static_cast<double>(encoded->size());
}
BENCHMARK(BM_DecodeMerge)->Arg(1)->Arg(10)->Arg(100)->Unit(benchmark::kMillisecond);

// The LDA model of K x V coordinates both plan benchmarks ship.
vipsd::StatusOr<std::unique_ptr<vipsd::models::LdaModel>> Lda() {
  vipsd::models::LdaConfig config;
  config.num_topics = kTopics;
  config.vocabulary_size = kVocabulary;
  config.alpha = 0.1;
  config.eta = 0.01;
  return vipsd::models::LdaModel::Create(config);
}

// Arg 0: the coordinator's encode; 1: a worker's decode (checksum and
// parse); 2: a worker's RestoreCheckpoint (LDA recomputes E[log beta]).
void BM_PlanModel(benchmark::State& state) {
  auto model = Lda();
  vipsd::daemon::Checkpoint checkpoint;
  checkpoint.run_id = std::string(32, 'a');
  checkpoint.step = 1;
  checkpoint.model_type = (*model)->type();
  checkpoint.model_fingerprint = std::string(64, 'b');
  checkpoint.arrays = (*model)->CheckpointArrays();
  const auto encoded = vipsd::daemon::CheckpointStore::Encode(checkpoint);
  const auto decoded = vipsd::daemon::CheckpointStore::Decode(*encoded, "plan");
  if (!encoded.ok() || !decoded.ok()) {
    state.SkipWithError("plan model round trip failed");
    return;
  }
  for (auto _ : state) {
    switch (state.range(0)) {
      case 0:
        benchmark::DoNotOptimize(vipsd::daemon::CheckpointStore::Encode(checkpoint));
        break;
      case 1:
        benchmark::DoNotOptimize(vipsd::daemon::CheckpointStore::Decode(*encoded, "plan"));
        break;
      default:
        benchmark::DoNotOptimize((*model)->RestoreCheckpoint(decoded->arrays));
    }
  }
  state.counters["wire_bytes"] = static_cast<double>(encoded->size());
}
BENCHMARK(BM_PlanModel)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

// A whole plan's model part, each way (issue 30): Arg 0 the model (the
// coordinator's CheckpointStore::Encode inside EncodeWorkPlan); 1 a worker's
// DecodeWorkPlan, DecodePlanModel and RestoreCheckpoint; 2 the previous
// step's released sum instead (EncodeReleased inside EncodeWorkPlan); 3 a
// worker's DecodeWorkPlan, DecodeReleased and the M-step. The released sum
// is a real σ = 1 release of a dense sum (the noise decides its size).
void BM_PlanShipping(benchmark::State& state) {
  auto model = std::move(Lda()).value();
  const BlockLayout& layout = model->statistic_layout();
  GaussianSumMechanism sum(layout);
  Fill(sum, 100);
  auto noise = std::move(vipsd::privacy::SecureNoiseSource::CreateReproducible(3)).value();
  const Eigen::VectorXd released = std::move(sum.Release(*noise, 1.0)).value().noisy_sum;
  vipsd::daemon::ModelBundle bundle;
  bundle.model_fingerprint = std::string(64, 'b');
  vipsd::daemon::WorkPlan plan;
  plan.job = "job";
  plan.owner = std::string(32, 'a');
  plan.step = 2;
  plan.sampling_rate = 0.1;
  plan.streams = {{"docs:0", 0, 10, 10}};
  plan.wanted = {"docs:0"};
  vipsd::daemon::Checkpoint checkpoint;
  checkpoint.run_id = std::string(32, 'a');
  checkpoint.step = 1;
  checkpoint.model_type = model->type();
  checkpoint.model_fingerprint = bundle.model_fingerprint;
  const bool delta = state.range(0) >= 2;
  auto encode = [&] {
    vipsd::daemon::WorkPlan p = plan;
    if (delta) {
      p.delta_sum = *GaussianSumMechanism::EncodeReleased(layout, released);
      p.delta_base = 1;
      p.delta_base_offset = 0;
      p.delta_step = 1;
      p.delta_mechanism.sampling_rate = 0.1;
      p.delta_rho = 0.5;
    } else {
      checkpoint.arrays = model->CheckpointArrays();
      p.model = *vipsd::daemon::CheckpointStore::Encode(checkpoint);
    }
    return vipsd::daemon::EncodeWorkPlan(p);
  };
  const std::string bytes = encode();
  for (auto _ : state) {
    if (state.range(0) % 2 == 0) {
      benchmark::DoNotOptimize(encode());
      continue;
    }
    auto decoded = vipsd::daemon::DecodeWorkPlan(bytes);
    if (delta) {
      auto applied = GaussianSumMechanism::DecodeReleased(layout, decoded->delta_sum);
      benchmark::DoNotOptimize(model->MStep(*applied, {decoded->delta_mechanism.sampling_rate,
                                                       0.0}, decoded->delta_rho));
    } else {
      auto restored = vipsd::daemon::CheckpointStore::Decode(decoded->model, "plan");
      benchmark::DoNotOptimize(model->RestoreCheckpoint(restored->arrays));
    }
  }
  state.counters["wire_bytes"] = static_cast<double>(bytes.size());
}
BENCHMARK(BM_PlanShipping)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
