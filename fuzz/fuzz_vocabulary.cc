// The vocabulary reader on arbitrary text: a parsed vocabulary looks up each
// of its own terms at its own index.
#include "core/text/vocabulary.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto vocabulary = text::Vocabulary::Parse(fuzz::AsText(data, size));
  if (!vocabulary.ok()) return 0;
  for (int32_t i = 0; i < vocabulary->size(); ++i) {
    if (vocabulary->Find(vocabulary->term(i)) != i) fuzz::Violated("term does not map back");
  }
  return 0;
}
