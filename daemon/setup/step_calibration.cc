#include "daemon/setup/step_calibration.h"

#include "core/privacy/accounting/planner.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/base/format.h"
#include "core/model/model.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/svi/step_driver.h"
#include "core/svi/step_randomness.h"
#include "daemon/setup/model_setup.h"

namespace vipsd::daemon {
namespace {

constexpr double kTailProbability = privacy::kBatchTailProbability;

// N·KL(b/N ‖ q) for b/N > q (the Chernoff exponent of the upper tail).
double UpperTailExponent(int64_t n, int64_t b, double q) {
  const double a = static_cast<double>(b) / static_cast<double>(n);
  if (a >= 1) return -static_cast<double>(n) * std::log(q);
  return static_cast<double>(n) * (a * std::log(a / q) + (1 - a) * std::log((1 - a) / (1 - q)));
}

int64_t Dimension(const model::Model& model, const std::string& name, int64_t fallback) {
  for (const auto& [key, value] : model.dimensions()) {
    if (key == name) return value;
  }
  return fallback;
}

// Public synthetic records of the configured model, from a fixed seed.
std::vector<model::Record> SyntheticRecords(const config::VipsdConfig& config,
                                            const model::Model& model, int64_t count) {
  std::mt19937_64 rng(20261127);
  std::vector<model::Record> records(static_cast<size_t>(count));
  if (config.model_type == "lda") {
    const int64_t vocabulary = std::max<int64_t>(1, Dimension(model, "V", 1));
    const int64_t length = config.lda.resample_length > 0 ? config.lda.resample_length : 100;
    std::uniform_int_distribution<int64_t> word(0, vocabulary - 1);
    for (auto& record : records) {
      record.word_ids.resize(static_cast<size_t>(length));
      for (auto& id : record.word_ids) id = static_cast<int32_t>(word(rng));
    }
  } else if (config.model_type == "blr") {
    const int64_t dim = std::max<int64_t>(1, Dimension(model, "d", 1));
    std::normal_distribution<double> normal;
    for (size_t r = 0; r < records.size(); ++r) {
      records[r].features.resize(static_cast<size_t>(dim));
      for (double& x : records[r].features) x = normal(rng);
      records[r].label = static_cast<double>(r % 2);
    }
  } else {
    const int64_t visible = std::max<int64_t>(1, Dimension(model, "J", 1));
    std::bernoulli_distribution bit(0.5);
    for (auto& record : records) {
      record.features.resize(static_cast<size_t>(visible));
      for (double& x : record.features) x = bit(rng) ? 1.0 : 0.0;
    }
  }
  return records;
}

double CpuSeconds(clockid_t clock) {
  timespec now{};
  if (clock_gettime(clock, &now) != 0) return 0;
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// CPU seconds this process has used, all threads together.
double ProcessCpuSeconds() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }
// CPU seconds the calling thread has used.
double ThreadCpuSeconds() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }

// The CPUs this process may run on (its affinity mask: a container's
// cpuset, taskset), else what the hardware reports.
int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::string Seconds(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.3g s", value);
  return buffer;
}

}  // namespace

int64_t BatchBound(int64_t n, double q) {
  if (n <= 0) return 0;
  if (q >= 1) return n;
  const double threshold = -std::log(kTailProbability);
  int64_t low = static_cast<int64_t>(std::ceil(q * static_cast<double>(n)));
  if (low >= n) return n;
  // The exponent increases in b above the mean: the first b past the
  // threshold, by bisection on (mean, n].
  int64_t high = n;
  if (UpperTailExponent(n, high, q) < threshold) return n;
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    if (UpperTailExponent(n, mid, q) >= threshold) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return high;
}

