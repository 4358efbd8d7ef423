#include <iostream>
#include <string>
#include <vector>

#include "tools/privacy/privacy_cli.h"

#ifndef VIPSD_VERSION
#define VIPSD_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--version") {
    std::cout << "vipsd-privacy " VIPSD_VERSION "\n";
    return 0;
  }
  return vipsd::tools::RunPrivacyCli(args, std::cout, std::cerr);
}
