// The shared-work messages (daemon/io/work_exchange.h: plans and partials on
// the work topic, written by other vipsd processes) on arbitrary bytes: as
// given (the checksum must refuse nearly all of them) and re-signed behind
// a valid magic so that the field parser is reached. A decoded plan or
// partial encodes to bytes that decode to the same message again, and a
// plan that decodes keeps its invariants (partitions sorted by name, each
// window 0 <= low <= floor <= high), a partial its own (at least one
// partition, sorted by name, each once, no negative cut), a plan with a
// released sum no model beside it and a base before it, a release
// (WorkRelease) a released step at or after its plan's step with q and ρ in
// (0, 1] and a sum. The first byte picks plan, partial or release.
#include <limits>
#include <string>

#include "daemon/io/work_exchange.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

namespace {

void Plan(const std::string& bytes) {
  const auto plan = daemon::DecodeWorkPlan(bytes);
  if (!plan.ok()) return;
  for (size_t i = 0; i < plan->streams.size(); ++i) {
    const daemon::WorkStream& s = plan->streams[i];
    if (!(0 <= s.low && s.low <= s.floor && s.floor <= s.high)) {
      fuzz::Violated("a decoded plan has a window outside 0 <= low <= floor <= high");
    }
    if (i > 0 && !(plan->streams[i - 1].name < s.name)) {
      fuzz::Violated("a decoded plan's partitions are not sorted by name");
    }
  }
  // A released sum replaces the model and names the plan it follows.
  if (plan->has_delta() &&
      (!plan->model.empty() || plan->delta_base < 1 || plan->delta_base_offset < 0 ||
       plan->delta_step >= plan->step)) {
    fuzz::Violated("a decoded plan's released sum has a model beside it or no base before it");
  }
  if (!plan->delta_sum.empty() && plan->delta_release_offset != -1) {
    fuzz::Violated("a decoded plan carries its released sum and names a release too");
  }
  if (plan->delta_sum.empty() && plan->delta_release_offset >= 0 &&
      plan->delta_release_offset <= plan->delta_base_offset) {
    fuzz::Violated("a decoded plan names a release before its base plan");
  }
  if (!plan->has_delta() && (plan->delta_base != -1 || plan->delta_base_offset != -1)) {
    fuzz::Violated("a decoded plan names a base without a released sum");
  }
  const std::string encoded = daemon::EncodeWorkPlan(*plan);
  const auto again = daemon::DecodeWorkPlan(encoded);
  if (!again.ok()) fuzz::Violated("a decoded plan does not decode after re-encoding");
  if (daemon::EncodeWorkPlan(*again) != encoded) fuzz::Violated("plan encoding is not stable");
}

void Partial(const std::string& bytes) {
  const auto partial = daemon::DecodeWorkPartial(bytes);
  if (!partial.ok()) return;
  if (partial->streams.empty()) fuzz::Violated("a decoded partial names no partition");
  for (size_t i = 0; i < partial->streams.size(); ++i) {
    if (partial->streams[i].cut < 0) fuzz::Violated("a decoded partial names a negative cut");
    if (i > 0 && !(partial->streams[i - 1].name < partial->streams[i].name)) {
      fuzz::Violated("a decoded partial's partitions are not sorted by name, each once");
    }
  }
  const std::string encoded = daemon::EncodeWorkPartial(*partial);
  const auto again = daemon::DecodeWorkPartial(encoded);
  if (!again.ok()) fuzz::Violated("a decoded partial does not decode after re-encoding");
  if (daemon::EncodeWorkPartial(*again) != encoded) {
    fuzz::Violated("partial encoding is not stable");
  }
}

void Release(const std::string& bytes) {
  const auto release = daemon::DecodeWorkRelease(bytes);
  if (!release.ok()) return;
  const double q = release->delta_mechanism.sampling_rate;
  const double sigma = release->delta_mechanism.noise_multiplier;
  if (release->step < 1 || release->delta_step < release->step || release->delta_sum.empty() ||
      !(q > 0 && q <= 1) || !(sigma >= 0 && sigma < std::numeric_limits<double>::infinity()) ||
      !(release->delta_rho > 0 && release->delta_rho <= 1)) {
    fuzz::Violated("a decoded release has a step, q, sigma, rho or sum out of range");
  }
  const std::string encoded = daemon::EncodeWorkRelease(*release);
  const auto again = daemon::DecodeWorkRelease(encoded);
  if (!again.ok()) fuzz::Violated("a decoded release does not decode after re-encoding");
  if (daemon::EncodeWorkRelease(*again) != encoded) {
    fuzz::Violated("release encoding is not stable");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string input(fuzz::AsText(data + 1, size - 1));
  if (data[0] % 3 == 2) {
    Release(input);
    Release(fuzz::Blake2bSigned("VWL1" + input));
  } else if (data[0] & 1) {
    Partial(input);
    Partial(fuzz::Blake2bSigned("VWR3" + input));
  } else {
    Plan(input);
    Plan(fuzz::Blake2bSigned("VWP6" + input));
  }
  (void)daemon::WorkMessageKindOf(input);
  return 0;
}
