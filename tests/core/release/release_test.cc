#include "core/release/release.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace vipsd::release {
namespace {

using ::testing::HasSubstr;

constexpr char kHexA[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr char kHexB[] = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

Release ValidRelease() {
  Release r;
  ReleaseMetadata& m = r.metadata;
  m.release_id = "run7-step-120";
  m.model_type = "lda";
  m.step = 120;
  m.rho = 0.0125;
  m.epsilon_spent = 0.75;
  m.delta = 1e-5;
  m.noise_multiplier = 1.1;
  m.sampling_rate = 0.01;
  m.accountant = "rdp";
  m.schedule = "fixed";
  m.conversion = "rdp_improved";
  m.clip_bounds = {{"topic_word", 50.0}};
  m.dimensions = {{"K", 2}, {"V", 3}, {"N", 500}};
  m.vocabulary_fingerprint = kHexA;
  m.config_fingerprint = kHexB;
  m.is_private = true;
  m.noise_description = "chacha20-os-seeded";
  m.created_at_utc = "2026-11-23T00:10:00Z";
  r.arrays.push_back({"lambda", {2, 3}, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}});
  return r;
}

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out += static_cast<char>(v);
  return out;
}

// Little-endian bytes of a double given by its IEEE-754 bit pattern.
std::string DoubleBytes(uint64_t bits) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
  return out;
}

