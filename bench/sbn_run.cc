// Scripted end-to-end run of the sigmoid belief network (core/models/sbn.h)
// for quality experiments (scripts/bench_sbn_fashion.sh drives it). Records
// are JSON Lines {"y": [0, 1, ...]} decoded by the daemon's own decoder
// (connectors/decode/sbn_record_decoder.h). Runs non-private SVI (σ = 0) or
// private SVI (σ > 0, secure noise, RDP accountant) through the real
// svi::StepDriver, and prints one JSON object: the configuration, ε spent,
// the held-out curve (every --eval-every steps), the final held-out
// reconstruction accuracy (paper protocol and from E[z]), the importance-
// sampling log-likelihood estimate, the per-pixel marginal baseline fitted
// on the training records, and wall/CPU time. This is a benchmark on data
// we own, not the daemon: it may print anything about its own data.
//
// σ: --sigma S, or --target-epsilon E to take the smallest σ (3 digits) that
// keeps ε(q, σ, steps, δ) ≤ E under the RDP accountant (core/privacy/accounting/planner.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "connectors/decode/sbn_record_decoder.h"
#include "core/models/sbn.h"
#include "core/models/sbn_eval.h"
#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/svi/step_driver.h"

namespace {

using namespace vipsd;

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

StatusOr<std::vector<std::vector<double>>> ReadRecords(const std::string& path, int64_t visible,
                                                       int64_t limit) {
  std::ifstream in(path);
  if (!in) return InvalidArgumentError("cannot read " + path);
  auto decoder = connectors::NewSbnRecordDecoder(visible);
  std::vector<std::vector<double>> records;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line) && (limit <= 0 || static_cast<int64_t>(records.size()) < limit)) {
    ++line_number;
    if (line.empty()) continue;
    auto decoded = decoder->Decode(line);
    if (auto* failure = std::get_if<connectors::DecodeFailure>(&decoded)) {
      return InvalidArgumentError(path + ":" + std::to_string(line_number) + ": " +
                                  std::string(connectors::RejectReasonName(failure->reason)));
    }
    records.push_back(std::move(std::get<model::Record>(decoded).features));
  }
  return records;
}

