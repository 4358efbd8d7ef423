// ReleaseAssembler: the consumer side of docs/release_format.md "Chunking for
// Kafka". Feed it the messages of a release topic in partition order (key,
// headers, value); it buffers array chunks per (release id, file) and, when
// a release's manifest arrives, returns the complete release as a
// release::EncodedRelease — but only after verifying it against the
// manifest exactly as tools/decode_release.py does: format and schema
// version, release id, every array entry (name, file = <name>.npy, dtype
// '<f8', shape, bytes, blake2b), every file complete (all chunks 0..n-1
// present), of the manifest's byte count and BLAKE2b-256, and a strict .npy
// (release::DecodeNpy) of the manifest's shape with finite values. (The
// reference decoder also checks the type of every metadata field; the
// assembler checks only what it needs to vouch for the bytes: format,
// schema_version, release_id and the array entries.) Files without a manifest
// entry are a mismatch too. A release that fails any check is dropped whole
// (nothing of it is returned) with an error naming the release and the
// failed check.
//
// Messages of one release share a key and hence a partition, so their order
// is kept; releases in different partitions may interleave freely. A chunk
// that arrives twice (a producer retry) replaces the earlier copy; a chunk
// whose vipsd-chunks differs from the earlier chunks of its file restarts
// that file (a re-publication with other content; an error is reported). A
// release published twice (a retried PublishRelease) is returned twice:
// release_id is the idempotency key for whoever applies releases.
//
// Memory bound: at most max_buffered_bytes of chunk payload are buffered
// over all incomplete releases, and at most max_pending_releases incomplete
// releases are kept; when a new chunk would exceed either bound, the oldest
// incomplete release (by first chunk seen) is dropped whole with a
// RESOURCE_EXHAUSTED error, repeatedly, and a single release larger than the
// byte bound is dropped itself. Releases whose manifest never comes (a
// failed publication, or a consumer that started in the middle of one) stay
// buffered until evicted this way. While a release is verified its files
// exist once more (the concatenation), so the peak is max_buffered_bytes
// plus one release.
//
// Errors (in AddResult::errors; the assembler never logs): INVALID_ARGUMENT
// for a message that is not a well-formed release message (ignored, nothing
// dropped), DATA_LOSS for a release dropped because it is incomplete or does
// not match its manifest, RESOURCE_EXHAUSTED for an eviction. Every message
// names the release id and the file or check. Releases are public data, so
// the error may name them.
//
// Thread-safety: not thread-safe; one consumer thread feeds one assembler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "connectors/kafka/kafka_source.h"
#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::connectors {

struct ReleaseAssemblerOptions {
  size_t max_buffered_bytes = size_t{256} << 20;  // 256 MiB of chunk payload
  size_t max_pending_releases = 16;
};

struct AssemblerStats {
  int64_t releases_completed = 0;
  int64_t releases_dropped = 0;   // mismatch, incomplete or evicted
  int64_t messages_ignored = 0;   // not well-formed release messages
};

class ReleaseAssembler {
 public:
  struct AddResult {
    // Set when this message was a manifest that completed a verified release.
    std::optional<release::EncodedRelease> release;
    // Problems this message caused or revealed (see the file comment).
    std::vector<Status> errors;
  };

  explicit ReleaseAssembler(ReleaseAssemblerOptions options = {});

  AddResult Add(std::string_view key,
                std::span<const std::pair<std::string, std::string>> headers,
                std::string_view value);
  // A message from KafkaSource (an oversize one is ignored with an error).
  AddResult Add(const SourceMessage& message);

  size_t buffered_bytes() const { return buffered_bytes_; }
  size_t pending_releases() const { return pending_.size(); }
  const AssemblerStats& stats() const { return stats_; }

 private:
  struct FileChunks {
    size_t chunk_count = 0;
    std::map<size_t, std::string> chunks;  // chunk index → bytes
  };
  struct Pending {
    uint64_t sequence = 0;  // order of first appearance (for eviction)
    size_t bytes = 0;
    std::map<std::string, FileChunks> files;
  };

  AddResult AddChunk(const std::string& release_id, const std::string& file, size_t chunk,
                     size_t chunk_count, std::string_view value);
  AddResult Complete(const std::string& release_id, std::string_view manifest);
  // Concatenates the chunks of `file_name` into `content` if all of them
  // are there and they hold `expected_bytes`. Returns why the release is
  // dropped, or nothing.
  static std::optional<std::string> JoinChunks(const std::string& file_name,
                                               const FileChunks& chunks, uint64_t expected_bytes,
                                               std::string& content);
  void Drop(const std::string& release_id);
  void Evict(const std::string& keep, std::vector<Status>& errors);

  ReleaseAssemblerOptions options_;
  std::map<std::string, Pending> pending_;  // by release id
  uint64_t next_sequence_ = 0;
  size_t buffered_bytes_ = 0;
  AssemblerStats stats_;
};

}  // namespace vipsd::connectors
