#include "daemon/step/slot_step.h"

#include "daemon/state/checkpoint.h"

namespace vipsd::daemon {

StatusOr<std::string> EncodePlanModel(const StepParts& parts, int64_t model_step) {
  Checkpoint model;
  model.run_id = parts.keeper->state().run_id;
  model.step = model_step;
  model.model_type = parts.bundle->model->type();
  model.model_fingerprint = parts.bundle->model_fingerprint;
  model.arrays = parts.bundle->model->CheckpointArrays();
  return CheckpointStore::Encode(model);
}

}  // namespace vipsd::daemon
