// Issue 27: no path can stop or corrupt the daemon. Every file a
// configuration names is checked before it is read (a device, a FIFO or a
// directory is named as such, at once, without blocking), and no output
// (dead-letter file, release directory, state directory) may be an input
// or hold one, however it is reached (symlink, hard link, `..`).
#include "daemon/setup/path_checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "config/config.h"
#include "daemon/service/daemon.h"
#include "daemon/service/offline_run.h"

namespace vipsd::daemon {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "path_checks_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// An offline (file source) configuration in `dir`; keys may be overridden.
struct Paths {
  std::string vocabulary = "vocab.txt";
  std::string source = "train.jsonl";
  std::string dead_letter = "dead.jsonl";
  std::string releases = "releases";
  std::string state = "state";
};

std::string WriteOfflineConfig(const std::string& dir, const Paths& p) {
  if (!fs::exists(dir + "/vocab.txt")) {
    std::ofstream(dir + "/vocab.txt") << "apple\nbanana\ncherry\n";
  }
  if (!fs::exists(dir + "/train.jsonl")) {
    std::ofstream corpus(dir + "/train.jsonl");
    for (int d = 0; d < 20; ++d) corpus << "{\"id\": " << d << ", \"text\": \"apple banana\"}\n";
  }
  std::ofstream(dir + "/vipsd.yaml")
      << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: " << p.vocabulary
      << "\n    alpha: 0.5\n    eta: 0.1\n    resample_length: 10\n"
         "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.2\n  delta: 1.0e-5\n"
         "  epsilon_ceiling: 100\n"
         "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 1\n  max_steps: 2\n"
         "source:\n  type: file\n  path: " << p.source << "\n"
      << "sink:\n  type: file\n  directory: " << p.releases << "\n  publish_every: 1\n"
      << "state:\n  directory: " << p.state << "\ndead_letter:\n  path: " << p.dead_letter
      << "\n";
  return dir + "/vipsd.yaml";
}

config::VipsdConfig Load(const std::string& path) {
  auto config = config::LoadConfigFile(path);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : config::VipsdConfig();
}

// CheckStartUp in another thread: a check that blocks fails the test
// instead of hanging it.
Status CheckStartUpWithin(const config::VipsdConfig& config, std::chrono::seconds limit) {
  auto check = std::async(std::launch::async, [config] { return CheckStartUp(config, {}); });
  if (check.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "the start-up check did not return within " << limit.count() << " s";
    std::_Exit(1);  // the blocked thread cannot be joined
  }
  return check.get();
}

TEST(PathChecksTest, AVocabularyThatIsNotARegularFileIsNamedAtOnce) {
  const std::string dir = FreshDir("vocabulary_kinds");
  const std::string fifo = dir + "/vocab.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directories(dir + "/vocab.dir");
  struct Case {
    std::string path;
    std::string said;
  };
  const Case cases[] = {
      {"/dev/zero", "/dev/zero is a character device"},
      {"/dev/urandom", "/dev/urandom is a character device"},
      {fifo, fifo + " is a FIFO"},
      {dir + "/vocab.dir", dir + "/vocab.dir is a directory"},
      {dir + "/missing.txt", dir + "/missing.txt does not exist"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    Paths paths;
    paths.vocabulary = c.path;
    const Status checked = CheckStartUpWithin(Load(WriteOfflineConfig(dir, paths)), 10s);
    EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument) << checked.ToString();
    EXPECT_THAT(checked.message(), HasSubstr("model.lda.vocabulary: "));
    EXPECT_THAT(checked.message(), HasSubstr(c.said));
  }
}

TEST(PathChecksTest, ASourceOrDeadLetterFileThatIsNotARegularFileIsRefused) {
  const std::string dir = FreshDir("source_kinds");
  const std::string fifo = dir + "/train.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  {
    Paths paths;
    paths.source = fifo;
    auto run = std::async(std::launch::async,
                          [&] { return RunOffline(Load(WriteOfflineConfig(dir, paths)), {}); });
    ASSERT_EQ(run.wait_for(20s), std::future_status::ready) << "a FIFO source blocked the run";
    const auto result = run.get();
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(), HasSubstr(fifo + " is a FIFO"));
  }
  for (const std::string& dead : {std::string("/dev/null"), fifo}) {
    SCOPED_TRACE(dead);
    fs::remove_all(dir + "/state");
    Paths paths;
    paths.dead_letter = dead;
    auto run = std::async(std::launch::async,
                          [&] { return RunOffline(Load(WriteOfflineConfig(dir, paths)), {}); });
    ASSERT_EQ(run.wait_for(20s), std::future_status::ready) << "the dead-letter file blocked";
    const auto result = run.get();
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(), HasSubstr("not a regular file"));
  }
}