// A .npy file with an arbitrary header dict, padded like NumPy's writer.
std::string NpyWithHeader(const std::string& dict, const std::string& data, size_t align = 64) {
  std::string header = dict;
  const size_t unpadded = 10 + header.size() + 1;
  header.append((align - unpadded % align) % align, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += Bytes({1, 0, static_cast<int>(header.size() & 0xff), static_cast<int>(header.size() >> 8)});
  return out + header + data;
}

// ---------------------------------------------------------------- Validate

TEST(ValidateTest, AcceptsWellFormedReleases) {
  EXPECT_TRUE(Validate(ValidRelease()).ok()) << Validate(ValidRelease()).message();

  Release non_private = ValidRelease();
  non_private.metadata.is_private = false;
  non_private.metadata.noise_multiplier = 0;
  non_private.metadata.epsilon_spent = 0;
  non_private.metadata.delta = 0;
  non_private.metadata.accountant = "none";
  non_private.metadata.clip_bounds = {{"topic_word", 0.0}};
  non_private.metadata.vocabulary_fingerprint = "";  // models without a vocabulary
  non_private.metadata.created_at_utc = "2026-11-23T00:10:00.123456+01:00";
  non_private.arrays.push_back({"scalar", {}, {2.5}});
  non_private.arrays.push_back({"empty", {0, 4}, {}});
  EXPECT_TRUE(Validate(non_private).ok()) << Validate(non_private).message();
}

struct Mutation {
  const char* what;
  std::function<void(Release&)> apply;
  const char* message_part;
};

TEST(ValidateTest, RejectsEveryOutOfRangeFieldNamingIt) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Mutation> mutations = {
      {"schema", [](Release& r) { r.metadata.schema_version = 2; }, "schema_version"},
      {"empty id", [](Release& r) { r.metadata.release_id = ""; }, "release_id"},
      {"dotdot id", [](Release& r) { r.metadata.release_id = ".."; }, "release_id"},
      {"hidden id", [](Release& r) { r.metadata.release_id = ".step-1.tmp"; }, "release_id"},
      {"slash id", [](Release& r) { r.metadata.release_id = "a/b"; }, "release_id"},
      {"long id", [](Release& r) { r.metadata.release_id = std::string(129, 'a'); }, "release_id"},
      {"model type", [](Release& r) { r.metadata.model_type = "LDA"; }, "model_type"},
      {"step", [](Release& r) { r.metadata.step = -1; }, "step"},
      {"rho zero", [](Release& r) { r.metadata.rho = 0; }, "rho"},
      {"rho big", [](Release& r) { r.metadata.rho = 1.5; }, "rho"},
      {"rho nan", [nan](Release& r) { r.metadata.rho = nan; }, "rho"},
      {"eps negative", [](Release& r) { r.metadata.epsilon_spent = -0.1; }, "epsilon_spent"},
      {"eps inf", [inf](Release& r) { r.metadata.epsilon_spent = inf; }, "epsilon_spent"},
      {"delta one", [](Release& r) { r.metadata.delta = 1; }, "delta"},
      {"sigma nan", [nan](Release& r) { r.metadata.noise_multiplier = nan; }, "noise_multiplier"},
      {"q zero", [](Release& r) { r.metadata.sampling_rate = 0; }, "sampling_rate"},
      {"q big", [](Release& r) { r.metadata.sampling_rate = 1.01; }, "sampling_rate"},
      {"accountant", [](Release& r) { r.metadata.accountant = ""; }, "accountant"},
      {"clip dup",
       [](Release& r) { r.metadata.clip_bounds.push_back({"topic_word", 1.0}); }, "clip_bounds"},
      {"clip name", [](Release& r) { r.metadata.clip_bounds = {{"a b", 1.0}}; }, "clip_bounds"},
      {"clip negative",
       [](Release& r) { r.metadata.clip_bounds = {{"topic_word", -1.0}}; }, "clip_bounds.topic_word"},
      {"dim negative", [](Release& r) { r.metadata.dimensions = {{"K", -2}}; }, "dimensions.K"},
      {"dim zero", [](Release& r) { r.metadata.dimensions = {{"K", 0}}; }, "dimensions.K"},
      {"unknown model", [](Release& r) { r.metadata.model_type = "cnn"; }, "model_type"},
      {"dim dup", [](Release& r) { r.metadata.dimensions = {{"K", 2}, {"K", 3}}; }, "dimensions"},
      {"vocab short", [](Release& r) { r.metadata.vocabulary_fingerprint = "abc"; },
       "vocabulary_fingerprint"},
      {"vocab upper",
       [](Release& r) { r.metadata.vocabulary_fingerprint = std::string(64, 'A'); },
       "vocabulary_fingerprint"},
      {"config empty", [](Release& r) { r.metadata.config_fingerprint = ""; },
       "config_fingerprint"},
      {"noise empty", [](Release& r) { r.metadata.noise_description = ""; }, "noise_description"},
      {"noise control", [](Release& r) { r.metadata.noise_description = "a\nb"; },
       "noise_description"},
      {"noise utf8", [](Release& r) { r.metadata.noise_description = "\xcf\x83=1"; },
       "noise_description"},
      {"time month", [](Release& r) { r.metadata.created_at_utc = "2026-13-01T00:00:00Z"; },
       "created_at_utc"},
      {"time space", [](Release& r) { r.metadata.created_at_utc = "2026-01-01 00:00:00Z"; },
       "created_at_utc"},
      {"time no zone", [](Release& r) { r.metadata.created_at_utc = "2026-01-01T00:00:00"; },
       "created_at_utc"},
      {"time trailing", [](Release& r) { r.metadata.created_at_utc = "2026-01-01T00:00:00Zx"; },
       "created_at_utc"},
      {"private sigma", [](Release& r) { r.metadata.noise_multiplier = 0; }, "noise_multiplier"},
      {"private none", [](Release& r) { r.metadata.accountant = "none"; }, "accountant"},
      {"private no schedule", [](Release& r) { r.metadata.schedule = "none"; }, "schedule"},
      {"private no conversion", [](Release& r) { r.metadata.conversion = "none"; }, "conversion"},
      {"unknown schedule", [](Release& r) { r.metadata.schedule = "sometimes"; }, "schedule"},
      {"private delta", [](Release& r) { r.metadata.delta = 0; }, "delta"},
      {"private clip", [](Release& r) { r.metadata.clip_bounds = {{"topic_word", 0.0}}; },
       "clip_bounds.topic_word"},
      {"private no clip", [](Release& r) { r.metadata.clip_bounds.clear(); }, "clip_bounds"},
      {"no arrays", [](Release& r) { r.arrays.clear(); }, "at least one array"},
      {"array upper", [](Release& r) { r.arrays[0].name = "Lambda"; }, "[a-z0-9_]"},
      {"array dash", [](Release& r) { r.arrays[0].name = "topic-word"; }, "[a-z0-9_]"},
      {"array empty", [](Release& r) { r.arrays[0].name = ""; }, "[a-z0-9_]"},
      {"array dup", [](Release& r) { r.arrays.push_back(r.arrays[0]); }, "used twice"},
      {"shape size", [](Release& r) { r.arrays[0].shape = {3, 3}; }, "9 elements but data has 6"},
      {"shape negative", [](Release& r) { r.arrays[0].shape = {-2, -3}; }, ">= 0"},
      {"shape overflow",
       [](Release& r) {
         r.arrays[0].shape = {std::numeric_limits<int64_t>::max(), 2};
         r.arrays[0].data.clear();
       },
       "representable"},
      {"rank", [](Release& r) { r.arrays[0].shape.assign(33, 1); r.arrays[0].data = {1.0}; },
       "rank"},
      {"nan value", [nan](Release& r) { r.arrays[0].data[4] = nan; }, "finite"},
      {"inf value", [inf](Release& r) { r.arrays[0].data[0] = -inf; }, "finite"},
  };
  for (const Mutation& mutation : mutations) {
    Release release = ValidRelease();
    mutation.apply(release);
    const Status status = Validate(release);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << mutation.what;
    EXPECT_THAT(status.message(), HasSubstr(mutation.message_part)) << mutation.what;
  }
}

