#include "daemon/ledger.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace vipsd::daemon {
namespace {

std::string FreshDirectory(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "ledger_test_" + name;
  std::filesystem::remove_all(dir);
  return dir + "/state";
}

TEST(LedgerTest, AbsentLedgerMeansAFreshRun) {
  auto ledger = Ledger::Open(FreshDirectory("absent"));
  ASSERT_TRUE(ledger.ok());
  auto state = ledger->Load();
  ASSERT_TRUE(state.ok());
  EXPECT_FALSE(state->has_value());
}

TEST(LedgerTest, CommitThenLoadRestoresStepAndBudgetExactly) {
  auto ledger = Ledger::Open(FreshDirectory("roundtrip"));
  ASSERT_TRUE(ledger.ok());
  LedgerState state;
  state.next_step = 42;
  ASSERT_TRUE(state.accountant.Compose(0.01, 1.1, 41).ok());
  ASSERT_TRUE(ledger->Commit(state).ok());
  EXPECT_FALSE(std::filesystem::exists(ledger->path() + ".tmp"));
  auto loaded = ledger->Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->next_step, 42);
  EXPECT_EQ((*loaded)->accountant, state.accountant);
  EXPECT_EQ((*loaded)->accountant.GetEpsilon(1e-5)->epsilon,
            state.accountant.GetEpsilon(1e-5)->epsilon);
  // A second commit replaces the first.
  state.next_step = 43;
  ASSERT_TRUE(state.accountant.Compose(0.01, 1.1).ok());
  ASSERT_TRUE(ledger->Commit(state).ok());
  EXPECT_EQ((*ledger->Load())->next_step, 43);
  EXPECT_EQ((*ledger->Load())->accountant.steps(), 42);
}

TEST(LedgerTest, CorruptLedgerIsRefusedNeverReset) {
  auto ledger = Ledger::Open(FreshDirectory("corrupt"));
  ASSERT_TRUE(ledger.ok());
  LedgerState state;
  ASSERT_TRUE(state.accountant.Compose(0.01, 1.1, 5).ok());
  ASSERT_TRUE(ledger->Commit(state).ok());
  std::string text;
  {
    std::ifstream in(ledger->path());
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const std::string& bad : {text.substr(0, text.size() / 2), std::string("garbage\n"),
                                 std::string("vipsd-ledger 1\nnext_step 0\n")}) {
    std::ofstream(ledger->path(), std::ios::trunc) << bad;
    auto loaded = ledger->Load();
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(loaded.status().message().find("refusing to start from zero"), std::string::npos);
  }
}

}  // namespace
}  // namespace vipsd::daemon
