// TEST-ONLY: the work topic (daemon/io/work_exchange.h) in memory — two
// totally ordered logs, plans and partial sums, shared by every end made
// from one MemoryWorkTopic. An end reads the log its role needs (a worker
// the plans, the coordinator the partials) from the log's end when it was
// made, as the Kafka exchange does.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/io/work_exchange.h"

namespace vipsd::daemon {

struct MemoryWorkTopic {
  std::mutex mutex;
  std::vector<std::string> plans;
  std::vector<std::string> partials;
  // Retention: offsets below these are gone (no Poll or ReadAt finds them).
  int64_t plans_start = 0;
  int64_t partials_start = 0;
  // Retention that passes the next N messages appended at once (before any
  // reader sees them), as a log over its retention.bytes would.
  int plans_lost_on_append = 0;
  int partials_lost_on_append = 0;
};

class MemoryWorkExchange final : public WorkExchange {
 public:
  MemoryWorkExchange(std::shared_ptr<MemoryWorkTopic> topic, WorkRole role)
      : topic_(std::move(topic)), role_(role) {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    position_ = static_cast<int64_t>(Log().size());
  }
  std::string Describe() const override { return "memory work topic"; }
  StatusOr<int64_t> Append(const std::string& bytes) override {
    VIPSD_ASSIGN_OR_RETURN(const WorkMessageKind kind, WorkMessageKindOf(bytes));
    std::lock_guard<std::mutex> lock(topic_->mutex);
    const bool plan = OnPlanLog(kind);
    auto& log = plan ? topic_->plans : topic_->partials;
    log.push_back(bytes);
    int& lost = plan ? topic_->plans_lost_on_append : topic_->partials_lost_on_append;
    if (lost > 0) {
      --lost;
      (plan ? topic_->plans_start : topic_->partials_start) = static_cast<int64_t>(log.size());
    }
    return static_cast<int64_t>(log.size()) - 1;
  }
  StatusOr<std::vector<std::pair<int64_t, std::string>>> Poll(
      std::chrono::milliseconds wait) override {
    const auto until = std::chrono::steady_clock::now() + wait;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(topic_->mutex);
        const auto& log = Log();
        std::vector<std::pair<int64_t, std::string>> out;
        position_ = std::max(position_, Start());
        for (; position_ < static_cast<int64_t>(log.size()); ++position_) {
          out.emplace_back(position_, log[static_cast<size_t>(position_)]);
        }
        if (!out.empty() || std::chrono::steady_clock::now() >= until) return out;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  StatusOr<std::string> ReadAt(int64_t offset) override {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    const auto& log = Log();
    if (offset < Start() || offset >= static_cast<int64_t>(log.size())) {
      return NotFoundError("no offset " + std::to_string(offset));
    }
    return log[static_cast<size_t>(offset)];
  }
  int64_t read_position() const override { return position_; }
  StatusOr<bool> HoldsPlan(int64_t offset) override {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    return offset >= topic_->plans_start && offset < static_cast<int64_t>(topic_->plans.size());
  }

 private:
  const std::vector<std::string>& Log() const {
    return role_ == WorkRole::kWorker ? topic_->plans : topic_->partials;
  }
  int64_t Start() const {
    return role_ == WorkRole::kWorker ? topic_->plans_start : topic_->partials_start;
  }
  std::shared_ptr<MemoryWorkTopic> topic_;
  const WorkRole role_;
  int64_t position_ = 0;
};

}  // namespace vipsd::daemon
