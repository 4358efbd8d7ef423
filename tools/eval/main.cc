// vipsd-eval: held-out quality of an LDA release (public parameters only).
// BLR releases: see tools/eval/blr_eval_command.h.
// SBN releases: see tools/eval/sbn_eval_command.h.
//
//   vipsd-eval RELEASE_DIR --test HELDOUT.jsonl --vocab VOCAB [--alpha A] [--top-words]
//   vipsd-eval --baseline unigram --train TRAIN.jsonl --test HELDOUT.jsonl --vocab VOCAB --eta E
//
// Prints one JSON object: document-completion perplexity (the peer kit's
// procedure), per-word perplexity bound (Hoffman et al. 2010), documents and
// tokens used, the noise the release states (noise_floor, noise_share, ...)
// when it carries it, and with --top-words the 10 most probable words per
// topic.
// Exit 2 on invalid arguments, 1 on unreadable or inconsistent input.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "connectors/file/file_util.h"
#include "connectors/file/jsonl_source.h"
#include "connectors/file/release_reader.h"
#include "core/models/lda.h"
#include "core/models/lda_eval.h"
#include "core/release/release.h"
#include "core/text/vocabulary.h"
#include "tools/eval/blr_eval_command.h"
#include "tools/eval/sbn_eval_command.h"