// ---------------------------------------------------------------- .npy

TEST(EncodeNpyTest, BytesMatchAHandBuiltFileFor2x3) {
  const ReleaseArray array{"m", {2, 3}, {1.0, 2.0, -2.0, 0.5, 0.0, -0.0}};
  const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
  // 10 + 118 = 128: the data starts on a 64-byte boundary, as NumPy writes it.
  std::string expected = "\x93NUMPY" + Bytes({0x01, 0x00, 118, 0x00}) + dict +
                         std::string(118 - dict.size() - 1, ' ') + "\n";
  ASSERT_EQ(expected.size(), 128u);
  expected += DoubleBytes(0x3FF0000000000000) + DoubleBytes(0x4000000000000000) +
              DoubleBytes(0xC000000000000000) + DoubleBytes(0x3FE0000000000000) +
              DoubleBytes(0x0000000000000000) + DoubleBytes(0x8000000000000000);
  EXPECT_EQ(EncodeNpy(array), expected);
}

TEST(EncodeNpyTest, HeaderIsPaddedToMultipleOf64AndEndsWithNewline) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {7}, {2, 3}, {1, 2, 3, 4, 5, 6}, {123456789012, 0}, std::vector<int64_t>(32, 1)};
  for (const auto& shape : shapes) {
    ReleaseArray array{"a", shape, {}};
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    array.data.assign(static_cast<size_t>(size), 0.25);
    const std::string bytes = EncodeNpy(array);
    const size_t header_length =
        static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    EXPECT_EQ((10 + header_length) % 64, 0u) << shape.size();
    EXPECT_EQ(bytes[10 + header_length - 1], '\n');
    EXPECT_EQ(bytes.size(), 10 + header_length + 8 * array.data.size());
  }
  // Python's tuple syntax: "()" for a scalar, "(7,)" for rank 1.
  EXPECT_THAT(EncodeNpy({"a", {}, {1.0}}), HasSubstr("'shape': (), }"));
  EXPECT_THAT(EncodeNpy({"a", {7}, std::vector<double>(7)}), HasSubstr("'shape': (7,), }"));
}

TEST(DecodeNpyTest, RoundTripIsBitExact) {
  const double nan_with_payload = std::bit_cast<double>(uint64_t{0x7FF8000000012345});
  const std::vector<double> values = {
      -0.0, 0.0, std::numeric_limits<double>::denorm_min(), -4.9406564584124654e-322,
      DBL_MIN, 1e308, -1e308, DBL_MAX, std::numbers::pi, 1.0 / 3.0, nan_with_payload, -1e-300};
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{12}, {3, 4}, {2, 3, 2}, {1, 12, 1}}) {
    const ReleaseArray array{"x", shape, values};
    auto decoded = DecodeNpy(EncodeNpy(array), "x");
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(decoded->name, "x");
    EXPECT_EQ(decoded->shape, shape);
    ASSERT_EQ(decoded->data.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint64_t>(decoded->data[i]), std::bit_cast<uint64_t>(values[i])) << i;
    }
  }
  auto scalar = DecodeNpy(EncodeNpy({"s", {}, {-0.0}}), "s");
  ASSERT_TRUE(scalar.ok());
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_TRUE(std::signbit(scalar->data.at(0)));
  auto empty = DecodeNpy(EncodeNpy({"e", {4, 0}, {}}), "e");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{4, 0}));
  EXPECT_TRUE(empty->data.empty());
}

