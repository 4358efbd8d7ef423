// The offline run end to end: JSONL in, ledger and releases out, the real
// reference decoder on the output, restart keeps the budget.
#include "daemon/service/offline_run.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>
#include <tuple>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cstring>

#include "connectors/file/release_reader.h"
#include "core/base/format.h"
#include "core/models/lda.h"
#include "core/release/release.h"
#include "core/svi/step_randomness.h"
#include "daemon/setup/model_setup.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger.h"
#include "daemon/state/state_status.h"
#include "tests/testing/ledger_text.h"

namespace vipsd::daemon {
namespace {

const char* kSecret = "zzsecretmarkerzz";

std::string MakeRunDirectory(const std::string& name, double ceiling, int64_t max_steps) {
  const std::string dir = ::testing::TempDir() + "offline_run_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/vocab.txt") << "apple\nbanana\ncherry\ndate\nelder\nfig\n";
  std::ofstream corpus(dir + "/train.jsonl");
  for (int d = 0; d < 200; ++d) {
    corpus << "{\"id\": " << d << ", \"text\": \""
           << (d % 2 ? "apple banana apple cherry" : "date elder fig fig") << "\"}\n";
  }
  corpus << "{\"id\": \"" << kSecret << "\", \"text\": 5}\n";  // malformed: text not a string
  corpus << "not json " << kSecret << "\n";
  // Well-formed but without a vocabulary word: pooled, contributes zero.
  corpus << "{\"id\": 999, \"text\": \"" << kSecret << " zebra\"}\n";
  corpus.close();
  std::ofstream(dir + "/vipsd.yaml")
      << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
         "    alpha: 0.5\n    eta: 0.1\n    resample_length: 20\n"
         "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.2\n  delta: 1.0e-5\n"
         "  epsilon_ceiling: " << ceiling << "\n"
      << "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 2\n  max_steps: " << max_steps << "\n"
      << "source:\n  type: file\n  path: train.jsonl\n"
         "sink:\n  type: file\n  directory: releases\n  publish_every: 4\n"
         "state:\n  directory: state\ndead_letter:\n  path: dead.jsonl\n";
  return dir;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Each (public release, reason) of `refused`, named in the configuration
// `prior(release)` (a function returning a loaded config), fails BuildModel
// with "CONFIG:LINE: model.public_prior.release: RELEASE" and the reason.
template <typename Prior>
void ExpectPublicPriorsRefused(const Prior& prior, const std::string& where,
                               const std::vector<std::pair<std::string, std::string>>& refused) {
  for (const auto& [release, says] : refused) {
    auto bad = prior(release);
    ASSERT_TRUE(bad.ok()) << bad.status().message();
    auto built = BuildModel(*bad);
    ASSERT_FALSE(built.ok()) << release;
    EXPECT_NE(built.status().message().find(where + ": model.public_prior.release: " + release),
              std::string::npos)
        << built.status().message();
    EXPECT_NE(built.status().message().find(says), std::string::npos) << built.status().message();
  }
}

TEST(OfflineRunTest, RunsStepsWritesLedgerAndDecodableReleases) {
  const std::string dir = MakeRunDirectory("basic", 50.0, 10);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto summary = RunOffline(*config);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->steps_run, 10);
  EXPECT_EQ(summary->records_pooled, 201);  // the document without a vocabulary word too
  EXPECT_EQ(summary->records_rejected, 2);
  EXPECT_EQ(summary->releases_written, 3);  // steps 4, 8 and the final 10
  // The ledger holds exactly the charged steps.
  auto ledger = Ledger::Open(dir + "/state");
  auto state = ledger->Load();
  ASSERT_TRUE(state.ok() && state->has_value());
  EXPECT_EQ((*state)->accountant.steps(), 10);
  EXPECT_EQ((*state)->next_step, 11);
  // Dead letters: line and reason, never the content.
  const std::string dead = Slurp(dir + "/dead.jsonl");
  EXPECT_NE(dead.find("\"line\": 201"), std::string::npos) << dead;
  EXPECT_EQ(dead.find("\"line\": 203"), std::string::npos) << dead;  // pooled, not rejected
  EXPECT_EQ(dead.find(kSecret), std::string::npos);
  // The reference decoder accepts the release (Debian's python3 + numpy).
  const std::string command = "/usr/bin/python3 " + std::string(VIPSD_SOURCE_DIR) +
                              "/tools/decode_release.py " + dir + "/releases/step-10 --json";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  EXPECT_NE(out.find("\"lambda\": {\"shape\": [2, 6]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"is_private\": true"), std::string::npos);
  EXPECT_NE(out.find("\"step\": 10"), std::string::npos);
  EXPECT_EQ(out.find(kSecret), std::string::npos);
  // The manifest carries what a consumer needs: the priors and where the
  // public vocabulary lives.
  EXPECT_NE(out.find("\"hyperparameters\": {\"alpha\": 0.5, \"eta\": "), std::string::npos) << out;
  EXPECT_NE(out.find("\"vocabulary_source\": \"" + dir + "/vocab.txt\""), std::string::npos) << out;
  // vipsd-eval reads the same release: document completion and the bound,
  // with alpha from the manifest (no --alpha).
  {
    const std::string eval = std::string(VIPSD_EVAL_BINARY) + " " + dir +
                             "/releases/step-10 --test " + dir + "/train.jsonl --vocab " + dir +
                             "/vocab.txt --top-words";
    FILE* eval_pipe = popen(eval.c_str(), "r");
    ASSERT_NE(eval_pipe, nullptr);
    std::string eval_out;
    while ((n = fread(buffer, 1, sizeof(buffer), eval_pipe)) > 0) eval_out.append(buffer, n);
    ASSERT_EQ(pclose(eval_pipe), 0) << eval_out;
    EXPECT_NE(eval_out.find("\"doc_completion_perplexity\":"), std::string::npos) << eval_out;
    EXPECT_NE(eval_out.find("\"alpha\":0.5,\"alpha_source\":\"manifest\""), std::string::npos)
        << eval_out;
    EXPECT_NE(eval_out.find("\"per_word_perplexity_bound\":"), std::string::npos);
    EXPECT_NE(eval_out.find("\"documents\":200"), std::string::npos) << eval_out;
    EXPECT_NE(eval_out.find("\"top_words\":[["), std::string::npos);
    // train.jsonl holds two malformed lines (the dead-letter cases above).
    EXPECT_NE(eval_out.find("\"rejected_records\":2"), std::string::npos) << eval_out;
    // A malformed held-out line is reported (line number, reason) and
    // counted, not silently skipped.
    std::ofstream(dir + "/test_bad.jsonl") << Slurp(dir + "/train.jsonl") << "not json\n";
    FILE* with_bad = popen((std::string(VIPSD_EVAL_BINARY) + " " + dir + "/releases/step-10 --test " +
                            dir + "/test_bad.jsonl --vocab " + dir + "/vocab.txt --alpha 0.5 2>&1")
                               .c_str(),
                           "r");
    ASSERT_NE(with_bad, nullptr);
    std::string bad_out;
    while ((n = fread(buffer, 1, sizeof(buffer), with_bad)) > 0) bad_out.append(buffer, n);
    ASSERT_EQ(pclose(with_bad), 0) << bad_out;
    EXPECT_NE(bad_out.find("skipped line 204: invalid_json"), std::string::npos) << bad_out;
    EXPECT_NE(bad_out.find("\"rejected_records\":3"), std::string::npos) << bad_out;
    EXPECT_NE(bad_out.find("\"documents\":200"), std::string::npos) << bad_out;
    // A wrong --alpha is a usage error (exit 2).
    FILE* bad = popen((std::string(VIPSD_EVAL_BINARY) + " " + dir +
                       "/releases/step-10 --test x --vocab " + dir + "/vocab.txt --alpha -1 2>/dev/null")
                          .c_str(),
                      "r");
    while (fread(buffer, 1, sizeof(buffer), bad) > 0) {
    }
    const int status = pclose(bad);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  }
  // A corrupted array makes the decoder fail.
  std::ofstream(dir + "/releases/step-10/lambda.npy", std::ios::app) << "x";
  pipe = popen((command + " 2>/dev/null").c_str(), "r");
  while (fread(buffer, 1, sizeof(buffer), pipe) > 0) {
  }
  EXPECT_NE(pclose(pipe), 0);
}

TEST(OfflineRunTest, ReleasesCarryTheRunsStartTimeNeverWhenAStepFinished) {
  // An offline run has no public clock: a release stamped when its step
  // finished would tell how long the steps before it took.
  const std::string dir = MakeRunDirectory("created_at", 50.0, 8);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  DaemonHooks hooks;
  hooks.before_step = [](int64_t step, int64_t, const svi::RecordPool&,
                         const std::vector<std::string>&) {
    if (step == 5) std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  };
  ASSERT_TRUE(RunOffline(*config, {}, hooks).ok());
  auto created_at = [&](int step) {
    const std::string manifest =
        Slurp(dir + "/releases/step-" + std::to_string(step) + "/manifest.json");
    const size_t at = manifest.find("\"created_at_utc\": \"");
    EXPECT_NE(at, std::string::npos) << manifest;
    return at == std::string::npos ? std::string() : manifest.substr(at + 19, 20);
  };
  ASSERT_FALSE(created_at(4).empty());
  EXPECT_EQ(created_at(4), created_at(8));  // a second apart in wall time
}

TEST(OfflineRunTest, StopsAtTheCeilingAndARestartNeverResetsTheBudget) {
  const std::string dir = MakeRunDirectory("ceiling", 6.0, 0);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok());
  auto first = RunOffline(*config);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(first->stopped_at_ceiling);
  EXPECT_GT(first->steps_run, 0);
  EXPECT_LE(first->epsilon_spent, 6.0);
  // The budget is still spent: a restart cannot run a single step, and says
  // so with a non-zero status instead of "finishing" after zero steps.
  auto second = RunOffline(*config);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("admits no step"), std::string::npos)
      << second.status().message();
  auto ledger = Ledger::Open(dir + "/state");
  ASSERT_TRUE(ledger.ok());
  auto state = ledger->Load();
  ASSERT_TRUE(state.ok() && state->has_value());
  EXPECT_EQ((*state)->next_step, first->steps_run + 1);
  EXPECT_EQ((*state)->accountant.steps(), first->steps_run);
}