namespace {

// How many steps the accountant's check beside the timed step covers (0:
// none, not a private fixed schedule). Beside the step, as in a run: a
// fixed schedule's new step count is a PLD composition, computed in the
// background while a step runs (LedgerKeeper::PrefetchNextCheck).
int64_t CheckStepsFor(const config::VipsdConfig& config) {
  const bool fixed_schedule =
      config.is_private() &&
      (!config.schedule.has_value() || *config.schedule == config::Schedule::kFixed);
  if (fixed_schedule) {
    // A composition's cost grows with the count (slowly: 0.09 s at 300
    // steps, 0.31 s at 10^5 for q = 0.1, σ = 2 here): at most
    // schedule.max_steps, at most about what the ceiling admits — twice the
    // RDP count (RDP's ε is above the PLD's, so it admits fewer steps: 59
    // against 73 at q = 0.1, σ = 2, ε = 2) — and at most
    // kCalibrationCheckSteps, so that a start does not spend seconds on it
    // (its length is only said, never judged: above).
    int64_t steps = kCalibrationCheckSteps;
    const auto rdp = privacy::MaxStepsForEpsilon(
        privacy::AccountantKind::kRdp, config.driver.epsilon_ceiling,
        config.driver.mechanism.sampling_rate, config.driver.mechanism.noise_multiplier,
        config.driver.delta);
    if (rdp.ok()) steps = std::min(steps, 2 * std::max<int64_t>(*rdp, 1));
    if (config.max_steps > 0) steps = std::min(steps, config.max_steps);
    return std::max<int64_t>(steps, 1);
  }
  return 0;
}

// Times the step twice on `records` (scaled to out->batch_bound) with the
// sample's words over a full pool and the accountant's check beside it;
// sets the step's wall (slowest, fastest), CPU and check figures.
Status TimeStepRuns(const config::VipsdConfig& config, const std::vector<model::Record>& records,
                    svi::StepDriver& driver, StepCalibration* out) {
  // The sample's words over a full pool (step_randomness.h): one keyed word
  // per candidate, for a window of pool.capacity records.
  // Timed on at most kCalibrationWords candidates and scaled to the pool.
  std::vector<int64_t> offsets(
      static_cast<size_t>(std::clamp<int64_t>(config.pool_capacity, 1, kCalibrationWords)));
  for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = static_cast<int64_t>(i);
  const double word_scale = static_cast<double>(std::max<int64_t>(config.pool_capacity, 1)) /
                            static_cast<double>(offsets.size());
  std::vector<uint64_t> words;
  const double scale =
      static_cast<double>(out->batch_bound) / static_cast<double>(out->timed_records);
  double slowest = 0;
  double fastest = std::numeric_limits<double>::infinity();
  double least_cpu = std::numeric_limits<double>::infinity();
  // One composition (a fresh accountant: a memoised count would cost
  // nothing), started before the first run and running beside both as long
  // as it lasts (at σ = 0.05 it takes about 2 s; two would double what a
  // start spends on it). Its thread's CPU is read at each run's ends, so
  // that each run's CPU is the step's alone.
  std::optional<privacy::FixedScheduleAccountant> fixed;
  if (out->check_steps > 0) {
    VIPSD_ASSIGN_OR_RETURN(fixed,
                           privacy::FixedScheduleAccountant::Create(config.driver.mechanism));
  }
  const auto check_start = std::chrono::steady_clock::now();
  Status checked = Status::Ok();
  double check_seconds = 0, check_cpu_final = 0;  // written before check_done
  std::atomic<bool> check_done{false};
  std::thread check;
  clockid_t check_clock{};
  bool check_clock_ok = false;
  if (fixed.has_value()) {
    check = std::thread([&] {
      const auto at = fixed->Epsilon(out->check_steps, config.driver.delta);
      if (!at.ok()) checked = at.status();
      check_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - check_start).count();
      check_cpu_final = ThreadCpuSeconds();
      check_done.store(true, std::memory_order_release);
    });
    check_clock_ok = pthread_getcpuclockid(check.native_handle(), &check_clock) == 0;
  }
  // The check thread's CPU so far (0 without one).
  auto check_cpu = [&]() -> double {
    if (!check.joinable()) return 0;
    if (check_done.load(std::memory_order_acquire)) return check_cpu_final;
    timespec now{};
    if (check_clock_ok && clock_gettime(check_clock, &now) == 0) {
      return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
    }
    // Its clock went with the thread, which ended just now: its own figure.
    while (!check_done.load(std::memory_order_acquire)) std::this_thread::yield();
    return check_cpu_final;
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    const double cpu_start = ProcessCpuSeconds();
    const double check_cpu_start = check_cpu();
    const auto start = std::chrono::steady_clock::now();
    svi::StepKey key;
    key.bytes[0] = static_cast<uint8_t>(attempt);
    const double words_cpu_start = ThreadCpuSeconds();  // the words are drawn on this thread
    const Status sampled =
        svi::KeyedWords(svi::DeriveStreamKey(key, "calibration"), svi::kSampleNonce, offsets,
                        words);
    const double words_wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double words_cpu = ThreadCpuSeconds() - words_cpu_start;
    StatusOr<svi::StepResult> result =
        sampled.ok() ? driver.Step(std::span<const model::Record>(records))
                     : StatusOr<svi::StepResult>(sampled);
    const double step_wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
        words_wall;
    const double run_cpu = ProcessCpuSeconds() - cpu_start - (check_cpu() - check_cpu_start);
    if (!result.ok()) {
      if (check.joinable()) check.join();
      return result.status();
    }
    // The step's own time, measured while the check took CPU beside it:
    // the check's length depends on q, σ and the count only, never on the
    // data, so a check that outlasts the slot delays steps whatever the
    // data (said below; not an overrun the data could cause).
    const double wall = words_wall * word_scale + step_wall * scale;
    slowest = std::max(slowest, wall);
    fastest = std::min(fastest, wall);
    // The step's CPU only (the words' scaled on their own).
    least_cpu = std::min(least_cpu, words_cpu * word_scale + (run_cpu - words_cpu) * scale);
  }
  if (check.joinable()) check.join();
  VIPSD_RETURN_IF_ERROR(checked);
  out->step_seconds = slowest;
  out->fastest_seconds = fastest;
  out->check_seconds = check_seconds;
  out->cpu_seconds = least_cpu;
  return Status::Ok();
}