namespace {

using namespace vipsd;

#ifndef VIPSD_VERSION
#define VIPSD_VERSION "unknown"
#endif

constexpr const char* kUsage =
    "usage:\n"
    "  vipsd-eval RELEASE_DIR --test FILE --vocab FILE [--alpha A] [--top-words] (LDA)\n"
    "  vipsd-eval --baseline unigram --train FILE --test FILE --vocab FILE --eta E\n"
    "  vipsd-eval RELEASE_DIR --test FILE [--norm-rule reject|rescale]          (BLR)\n"
    "             [--reference RELEASE_DIR]\n"
    "  vipsd-eval RELEASE_DIR --test FILE [--train FILE] [--samples 100] [--seed 0]\n"
    "             [--threads 1] [--estep-iterations 100] [--estep-tolerance 1e-4]  (SBN)\n"
    "  vipsd-eval --version | --help\n";

constexpr const char* kHelp =
    "vipsd-eval " VIPSD_VERSION ": held-out quality of a vipsd release (public parameters only).\n"
    "The release's manifest.json (model_type) chooses the model; every release is read and\n"
    "checked by the release reader (connectors/file/release_reader.h) first.\n"
    "\n"
    "LDA: document-completion perplexity (the first half of each held-out document's\n"
    "  tokens estimate its topic mix, the rest is scored), the per-word perplexity bound,\n"
    "  documents and tokens used, malformed lines (rejected_records); the noise the\n"
    "  release states: the mass a topic-word cell without counts holds from the privacy\n"
    "  noise (noise_floor, its variance noise_floor_variance), the noise variance of a\n"
    "  cell with counts (noise_variance) and each topic's share of mass that is noise\n"
    "  (noise_share); --top-words adds\n"
    "  the 10 most probable words per topic. alpha (the document-topic prior) is the\n"
    "  release's own (manifest hyperparameters); --alpha overrides it and is needed for\n"
    "  releases written before manifests carried it. --vocab must be the vocabulary the\n"
    "  release names (fingerprint checked; manifest vocabulary_source says where it\n"
    "  lives). The unigram baseline (--baseline unigram) fits word\n"
    "  frequencies on --train with pseudo-count --eta.\n"
    "BLR: AUC, log loss and accuracy of the probit-approximated predictive on --test\n"
    "  ({\"x\": [...], \"y\": 0|1} lines, the training record format; records with ||x|| > 1\n"
    "  are rejected by default, --norm-rule rescale rescales them). --reference DIR (for\n"
    "  example a non-private release on the same data) adds how often this release's\n"
    "  central 50 % and 95 % intervals contain DIR's mean, over the coefficients, and\n"
    "  the median ratio of their marginal sds.\n"
    "SBN: reconstruction accuracy (the paper's protocol: sampled z) and an\n"
    "  importance-sampled held-out log-likelihood under the posterior means (--samples\n"
    "  draws per record; 0 skips it), against a per-pixel marginal baseline fitted on\n"
    "  --train (on --test itself when --train is absent, which flatters the baseline).\n"
    "\n"
    "Prints one JSON object. Exit 0 on success, 2 on invalid arguments, 1 on unreadable\n"
    "or inconsistent input (one line on stderr naming the file).\n";

int Usage(const std::string& message) {
  std::cerr << "vipsd-eval: " << message << "\n" << kUsage;
  return 2;
}

struct Documents {
  std::vector<std::vector<int32_t>> word_ids;
  int64_t rejected = 0;  // malformed lines, each also reported on stderr
};

// The documents of a JSONL file; a malformed line is counted and reported
// (its line number and reason, never its content), as BLR and SBN do.
StatusOr<Documents> ReadDocuments(const std::string& path, const text::Vocabulary& vocabulary) {
  VIPSD_ASSIGN_OR_RETURN(auto source, connectors::JsonlDocumentSource::Open(path, vocabulary));
  Documents documents;
  for (;;) {
    VIPSD_ASSIGN_OR_RETURN(auto line, source.Next());
    if (!line.has_value()) break;
    if (auto* document = std::get_if<text::Document>(&*line)) {
      documents.word_ids.push_back(std::move(document->word_ids));
    } else {
      const auto& rejection = std::get<connectors::Rejection>(*line);
      ++documents.rejected;
      std::cerr << "vipsd-eval: " << path << ": skipped " << rejection.reason << "\n";
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
      std::cout << kHelp << "\n" << kUsage;
      return 0;
    }
    if (arg == "--version") {
      std::cout << "vipsd-eval " VIPSD_VERSION "\n";
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
  auto vocabulary_text = connectors::ReadRegularFile(flags["--vocab"], connectors::kMaxVocabularyBytes);
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
    auto unigram = models::UnigramBaseline(train->word_ids, test->word_ids,
                                           vocabulary->size(), eta);
    if (!unigram.ok()) return Fail(unigram.status());
    out = {{"baseline", "unigram"},
           {"doc_completion_perplexity", unigram->completion_perplexity},
           {"all_tokens_perplexity", unigram->all_tokens_perplexity},
           {"heldout_tokens", unigram->heldout_tokens},
           {"tokens", unigram->tokens},
           {"rejected_records", test->rejected + train->rejected}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  if (release_dir.empty()) return Usage("missing RELEASE_DIR");
  std::optional<double> alpha_flag;
  if (flags.count("--alpha")) {
    try {
      alpha_flag = std::stod(flags["--alpha"]);
    } catch (...) {
      return Usage("--alpha must be a number > 0");
    }
    if (!(*alpha_flag > 0)) return Usage("--alpha must be a number > 0");
  }
  // The whole release, by the one C++ reader's rules (docs/release_format.md).
  auto release = connectors::ReadReleaseDirectory(release_dir);
  if (!release.ok()) return Fail(release.status());
  const release::ReleaseMetadata& manifest = release->metadata;
  if (manifest.model_type != "lda") {
    return Fail(InvalidArgumentError(release_dir + " holds a " + manifest.model_type +
                                     " release, not an LDA one"));
  }
  if (manifest.vocabulary_fingerprint != vocabulary->Fingerprint()) {
    return Fail(InvalidArgumentError(
        "the release was made with a different vocabulary" +
        (manifest.vocabulary_source.empty()
             ? std::string()
             : " (its manifest names " + manifest.vocabulary_source + ")")));
  }
  // α: the release's own (manifest hyperparameters), or --alpha for releases
  // written before the manifest carried it (or to evaluate with another).
  std::optional<double> alpha_manifest;
  for (const auto& [name, value] : manifest.hyperparameters) {
    if (name == "alpha") alpha_manifest = value;
  }
  if (!alpha_flag && !alpha_manifest) {
    return Usage("the release's manifest does not give alpha (written before it did): pass "
                 "--alpha, the model.lda.alpha the run used");
  }
  const double alpha = alpha_flag ? *alpha_flag : *alpha_manifest;
  const std::string alpha_source = alpha_flag ? "flag" : "manifest";
  if (alpha_flag && alpha_manifest && *alpha_flag != *alpha_manifest) {
    std::cerr << "vipsd-eval: --alpha " << *alpha_flag << " differs from the release's alpha "
              << *alpha_manifest << "; evaluating with --alpha\n";
  }
  const release::ReleaseArray* array = nullptr;
  for (const release::ReleaseArray& candidate : release->arrays) {
    if (candidate.name == "lambda") array = &candidate;
  }
  if (array == nullptr) return Fail(InvalidArgumentError(release_dir + " has no lambda array"));
  if (array->shape.size() != 2 || array->shape[1] != vocabulary->size()) {
    return Fail(InvalidArgumentError("lambda is not K x V for this vocabulary"));
  }
  const Eigen::MatrixXd lambda = Eigen::Map<
      const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      array->data.data(), array->shape[0], array->shape[1]);
  auto completion = models::DocumentCompletion(lambda, alpha, test->word_ids);
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
  auto bound = models::PerWordPerplexityBound(**model, test->word_ids);
  if (!bound.ok()) return Fail(bound.status());
  out = {{"release_id", manifest.release_id},
         {"step", manifest.step},
         {"epsilon_spent", manifest.epsilon_spent},
         {"alpha", alpha},
         {"alpha_source", alpha_source},
         {"doc_completion_perplexity", completion->perplexity},
         {"per_word_perplexity_bound", bound->perplexity},
         {"documents", completion->documents},
         {"observed_tokens", completion->observed_tokens},
         {"heldout_tokens", completion->heldout_tokens},
         {"bound_documents", bound->documents},
         {"bound_tokens", bound->tokens},
         {"rejected_records", test->rejected}};
  // The noise the release states (core/models/lda.h, "M-step"): the mass a
  // cell without counts holds from the noise, its sd, the noise sd of a cell
  // with counts, and each topic's share of mass that is noise.
  for (const release::ReleaseArray& candidate : release->arrays) {
    if (candidate.data.size() == 1 &&
        (candidate.name == "noise_floor" || candidate.name == "noise_floor_variance" ||
         candidate.name == "noise_variance")) {
      out[candidate.name] = candidate.data[0];
    } else if (candidate.name == "noise_share") {
      out["noise_share"] = candidate.data;
    }
  }
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