// The one start-up check through the offline entry point: a ledger and a
// checkpoint that do not belong together are refused, naming the file and
// the reason, never a restart from zero (daemon_test.cc has the same cases
// through the daemon's Kafka entry point).
TEST(OfflineRunTest, TheStartUpCheckRefusesStateThatDoesNotBelongTogether) {
  const std::string dir = MakeRunDirectory("belong", 50.0, 1);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(RunOffline(*config).ok());
  const std::string state = dir + "/state";
  const std::string ledger_path = state + "/ledger";
  const std::string after_step_1 = Slurp(ledger_path);
  config->max_steps = 2;
  ASSERT_TRUE(RunOffline(*config).ok());  // checkpoint of step 3
  const std::string saved = Slurp(ledger_path);
  auto write_ledger = [&](const std::string& bytes) {
    std::ofstream(ledger_path, std::ios::trunc) << bytes;
  };
  auto resign_line = [&](const std::string& prefix, const std::string& line) {
    return [=] {
      vipsd::testing::ResignLedgerFile(ledger_path, [&](std::string body) {
        return vipsd::testing::ReplaceLedgerLine(std::move(body), prefix, line);
      });
    };
  };
  struct Case {
    std::string what;
    std::function<void()> damage;  // applied to the state after step 3
    StatusCode code;
    std::string names;   // the file the message names, and the start of what it says of it
    std::string reason;  // further text of the message
  };
  const std::vector<Case> cases = {
      // A deleted ledger next to the checkpoint is never a fresh budget.
      {"missing ledger", [&] { std::filesystem::remove(ledger_path); }, StatusCode::kDataLoss,
       ledger_path + " does not exist, but the state directory " + state + " holds checkpoint",
       "the spent budget is unknown"},
      // The ledger of another run next to this checkpoint.
      {"other run", resign_line("run ", "run " + std::string(32, 'e')),
       StatusCode::kFailedPrecondition, state + "/checkpoint belongs to run ",
       ledger_path + " is run " + std::string(32, 'e')},
      // A checkpoint of step 3 next to an older copy of the ledger (step 1).
      {"checkpoint ahead of the ledger", [&] { write_ledger(after_step_1); },
       StatusCode::kDataLoss, state + "/checkpoint holds the model after step 3",
       ledger_path + " records only 1 steps"},
      // A step counter near overflow, behind a valid checksum.
      {"next_step near overflow", resign_line("next_step ", "next_step 9223372036854775806"),
       StatusCode::kDataLoss, ledger_path + ": bad next_step line", "refusing to start from zero"},
      // A version-1 ledger carries no checksum: refused, not migrated.
      {"version-1 ledger",
       [&] { write_ledger("vipsd-ledger 1\n" + vipsd::testing::LedgerBody(saved).substr(15)); },
       StatusCode::kDataLoss, ledger_path + ": version-1 ledger", "no checksum"},
  };
  for (const Case& c : cases) {
    c.damage();
    auto run = RunOffline(*config);
    ASSERT_FALSE(run.ok()) << c.what;
    EXPECT_EQ(run.status().code(), c.code) << c.what << ": " << run.status().ToString();
    EXPECT_NE(run.status().message().find(c.names), std::string::npos)
        << c.what << ": " << run.status().message();
    EXPECT_NE(run.status().message().find(c.reason), std::string::npos)
        << c.what << ": " << run.status().message();
    write_ledger(saved);
  }
  // The restored state continues (so each refusal above was the damage's).
  config->max_steps = 1;
  ASSERT_TRUE(RunOffline(*config).ok());
  // The ledger of another model.
  config->lda.alpha = 0.5;  // not part of the fingerprint: still the same model
  ASSERT_TRUE(RunOffline(*config).ok());
  config->lda.num_topics = 3;
  auto other_model = RunOffline(*config);
  ASSERT_FALSE(other_model.ok());
  EXPECT_EQ(other_model.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other_model.status().message().find(ledger_path + " belongs to a different model"),
            std::string::npos)
      << other_model.status().message();
}

