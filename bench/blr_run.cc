// Scripted end-to-end Bayesian logistic regression run (VIPS Algorithm 5)
// for quality experiments (scripts/bench_blr_adult.sh drives it). Reads
// training and held-out records in the daemon's BLR record format
// (connectors/decode/blr_record_decoder.h), runs non-private SVI (σ = 0) or
// private SVI (σ > 0, OS-seeded ChaCha20 noise, RDP accountant with the
// ε ceiling) through the real svi::StepDriver, and prints one JSON object:
// steps run, q, σ, ε spent (RDP, improved conversion) at δ, training wall
// time, E[α], and held-out AUC / log-loss / accuracy of the release
// (probit approximation, core/models/blr_eval.h). With --newton L2 it also
// fits a non-private L2-penalised logistic regression by Newton's method on
// the same training records (the baseline; L2 = 1/C of scikit-learn).
// --target-epsilon E picks σ with the planner (core/privacy/accounting/planner.h, RDP):
// the smallest 3-digit σ whose ε after --steps steps at rate q is ≤ E.
// --release-dir DIR writes the final release (manifest + .npy) for
// `vipsd-eval DIR --test FILE`; --public-prior DIR makes a non-private
// release the prior (model.public_prior, docs/models.md "Public priors").
//
// This is a benchmark on data we own, not the daemon: it prints counts of
// rejected records, which the daemon would never do.
#include <nlohmann/json.hpp>

#include <Eigen/Cholesky>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "connectors/decode/blr_record_decoder.h"
#include "connectors/file/release_reader.h"
#include "core/models/blr.h"
#include "core/models/blr_eval.h"
#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/release/release.h"
#include "core/svi/step_driver.h"

namespace {

using namespace vipsd;

struct Records {
  std::vector<model::Record> records;
  int64_t rejected = 0;
};

StatusOr<Records> ReadRecords(const std::string& path, int64_t dim, connectors::NormRule rule) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open " + path);
  const auto decoder = connectors::NewBlrRecordDecoder(dim, rule);
  Records out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto decoded = decoder->Decode(line);
    if (auto* record = std::get_if<model::Record>(&decoded)) {
      out.records.push_back(std::move(*record));
    } else {
      ++out.rejected;
    }
  }
  return out;
}

// argmin_w Σ_n [log(1 + e^{wᵀx_n}) − y_n wᵀx_n] + (l2/2)‖w‖², Newton's method.
Eigen::VectorXd NewtonLogisticRegression(const std::vector<model::Record>& train, int64_t dim,
                                         double l2) {
  const auto n = static_cast<Eigen::Index>(train.size());
  Eigen::MatrixXd x(n, dim);
  Eigen::VectorXd y(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    x.row(i) = Eigen::Map<const Eigen::RowVectorXd>(train[i].features.data(), dim);
    y[i] = train[i].label;
  }
  Eigen::VectorXd w = Eigen::VectorXd::Zero(dim);
  for (int iteration = 0; iteration < 100; ++iteration) {
    const Eigen::VectorXd p = (x * w).unaryExpr([](double z) { return models::Sigmoid(z); });
    const Eigen::VectorXd gradient = x.transpose() * (p - y) + l2 * w;
    const Eigen::VectorXd weight = p.array() * (1 - p.array());
    Eigen::MatrixXd hessian = x.transpose() * weight.asDiagonal() * x;
    hessian.diagonal().array() += l2;
    const Eigen::VectorXd step = hessian.llt().solve(gradient);
    w -= step;
    if (step.norm() < 1e-12 * (1 + w.norm())) break;
  }
  return w;
}

