#include "core/svi/step_driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/privacy_unit.h"

namespace vipsd::svi {
namespace {

// Records per accumulation chunk (see Step). Part of the result's
// definition: changing it changes the floating-point summation order.
constexpr size_t kChunkRecords = 64;

// Seconds since `since`, and moves `since` to now.
double Lap(std::chrono::steady_clock::time_point& since) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - since).count();
  since = now;
  return seconds;
}

// total += add, both sparse with strictly increasing indices; `scratch`
// is reused storage.
[[maybe_unused]] void AddSparseTo(const model::SparseStatistic& add, model::SparseStatistic& total,
                 model::SparseStatistic& scratch) {
  if (total.indices.empty()) {
    total.indices = add.indices;
    total.values = add.values;
    return;
  }
  scratch.Clear();
  size_t a = 0, t = 0;
  while (a < add.indices.size() || t < total.indices.size()) {
    if (t == total.indices.size() ||
        (a < add.indices.size() && add.indices[a] < total.indices[t])) {
      scratch.indices.push_back(add.indices[a]);
      scratch.values.push_back(add.values[a++]);
    } else if (a == add.indices.size() || total.indices[t] < add.indices[a]) {
      scratch.indices.push_back(total.indices[t]);
      scratch.values.push_back(total.values[t++]);
    } else {
      scratch.indices.push_back(total.indices[t]);
      scratch.values.push_back(total.values[t++] + add.values[a++]);
    }
  }
  std::swap(total, scratch);
}

struct UnitHash {
  size_t operator()(const std::array<uint8_t, 16>& digest) const {
    uint64_t h = 0;
    std::memcpy(&h, digest.data(), sizeof(h));
    return static_cast<size_t>(h);
  }
};

// Step 2's outcome for one stream: the records of its contributions and
// their E-step seeds. Record-level: each record is a contribution (`ends`
// empty). Unit-level: contribution j is records[ends[j-1], ends[j]).
struct Batch {
  std::vector<const model::Record*> records;
  std::vector<uint64_t> seeds;
  std::vector<uint32_t> ends;
  size_t contributions() const { return ends.empty() ? records.size() : ends.size(); }
};