TEST(DecodeNpyTest, RejectsAnythingButTheExactFormat) {
  const std::string six_doubles(48, '\0');
  const std::string good = EncodeNpy({"m", {2, 3}, std::vector<double>(6, 0.0)});
  ASSERT_TRUE(DecodeNpy(good, "m").ok());
  ASSERT_TRUE(
      DecodeNpy(NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
                              six_doubles),
                "m")
          .ok());
  struct Case {
    const char* what;
    std::string bytes;
    const char* message_part;
  };
  std::string version2 = good;
  version2[6] = '\x02';
  std::string bad_magic = good;
  bad_magic[1] = 'P';
  const std::vector<Case> cases = {
      {"empty", "", "not a NumPy"},
      {"magic", bad_magic, "not a NumPy"},
      {"version", version2, "version 1.0"},
      {"truncated header", good.substr(0, 60), "truncated header"},
      {"short data", good.substr(0, good.size() - 1), "data size"},
      {"long data", good + "x", "data size"},
      {"big endian",
       NpyWithHeader("{'descr': '>f8', 'fortran_order': False, 'shape': (2, 3), }", six_doubles),
       "header is not"},
      {"float32",
       NpyWithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                     std::string(24, '\0')),
       "header is not"},
      {"fortran",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", six_doubles),
       "header is not"},
      {"key order",
       NpyWithHeader("{'fortran_order': False, 'descr': '<f8', 'shape': (2, 3), }", six_doubles),
       "header is not"},
      {"no space",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (2,3), }", six_doubles),
       "malformed shape"},
      {"rank1 without comma",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (6), }", six_doubles),
       "malformed shape"},
      {"trailing comma",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3,), }", six_doubles),
       "malformed shape"},
      {"negative",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (-2, -3), }", six_doubles),
       "malformed shape"},
      {"leading zero",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (02, 3), }", six_doubles),
       "malformed shape"},
      {"overflow",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': "
                     "(4611686018427387904, 4), }",
                     ""),
       "shape too large"},
      {"16-byte alignment",
       NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", six_doubles,
                     16),
       "multiple of 64"},
  };
  for (const Case& c : cases) {
    auto decoded = DecodeNpy(c.bytes, "lambda");
    ASSERT_FALSE(decoded.ok()) << c.what;
    EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(decoded.status().message(), HasSubstr("lambda.npy: ")) << c.what;
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.message_part)) << c.what;
  }
}

// ---------------------------------------------------------------- hashing