Status WriteRelease(const std::string& directory, const models::BlrModel& model,
                    const svi::DriverConfig& driver, int64_t steps, double rho, double epsilon,
                    bool is_private, const std::string& noise_description) {
  release::Release r;
  auto& m = r.metadata;
  m.release_id = "step-" + std::to_string(steps);
  m.model_type = "blr";
  m.step = steps;
  m.rho = rho;
  m.epsilon_spent = is_private ? epsilon : 0;
  m.delta = is_private ? driver.delta : 0;
  m.noise_multiplier = driver.mechanism.noise_multiplier;
  m.sampling_rate = driver.mechanism.sampling_rate;
  m.accountant = is_private ? "rdp" : "none";
  // One (q, σ) for every step, charged by the RDP accountant (its improved
  // conversion): the release format requires both names of a private one.
  m.schedule = is_private ? "fixed" : "none";
  m.conversion = is_private ? "rdp_improved" : "none";
  for (const auto& block : model.statistic_layout().blocks()) {
    m.clip_bounds.emplace_back(block.name, block.clip_bound);
  }
  m.dimensions = model.dimensions();
  m.config_fingerprint = release::Blake2bHex("blr_run " + std::to_string(model.config().dim));
  m.is_private = is_private;
  m.noise_description = noise_description;
  m.created_at_utc = "1970-01-01T00:00:00Z";  // experiments: a fixed, obviously synthetic stamp
  for (const auto& array : model.ReleaseArrays()) {
    r.arrays.push_back({array.name, array.shape, array.data});
  }
  VIPSD_ASSIGN_OR_RETURN(auto encoded, release::EncodeRelease(r));
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) return UnavailableError("cannot create " + directory);
  for (const auto& file : encoded.files) {
    std::ofstream out(directory + "/" + file.name, std::ios::binary | std::ios::trunc);
    out << file.bytes;
    if (!out) return UnavailableError("cannot write " + directory + "/" + file.name);
  }
  return Status::Ok();
}