// Unit-level step 2 (DriverConfig::max_records_per_unit). A stream with a
// home rule (StreamCandidates::partition_count > 0) offers only the records
// of units whose home partition it is. Every decision about unit u depends
// on the step key and u's own candidates only:
//   kept(u): UnitWord(key, d(u)) < ⌊q·2^64⌋;
//   chosen: u's candidates with the `cap` smallest (rank(s, o), s, o) —
//           rank = word(s, o, kUnitRankNonce), s in stream (name) order;
//   home: the chosen record with the smallest (s, o); the unit's
//         contribution is part of stream s's partial sum, in order of home
//         offsets, its records summed in (s, o) order.
// Adding or removing another unit's records changes none of these.
Status SampleUnits(const StepKey& key, const std::vector<StreamCandidates>& streams, double q,
                   int64_t cap, std::vector<Batch>& batches) {
  struct Member {
    uint32_t stream;
    uint32_t index;
    uint64_t rank;
  };
  std::unordered_map<std::array<uint8_t, 16>, std::vector<Member>, UnitHash> units;
  std::unordered_map<std::array<uint8_t, 16>, bool, UnitHash> kept;
  const uint64_t threshold = q >= 1.0 ? 0 : SampleThreshold(q);
  std::vector<std::array<uint8_t, 32>> stream_keys;
  stream_keys.reserve(streams.size());
  std::vector<int64_t> offsets;
  std::vector<uint32_t> indices;
  std::vector<uint64_t> words;
  for (size_t s = 0; s < streams.size(); ++s) {
    const StreamCandidates& stream = streams[s];
    stream_keys.push_back(DeriveStreamKey(key, stream.stream));
    offsets.clear();
    indices.clear();
    for (size_t i = 0; i < stream.records.size(); ++i) {
      // Shared work: a unit counts only in its home partition.
      if (stream.partition_count > 0 &&
          privacy::UnitHomePartition(stream.records[i]->unit_hash, stream.partition_count) !=
              stream.partition) {
        continue;
      }
      const auto& digest = stream.records[i]->unit;
      auto [it, fresh] = kept.try_emplace(digest, true);
      if (fresh && q < 1.0) it->second = UnitWord(key, digest) < threshold;
      if (!it->second) continue;
      offsets.push_back(stream.offsets[i]);
      indices.push_back(static_cast<uint32_t>(i));
    }
    VIPSD_RETURN_IF_ERROR(KeyedWords(stream_keys[s], kUnitRankNonce, offsets, words));
    for (size_t j = 0; j < indices.size(); ++j) {
      units[stream.records[indices[j]]->unit].push_back(
          {static_cast<uint32_t>(s), indices[j], words[j]});
    }
  }
  // Chosen records per stream (by index), and each unit's home.
  struct Contribution {
    uint32_t home_index;  // in its home stream
    std::vector<Member> members;
  };
  std::vector<std::vector<Contribution>> homed(streams.size());
  std::vector<std::vector<uint32_t>> chosen(streams.size());
  const auto by_position = [](const Member& a, const Member& b) {
    return a.stream != b.stream ? a.stream < b.stream : a.index < b.index;
  };
  for (auto& [digest, members] : units) {
    if (static_cast<int64_t>(members.size()) > cap) {
      std::nth_element(members.begin(), members.begin() + (cap - 1), members.end(),
                       [&](const Member& a, const Member& b) {
                         return a.rank != b.rank ? a.rank < b.rank : by_position(a, b);
                       });
      members.resize(static_cast<size_t>(cap));
    }
    std::sort(members.begin(), members.end(), by_position);
    for (const Member& m : members) chosen[m.stream].push_back(m.index);
    homed[members.front().stream].push_back({members.front().index, std::move(members)});
  }
  // E-step seeds of the chosen records: word(s, o, kEStepSeedNonce).
  std::vector<std::vector<uint64_t>> seed_of(streams.size());
  for (size_t s = 0; s < streams.size(); ++s) {
    std::sort(chosen[s].begin(), chosen[s].end());
    offsets.clear();
    for (uint32_t i : chosen[s]) offsets.push_back(streams[s].offsets[i]);
    VIPSD_RETURN_IF_ERROR(KeyedWords(stream_keys[s], kEStepSeedNonce, offsets, words));
    seed_of[s].assign(streams[s].records.size(), 0);
    for (size_t j = 0; j < chosen[s].size(); ++j) seed_of[s][chosen[s][j]] = words[j];
  }
  for (size_t s = 0; s < streams.size(); ++s) {
    std::sort(homed[s].begin(), homed[s].end(), [](const Contribution& a, const Contribution& b) {
      return a.home_index < b.home_index;
    });
    Batch& batch = batches[s];
    for (const Contribution& contribution : homed[s]) {
      for (const Member& m : contribution.members) {
        batch.records.push_back(streams[m.stream].records[m.index]);
        batch.seeds.push_back(seed_of[m.stream][m.index]);
      }
      batch.ends.push_back(static_cast<uint32_t>(batch.records.size()));
    }
  }
  return Status::Ok();
}

