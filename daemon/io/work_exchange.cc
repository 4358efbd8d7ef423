#include "daemon/io/work_exchange.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "daemon/state/ledger.h"

namespace vipsd::daemon {
namespace {

constexpr char kPlanMagic[4] = {'V', 'W', 'P', '7'};
// Plans of earlier vipsd versions (refused by name): VWP1 without the record
// settings, VWP2 with cuts at the observed log ends (no timestamp cut rule),
// VWP3 with one partial per partition, VWP4 with the model in every plan,
// VWP5 with the released sum always inside the plan, VWP6 (and releases
// VWL1) without the released sum's σ, which the noise-aware M-step reads.
constexpr char kPlanMagicV1[4] = {'V', 'W', 'P', '1'};
constexpr char kPlanMagicV2[4] = {'V', 'W', 'P', '2'};
constexpr char kPlanMagicV3[4] = {'V', 'W', 'P', '3'};
constexpr char kPlanMagicV4[4] = {'V', 'W', 'P', '4'};
constexpr char kPlanMagicV5[4] = {'V', 'W', 'P', '5'};
constexpr char kPlanMagicV6[4] = {'V', 'W', 'P', '6'};
constexpr char kReleaseMagicV1[4] = {'V', 'W', 'L', '1'};
constexpr char kPartialMagic[4] = {'V', 'W', 'R', '3'};
constexpr char kPartialMagicV1[4] = {'V', 'W', 'R', '1'};
constexpr char kPartialMagicV2[4] = {'V', 'W', 'R', '2'};
constexpr char kFederatedPlanMagicV1[4] = {'V', 'F', 'P', '1'};
constexpr char kFederatedPlanMagicV2[4] = {'V', 'F', 'P', '2'};
constexpr char kFederatedPlanMagic[4] = {'V', 'F', 'P', '3'};
constexpr char kFederatedShareMagicV1[4] = {'V', 'F', 'S', '1'};
constexpr char kFederatedShareMagicV2[4] = {'V', 'F', 'S', '2'};
constexpr char kFederatedShareMagic[4] = {'V', 'F', 'S', '3'};
constexpr char kFederatedRefusalMagic[4] = {'V', 'F', 'R', '1'};
constexpr char kReleaseMagic[4] = {'V', 'W', 'L', '2'};
constexpr size_t kDigestBytes = 32;
// At most this many coordinates in a share (2^31 words: 16 GiB).
constexpr uint64_t kMaxShareWords = uint64_t{1} << 31;
// Strings and lists beyond these are refused before anything is allocated.
constexpr uint64_t kMaxString = uint64_t{1} << 32;
constexpr uint64_t kMaxStreams = uint64_t{1} << 20;

class Writer {
 public:
  explicit Writer(const char (&magic)[4]) { out_.append(magic, 4); }
  void U64(uint64_t v) {
    for (int b = 0; b < 8; ++b) out_.push_back(static_cast<char>(v >> (8 * b)));
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void F64(double d) {
    uint64_t v;
    std::memcpy(&v, &d, sizeof v);
    U64(v);
  }
  void Str(std::string_view s) {
    U64(s.size());
    out_.append(s);
  }
  std::string Finish() {
    unsigned char digest[kDigestBytes];
    crypto_generichash(digest, kDigestBytes, reinterpret_cast<const unsigned char*>(out_.data()),
                       out_.size(), nullptr, 0);
    out_.append(reinterpret_cast<const char*>(digest), kDigestBytes);
    return std::move(out_);
  }

 private:
  std::string out_;
};

class Reader {
 public:
  // Checks the magic and the checksum; the fields are read in between.
  Reader(std::string_view bytes, const char (&magic)[4], const char* what) : what_(what) {
    if (bytes.size() < 4 + kDigestBytes || std::memcmp(bytes.data(), magic, 4) != 0) {
      ok_ = false;
      return;
    }
    unsigned char digest[kDigestBytes];
    const size_t body = bytes.size() - kDigestBytes;
    crypto_generichash(digest, kDigestBytes, reinterpret_cast<const unsigned char*>(bytes.data()),
                       body, nullptr, 0);
    if (std::memcmp(digest, bytes.data() + body, kDigestBytes) != 0) {
      ok_ = false;
      return;
    }
    bytes_ = bytes.substr(4, body - 4);
  }
  bool U64(uint64_t* v) {
    if (!ok_ || bytes_.size() - pos_ < 8) return ok_ = false;
    *v = 0;
    for (int b = 0; b < 8; ++b) {
      *v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[pos_ + b])) << (8 * b);
    }
    pos_ += 8;
    return true;
  }
  bool I64(int64_t* v) {
    uint64_t u = 0;
    if (!U64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool F64(double* d) {
    uint64_t u = 0;
    if (!U64(&u)) return false;
    std::memcpy(d, &u, sizeof u);
    return true;
  }
  bool Str(std::string* s) {
    uint64_t n = 0;
    if (!U64(&n)) return false;
    if (n > kMaxString || bytes_.size() - pos_ < n) return ok_ = false;
    s->assign(bytes_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  Status Done() const {
    if (!ok_ || pos_ != bytes_.size()) {
      return DataLossError(std::string("work topic: a malformed ") + what_ +
                           " (bad magic, checksum, or field)");
    }
    return Status::Ok();
  }
  bool ok() const { return ok_; }
  // Bytes not read yet: a count of fields is refused before anything is
  // allocated when they could not hold that many.
  size_t remaining() const { return ok_ ? bytes_.size() - pos_ : 0; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  bool ok_ = true;
  const char* what_;
};

void PutHeader(Writer& w, const std::string& job, uint64_t epoch, const std::string& owner,
               int64_t step, int64_t slot) {
  w.Str(job);
  w.U64(epoch);
  w.Str(owner);
  w.I64(step);
  w.I64(slot);
}

bool GetHeader(Reader& r, std::string* job, uint64_t* epoch, std::string* owner, int64_t* step,
               int64_t* slot) {
  return r.Str(job) && r.U64(epoch) && r.Str(owner) && r.I64(step) && r.I64(slot);
}

}  // namespace

std::string EncodeWorkPlan(const WorkPlan& plan) {
  Writer w(kPlanMagic);
  PutHeader(w, plan.job, plan.epoch, plan.owner, plan.step, plan.slot);
  w.F64(plan.sampling_rate);
  w.U64(plan.is_private ? 1 : 0);
  w.Str(std::string_view(reinterpret_cast<const char*>(plan.key.bytes.data()), plan.key.bytes.size()));
  w.I64(plan.cut_time_ms);
  w.U64(plan.streams.size());
  for (const WorkStream& s : plan.streams) {
    w.Str(s.name);
    w.I64(s.low);
    w.I64(s.floor);
    w.I64(s.high);
  }
  w.U64(plan.wanted.size());
  for (const std::string& s : plan.wanted) w.Str(s);
  w.Str(plan.model);
  w.Str(plan.delta_sum);
  w.I64(plan.delta_base);
  w.I64(plan.delta_base_offset);
  w.I64(plan.delta_step);
  w.F64(plan.delta_mechanism.sampling_rate);
  w.F64(plan.delta_rho);
  w.F64(plan.delta_mechanism.noise_multiplier);
  w.I64(plan.plan_offset);
  w.Str(plan.record_settings);
  w.I64(plan.partials_read);
  w.I64(plan.delta_release_offset);
  return w.Finish();
}

std::string EncodeWorkPartial(const WorkPartial& partial) {
  Writer w(kPartialMagic);
  PutHeader(w, partial.job, partial.epoch, partial.owner, partial.step, partial.slot);
  w.U64(partial.streams.size());
  for (const PartialStream& stream : partial.streams) {
    w.Str(stream.name);
    w.I64(stream.cut);
  }
  w.U64(partial.overflow ? 1 : 0);
  w.Str(partial.sum);
  w.Str(partial.instance);
  return w.Finish();
}

std::string EncodeWorkRelease(const WorkRelease& release) {
  Writer w(kReleaseMagic);
  PutHeader(w, release.job, release.epoch, release.owner, release.step, release.slot);
  w.I64(release.delta_step);
  w.F64(release.delta_mechanism.sampling_rate);
  w.F64(release.delta_rho);
  w.F64(release.delta_mechanism.noise_multiplier);
  w.Str(release.delta_sum);
  return w.Finish();
}

StatusOr<WorkMessageKind> WorkMessageKindOf(std::string_view bytes) {
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPlanMagic, 4) == 0) {
    return WorkMessageKind::kPlan;
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPartialMagic, 4) == 0) {
    return WorkMessageKind::kPartial;
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kFederatedPlanMagic, 4) == 0) {
    return WorkMessageKind::kFederatedPlan;
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kFederatedShareMagic, 4) == 0) {
    return WorkMessageKind::kFederatedShare;
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kReleaseMagic, 4) == 0) {
    return WorkMessageKind::kRelease;
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kFederatedRefusalMagic, 4) == 0) {
    return WorkMessageKind::kFederatedRefusal;
  }
  if (bytes.size() >= 4 && (std::memcmp(bytes.data(), kFederatedPlanMagicV2, 4) == 0 ||
                            std::memcmp(bytes.data(), kFederatedShareMagicV2, 4) == 0)) {
    return FailedPreconditionError(
        "work topic: a federated message of an older vipsd (VFP2/VFS2, shares sent when ready "
        "and joins without their terms): every process of a federation must run one vipsd "
        "version");
  }
  if (bytes.size() >= 4 && (std::memcmp(bytes.data(), kFederatedPlanMagicV1, 4) == 0 ||
                            std::memcmp(bytes.data(), kFederatedShareMagicV1, 4) == 0)) {
    return FailedPreconditionError(
        "work topic: a federated message of an older vipsd (VFP1/VFS1, pads not bound to the "
        "aggregator's run and the holders' state directories): every process of a federation "
        "must run one vipsd version");
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPlanMagicV1, 4) == 0) {
    return FailedPreconditionError(
        "work topic: a plan of an older vipsd (VWP1, without the record settings): every "
        "process of a job must run one vipsd version");
  }
  if (bytes.size() >= 4 && (std::memcmp(bytes.data(), kPlanMagicV2, 4) == 0 ||
                            std::memcmp(bytes.data(), kPartialMagicV1, 4) == 0)) {
    return FailedPreconditionError(
        "work topic: a message of an older vipsd (VWP2/VWR1, cuts at observed log ends "
        "rather than by record timestamps): every process of a job must run one vipsd "
        "version");
  }
  if (bytes.size() >= 4 && (std::memcmp(bytes.data(), kPlanMagicV3, 4) == 0 ||
                            std::memcmp(bytes.data(), kPartialMagicV2, 4) == 0)) {
    return FailedPreconditionError(
        "work topic: a message of an older vipsd (VWP3/VWR2, one partial sum per "
        "partition): every process of a job must run one vipsd version");
  }
  if (bytes.size() >= 4 && (std::memcmp(bytes.data(), kPlanMagicV6, 4) == 0 ||
                            std::memcmp(bytes.data(), kReleaseMagicV1, 4) == 0)) {
    return FailedPreconditionError(
        "work topic: a message of an older vipsd (VWP6/VWL1, without the released sum's "
        "noise multiplier): every process of a job must run one vipsd version");
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPlanMagicV5, 4) == 0) {
    return FailedPreconditionError(
        "work topic: a plan of an older vipsd (VWP5, the released sum always inside the "
        "plan): every process of a job must run one vipsd version");
  }
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPlanMagicV4, 4) == 0) {
    return FailedPreconditionError(
        "work topic: a plan of an older vipsd (VWP4, the whole model in every plan): every "
        "process of a job must run one vipsd version");
  }
  return DataLossError("work topic: a message that is neither a plan nor a partial sum");
}