// The budget the step has, whether it needs the margin, the verdicts
// (JudgeStepTiming) and the line that says them.
void JudgeAndDescribe(const config::VipsdConfig& config, StepCalibration* out) {
  // The noise thread runs beside the step's own (svi::StepDriver::DrawNoiseAhead):
  // counting it keeps floor_seconds a lower bound of the step's wall time.
  const bool noise_thread =
      config.is_private() && (config.driver.threads > 1 || !config.work_topic.empty());
  out->usable_threads =
      std::max(1, std::min(config.driver.threads + (noise_thread ? 1 : 0), UsableCpus()));
  out->floor_seconds = out->cpu_seconds / out->usable_threads;
  const bool holder = config.federation.role == config::FederationRole::kHolder;
  // A federated holder's round runs from the plan to its share time (its
  // reading of the window included); one vipsd's step from its cut's read
  // to its release deadline, one slot after another.
  out->budget_seconds = holder ? config.federation.share_delay_seconds
                               : std::min(config.release_delay_seconds - config.cut_grace_seconds,
                                          config.step_interval_seconds);
  out->budget_key = holder ? "federation.share_delay_seconds" : "schedule.interval_seconds";
  // The claim's β needs the worst-case step to fit (SECURITY.md "Overruns"):
  // a private run that stops at an overrun, and a holder (its share leaves
  // at its time or never), is refused without that margin. Under
  // schedule.on_overrun: catch_up an overrun's length shows anyway, so it
  // is said, not refused.
  out->margin_required =
      config.is_private() &&
      (holder || (config.on_overrun == config::OverrunAction::kStop &&
                  config.federation.role != config::FederationRole::kAggregator));
  JudgeStepTiming(*out);
  out->text = "a step on " + std::to_string(out->batch_bound) +
              " records (the batch Poisson sampling at q = " +
              ShortestNumber(config.driver.mechanism.sampling_rate) + " from pool.capacity " +
              std::to_string(config.pool_capacity) + " exceeds with probability < 1e-9" +
              (out->timed_records < out->batch_bound
                   ? "; timed on " + std::to_string(out->timed_records) + " and scaled"
                   : "") +
              (out->check_steps > 0
                   ? "; with the accountant's check of step " + std::to_string(out->check_steps) +
                         " beside it, which took " + Seconds(out->check_seconds)
                   : "") +
              ") took " + Seconds(out->step_seconds) + " on this machine (the faster of two runs " +
              Seconds(out->fastest_seconds) + "; " + Seconds(out->cpu_seconds) +
              " of CPU time on " + std::to_string(out->usable_threads) + " thread" +
              (out->usable_threads == 1 ? "" : "s") + ": at least " + Seconds(out->floor_seconds) +
              " even when idle); " +
              (holder ? "a round gives its share " + Seconds(out->budget_seconds) +
                            " (federation.share_delay_seconds)"
                      : "a slot gives a step " + Seconds(out->budget_seconds) +
                            " (min of schedule.release_delay_seconds - cut_grace_seconds and "
                            "schedule.interval_seconds)");
  const std::string remedy =
      holder ? "; raise federation.share_delay_seconds (below the aggregator's "
               "round_timeout_seconds), or lower pool.capacity"
             : "; raise schedule.interval_seconds (and release_delay_seconds), or lower "
               "schedule.cut_grace_seconds or pool.capacity";
  const std::string margin = Seconds(kCalibrationSafety * out->fastest_seconds) + " (" +
                             ShortestNumber(kCalibrationSafety) + " x the faster run)";
  if (out->check_seconds > out->budget_seconds) {
    out->text += "; the accountant's check takes longer than the slot, so later steps wait for "
                 "it and leave late whatever the data (its length depends on q, sigma and the "
                 "step count only)";
  }
  if (out->refused_idle) {
    out->text += ", less than the step needs even on an idle machine: every step near this "
                 "batch would overrun its deadline" + remedy;
  } else if (out->refused) {
    out->text += ", less than " + margin +
                 ": without that margin an overrun's chance (beta in (epsilon, delta + beta)) is "
                 "not bounded, and a private run that stops at an overrun "
                 "(schedule.on_overrun: stop) is refused" + remedy;
  } else if (!out->fits) {
    out->text += ", less than " + margin + ": steps would overrun their deadlines on this "
                 "machine (schedule.on_overrun: catch_up shows how late they are)" + remedy;
  } else if (out->busy) {
    out->text += ", less than " + Seconds(kCalibrationSafety * out->step_seconds) + " (" +
                 ShortestNumber(kCalibrationSafety) +
                 " x the slower run): steps may overrun their deadlines on a machine this busy" +
                 remedy;
  }
}

}  // namespace

