#include "connectors/kafka/release_assembler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

namespace vipsd::connectors {
namespace {

using ::testing::HasSubstr;
using Headers = std::vector<std::pair<std::string, std::string>>;

// One message as PublishRelease sends it (docs/release_format.md).
struct Wire {
  std::string key;
  Headers headers;
  std::string value;
};

release::Release MakeRelease(const std::string& id, size_t values = 300000) {
  release::Release r;
  release::ReleaseMetadata& m = r.metadata;
  m.release_id = id;
  m.model_type = "lda";
  m.step = 3;
  m.rho = 0.5;
  m.accountant = "none";
  m.sampling_rate = 0.1;
  m.dimensions = {{"K", 1}, {"V", static_cast<int64_t>(values)}};
  m.config_fingerprint = std::string(64, 'e');
  m.noise_description = "none";
  m.created_at_utc = "2026-01-31T12:00:00Z";
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(0, 1);
  release::ReleaseArray lambda{"lambda", {1, static_cast<int64_t>(values)}, {}};
  for (size_t i = 0; i < values; ++i) lambda.data.push_back(uniform(rng));
  r.arrays.push_back(std::move(lambda));
  r.arrays.push_back({"alpha", {2}, {0.5, 0.25}});
  return r;
}

// Exactly the messages KafkaProducer::PublishRelease produces (chunk size
// as given, so that small tests still have several chunks).
std::vector<Wire> ToWire(const release::EncodedRelease& encoded,
                         size_t chunk_bytes = release::kDefaultChunkBytes) {
  std::vector<Wire> wire;
  for (size_t f = 0; f + 1 < encoded.files.size(); ++f) {
    const auto pieces = release::ChunkBytes(encoded.files[f].bytes, chunk_bytes);
    for (size_t c = 0; c < pieces.size(); ++c) {
      wire.push_back({encoded.release_id,
                      {{"vipsd-release-id", encoded.release_id},
                       {"vipsd-file", encoded.files[f].name},
                       {"vipsd-chunk", std::to_string(c)},
                       {"vipsd-chunks", std::to_string(pieces.size())}},
                      pieces[c]});
    }
  }
  wire.push_back({encoded.release_id,
                  {{"vipsd-release-id", encoded.release_id}, {"vipsd-file", "manifest.json"}},
                  encoded.files.back().bytes});
  return wire;
}

release::EncodedRelease Encode(const std::string& id, size_t values = 300000) {
  auto encoded = release::EncodeRelease(MakeRelease(id, values));
  EXPECT_TRUE(encoded.ok()) << encoded.status().message();
  return std::move(encoded).value();
}

struct FeedResult {
  std::vector<release::EncodedRelease> releases;
  std::vector<Status> errors;
};

FeedResult Feed(ReleaseAssembler& assembler, const std::vector<Wire>& wire) {
  FeedResult out;
  for (const Wire& m : wire) {
    ReleaseAssembler::AddResult r = assembler.Add(m.key, m.headers, m.value);
    if (r.release) out.releases.push_back(std::move(*r.release));
    out.errors.insert(out.errors.end(), r.errors.begin(), r.errors.end());
  }
  return out;
}

void ExpectSame(const release::EncodedRelease& a, const release::EncodedRelease& b) {
  EXPECT_EQ(a.release_id, b.release_id);
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    EXPECT_EQ(a.files[i].name, b.files[i].name);
    EXPECT_TRUE(a.files[i].bytes == b.files[i].bytes) << a.files[i].name;
  }
}

TEST(ReleaseAssemblerTest, ReassemblesChunksInAnyOrderOnceTheManifestArrives) {
  const release::EncodedRelease encoded = Encode("step-3");
  std::vector<Wire> wire = ToWire(encoded, 100000);  // lambda: 25 chunks
  ASSERT_GT(wire.size(), 20u);
  // Chunks may come in any order (only the manifest must be last).
  std::mt19937 rng(5);
  std::shuffle(wire.begin(), wire.end() - 1, rng);
  // A retried chunk (same bytes) replaces its first copy.
  wire.insert(wire.end() - 1, wire[3]);
  ReleaseAssembler assembler;
  const FeedResult result = Feed(assembler, wire);
  EXPECT_TRUE(result.errors.empty()) << result.errors[0].message();
  ASSERT_EQ(result.releases.size(), 1u);
  ExpectSame(result.releases[0], encoded);
  EXPECT_EQ(assembler.pending_releases(), 0u);
  EXPECT_EQ(assembler.buffered_bytes(), 0u);
  EXPECT_EQ(assembler.stats().releases_completed, 1);
}

TEST(ReleaseAssemblerTest, InterleavedReleasesAreKeptApart) {
  const release::EncodedRelease a = Encode("step-1", 1000);
  const release::EncodedRelease b = Encode("step-2", 2000);
  const std::vector<Wire> wa = ToWire(a, 3000);
  const std::vector<Wire> wb = ToWire(b, 3000);
  std::vector<Wire> wire;
  for (size_t i = 0; i < std::max(wa.size(), wb.size()); ++i) {
    if (i < wb.size()) wire.push_back(wb[i]);
    if (i < wa.size()) wire.push_back(wa[i]);
  }
  ReleaseAssembler assembler;
  const FeedResult result = Feed(assembler, wire);
  EXPECT_TRUE(result.errors.empty());
  ASSERT_EQ(result.releases.size(), 2u);
  ExpectSame(result.releases[0], a);  // a's manifest came first
  ExpectSame(result.releases[1], b);
}

// Every way a release can be incomplete or inconsistent drops it whole.
TEST(ReleaseAssemblerTest, IncompleteOrMismatchingReleasesAreDroppedWhole) {
  const release::EncodedRelease encoded = Encode("step-9", 5000);
  const std::vector<Wire> good = ToWire(encoded, 10000);  // lambda: 5 chunks
  struct Case {
    const char* name;
    std::vector<Wire> (*mutate)(std::vector<Wire>);
    const char* message;
  };
  const std::vector<Case> cases = {
      {"missing chunk",
       [](std::vector<Wire> w) {
         w.erase(w.begin() + 1);
         return w;
       },
       "lambda.npy: chunk 1 of 5 missing"},
      {"missing file",
       [](std::vector<Wire> w) {
         w.erase(w.end() - 2);  // alpha.npy's only chunk
         return w;
       },
       "alpha.npy: no chunk received"},
      {"flipped byte",
       [](std::vector<Wire> w) {
         w[2].value[100] ^= 0x20;
         return w;
       },
       "lambda.npy: BLAKE2b-256 does not match"},
      {"truncated chunk",
       [](std::vector<Wire> w) {
         w[3].value.pop_back();
         return w;
       },
       "bytes, manifest says"},
      {"extra file",
       [](std::vector<Wire> w) {
         Wire extra = w[0];
         extra.headers[1].second = "beta.npy";
         extra.headers[3].second = "1";
         w.insert(w.begin(), extra);
         return w;
       },
       "beta.npy is not listed in the manifest"},
      {"manifest for another id",
       [](std::vector<Wire> w) {
         auto manifest = nlohmann::json::parse(w.back().value);
         manifest["release_id"] = "step-10";
         w.back().value = manifest.dump();
         return w;
       },
       "release_id differs"},
      {"wrong shape in manifest",
       [](std::vector<Wire> w) {
         auto manifest = nlohmann::json::parse(w.back().value);
         manifest["arrays"][0]["shape"] = {5000, 1};
         w.back().value = manifest.dump();
         return w;
       },
       "shape differs"},
      {"broken manifest",
       [](std::vector<Wire> w) {
         w.back().value = "{\"format\": ";
         return w;
       },
       "not a JSON object"},
      {"schema 2",
       [](std::vector<Wire> w) {
         auto manifest = nlohmann::json::parse(w.back().value);
         manifest["schema_version"] = 2;
         w.back().value = manifest.dump();
         return w;
       },
       "schema_version is not 1"},
  };
  for (const Case& c : cases) {
    ReleaseAssembler assembler;
    const FeedResult result = Feed(assembler, c.mutate(good));
    EXPECT_TRUE(result.releases.empty()) << c.name;
    ASSERT_EQ(result.errors.size(), 1u) << c.name;
    EXPECT_EQ(result.errors[0].code(), StatusCode::kDataLoss) << c.name;
    EXPECT_THAT(result.errors[0].message(), HasSubstr("release step-9 dropped")) << c.name;
    EXPECT_THAT(result.errors[0].message(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(assembler.buffered_bytes(), 0u) << c.name;
    EXPECT_EQ(assembler.stats().releases_dropped, 1) << c.name;
    // The next, intact copy of the release still assembles.
    const FeedResult again = Feed(assembler, good);
    EXPECT_EQ(again.releases.size(), 1u) << c.name;
  }
}

TEST(ReleaseAssemblerTest, NonFiniteValuesAreRefused) {
  release::Release r = MakeRelease("nan", 10);
  auto encoded = release::EncodeRelease(r);
  ASSERT_TRUE(encoded.ok());
  // Re-encode lambda with a NaN behind Validate's back and fix the manifest.
  release::ReleaseArray bad = r.arrays[0];
  bad.data[4] = std::numeric_limits<double>::quiet_NaN();
  encoded->files[0].bytes = release::EncodeNpy(bad);
  auto manifest = nlohmann::json::parse(encoded->files.back().bytes);
  manifest["arrays"][0]["blake2b"] = release::Blake2bHex(encoded->files[0].bytes);
  encoded->files.back().bytes = manifest.dump();
  ReleaseAssembler assembler;
  const FeedResult result = Feed(assembler, ToWire(*encoded));
  EXPECT_TRUE(result.releases.empty());
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].message(), HasSubstr("non-finite"));
}

TEST(ReleaseAssemblerTest, MalformedMessagesAreIgnoredWithAnError) {
  const release::EncodedRelease encoded = Encode("step-4", 100);
  std::vector<Wire> wire = ToWire(encoded);
  ReleaseAssembler assembler;
  auto ignored = [&assembler](const Wire& w) {
    ReleaseAssembler::AddResult r = assembler.Add(w.key, w.headers, w.value);
    EXPECT_FALSE(r.release.has_value());
    if (r.errors.size() != 1) return std::string("<no error>");
    EXPECT_EQ(r.errors[0].code(), StatusCode::kInvalidArgument);
    return r.errors[0].message();
  };
  Wire w = wire[0];
  w.headers.clear();
  EXPECT_THAT(ignored(w), HasSubstr("not a release message"));
  w = wire[0];
  w.key = "other";
  EXPECT_THAT(ignored(w), HasSubstr("key differs"));
  w = wire[0];
  w.headers[2].second = "4";  // chunk 4 of 1
  EXPECT_THAT(ignored(w), HasSubstr("vipsd-chunk"));
  w = wire[0];
  w.headers[2].second = "01";
  EXPECT_THAT(ignored(w), HasSubstr("vipsd-chunk"));
  w = wire[0];
  w.headers[1].second = "../x.npy";
  EXPECT_THAT(ignored(w), HasSubstr("neither manifest.json nor"));
  w = wire[0];
  w.headers.push_back({"vipsd-file", "alpha.npy"});
  EXPECT_THAT(ignored(w), HasSubstr("appears twice"));
  SourceMessage oversize;
  oversize.oversize = true;
  EXPECT_EQ(assembler.Add(oversize).errors.size(), 1u);
  EXPECT_EQ(assembler.stats().messages_ignored, 7);
  // None of that disturbed the real release.
  EXPECT_EQ(Feed(assembler, wire).releases.size(), 1u);
}

TEST(ReleaseAssemblerTest, ChunkCountChangeRestartsTheFile) {
  const release::EncodedRelease encoded = Encode("step-5", 5000);
  std::vector<Wire> first_try = ToWire(encoded, 10000);   // 5 lambda chunks
  std::vector<Wire> second_try = ToWire(encoded, 20000);  // 3 lambda chunks
  ReleaseAssembler assembler;
  // The first attempt sent two chunks and failed; the second is complete.
  std::vector<Wire> wire = {first_try[0], first_try[1]};
  wire.insert(wire.end(), second_try.begin(), second_try.end());
  const FeedResult result = Feed(assembler, wire);
  ASSERT_EQ(result.releases.size(), 1u);
  ExpectSame(result.releases[0], encoded);
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].message(), HasSubstr("chunk count changed from 5 to 3"));
}

