#include "daemon/service/service.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "connectors/file/file_util.h"
#include "core/base/log.h"
#include "core/base/thread_annotations.h"
#include "core/text/vocabulary.h"
#include "daemon/io/embedded.h"
#include "daemon/io/kafka_io.h"
#include "daemon/io/metrics.h"
#include "daemon/io/sd_notify.h"
#include "daemon/service/daemon.h"
#include "daemon/step/holder.h"
#include "daemon/step/worker.h"

#ifndef VIPSD_VERSION
#define VIPSD_VERSION "unknown"
#endif

namespace vipsd::daemon {
namespace {

// Prints the top words of the first topics of an LDA release (demo summary).
void PrintTopWords(const release::Release& release, const std::string& vocabulary_path,
                   int topics, int words) {
  auto text = connectors::ReadRegularFile(vocabulary_path, connectors::kMaxVocabularyBytes);
  if (!text.ok()) return;
  auto vocabulary = text::Vocabulary::Parse(*text);
  if (!vocabulary.ok()) return;
  for (const auto& array : release.arrays) {
    if (array.name != "lambda" || array.shape.size() != 2) continue;
    const int64_t k_count = array.shape[0], v_count = array.shape[1];
    std::cout << "Top words of " << std::min<int64_t>(topics, k_count) << " of " << k_count
              << " topics in release " << release.metadata.release_id << " (epsilon "
              << release.metadata.epsilon_spent << ", delta " << release.metadata.delta
              << "):\n";
    for (int64_t k = 0; k < std::min<int64_t>(topics, k_count); ++k) {
      std::vector<int32_t> order(static_cast<size_t>(v_count));
      std::iota(order.begin(), order.end(), 0);
      const double* row = array.data.data() + k * v_count;
      std::partial_sort(order.begin(), order.begin() + std::min<int64_t>(words, v_count),
                        order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      std::cout << "  topic " << k << ":";
      for (int64_t i = 0; i < std::min<int64_t>(words, v_count); ++i) {
        std::cout << " " << vocabulary->term(order[static_cast<size_t>(i)]);
      }
      std::cout << "\n";
    }
  }
}

// The service around one Daemon: the embedded cluster, the metrics endpoint,
// the standby/takeover loop, the signal thread and the demo's summary. Each
// phase that can end the process returns its exit code.
class Service {
 public:
  Service(const config::VipsdConfig& config, const DaemonOptions& options)
      : config_(config), options_(options), claim_options_(options) {}

  int Run();

 private:
  std::optional<int> StartEmbeddedKafka();
  std::optional<int> StartMetrics();
  // Builds the daemon: claims the job (a standby first waits for the owner
  // to fall silent, working for it meanwhile with state.work_topic).
  std::optional<int> Claim();
  // One standby period; nullopt when the claim may be tried.
  std::optional<int> StandBy(LedgerReplica& replica);
  bool StopRequested();
  SourceFactory KafkaInputs();
  // The service's Kafka clients, made once the brokers answer
  // (RetryWhileUnavailable: a stop signal meanwhile gives CANCELLED).
  StatusOr<std::unique_ptr<WorkExchange>> WorkExchangeUntilAvailable(WorkRole role);
  StatusOr<std::unique_ptr<OutputSink>> OutputUntilAvailable();
  // The exit code after a client could not be made, said: 0 when a stop
  // signal ended the wait, else ExitCodeFor.
  int ExitAfter(const std::string& what, const Status& status);
  // federation.role: holder — the Holder in place of a daemon.
  int RunHolder();
  int RunUntilStopped();
  void PrintDemoSummary();

  const config::VipsdConfig& config_;
  const DaemonOptions& options_;
  DaemonOptions claim_options_;  // with the takeover model of a standby that worked
  sigset_t signals_{};
  bool stopping_ = false;
  std::unique_ptr<EmbeddedKafka> embedded_;
  std::string bootstrap_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Daemon> daemon_;
  Mutex last_release_mutex_;  // after_release runs on the step thread
  std::optional<release::Release> last_release_ GUARDED_BY(last_release_mutex_);
};

int Service::Run() {
  // Signals are handled by one thread with sigwait; block them everywhere
  // before any other thread starts (librdkafka's and prometheus' included).
  sigemptyset(&signals_);
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&signals_, signal);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  bootstrap_ = config_.kafka.bootstrap_servers;
  if (auto exit = StartEmbeddedKafka()) return *exit;
  if (auto exit = StartMetrics()) return *exit;
  if (config_.federation.role == config::FederationRole::kHolder) return RunHolder();
  if (auto exit = Claim()) return *exit;
  return RunUntilStopped();
}

std::optional<int> Service::StartEmbeddedKafka() {
  if (!config_.kafka.embedded) return std::nullopt;
  auto started = EmbeddedKafka::Start(config_);
  if (!started.ok()) {
    Log(LogLevel::kError, "main", "embedded Kafka: " + started.status().ToString());
    return 1;
  }
  embedded_ = std::move(*started);
  bootstrap_ = embedded_->bootstrap_servers();
  std::error_code error;
  std::filesystem::create_directories(config_.state_directory, error);
  std::ofstream(config_.state_directory + "/bootstrap") << bootstrap_ << "\n";
  std::cout << "Embedded Kafka (librdkafka mock cluster) at " << bootstrap_
            << "; demo records produced: " << embedded_->demo_records() << "\n";
  if (config_.sink_type == config::SinkType::kKafka) {
    // The dump format the reference decoder reads (tools/decode_release.py).
    std::cout << "Read releases while it runs:  kcat -b " << bootstrap_ << " -t "
              << config_.release_topic
              << " -C -o beginning -e -q -f 'vipsd-kcat %p %o %K %S\\n%k\\n%h\\n%s\\n'"
                 " > releases.dump && /usr/bin/python3 tools/decode_release.py --kcat "
                 "releases.dump\n";
  }
  std::cout << std::flush;
  return std::nullopt;
}

std::optional<int> Service::StartMetrics() {
  MetricsOptions metrics_options;
  metrics_options.listen_address = config_.metrics_listen;
  metrics_options.version = VIPSD_VERSION;
  metrics_options.model_type = config_.model_type;
  metrics_options.input_topics = config_.source_topics;
  metrics_options.expose_step_timing = config_.expose_step_timing;
  metrics_options.per_unit = config_.privacy_unit != config::PrivacyUnit::kRecord;
  auto metrics = Metrics::Create(metrics_options);
  if (!metrics.ok()) {
    Log(LogLevel::kError, "main", "metrics: " + metrics.status().ToString());
    return 1;
  }
  metrics_ = std::move(*metrics);
  if (metrics_->port() > 0) {
    Log(LogLevel::kInfo, "main",
        "metrics at http://" + config_.metrics_listen.substr(0, config_.metrics_listen.rfind(':')) +
            ":" + std::to_string(metrics_->port()) + "/metrics");
  }
  return std::nullopt;
}

bool Service::StopRequested() {
  const timespec now{0, 0};
  siginfo_t info;
  for (;;) {
    const int signal = sigtimedwait(&signals_, &info, &now);
    if (signal < 0) return stopping_;
    if (signal == SIGINT || signal == SIGTERM) {
      Log(LogLevel::kInfo, "main",
          std::string("signal ") + strsignal(signal) + " before the run: stopping");
      stopping_ = true;
    }  // SIGHUP while standing by: the configuration is read at take-over
  }
}

int Service::RunHolder() {
  auto exchange = WorkExchangeUntilAvailable(WorkRole::kWorker);
  if (!exchange.ok()) return ExitAfter("work topic", exchange.status());
  auto output = OutputUntilAvailable();
  if (!output.ok()) return ExitAfter("output", output.status());
  auto holder = Holder::Create(config_, KafkaInputs(), std::move(*output), metrics_.get(),
                               std::move(*exchange), options_);
  if (!holder.ok()) {
    Log(LogLevel::kError, "main", holder.status().ToString());
    return ExitCodeFor(holder.status());
  }
  Status result = Status::Ok();
  std::atomic<bool> done{false};
  std::thread runner([&] {
    result = (*holder)->Run();
    done = true;
  });
  (void)Notify("READY=1\nSTATUS=holder");
  while (!done.load() && !StopRequested()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  (*holder)->RequestStop();
  runner.join();
  holder->reset();
  if (!result.ok()) {
    Log(LogLevel::kError, "main", "holder: " + result.ToString());
    return ExitCodeFor(result);
  }
  return 0;
}

SourceFactory Service::KafkaInputs() {
  if (config_.federation.role == config::FederationRole::kAggregator) {
    // An aggregator holds no data: it joins no consumer group.
    return [](ResumeOffsetFn) -> StatusOr<std::unique_ptr<InputSource>> {
      return std::unique_ptr<InputSource>(std::make_unique<NoInputSource>());
    };
  }
  const config::VipsdConfig* config = &config_;
  const std::string bootstrap = bootstrap_;
  Metrics* metrics = metrics_.get();
  return [config, bootstrap, metrics](ResumeOffsetFn resume) {
    return NewKafkaInput(*config, bootstrap, std::move(resume), metrics);
  };
}

StatusOr<std::unique_ptr<WorkExchange>> Service::WorkExchangeUntilAvailable(WorkRole role) {
  return RetryWhileUnavailable<std::unique_ptr<WorkExchange>>(
      "work topic", [this, role] { return NewKafkaWorkExchange(config_, bootstrap_, role); },
      [this] { return StopRequested(); });
}

StatusOr<std::unique_ptr<OutputSink>> Service::OutputUntilAvailable() {
  return RetryWhileUnavailable<std::unique_ptr<OutputSink>>(
      "output", [this] { return NewDaemonOutput(config_, bootstrap_); },
      [this] { return StopRequested(); });
}

int Service::ExitAfter(const std::string& what, const Status& status) {
  if (status.code() == StatusCode::kCancelled) {
    Log(LogLevel::kInfo, "main", "stopped while waiting for the brokers (" + what + ")");
    return 0;
  }
  Log(LogLevel::kError, "main", what + ": " + status.ToString());
  return ExitCodeFor(status);
}

std::optional<int> Service::StandBy(LedgerReplica& replica) {
  const bool shared = !config_.work_topic.empty();
  std::ostringstream seconds;
  seconds << config_.standby_takeover_seconds;
  Log(LogLevel::kInfo, "main",
      "standby for job '" + config_.ledger_key + "' on ledger topic " + config_.ledger_topic +
          ": taking over after " + seconds.str() + " s without a ledger entry" +
          (!shared ? ""
           : config_.work_partitions
               ? " or a plan; working for the owner meanwhile"
               : " or a plan; following its plans without reading partitions "
                 "(state.work_partitions: false)"));
  (void)Notify("READY=1\nSTATUS=standby");
  metrics_->standby().Set(1);
  // state.work_topic: the standby works for the owner while it waits
  // (daemon/io/work_exchange.h) and stops working before it claims.
  std::unique_ptr<Worker> worker;
  std::thread worker_thread;
  std::atomic<bool> worker_done{false};
  Status worker_result = Status::Ok();
  if (shared) {
    if (config_.work_partitions) metrics_->standby().Set(0);  // working, not idle
    auto exchange = WorkExchangeUntilAvailable(WorkRole::kWorker);
    if (!exchange.ok()) return ExitAfter("work topic", exchange.status());
    auto worker_output = OutputUntilAvailable();
    if (!worker_output.ok()) return ExitAfter("output", worker_output.status());
    auto created = Worker::Create(config_, KafkaInputs(), std::move(*worker_output),
                                  metrics_.get(), std::move(*exchange), options_);
    if (!created.ok()) {
      Log(LogLevel::kError, "main", created.status().ToString());
      return ExitCodeFor(created.status());
    }
    worker = std::move(*created);
    worker_thread = std::thread([&] {
      worker_result = worker->Run();
      worker_done = true;
    });
  }
  Worker* working = worker.get();
  const Status silent = replica.AwaitSilence(
      std::chrono::milliseconds(
          static_cast<int64_t>(std::ceil(config_.standby_takeover_seconds * 1000))),
      [&] { return StopRequested() || worker_done.load(); },
      [working]() -> int64_t { return working == nullptr ? 0 : working->last_plan_seen_ns(); });
  if (worker != nullptr) {
    // Leaves the consumer group and unlocks the state directory before a
    // claim: the owner's partitions move through an ordinary rebalance.
    worker->RequestStop();
    worker_thread.join();
    // The model the job had reached: the new owner continues from it.
    if (std::string model = worker->latest_plan_model(); !model.empty()) {
      claim_options_.takeover_model = std::move(model);
    }
    worker.reset();
    if (!worker_result.ok()) {
      Log(LogLevel::kError, "main", "worker: " + worker_result.ToString());
      return ExitCodeFor(worker_result);  // 2: a configuration error (no restart)
    }
  }
  if (silent.code() == StatusCode::kCancelled) return 0;
  if (!silent.ok()) {
    Log(LogLevel::kError, "main", silent.ToString());
    return 1;
  }
  metrics_->standby().Set(0);
  return std::nullopt;
}

std::optional<int> Service::Claim() {
  auto output = OutputUntilAvailable();
  if (!output.ok()) return ExitAfter("output", output.status());
  DaemonHooks hooks;
  if (config_.kafka.embedded) {
    hooks.after_release = [this](const release::Release& release) {
      MutexLock lock(&last_release_mutex_);
      last_release_ = release;
    };
  }
  // With state.ledger_topic the job's budget of record is claimed on the
  // topic in Daemon::Create. A hot standby (state.standby_takeover_seconds)
  // first waits until the running daemon's ledger entries stop, and stands
  // by again if another standby claimed the job at the same moment (or the
  // topic was unavailable for the claim).
  const bool standby = !config_.ledger_topic.empty() && config_.standby_takeover_seconds > 0;
  const bool shared = !config_.ledger_topic.empty() && !config_.work_topic.empty();
  for (;;) {
    std::unique_ptr<LedgerReplica> replica;
    if (!config_.ledger_topic.empty()) {
      auto made = RetryWhileUnavailable<std::unique_ptr<LedgerReplica>>(
          "ledger topic", [this] { return NewKafkaLedgerReplica(config_, bootstrap_); },
          [this] { return StopRequested(); });
      if (!made.ok()) return ExitAfter("ledger topic", made.status());
      replica = std::move(*made);
    }
    if (standby) {
      if (auto exit = StandBy(*replica)) return exit;
    }
    if (!output.ok()) output = OutputUntilAvailable();
    if (!output.ok()) return ExitAfter("output", output.status());
    std::unique_ptr<WorkExchange> exchange;
    if (shared) {
      auto made = WorkExchangeUntilAvailable(WorkRole::kCoordinator);
      if (!made.ok()) return ExitAfter("work topic", made.status());
      exchange = std::move(*made);
    }
    auto daemon = Daemon::Create(config_, KafkaInputs(), std::move(*output), metrics_.get(),
                                 hooks, claim_options_, std::move(replica), std::move(exchange));
    output = UnavailableError("handed to the daemon");
    if (!daemon.ok() && standby && daemon.status().code() == StatusCode::kUnavailable) {
      Log(LogLevel::kWarning, "main",
          "not taking over: " + daemon.status().ToString() + "; standing by again");
      metrics_->standby().Set(1);
      continue;
    }
    if (!daemon.ok()) {
      Log(LogLevel::kError, "main", daemon.status().ToString());
      return ExitCodeFor(daemon.status());
    }
    daemon_ = std::move(*daemon);
    return std::nullopt;
  }
}

int Service::RunUntilStopped() {
  std::thread signal_thread([this] {
    for (;;) {
      int signal = 0;
      if (sigwait(&signals_, &signal) != 0) continue;
      if (signal == SIGHUP) {
        (void)Notify("RELOADING=1");
        Log(LogLevel::kInfo, "main", "SIGHUP: reloading " + config_.file);
        daemon_->RequestReload();
        (void)Notify("READY=1");
        continue;
      }
      if (signal == SIGUSR1) return;  // Run() returned by itself
      (void)Notify("STOPPING=1");
      Log(LogLevel::kInfo, "main",
          std::string("signal ") + strsignal(signal) + ": finishing the current step and stopping");
      daemon_->RequestStop();
      return;
    }
  });
  (void)Notify("READY=1");
  const Status result = daemon_->Run();
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  daemon_.reset();  // closes the Kafka clients before the embedded cluster goes
  if (config_.kafka.embedded) PrintDemoSummary();
  if (!result.ok()) {
    Log(LogLevel::kError, "main", result.ToString());
    return 1;
  }
  return 0;
}

void Service::PrintDemoSummary() {
  MutexLock lock(&last_release_mutex_);
  if (last_release_.has_value() && config_.model_type == "lda") {
    PrintTopWords(*last_release_, config_.vocabulary_path, 5, 8);
  }
  if (config_.sink_type == config::SinkType::kKafka) {
    std::cout << "Releases were published to topic " << config_.release_topic
              << " of the embedded cluster (gone with this process)\n";
  }
  const std::string& directory = config_.sink_type == config::SinkType::kFile
                                     ? config_.sink_directory
                                     : config_.sink_mirror_directory;
  if (!directory.empty()) {
    std::cout << "Releases are in " << directory
              << "/ (decode one with: /usr/bin/python3 tools/decode_release.py " << directory
              << "/step-N)\n";
  }
}

}  // namespace

int ExitCodeFor(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int RunService(const config::VipsdConfig& config, const DaemonOptions& options) {
  Service service(config, options);
  return service.Run();
}

}  // namespace vipsd::daemon
