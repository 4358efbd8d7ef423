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

TEST(LedgerTest, ResidencyStateResumeOffsetsAndWarningsRoundTrip) {
  auto ledger = Ledger::Open(FreshDirectory("residency"));
  ASSERT_TRUE(ledger.ok());
  LedgerState state;
  state.next_step = 8;
  state.mode = AccountingMode::kResidency;
  state.warning_level = 0.75;
  state.resume_offsets = {{"docs:0", 17}, {"docs:3", 0}};
  ASSERT_TRUE(state.accountant.Compose(0.05, 2.0, 7).ok());
  auto residency = privacy::ResidencyAccountant::Create(5);
  ASSERT_TRUE(residency.ok());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(residency->RecordStep(0.05, 2.0, 0.125).ok());
  state.residency = std::move(*residency);
  state.arrivals = svi::ArrivalHistory(5);
  ASSERT_TRUE(state.arrivals.RecordStep(6, {{"docs:0", 20}}).ok());
  ASSERT_TRUE(state.arrivals.RecordStep(7, {{"docs:0", 25}, {"docs:3", 2}}).ok());
  ASSERT_TRUE(ledger->Commit(state).ok());
  auto loaded = ledger->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->has_value());
  const LedgerState& back = **loaded;
  EXPECT_EQ(back.next_step, 8);
  EXPECT_EQ(back.mode, AccountingMode::kResidency);
  EXPECT_EQ(back.warning_level, 0.75);
  EXPECT_EQ(back.resume_offsets, state.resume_offsets);
  EXPECT_EQ(back.accountant, state.accountant);
  ASSERT_TRUE(back.residency.has_value());
  EXPECT_EQ(*back.residency, *state.residency);
  EXPECT_EQ(back.arrivals, state.arrivals);
  EXPECT_EQ(Ledger::Encode(back), Ledger::Encode(state));
}

TEST(LedgerTest, AnyFlippedByteIsDetected) {
  LedgerState state;
  state.next_step = 3;
  ASSERT_TRUE(state.accountant.Compose(0.01, 1.1, 2).ok());
  state.resume_offsets = {{"in:0", 5}};
  const std::string bytes = Ledger::Encode(state);
  ASSERT_TRUE(Ledger::Decode(bytes, "ledger").ok());
  // Flip one bit at positions spread over the whole file (header, counters,
  // hex floats, checksum): every variant must be refused, none reset.
  for (size_t position = 0; position < bytes.size(); position += 7) {
    std::string corrupt = bytes;
    corrupt[position] = static_cast<char>(corrupt[position] ^ 0x04);
    auto decoded = Ledger::Decode(corrupt, "ledger");
    ASSERT_FALSE(decoded.ok()) << "flip at " << position;
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  }
}

TEST(LedgerTest, VersionOneLedgersAreStillRead) {
  privacy::RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose(0.02, 1.3, 9).ok());
  const std::string v1 = "vipsd-ledger 1\nnext_step 10\n" + accountant.Serialize();
  auto decoded = Ledger::Decode(v1, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->next_step, 10);
  EXPECT_EQ(decoded->mode, AccountingMode::kGlobal);
  EXPECT_EQ(decoded->accountant, accountant);
}

TEST(LedgerTest, ASecondProcessCannotOpenTheSameStateDirectory) {
  const std::string dir = FreshDirectory("locked");
  auto first = Ledger::Open(dir);
  ASSERT_TRUE(first.ok());
  auto second = Ledger::Open(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another vipsd process"), std::string::npos);
  { Ledger released = std::move(*first); }
  EXPECT_TRUE(Ledger::Open(dir).ok());  // the lock goes with the Ledger
}

}  // namespace
}  // namespace vipsd::daemon