// Record-level step 2: record o of stream s is in the batch iff
// word(s, o, kSampleNonce) < ⌊q·2^64⌋ (every record at q = 1); its E-step
// seed is word(s, o, kEStepSeedNonce). Both depend on the step key and the
// record's own position only.
Status SampleRecords(const StepKey& key, const std::vector<StreamCandidates>& streams, double q,
                     std::vector<Batch>& batches) {
  const uint64_t threshold = q >= 1.0 ? 0 : SampleThreshold(q);
  std::vector<uint64_t> sample_words, seed_words;
  std::vector<int64_t> sampled_offsets;
  for (size_t s = 0; s < streams.size(); ++s) {
    const StreamCandidates& stream = streams[s];
    const auto stream_key = DeriveStreamKey(key, stream.stream);
    Batch& batch = batches[s];
    sampled_offsets.clear();
    if (q >= 1.0) {
      batch.records = stream.records;
      sampled_offsets = stream.offsets;
    } else {
      VIPSD_RETURN_IF_ERROR(KeyedWords(stream_key, kSampleNonce, stream.offsets, sample_words));
      for (size_t i = 0; i < stream.records.size(); ++i) {
        if (sample_words[i] < threshold) {
          batch.records.push_back(stream.records[i]);
          sampled_offsets.push_back(stream.offsets[i]);
        }
      }
    }
    VIPSD_RETURN_IF_ERROR(KeyedWords(stream_key, kEStepSeedNonce, sampled_offsets, seed_words));
    batch.seeds.swap(seed_words);
  }
  return Status::Ok();
}

// The E-step's work list (SumStreams, steps 3 + 4): every batch's
// contributions in chunks of kChunkRecords, streams in order; a stream with
// an empty batch has one empty chunk, so that its (zero) partial still
// reaches the sink.
struct Chunk {
  size_t stream;
  size_t begin, end;  // contributions of batches[stream]
  bool last_of_stream;
};
std::vector<Chunk> ChunksOf(const std::vector<Batch>& batches) {
  std::vector<Chunk> chunks;
  for (size_t s = 0; s < batches.size(); ++s) {
    const size_t n = batches[s].contributions();
    if (n == 0) {
      chunks.push_back({s, 0, 0, true});
      continue;
    }
    for (size_t begin = 0; begin < n; begin += kChunkRecords) {
      const size_t end = std::min(n, begin + kChunkRecords);
      chunks.push_back({s, begin, end, end == n});
    }
  }
  return chunks;
}

// Steps 3 + 4 for contributions [begin, end) of one batch: each one's
// statistic (a unit's: its records' statistics summed) is added to `sum`,
// which clips it to the block bounds.
struct ContributionScratch {
  model::SparseStatistic statistic, unit_sum, merged_sum;
};
void SumContributions(const model::Model& model, const Batch& batch, size_t begin, size_t end,
                      model::EStepScratch& scratch, ContributionScratch& work,
                      privacy::GaussianSumMechanism& sum) {
  model::SparseStatistic& statistic = work.statistic;
  for (size_t c = begin; c < end; ++c) {
    if (batch.ends.empty()) {
      model::RecordRng rng(batch.seeds[c]);
      statistic.Clear();
      // A record the model rejects (malformed) or whose statistic is not
      // finite is not summed; that is a PRIVATE fact and is not reported.
      if (model.EStep(*batch.records[c], rng, scratch, statistic).ok()) {
        (void)sum.AddSparse(statistic.indices, statistic.values);
      }
      continue;
    }
    // A unit: its records' statistics summed, the sum clipped once.
    work.unit_sum.Clear();
    for (size_t i = c == 0 ? 0 : batch.ends[c - 1]; i < batch.ends[c]; ++i) {
      model::RecordRng rng(batch.seeds[i]);
      statistic.Clear();
      if (model.EStep(*batch.records[i], rng, scratch, statistic).ok()) {
#ifdef VIPSD_AUDIT_BUILD_PER_RECORD_UNIT_CLIPPING
        // TEST-ONLY (tests/CMakeLists.txt, privacy_audit_per_record_unit_test):
        // each record clipped on its own, the violation the unit audit
        // must detect. Never in a vipsd build.
        (void)sum.AddSparse(statistic.indices, statistic.values);
#else
        AddSparseTo(statistic, work.unit_sum, work.merged_sum);
#endif
      }
    }
    (void)sum.AddSparse(work.unit_sum.indices, work.unit_sum.values);
  }
}