TEST(Blake2bHexTest, MatchesKnownBlake2b256Vectors) {
  // hashlib.blake2b(data, digest_size=32).hexdigest()
  EXPECT_EQ(Blake2bHex(""), "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
  EXPECT_EQ(Blake2bHex("abc"), "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
}

// ---------------------------------------------------------------- manifest

const std::set<std::string> kManifestKeys = {
    "format", "schema_version", "release_id", "model_type", "step", "rho", "epsilon_spent",
    "delta", "noise_multiplier", "sampling_rate", "accountant", "schedule", "conversion",
    "clip_bounds", "dimensions",
    "vocabulary_fingerprint", "vocabulary_source", "hyperparameters", "config_fingerprint", "is_private", "noise_description",
    "created_at_utc", "arrays"};

TEST(ManifestJsonTest, HoldsExactlyTheDocumentedFieldsWithTheirValues) {
  Release release = ValidRelease();
  release.metadata.rho = 1.0;  // integral doubles must still read as floats
  release.metadata.noise_description = "quote \" and backslash \\ survive";
  release.arrays.push_back({"extra", {4}, {0.1, 0.2, 0.3, 0.4}});
  std::vector<std::string> npy = {EncodeNpy(release.arrays[0]), EncodeNpy(release.arrays[1])};
  auto text = ManifestJson(release, npy);
  ASSERT_TRUE(text.ok()) << text.status().message();
  const nlohmann::json manifest = nlohmann::json::parse(*text);

  std::set<std::string> keys;
  for (const auto& item : manifest.items()) keys.insert(item.key());
  // Exactly these: in particular no batch size, pool size, clip count or loss.
  EXPECT_EQ(keys, kManifestKeys);

  const ReleaseMetadata& m = release.metadata;
  EXPECT_EQ(manifest["format"], "vipsd-release");
  EXPECT_EQ(manifest["schema_version"], 1);
  EXPECT_EQ(manifest["release_id"], m.release_id);
  EXPECT_EQ(manifest["model_type"], "lda");
  EXPECT_TRUE(manifest["step"].is_number_integer());
  EXPECT_EQ(manifest["step"], 120);
  for (const char* key : {"rho", "epsilon_spent", "delta", "noise_multiplier", "sampling_rate"}) {
    EXPECT_TRUE(manifest[key].is_number_float()) << key;
  }
  EXPECT_EQ(manifest["rho"].get<double>(), 1.0);
  EXPECT_EQ(manifest["epsilon_spent"].get<double>(), m.epsilon_spent);
  EXPECT_EQ(manifest["delta"].get<double>(), m.delta);
  EXPECT_EQ(manifest["noise_multiplier"].get<double>(), m.noise_multiplier);
  EXPECT_EQ(manifest["sampling_rate"].get<double>(), m.sampling_rate);
  EXPECT_EQ(manifest["accountant"], "rdp");
  EXPECT_EQ(manifest["schedule"], "fixed");
  EXPECT_EQ(manifest["conversion"], "rdp_improved");
  EXPECT_EQ(manifest["clip_bounds"], nlohmann::json::parse(R"({"topic_word": 50.0})"));
  EXPECT_TRUE(manifest["clip_bounds"]["topic_word"].is_number_float());
  EXPECT_EQ(manifest["dimensions"], nlohmann::json::parse(R"({"K": 2, "V": 3, "N": 500})"));
  EXPECT_EQ(manifest["vocabulary_fingerprint"], kHexA);
  EXPECT_EQ(manifest["config_fingerprint"], kHexB);
  EXPECT_EQ(manifest["is_private"], true);
  EXPECT_EQ(manifest["noise_description"], m.noise_description);
  EXPECT_EQ(manifest["created_at_utc"], m.created_at_utc);

  ASSERT_EQ(manifest["arrays"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& entry = manifest["arrays"][i];
    std::set<std::string> entry_keys;
    for (const auto& item : entry.items()) entry_keys.insert(item.key());
    EXPECT_EQ(entry_keys,
              (std::set<std::string>{"name", "shape", "dtype", "file", "bytes", "blake2b"}));
    EXPECT_EQ(entry["name"], release.arrays[i].name);
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), release.arrays[i].shape);
    EXPECT_EQ(entry["dtype"], "<f8");
    EXPECT_EQ(entry["file"], release.arrays[i].name + ".npy");
    EXPECT_EQ(entry["bytes"], npy[i].size());
    EXPECT_EQ(entry["blake2b"], Blake2bHex(npy[i]));
  }
}

TEST(ManifestJsonTest, NumbersParseBackToTheSameDouble) {
  Release release = ValidRelease();
  release.metadata.epsilon_spent = 0.1 + 0.2;  // 0.30000000000000004
  release.metadata.delta = 1e-300;
  release.metadata.rho = std::nextafter(1.0, 0.0);
  release.metadata.clip_bounds = {{"topic_word", DBL_MAX}};
  auto text = ManifestJson(release, std::vector<std::string>{EncodeNpy(release.arrays[0])});
  ASSERT_TRUE(text.ok());
  const nlohmann::json manifest = nlohmann::json::parse(*text);
  EXPECT_EQ(manifest["epsilon_spent"].get<double>(), 0.1 + 0.2);
  EXPECT_EQ(manifest["delta"].get<double>(), 1e-300);
  EXPECT_EQ(manifest["rho"].get<double>(), std::nextafter(1.0, 0.0));
  EXPECT_EQ(manifest["clip_bounds"]["topic_word"].get<double>(), DBL_MAX);
}

TEST(ManifestJsonTest, RefusesFilesThatAreNotTheArraysEncoding) {
  const Release release = ValidRelease();
  const std::string npy = EncodeNpy(release.arrays[0]);
  auto none = ManifestJson(release, std::vector<std::string>{});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("0 .npy files for 1 arrays"));
  ReleaseArray other = release.arrays[0];
  other.data[5] = 7.0;
  auto wrong = ManifestJson(release, std::vector<std::string>{EncodeNpy(other)});
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("not the encoding of array lambda"));
  Release invalid = release;
  invalid.metadata.release_id = "";
  EXPECT_EQ(ManifestJson(invalid, std::vector<std::string>{npy}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(EncodeReleaseTest, ArraysFirstManifestLastAndDeterministic) {
  Release release = ValidRelease();
  release.arrays.push_back({"extra", {2}, {-1.0, 1.0}});
  auto encoded = EncodeRelease(release);
  ASSERT_TRUE(encoded.ok()) << encoded.status().message();
  EXPECT_EQ(encoded->release_id, "run7-step-120");
  ASSERT_EQ(encoded->files.size(), 3u);
  EXPECT_EQ(encoded->files[0].name, "lambda.npy");
  EXPECT_EQ(encoded->files[0].bytes, EncodeNpy(release.arrays[0]));
  EXPECT_EQ(encoded->files[1].name, "extra.npy");
  EXPECT_EQ(encoded->files[1].bytes, EncodeNpy(release.arrays[1]));
  EXPECT_EQ(encoded->files[2].name, "manifest.json");
  auto manifest = ManifestJson(
      release, std::vector<std::string>{encoded->files[0].bytes, encoded->files[1].bytes});
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(encoded->files[2].bytes, *manifest);
  auto again = EncodeRelease(release);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->files[2].bytes, encoded->files[2].bytes);

  release.arrays[1].data[0] = std::numeric_limits<double>::quiet_NaN();
  auto invalid = EncodeRelease(release);
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.status().message(), HasSubstr("extra"));
}