// model.public_prior end to end (docs/models.md, "Public priors"): a
// non-private run over a public corpus writes the release a private run
// starts from. The private model starts exactly at the blend of its seeded
// random start and that release (nothing else is read into the start); the
// release's digest and the blend's weight are in the ledger's model
// fingerprint, and the digest in every release's provenance; a restart with
// another public release or weight is refused; a bad source is named by key
// and line.
TEST(OfflineRunTest, APublicPriorIsCheckedRecordedAndPinnedToTheStateDirectory) {
  const std::string dir = MakeRunDirectory("public_prior", 50.0, 4);
  {
    std::ofstream corpus(dir + "/public.jsonl");
    for (int d = 0; d < 60; ++d) {
      corpus << "{\"id\": " << d << ", \"text\": \""
             << (d % 2 ? "apple cherry apple banana" : "fig fig date elder") << "\"}\n";
    }
  }
  auto loaded = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(loaded.ok());
  // The public model: σ = 0 on the public file, into its own directories.
  auto fit_public = [&](const std::string& name, int64_t steps) {
    config::VipsdConfig open = *loaded;
    open.driver.mechanism.noise_multiplier = 0;
    open.driver.mechanism.sampling_rate = 1;
    open.max_steps = steps;
    open.publish_every = steps;
    open.source_path = dir + "/public.jsonl";
    open.sink_directory = dir + "/" + name;
    open.state_directory = dir + "/state_" + name;
    auto run = RunOffline(open);
    ASSERT_TRUE(run.ok()) << run.status().message();
  };
  fit_public("public_a", 5);
  fit_public("public_b", 6);
  const std::string public_a = dir + "/public_a/step-5";
  auto with_prior = [&](const std::string& release, const std::string& weight = "") {
    std::string text = Slurp(dir + "/vipsd.yaml");
    text.replace(text.find("privacy:\n"), 0,
                 "  public_prior:\n    release: " + release + "\n" +
                     (weight.empty() ? "" : "    weight: " + weight + "\n"));
    std::ofstream(dir + "/prior.yaml", std::ios::trunc) << text;
    return config::LoadConfigFile(dir + "/prior.yaml");
  };
  auto public_release = connectors::ReadReleaseDirectory(public_a);
  ASSERT_TRUE(public_release.ok());
  const std::vector<double>& p = public_release->arrays[0].data;
  auto random_start = BuildModel(*loaded);  // no public prior
  ASSERT_TRUE(random_start.ok()) << random_start.status().message();
  const std::vector<double> r = random_start->model->ReleaseArrays()[0].data;
  const size_t topics = static_cast<size_t>(loaded->lda.num_topics);
  const size_t words = r.size() / topics;
  ASSERT_EQ(p.size(), r.size());
  ASSERT_NE(p, r);
  // The start, whatever the source: λ₀[k] = (1 − m)·R[k] + m·(|R[k]| / |P[k]|)·P[k]
  // (core/models/lda.h), at the default m and at m = 1 (each topic the
  // public topic's shape at the random start's mass).
  for (const auto& [weight, m] : {std::pair<std::string, double>{"", models::kDefaultPublicStartWeight},
                                  {"1", 1.0}}) {
    auto config = with_prior(public_a, weight);
    ASSERT_TRUE(config.ok()) << config.status().message();
    config::VipsdConfig no_source = *config;
    no_source.source_path = dir + "/does-not-exist.jsonl";
    auto bundle = BuildModel(no_source);
    ASSERT_TRUE(bundle.ok()) << bundle.status().message();
    const std::vector<double> start = bundle->model->ReleaseArrays()[0].data;
    ASSERT_EQ(start.size(), r.size());
    for (size_t k = 0; k < topics; ++k) {
      double r_mass = 0, p_mass = 0;
      for (size_t v = 0; v < words; ++v) {
        r_mass += r[k * words + v];
        p_mass += p[k * words + v];
      }
      for (size_t v = 0; v < words; ++v) {
        const double expected =
            (1 - m) * r[k * words + v] + m * r_mass / p_mass * p[k * words + v];
        EXPECT_NEAR(start[k * words + v], expected, 1e-12 * expected)
            << "m = " << m << ", topic " << k << ", word " << v;
      }
    }
    EXPECT_NE(bundle->record_settings.find("model.public_prior.weight: " + ShortestNumber(m)),
              std::string::npos)
        << bundle->record_settings;
  }
  // Without a public prior the weight is not part of the record's settings,
  // nor of the releases' config fingerprint; with one it is.
  EXPECT_EQ(random_start->record_settings.find("model.public_prior.weight"), std::string::npos)
      << random_start->record_settings;
  config::VipsdConfig other_share = *loaded;
  other_share.lda.public_start_weight = 0.5;
  EXPECT_EQ(ConfigFingerprint(other_share), ConfigFingerprint(*loaded));
  auto default_share = with_prior(public_a);
  auto half_share = with_prior(public_a, "0.5");
  ASSERT_TRUE(default_share.ok() && half_share.ok());
  EXPECT_NE(ConfigFingerprint(*half_share), ConfigFingerprint(*default_share));

  auto config = with_prior(public_a);
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto bundle = BuildModel(*config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().message();
  const std::string digest = release::Blake2bHex(Slurp(public_a + "/manifest.json"));
  EXPECT_EQ(bundle->public_prior_fingerprint, digest);
  EXPECT_NE(bundle->record_settings.find(
                "model.public_prior.release (BLAKE2b-256 of its manifest): " + digest),
            std::string::npos)
      << bundle->record_settings;

  // The private run records the digest in every release's provenance.
  auto run = RunOffline(*config);
  ASSERT_TRUE(run.ok()) << run.status().message();
  auto released = connectors::ReadReleaseDirectory(dir + "/releases/step-4");
  ASSERT_TRUE(released.ok()) << released.status().message();
  EXPECT_EQ(released->metadata.public_prior_fingerprint, digest);
  EXPECT_EQ(released->metadata.public_prior_source, public_a);
  EXPECT_EQ(released->metadata.public_prior_weight, models::kDefaultPublicStartWeight);
  // The same source continues; another one would change the model's history.
  ASSERT_TRUE(RunOffline(*config).ok());
  auto other = with_prior(dir + "/public_b/step-6");
  ASSERT_TRUE(other.ok());
  auto refused = RunOffline(*other);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("belongs to a different model"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("public prior"), std::string::npos);
  // So would another share of the same public release in the start.
  auto other_weight = with_prior(public_a, "0.5");
  ASSERT_TRUE(other_weight.ok());
  auto refused_weight = RunOffline(*other_weight);
  ASSERT_FALSE(refused_weight.ok());
  EXPECT_NE(refused_weight.status().message().find("belongs to a different model"),
            std::string::npos)
      << refused_weight.status().message();

  // Bad sources: named by file, line and key.
  const std::string where = dir + "/prior.yaml:10: model.public_prior.release: ";
  struct Case {
    std::string release;
    std::string says;
  };
  const std::vector<Case> cases = {
      {dir + "/missing", "not a vipsd release directory"},
      {dir + "/vocab.txt", "not a vipsd release directory"},
      // A private release is not public knowledge.
      {dir + "/releases/step-4", "is a private release"},
  };
  for (const Case& c : cases) {
    auto bad = with_prior(c.release);
    ASSERT_TRUE(bad.ok()) << bad.status().message();
    auto built = BuildModel(*bad);
    ASSERT_FALSE(built.ok()) << c.release;
    EXPECT_NE(built.status().message().find(where + c.release), std::string::npos)
        << built.status().message();
    EXPECT_NE(built.status().message().find(c.says), std::string::npos)
        << built.status().message();
  }
  // Another vocabulary: the public model's words are not the model's.
  std::ofstream(dir + "/vocab.txt", std::ios::trunc) << "apple\nbanana\ncherry\ndate\nelder\nfigs\n";
  auto other_vocabulary = BuildModel(*config);
  ASSERT_FALSE(other_vocabulary.ok());
  EXPECT_NE(other_vocabulary.status().message().find("was fitted with another vocabulary"),
            std::string::npos)
      << other_vocabulary.status().message();
}

// The same for BLR, whose public prior is a prior (docs/models.md, "Public
// priors"): the private model starts at the public posterior (mean and
// covariance, at the default a0 = b0 = 1), its releases name the public
// release, and a public release of another dimension or a private one is
// refused with key and line.
TEST(OfflineRunTest, ABlrPublicPriorIsWhereTheModelStartsAndIsNamedInItsReleases) {
  const std::string dir = ::testing::TempDir() + "offline_run_blr_public_prior";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write_records = [&](const std::string& name, int count, int dim, int seed) {
    std::ofstream out(dir + "/" + name);
    std::mt19937_64 gen(static_cast<uint64_t>(seed));
    std::uniform_real_distribution<double> uniform(-0.5, 0.5);
    for (int i = 0; i < count; ++i) {
      std::vector<double> x(static_cast<size_t>(dim));
      for (double& v : x) v = uniform(gen);
      out << "{\"x\": [";
      for (int j = 0; j < dim; ++j) out << (j ? ", " : "") << x[static_cast<size_t>(j)];
      out << "], \"y\": " << (x[0] - x[1] > 0 ? 1 : 0) << "}\n";
    }
  };
  write_records("train.jsonl", 300, 3, 1);
  write_records("public.jsonl", 200, 3, 2);
  write_records("public4.jsonl", 200, 4, 3);
  auto config_text = [&](int dim, const std::string& source, const std::string& extra,
                         double sigma, const std::string& out) {
    std::ostringstream text;
    text << "model:\n  type: blr\n  blr:\n    dimension: " << dim << "\n" << extra
         << "privacy:\n  noise_multiplier: " << sigma << "\n  sampling_rate: "
         << (sigma > 0 ? 0.5 : 1.0) << "\n  delta: 1.0e-5\n  epsilon_ceiling: 50\n"
         << "schedule:\n  max_steps: 3\nsource:\n  type: file\n  path: " << source << "\n"
         << "sink:\n  type: file\n  directory: " << out << "_releases\n  publish_every: 3\n"
         << "state:\n  directory: " << out << "_state\ndead_letter:\n  path: " << out
         << "_dead.jsonl\n";
    std::ofstream(dir + "/" + out + ".yaml", std::ios::trunc) << text.str();
    return config::LoadConfigFile(dir + "/" + out + ".yaml");
  };
  for (const auto& [dim, source, name] :
       {std::tuple{3, "public.jsonl", "public"}, std::tuple{4, "public4.jsonl", "public4"}}) {
    auto open = config_text(dim, source, "", 0, name);
    ASSERT_TRUE(open.ok()) << open.status().message();
    ASSERT_TRUE(RunOffline(*open).ok());
  }
  const std::string public_release = dir + "/public_releases/step-3";
  auto prior = [&](const std::string& release) {
    return config_text(3, "train.jsonl", "  public_prior:\n    release: " + release + "\n", 2.0,
                       "private");
  };
  auto config = prior(public_release);
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto bundle = BuildModel(*config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().message();
  auto public_model = connectors::ReadReleaseDirectory(public_release);
  ASSERT_TRUE(public_model.ok());
  const std::string digest = release::Blake2bHex(Slurp(public_release + "/manifest.json"));
  EXPECT_EQ(bundle->public_prior_fingerprint, digest);
  const auto start = bundle->model->ReleaseArrays();
  for (const std::string name : {"mean", "covariance"}) {
    const auto& theirs = *std::find_if(public_model->arrays.begin(), public_model->arrays.end(),
                                       [&](const auto& a) { return a.name == name; });
    const auto& ours = *std::find_if(start.begin(), start.end(),
                                     [&](const auto& a) { return a.name == name; });
    ASSERT_EQ(ours.data.size(), theirs.data.size());
    for (size_t i = 0; i < ours.data.size(); ++i) {
      EXPECT_NEAR(ours.data[i], theirs.data[i], 1e-9 * (1 + std::abs(theirs.data[i]))) << name;
    }
  }
  ASSERT_TRUE(RunOffline(*config).ok());
  auto released = connectors::ReadReleaseDirectory(dir + "/private_releases/step-3");
  ASSERT_TRUE(released.ok()) << released.status().message();
  EXPECT_EQ(released->metadata.public_prior_fingerprint, digest);
  EXPECT_EQ(released->metadata.public_prior_weight, 0);  // LDA's blend only
  EXPECT_EQ(released->metadata.public_prior_source, public_release);
  ExpectPublicPriorsRefused(
      prior, dir + "/private.yaml:6",
      {{dir + "/public4_releases/step-3", "its dimensions differ from the model's (d = 3)"},
       {dir + "/private_releases/step-3", "is a private release"}});
}

// The same for SBN, whose public prior is a start (core/models/sbn.h,
// "Public start"): the private model starts at the public release's
// variational state (its release arrays equal the public ones up to the
// rounding of Σ → Λ → Σ), its releases name the public release, and a public
// release with another K or a private one is refused with key and line.
TEST(OfflineRunTest, AnSbnPublicPriorIsWhereTheModelStartsAndIsNamedInItsReleases) {
  const std::string dir = ::testing::TempDir() + "offline_run_sbn_public_prior";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Two prototypes of 8 pixels, each pixel flipped with probability 1/8.
  auto write_records = [&](const std::string& name, int count, uint64_t seed) {
    std::ofstream out(dir + "/" + name);
    std::mt19937_64 gen(seed);
    for (int i = 0; i < count; ++i) {
      out << "{\"y\": [";
      for (int j = 0; j < 8; ++j) {
        int pixel = (i % 2 == 0) == (j < 4) ? 1 : 0;
        if (gen() % 8 == 0) pixel = 1 - pixel;
        out << (j ? ", " : "") << pixel;
      }
      out << "]}\n";
    }
  };
  write_records("train.jsonl", 200, 1);
  write_records("public.jsonl", 200, 2);
  auto config_text = [&](int hidden, const std::string& source, const std::string& extra,
                         double sigma, const std::string& out) {
    std::ostringstream text;
    text << "model:\n  type: sbn\n  sbn:\n    visible: 8\n    hidden: " << hidden << "\n" << extra
         << "privacy:\n  noise_multiplier: " << sigma << "\n  sampling_rate: "
         << (sigma > 0 ? 0.5 : 1.0) << "\n  delta: 1.0e-5\n  epsilon_ceiling: 50\n"
         << "schedule:\n  max_steps: 3\nsource:\n  type: file\n  path: " << source << "\n"
         << "sink:\n  type: file\n  directory: " << out << "_releases\n  publish_every: 3\n"
         << "state:\n  directory: " << out << "_state\ndead_letter:\n  path: " << out
         << "_dead.jsonl\n";
    std::ofstream(dir + "/" + out + ".yaml", std::ios::trunc) << text.str();
    return config::LoadConfigFile(dir + "/" + out + ".yaml");
  };
  for (const auto& [hidden, name] : {std::pair{2, "public"}, std::pair{3, "public3"}}) {
    auto open = config_text(hidden, "public.jsonl", "", 0, name);
    ASSERT_TRUE(open.ok()) << open.status().message();
    auto run = RunOffline(*open);
    ASSERT_TRUE(run.ok()) << run.status().message();
  }
  const std::string public_release = dir + "/public_releases/step-3";
  auto prior = [&](const std::string& release) {
    return config_text(2, "train.jsonl", "  public_prior:\n    release: " + release + "\n", 1.0,
                       "private");
  };
  auto config = prior(public_release);
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto bundle = BuildModel(*config);
  ASSERT_TRUE(bundle.ok()) << bundle.status().message();
  auto public_model = connectors::ReadReleaseDirectory(public_release);
  ASSERT_TRUE(public_model.ok());
  const std::string digest = release::Blake2bHex(Slurp(public_release + "/manifest.json"));
  EXPECT_EQ(bundle->public_prior_fingerprint, digest);
  // Without the public prior the model starts elsewhere (the check below
  // could not pass by accident).
  auto plain = config_text(2, "train.jsonl", "", 1.0, "plain");
  ASSERT_TRUE(plain.ok());
  auto plain_bundle = BuildModel(*plain);
  ASSERT_TRUE(plain_bundle.ok());
  const auto start = bundle->model->ReleaseArrays();
  const auto random_start = plain_bundle->model->ReleaseArrays();
  ASSERT_EQ(start.size(), public_model->arrays.size());
  for (size_t a = 0; a < start.size(); ++a) {
    const auto& theirs = *std::find_if(public_model->arrays.begin(), public_model->arrays.end(),
                                       [&](const auto& x) { return x.name == start[a].name; });
    ASSERT_EQ(start[a].data.size(), theirs.data.size()) << start[a].name;
    double moved = 0;
    for (size_t i = 0; i < theirs.data.size(); ++i) {
      EXPECT_NEAR(start[a].data[i], theirs.data[i], 1e-9 * (1 + std::abs(theirs.data[i])))
          << start[a].name;
      moved = std::max(moved, std::abs(random_start[a].data[i] - theirs.data[i]));
    }
    EXPECT_GT(moved, 1e-3) << start[a].name;
  }
  ASSERT_TRUE(RunOffline(*config).ok());
  auto released = connectors::ReadReleaseDirectory(dir + "/private_releases/step-3");
  ASSERT_TRUE(released.ok()) << released.status().message();
  EXPECT_TRUE(released->metadata.is_private);
  EXPECT_EQ(released->metadata.public_prior_fingerprint, digest);
  EXPECT_EQ(released->metadata.public_prior_weight, 0);  // LDA's blend only
  EXPECT_EQ(released->metadata.public_prior_source, public_release);
  ExpectPublicPriorsRefused(
      prior, dir + "/private.yaml:7",
      {{dir + "/public3_releases/step-3", "its dimensions differ from the model's (K = 2)"},
       {dir + "/private_releases/step-3", "is a private release"}});
}

TEST(OfflineRunTest, APrivateRunRefusesAStateDirectoryThatRanNonPrivateSteps) {
  const std::string dir = MakeRunDirectory("mixed", 50.0, 2);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok());
  config::VipsdConfig open = *config;
  open.driver.mechanism.noise_multiplier = 0;
  ASSERT_TRUE(RunOffline(open).ok());
  auto run = RunOffline(*config);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find(dir + "/state/ledger"), std::string::npos);
  EXPECT_NE(run.status().message().find("2 non-private steps"), std::string::npos)
      << run.status().message();
  EXPECT_NE(run.status().message().find("the first was step 1"), std::string::npos);

  // Fixed-seed noise needs the command-line flag, and contaminates as well.
  const std::string dir2 = MakeRunDirectory("fixed_seed", 50.0, 2);
  auto seeded = config::LoadConfigFile(dir2 + "/vipsd.yaml");
  ASSERT_TRUE(seeded.ok());
  seeded->noise_mode = config::NoiseMode::kFixedSeed;
  auto without_flag = RunOffline(*seeded);
  ASSERT_FALSE(without_flag.ok());
  EXPECT_NE(without_flag.status().message().find("--insecure-fixed-seed-noise"),
            std::string::npos);
  DaemonOptions flag;
  flag.allow_fixed_seed_noise = true;
  ASSERT_TRUE(RunOffline(*seeded, flag).ok());
  seeded->noise_mode = config::NoiseMode::kSecure;
  auto secure_after = RunOffline(*seeded);
  ASSERT_FALSE(secure_after.ok());
  EXPECT_NE(secure_after.status().message().find("fixed-seed noise"), std::string::npos);

  // And the other way round: a private directory is continued by neither a
  // non-private nor a fixed-seed run.
  const std::string dir3 = MakeRunDirectory("private_first", 50.0, 2);
  auto secure = config::LoadConfigFile(dir3 + "/vipsd.yaml");
  ASSERT_TRUE(secure.ok());
  ASSERT_TRUE(RunOffline(*secure).ok());
  config::VipsdConfig unnoised = *secure;
  unnoised.driver.mechanism.noise_multiplier = 0;
  config::VipsdConfig fixed = *secure;
  fixed.noise_mode = config::NoiseMode::kFixedSeed;
  for (const auto* later : {&unnoised, &fixed}) {
    auto refused = RunOffline(*later, flag);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find(dir3 + "/state/ledger: this state directory ran 2 "
                                                     "private steps"),
              std::string::npos)
        << refused.status().message();
  }
}

