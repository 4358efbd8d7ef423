#include "core/privacy/mechanisms/privacy_unit.h"

#include <array>

namespace vipsd::privacy {
namespace {

// Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2; seed
// 0x9747b28c), on the key's bytes.
uint32_t Murmur2(std::string_view key) {
  constexpr uint32_t kM = 0x5bd1e995;
  constexpr int kR = 24;
  const auto* data = reinterpret_cast<const unsigned char*>(key.data());
  const auto length = static_cast<uint32_t>(key.size());
  uint32_t h = 0x9747b28cu ^ length;
  const uint32_t blocks = length / 4;
  for (uint32_t i = 0; i < blocks; ++i) {
    const unsigned char* b = data + 4 * i;
    uint32_t k = static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
                 (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
    k *= kM;
    k ^= k >> kR;
    k *= kM;
    h *= kM;
    h ^= k;
  }
  const unsigned char* tail = data + 4 * blocks;
  switch (length % 4) {
    case 3:
      h ^= static_cast<uint32_t>(tail[2]) << 16;
      [[fallthrough]];
    case 2:
      h ^= static_cast<uint32_t>(tail[1]) << 8;
      [[fallthrough]];
    case 1:
      h ^= static_cast<uint32_t>(tail[0]);
      h *= kM;
      break;
    default:
      break;
  }
  h ^= h >> 13;
  h *= kM;
  h ^= h >> 15;
  return h;
}

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's crc32).
constexpr std::array<uint32_t, 256> Crc32Table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t Crc32(std::string_view key) {
  static constexpr std::array<uint32_t, 256> kTable = Crc32Table();
  uint32_t c = 0xFFFFFFFFu;
  for (const char ch : key) c = kTable[(c ^ static_cast<unsigned char>(ch)) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace

uint32_t UnitKeyHash(UnitPartitioner partitioner, std::string_view key) {
  switch (partitioner) {
    case UnitPartitioner::kMurmur2:
      return Murmur2(key) & 0x7fffffffu;
    case UnitPartitioner::kCrc32:
      return Crc32(key);
    case UnitPartitioner::kNone:
      break;
  }
  return 0;
}

}  // namespace vipsd::privacy
