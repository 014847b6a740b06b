// The run's metrics (see run_metrics.hpp).
#include "run_metrics.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "ablate/config.hpp"

namespace ablate {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

PeakFlops resolve_peak(const Config& config, Model& model, Communicator& comm) {
  PeakFlops p;
  const double configured = config.section("metrics").get_float("peak_tflops");
  const DType dtype = config.section("run").get_string("dtype") == "bf16" ? DType::bf16 : DType::f32;
  if (configured > 0) {
    p.rank_tflops = configured;
    p.source = "configured";
  } else if (const double table = model.device().peak_tflops(dtype); table > 0) {
    p.rank_tflops = table;
    p.source = "device table";
  } else {
    p.rank_tflops = model.measure_matmul_tflops();
    p.source = "measured";
  }
  double job = p.rank_tflops;
  comm.all_reduce_host(flat_view(&job, DType::f64, 1), ReduceOp::sum);
  p.job_tflops = job;
  p.rank_tflops = job / comm.world();
  return p;
}

RunMetrics::RunMetrics(int64_t start_step, int64_t steps, const PeakFlops& peak, bool communicates)
    : start_step_(start_step), steps_(steps), peak_(peak), communicates_(communicates) {}

StepMetrics RunMetrics::record(int64_t step, double lr, const StepOutcome& o, double step_s, double wait_ms,
                               double flops_per_token, int64_t mem_peak_bytes, int64_t optimizer_state_bytes) {
  StepMetrics sm;
  sm.step = step;
  sm.loss = o.loss;
  sm.lr = lr;
  sm.grad_norm = o.grad_norm;
  sm.step_ms = step_s * 1e3;
  sm.tokens = o.positions;
  sm.real_tokens = o.real_targets;
  sm.padding_fraction = o.positions > 0 ? 1.0 - double(o.real_targets) / double(o.positions) : 0.0;
  sm.tokens_per_s = double(o.positions) / step_s;
  sm.real_tokens_per_s = double(o.real_targets) / step_s;
  sm.tflops = flops_per_token * double(o.positions) / step_s / 1e12;
  sm.mfu = peak_.job_tflops > 0 ? sm.tflops / peak_.job_tflops : 0.0;
  sm.effective_mfu = peak_.job_tflops > 0 ? flops_per_token * double(o.real_targets) / step_s / 1e12 / peak_.job_tflops : 0.0;
  sm.data_wait_pct = 100.0 * wait_ms / sm.step_ms;
  sm.mem_peak_bytes = mem_peak_bytes;
  sm.optimizer_state_bytes = optimizer_state_bytes;
  // The first step of a process carries warm-up costs: left out of the medians unless it is the only one.
  const bool counted = step > start_step_ + 1 || steps_ - start_step_ == 1;
  if (communicates_) {
    sm.extra.push_back({"comm_pct", 100.0 * o.comm_s / step_s});
    if (counted) comm_pcts_.push_back(100.0 * o.comm_s / step_s);
  }
  if (first_loss_ < 0) first_loss_ = o.loss;
  if (counted) {
    tps_.push_back(sm.tokens_per_s);
    rtps_.push_back(sm.real_tokens_per_s);
    mfus_.push_back(sm.mfu);
    emfus_.push_back(sm.effective_mfu);
    tflops_.push_back(sm.tflops);
  }
  waits_.push_back(sm.data_wait_pct);
  if (counted && sm.mfu > 1.0) {
    // More FLOP/s than the peak: the peak is wrong (a CPU measured under load, a table entry for
    // another part), not the model. Said once, and summary.json carries the flag.
    if (!above_peak_) {
      spdlog::warn("step {}: MFU {:.0f}% exceeds 100% of the peak it is measured against ({:.3f} TFLOP/s per rank, {}); "
                   "MFU figures of this run are not trustworthy: set [metrics] peak_tflops to this machine's peak",
                   step, 100.0 * sm.mfu, peak_.rank_tflops, peak_.source);
    }
    above_peak_ = true;
  }
  return sm;
}

double RunMetrics::median_tokens_per_s() const { return median(tps_); }
double RunMetrics::median_mfu() const { return median(mfus_); }

nlohmann::json RunMetrics::summary() const {
  // A process that trained no step (resumed at the last one) measured nothing: null, not zero.
  const auto med = [](const std::vector<double>& v) { return v.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(v)); };
  nlohmann::json j = {{"first_loss", first_loss_ < 0 ? nlohmann::json(nullptr) : nlohmann::json(first_loss_)},
                      {"tokens_per_s", med(tps_)},
                      {"real_tokens_per_s", med(rtps_)},
                      {"tflops", med(tflops_)},
                      {"mfu", med(mfus_)},
                      {"effective_mfu", med(emfus_)},
                      {"peak_tflops", peak_.rank_tflops},
                      {"peak_source", peak_.source},
                      {"mfu_above_peak", above_peak_},
                      {"data_wait_pct", med(waits_)}};
  if (communicates_) j["comm_pct"] = med(comm_pcts_);
  return j;
}

}  // namespace ablate
