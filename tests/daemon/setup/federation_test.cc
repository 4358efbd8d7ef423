// Federated mode's pieces in the daemon (issue 31): the key generator, a
// holder's key against the roster, the roster's fingerprint, and the plan
// and share messages on the work topic.
#include "daemon/setup/federation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "config/config.h"
#include "connectors/file/file_util.h"
#include "core/privacy/mechanisms/distributed_noise.h"
#include "daemon/io/work_exchange.h"
#include "daemon/setup/model_setup.h"
#include "tools/privacy/privacy_cli.h"

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "federation_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string SecretOf(const std::string& path) {
  auto text = connectors::ReadWholeFile(path);
  EXPECT_TRUE(text.ok());
  return text.ok() ? text->substr(0, 64) : std::string();
}

TEST(FederationTest, KeygenWritesAPrivateFileNeverOverwritesAndItsKeyMatchesTheRoster) {
  const std::string dir = Dir("keygen");
  auto a = WriteNewHolderKey(dir + "/a.key");
  auto b = WriteNewHolderKey(dir + "/b.key");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  struct stat info{};
  ASSERT_EQ(stat((dir + "/a.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  auto again = WriteNewHolderKey(dir + "/a.key");
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr("never overwritten"));

  config::FederationSettings settings;
  settings.role = config::FederationRole::kHolder;
  settings.holder_id = "a";
  settings.holders = {{"a", *a}, {"b", *b}};
  settings.secret_key = SecretOf(dir + "/a.key");
  EXPECT_TRUE(HolderMaskerOf(settings).ok());
  // b's secret key under a's id: not the roster's key for a.
  settings.secret_key = SecretOf(dir + "/b.key");
  auto impostor = HolderMaskerOf(settings);
  ASSERT_FALSE(impostor.ok());
  EXPECT_THAT(impostor.status().message(), HasSubstr("unknown key"));
  // Not 64 hex digits: refused without repeating the file.
  settings.secret_key = "not a key";
  auto garbled = HolderMaskerOf(settings);
  ASSERT_FALSE(garbled.ok());
  EXPECT_THAT(garbled.status().message(), HasSubstr("64 hex digits"));
  EXPECT_THAT(garbled.status().message(), ::testing::Not(HasSubstr("not a key")));
}

TEST(FederationTest, TheRosterFingerprintFollowsEveryIdAndKey) {
  const std::string dir = Dir("roster");
  auto a = WriteNewHolderKey(dir + "/a.key");
  auto b = WriteNewHolderKey(dir + "/b.key");
  auto c = WriteNewHolderKey(dir + "/c.key");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  config::FederationSettings settings;
  settings.holders = {{"a", *a}, {"b", *b}};
  auto roster = RosterOf(settings);
  ASSERT_TRUE(roster.ok());
  const std::string fingerprint = RosterFingerprint(*roster);
  EXPECT_EQ(fingerprint.size(), 64u);
  settings.holders["b"] = *c;
  EXPECT_NE(RosterFingerprint(*RosterOf(settings)), fingerprint);
  settings.holders = {{"a", *a}, {"z", *b}};
  EXPECT_NE(RosterFingerprint(*RosterOf(settings)), fingerprint);
  settings.holders = {{"a", *a}, {"b", *a}};
  EXPECT_FALSE(RosterOf(settings).ok());  // one key twice
}

TEST(FederationTest, PlansAndSharesRoundTripAndAnythingElseIsRefused) {
  FederatedPlan plan;
  plan.job = "fedjob";
  plan.epoch = 3;
  plan.owner = std::string(32, 'f');
  plan.step = 7;
  plan.slot = 9;
  plan.mechanism.sampling_rate = 0.25;
  plan.mechanism.noise_multiplier = 1.5;
  plan.cut_time_ms = 1767225600000;
  plan.participants = {"h1", "h2", "h3"};
  plan.incarnations = {std::string(32, '1'), std::string(32, '2'), std::string(32, '3')};
  plan.tolerated = 1;
  plan.roster = std::string(64, 'a');
  plan.run = std::string(32, 'c');
  plan.model = "model bytes";
  plan.terms = "model.type: lda\nsource.timestamps: log_append_time\n";
  plan.issued_ms = 1767225601000;
  plan.due_ms = 1767225631000;
  const std::string bytes = EncodeFederatedPlan(plan);
  ASSERT_EQ(*WorkMessageKindOf(bytes), WorkMessageKind::kFederatedPlan);
  auto decoded = DecodeFederatedPlan(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->participants, plan.participants);
  EXPECT_EQ(decoded->tolerated, 1u);
  EXPECT_EQ(decoded->cut_time_ms, plan.cut_time_ms);
  EXPECT_EQ(decoded->model, plan.model);
  EXPECT_EQ(decoded->mechanism.noise_multiplier, 1.5);
  EXPECT_EQ(decoded->run, plan.run);
  EXPECT_EQ(decoded->incarnations, plan.incarnations);
  EXPECT_EQ(decoded->terms, plan.terms);
  EXPECT_EQ(decoded->issued_ms, plan.issued_ms);
  EXPECT_EQ(decoded->due_ms, plan.due_ms);
  // Its public times: issued, then due after it.
  FederatedPlan untimed = plan;
  untimed.due_ms = plan.issued_ms;
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(untimed)).ok());
  untimed.issued_ms = 0;
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(untimed)).ok());
  FederatedPlan bad_incarnation = plan;
  bad_incarnation.incarnations[1] = "h2";
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(bad_incarnation)).ok());
  // The aggregator's run is what the pads are bound to: a plan without a
  // well-formed one is refused, and one of an earlier vipsd (VFP1, pads
  // bound to nothing) is named as such.
  FederatedPlan unbound = plan;
  unbound.run = "";
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(unbound)).ok());
  unbound.run = std::string(32, 'C');
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(unbound)).ok());
  std::string v1 = bytes;
  v1[3] = '1';
  EXPECT_EQ(WorkMessageKindOf(v1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(WorkMessageKindOf(v1).status().message().find("VFP1"), std::string::npos);
  std::string v2 = bytes;
  v2[3] = '2';  // shares sent when ready, joins without terms
  EXPECT_EQ(WorkMessageKindOf(v2).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(WorkMessageKindOf(v2).status().message().find("VFP2"), std::string::npos);
  std::string flipped = bytes;
  flipped[10] ^= 1;
  EXPECT_EQ(DecodeFederatedPlan(flipped).status().code(), StatusCode::kDataLoss);
  FederatedPlan unsorted = plan;
  unsorted.participants = {"h2", "h1"};
  unsorted.incarnations = {std::string(32, '2'), std::string(32, '1')};
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(unsorted)).ok());
  FederatedPlan no_honest = plan;
  no_honest.tolerated = 3;
  EXPECT_FALSE(DecodeFederatedPlan(EncodeFederatedPlan(no_honest)).ok());

  FederatedShare share;
  share.job = "fedjob";
  share.epoch = 3;
  share.step = 7;
  share.holder = "h2";
  share.incarnation = std::string(32, '2');
  share.masked = {1, 0xffffffffffffffffull, 42};
  const std::string share_bytes = EncodeFederatedShare(share);
  ASSERT_EQ(*WorkMessageKindOf(share_bytes), WorkMessageKind::kFederatedShare);
  auto share_decoded = DecodeFederatedShare(share_bytes);
  ASSERT_TRUE(share_decoded.ok());
  EXPECT_EQ(share_decoded->masked, share.masked);
  EXPECT_EQ(share_decoded->kind, ShareKind::kShare);
  EXPECT_TRUE(share_decoded->noise_private);
  EXPECT_EQ(share_decoded->incarnation, share.incarnation);
  FederatedShare anonymous = share;
  anonymous.incarnation.clear();  // every message names its holder's incarnation
  EXPECT_FALSE(DecodeFederatedShare(EncodeFederatedShare(anonymous)).ok());
  FederatedShare join = share;
  join.kind = ShareKind::kJoin;  // a join carries no words
  EXPECT_FALSE(DecodeFederatedShare(EncodeFederatedShare(join)).ok());
  join.masked.clear();
  join.terms = "privacy.sampling_rate: 0.5\n";
  auto join_decoded = DecodeFederatedShare(EncodeFederatedShare(join));
  ASSERT_TRUE(join_decoded.ok());
  EXPECT_EQ(join_decoded->terms, join.terms);  // what the aggregator checks before planning it
  FederatedShare leave = join;
  leave.kind = ShareKind::kLeave;
  EXPECT_EQ(DecodeFederatedShare(EncodeFederatedShare(leave))->kind, ShareKind::kLeave);
  // The aggregator's refusal of a join, on the plan log.
  FederatedRefusal refusal{"fedjob", 3, std::string(32, 'f'), "h2", std::string(32, '2'),
                           "source.timestamps: aggregator log_append_time, holder create_time"};
  const std::string refusal_bytes = EncodeFederatedRefusal(refusal);
  ASSERT_EQ(*WorkMessageKindOf(refusal_bytes), WorkMessageKind::kFederatedRefusal);
  EXPECT_TRUE(OnPlanLog(WorkMessageKind::kFederatedRefusal));
  auto refusal_decoded = DecodeFederatedRefusal(refusal_bytes);
  ASSERT_TRUE(refusal_decoded.ok());
  EXPECT_EQ(refusal_decoded->reason, refusal.reason);
  EXPECT_EQ(refusal_decoded->incarnation, refusal.incarnation);
  refusal.incarnation = "h2";
  EXPECT_FALSE(DecodeFederatedRefusal(EncodeFederatedRefusal(refusal)).ok());
  // A shared-work plan is neither.
  WorkPlan work;
  work.step = 1;
  work.sampling_rate = 0.5;
  EXPECT_EQ(*WorkMessageKindOf(EncodeWorkPlan(work)), WorkMessageKind::kPlan);
  EXPECT_FALSE(DecodeFederatedPlan(EncodeWorkPlan(work)).ok());
}

