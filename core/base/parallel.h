// ForEachIndexOnThreads: a loop over [0, count) spread over a few threads.
//
// Thread-safety: `body` is called from several threads at once (each index
// exactly once); it must only touch what its index owns or what it guards.
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

}  // namespace vipsd
