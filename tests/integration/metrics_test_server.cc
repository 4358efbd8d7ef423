// Test-only executable: serves a Metrics registry with fixed, known values so
// that tests/integration/prometheus_scrape_test.sh can scrape it with a real
// Prometheus server and check what arrives.
//
//   metrics_test_server [--listen ADDRESS]   (default 127.0.0.1:0)
//
// Prints the port it listens on as the first line of stdout, then serves
// until SIGTERM or SIGINT. The values below are what the ctest expects; keep
// them in sync with tests/CMakeLists.txt.
#include <csignal>
#include <cstring>
#include <iostream>
#include <string>

#include "daemon/io/metrics.h"

int main(int argc, char** argv) {
  using namespace vipsd::daemon;
  MetricsOptions options;
  options.listen_address = "127.0.0.1:0";
  options.version = "0.0.0-test";
  options.model_type = "lda";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
      options.listen_address = argv[++i];
    } else {
      std::cerr << "usage: metrics_test_server [--listen ADDRESS]\n";
      return 2;
    }
  }

  // Block the stop signals before the endpoint starts its threads, so that
  // only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto created = Metrics::Create(options);
  if (!created.ok()) {
    std::cerr << "metrics_test_server: " << created.status().ToString() << "\n";
    return 1;
  }
  const Metrics& metrics = **created;

  const double now = metrics.start_time_seconds().Value();
  metrics.SetAccountingMode(AccountingMode::kGlobal);
  metrics.SetPrivacyBudget(/*epsilon_spent=*/0.9, /*epsilon_ceiling=*/1.0, /*delta=*/1e-5);
  metrics.privacy_budget_warning_level().Set(0.8);
  metrics.noise_multiplier().Set(1.1);
  metrics.sampling_rate().Set(0.01);
  metrics.steps_total().Increment(42);
  metrics.step().Set(42);
  metrics.step_size_rho().Set(0.125);
  metrics.step_interval_seconds().Set(60);
  metrics.last_step_timestamp_seconds().Set(now);
  metrics.slot().Set(42);
  metrics.last_slot_timestamp_seconds().Set(now);
  for (double seconds : {0.02, 0.2, 2.0}) metrics.step_duration_seconds().Observe(seconds);
  metrics.records_consumed_total("docs").Increment(1000);
  metrics.records_rejected_total(vipsd::connectors::RejectReason::kInvalidJson).Increment(3);
  metrics.pool_records().Set(500);
  metrics.pool_capacity().Set(10000);
  metrics.releases_published_total().Increment(42);
  metrics.release_publish_duration_seconds().Observe(0.01);
  metrics.last_release_step().Set(42);
  metrics.last_release_timestamp_seconds().Set(now);
  metrics.release_bytes().Set(123456);
  metrics.ledger_commits_total().Increment(42);
  metrics.ledger_commit_duration_seconds().Observe(0.002);
  metrics.dead_letters_published_total().Increment(3);

  std::cout << metrics.port() << std::endl;

  int received = 0;
  sigwait(&stop_signals, &received);
  return 0;
}