// Memory stays bounded: the oldest incomplete release goes first.
TEST(ReleaseAssemblerTest, EvictsTheOldestIncompleteReleaseBeyondTheBounds) {
  ReleaseAssemblerOptions options;
  options.max_buffered_bytes = 100000;
  options.max_pending_releases = 2;
  ReleaseAssembler assembler(options);
  const release::EncodedRelease r1 = Encode("r1", 5000);  // ~40 kB each
  const release::EncodedRelease r2 = Encode("r2", 5000);
  const release::EncodedRelease r3 = Encode("r3", 5000);
  auto without_manifest = [](const release::EncodedRelease& e) {
    std::vector<Wire> w = ToWire(e, 10000);
    w.pop_back();
    return w;
  };
  EXPECT_TRUE(Feed(assembler, without_manifest(r1)).errors.empty());
  EXPECT_TRUE(Feed(assembler, without_manifest(r2)).errors.empty());
  EXPECT_EQ(assembler.pending_releases(), 2u);
  EXPECT_LE(assembler.buffered_bytes(), options.max_buffered_bytes);
  // A third release exceeds both bounds: r1 (oldest) is dropped.
  const FeedResult third = Feed(assembler, ToWire(r3, 10000));
  ASSERT_EQ(third.releases.size(), 1u);
  ASSERT_FALSE(third.errors.empty());
  EXPECT_EQ(third.errors[0].code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.errors[0].message(), HasSubstr("incomplete release r1 dropped"));
  EXPECT_LE(assembler.buffered_bytes(), options.max_buffered_bytes);
  // r2 survived and completes with its manifest; r1's manifest alone fails.
  const std::vector<Wire> w2 = ToWire(r2, 10000);
  EXPECT_EQ(Feed(assembler, {w2.back()}).releases.size(), 1u);
  const std::vector<Wire> w1 = ToWire(r1, 10000);
  const FeedResult late = Feed(assembler, {w1.back()});
  EXPECT_TRUE(late.releases.empty());
  ASSERT_EQ(late.errors.size(), 1u);
  EXPECT_THAT(late.errors[0].message(), HasSubstr("no chunk received"));
  // A release larger than the whole bound cannot be held at all.
  const FeedResult huge = Feed(assembler, ToWire(Encode("huge", 20000), 10000));
  EXPECT_TRUE(huge.releases.empty());
  EXPECT_FALSE(huge.errors.empty());
  EXPECT_LE(assembler.buffered_bytes(), options.max_buffered_bytes);
}

}  // namespace
}  // namespace vipsd::connectors