// ---------------------------------------------------------------- chunking

std::string Concatenate(const std::vector<std::string>& chunks) {
  std::string out;
  for (const std::string& c : chunks) out += c;
  return out;
}

TEST(ChunkBytesTest, LdaSizedReleaseFitsKafkasDefaultMessageLimit) {
  // K × V = 50 × 8000 doubles: 3.2 MB, above Kafka's 1 MB default.
  ReleaseArray lambda{"lambda", {50, 8000}, std::vector<double>(400000)};
  for (size_t i = 0; i < lambda.data.size(); ++i) lambda.data[i] = 0.5 + static_cast<double>(i);
  const std::string npy = EncodeNpy(lambda);
  ASSERT_EQ(npy.size(), 128u + 3200000u);
  static_assert(kDefaultChunkBytes < 1000000);
  const std::vector<std::string> chunks = ChunkBytes(npy);
  ASSERT_EQ(chunks.size(), (npy.size() + kDefaultChunkBytes - 1) / kDefaultChunkBytes);
  EXPECT_EQ(chunks.size(), 4u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_LE(chunks[i].size(), kDefaultChunkBytes);
    if (i + 1 < chunks.size()) {
      EXPECT_EQ(chunks[i].size(), kDefaultChunkBytes);
    }
    EXPECT_FALSE(chunks[i].empty());
  }
  const std::string joined = Concatenate(chunks);
  EXPECT_EQ(joined, npy);
  auto decoded = DecodeNpy(joined, "lambda");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->data, lambda.data);
}

TEST(ChunkBytesTest, EdgeSizes) {
  const std::string ten = "0123456789";
  EXPECT_TRUE(ChunkBytes("", 4).empty());
  EXPECT_EQ(ChunkBytes(ten, 5), (std::vector<std::string>{"01234", "56789"}));
  EXPECT_EQ(ChunkBytes(ten, 4), (std::vector<std::string>{"0123", "4567", "89"}));
  EXPECT_EQ(ChunkBytes(ten, 10), (std::vector<std::string>{ten}));
  EXPECT_EQ(ChunkBytes(ten, 1000), (std::vector<std::string>{ten}));
  EXPECT_EQ(ChunkBytes(ten, 1).size(), 10u);
  EXPECT_EQ(ChunkBytes(ten, 0).size(), 10u);  // 0 is treated as 1
  EXPECT_EQ(Concatenate(ChunkBytes(ten, 3)), ten);
  const std::string binary("\0\x93\xff\n\0", 5);
  EXPECT_EQ(Concatenate(ChunkBytes(binary, 2)), binary);
}

}  // namespace
}  // namespace vipsd::release
