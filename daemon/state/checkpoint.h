// Model checkpoints: the state a restarted daemon resumes from (docs/architecture.md;
// docs/style.md "Durability").
//
// One file, `<state directory>/checkpoint`, written after the ledger commit
// of a step: the model's CheckpointArrays() (for LDA, λ), the step t whose
// M-step they include, the model type and a fingerprint of the model's
// public shape (type, dimensions, vocabulary fingerprint) so that a
// checkpoint is never loaded into a differently shaped model. Format
// (docs/checkpoint_format.md): a text header, raw little-endian doubles,
// and a BLAKE2b-256 checksum line over everything before it. Written to
// `checkpoint.tmp`, fsynced, renamed over `checkpoint`, directory fsynced.
//
// Relation to the ledger: the ledger is the budget of record and is
// committed every step; the checkpoint may lag (checkpoint_every) or be
// missing after a crash. On restart the daemon restores the checkpoint and
// continues at the ledger's t: steps charged after the checkpoint are lost
// model progress, never lost budget. The checkpoint carries the ledger's
// run id and its step; the start-up check (daemon/startup.h) refuses a
// checkpoint of another run, of another model, or of a step the ledger does
// not cover.
//
// Failure: Load() returns nullopt when no checkpoint exists and DATA_LOSS
// (naming the file) for a corrupt or mismatching one; the daemon refuses to
// start rather than silently starting from scratch.
//
// Privacy: the arrays are post-processing of noisy releases (public).
//
// Thread-safety: a CheckpointStore is used from the step thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"

namespace vipsd::daemon {

struct Checkpoint {
  // The ledger's run id: a checkpoint is only restored next to the ledger of
  // the run that wrote it.
  std::string run_id;           // 32 lowercase hex
  int64_t step = 0;             // t of the last M-step included (0 = initial)
  std::string model_type;       // "lda" | "blr" | "sbn"
  std::string model_fingerprint;  // 64 lowercase hex
  std::vector<model::NamedArray> arrays;
};

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string directory);

  Status Save(const Checkpoint& checkpoint) const;
  StatusOr<std::optional<Checkpoint>> Load() const;

  const std::string& path() const { return path_; }

  static StatusOr<std::string> Encode(const Checkpoint& checkpoint);
  static StatusOr<Checkpoint> Decode(const std::string& bytes, const std::string& where);

 private:
  std::string directory_;
  std::string path_;
};

}  // namespace vipsd::daemon
