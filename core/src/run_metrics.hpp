// The run's metrics: each step's StepMetrics (metrics.hpp's names and definitions, in
// docs/architecture.md) from the engine's outcome and the step's timing, the medians that
// summary.json reports, the peak FLOP/s that MFU is measured against, and how far the run's
// timings can be trusted (the spread of its step times, the load other processes put on the machine).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/communicator.hpp"
#include "ablate/runtime/engine.hpp"
#include "ablate/metrics.hpp"
#include "ablate/runtime/model.hpp"

namespace ablate {

struct RunSpec;

// The peak of one rank and of the job (the sum over ranks), and where it came from: [metrics]
// peak_tflops when set, else the device's table entry, else (a CPU) the measured fp32 matrix-product
// rate, every rank measuring at once as they will train.
struct PeakFlops {
  double rank_tflops = 0, job_tflops = 0;
  std::string source;  // "configured", "device table", "measured"
};
PeakFlops resolve_peak(const RunSpec& spec, Model& model, Communicator& comm);

class RunMetrics {
 public:
  // communicates: the run's communicator moves data (several ranks, or buckets at one): comm_pct is kept.
  RunMetrics(int64_t start_step, int64_t steps, const PeakFlops& peak, bool communicates);

  // The metrics of one step (tokens, throughput and MFU over the whole job).
  StepMetrics record(int64_t step, double lr, const StepOutcome& outcome, double step_s, double wait_ms, double flops_per_token,
                     int64_t mem_peak_bytes, int64_t optimizer_state_bytes);

  // summary.json's fields that come from the steps (the trainer adds the run's own).
  nlohmann::json summary() const;
  double median_tokens_per_s() const;
  double median_mfu() const;
  double first_loss() const noexcept { return first_loss_; }

 private:
  int64_t start_step_, steps_;
  PeakFlops peak_;
  bool communicates_;
  double first_loss_ = -1;
  bool above_peak_ = false;  // a counted step's MFU exceeded 1
  std::vector<double> tps_, rtps_, mfus_, emfus_, tflops_, waits_, comm_pcts_, host_pcts_, step_s_;
};

double median(std::vector<double> values);

// The standard deviation of `values` over their mean (population form: divided by n); nullopt for
// fewer than two values or a mean that is not positive. summary.json's step_time_cv.
std::optional<double> coefficient_of_variation(const std::vector<double>& values);

// CPU time in clock ticks as Linux counts it: the machine's in /proc/stat (its first, all-CPU
// line), this process's in /proc/self/stat.
struct CpuTimes {
  double total = 0;  // every CPU's time in every state (guest time is inside user time already)
  double busy = 0;   // user, nice, system, irq and softirq: time some process ran
  double steal = 0;  // time the hypervisor gave to other virtual machines
  double self = 0;   // this process's utime + stime, all its threads
};
// The two files' text parsed; nullopt when either is not in the form Linux writes.
std::optional<CpuTimes> parse_cpu_times(std::string_view proc_stat, std::string_view proc_self_stat);
// The counters now; nullopt where the files cannot be read (not Linux).
std::optional<CpuTimes> read_cpu_times();

struct MachineLoad {
  double load = 0;   // (busy time of other processes + steal) / all CPU time
  double steal = 0;  // steal / all CPU time
};
// The load between two readings. `job_self` is the CPU time the job's own processes on this
// machine used meanwhile (one rank: after.self - before.self); the rest of the busy time is other
// processes'. nullopt when no CPU time passed. Both fractions lie in [0, 1].
std::optional<MachineLoad> machine_load(const CpuTimes& before, const CpuTimes& after, double job_self);

// summary.json's machine_load and cpu_steal from `before` to now, null where unavailable. A
// collective (every rank calls it): the job's ranks on this machine count as the run, not as
// other processes.
nlohmann::json machine_load_summary(const std::optional<CpuTimes>& before, Communicator& comm);

}  // namespace ablate