StatusOr<WorkPlan> DecodeWorkPlan(std::string_view bytes) {
  Reader r(bytes, kPlanMagic, "plan");
  WorkPlan plan;
  uint64_t is_private = 0, count = 0;
  std::string key;
  if (GetHeader(r, &plan.job, &plan.epoch, &plan.owner, &plan.step, &plan.slot) &&
      r.F64(&plan.sampling_rate) && r.U64(&is_private) && r.Str(&key) &&
      r.I64(&plan.cut_time_ms) && r.U64(&count)) {
    // A stream is at least its name's length and three offsets (32 bytes).
    if (count > kMaxStreams || count > r.remaining() / 32) {
      return DataLossError("work topic: a plan with too many partitions");
    }
    plan.streams.resize(count);
    for (WorkStream& s : plan.streams) {
      if (!(r.Str(&s.name) && r.I64(&s.low) && r.I64(&s.floor) && r.I64(&s.high))) break;
    }
    // A wanted name is at least its length (8 bytes).
    if (r.U64(&count) && count <= kMaxStreams && count <= r.remaining() / 8) {
      plan.wanted.resize(count);
      for (std::string& s : plan.wanted) {
        if (!r.Str(&s)) break;
      }
      (void)(r.Str(&plan.model) && r.Str(&plan.delta_sum) && r.I64(&plan.delta_base) &&
             r.I64(&plan.delta_base_offset) && r.I64(&plan.delta_step) &&
             r.F64(&plan.delta_mechanism.sampling_rate) && r.F64(&plan.delta_rho) &&
             r.F64(&plan.delta_mechanism.noise_multiplier) && r.I64(&plan.plan_offset) &&
             r.Str(&plan.record_settings) &&
             r.I64(&plan.partials_read) && r.I64(&plan.delta_release_offset));
    }
  }
  VIPSD_RETURN_IF_ERROR(r.Done());
  bool valid = key.size() == plan.key.bytes.size() && is_private <= 1 && plan.step >= 1 &&
               plan.slot >= 0 && std::isfinite(plan.sampling_rate) && plan.sampling_rate > 0 &&
               plan.sampling_rate <= 1 && plan.partials_read >= 0;
  if (!plan.has_delta()) {
    valid = valid && plan.delta_base == -1 && plan.delta_base_offset == -1 &&
            plan.delta_release_offset == -1;
  } else {
    // A delta replaces the model of a full plan: from an earlier plan's
    // model through the M-step of a step in between, with q and ρ in (0, 1];
    // the sum inline or in a release appended after that plan, never both.
    valid = valid && plan.model.empty() && plan.plan_offset == -1 && plan.delta_base >= 1 &&
            plan.delta_base_offset >= 0 && plan.delta_base <= plan.delta_step &&
            plan.delta_step < plan.step &&
            privacy::ValidateSampledGaussian(plan.delta_mechanism, /*require_noise=*/false).ok() &&
            std::isfinite(plan.delta_rho) && plan.delta_rho > 0 && plan.delta_rho <= 1 &&
            (plan.delta_sum.empty() ? plan.delta_release_offset > plan.delta_base_offset
                                    : plan.delta_release_offset == -1);
  }
  for (size_t i = 0; valid && i < plan.streams.size(); ++i) {
    const WorkStream& s = plan.streams[i];
    valid = s.low >= 0 && s.low <= s.floor && s.floor <= s.high &&
            (i == 0 || plan.streams[i - 1].name < s.name);
  }
  if (!valid) return DataLossError("work topic: a plan with out-of-range fields");
  std::memcpy(plan.key.bytes.data(), key.data(), key.size());
  plan.is_private = is_private == 1;
  return plan;
}

