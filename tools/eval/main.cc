// vipsd-eval: held-out quality of an LDA release (public parameters only).
// BLR releases: see tools/eval/blr_eval_command.h.
// SBN releases: see tools/eval/sbn_eval_command.h.
//
//   vipsd-eval RELEASE_DIR --test HELDOUT.jsonl --vocab VOCAB --alpha A [--top-words]
//   vipsd-eval --baseline unigram --train TRAIN.jsonl --test HELDOUT.jsonl --vocab VOCAB --eta E
//
// Prints one JSON object: document-completion perplexity (the peer kit's
// procedure), per-word perplexity bound (Hoffman et al. 2010), documents and
// tokens used, and with --top-words the 10 most probable words per topic.
// Exit 2 on invalid arguments, 1 on unreadable or inconsistent input.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "connectors/file/file_util.h"
#include "connectors/file/jsonl_source.h"
#include "core/models/lda.h"
#include "core/models/lda_eval.h"
#include "core/release/release.h"
#include "core/text/vocabulary.h"
#include "tools/eval/blr_eval_command.h"
#include "tools/eval/sbn_eval_command.h"

namespace {

using namespace vipsd;

int Usage(const std::string& message) {
  std::cerr << "vipsd-eval: " << message << "\n"
            << "usage: vipsd-eval RELEASE_DIR --test FILE --vocab FILE --alpha A [--top-words]\n"
            << "       vipsd-eval --baseline unigram --train FILE --test FILE --vocab FILE --eta E\n";
  return 2;
}

StatusOr<std::vector<std::vector<int32_t>>> ReadDocuments(const std::string& path,
                                                          const text::Vocabulary& vocabulary) {
  VIPSD_ASSIGN_OR_RETURN(auto source, connectors::JsonlDocumentSource::Open(path, vocabulary));
  std::vector<std::vector<int32_t>> documents;
  for (;;) {
    VIPSD_ASSIGN_OR_RETURN(auto line, source.Next());
    if (!line.has_value()) break;
    if (auto* document = std::get_if<text::Document>(&*line)) {
      documents.push_back(std::move(document->word_ids));
    }
  }
  return documents;
}

int Fail(const Status& status) {
  std::cerr << "vipsd-eval: " << status.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  std::string release_dir;
  bool top_words = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: vipsd-eval RELEASE_DIR --test FILE --vocab FILE --alpha A [--top-words]\n"
                   "       vipsd-eval --baseline unigram --train FILE --test FILE --vocab FILE "
                   "--eta E\nPrints one JSON object; see the header of tools/eval/main.cc.\n";
      return 0;
    }
    if (arg == "--top-words") {
      top_words = true;
    } else if (arg.rfind("--", 0) == 0) {
      if (i + 1 >= argc) return Usage(arg + " needs a value");
      flags[arg] = argv[++i];
    } else if (release_dir.empty()) {
      release_dir = arg;
    } else {
      return Usage("unexpected argument '" + arg + "'");
    }
  }
  // BLR releases (manifest model_type "blr"): tools/eval/blr_eval_command.h.
  if (!release_dir.empty()) {
    if (auto status = tools::MaybeRunBlrEval(release_dir, flags, std::cout, std::cerr)) {
      return *status;
    }
    // SBN releases (model_type "sbn"): tools/eval/sbn_eval_command.h.
    if (auto status = tools::MaybeRunSbnEval(release_dir, flags, std::cout, std::cerr)) {
      return *status;
    }
  }
  for (const auto& [flag, value] : flags) {
    if (flag != "--test" && flag != "--vocab" && flag != "--alpha" && flag != "--eta" &&
        flag != "--train" && flag != "--baseline") {
      return Usage("unknown flag " + flag);
    }
  }
  if (!flags.count("--test") || !flags.count("--vocab")) return Usage("--test and --vocab are required");
  auto vocabulary_text = connectors::ReadWholeFile(flags["--vocab"]);
  if (!vocabulary_text.ok()) return Fail(vocabulary_text.status());
  auto vocabulary = text::Vocabulary::Parse(*vocabulary_text);
  if (!vocabulary.ok()) return Fail(vocabulary.status());
  auto test = ReadDocuments(flags["--test"], *vocabulary);
  if (!test.ok()) return Fail(test.status());
  nlohmann::json out;
  if (flags.count("--baseline")) {
    if (flags["--baseline"] != "unigram") return Usage("--baseline must be unigram");
    if (!flags.count("--train") || !flags.count("--eta")) return Usage("unigram needs --train and --eta");
    double eta = 0;
    try {
      eta = std::stod(flags["--eta"]);
    } catch (...) {
      return Usage("--eta must be a number > 0");
    }
    if (!(eta > 0)) return Usage("--eta must be a number > 0");
    auto train = ReadDocuments(flags["--train"], *vocabulary);
    if (!train.ok()) return Fail(train.status());
    auto unigram = models::UnigramBaseline(*train, *test, vocabulary->size(), eta);
    if (!unigram.ok()) return Fail(unigram.status());
    out = {{"baseline", "unigram"},
           {"doc_completion_perplexity", unigram->completion_perplexity},
           {"all_tokens_perplexity", unigram->all_tokens_perplexity},
           {"heldout_tokens", unigram->heldout_tokens},
           {"tokens", unigram->tokens}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  if (release_dir.empty()) return Usage("missing RELEASE_DIR");
  if (!flags.count("--alpha")) return Usage("--alpha is required (the model's Dirichlet prior)");
  double alpha = 0;
  try {
    alpha = std::stod(flags["--alpha"]);
  } catch (...) {
    return Usage("--alpha must be a number > 0");
  }
  if (!(alpha > 0)) return Usage("--alpha must be a number > 0");
  auto manifest_text = connectors::ReadWholeFile(release_dir + "/manifest.json");
  if (!manifest_text.ok()) return Fail(manifest_text.status());
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(*manifest_text);
  } catch (const nlohmann::json::exception&) {
    return Fail(InvalidArgumentError(release_dir + "/manifest.json is not valid JSON"));
  }
  if (manifest.value("vocabulary_fingerprint", "") != vocabulary->Fingerprint()) {
    return Fail(InvalidArgumentError("the release was made with a different vocabulary"));
  }
  auto npy = connectors::ReadWholeFile(release_dir + "/lambda.npy");
  if (!npy.ok()) return Fail(npy.status());
  auto array = release::DecodeNpy(*npy, "lambda");
  if (!array.ok()) return Fail(array.status());
  if (array->shape.size() != 2 || array->shape[1] != vocabulary->size()) {
    return Fail(InvalidArgumentError("lambda is not K x V for this vocabulary"));
  }
  const Eigen::MatrixXd lambda = Eigen::Map<
      Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      array->data.data(), array->shape[0], array->shape[1]);
  auto completion = models::DocumentCompletion(lambda, alpha, *test);
  if (!completion.ok()) return Fail(completion.status());
  models::LdaConfig config;
  config.num_topics = lambda.rows();
  config.vocabulary_size = lambda.cols();
  config.alpha = alpha;
  config.eta = 1.0;  // unused by the bound's document terms
  config.resample_length = 0;
  auto model = models::LdaModel::Create(config);
  if (!model.ok()) return Fail(model.status());
  if (Status s = (*model)->SetLambda(lambda); !s.ok()) return Fail(s);
  auto bound = models::PerWordPerplexityBound(**model, *test);
  if (!bound.ok()) return Fail(bound.status());
  out = {{"release_id", manifest.value("release_id", "")},
         {"step", manifest.value("step", 0)},
         {"epsilon_spent", manifest.value("epsilon_spent", 0.0)},
         {"doc_completion_perplexity", completion->perplexity},
         {"per_word_perplexity_bound", bound->perplexity},
         {"documents", completion->documents},
         {"observed_tokens", completion->observed_tokens},
         {"heldout_tokens", completion->heldout_tokens},
         {"bound_documents", bound->documents},
         {"bound_tokens", bound->tokens}};
  if (top_words) {
    nlohmann::json topics = nlohmann::json::array();
    for (Eigen::Index k = 0; k < lambda.rows(); ++k) {
      std::vector<int32_t> order(static_cast<size_t>(lambda.cols()));
      std::iota(order.begin(), order.end(), 0);
      const size_t n = std::min<size_t>(10, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                        [&](int32_t a, int32_t b) { return lambda(k, a) > lambda(k, b); });
      nlohmann::json words = nlohmann::json::array();
      for (size_t i = 0; i < n; ++i) words.push_back(vocabulary->term(order[i]));
      topics.push_back(words);
    }
    out["top_words"] = topics;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
