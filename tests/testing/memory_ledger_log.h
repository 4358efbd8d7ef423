// TEST-ONLY: the ledger topic (daemon/state/ledger_replica.h) in memory, an
// ordered log shared by several replicas (the processes).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "daemon/state/ledger_replica.h"

namespace vipsd::daemon {

// An in-memory ordered log shared by several replicas (the processes).
// `before_append` runs once before the next append: it interleaves another
// process's actions at the worst moment. While `unreadable`, reads fail
// UNAVAILABLE (a broker down).
struct MemoryLog {
  std::vector<LedgerLogEntry> entries;
  int64_t first = 0;
  bool unreadable = false;
  std::function<void()> before_append;
};

class MemoryLedgerLog final : public LedgerLog {
 public:
  explicit MemoryLedgerLog(MemoryLog* log) : log_(log) {}
  std::string Describe() const override { return "memory log"; }
  StatusOr<std::pair<int64_t, int64_t>> Bounds() override {
    if (log_->unreadable) return UnavailableError("memory log: unreadable");
    return std::make_pair(log_->first, static_cast<int64_t>(log_->entries.size()));
  }
  StatusOr<std::vector<LedgerLogEntry>> Read(int64_t from, int64_t to) override {
    std::vector<LedgerLogEntry> out;
    for (int64_t o = std::max(from, log_->first);
         o < to && o < static_cast<int64_t>(log_->entries.size()); ++o) {
      out.push_back(log_->entries[static_cast<size_t>(o)]);
    }
    return out;
  }
  StatusOr<int64_t> Append(const LedgerLogEntry& entry) override {
    if (log_->before_append) {
      auto hook = std::move(log_->before_append);
      log_->before_append = nullptr;
      hook();
    }
    LedgerLogEntry stored = entry;
    stored.offset = static_cast<int64_t>(log_->entries.size());
    log_->entries.push_back(stored);
    return stored.offset;
  }

 private:
  MemoryLog* log_;
};

}  // namespace vipsd::daemon
