// vipsd: differentially private streaming variational Bayes.
//
//   vipsd --config FILE [--check-config]
//   vipsd status --state DIR [--delta D] [--json]
//
// source.type: file  → the offline run (daemon/service/offline_run.h);
// source.type: kafka → the daemon (daemon/service/daemon.h), until SIGTERM/SIGINT,
//                      reloading on SIGHUP; with kafka.embedded: true it
//                      first starts an in-process Kafka (daemon/io/embedded.h).
// Runs in the foreground (systemd Type=notify; never self-daemonises).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "config/config.h"
#include "core/base/log.h"
#include "daemon/service/check_config.h"
#include "daemon/service/daemon.h"
#include "daemon/service/offline_run.h"
#include "daemon/service/service.h"
#include "daemon/setup/federation.h"
#include "daemon/state/state_status.h"

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
    "                                 window against the epsilon ceiling; with Kafka,\n"
    "                                 the capacity margin and a worst-case step timed\n"
    "                                 on synthetic records against the slot: refused\n"
    "                                 when its CPU time over its threads does not fit,\n"
    "                                 and, for a private run with on_overrun: stop or a\n"
    "                                 holder, when 1.5 x the faster of two timed runs\n"
    "                                 does not (the claim's beta needs that margin); a\n"
    "                                 warning otherwise when 1.5 x a run does not fit.\n"
    "                                 Every start checks this too, and every reload\n"
    "                                 that changes q, sigma, threads, the slot's times,\n"
    "                                 max_steps or pool.capacity (refused: the old\n"
    "                                 configuration keeps running)\n"
    "  vipsd --config FILE --no-step-time-check\n"
    "                                 start without timing the worst-case step, at the\n"
    "                                 start or at reloads (for throughput benchmarks\n"
    "                                 whose slots are meant to overrun: beta is then not\n"
    "                                 bounded, SECURITY.md \"Overruns\");\n"
    "                                 with --check-config, check FILE as such a start\n"
    "                                 would: everything but that timing\n"
    "  vipsd status --state DIR [--delta D] [--json]\n"
    "                                 what a state directory holds, read without the\n"
    "                                 lock and without writing: mode, schedule, next\n"
    "                                 step, epsilon spent (the daemon's own computation,\n"
    "                                 at the delta the ledger records; --delta, or the\n"
    "                                 delta in DIR/status.json, only for a ledger written\n"
    "                                 before vipsd recorded it), ceiling, streams, checkpoint,\n"
    "                                 last release, whether the daemon runs. Exit 0\n"
    "                                 when ledger and checkpoint verify, 1 when not,\n"
    "                                 2 for no ledger or a bad command line\n"
    "  vipsd federation-keygen --out PATH\n"
    "                                 a federated data holder's X25519 key pair: the\n"
    "                                 secret key to PATH (created, mode 0600, never\n"
    "                                 overwritten; federation.secret_key: {file: PATH}),\n"
    "                                 the public key printed for every configuration's\n"
    "                                 federation.holders (docs/federation.md)\n"
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

int KeygenCommand(int argc, char** argv) {
  std::string path;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else {
      std::cerr << "vipsd federation-keygen: unknown argument '" << arg << "'; see --help\n";
      return 2;
    }
  }
  if (path.empty()) {
    std::cerr << "vipsd federation-keygen: missing --out PATH; see --help\n";
    return 2;
  }
  auto public_key = daemon::WriteNewHolderKey(path);
  if (!public_key.ok()) {
    std::cerr << "vipsd federation-keygen: " << public_key.status().message() << "\n";
    return 2;
  }
  std::cout << *public_key << "\n";
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "status") return StatusCommand(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "federation-keygen") return KeygenCommand(argc, argv);
  std::string config_path;
  bool check_only = false;
  bool step_time_check = true;
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
    } else if (arg == "--no-step-time-check") {
      step_time_check = false;
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
  // With log.format: json every line on stderr is one JSON object, from
  // the first warning on (a log shipper rejects anything else). Legal but
  // unwise values are said at --check-config and at every start.
  SetLogFormat(config->log_format);
  daemon::SayConfigWarnings(&*config);
  if (check_only) return daemon::CheckConfigCommand(*config, config_path, options, step_time_check);
  SetMinLogLevel(config->log_level);
  // Every start times the worst-case step too (before the Kafka clients
  // start, so the group join does not wait on it), refused as --check-config
  // refuses it; reloads are timed by the daemon (options.step_time_check).
  if (config->source_type == config::SourceType::kKafka && step_time_check) {
    // A stop asked for while the step is timed is kept pending for the
    // service's signal thread (Service::Run blocks the same set), which
    // then stops cleanly, instead of killing the process mid-timing.
    sigset_t signals;
    sigemptyset(&signals);
    for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&signals, signal);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::string timing;
    if (!daemon::TimeWorstCaseStep(*config, /*check_only=*/false, &timing)) return 2;
    if (!timing.empty()) Log(LogLevel::kInfo, "main", timing);
    options.time_reloads = true;
  } else if (config->source_type == config::SourceType::kKafka) {
    Log(LogLevel::kWarning, "main", daemon::UntimedStartWarning());
  }
  if (config->source_type == config::SourceType::kFile) {
    auto summary = daemon::RunOffline(*config, options);
    if (!summary.ok()) {
      Log(LogLevel::kError, "main", summary.status().ToString());
      return daemon::ExitCodeFor(summary.status());
    }
    return 0;
  }
  return daemon::RunService(*config, options);
}