// Hands step `step`'s contributions to `observer` (StepDriver::set_sample_observer).
void ReportContributions(const SampleObserver& observer, int64_t step,
                         const std::vector<StreamCandidates>& streams,
                         const std::vector<Batch>& batches) {
  std::unordered_map<const model::Record*, std::pair<size_t, int64_t>> where;
  for (size_t s = 0; s < streams.size(); ++s) {
    for (size_t i = 0; i < streams[s].records.size(); ++i) {
      where.emplace(streams[s].records[i], std::make_pair(s, streams[s].offsets[i]));
    }
  }
  Contributions contributions;
  for (const Batch& batch : batches) {
    size_t begin = 0;
    for (size_t j = 0; j < batch.contributions(); ++j) {
      const size_t end = batch.ends.empty() ? j + 1 : batch.ends[j];
      auto& contribution = contributions.emplace_back();
      for (size_t r = begin; r < end; ++r) {
        const auto& [s, offset] = where.at(batch.records[r]);
        contribution.emplace_back(streams[s].stream, offset);
      }
      begin = end;
    }
  }
  observer(step, contributions);
}

}  // namespace

Status ValidateDriverConfig(const DriverConfig& c) {
  if (!(c.mechanism.sampling_rate > 0 && c.mechanism.sampling_rate <= 1)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1]");
  }
  if (!(c.mechanism.noise_multiplier >= 0) || !std::isfinite(c.mechanism.noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and >= 0 (0 = non-private)");
  }
  if (!(c.tau0 >= 0) || !std::isfinite(c.tau0)) {
    return InvalidArgumentError("tau0 must be finite and >= 0");
  }
  if (!(c.kappa > 0.5 && c.kappa <= 1)) return InvalidArgumentError("kappa must be in (0.5, 1]");
  if (c.threads < 1 || c.threads > 256) return InvalidArgumentError("threads must be in [1, 256]");
  if (c.max_records_per_unit < 0 || c.max_records_per_unit > privacy::kMaxRecordsPerUnit) {
    return InvalidArgumentError("max_records_per_unit must be in [0, 1000000] (0 = record-level)");
  }
  if (c.mechanism.noise_multiplier > 0) {
    if (!(c.delta > 0 && c.delta < 1)) return InvalidArgumentError("delta must be in (0, 1)");
    if (!(c.epsilon_ceiling > 0) || !std::isfinite(c.epsilon_ceiling)) {
      return InvalidArgumentError("epsilon_ceiling must be finite and > 0");
    }
  }
  return Status::Ok();
}

double StepSize(double tau0, double kappa, int64_t t) {
  return std::pow(tau0 + static_cast<double>(t), -kappa);
}

namespace {

// A bare accountant as the budget of record (offline tools, tests).
class AccountantBook final : public ChargeBook {
 public:
  explicit AccountantBook(privacy::RdpAccountant* accountant) : accountant_(accountant) {}
  const privacy::RdpAccountant& accountant() const override { return *accountant_; }
  Status Charge(const privacy::SampledGaussian& step) override {
    return accountant_->Compose(step, 1);
  }

