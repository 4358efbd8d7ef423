// The unit's home partition (core/privacy/mechanisms/privacy_unit.h) against
// librdkafka's own partitioners, the independent oracle: murmur2 against
// rd_kafka_msg_partitioner_murmur2 (the Java client's default), crc32
// against rd_kafka_msg_partitioner_consistent (librdkafka's default), for
// every partition count 1..64 and keys of every length 0..40 (each tail
// case of murmur2's 4-byte blocks) including bytes ≥ 0x80.
#include <librdkafka/rdkafka.h>

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/privacy/mechanisms/privacy_unit.h"

namespace vipsd::privacy {
namespace {

std::vector<std::string> Keys() {
  std::vector<std::string> keys = {"", "a", "user-1", "patient 42", "enwiki14742"};
  std::mt19937_64 rng(11);
  for (size_t length = 0; length <= 40; ++length) {
    for (int copy = 0; copy < 25; ++copy) {
      std::string key(length, '\0');
      for (char& c : key) c = static_cast<char>(rng() & 0xFF);
      keys.push_back(std::move(key));
    }
  }
  return keys;
}

TEST(UnitPartitionerTest, Murmur2IsTheJavaClientsPartitionerAsLibrdkafkaComputesIt) {
  for (const std::string& key : Keys()) {
    const uint32_t hash = UnitKeyHash(UnitPartitioner::kMurmur2, key);
    EXPECT_LE(hash, 0x7fffffffu);
    for (int32_t count = 1; count <= 64; ++count) {
      const int32_t expected = rd_kafka_msg_partitioner_murmur2(
          nullptr, key.data(), key.size(), count, nullptr, nullptr);
      ASSERT_EQ(UnitHomePartition(hash, count), expected)
          << "key of " << key.size() << " bytes, " << count << " partitions";
    }
  }
}

TEST(UnitPartitionerTest, Crc32IsLibrdkafkasDefaultConsistentPartitioner) {
  for (const std::string& key : Keys()) {
    if (key.empty()) continue;  // consistent: an empty key goes to a random partition
    const uint32_t hash = UnitKeyHash(UnitPartitioner::kCrc32, key);
    for (int32_t count = 1; count <= 64; ++count) {
      const int32_t expected = rd_kafka_msg_partitioner_consistent(
          nullptr, key.data(), key.size(), count, nullptr, nullptr);
      ASSERT_EQ(UnitHomePartition(hash, count), expected)
          << "key of " << key.size() << " bytes, " << count << " partitions";
    }
  }
  // The CRC-32 check value of "123456789".
  EXPECT_EQ(UnitKeyHash(UnitPartitioner::kCrc32, "123456789"), 0xCBF43926u);
}

TEST(UnitPartitionerTest, NoPartitionerHashesToZero) {
  EXPECT_EQ(UnitKeyHash(UnitPartitioner::kNone, "anything"), 0u);
}

}  // namespace
}  // namespace vipsd::privacy