TEST(OfflineRunTest, ARestartResumesTheModelFromItsCheckpoint) {
  const std::string dir = MakeRunDirectory("resume", 50.0, 8);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(RunOffline(*config).ok());
  // The checkpoint holds exactly the released λ of the last step.
  auto checkpoint = CheckpointStore(dir + "/state").Load();
  ASSERT_TRUE(checkpoint.ok() && checkpoint->has_value());
  EXPECT_EQ((*checkpoint)->step, 8);
  const std::vector<double> lambda8 = (*checkpoint)->arrays[0].data;
  const std::string npy = Slurp(dir + "/releases/step-8/lambda.npy");
  ASSERT_GE(npy.size(), lambda8.size() * 8);
  EXPECT_EQ(std::memcmp(npy.data() + npy.size() - lambda8.size() * 8, lambda8.data(),
                        lambda8.size() * 8),
            0);
  // Two more steps continue from it (λ moves by a blend with ρ ≈ 0.2, not
  // back to the Gamma(100, 1/100) initialisation near 1).
  config->max_steps = 2;
  auto second = RunOffline(*config);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->first_step, 9);
  auto resumed = CheckpointStore(dir + "/state").Load();
  ASSERT_TRUE(resumed.ok() && resumed->has_value());
  EXPECT_EQ((*resumed)->step, 10);
  double total8 = 0, total10 = 0;
  for (double x : lambda8) total8 += x;
  for (double x : (*resumed)->arrays[0].data) total10 += x;
  EXPECT_GT(total8, 40);  // far from the initial ≈ 12 (2 × 6 entries near 1)
  EXPECT_NEAR(total10 / total8, 1.0, 0.5);
  // A checkpoint of another model shape is refused, not silently replaced.
  config->lda.num_topics = 3;
  auto mismatch = RunOffline(*config);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("different model"), std::string::npos);
}

