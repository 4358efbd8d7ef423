// vipsd: differentially private streaming variational Bayes.
//
//   vipsd --config FILE [--check-config]
//
// Today the daemon runs the offline path (file source, file sink); the Kafka
// source and sink arrive with the streaming-daemon issue.
#include <cstring>
#include <iostream>
#include <string>

#include "config/config.h"
#include "core/base/log.h"
#include "daemon/offline_run.h"

namespace {

constexpr const char* kUsage =
    "vipsd: differentially private streaming variational Bayes (VIPS)\n"
    "\n"
    "Usage:\n"
    "  vipsd --config FILE            run (today: the offline file-to-file run)\n"
    "  vipsd --config FILE --check-config\n"
    "                                 validate FILE and exit (0 valid, 2 invalid)\n"
    "  vipsd --help\n"
    "\n"
    "Every key is documented in config/examples/lda_offline.yaml and README\n"
    "\"Configuration\". Logs go to stderr (logfmt) and carry only public values.\n"
    "Exit codes: 0 done (including a stop at the epsilon ceiling), 1 run-time\n"
    "failure, 2 invalid command line or configuration.\n";

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--check-config") {
      check_only = true;
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
  auto config = vipsd::config::LoadConfigFile(config_path);
  if (!config.ok()) {
    std::cerr << "vipsd: " << config.status().message() << "\n";
    return 2;
  }
  if (check_only) {
    std::cout << "vipsd: " << config_path << " is valid\n";
    return 0;
  }
  auto summary = vipsd::daemon::RunOffline(*config);
  if (!summary.ok()) {
    vipsd::Log(vipsd::LogLevel::kError, "main", summary.status().ToString());
    return 1;
  }
  return 0;
}
