// The run's metrics: each step's StepMetrics (metrics.hpp's names and definitions, in
// docs/architecture.md) from the engine's outcome and the step's timing, the medians that
// summary.json reports, and the peak FLOP/s that MFU is measured against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/communicator.hpp"
#include "ablate/engine.hpp"
#include "ablate/metrics.hpp"
#include "ablate/model.hpp"

namespace ablate {

class Config;

// The peak of one rank and of the job (the sum over ranks), and where it came from: [metrics]
// peak_tflops when set, else the device's table entry, else (a CPU) the measured fp32 matrix-product
// rate, every rank measuring at once as they will train.
struct PeakFlops {
  double rank_tflops = 0, job_tflops = 0;
  std::string source;  // "configured", "device table", "measured"
};
PeakFlops resolve_peak(const Config& config, Model& model, Communicator& comm);

class RunMetrics {
 public:
  // communicates: the run's communicator moves data (several ranks, or buckets at one): comm_pct is kept.
  RunMetrics(int64_t start_step, int64_t steps, const PeakFlops& peak, bool communicates);

  // The metrics of one step (tokens, throughput and MFU over the whole job).
  StepMetrics record(int64_t step, double lr, const StepOutcome& outcome, double step_s, double wait_ms,
                     double flops_per_token, int64_t mem_peak_bytes, int64_t optimizer_state_bytes);

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
  std::vector<double> tps_, rtps_, mfus_, emfus_, tflops_, waits_, comm_pcts_;
};

double median(std::vector<double> values);

}  // namespace ablate