TEST(OfflineRunTest, BayesianLogisticRegressionRunsThroughTheSamePath) {
  const std::string dir = ::testing::TempDir() + "offline_run_blr";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // y = 1 iff x0 + x1 > 0, with ||x|| <= 1; one record too long (rejected).
  std::ofstream data(dir + "/train.jsonl");
  uint64_t state = 42;
  auto uniform = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / 9007199254740992.0 * 2 - 1;
  };
  for (int i = 0; i < 2000; ++i) {
    const double x0 = 0.5 * uniform(), x1 = 0.5 * uniform(), x2 = 0.5 * uniform();
    data << "{\"x\": [" << x0 << ", " << x1 << ", " << x2 << "], \"y\": " << (x0 + x1 > 0 ? 1 : 0)
         << "}\n";
  }
  data << "{\"x\": [1.0, 1.0, 1.0], \"y\": 1}\n";  // norm > 1: rescaled, pooled
  data << "{\"x\": [1.0, 1.0], \"y\": 1}\n";       // wrong dimension: rejected
  data.close();
  std::ofstream(dir + "/vipsd.yaml")
      << "model:\n  type: blr\n  blr:\n    dimension: 3\n"
         "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
         "  epsilon_ceiling: 50\n"
         "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 2\n  max_steps: 10\n"
         "source:\n  type: file\n  path: train.jsonl\n"
         "sink:\n  type: file\n  directory: releases\n  publish_every: 5\n"
         "state:\n  directory: state\ndead_letter:\n  path: dead.jsonl\n";
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto summary = RunOffline(*config);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->steps_run, 10);
  EXPECT_EQ(summary->records_pooled, 2001);
  EXPECT_EQ(summary->records_rejected, 1);
  EXPECT_NE(Slurp(dir + "/dead.jsonl").find("wrong_dimension"), std::string::npos);
  EXPECT_EQ(Slurp(dir + "/dead.jsonl").find("norm_too_large"), std::string::npos);
  // vipsd-eval reads the release: the private model separates the classes.
  const std::string eval = std::string(VIPSD_EVAL_BINARY) + " " + dir +
                           "/releases/step-10 --test " + dir + "/train.jsonl";
  FILE* pipe = popen(eval.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  const size_t at = out.find("\"auc\":");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_GT(std::stod(out.substr(at + 6)), 0.9) << out;
  EXPECT_NE(out.find("\"model_type\":\"blr\""), std::string::npos);
}