int Fail(const std::string& message) {
  std::cerr << "sbn_run: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  auto get = [&](const std::string& key, const std::string& fallback) {
    return args.count(key) ? args[key] : fallback;
  };
  if (!args.count("--train") || !args.count("--test") || argc % 2 == 0) {
    std::cerr << "usage: sbn_run --train Y.jsonl --test Y.jsonl [--J 784] [--K 50]\n"
                 "  [--train-limit 0] [--test-limit 0] [--batch 100] [--steps 100]\n"
                 "  [--tau0 1] [--kappa 0.7] [--sigma 0 | --target-epsilon E] [--delta 1e-5]\n"
                 "  [--threads 1] [--seed 0] [--eval-every 0] [--samples 100]\n"
                 "  [--estep-iterations 100] [--estep-tolerance 1e-3] [--weight-prior 1]\n"
                 "  [--clip-xi-zz 1] [--clip-y-z 1] [--clip-xi-z 1]\n";
    return 2;
  }
  try {
    const int64_t visible = std::stoll(get("--J", "784"));
    models::SbnConfig sbn;
    sbn.visible = visible;
    sbn.hidden = std::stoll(get("--K", "50"));
    sbn.weight_prior_precision = std::stod(get("--weight-prior", "1"));
    sbn.estep_max_iterations = std::stoi(get("--estep-iterations", "100"));
    sbn.estep_tolerance = std::stod(get("--estep-tolerance", "1e-3"));
    sbn.init_seed = std::stoull(get("--seed", "0"));
    sbn.clip_fractions.xi_zz = std::stod(get("--clip-xi-zz", "1"));
    sbn.clip_fractions.y_z = std::stod(get("--clip-y-z", "1"));
    sbn.clip_fractions.xi_z = std::stod(get("--clip-xi-z", "1"));
    auto train = ReadRecords(args["--train"], visible, std::stoll(get("--train-limit", "0")));
    if (!train.ok()) return Fail(train.status().message());
    auto test = ReadRecords(args["--test"], visible, std::stoll(get("--test-limit", "0")));
    if (!test.ok()) return Fail(test.status().message());
    if (train->empty() || test->empty()) return Fail("no records");
    auto model = models::SbnModel::Create(sbn);
    if (!model.ok()) return Fail(model.status().ToString());

    const double batch = std::stod(get("--batch", "100"));
    const int64_t steps = std::stoll(get("--steps", "100"));
    svi::DriverConfig driver_config;
    driver_config.mechanism.sampling_rate = std::min(1.0,
                                                     batch / static_cast<double>(train->size()));
    driver_config.tau0 = std::stod(get("--tau0", "1"));
    driver_config.kappa = std::stod(get("--kappa", "0.7"));
    driver_config.threads = std::stoi(get("--threads", "1"));
    driver_config.delta = std::stod(get("--delta", "1e-5"));
    double sigma = std::stod(get("--sigma", "0"));
    double target_epsilon = 0;
    if (args.count("--target-epsilon")) {
      target_epsilon = std::stod(args["--target-epsilon"]);
      auto planned = privacy::NoiseMultiplierForEpsilon(
          privacy::AccountantKind::kRdp, target_epsilon, driver_config.mechanism.sampling_rate,
          steps, driver_config.delta);
      if (!planned.ok()) return Fail(planned.status().ToString());
      sigma = *planned;
    }
    driver_config.mechanism.noise_multiplier = sigma;
    driver_config.epsilon_ceiling = target_epsilon > 0 ? target_epsilon * (1 + 1e-9) : 1e9;

    std::unique_ptr<privacy::NoiseSource> noise;
    if (sigma > 0) {
      auto secure = privacy::SecureNoiseSource::Create();
      if (!secure.ok()) return Fail(secure.status().ToString());
      noise = std::move(*secure);
    } else {  // σ = 0: only the sampling bits are used; a seed makes runs repeatable
      auto seeded = privacy::SecureNoiseSource::CreateReproducible(sbn.init_seed);
      if (!seeded.ok()) return Fail(seeded.status().ToString());
      noise = std::move(*seeded);
    }
    privacy::RdpAccountant accountant;
    auto driver = svi::StepDriver::Create(model->get(), noise.get(),
                                          sigma > 0 ? &accountant : nullptr, driver_config);
    if (!driver.ok()) return Fail(driver.status().ToString());
    std::vector<model::Record> pool(train->size());
    for (size_t i = 0; i < train->size(); ++i) pool[i].features = (*train)[i];

    models::SbnEvalOptions eval_options;
    eval_options.estep_max_iterations = sbn.estep_max_iterations;
    eval_options.estep_tolerance = sbn.estep_tolerance;
    eval_options.importance_samples = std::stoi(get("--samples", "100"));
    eval_options.threads = driver_config.threads;
    eval_options.seed = 12345;
    auto evaluate = [&]() -> nlohmann::json {
      auto result = models::EvaluateSbnHeldOut((*model)->expectations(), *test, eval_options);
      if (!result.ok()) return {{"error", result.status().ToString()}};
      return {{"accuracy_sampled", result->accuracy_sampled},
              {"accuracy_mean", result->accuracy_mean},
              {"loglik_per_record", result->loglik_per_record},
              {"mean_estep_iterations", result->mean_estep_iterations},
              {"records_at_max_iterations", result->records_at_max_iterations}};
    };
    const int64_t eval_every = std::stoll(get("--eval-every", "0"));
    nlohmann::json curve = nlohmann::json::array();
    if (eval_every > 0) {
      nlohmann::json point = evaluate();
      point["step"] = 0;
      curve.push_back(point);
    }
    const auto wall_start = std::chrono::steady_clock::now();
    const double cpu_start = CpuSeconds();
    double train_wall = 0;
    int64_t ran = 0;
    bool ceiling = false;
    for (int64_t t = 1; t <= steps; ++t) {
      const auto step_start = std::chrono::steady_clock::now();
      auto result = (*driver)->Step(pool);
      if (!result.ok()) return Fail(result.status().ToString());
      train_wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      if (result->outcome == svi::StepResult::Outcome::kRefusedCeiling) {
        ceiling = true;
        break;
      }
      ++ran;
      if (eval_every > 0 && t % eval_every == 0 && t != steps) {
        nlohmann::json point = evaluate();
        point["step"] = t;
        if (sigma > 0) point["epsilon"] = result->epsilon_spent;
        curve.push_back(point);
        std::cerr << "sbn_run: " << point.dump() << "\n";
      }
    }
    const double cpu = CpuSeconds() - cpu_start;
    nlohmann::json final_eval = evaluate();
    final_eval["step"] = ran;
    if (eval_every > 0) curve.push_back(final_eval);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    auto baseline = models::SbnMarginalBaseline(*train, *test);
    nlohmann::json out = {
        {"J", visible},
        {"K", sbn.hidden},
        {"train_records", train->size()},
        {"test_records", test->size()},
        {"sampling_rate", driver_config.mechanism.sampling_rate},
        {"expected_batch",
         driver_config.mechanism.sampling_rate * static_cast<double>(train->size())},
        {"steps", ran},
        {"stopped_at_ceiling", ceiling},
        {"tau0", driver_config.tau0},
        {"kappa", driver_config.kappa},
        {"sigma", sigma},
        {"delta", driver_config.delta},
        {"clip_fraction_xi_zz", sbn.clip_fractions.xi_zz},
        {"clip_fraction_y_z", sbn.clip_fractions.y_z},
        {"clip_fraction_xi_z", sbn.clip_fractions.xi_z},
        {"threads", driver_config.threads},
        {"train_wall_s", train_wall},
        {"total_wall_s", wall},
        {"cpu_s", cpu},
        {"final", final_eval},
        {"curve", curve},
    };
    if (baseline.ok()) {
      out["marginal_baseline"] = {{"accuracy", baseline->accuracy},
                                  {"loglik_per_record", baseline->loglik_per_record}};
    }
    if (sigma > 0) {
      auto spent = accountant.GetEpsilon(driver_config.delta);
      out["epsilon"] = spent.ok() ? spent->epsilon : -1.0;
      out["target_epsilon"] = target_epsilon;
    }
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    return Fail(std::string("bad argument: ") + e.what());
  }
}