StatusOr<WorkPartial> DecodeWorkPartial(std::string_view bytes) {
  Reader r(bytes, kPartialMagic, "partial sum");
  WorkPartial partial;
  uint64_t overflow = 0, count = 0;
  if (GetHeader(r, &partial.job, &partial.epoch, &partial.owner, &partial.step,
                &partial.slot) &&
      r.U64(&count)) {
    // A stream is at least its name's length and its cut (16 bytes).
    if (count > kMaxStreams || count > r.remaining() / 16) {
      return DataLossError("work topic: a partial sum naming too many partitions");
    }
    partial.streams.resize(count);
    bool read = true;
    for (PartialStream& stream : partial.streams) {
      if (!(read = r.Str(&stream.name) && r.I64(&stream.cut))) break;
    }
    (void)(read && r.U64(&overflow) && r.Str(&partial.sum) && r.Str(&partial.instance));
  }
  VIPSD_RETURN_IF_ERROR(r.Done());
  bool valid = overflow <= 1 && partial.step >= 1 && !partial.streams.empty();
  for (size_t i = 0; valid && i < partial.streams.size(); ++i) {
    valid = partial.streams[i].cut >= 0 &&
            (i == 0 || partial.streams[i - 1].name < partial.streams[i].name);
  }
  if (!valid) return DataLossError("work topic: a partial sum with out-of-range fields");
  partial.overflow = overflow == 1;
  return partial;
}