TEST(OfflineRunTest, SigmoidBeliefNetworkRunsThroughTheSamePath) {
  const std::string dir = ::testing::TempDir() + "offline_run_sbn";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Two prototypes of 8 pixels, each pixel flipped with probability 1/8.
  std::ofstream data(dir + "/train.jsonl");
  uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  for (int i = 0; i < 300; ++i) {
    data << "{\"y\": [";
    for (int j = 0; j < 8; ++j) {
      int pixel = (i % 2 == 0) == (j < 4) ? 1 : 0;
      if (next() % 8 == 0) pixel = 1 - pixel;
      data << (j ? ", " : "") << pixel;
    }
    data << "]}\n";
  }
  data << "{\"y\": [0, 1, 2, 0, 0, 0, 0, 0]}\n";  // not binary: rejected
  data.close();
  std::ofstream(dir + "/vipsd.yaml")
      << "model:\n  type: sbn\n  sbn:\n    visible: 8\n    hidden: 2\n"
         "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
         "  epsilon_ceiling: 50\n"
         "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 2\n  max_steps: 6\n"
         "source:\n  type: file\n  path: train.jsonl\n"
         "sink:\n  type: file\n  directory: releases\n  publish_every: 3\n"
         "state:\n  directory: state\ndead_letter:\n  path: dead.jsonl\n";
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto summary = RunOffline(*config);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->steps_run, 6);
  EXPECT_EQ(summary->records_pooled, 300);
  EXPECT_EQ(summary->records_rejected, 1);
  EXPECT_NE(Slurp(dir + "/dead.jsonl").find("not_binary"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir + "/releases/step-6/manifest.json"));
  auto checkpoint = CheckpointStore(dir + "/state").Load();
  ASSERT_TRUE(checkpoint.ok() && checkpoint->has_value());
  EXPECT_EQ((*checkpoint)->model_type, "sbn");
  // vipsd-eval reads the release.
  const std::string eval = std::string(VIPSD_EVAL_BINARY) + " " + dir +
                           "/releases/step-6 --test " + dir + "/train.jsonl --train " + dir +
                           "/train.jsonl 2>&1";
  FILE* pipe = popen(eval.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  EXPECT_NE(out.find("sbn"), std::string::npos) << out;
}

