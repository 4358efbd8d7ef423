// The privacy unit's public limits (privacy.unit; docs/privacy_accounting.md
// §6d), in one place for the configuration, the step driver, the ledger and
// the release manifest: the cap on a unit's records per step, the form of a
// unit field's name, and the home partition of a unit when the work is
// shared (privacy.unit_partitioner).
//
// Home partition: with shared work (state.work_topic) the partitions are
// summed by different processes, so a unit whose records sit in two
// partitions would be clipped twice. A unit therefore counts only in its
// home partition, the one a Kafka producer's key partitioner sends its key
// to: UnitKeyHash(partitioner, key) mod P, P the topic's partition count in
// the step's plan. kMurmur2 is the Java client's default partitioner (and
// librdkafka's murmur2 / murmur2_random): murmur2(key) & 0x7fffffff;
// kCrc32 is librdkafka's default (consistent / consistent_random):
// CRC-32 (IEEE) of the key. Both match librdkafka's partitioner functions
// for every key and partition count (tests/connectors compare them).
//
// What is private: the key (a unit id) and its hash; the partitioner and
// the limits are configuration.
// Thread-safety: constants and pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace vipsd::privacy {

// privacy.max_records_per_unit is in [1, kMaxRecordsPerUnit].
inline constexpr int64_t kMaxRecordsPerUnit = 1000000;

// privacy.unit_field: 1-128 characters of A-Z a-z 0-9 _ . - (a JSON key;
// one word in the ledger's unit line).
inline bool IsUnitFieldName(std::string_view name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
  });
}

enum class UnitPartitioner { kNone, kMurmur2, kCrc32 };

// The key's partitioner hash (see above); 0 for kNone.
uint32_t UnitKeyHash(UnitPartitioner partitioner, std::string_view key);

// The partition a key with hash `hash` goes to among `partition_count` ≥ 1.
inline int32_t UnitHomePartition(uint32_t hash, int32_t partition_count) {
  return static_cast<int32_t>(hash % static_cast<uint32_t>(partition_count));
}

}  // namespace vipsd::privacy