StatusOr<WorkRelease> DecodeWorkRelease(std::string_view bytes) {
  Reader r(bytes, kReleaseMagic, "release");
  WorkRelease release;
  (void)(GetHeader(r, &release.job, &release.epoch, &release.owner, &release.step,
                   &release.slot) &&
         r.I64(&release.delta_step) && r.F64(&release.delta_mechanism.sampling_rate) &&
         r.F64(&release.delta_rho) && r.F64(&release.delta_mechanism.noise_multiplier) &&
         r.Str(&release.delta_sum));
  VIPSD_RETURN_IF_ERROR(r.Done());
  // The plan of `step` ran the released step (delta_step ≥ step: a step
  // number is never reused), with q and ρ in (0, 1].
  const bool valid = release.step >= 1 && release.slot >= 0 &&
                     release.delta_step >= release.step && !release.delta_sum.empty() &&
                     privacy::ValidateSampledGaussian(release.delta_mechanism,
                                                      /*require_noise=*/false)
                         .ok() &&
                     std::isfinite(release.delta_rho) && release.delta_rho > 0 &&
                     release.delta_rho <= 1;
  if (!valid) return DataLossError("work topic: a release with out-of-range fields");
  return release;
}

namespace {

bool IsSortedUnique(const std::vector<std::string>& names) {
  for (size_t i = 1; i < names.size(); ++i) {
    if (!(names[i - 1] < names[i])) return false;
  }
  return true;
}

}  // namespace

