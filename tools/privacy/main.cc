#include <iostream>
#include <string>
#include <vector>

#include "tools/privacy/privacy_cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return vipsd::tools::RunPrivacyCli(args, std::cout, std::cerr);
}