StatusOr<StepCalibration> CalibrateWorstCaseStep(const config::VipsdConfig& config) {
  if (config.source_type != config::SourceType::kKafka) {
    return FailedPreconditionError("the worst-case step is timed for a Kafka source only");
  }
  StepCalibration out;
  int64_t bound = BatchBound(config.pool_capacity, config.driver.mechanism.sampling_rate);
  if (config.driver.max_records_per_unit > 0) {
    bound = std::min<int64_t>(config.pool_capacity,
                              bound * std::max<int64_t>(1, config.driver.max_records_per_unit));
  }
  out.batch_bound = std::max<int64_t>(bound, 1);
  out.timed_records = std::min(out.batch_bound, kCalibrationRecords);

  // The worst case of the E-step too: every record runs the configured
  // maximum of iterations (a tolerance only an exact fixed point meets),
  // whatever real records would need.
  config::VipsdConfig worst = config;
  worst.lda.estep_tolerance = std::numeric_limits<double>::denorm_min();
  worst.sbn.estep_tolerance = std::numeric_limits<double>::denorm_min();
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(worst));
  const std::vector<model::Record> records =
      SyntheticRecords(config, *bundle.model, out.timed_records);
  svi::DriverConfig driver_config = config.driver;
  driver_config.mechanism.sampling_rate = 1;
  driver_config.max_records_per_unit = 0;  // one record per synthetic unit: the same work
  driver_config.epsilon_ceiling = 1e300;
  driver_config.enforce_ceiling = false;
  VIPSD_ASSIGN_OR_RETURN(auto noise, privacy::SecureNoiseSource::Create());
  privacy::RdpAccountant accountant;
  VIPSD_ASSIGN_OR_RETURN(auto driver,
                         svi::StepDriver::Create(bundle.model.get(), noise.get(),
                                                 driver_config.mechanism.is_private()
                                                     ? &accountant
                                                     : nullptr,
                                                 driver_config));
  out.check_steps = CheckStepsFor(config);
  VIPSD_RETURN_IF_ERROR(TimeStepRuns(config, records, *driver, &out));
  JudgeAndDescribe(config, &out);
  return out;
}

void JudgeStepTiming(StepCalibration& timing) {
  timing.fits = kCalibrationSafety * timing.fastest_seconds <= timing.budget_seconds;
  timing.busy = kCalibrationSafety * timing.step_seconds > timing.budget_seconds;
  timing.refused_idle = timing.floor_seconds > timing.budget_seconds;
  timing.refused = timing.refused_idle || (timing.margin_required && !timing.fits);
}

const std::vector<std::string>& StepCostKeys() {
  static const std::vector<std::string> keys = {
      "privacy.noise_multiplier",    "privacy.sampling_rate",
      "schedule.threads",            "schedule.interval_seconds",
      "schedule.release_delay_seconds", "schedule.cut_grace_seconds",
      "schedule.max_steps",          "pool.capacity"};
  return keys;
}

}  // namespace vipsd::daemon