std::string EncodeFederatedPlan(const FederatedPlan& plan) {
  Writer w(kFederatedPlanMagic);
  PutHeader(w, plan.job, plan.epoch, plan.owner, plan.step, plan.slot);
  w.F64(plan.mechanism.sampling_rate);
  w.F64(plan.mechanism.noise_multiplier);
  w.I64(plan.cut_time_ms);
  w.U64(plan.participants.size());
  for (const std::string& id : plan.participants) w.Str(id);
  for (const std::string& run : plan.incarnations) w.Str(run);
  w.U64(plan.tolerated);
  w.Str(plan.roster);
  w.Str(plan.run);
  w.Str(plan.model);
  w.Str(plan.terms);
  w.I64(plan.issued_ms);
  w.I64(plan.due_ms);
  return w.Finish();
}

StatusOr<FederatedPlan> DecodeFederatedPlan(std::string_view bytes) {
  Reader r(bytes, kFederatedPlanMagic, "federated plan");
  FederatedPlan plan;
  uint64_t count = 0, tolerated = 0;
  if (GetHeader(r, &plan.job, &plan.epoch, &plan.owner, &plan.step, &plan.slot) &&
      r.F64(&plan.mechanism.sampling_rate) && r.F64(&plan.mechanism.noise_multiplier) &&
      r.I64(&plan.cut_time_ms) && r.U64(&count)) {
    if (count > 4096 || count > r.remaining() / 8) {
      return DataLossError("work topic: a federated plan with too many participants");
    }
    plan.participants.resize(count);
    plan.incarnations.resize(count);
    bool read = true;
    for (std::string& id : plan.participants) {
      if (!(read = r.Str(&id))) break;
    }
    for (std::string& run : plan.incarnations) {
      if (!read || !(read = r.Str(&run))) break;
    }
    (void)(read && r.U64(&tolerated) && r.Str(&plan.roster) && r.Str(&plan.run) &&
           r.Str(&plan.model) && r.Str(&plan.terms) && r.I64(&plan.issued_ms) &&
           r.I64(&plan.due_ms));
  }
  VIPSD_RETURN_IF_ERROR(r.Done());
  const bool valid = plan.step >= 1 && plan.slot >= 0 &&
                     privacy::ValidateSampledGaussian(plan.mechanism, true).ok() &&  // σ > 0
                     !plan.participants.empty() && IsSortedUnique(plan.participants) &&
                     tolerated < plan.participants.size() && IsRunId(plan.run) &&
                     plan.issued_ms > 0 && plan.due_ms > plan.issued_ms &&
                     std::all_of(plan.incarnations.begin(), plan.incarnations.end(),
                                 [](const std::string& run) { return IsRunId(run); });
  if (!valid) return DataLossError("work topic: a federated plan with out-of-range fields");
  plan.tolerated = static_cast<uint32_t>(tolerated);
  return plan;
}

