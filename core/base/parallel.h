// Loops over [0, count) spread over a few threads: ForEachIndexOnThreads
// hands out one index at a time (work of uneven cost), ParallelRanges one
// contiguous range per thread (uniform work over a large array).
//
// Thread-safety: `body` is called from several threads at once (each index
// or range exactly once); it must only touch what it owns or what it guards.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace vipsd {

// Calls body(i) for every i in [0, count) on min(threads, count) threads,
// the calling one included; each thread takes the next index left, so the
// work balances whatever each index costs. Returns when every call did.
template <typename Body>
void ForEachIndexOnThreads(size_t count, int threads, const Body& body) {
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) body(i);
  };
  const size_t used = std::min<size_t>(count, static_cast<size_t>(std::max(threads, 1)));
  std::vector<std::thread> helpers;
  helpers.reserve(used > 0 ? used - 1 : 0);
  for (size_t t = 1; t < used; ++t) helpers.emplace_back(run);
  run();
  for (std::thread& helper : helpers) helper.join();
}

// Runs body(begin, end) over [0, count) split into min(threads, 256)
// contiguous ranges, on the calling thread and the others new ones; one
// range on the calling thread when count < 2 · that many.
template <typename Index, typename Body>
void ParallelRanges(Index count, int threads, const Body& body) {
  const auto parts = static_cast<Index>(std::max(1, std::min<int>(threads, 256)));
  if (parts == 1 || count < 2 * parts) {
    body(Index{0}, count);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(parts - 1));
  for (Index part = 1; part < parts; ++part) {
    workers.emplace_back([&body, count, parts, part] {
      body(count * part / parts, count * (part + 1) / parts);
    });
  }
  body(Index{0}, count / parts);
  for (std::thread& worker : workers) worker.join();
}

}  // namespace vipsd
