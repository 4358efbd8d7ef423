// vipsd: differentially private streaming variational Bayes.
//
//   vipsd --config FILE [--check-config]
//   vipsd status --state DIR [--delta D] [--json]
//
// source.type: file  → the offline run (daemon/offline_run.h);
// source.type: kafka → the daemon (daemon/daemon.h), until SIGTERM/SIGINT,
//                      reloading on SIGHUP; with kafka.embedded: true it
//                      first starts an in-process Kafka (daemon/embedded.h).
// Runs in the foreground (systemd Type=notify; never self-daemonises).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
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

#include "config/config.h"
#include "connectors/file/file_util.h"
#include "core/base/log.h"
#include "core/text/vocabulary.h"
#include "daemon/daemon.h"
#include "daemon/embedded.h"
#include "daemon/kafka_io.h"
#include "daemon/metrics.h"
#include "daemon/model_setup.h"
#include "daemon/offline_run.h"
#include "daemon/sd_notify.h"
#include "daemon/state_status.h"

#ifndef VIPSD_VERSION
#define VIPSD_VERSION "unknown"
#endif

namespace {

using namespace vipsd;

constexpr const char* kUsage =
    "vipsd " VIPSD_VERSION ": differentially private streaming variational Bayes (VIPS)\n"
    "\n"
    "Usage:\n"
    "  vipsd --config FILE            run: with source.type kafka, the daemon (until\n"
    "                                 SIGTERM/SIGINT; SIGHUP reloads FILE); with\n"
    "                                 source.type file, the offline run over a JSONL file\n"
    "  vipsd --config FILE --check-config\n"
    "                                 check FILE as a start would, without network or\n"
    "                                 writes, and exit: 0 valid, 2 invalid. Keys and\n"
    "                                 ranges (every error, file:line: key: what, with\n"
    "                                 a suggestion for a misspelt key; warnings for\n"
    "                                 legal but unwise values), vocabulary, metrics\n"
    "                                 address, librdkafka properties, the state\n"
    "                                 directory (writable; its ledger and checkpoint\n"
    "                                 against FILE), the first step and the residency\n"
    "                                 window against the epsilon ceiling\n"
    "  vipsd status --state DIR [--delta D] [--json]\n"
    "                                 what a state directory holds, read without the\n"
    "                                 lock and without writing: mode, schedule, next\n"
    "                                 step, epsilon spent (the daemon's own computation,\n"
    "                                 at --delta or the delta the daemon last wrote to\n"
    "                                 DIR/status.json), ceiling, streams, checkpoint,\n"
    "                                 last release, whether the daemon runs. Exit 0\n"
    "                                 when ledger and checkpoint verify, 1 when not,\n"
    "                                 2 for no ledger or a bad command line\n"
    "  vipsd --print-reference-config\n"
    "                                 every configuration key with its default, kind,\n"
    "                                 allowed values, required or not, live on reload\n"
    "                                 or not (config/vipsd.reference.yaml)\n"
    "  vipsd --version | --help\n"
    "\n"
    "Options:\n"
    "  --insecure-fixed-seed-noise    allow privacy.noise: fixed_seed (reproducible noise,\n"
    "                                 NOT private; tests and experiments only). Without\n"
    "                                 this flag such a configuration is refused.\n"
    "  --instance-id NAME             names this process in its log lines and in the\n"
    "                                 partial sums it computes (state.work_topic: one\n"
    "                                 configuration for all processes of a job);\n"
    "                                 default host:pid\n"
    "\n"
    "Every key: config/vipsd.reference.yaml (--print-reference-config); commented\n"
    "examples: config/examples/*.yaml.\n"
    "kafka.embedded: true starts an in-process Kafka (librdkafka's mock cluster) and\n"
    "prints its address, e.g. for kcat. Logs go to stderr (logfmt) and carry only\n"
    "public values. Exit codes: 0 done (stopped, or stopped at the epsilon ceiling\n"
    "with on_ceiling: exit), 1 run-time failure, 2 invalid command line or\n"
    "configuration.\n";

int ExitCodeFor(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

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

int RunDaemon(const config::VipsdConfig& config, const daemon::DaemonOptions& options) {
  // Signals are handled by one thread with sigwait; block them everywhere
  // before any other thread starts (librdkafka's and prometheus' included).
  sigset_t signals;
  sigemptyset(&signals);
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&signals, signal);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<daemon::EmbeddedKafka> embedded;
  std::string bootstrap = config.kafka.bootstrap_servers;
  if (config.kafka.embedded) {
    auto started = daemon::EmbeddedKafka::Start(config);
    if (!started.ok()) {
      Log(LogLevel::kError, "main", "embedded Kafka: " + started.status().ToString());
      return 1;
    }
    embedded = std::move(*started);
    bootstrap = embedded->bootstrap_servers();
    std::error_code error;
    std::filesystem::create_directories(config.state_directory, error);
    std::ofstream(config.state_directory + "/bootstrap") << bootstrap << "\n";
    std::cout << "Embedded Kafka (librdkafka mock cluster) at " << bootstrap
              << "; demo records produced: " << embedded->demo_records() << "\n";
    if (config.sink_type == config::SinkType::kKafka) {
      // The dump format the reference decoder reads (tools/decode_release.py).
      std::cout << "Read releases while it runs:  kcat -b " << bootstrap << " -t "
                << config.release_topic
                << " -C -o beginning -e -q -f 'vipsd-kcat %p %o %K %S\\n%k\\n%h\\n%s\\n'"
                   " > releases.dump && /usr/bin/python3 tools/decode_release.py --kcat "
                   "releases.dump\n";
    }
    std::cout << std::flush;
  }

  daemon::MetricsOptions metrics_options;
  metrics_options.listen_address = config.metrics_listen;
  metrics_options.version = VIPSD_VERSION;
  metrics_options.model_type = config.model_type;
  metrics_options.input_topics = config.source_topics;
  metrics_options.expose_step_timing = config.expose_step_timing;
  auto metrics = daemon::Metrics::Create(metrics_options);
  if (!metrics.ok()) {
    Log(LogLevel::kError, "main", "metrics: " + metrics.status().ToString());
    return 1;
  }
  if ((*metrics)->port() > 0) {
    Log(LogLevel::kInfo, "main",
        "metrics at http://" + config.metrics_listen.substr(0, config.metrics_listen.rfind(':')) +
            ":" + std::to_string((*metrics)->port()) + "/metrics");
  }

  auto output = daemon::NewDaemonOutput(config, bootstrap);
  if (!output.ok()) {
    Log(LogLevel::kError, "main", "output: " + output.status().ToString());
    return ExitCodeFor(output.status());
  }
  std::mutex last_release_mutex;
  std::optional<release::Release> last_release;
  daemon::DaemonHooks hooks;
  if (config.kafka.embedded) {
    hooks.after_release = [&](const release::Release& release) {
      std::lock_guard<std::mutex> lock(last_release_mutex);
      last_release = release;
    };
  }
  // With state.ledger_topic the job's budget of record is claimed on the
  // topic in Daemon::Create. A hot standby (state.standby_takeover_seconds)
  // first waits until the running daemon's ledger entries stop, and stands
  // by again if another standby claimed the job at the same moment (or the
  // topic was unavailable for the claim).
  const bool standby = !config.ledger_topic.empty() && config.standby_takeover_seconds > 0;
  const bool shared = !config.ledger_topic.empty() && !config.work_topic.empty();
  bool stopping = false;
  const auto stop_requested = [&] {
    const timespec now{0, 0};
    siginfo_t info;
    for (;;) {
      const int signal = sigtimedwait(&signals, &info, &now);
      if (signal < 0) return stopping;
      if (signal == SIGINT || signal == SIGTERM) {
        Log(LogLevel::kInfo, "main",
            std::string("signal ") + strsignal(signal) + " while standing by: stopping");
        stopping = true;
      }  // SIGHUP while standing by: the configuration is read at take-over
    }
  };
  daemon::Metrics* metrics_ptr = metrics->get();
  StatusOr<std::unique_ptr<daemon::Daemon>> daemon = UnavailableError("not started");
  daemon::DaemonOptions claim_options = options;
  for (;;) {
    std::unique_ptr<daemon::LedgerReplica> replica;
    if (!config.ledger_topic.empty()) {
      auto made = daemon::NewKafkaLedgerReplica(config, bootstrap);
      if (!made.ok()) {
        Log(LogLevel::kError, "main", "ledger topic: " + made.status().ToString());
        return ExitCodeFor(made.status());
      }
      replica = std::move(*made);
    }
    if (standby) {
      std::ostringstream seconds;
      seconds << config.standby_takeover_seconds;
      Log(LogLevel::kInfo, "main",
          "standby for job '" + config.ledger_key + "' on ledger topic " + config.ledger_topic +
              ": taking over after " + seconds.str() + " s without a ledger entry" +
              (shared ? " or a plan; working for the owner meanwhile" : ""));
      (void)daemon::Notify("READY=1\nSTATUS=standby");
      (*metrics)->standby().Set(1);
      // state.work_topic: the standby works for the owner while it waits
      // (daemon/work_exchange.h) and stops working before it claims.
      std::unique_ptr<daemon::Daemon> worker;
      std::thread worker_thread;
      std::atomic<bool> worker_done{false};
      Status worker_result = Status::Ok();
      if (shared) {
        (*metrics)->standby().Set(0);  // working, not idle
        auto exchange = daemon::NewKafkaWorkExchange(config, bootstrap, daemon::WorkRole::kWorker);
        if (!exchange.ok()) {
          Log(LogLevel::kError, "main", "work topic: " + exchange.status().ToString());
          return ExitCodeFor(exchange.status());
        }
        auto worker_output = daemon::NewDaemonOutput(config, bootstrap);
        if (!worker_output.ok()) {
          Log(LogLevel::kError, "main", "output: " + worker_output.status().ToString());
          return ExitCodeFor(worker_output.status());
        }
        auto created = daemon::Daemon::CreateWorker(
            config,
            [&config, bootstrap, metrics_ptr](daemon::ResumeOffsetFn resume) {
              return daemon::NewKafkaInput(config, bootstrap, std::move(resume), metrics_ptr);
            },
            std::move(*worker_output), metrics_ptr, std::move(*exchange), options);
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
      daemon::Daemon* working = worker.get();
      const Status silent = replica->AwaitSilence(
          std::chrono::milliseconds(
              static_cast<int64_t>(std::ceil(config.standby_takeover_seconds * 1000))),
          [&] { return stop_requested() || worker_done.load(); },
          [working]() -> int64_t { return working == nullptr ? 0 : working->last_plan_seen_ns(); });
      if (worker != nullptr) {
        // Leaves the consumer group and unlocks the state directory before a
        // claim: the owner's partitions move through an ordinary rebalance.
        worker->RequestStop();
        worker_thread.join();
        // The model the job had reached: the new owner continues from it.
        if (!worker->latest_plan_model().empty()) {
          claim_options.takeover_model = worker->latest_plan_model();
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
      (*metrics)->standby().Set(0);
    }
    if (!output.ok()) output = daemon::NewDaemonOutput(config, bootstrap);
    if (!output.ok()) {
      Log(LogLevel::kError, "main", "output: " + output.status().ToString());
      return ExitCodeFor(output.status());
    }
    std::unique_ptr<daemon::WorkExchange> exchange;
    if (shared) {
      auto made =
          daemon::NewKafkaWorkExchange(config, bootstrap, daemon::WorkRole::kCoordinator);
      if (!made.ok()) {
        Log(LogLevel::kError, "main", "work topic: " + made.status().ToString());
        return ExitCodeFor(made.status());
      }
      exchange = std::move(*made);
    }
    daemon = daemon::Daemon::Create(
        config,
        [&config, bootstrap, metrics_ptr](daemon::ResumeOffsetFn resume) {
          return daemon::NewKafkaInput(config, bootstrap, std::move(resume), metrics_ptr);
        },
        std::move(*output), metrics_ptr, hooks, claim_options, std::move(replica),
        std::move(exchange));
    output = UnavailableError("handed to the daemon");
    if (!daemon.ok() && standby && daemon.status().code() == StatusCode::kUnavailable) {
      Log(LogLevel::kWarning, "main",
          "not taking over: " + daemon.status().ToString() + "; standing by again");
      (*metrics)->standby().Set(1);
      continue;
    }
    break;
  }
  if (!daemon.ok()) {
    Log(LogLevel::kError, "main", daemon.status().ToString());
    return ExitCodeFor(daemon.status());
  }

  std::thread signal_thread([&] {
    for (;;) {
      int signal = 0;
      if (sigwait(&signals, &signal) != 0) continue;
      if (signal == SIGHUP) {
        (void)daemon::Notify("RELOADING=1");
        Log(LogLevel::kInfo, "main", "SIGHUP: reloading " + config.file);
        (*daemon)->RequestReload();
        (void)daemon::Notify("READY=1");
        continue;
      }
      if (signal == SIGUSR1) return;  // Run() returned by itself
      (void)daemon::Notify("STOPPING=1");
      Log(LogLevel::kInfo, "main",
          std::string("signal ") + strsignal(signal) + ": finishing the current step and stopping");
      (*daemon)->RequestStop();
      return;
    }
  });
  (void)daemon::Notify("READY=1");
  const Status result = (*daemon)->Run();
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  daemon->reset();  // closes the Kafka clients before the embedded cluster goes
  if (config.kafka.embedded) {
    std::lock_guard<std::mutex> lock(last_release_mutex);
    if (last_release.has_value() && config.model_type == "lda") {
      PrintTopWords(*last_release, config.vocabulary_path, 5, 8);
    }
    if (config.sink_type == config::SinkType::kKafka) {
      std::cout << "Releases were published to topic " << config.release_topic
                << " of the embedded cluster (gone with this process)\n";
    }
    const std::string& directory = config.sink_type == config::SinkType::kFile
                                       ? config.sink_directory
                                       : config.sink_mirror_directory;
    if (!directory.empty()) {
      std::cout << "Releases are in " << directory
                << "/ (decode one with: /usr/bin/python3 tools/decode_release.py "
                << directory << "/step-N)\n";
    }
  }
  if (!result.ok()) {
    Log(LogLevel::kError, "main", result.ToString());
    return 1;
  }
  return 0;
}

}  // namespace

int StatusCommand(int argc, char** argv) {
  daemon::StateStatusOptions options;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      options.json = true;
    } else if (arg == "--state" && i + 1 < argc) {
      options.directory = argv[++i];
    } else if (arg == "--delta" && i + 1 < argc) {
      const std::string text = argv[++i];
      char* end = nullptr;
      const double delta = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) {
        std::cerr << "vipsd status: --delta '" << text << "' is not a number\n";
        return 2;
      }
      options.delta = delta;
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else {
      std::cerr << "vipsd status: unknown argument '" << arg << "'; see --help\n";
      return 2;
    }
  }
  if (options.directory.empty()) {
    std::cerr << "vipsd status: missing --state DIR; see --help\n";
    return 2;
  }
  auto report = daemon::StateStatus(options);
  if (!report.ok()) {
    std::cerr << "vipsd status: " << report.status().message() << "\n";
    return 2;
  }
  std::cout << report->text;
  return report->verified ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "status") return StatusCommand(argc, argv);
  std::string config_path;
  bool check_only = false;
  daemon::DaemonOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--version") {
      std::cout << "vipsd " VIPSD_VERSION "\n";
      return 0;
    } else if (arg == "--print-reference-config") {
      std::cout << config::ReferenceConfig();
      return 0;
    } else if (arg == "--check-config") {
      check_only = true;
    } else if (arg == "--insecure-fixed-seed-noise") {
      options.allow_fixed_seed_noise = true;
    } else if (arg == "--instance-id" && i + 1 < argc) {
      options.instance_id = argv[++i];
    } else if (arg == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (arg.rfind("--config=", 0) == 0) {
      config_path = arg.substr(9);
    } else {
      std::cerr << "vipsd: unknown argument '" << arg << "'; see --help\n";
      return 2;
    }
  }
  if (config_path.empty()) {
    std::cerr << "vipsd: missing --config FILE; see --help\n";
    return 2;
  }
  if (options.instance_id.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "host");
    options.instance_id = std::string(host) + ":" + std::to_string(getpid());
  }
  auto config = config::LoadConfigFile(config_path);
  if (!config.ok()) {
    // Every error of the file, one per line, each naming file:line: key.
    std::istringstream lines(std::string(config.status().message()));
    for (std::string line; std::getline(lines, line);) std::cerr << "vipsd: " << line << "\n";
    return 2;
  }
  // Legal but unwise values: said at --check-config and at every start.
  if (config->source_type == config::SourceType::kKafka) {
    for (std::string& warning : daemon::KafkaClientWarnings(*config)) {
      config->warnings.push_back(std::move(warning));
    }
  }
  for (const std::string& warning : config->warnings) std::cerr << "vipsd: " << warning << "\n";
  if (check_only) {
    // Everything a start checks that needs neither the network nor a
    // write: model and vocabulary, metrics address, state directory,
    // ledger and checkpoint against this file, the privacy start-up checks,
    // and the librdkafka client configurations.
    Status checked = daemon::CheckStartUp(*config, options);
    if (checked.ok() && config->source_type == config::SourceType::kKafka) {
      checked = daemon::CheckKafkaClients(*config);
    }
    if (!checked.ok()) {
      std::cerr << "vipsd: " << checked.message() << "\n";
      return 2;
    }
    std::cout << "vipsd: " << config_path << " is valid\n";
    return 0;
  }
  SetMinLogLevel(config->log_level);
  SetLogFormat(config->log_format);
  if (config->source_type == config::SourceType::kFile) {
    auto summary = daemon::RunOffline(*config, options);
    if (!summary.ok()) {
      Log(LogLevel::kError, "main", summary.status().ToString());
      return ExitCodeFor(summary.status());
    }
    return 0;
  }
  return RunDaemon(*config, options);
}