 private:
  privacy::RdpAccountant* accountant_;
};

Status ValidateDriverInputs(model::Model* model, privacy::NoiseSource* noise, bool has_book,
                            const DriverConfig& config, int64_t next_step) {
  if (model == nullptr || noise == nullptr) {
    return InvalidArgumentError("step driver needs a model and a noise source");
  }
  VIPSD_RETURN_IF_ERROR(ValidateDriverConfig(config));
  if (next_step < 1) return InvalidArgumentError("the first step number must be >= 1");
  if (config.mechanism.noise_multiplier > 0) {
    if (!has_book) {
      return InvalidArgumentError("a private driver (noise_multiplier > 0) needs an accountant");
    }
    if (!model->has_proven_bounds()) {
      return InvalidArgumentError(
          "this model configuration has no proven statistic bound (e.g. LDA with "
          "resample_length 0) and can only run with noise_multiplier 0");
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<StepDriver>> StepDriver::Create(model::Model* model,
                                                         privacy::NoiseSource* noise,
                                                         privacy::RdpAccountant* accountant,
                                                         const DriverConfig& config,
                                                         int64_t next_step) {
  VIPSD_RETURN_IF_ERROR(
      ValidateDriverInputs(model, noise, accountant != nullptr, config, next_step));
  std::unique_ptr<ChargeBook> book;
  if (accountant != nullptr) book = std::make_unique<AccountantBook>(accountant);
  ChargeBook* const charged = book.get();
  return std::unique_ptr<StepDriver>(
      new StepDriver(model, noise, std::move(book), charged, config, next_step));
}

StatusOr<std::unique_ptr<StepDriver>> StepDriver::Create(model::Model* model,
                                                         privacy::NoiseSource* noise,
                                                         ChargeBook& book,
                                                         const DriverConfig& config,
                                                         int64_t next_step) {
  VIPSD_RETURN_IF_ERROR(ValidateDriverInputs(model, noise, true, config, next_step));
  return std::unique_ptr<StepDriver>(
      new StepDriver(model, noise, nullptr, &book, config, next_step));
}

StepDriver::StepDriver(model::Model* model, privacy::NoiseSource* noise,
                       std::unique_ptr<ChargeBook> owned_book, ChargeBook* book,
                       const DriverConfig& config, int64_t next_step)
    : model_(model),
      noise_(noise),
      owned_book_(std::move(owned_book)),
      book_(book),
      config_(config),
      next_step_(next_step) {}

Status StepDriver::Reconfigure(const DriverConfig& config) {
  VIPSD_RETURN_IF_ERROR(ValidateDriverConfig(config));
  if ((config.mechanism.noise_multiplier > 0) != (config_.mechanism.noise_multiplier > 0)) {
    return InvalidArgumentError(
        "noise_multiplier cannot switch between 0 (non-private) and > 0 on a running driver");
  }
  if (config.max_records_per_unit != config_.max_records_per_unit) {
    return InvalidArgumentError(
        "max_records_per_unit (the privacy unit's cap) cannot change on a running driver");
  }
  config_ = config;
  return Status::Ok();
}

StatusOr<StepResult> StepDriver::Step(std::span<const model::Record> pool) {
  std::vector<StreamCandidates> streams(1);
  streams[0].records.reserve(pool.size());
  streams[0].offsets.reserve(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) {
    streams[0].records.push_back(&pool[i]);
    streams[0].offsets.push_back(static_cast<int64_t>(i));
  }
  return Step(streams);
}

StatusOr<StepResult> StepDriver::Step(const std::vector<StreamCandidates>& streams) {
  // Stream order is part of the result's definition (summation order).
  for (size_t i = 1; i < streams.size(); ++i) {
    if (!(streams[i - 1].stream < streams[i].stream)) {
      return InvalidArgumentError("step candidates must be sorted by stream name, each name once ('" +
                                  streams[i - 1].stream + "' before '" + streams[i].stream + "')");
    }
  }
  VIPSD_ASSIGN_OR_RETURN(StepTicket ticket, Begin());
  if (ticket.result.outcome == StepResult::Outcome::kRefusedCeiling) return ticket.result;
  // With threads to spare, the noise is drawn beside the E-step; with one
  // thread the step stays on one core.
  if (config_.threads > 1) DrawNoiseAhead();
  StepPhaseSeconds phases = ticket.result.phase_seconds;
  const privacy::BlockLayout& layout = model_->statistic_layout();
  const privacy::SumKind kind = privacy::SumKindFor(config_.mechanism.noise_multiplier);
  if (total_ == nullptr || total_->kind() != kind) {
    total_ = std::make_unique<privacy::GaussianSumMechanism>(layout, kind);
  } else {
    total_->Reset();
  }
  const Status summed = SumStreams(
      ticket.key, streams,
      [this](size_t, privacy::GaussianSumMechanism& partial) {
        return total_->Merge(std::move(partial));
      },
      &phases);
  if (!summed.ok()) {
    Abandon(ticket);
    return summed;
  }
  StatusOr<StepResult> finished = Finish(ticket, *total_);
  if (!finished.ok()) {
    Abandon(ticket);
    return finished.status();
  }
  StepResult result = std::move(*finished);
  result.phase_seconds.charge = phases.charge;
  result.phase_seconds.sample = phases.sample;
  result.phase_seconds.estep = phases.estep;
  return result;
}

StatusOr<StepTicket> StepDriver::Begin() {
  const bool is_private = config_.mechanism.is_private();
  const privacy::SampledGaussian& step = config_.mechanism;
  StepTicket ticket;
  StepResult& result = ticket.result;
  result.step = next_step_;
  result.mechanism = step;
  auto clock = std::chrono::steady_clock::now();
  // 1. Ceiling check and charge, on public parameters only.
  if (is_private) {
    if (config_.enforce_ceiling) {
      VIPSD_ASSIGN_OR_RETURN(
          auto check, book_->accountant().CheckCeiling(
                          step, 1, {config_.epsilon_ceiling, config_.delta},
                          privacy::RdpConversion::kImproved, config_.adaptivity));
      if (check.would_exceed) {
        result.outcome = StepResult::Outcome::kRefusedCeiling;
        result.epsilon_refused = check.epsilon_after;
        VIPSD_ASSIGN_OR_RETURN(auto spent,
                               book_->accountant().GetEpsilon(config_.delta,
                                                       privacy::RdpConversion::kImproved,
                                                       config_.adaptivity));
        result.epsilon_spent = spent.epsilon;
        return ticket;
      }
    }
    VIPSD_RETURN_IF_ERROR(book_->Charge(step));
    VIPSD_ASSIGN_OR_RETURN(auto spent, book_->accountant().GetEpsilon(
                                           config_.delta, privacy::RdpConversion::kImproved,
                                           config_.adaptivity));
    result.epsilon_spent = spent.epsilon;
  }
  ticket.key = DrawStepKey(*noise_);
  result.phase_seconds.charge = Lap(clock);
  return ticket;
}

Status StepDriver::SumStreams(const StepKey& key, const std::vector<StreamCandidates>& streams,
                              const PartialSink& sink, StepPhaseSeconds* phases) {
  const double q = config_.mechanism.sampling_rate;
  auto clock = std::chrono::steady_clock::now();

  // 2. Poisson sampling, per record (or per unit), from the keyed words.
  // P(include) = ⌊q·2^64⌋/2^64 ≤ q, which the accountant's q bounds (RDP
  // grows with q). batches[s] lists stream s's contributions and the
  // E-step seeds of their records.
  std::vector<Batch> batches(streams.size());
  for (const StreamCandidates& stream : streams) {
    if (stream.records.size() != stream.offsets.size()) {
      return InvalidArgumentError("stream '" + stream.stream +
                                  "': records and offsets differ in number");
    }
  }
  if (config_.max_records_per_unit > 0) {
    VIPSD_RETURN_IF_ERROR(SampleUnits(key, streams, q, config_.max_records_per_unit, batches));
  } else {
    VIPSD_RETURN_IF_ERROR(SampleRecords(key, streams, q, batches));
  }
  if (on_sample_) ReportContributions(on_sample_, next_step_, streams, batches);
  if (phases != nullptr) phases->sample += Lap(clock);

  // 3 + 4. E-step, clip and sum, in parallel over fixed chunks (ChunksOf).
  // Chunk sums are merged in chunk order into the current stream's partial,
  // which goes to the sink when the stream's last chunk is merged. Chunk
  // boundaries do not depend on the thread count, so neither does the
  // result. Memory stays bounded (a few accumulators per worker).
  const std::vector<Chunk> chunks = ChunksOf(batches);
  const privacy::BlockLayout& layout = model_->statistic_layout();
  const privacy::SumKind kind = privacy::SumKindFor(config_.mechanism.noise_multiplier);
  if (current_ == nullptr || current_->kind() != kind) {
    current_ = std::make_unique<privacy::GaussianSumMechanism>(layout, kind);
  } else {
    current_->Reset();
  }
  privacy::GaussianSumMechanism& current = *current_;
  const size_t num_chunks = chunks.size();
  size_t work_chunks = 0;
  for (const Chunk& chunk : chunks) work_chunks += chunk.end > chunk.begin ? 1 : 0;
  const size_t num_workers =
      std::min<size_t>(static_cast<size_t>(config_.threads), std::max<size_t>(work_chunks, 1));
  const size_t max_pending = 2 * num_workers;
  std::mutex mutex;
  std::condition_variable merged;
  size_t next_chunk = 0;  // guarded by mutex
  size_t next_merge = 0;  // guarded by mutex
  bool merging = false;   // guarded by mutex: a worker is merging into `current`
  std::vector<std::unique_ptr<privacy::GaussianSumMechanism>> finished(num_chunks);
  std::vector<std::unique_ptr<privacy::GaussianSumMechanism>>& spare = spare_;  // guarded by mutex
  Status merge_status = Status::Ok();                                   // guarded by mutex
  auto worker = [&]() {
    auto scratch = model_->NewScratch();
    ContributionScratch sums;
    for (;;) {
      size_t index;
      std::unique_ptr<privacy::GaussianSumMechanism> sum;
      {
        std::unique_lock<std::mutex> lock(mutex);
        // Do not run too far ahead of the merge point: bounds memory.
        merged.wait(lock, [&] { return next_chunk - next_merge < max_pending; });
        if (next_chunk >= num_chunks) return;
        index = next_chunk++;
        if (!spare.empty()) {
          sum = std::move(spare.back());
          spare.pop_back();
          if (sum->kind() != kind) sum.reset();  // σ crossed 0 by a reload
        }
      }
      if (!sum) sum = std::make_unique<privacy::GaussianSumMechanism>(layout, kind);
      const Chunk& chunk = chunks[index];
      const Batch& batch = batches[chunk.stream];
      SumContributions(*model_, batch, chunk.begin, chunk.end, *scratch, sums, *sum);
      std::unique_lock<std::mutex> lock(mutex);
      finished[index] = std::move(sum);
      if (merging) continue;  // the merging worker will pick this chunk up
      // This worker merges every chunk that is due, in chunk order, outside
      // the lock so that the others keep running E-steps meanwhile. Only the
      // worker that set `merging` touches `current` and calls the sink; the
      // flag changes under the lock, which orders one merger's writes before
      // the next one's.
      merging = true;
      while (next_merge < num_chunks && finished[next_merge]) {
        std::unique_ptr<privacy::GaussianSumMechanism> piece = std::move(finished[next_merge]);
        const Chunk& due = chunks[next_merge];
        lock.unlock();
        Status status = current.Merge(std::move(*piece));
        piece->Reset();
        if (status.ok() && due.last_of_stream) {
          status = sink(due.stream, current);
          current.Reset();
        }
        lock.lock();
        if (!status.ok() && merge_status.ok()) merge_status = status;
        spare.push_back(std::move(piece));
        ++next_merge;
        merged.notify_all();
      }
      merging = false;
    }
  };
  if (num_workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> threads;
    threads.reserve(num_workers);
    for (size_t w = 0; w < num_workers; ++w) threads.emplace_back(worker);
    for (auto& thread : threads) thread.join();
  }
  if (phases != nullptr) phases->estep += Lap(clock);
  return merge_status;
}

StatusOr<StepResult> StepDriver::Finish(const StepTicket& ticket,
                                        privacy::GaussianSumMechanism& total) {
  if (ticket.result.outcome != StepResult::Outcome::kRan || ticket.result.step != next_step_) {
    return FailedPreconditionError("Finish: the ticket is not this driver's admitted step " +
                                   std::to_string(next_step_));
  }
  const bool is_private = config_.mechanism.noise_multiplier > 0;
  StepResult result = ticket.result;
  auto clock = std::chrono::steady_clock::now();
  StatusOr<privacy::GaussianRelease> release = UnavailableError("no release");
  if (!is_private) {
    release = total.ReleaseNonPrivate();
  } else if (noise_ahead_.valid()) {
    auto prepared = noise_ahead_.get();
    if (!prepared.ok()) return prepared.status();
    release = total.Release(std::move(*prepared));
  } else {
    release = total.Release(*noise_, config_.mechanism.noise_multiplier);
  }
  if (!release.ok()) return release.status();
  result.phase_seconds.noise = Lap(clock);
  return MStepOn(std::move(result), *release);
}

StatusOr<StepResult> StepDriver::MStepOn(StepResult result,
                                         const privacy::GaussianRelease& release) {
  // 5. M-step on the released sum.
  auto clock = std::chrono::steady_clock::now();
  result.rho = StepSize(config_.tau0, config_.kappa, next_step_);
  // The sum's q, and the σ its release used (0 for an exact sum).
  const privacy::SampledGaussian released_by{config_.mechanism.sampling_rate,
                                             release.noise_multiplier};
  // The observer first: what it does with the sum (a coordinator encodes it
  // for the next plan) overlaps the M-step.
  if (on_release_) on_release_(release.noisy_sum, next_step_, released_by, result.rho);
  VIPSD_RETURN_IF_ERROR(model_->MStep(release.noisy_sum, released_by, result.rho));
  result.phase_seconds.mstep = Lap(clock);
  ++next_step_;
  return result;
}

StatusOr<StepResult> StepDriver::FinishReleased(const StepTicket& ticket,
                                                const privacy::GaussianRelease& release) {
  if (ticket.result.outcome != StepResult::Outcome::kRan || ticket.result.step != next_step_) {
    return FailedPreconditionError("FinishReleased: the ticket is not this driver's admitted step " +
                                   std::to_string(next_step_));
  }
  if (config_.mechanism.noise_multiplier <= 0 || noise_ahead_.valid()) {
    return FailedPreconditionError(
        "FinishReleased: only for a private driver without noise drawn ahead");
  }
  if (static_cast<size_t>(release.noisy_sum.size()) != model_->statistic_layout().total_size()) {
    return FailedPreconditionError("FinishReleased: the release has another dimension");
  }
  return MStepOn(ticket.result, release);
}

void StepDriver::DrawNoiseAhead() {
  if (config_.mechanism.noise_multiplier <= 0 || noise_ahead_.valid()) return;
  const privacy::BlockLayout* layout = &model_->statistic_layout();
  privacy::NoiseSource* noise = noise_;
  const double sigma = config_.mechanism.noise_multiplier;
  // On the step's threads (schedule.threads): a coordinator that reads no
  // partition has them free, and the draws are the same however many.
  const int threads = config_.threads;
  noise_ahead_ = std::async(std::launch::async, [layout, noise, sigma, threads] {
    return privacy::GaussianSumMechanism::PrepareNoise(*layout, *noise, sigma, threads);
  });
}

void StepDriver::Abandon(const StepTicket& ticket) {
  // The noise drawn ahead for this step is never used (and wiped).
  if (noise_ahead_.valid()) (void)noise_ahead_.get();
  if (ticket.result.outcome == StepResult::Outcome::kRan && ticket.result.step == next_step_) {
    ++next_step_;
  }
}

Status StepDriver::Advance(const Eigen::VectorXd& released_sum, int64_t step) {
  if (step != next_step_) {
    return FailedPreconditionError("Advance: released sum of step " + std::to_string(step) +
                                   ", but this replica's next step is " +
                                   std::to_string(next_step_));
  }
  VIPSD_RETURN_IF_ERROR(model_->MStep(released_sum, config_.mechanism,
                                      StepSize(config_.tau0, config_.kappa, next_step_)));
  ++next_step_;
  return Status::Ok();
}

}  // namespace vipsd::svi