TEST(PathChecksTest, ADeadLetterFileThatIsTheSourceByAnyNameIsRefused) {
  const std::string dir = FreshDir("dead_letter_alias");
  fs::create_directories(dir + "/sub");
  WriteOfflineConfig(dir, {});  // writes train.jsonl
  ASSERT_EQ(::symlink((dir + "/train.jsonl").c_str(), (dir + "/sym.jsonl").c_str()), 0);
  ASSERT_EQ(::link((dir + "/train.jsonl").c_str(), (dir + "/hard.jsonl").c_str()), 0);
  const std::string before = [&] {
    std::ifstream in(dir + "/train.jsonl");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // The same path text (also through `..`) is refused when the file loads.
  for (const std::string& alias : {std::string("sub/../train.jsonl"), dir + "/./train.jsonl"}) {
    Paths paths;
    paths.dead_letter = alias;
    const auto config = config::LoadConfigFile(WriteOfflineConfig(dir, paths));
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << alias;
    EXPECT_THAT(config.status().message(), HasSubstr("dead_letter.path: "));
  }
  // Links reach the same file under another name: refused by device and
  // inode at --check-config and at every start.
  for (const std::string& alias : {std::string("sym.jsonl"), std::string("hard.jsonl")}) {
    SCOPED_TRACE(alias);
    Paths paths;
    paths.dead_letter = alias;
    const config::VipsdConfig config = Load(WriteOfflineConfig(dir, paths));
    const Status checked = CheckInputsAndOutputsApart(config);
    EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(checked.message(), HasSubstr("dead_letter.path: "));
    EXPECT_THAT(checked.message(), HasSubstr("source.path ("));
    EXPECT_THAT(checked.message(), HasSubstr("same file"));
    // And a whole run is refused before anything is written.
    const auto run = RunOffline(config, {});
    EXPECT_FALSE(run.ok());
  }
  std::ifstream in(dir + "/train.jsonl");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), before);
}

TEST(PathChecksTest, OutputDirectoriesAreApartFromInputsAndFromEachOther) {
  const std::string dir = FreshDir("directories");
  WriteOfflineConfig(dir, {});
  fs::create_directories(dir + "/state");
  ASSERT_EQ(::symlink((dir + "/state").c_str(), (dir + "/state_link").c_str()), 0);
  struct Case {
    std::string name;
    Paths paths;
    std::string key;   // the key the message starts with
    std::string said;  // further text
  };
  std::vector<Case> cases;
  {
    Paths p;
    p.releases = "state";
    cases.push_back({"release directory is the state directory", p, "sink.directory: ",
                     "is, contains or lies inside state.directory"});
  }
  {
    Paths p;
    p.releases = "state_link";
    cases.push_back({"the same directory through a symlink", p, "sink.directory: ",
                     "is, contains or lies inside"});
  }
  {
    Paths p;
    p.releases = "state/releases";
    cases.push_back({"release directory inside the state directory", p, "sink.directory: ",
                     "is, contains or lies inside"});
  }
  {
    Paths p;
    p.dead_letter = "state/dead.jsonl";
    cases.push_back({"dead letters in the state directory", p, "dead_letter.path: ",
                     "lies inside state.directory"});
  }
  {
    Paths p;
    p.state = ".";  // holds the vocabulary, the source and the configuration
    cases.push_back({"inputs inside the state directory", p, "state.directory: ", "holds "});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Status checked = CheckInputsAndOutputsApart(Load(WriteOfflineConfig(dir, c.paths)));
    EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(checked.message(), HasSubstr(c.key));
    EXPECT_THAT(checked.message(), HasSubstr(c.said));
    EXPECT_THAT(checked.message(), HasSubstr(dir + "/vipsd.yaml:"));  // file:line named
  }
  EXPECT_TRUE(CheckInputsAndOutputsApart(Load(WriteOfflineConfig(dir, {}))).ok());
}

// A start refused by the start-up check leaves nothing behind (it used to
// create an empty releases/ directory and dead-letter file).
TEST(PathChecksTest, ARefusedStartCreatesNoReleaseDirectoryOrDeadLetterFile) {
  const std::string dir = FreshDir("refused_start");
  WriteOfflineConfig(dir, {});  // writes train.jsonl
  ASSERT_EQ(::link((dir + "/train.jsonl").c_str(), (dir + "/hard.jsonl").c_str()), 0);
  Paths paths;
  paths.dead_letter = "hard.jsonl";  // refused: the source itself, under another name
  paths.releases = "out/releases";
  const auto run = RunOffline(Load(WriteOfflineConfig(dir, paths)), {});
  ASSERT_FALSE(run.ok());
  EXPECT_FALSE(fs::exists(dir + "/out"));
  // And a ledger of another model is refused after the outputs were made.
  fs::create_directories(dir + "/state");
  std::ofstream(dir + "/state/ledger") << "not a ledger\n";
  Paths fine;
  fine.releases = "out/releases";
  const auto refused = RunOffline(Load(WriteOfflineConfig(dir, fine)), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_FALSE(fs::exists(dir + "/out"));
  EXPECT_FALSE(fs::exists(dir + "/dead.jsonl"));
}

}  // namespace
}  // namespace vipsd::daemon