// Unit-level privacy end to end (privacy.unit: field): every pooled record
// carries its own unit's digest, records without a usable unit id are
// dead-lettered by reason without their content, the ledger records the
// unit and a restart with another cap is refused.
TEST(OfflineRunTest, AUnitFromANamedFieldIsCarriedRecordedAndKept) {
  const std::string dir = ::testing::TempDir() + "offline_run_unit";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<std::string> words = {"apple", "banana", "cherry", "date", "elder", "fig"};
  {
    std::ofstream vocab(dir + "/vocab.txt");
    for (const std::string& word : words) vocab << word << "\n";
    std::ofstream corpus(dir + "/train.jsonl");
    // Person k writes 20 documents, each of word k only.
    for (int d = 0; d < 120; ++d) {
      const int person = d % 6;
      corpus << "{\"id\": " << d << ", \"text\": \"" << words[person] << " " << words[person]
             << "\", \"person\": \"" << kSecret << person << "\"}\n";
    }
    corpus << "{\"id\": 500, \"text\": \"apple\"}\n";                      // no unit
    corpus << "{\"id\": 501, \"text\": \"apple\", \"person\": 1.5}\n";     // bad unit
    corpus << "{\"id\": 502, \"text\": \"apple\", \"person\": \"\"}\n";    // bad unit
  }
  const auto write_config = [&](int cap) {
    std::ofstream(dir + "/vipsd.yaml")
        << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
           "    alpha: 0.5\n    eta: 0.1\n    resample_length: 20\n"
           "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
           "  epsilon_ceiling: 50\n  unit: field\n  unit_field: person\n"
           "  max_records_per_unit: "
        << cap << "\n"
        << "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 2\n  max_steps: 4\n"
           "source:\n  type: file\n  path: train.jsonl\n"
           "sink:\n  type: file\n  directory: releases\n  publish_every: 2\n"
           "state:\n  directory: state\ndead_letter:\n  path: dead.jsonl\n";
  };
  write_config(3);
  auto config = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  int64_t checked = 0;
  DaemonHooks hooks;
  hooks.before_step = [&](int64_t, int64_t, const svi::RecordPool& pool,
                          const std::vector<std::string>&) {
    pool.ForEach([&](const model::Record& record, const svi::RecordOrigin&, int64_t) {
      const int person = record.word_ids.at(0);
      EXPECT_EQ(record.unit, svi::UnitDigest(std::string(kSecret) + std::to_string(person)));
      ++checked;
    });
  };
  auto summary = RunOffline(*config, {}, hooks);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->steps_run, 4);
  EXPECT_EQ(summary->records_pooled, 120);
  EXPECT_EQ(summary->records_rejected, 3);
  EXPECT_EQ(checked, 4 * 120);
  const std::string dead = Slurp(dir + "/dead.jsonl");
  EXPECT_NE(dead.find("missing_unit"), std::string::npos) << dead;
  EXPECT_NE(dead.find("bad_unit"), std::string::npos) << dead;
  EXPECT_EQ(dead.find(kSecret), std::string::npos) << dead;
  const std::string ledger = Slurp(dir + "/state/ledger");
  EXPECT_EQ(ledger.rfind("vipsd-ledger 7\n", 0), 0u);  // with its delta
  EXPECT_NE(ledger.find("\nunit field person 3\n"), std::string::npos);
  EXPECT_EQ(ledger.find(kSecret), std::string::npos);
  // The release and `vipsd status` say what the ε protects.
  const std::string manifest = Slurp(dir + "/releases/step-4/manifest.json");
  EXPECT_NE(manifest.find("\"privacy_unit\": \"field\",\n  \"unit_field\": \"person\",\n"
                          "  \"max_records_per_unit\": 3,"),
            std::string::npos)
      << manifest;
  StateStatusOptions status_options;
  status_options.directory = dir + "/state";
  auto status = StateStatus(status_options);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->text.find("every record of one unit (one value of field person), up to 3 of "
                              "them per step"),
            std::string::npos)
      << status->text;
  // The unit and its cap belong to the state directory.
  write_config(4);
  auto other = config::LoadConfigFile(dir + "/vipsd.yaml");
  ASSERT_TRUE(other.ok()) << other.status().message();
  auto refused = RunOffline(*other);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_records_per_unit 3; this configuration says "
                                            "unit field (field person) with max_records_per_unit 4"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace vipsd::daemon