// vipsd-privacy plan rebuilds a model's layout from its type (it reads no
// vocabulary): the shares it reports must be those the daemon plans its
// rounds with on the model's real layout.
TEST(FederationTest, ThePlannersSharesAreTheDaemonsForEveryModel) {
  const std::string examples = std::string(VIPSD_SOURCE_DIR) + "/config/examples/";
  for (const char* file : {"federation/aggregator.yaml", "blr_offline.yaml", "sbn_offline.yaml"}) {
    SCOPED_TRACE(file);
    auto config = config::LoadConfigFile(examples + file);
    ASSERT_TRUE(config.ok()) << config.status().message();
    config->federation.holders = {{"a", std::string(64, '1')},
                                  {"b", std::string(64, '2')},
                                  {"c", std::string(64, '3')}};
    config->federation.tolerated_holders = 1;
    if (!config->is_private()) config->driver.mechanism.noise_multiplier = 1.3;
    auto bundle = BuildModel(*config);
    ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
    auto daemon_noise = privacy::DistributedNoiseFor(
        bundle->model->statistic_layout(), config->driver.mechanism.noise_multiplier, 3, 1);
    auto planner_noise = tools::FederatedNoiseOf(*config);
    ASSERT_TRUE(daemon_noise.ok() && planner_noise.ok());
    EXPECT_EQ(planner_noise->share_sigma2.numerator, daemon_noise->share_sigma2.numerator);
    EXPECT_EQ(planner_noise->central.sigma2.numerator, daemon_noise->central.sigma2.numerator);
    EXPECT_EQ(planner_noise->central.bound_squared, daemon_noise->central.bound_squared);
    EXPECT_EQ(planner_noise->central.grid_exponent, daemon_noise->central.grid_exponent);
  }
}

}  // namespace
}  // namespace vipsd::daemon