std::string EncodeFederatedShare(const FederatedShare& share) {
  Writer w(kFederatedShareMagic);
  w.Str(share.job);
  w.U64(share.epoch);
  w.I64(share.step);
  w.Str(share.holder);
  w.Str(share.incarnation);
  w.U64(static_cast<uint64_t>(share.kind));
  w.Str(share.reason);
  w.Str(share.terms);
  w.U64(share.noise_private ? 1 : 0);
  w.U64(share.masked.size());
  for (uint64_t word : share.masked) w.U64(word);
  return w.Finish();
}

StatusOr<FederatedShare> DecodeFederatedShare(std::string_view bytes) {
  Reader r(bytes, kFederatedShareMagic, "federated share");
  FederatedShare share;
  uint64_t kind = 0, noise_private = 0, count = 0;
  if (r.Str(&share.job) && r.U64(&share.epoch) && r.I64(&share.step) && r.Str(&share.holder) &&
      r.Str(&share.incarnation) && r.U64(&kind) && r.Str(&share.reason) && r.Str(&share.terms) &&
      r.U64(&noise_private) && r.U64(&count)) {
    if (count > kMaxShareWords || count > r.remaining() / 8) {
      return DataLossError("work topic: a federated share with too many coordinates");
    }
    share.masked.resize(count);
    for (uint64_t& word : share.masked) {
      if (!r.U64(&word)) break;
    }
  }
  VIPSD_RETURN_IF_ERROR(r.Done());
  const bool valid = share.step >= 1 && !share.holder.empty() && IsRunId(share.incarnation) &&
                     kind <= 3 &&
                     noise_private <= 1 && (kind == 0 || share.masked.empty());
  if (!valid) return DataLossError("work topic: a federated share with out-of-range fields");
  share.kind = static_cast<ShareKind>(kind);
  share.noise_private = noise_private == 1;
  return share;
}

std::string EncodeFederatedRefusal(const FederatedRefusal& refusal) {
  Writer w(kFederatedRefusalMagic);
  w.Str(refusal.job);
  w.U64(refusal.epoch);
  w.Str(refusal.owner);
  w.Str(refusal.holder);
  w.Str(refusal.incarnation);
  w.Str(refusal.reason);
  return w.Finish();
}

StatusOr<FederatedRefusal> DecodeFederatedRefusal(std::string_view bytes) {
  Reader r(bytes, kFederatedRefusalMagic, "federated refusal");
  FederatedRefusal refusal;
  (void)(r.Str(&refusal.job) && r.U64(&refusal.epoch) && r.Str(&refusal.owner) &&
         r.Str(&refusal.holder) && r.Str(&refusal.incarnation) && r.Str(&refusal.reason));
  VIPSD_RETURN_IF_ERROR(r.Done());
  if (refusal.holder.empty() || !IsRunId(refusal.incarnation)) {
    return DataLossError("work topic: a federated refusal with out-of-range fields");
  }
  return refusal;
}

}  // namespace vipsd::daemon
