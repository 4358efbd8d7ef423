// Scripted end-to-end LDA run for quality and throughput comparisons with
// the peer kit (scripts/bench_lda_peers.sh drives it). Input: documents as
// vocabulary ids, one JSON object per line with an "ids" array — the output
// of the peer kit's reference tokenizer, so vipsd and the peers train on the
// same tokens. Runs non-private SVI (σ = 0) or private SVI (σ > 0) through
// the real StepDriver and reports JSON: wall and CPU time of the training
// loop, documents/s and tokens/s (documents processed = Σ realised batch
// sizes, which is fine to print here: this is a benchmark on data we own,
// not the daemon), held-out document-completion perplexity, and ε spent.
// "phase_seconds" splits the training wall time by step phase (charge,
// sample, E-step + clip + sum, noise, M-step); "max_rss_mib" is the peak
// resident memory of the whole run (corpus included).
// --unit-cap C runs unit-level privacy (privacy.unit in the daemon) with
// the Wikipedia article as the unit: a paragraph's id "enwiki123_p4"
// belongs to unit "enwiki123"; each step keeps an article with probability
// q and sums at most C of its paragraphs before one clip (the StepDriver's
// DriverConfig::max_records_per_unit). "units" and "unit_cap" are reported.
// λ is written as raw little-endian doubles (K × V, row-major) for the
// script to hand to the peers' evaluator.
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "core/models/lda.h"
#include "core/models/lda_eval.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/strong_composition.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/svi/step_driver.h"
#include "core/svi/step_randomness.h"

namespace {

// The documents' ids; with `names`, also each document's "id" (the peer
// kit's tokenizer keeps it), "" where absent.
std::vector<std::vector<int32_t>> ReadIds(const std::string& path, int64_t* tokens,
                                          std::vector<std::string>* names = nullptr) {
  std::ifstream in(path);
  std::vector<std::vector<int32_t>> docs;
  std::string line;
  *tokens = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto object = nlohmann::json::parse(line);
    docs.push_back(object.at("ids").get<std::vector<int32_t>>());
    *tokens += static_cast<int64_t>(docs.back().size());
    if (names != nullptr) {
      names->push_back(object.contains("id") && object["id"].is_string()
                           ? object["id"].get<std::string>() : std::string());
    }
  }
  return docs;
}

