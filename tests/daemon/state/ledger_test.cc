#include "daemon/state/ledger.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/base/format.h"
#include "core/privacy/accounting/filter_weights.h"
#include "core/release/release.h"
#include "tests/testing/ledger_text.h"

namespace vipsd::daemon {
namespace {

std::string FreshDirectory(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "ledger_test_" + name;
  std::filesystem::remove_all(dir);
  return dir + "/state";
}

// A plausible global-mode state with `steps` private steps.
LedgerState Global(int64_t steps) {
  LedgerState state;
  state.run_id = "0123456789abcdef0123456789abcdef";
  state.model_type = "lda";
  state.model_fingerprint = std::string(64, 'a');
  state.next_step = steps + 1;
  state.noise.private_steps = steps;
  EXPECT_TRUE(state.accountant.Compose({0.01, 1.1}, steps).ok());
  auto windows = svi::SlotWindows::Create(1764000000.5, 0.25, svi::kWindowAll);
  EXPECT_TRUE(windows.ok());
  state.windows = std::move(*windows);
  EXPECT_TRUE(state.windows.AddStream("in:0", 0).ok());
  EXPECT_TRUE(state.windows.RecordCuts(steps + 2, {{"in:0", 5 * steps}}).ok());
  return state;
}

// Re-signs `body` (everything before the checksum line) so that parsing is
// reached behind the checksum.
std::string Resign(const std::string& body) { return vipsd::testing::ResignLedgerBody(body); }

std::string Body(const std::string& bytes) { return vipsd::testing::LedgerBody(bytes); }

TEST(LedgerTest, AbsentLedgerMeansAFreshRun) {
  auto ledger = Ledger::Open(FreshDirectory("absent"));
  ASSERT_TRUE(ledger.ok());
  auto state = ledger->Load();
  ASSERT_TRUE(state.ok());
  EXPECT_FALSE(state->has_value());
}

TEST(LedgerTest, NewRunIdsAreRandomHex) {
  auto a = NewRunId();
  auto b = NewRunId();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(LedgerTest, CommitThenLoadRestoresEverythingExactly) {
  auto ledger = Ledger::Open(FreshDirectory("roundtrip"));
  ASSERT_TRUE(ledger.ok());
  LedgerState state = Global(41);
  state.noise = {38, 2, 4, 1, 9};
  state.warning_level = 0.5;
  ASSERT_TRUE(ledger->Commit(state).ok());
  EXPECT_FALSE(std::filesystem::exists(ledger->path() + ".tmp"));
  auto loaded = ledger->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->has_value());
  const LedgerState& back = **loaded;
  EXPECT_EQ(back.run_id, state.run_id);
  EXPECT_EQ(back.model_type, "lda");
  EXPECT_EQ(back.model_fingerprint, state.model_fingerprint);
  EXPECT_EQ(back.source, SourceKind::kKafka);
  EXPECT_EQ(back.next_step, 42);
  EXPECT_EQ(back.noise, state.noise);
  EXPECT_EQ(back.warning_level, 0.5);
  EXPECT_TRUE(back.windows == state.windows);
  EXPECT_EQ(back.accountant, state.accountant);
  EXPECT_EQ(back.accountant.GetEpsilon(1e-5)->epsilon, state.accountant.GetEpsilon(1e-5)->epsilon);
  EXPECT_EQ(Ledger::Encode(back), Ledger::Encode(state));
}

// Issue 26: the ceiling the directory is held to is part of the record
// (version 5); a version-4 ledger reads with none recorded.
TEST(LedgerTest, TheCeilingIsRecordedAndAVersion4LedgerHasNone) {
  LedgerState state = Global(9);
  state.epsilon_ceiling = 3.75;
  const std::string bytes = Ledger::Encode(state);
  EXPECT_NE(bytes.find("\nceiling 0x1.ep+1\n"), std::string::npos);
  auto decoded = Ledger::Decode(bytes, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->epsilon_ceiling, 3.75);
  EXPECT_EQ(Ledger::Encode(*decoded), bytes);

  std::string v4 = Body(bytes);
  v4.replace(0, 15, "vipsd-ledger 4\n");
  const size_t at = v4.find("ceiling ");
  v4.erase(at, v4.find('\n', at) + 1 - at);
  decoded = Ledger::Decode(Resign(v4), "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->epsilon_ceiling, 0);
  EXPECT_EQ(decoded->accountant, state.accountant);

  for (const std::string& bad :
       {std::string("ceiling -0x1p+0\n"), std::string("ceiling inf\n"), std::string("ceiling nan\n"),
        std::string("ceiling\n"), std::string("ceiling 0x1p+0 0x1p+0\n"),
        std::string("limit 0x1p+0\n")}) {
    std::string body = Body(bytes);
    const size_t line = body.find("ceiling ");
    body.replace(line, body.find('\n', line) + 1 - line, bad);
    EXPECT_FALSE(Ledger::Decode(Resign(body), "ledger").ok()) << bad;
  }
  // A version-5 ledger without the line is refused (not read as 0).
  std::string missing = Body(bytes);
  missing.erase(missing.find("ceiling "), missing.find('\n', missing.find("ceiling ")) + 1 -
                                              missing.find("ceiling "));
  EXPECT_FALSE(Ledger::Decode(Resign(missing), "ledger").ok());
}

// The privacy unit: a record-level directory is still written as version 5
// (byte for byte what earlier releases wrote); a unit makes it version 6
// with a unit line, which is checked behind the checksum.
TEST(LedgerTest, AUnitIsRecordedInVersion6AndAVersion5LedgerIsRecordLevel) {
  LedgerState state = Global(4);
  state.epsilon_ceiling = 2;
  const std::string record_level = Ledger::Encode(state);
  EXPECT_EQ(record_level.rfind("vipsd-ledger 5\n", 0), 0u);
  EXPECT_EQ(record_level.find("\nunit "), std::string::npos);
  auto decoded = Ledger::Decode(record_level, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->unit, "record");
  EXPECT_EQ(decoded->max_records_per_unit, 0);

  state.unit = "field";
  state.unit_field = "article";
  state.max_records_per_unit = 12;
  const std::string per_unit = Ledger::Encode(state);
  EXPECT_EQ(per_unit.rfind("vipsd-ledger 6\n", 0), 0u);
  EXPECT_NE(per_unit.find("\nceiling 0x1p+1\nunit field article 12\n"), std::string::npos);
  decoded = Ledger::Decode(per_unit, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->unit, "field");
  EXPECT_EQ(decoded->unit_field, "article");
  EXPECT_EQ(decoded->max_records_per_unit, 12);
  EXPECT_EQ(Ledger::Encode(*decoded), per_unit);
  state.unit = "key";
  state.unit_field.clear();
  decoded = Ledger::Decode(Ledger::Encode(state), "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->unit, "key");
  EXPECT_EQ(decoded->max_records_per_unit, 12);

  for (const std::string& bad :
       {std::string("unit record 3\n"), std::string("unit key\n"), std::string("unit key 0\n"),
        std::string("unit key 1000001\n"), std::string("unit key 3x\n"),
        std::string("unit field 3\n"), std::string("unit key 3 4\n"), std::string("")}) {
    std::string body = Body(per_unit);
    const size_t line = body.find("unit ");
    body.replace(line, body.find('\n', line) + 1 - line, bad);
    EXPECT_FALSE(Ledger::Decode(Resign(body), "ledger").ok()) << bad;
  }
}

// Issue 49: δ is part of the record (version 7, with the unit line always
// present); a version-6 or 5 ledger reads with none recorded.
TEST(LedgerTest, DeltaIsRecordedInVersion7AndOlderLedgersHaveNone) {
  LedgerState state = Global(4);
  state.epsilon_ceiling = 2;
  state.delta = 1e-6;
  const std::string bytes = Ledger::Encode(state);
  EXPECT_EQ(bytes.rfind("vipsd-ledger 7\n", 0), 0u);
  EXPECT_NE(bytes.find("\nceiling 0x1p+1\ndelta " + HexDouble(1e-6) + "\nunit record\n"),
            std::string::npos);
  auto decoded = Ledger::Decode(bytes, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->delta, 1e-6);
  EXPECT_EQ(decoded->unit, "record");
  EXPECT_EQ(Ledger::Encode(*decoded), bytes);
  // With a unit.
  state.unit = "key";
  state.max_records_per_unit = 5;
  const std::string per_unit = Ledger::Encode(state);
  EXPECT_NE(per_unit.find("\ndelta " + HexDouble(1e-6) + "\nunit key 5\n"), std::string::npos);
  decoded = Ledger::Decode(per_unit, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->delta, 1e-6);
  EXPECT_EQ(decoded->unit, "key");
  EXPECT_EQ(decoded->max_records_per_unit, 5);
  // No δ recorded: written as before (version 5 here), read as none.
  state.unit = "record";
  state.max_records_per_unit = 0;
  state.delta = 0;
  const std::string v5 = Ledger::Encode(state);
  EXPECT_EQ(v5.rfind("vipsd-ledger 5\n", 0), 0u);
  EXPECT_EQ(v5.find("\ndelta "), std::string::npos);
  decoded = Ledger::Decode(v5, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->delta, 0);
  // Bad δ lines, and a version-7 ledger without its δ or unit line.
  for (const std::string& bad :
       {std::string("delta 0x0p+0\n"), std::string("delta 0x1p+0\n"), std::string("delta -0x1p-20\n"),
        std::string("delta nan\n"), std::string("delta\n"), std::string("delta 0x1p-20 1\n"),
        std::string("")}) {
    std::string body = Body(bytes);
    const size_t line = body.find("delta ");
    body.replace(line, body.find('\n', line) + 1 - line, bad);
    EXPECT_FALSE(Ledger::Decode(Resign(body), "ledger").ok()) << bad;
  }
  std::string no_unit = Body(bytes);
  no_unit.erase(no_unit.find("unit record\n"), 12);
  EXPECT_FALSE(Ledger::Decode(Resign(no_unit), "ledger").ok());
  // A federated holder's directory records the aggregator run it serves.
  state.delta = 1e-6;
  state.federation_run = std::string(32, 'e');
  const std::string holder = Ledger::Encode(state);
  EXPECT_NE(holder.find("\nunit record\nfederation " + std::string(32, 'e') + "\nsection "),
            std::string::npos);
  decoded = Ledger::Decode(holder, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->federation_run, std::string(32, 'e'));
  EXPECT_EQ(Ledger::Encode(*decoded), holder);
  for (const std::string& bad : {std::string("federation \n"), std::string("federation EEEE\n"),
                                 "federation " + std::string(32, 'e') + " x\n"}) {
    std::string body = Body(holder);
    const size_t line = body.find("federation ");
    body.replace(line, body.find('\n', line) + 1 - line, bad);
    EXPECT_FALSE(Ledger::Decode(Resign(body), "ledger").ok()) << bad;
  }
}

TEST(LedgerTest, AFixedScheduleIsPinnedAndAVersion3LedgerReadsAsAdaptive) {
  LedgerState state = Global(9);
  state.schedule = ScheduleKind::kFixed;
  state.fixed_step.sampling_rate = 0.01;
  state.fixed_step.noise_multiplier = 1.1;
  const std::string bytes = Ledger::Encode(state);
  EXPECT_EQ(bytes.rfind("vipsd-ledger 5\n", 0), 0u);
  EXPECT_NE(bytes.find("\nschedule fixed "), std::string::npos);
  auto decoded = Ledger::Decode(bytes, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->schedule, ScheduleKind::kFixed);
  EXPECT_EQ(decoded->fixed_step.sampling_rate, 0.01);
  EXPECT_EQ(decoded->fixed_step.noise_multiplier, 1.1);
  EXPECT_EQ(Ledger::Encode(*decoded), bytes);

  // The same ledger as version 3 (no schedule line): existing state
  // directories keep the adaptive filter they were charged with.
  std::string v3 = Body(bytes);
  v3.replace(0, 15, "vipsd-ledger 3\n");
  for (const char* line : {"schedule fixed ", "ceiling "}) {  // neither existed in v3
    const size_t at = v3.find(line);
    v3.erase(at, v3.find('\n', at) + 1 - at);
  }
  decoded = Ledger::Decode(Resign(v3), "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->schedule, ScheduleKind::kAdaptive);
  EXPECT_EQ(decoded->accountant, state.accountant);

  // Bad schedule lines behind a valid checksum.
  for (const std::string& bad :
       {std::string("schedule sometimes\n"), std::string("schedule fixed 0x1p+1 0x1p+0\n"),
        std::string("schedule fixed 0x1p-2\n"), std::string("schedule fixed 0x1p-2 -0x1p+0\n"),
        std::string("schedule fixed 0x1p-2 inf\n"), std::string("schedule adaptive 3\n")}) {
    std::string body = Body(bytes);
    const size_t line = body.find("schedule fixed ");
    body.replace(line, body.find('\n', line) + 1 - line, bad);
    auto refused = Ledger::Decode(Resign(body), "ledger");
    EXPECT_FALSE(refused.ok()) << bad;
  }
}

TEST(LedgerTest, TheFilterSplitOfAnAdaptiveScheduleIsKeptExactlyAndCheckedBehindTheChecksum) {
  LedgerState state = Global(7);
  state.schedule = ScheduleKind::kAdaptive;
  state.mode = AccountingMode::kResidency;
  auto weights = privacy::DesignFilterWeights(0.01, 1.1, 1e-5, 2.0, 50);
  ASSERT_TRUE(weights.ok());
  ASSERT_TRUE(state.accountant.SetFilterWeights(*weights).ok());
  auto residency = privacy::ResidencyAccountant::Create(50);
  ASSERT_TRUE(residency.ok());
  ASSERT_TRUE(residency->SetFilterWeights(*weights).ok());
  ASSERT_TRUE(residency->RecordStep({0.01, 1.1}, 0.5).ok());
  state.residency = std::move(*residency);
  const std::string bytes = Ledger::Encode(state);
  EXPECT_NE(bytes.find("\nschedule adaptive weighted\n"), std::string::npos);
  EXPECT_NE(bytes.find("filter-weights"), std::string::npos);
  auto decoded = Ledger::Decode(bytes, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->accountant.filter_weights(), *weights);  // bit-exact
  EXPECT_EQ(decoded->residency->filter_weights(), *weights);
  EXPECT_EQ(decoded->accountant, state.accountant);
  EXPECT_EQ(Ledger::Encode(*decoded), bytes);

  // Without the weighted flag: the uniform split of older ledgers.
  state.accountant = Global(7).accountant;
  state.residency.reset();
  state.mode = AccountingMode::kGlobal;
  const std::string uniform = Ledger::Encode(state);
  EXPECT_NE(uniform.find("\nschedule adaptive\n"), std::string::npos);
  decoded = Ledger::Decode(uniform, "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->accountant.filter_weights().empty());

  // A split that would spend more than δ, one that does not match the
  // accountant's orders, or a flag without its section: refused even with a
  // valid checksum.
  const std::string body = Body(bytes);
  const size_t first = body.find("0x", body.find("vipsd-filter-weights"));
  const size_t weight_at = body.find(' ', first) + 1;
  const size_t weight_end = body.find('\n', weight_at);
  for (const std::string& weight : {std::string("0x1p+0"), std::string("0x0p+0"),
                                    std::string("-0x1p-9"), std::string("nan")}) {
    std::string changed = body;
    changed.replace(weight_at, weight_end - weight_at, weight);
    auto refused = Ledger::Decode(Resign(changed), "ledger");
    EXPECT_FALSE(refused.ok()) << weight;
  }
  std::string other_order = body;
  other_order.replace(first, weight_at - 1 - first, "0x1.02p+0");
  EXPECT_FALSE(Ledger::Decode(Resign(other_order), "ledger").ok());
  std::string flag_only = Body(uniform);
  flag_only.replace(flag_only.find("schedule adaptive\n"), 18, "schedule adaptive weighted\n");
  EXPECT_FALSE(Ledger::Decode(Resign(flag_only), "ledger").ok());
}

TEST(LedgerTest, ResidencyStateRoundTrips) {
  LedgerState state = Global(7);
  state.mode = AccountingMode::kResidency;
  state.source = SourceKind::kKafka;
  auto residency = privacy::ResidencyAccountant::Create(5);
  ASSERT_TRUE(residency.ok());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(residency->RecordStep({0.05, 2.0}, 0.125).ok());
  state.residency = std::move(*residency);
  auto decoded = Ledger::Decode(Ledger::Encode(state), "ledger");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_TRUE(decoded->residency.has_value());
  EXPECT_EQ(*decoded->residency, *state.residency);
  EXPECT_EQ(decoded->mode, AccountingMode::kResidency);
}

TEST(LedgerTest, CorruptLedgerIsRefusedNeverReset) {
  auto ledger = Ledger::Open(FreshDirectory("corrupt"));
  ASSERT_TRUE(ledger.ok());
  ASSERT_TRUE(ledger->Commit(Global(5)).ok());
  std::string text;
  {
    std::ifstream in(ledger->path());
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const std::string& bad : {text.substr(0, text.size() / 2), std::string("garbage\n"),
                                 std::string(), std::string("vipsd-ledger 3\n")}) {
    std::ofstream(ledger->path(), std::ios::trunc) << bad;
    auto loaded = ledger->Load();
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(loaded.status().message().find(ledger->path()), std::string::npos);
    EXPECT_NE(loaded.status().message().find("refusing to start from zero"), std::string::npos);
  }
}

TEST(LedgerTest, AnyFlippedByteIsDetected) {
  const std::string bytes = Ledger::Encode(Global(2));
  ASSERT_TRUE(Ledger::Decode(bytes, "ledger").ok());
  for (size_t position = 0; position < bytes.size(); position += 5) {
    std::string corrupt = bytes;
    corrupt[position] = static_cast<char>(corrupt[position] ^ 0x04);
    auto decoded = Ledger::Decode(corrupt, "ledger");
    ASSERT_FALSE(decoded.ok()) << "flip at " << position;
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  }
}

TEST(LedgerTest, OlderVersionsAreRefusedWithTheReason) {
  privacy::RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.02, 1.3}, 9).ok());
  auto v1 = Ledger::Decode("vipsd-ledger 1\nnext_step 10\n" + accountant.Serialize(), "/s/ledger");
  ASSERT_FALSE(v1.ok());
  EXPECT_EQ(v1.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(v1.status().message().find("/s/ledger: version-1 ledger"), std::string::npos);
  EXPECT_NE(v1.status().message().find("no checksum"), std::string::npos);
  const std::string v2_body = "vipsd-ledger 2\nnext_step 10\nmode global\nwarning_level 0x0p+0\n";
  auto v2 = Ledger::Decode(Resign(v2_body), "/s/ledger");
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.status().message().find("version-2 ledger"), std::string::npos);
}

TEST(LedgerTest, CountersNearOverflowAreRefusedBehindAValidChecksum) {
  // A checksum-valid ledger whose step counter is near INT64_MAX must not
  // be accepted: later arithmetic (t + 1, slot times) would overflow.
  const std::string body = Body(Ledger::Encode(Global(3)));
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{
           {"next_step 4\n", "next_step 9223372036854775807\n"},
           {"next_step 4\n", "next_step 9007199254740993\n"},
           {"noise 3 0 0 0 0\n", "noise 3 0 0 4 0\n"},     // count without first step
           {"noise 3 0 0 0 0\n", "noise 3 2 1 0 0\n"},     // more steps than t
           {"run 0123456789abcdef0123456789abcdef\n", "run xyz\n"},
           {"model lda ", "model cnn "},
           {"source kafka\n", "source tape\n"},
       }) {
    std::string changed = body;
    const size_t at = changed.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    changed.replace(at, from.size(), to);
    auto decoded = Ledger::Decode(Resign(changed), "/s/ledger");
    ASSERT_FALSE(decoded.ok()) << to;
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss) << to;
    EXPECT_NE(decoded.status().message().find("/s/ledger"), std::string::npos);
  }
}

// `body` with its residency-accountant section's text edited by `edit`
// (the section's length header follows the edit).
std::string EditResidencySection(const std::string& body,
                                 const std::function<std::string(std::string)>& edit) {
  return vipsd::testing::EditLedgerSection(body, "residency-accountant", edit);
}

TEST(LedgerTest, ResidencyCountersNearOverflowAreRefusedBehindAValidChecksum) {
  // The residency section's counters obey the same bound: a step counter
  // near INT64_MAX would overflow at the next step, and segment counts are
  // summed (each bounded before the sum is formed).
  LedgerState state = Global(7);
  state.mode = AccountingMode::kResidency;
  auto residency = privacy::ResidencyAccountant::Create(5);
  ASSERT_TRUE(residency.ok());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(residency->RecordStep({0.05, 2.0}, 0.125).ok());
  state.residency = std::move(*residency);
  const std::string body = Body(Ledger::Encode(state));
  ASSERT_TRUE(Ledger::Decode(Resign(EditResidencySection(body, [](std::string t) { return t; })),
                             "/s/ledger")
                  .ok());
  std::string rates;  // "q σ " of the one segment, whose count is M - 1 = 4
  EditResidencySection(body, [&](std::string text) {
    const size_t at = text.find("segments 1\n") + std::string("segments 1\n").size();
    const std::string segment = text.substr(at, text.find('\n', at) - at);
    rates = segment.substr(0, segment.rfind(' ') + 1);
    EXPECT_EQ(segment, rates + "4");
    return text;
  });
  ASSERT_FALSE(rates.empty());
  auto replace = [](std::string from, std::string to) {
    return [from, to](std::string text) {
      const size_t at = text.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at != std::string::npos) text.replace(at, from.size(), to);
      return text;
    };
  };
  const std::vector<std::function<std::string(std::string)>> edits = {
      replace("\nsteps 7\n", "\nsteps 9223372036854775807\n"),
      replace("\nsteps 7\n", "\nsteps 9\n"),  // more steps than the ledger's counter
      replace("max_residency_steps 5\n", "max_residency_steps 9223372036854775807\n"),
      replace(rates + "4\n", rates + "9223372036854775807\n"),
      // M = 2^53 is legal, but two segments of 2^53 - 2 steps each are not:
      // their sum exceeds M - 1 (and would overflow in int64 arithmetic of
      // a few more such segments); it is refused before it is formed.
      [&](std::string text) {
        text = replace("max_residency_steps 5\n", "max_residency_steps 9007199254740992\n")(text);
        return replace("segments 1\n" + rates + "4\n",
                       "segments 2\n" + rates + "9007199254740990\n" + rates +
                           "9007199254740990\n")(text);
      },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    auto decoded = Ledger::Decode(Resign(EditResidencySection(body, edits[i])), "/s/ledger");
    ASSERT_FALSE(decoded.ok()) << "edit " << i;
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss) << "edit " << i;
    EXPECT_NE(decoded.status().message().find("/s/ledger"), std::string::npos);
    EXPECT_NE(decoded.status().message().find("residency accountant"), std::string::npos)
        << "edit " << i << ": " << decoded.status().message();
  }
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
