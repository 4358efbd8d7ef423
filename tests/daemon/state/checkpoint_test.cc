#include "daemon/state/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>
#include <vector>

#include "core/release/release.h"

namespace vipsd::daemon {
namespace {

Checkpoint Sample() {
  Checkpoint checkpoint;
  checkpoint.run_id = "00112233445566778899aabbccddeeff";
  checkpoint.step = 12;
  checkpoint.model_type = "lda";
  checkpoint.model_fingerprint = std::string(64, 'a');
  checkpoint.arrays.push_back({"lambda", {2, 3}, {0.5, 1e-300, 3.25, -0.0, 1e300, 7}});
  checkpoint.arrays.push_back({"extra", {1}, {42}});
  checkpoint.arrays.push_back({"scalar", {}, {2.5}});
  return checkpoint;
}

std::string FreshDirectory(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "checkpoint_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(CheckpointTest, SaveLoadIsBitExact) {
  CheckpointStore store(FreshDirectory("roundtrip"));
  auto empty = store.Load();
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->has_value());
  const Checkpoint checkpoint = Sample();
  ASSERT_TRUE(store.Save(checkpoint).ok());
  EXPECT_FALSE(std::filesystem::exists(store.path() + ".tmp"));
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->has_value());
  const Checkpoint& back = **loaded;
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.run_id, checkpoint.run_id);
  EXPECT_EQ(back.model_type, "lda");
  EXPECT_EQ(back.model_fingerprint, checkpoint.model_fingerprint);
  ASSERT_EQ(back.arrays.size(), 3u);
  EXPECT_TRUE(back.arrays[2].shape.empty());
  EXPECT_EQ(back.arrays[2].data, std::vector<double>{2.5});
  EXPECT_EQ(back.arrays[0].name, "lambda");
  EXPECT_EQ(back.arrays[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back.arrays[0].data, checkpoint.arrays[0].data);
  EXPECT_TRUE(std::signbit(back.arrays[0].data[3]));
  EXPECT_EQ(back.arrays[1].data, std::vector<double>{42});
  // Overwriting keeps exactly one checkpoint.
  Checkpoint later = checkpoint;
  later.step = 13;
  ASSERT_TRUE(store.Save(later).ok());
  EXPECT_EQ((*store.Load())->step, 13);
}

TEST(CheckpointTest, EveryCorruptionIsDataLoss) {
  auto bytes = CheckpointStore::Encode(Sample());
  ASSERT_TRUE(bytes.ok());
  for (size_t position = 0; position < bytes->size(); position += 5) {
    std::string corrupt = *bytes;
    corrupt[position] = static_cast<char>(corrupt[position] ^ 0x10);
    auto decoded = CheckpointStore::Decode(corrupt, "checkpoint");
    ASSERT_FALSE(decoded.ok()) << "flip at " << position;
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  }
  for (size_t length : {size_t{0}, size_t{10}, bytes->size() / 2, bytes->size() - 1}) {
    auto decoded = CheckpointStore::Decode(bytes->substr(0, length), "checkpoint");
    ASSERT_FALSE(decoded.ok()) << "truncated to " << length;
    EXPECT_NE(decoded.status().message().find("refusing to start from a fresh model"),
              std::string::npos);
  }
}

// Behind a valid checksum (so that the parser is reached): what the encoder
// refuses, the decoder refuses too. Found by fuzz/fuzz_state.
TEST(CheckpointTest, ResignedCheckpointsWithBadContentAreRefused) {
  auto bytes = CheckpointStore::Encode(Sample());
  ASSERT_TRUE(bytes.ok());
  const std::string body = bytes->substr(0, bytes->rfind("\nblake2b "));
  auto resign = [](const std::string& b) {
    return b + "\nblake2b " + release::Blake2bHex(b) + "\n";
  };
  ASSERT_TRUE(CheckpointStore::Decode(resign(body), "checkpoint").ok());
  // A NaN in the data section (the first double of lambda).
  std::string nan = body;
  const size_t data = nan.find("\ndata\n") + 6;
  const double not_a_number = std::numeric_limits<double>::quiet_NaN();
  std::memcpy(nan.data() + data, &not_a_number, sizeof(double));
  auto refused = CheckpointStore::Decode(resign(nan), "checkpoint");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("non-finite"), std::string::npos);
  // Eight dimensions of 2^32: the element count wraps to 0, and with the
  // array's one double removed the rest of the file is consistent — only the
  // overflow check refuses it.
  std::string huge = body;
  const std::string shape = "array extra 1 1";
  huge.replace(huge.find(shape), shape.size(),
               "array extra 8 4294967296 4294967296 4294967296 4294967296 4294967296 "
               "4294967296 4294967296 4294967296");
  huge.erase(huge.find("\ndata\n") + 6 + 6 * sizeof(double), sizeof(double));
  refused = CheckpointStore::Decode(resign(huge), "checkpoint");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("too large"), std::string::npos)
      << refused.status().message();
  // A model type or fingerprint the encoder would never write.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"model lda", "model LDA!"}, {std::string(64, 'a'), std::string(64, 'Z')}}) {
    std::string changed = body;
    changed.replace(changed.find(from), from.size(), to);
    EXPECT_FALSE(CheckpointStore::Decode(resign(changed), "checkpoint").ok()) << to;
  }
}

TEST(CheckpointTest, RefusesToEncodeInvalidState) {
  Checkpoint checkpoint = Sample();
  checkpoint.arrays[0].data[1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(CheckpointStore::Encode(checkpoint).ok());
  checkpoint = Sample();
  checkpoint.arrays[0].shape = {4, 3};
  EXPECT_FALSE(CheckpointStore::Encode(checkpoint).ok());
  checkpoint = Sample();
  checkpoint.model_fingerprint = "short";
  EXPECT_FALSE(CheckpointStore::Encode(checkpoint).ok());
  checkpoint = Sample();
  checkpoint.run_id = "not-a-run-id";
  EXPECT_FALSE(CheckpointStore::Encode(checkpoint).ok());
  checkpoint = Sample();
  checkpoint.step = (int64_t{1} << 53) + 1;
  EXPECT_FALSE(CheckpointStore::Encode(checkpoint).ok());
}

TEST(CheckpointTest, VersionOneCheckpointsAreRefusedWithTheReason) {
  // Version 1 carried no run id, so it could not be tied to its ledger.
  auto bytes = CheckpointStore::Encode(Sample());
  ASSERT_TRUE(bytes.ok());
  std::string v1 = *bytes;
  v1.replace(0, std::string("vipsd-checkpoint 2").size(), "vipsd-checkpoint 1");
  auto decoded = CheckpointStore::Decode(v1, "/state/checkpoint");
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(decoded.status().message().find("/state/checkpoint: written by an older vipsd"),
            std::string::npos);
}

}  // namespace
}  // namespace vipsd::daemon