// "enwiki14742_p0" -> "enwiki14742" (scripts/prepare_wikipedia.py's rule).
std::string Article(const std::string& paragraph_id) {
  const size_t cut = paragraph_id.rfind("_p");
  return cut == std::string::npos ? paragraph_id : paragraph_id.substr(0, cut);
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double MaxRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  auto get = [&](const std::string& key, const std::string& fallback) {
    return args.count(key) ? args[key] : fallback;
  };
  if (!args.count("--train") || !args.count("--test") || !args.count("--V")) {
    std::cerr << "usage: lda_svi_run --train IDS.jsonl --test IDS.jsonl --V V [--K 50] "
                 "[--alpha 1/K] [--eta 1/K] [--batch 256] [--passes 1] [--tau0 64] "
                 "[--kappa 0.7] [--threads 1] [--sigma 0] [--N 500] [--clip 0.1] "
                 "[--epsilon 3] [--delta 1e-5] [--seed 0] [--lambda-out FILE] [--vocab FILE]\n"
                 "       [--q Q (instead of --batch)] [--steps T (instead of --passes)]\n"
                 "       [--validation IDS.jsonl] [--eval-every S (perplexity on --test every S steps)]\n"
                 "       [--unit-cap C (unit-level privacy, the article as the unit)]\n"
                 "       [--public-lambda FILE (a public start: K x V doubles as --lambda-out\n"
                 "        writes, from a run on public data)] [--public-weight M (its share\n"
                 "        of the start, model.public_prior.weight; default 0.01)]\n"
                 "       [--lambda-in FILE (start from these K x V doubles exactly, e.g. to\n"
                 "        score a public fit alone with --steps 0)]\n";
    return 2;
  }
  int64_t train_tokens = 0, test_tokens = 0;
  std::vector<std::string> train_names;
  auto train = ReadIds(args["--train"], &train_tokens, &train_names);
  {  // empty documents dropped, as the peer kit does
    size_t kept = 0;
    for (size_t d = 0; d < train.size(); ++d) {
      if (train[d].empty()) continue;
      if (kept != d) {  // (a self-move would empty the string)
        train[kept] = std::move(train[d]);
        train_names[kept] = std::move(train_names[d]);
      }
      ++kept;
    }
    train.resize(kept);
    train_names.resize(kept);
  }
  const int64_t unit_cap = std::stoll(get("--unit-cap", "0"));
  const auto test = ReadIds(args["--test"], &test_tokens);
  int64_t validation_tokens = 0;
  const auto validation = args.count("--validation")
                              ? ReadIds(args["--validation"], &validation_tokens)
                              : std::vector<std::vector<int32_t>>{};
  const int64_t eval_every = std::stoll(get("--eval-every", "0"));
  vipsd::models::LdaConfig lda;
  lda.num_topics = std::stoll(get("--K", "50"));
  lda.vocabulary_size = std::stoll(args["--V"]);
  lda.alpha = std::stod(get("--alpha", std::to_string(1.0 / lda.num_topics)));
  lda.eta = std::stod(get("--eta", std::to_string(1.0 / lda.num_topics)));
  const double sigma = std::stod(get("--sigma", "0"));
  lda.resample_length = sigma > 0 ? std::stoll(get("--N", "500")) : 0;
  lda.clip_fraction = std::stod(get("--clip", "0.1"));
  lda.estep_max_iterations = 100;
  lda.estep_tolerance = 1e-3;
  lda.init_seed = std::stoull(get("--seed", "0"));
  lda.mstep_threads = std::stoi(get("--threads", "1"));  // the M-step uses the driver's threads
  lda.public_start_weight = std::stod(
      get("--public-weight", std::to_string(vipsd::models::kDefaultPublicStartWeight)));
  auto model = vipsd::models::LdaModel::Create(lda);
  if (!model.ok()) {
    std::cerr << model.status().ToString() << "\n";
    return 1;
  }
  if (args.count("--public-lambda") && args.count("--lambda-in")) {
    std::cerr << "--public-lambda and --lambda-in: give one start\n";
    return 2;
  }
  for (const char* flag : {"--public-lambda", "--lambda-in"}) {
    if (!args.count(flag)) continue;
    std::ifstream f(args[flag], std::ios::binary);
    vipsd::model::NamedArray lambda{"lambda", {lda.num_topics, lda.vocabulary_size}, {}};
    lambda.data.resize(static_cast<size_t>(lda.num_topics * lda.vocabulary_size));
    f.read(reinterpret_cast<char*>(lambda.data.data()),
           static_cast<std::streamsize>(lambda.data.size() * sizeof(double)));
    if (!f || f.peek() != std::char_traits<char>::eof()) {
      std::cerr << flag << ": not K x V doubles\n";
      return 2;
    }
    // --public-lambda is model.public_prior (the blended start);
    // --lambda-in sets λ as it is.
    const vipsd::Status set =
        std::string(flag) == "--public-lambda"
            ? (*model)->SetPublicPrior(std::vector<vipsd::model::NamedArray>{lambda})
            : (*model)->SetLambda(Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic,
                                                                  Eigen::Dynamic, Eigen::RowMajor>>(
                  lambda.data.data(), lda.num_topics, lda.vocabulary_size));
    if (!set.ok()) {
      std::cerr << flag << ": " << set.ToString() << "\n";
      return 2;
    }
  }
  const double batch = args.count("--q") ? std::stod(args["--q"]) * static_cast<double>(train.size())
                                          : std::stod(get("--batch", "256"));
  vipsd::svi::DriverConfig driver_config;
  driver_config.mechanism.sampling_rate = std::min(1.0, batch / static_cast<double>(train.size()));
  driver_config.mechanism.noise_multiplier = sigma;
  driver_config.tau0 = std::stod(get("--tau0", "64"));
  driver_config.kappa = std::stod(get("--kappa", "0.7"));
  driver_config.threads = std::stoi(get("--threads", "1"));
  driver_config.delta = std::stod(get("--delta", "1e-5"));
  driver_config.epsilon_ceiling = std::stod(get("--epsilon", "3"));
  driver_config.max_records_per_unit = unit_cap;
  std::unique_ptr<vipsd::privacy::NoiseSource> noise_source;
  if (sigma > 0) {
    auto secure = vipsd::privacy::SecureNoiseSource::Create();
    if (!secure.ok()) return 1;
    noise_source = std::move(*secure);
  } else {  // σ = 0: only the sampling bits are used; a seed makes runs repeatable
    auto seeded =
        vipsd::privacy::SecureNoiseSource::CreateReproducible(std::stoull(get("--seed", "0")));
    if (!seeded.ok()) return 1;
    noise_source = std::move(*seeded);
  }
  vipsd::privacy::RdpAccountant accountant;
  auto driver = vipsd::svi::StepDriver::Create(model->get(), noise_source.get(),
                                               sigma > 0 ? &accountant : nullptr, driver_config);
  if (!driver.ok()) {
    std::cerr << driver.status().ToString() << "\n";
    return 1;
  }
  std::vector<vipsd::model::Record> pool(train.size());
  std::set<std::string> units;
  for (size_t d = 0; d < train.size(); ++d) {
    pool[d].word_ids = train[d];
    if (unit_cap > 0) {
      if (train_names[d].empty()) {
        std::cerr << "--unit-cap: document " << d << " of --train has no \"id\"\n";
        return 2;
      }
      const std::string article = Article(train_names[d]);
      pool[d].unit = vipsd::svi::UnitDigest(article);
      units.insert(article);
    }
  }
  const double passes = std::stod(get("--passes", "1"));
  const auto steps = args.count("--steps") ? std::stoll(args["--steps"]) : static_cast<int64_t>(
      std::ceil(passes * static_cast<double>(train.size()) / batch));
  const auto wall_start = std::chrono::steady_clock::now();
  const double cpu_start = CpuSeconds();
  int64_t ran = 0;
  bool ceiling = false;
  nlohmann::json per_step = nlohmann::json::array();
  double excluded_wall = 0, excluded_cpu = 0;
  vipsd::svi::StepPhaseSeconds phases;  // summed over the steps run
  for (int64_t t = 0; t < steps; ++t) {
    auto result = (*driver)->Step(pool);
    if (!result.ok()) {
      std::cerr << result.status().ToString() << "\n";
      return 1;
    }
    if (result->outcome == vipsd::svi::StepResult::Outcome::kRefusedCeiling) {
      ceiling = true;
      break;
    }
    ++ran;
    phases.charge += result->phase_seconds.charge;
    phases.sample += result->phase_seconds.sample;
    phases.estep += result->phase_seconds.estep;
    phases.noise += result->phase_seconds.noise;
    phases.mstep += result->phase_seconds.mstep;
    if (eval_every > 0 && ran % eval_every == 0) {  // excluded from the timings below
      const auto pause = std::chrono::steady_clock::now();
      const double pause_cpu = CpuSeconds();
      auto at_step = vipsd::models::DocumentCompletion((*model)->lambda(), lda.alpha, test);
      per_step.push_back({{"step", ran}, {"doc_completion_perplexity",
                                          at_step.ok() ? at_step->perplexity : -1.0}});
      excluded_wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - pause).count();
      excluded_cpu += CpuSeconds() - pause_cpu;
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count() -
      excluded_wall;
  const double cpu = CpuSeconds() - cpu_start - excluded_cpu;
  // Expected documents processed: q·D per step (the realised count is not
  // observable through the driver, by design).
  const double docs = static_cast<double>(ran) * driver_config.mechanism.sampling_rate *
                      static_cast<double>(train.size());
  const double tokens_per_doc =
      static_cast<double>(train_tokens) / static_cast<double>(train.size());
  auto completion = vipsd::models::DocumentCompletion((*model)->lambda(), lda.alpha, test);
  nlohmann::json out = {
      {"steps", ran},
      {"stopped_at_ceiling", ceiling},
      {"sampling_rate", driver_config.mechanism.sampling_rate},
      {"threads", driver_config.threads},
      {"sigma", sigma},
      {"train_wall_s", wall},
      {"train_cpu_s", cpu},
      {"docs_per_s", docs / wall},
      {"tokens_per_s", docs * tokens_per_doc / wall},
      {"doc_completion_perplexity", completion.ok() ? completion->perplexity : -1.0},
      // Wall seconds per phase, summed over the steps (svi::StepPhaseSeconds).
      {"phase_seconds", {{"charge", phases.charge}, {"sample", phases.sample},
                         {"estep", phases.estep}, {"noise", phases.noise},
                         {"mstep", phases.mstep}}},
      {"max_rss_mib", MaxRssMiB()},
      {"unit_cap", unit_cap},
  };
  if (unit_cap > 0) out["units"] = units.size();
  if (!per_step.empty()) out["per_step"] = per_step;
  if (!validation.empty()) {
    auto v = vipsd::models::DocumentCompletion((*model)->lambda(), lda.alpha, validation);
    out["validation_doc_completion_perplexity"] = v.ok() ? v->perplexity : -1.0;
  }
  if (sigma > 0) {
    // The daemon's charge (privacy.schedule: fixed): min(PLD, RDP) from the
    // same class the daemon, the planner and the manifests use; and what
    // the RDP accountant alone and the paper's strong-composition baseline
    // would say for the same (q, σ, T).
    auto fixed = vipsd::privacy::FixedScheduleAccountant::Create(
        {driver_config.mechanism.sampling_rate, sigma});
    auto charged = fixed->Epsilon(ran, driver_config.delta);
    out["epsilon"] = charged->epsilon;
    out["epsilon_pld"] = charged->pld;
    out["epsilon_rdp"] = charged->rdp;
    auto strong = vipsd::privacy::StrongCompositionEpsilon(driver_config.mechanism.sampling_rate,
                                                           sigma,
                                                           std::max<int64_t>(ran, 1),
                                                           driver_config.delta);
    out["epsilon_strong_composition"] = strong.ok() ? strong->epsilon : -1.0;
    out["delta"] = driver_config.delta;
  }
  if (args.count("--lambda-out")) {
    std::ofstream f(args["--lambda-out"], std::ios::binary);
    const auto arrays = (*model)->ReleaseArrays();
    f.write(reinterpret_cast<const char*>(arrays[0].data.data()),
            static_cast<std::streamsize>(arrays[0].data.size() * sizeof(double)));
    // The release's other arrays (the noise summaries, core/models/lda.h) as
    // JSON beside it.
    nlohmann::json summaries = nlohmann::json::object();
    for (size_t i = 1; i < arrays.size(); ++i) summaries[arrays[i].name] = arrays[i].data;
    std::ofstream(args["--lambda-out"] + ".summaries.json") << summaries.dump() << "\n";
  }
  if (args.count("--vocab")) {  // top-10 words of every topic (public: from λ)
    std::ifstream vocab_file(args["--vocab"]);
    std::vector<std::string> terms;
    for (std::string term; std::getline(vocab_file, term);) terms.push_back(term);
    const Eigen::MatrixXd& lambda = (*model)->lambda();
    nlohmann::json topics = nlohmann::json::array();
    for (Eigen::Index k = 0; k < lambda.rows(); ++k) {
      std::vector<Eigen::Index> order(static_cast<size_t>(lambda.cols()));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 10, order.end(),
                        [&](Eigen::Index a, Eigen::Index b) { return lambda(k, a) > lambda(k, b); });
      std::string words;
      for (int i = 0; i < 10; ++i) {
        const auto id = static_cast<size_t>(order[static_cast<size_t>(i)]);
        words += (i ? " " : "") + (id < terms.size() ? terms[id] : std::to_string(id));
      }
      topics.push_back(words);
    }
    out["top_words"] = topics;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
