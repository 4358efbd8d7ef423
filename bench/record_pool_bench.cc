// Memory held by the pool per record, measured with glibc's mallinfo2 (heap
// bytes in use) around filling a RecordPool, for LDA documents of several
// lengths (in-vocabulary tokens) and BLR feature vectors. Reported as
// bytes_per_record counters; the README's figure comes from here:
//   build/bench/record_pool_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdint>

#include "core/svi/record_pool.h"

namespace {

size_t HeapInUse() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

void FillPool(benchmark::State& state, bool features) {
  const int64_t records = 20000;
  const int64_t length = state.range(0);
  double bytes_per_record = 0;
  for (auto _ : state) {
    const size_t before = HeapInUse();
    vipsd::svi::RecordPool pool;
    for (int64_t i = 0; i < records; ++i) {
      vipsd::model::Record record;
      if (features) {
        record.features.assign(static_cast<size_t>(length), 0.01);
      } else {
        record.word_ids.assign(static_cast<size_t>(length), static_cast<int32_t>(i % 1000));
      }
      pool.Add(std::move(record), {0, i});
    }
    bytes_per_record = static_cast<double>(HeapInUse() - before) / static_cast<double>(records);
    benchmark::DoNotOptimize(pool.size());
  }
  state.counters["bytes_per_record"] = bytes_per_record;
  state.counters["payload_bytes"] =
      static_cast<double>(length) * (features ? sizeof(double) : sizeof(int32_t));
}

void BM_PoolLdaDocuments(benchmark::State& state) { FillPool(state, false); }
void BM_PoolBlrRecords(benchmark::State& state) { FillPool(state, true); }

BENCHMARK(BM_PoolLdaDocuments)->Arg(50)->Arg(200)->Arg(500)->Iterations(3);
BENCHMARK(BM_PoolBlrRecords)->Arg(20)->Arg(92)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