int Fail(const Status& status) {
  std::cerr << "blr_run: " << status.ToString() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  auto get = [&](const std::string& key, const std::string& fallback) {
    return args.count(key) ? args[key] : fallback;
  };
  if (argc % 2 == 0 || !args.count("--train") || !args.count("--test") || !args.count("--dim")) {
    std::cerr << "usage: blr_run --train FILE --test FILE --dim D [--q 0.01] [--steps 1000] "
                 "[--sigma 0 | --target-epsilon E] [--delta 1e-5] [--tau0 1] [--kappa 0.7] "
                 "[--threads 1] [--a0 1] [--b0 1] [--eigenvalue-floor 1e-6] "
                 "[--prior-groups G0,G1,...] "
                 "[--norm-rule reject|rescale] [--seed 0] [--newton L2] [--release-dir DIR] "
                 "[--public-prior RELEASE_DIR]\n";
    return 2;
  }
  const int64_t dim = std::stoll(args["--dim"]);
  const auto rule = connectors::ParseNormRule(get("--norm-rule", "reject"));
  if (!rule.has_value()) return Fail(InvalidArgumentError("--norm-rule must be reject or rescale"));
  auto train = ReadRecords(args["--train"], dim, *rule);
  if (!train.ok()) return Fail(train.status());
  auto test = ReadRecords(args["--test"], dim, *rule);
  if (!test.ok()) return Fail(test.status());

  models::BlrConfig config;
  config.dim = dim;
  config.prior_shape = std::stod(get("--a0", "1"));
  config.prior_rate = std::stod(get("--b0", "1"));
  config.eigenvalue_floor = std::stod(get("--eigenvalue-floor", "1e-6"));
  if (args.count("--prior-groups")) {  // comma-separated, one group index per coefficient
    std::stringstream list(args["--prior-groups"]);
    for (std::string item; std::getline(list, item, ',');) {
      config.prior_group.push_back(std::stoi(item));
    }
  }
  auto model = models::BlrModel::Create(config);
  if (!model.ok()) return Fail(model.status());
  if (args.count("--public-prior")) {  // model.public_prior: a non-private BLR release
    auto prior = connectors::ReadReleaseDirectory(args["--public-prior"]);
    if (!prior.ok()) return Fail(prior.status());
    if (prior->metadata.is_private || prior->metadata.model_type != "blr") {
      return Fail(InvalidArgumentError("--public-prior: not a non-private BLR release"));
    }
    std::vector<model::NamedArray> arrays;
    for (auto& array : prior->arrays) arrays.push_back({array.name, array.shape, array.data});
    const Status set = (*model)->SetPublicPrior(arrays);
    if (!set.ok()) return Fail(set);
  }

  svi::DriverConfig driver_config;
  driver_config.mechanism.sampling_rate = std::stod(get("--q", "0.01"));
  driver_config.tau0 = std::stod(get("--tau0", "1"));
  driver_config.kappa = std::stod(get("--kappa", "0.7"));
  driver_config.threads = std::stoi(get("--threads", "1"));
  driver_config.delta = std::stod(get("--delta", "1e-5"));
  const int64_t steps = std::stoll(get("--steps", "1000"));
  double sigma = std::stod(get("--sigma", "0"));
  if (args.count("--target-epsilon")) {
    auto planned = privacy::NoiseMultiplierForEpsilon(
        privacy::AccountantKind::kRdp, std::stod(args["--target-epsilon"]),
        driver_config.mechanism.sampling_rate, steps, driver_config.delta);
    if (!planned.ok()) return Fail(planned.status());
    sigma = *planned;
  }
  driver_config.mechanism.noise_multiplier = sigma;
  // The ceiling is the planned budget (a hair above, against the planner's
  // own rounding); the run stops early only if the plan was wrong.
  driver_config.epsilon_ceiling =
      args.count("--target-epsilon") ? std::stod(args["--target-epsilon"]) * (1 + 1e-9) : 1e9;

  std::unique_ptr<privacy::NoiseSource> noise;
  if (sigma > 0) {
    auto secure = privacy::SecureNoiseSource::Create();
    if (!secure.ok()) return Fail(secure.status());
    noise = std::move(*secure);
  } else {  // σ = 0: only the sampling bits are used; a seed makes runs repeatable
    auto seeded = privacy::SecureNoiseSource::CreateReproducible(std::stoull(get("--seed", "0")));
    if (!seeded.ok()) return Fail(seeded.status());
    noise = std::move(*seeded);
  }
  privacy::RdpAccountant accountant;
  auto driver = svi::StepDriver::Create(model->get(), noise.get(),
                                        sigma > 0 ? &accountant : nullptr, driver_config);
  if (!driver.ok()) return Fail(driver.status());

  const auto start = std::chrono::steady_clock::now();
  int64_t ran = 0;
  double last_rho = 1;
  bool ceiling = false;
  for (int64_t t = 0; t < steps; ++t) {
    auto result = (*driver)->Step(train->records);
    if (!result.ok()) return Fail(result.status());
    if (result->outcome == svi::StepResult::Outcome::kRefusedCeiling) {
      ceiling = true;
      break;
    }
    last_rho = result->rho;
    ++ran;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<std::vector<double>> test_x;
  std::vector<double> test_y;
  for (const auto& record : test->records) {
    test_x.push_back(record.features);
    test_y.push_back(record.label);
  }
  auto posterior = models::BlrPosteriorFromArrays((*model)->ReleaseArrays());
  if (!posterior.ok()) return Fail(posterior.status());
  auto evaluation = models::EvaluateBlr(*posterior, test_x, test_y);
  if (!evaluation.ok()) return Fail(evaluation.status());
  const double epsilon = sigma > 0 ? accountant.GetEpsilon(driver_config.delta)->epsilon : 0.0;
  const Eigen::VectorXd alpha = (*model)->expected_alpha();  // per prior group
  nlohmann::json out = {
      {"model", "blr"},
      {"steps", ran},
      {"stopped_at_ceiling", ceiling},
      {"sampling_rate", driver_config.mechanism.sampling_rate},
      {"sigma", sigma},
      // A non-private run (σ = 0) has no finite ε: null, never 0.
      {"epsilon", sigma > 0 ? nlohmann::json(epsilon) : nlohmann::json(nullptr)},
      {"delta", sigma > 0 ? driver_config.delta : 0.0},
      {"tau0", driver_config.tau0},
      {"kappa", driver_config.kappa},
      {"train_records", train->records.size()},
      {"train_rejected", train->rejected},
      {"test_records", test->records.size()},
      {"test_rejected", test->rejected},
      {"train_wall_s", wall},
      {"expected_alpha", std::vector<double>(alpha.data(), alpha.data() + alpha.size())},
      {"auc", evaluation->auc},
      {"log_loss", evaluation->log_loss},
      {"accuracy", evaluation->accuracy},
  };
  if (args.count("--newton")) {
    const double l2 = std::stod(args["--newton"]);
    const Eigen::VectorXd w = NewtonLogisticRegression(train->records, dim, l2);
    const models::BlrPosterior point{w, Eigen::MatrixXd::Zero(dim, dim)};
    auto baseline = models::EvaluateBlr(point, test_x, test_y);
    if (!baseline.ok()) return Fail(baseline.status());
    out["newton"] = {{"l2", l2},
                     {"auc", baseline->auc},
                     {"log_loss", baseline->log_loss},
                     {"accuracy", baseline->accuracy}};
  }
  if (args.count("--release-dir")) {
    const Status written =
        WriteRelease(args["--release-dir"], **model, driver_config, ran, last_rho, epsilon,
                     sigma > 0 && noise->is_private(), noise->description());
    if (!written.ok()) return Fail(written);
  }
  std::cout << out.dump() << "\n";
  return 0;
}
