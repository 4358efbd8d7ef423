// TEST-ONLY: what the shared-work tests (coordinator_test, worker_test)
// share — a job's configuration in a fresh directory (LDA unless asked for
// BLR or SBN, fixed-seed noise, a work topic), its input log, and the model
// and records a solo step would see.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config/config.h"
#include "daemon/io/metrics.h"
#include "daemon/setup/model_setup.h"
#include "daemon/setup/startup_check.h"
#include "tests/testing/fake_io.h"
#include "tests/testing/memory_work_exchange.h"
#include "tests/testing/test_metrics.h"

namespace vipsd::daemon {

struct WorkFixture {
  std::string dir;
  config::VipsdConfig config;
  std::shared_ptr<FakeTopic> topic = std::make_shared<FakeTopic>();
  std::shared_ptr<MemoryWorkTopic> work = std::make_shared<MemoryWorkTopic>();
  std::unique_ptr<Metrics> metrics;
  // The configuration's fixed-seed noise (the processes of one test draw
  // the same noise) needs the command-line flag.
  DaemonOptions options = [] {
    DaemonOptions o;
    o.allow_fixed_seed_noise = true;
    return o;
  }();

  // `extra_privacy`: more lines of the privacy section (indented two
  // spaces); `records`: whether to append the nine default records; `q`:
  // privacy.sampling_rate; `model`: "lda", "blr" (d = 3) or "sbn" (J = 6,
  // K = 2), the records in its format.
  explicit WorkFixture(const std::string& name, const std::string& extra_privacy = "",
                       bool records = true, const std::string& q = "0.5",
                       const std::string& model = "lda") {
    dir = ::testing::TempDir() + "work_" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/vocab.txt") << "apple\nbanana\ncherry\ndate\nelder\nfig\n";
    const std::string model_section =
        model == "blr"   ? "model:\n  type: blr\n  blr:\n    dimension: 3\n"
        : model == "sbn" ? "model:\n  type: sbn\n  sbn:\n    visible: 6\n    hidden: 2\n"
                         : "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
                           "    alpha: 0.5\n    eta: 0.1\n    resample_length: 10\n";
    EXPECT_TRUE(model == "lda" || model == "blr" || model == "sbn") << model;
    std::ofstream(dir + "/vipsd.yaml")
        << model_section
        << "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: " << q << "\n  delta: 1.0e-5\n"
           "  epsilon_ceiling: 1000\n  schedule: adaptive\n  noise: fixed_seed\n"
           "  noise_seed: 7\n"
        << extra_privacy
        << "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 1\n  interval_seconds: 1\n"
           "  start_delay_seconds: 0\n  window_steps: 1000000000\n"
           "source:\n  type: kafka\n  topics: [docs]\n"
           "sink:\n  type: kafka\n  topic: releases\n"
           "dead_letter:\n  topic: dead\n"
           "kafka:\n  bootstrap_servers: unused:9092\n"
           "state:\n  directory: state\n  ledger_topic: ledger\n  work_topic: work\n"
           "metrics:\n  listen: \"\"\n";
    auto loaded = config::LoadConfigFile(dir + "/vipsd.yaml");
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    if (loaded.ok()) config = *loaded;
    metrics = NewTestMetrics();
    const char* texts[] = {"apple banana apple cherry", "date elder fig fig", "fig apple"};
    const char* features[] = {"[0.5, -0.25, 0.125]", "[-0.75, 0.5, 0.0]", "[0.25, 0.25, -0.5]"};
    const char* pixels[] = {"[1, 0, 1, 1, 0, 0]", "[0, 1, 0, 0, 1, 1]", "[1, 1, 0, 1, 0, 1]"};
    for (int i = 0; records && i < 9; ++i) {
      const std::string id = "{\"id\": " + std::to_string(i);
      topic->Append(i % 2, model == "blr"   ? id + ", \"x\": " + features[i % 3] +
                                                ", \"y\": " + std::to_string(i % 2) + "}"
                           : model == "sbn" ? id + ", \"y\": " + pixels[i % 3] + "}"
                                            : id + ", \"text\": \"" + texts[i % 3] + "\"}");
    }
  }
  // A process reading only `partitions` of the input.
  SourceFactory Partitions(std::set<int32_t> partitions) const {
    auto log = topic;
    return [log, partitions](ResumeOffsetFn resume) -> StatusOr<std::unique_ptr<InputSource>> {
      return std::unique_ptr<InputSource>(new FakeSource(log, std::move(resume), partitions));
    };
  }
};

}  // namespace vipsd::daemon
