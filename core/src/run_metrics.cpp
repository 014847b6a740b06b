// The run's metrics (see run_metrics.hpp).
#include "run_metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "ablate/runtime/run_spec.hpp"

namespace ablate {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

PeakFlops resolve_peak(const RunSpec& spec, Model& model, Communicator& comm) {
  PeakFlops p;
  const double configured = spec.peak_tflops;
  // FP8 runs are counted against the bf16 peak: the classifier and attention stay bf16, and the
  // figure stays comparable with the bf16 run it is ablated against.
  const DType dtype = holds_bf16(spec.run.dtype) ? DType::bf16 : DType::f32;
  if (configured > 0) {
    p.rank_tflops = configured;
    p.source = "configured";
  } else if (const double table = model.device().peak_tflops(dtype); table > 0) {
    p.rank_tflops = table;
    p.source = "device table";
  } else if (table < 0) {
    p.rank_tflops = 0;  // MFU is 0 throughout: not reported
    p.source = "none: emulated device";
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

StepMetrics RunMetrics::record(int64_t step, double lr, const StepOutcome& o, double step_s, double wait_ms, double flops_per_token,
                               int64_t mem_peak_bytes, int64_t optimizer_state_bytes) {
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
  if (const double engine_s = step_s - wait_ms / 1e3; o.issue_s >= 0 && engine_s > 0) {
    // The host's share of the step's own time (the data wait left out): near 100, the device waited
    // for the host to issue its work.
    const double pct = std::min(100.0, 100.0 * o.issue_s / engine_s);
    sm.extra.push_back({"host_pct", pct});
    if (counted) host_pcts_.push_back(pct);
  }
  if (o.fp8_saturated >= 0) {
    sm.extra.push_back({"fp8_saturated", double(o.fp8_saturated)});
    sm.extra.push_back({"fp8_saturated_worst", double(o.fp8_saturated_worst)});
  }
  if (first_loss_ < 0) first_loss_ = o.loss;
  if (counted) {
    tps_.push_back(sm.tokens_per_s);
    rtps_.push_back(sm.real_tokens_per_s);
    mfus_.push_back(sm.mfu);
    emfus_.push_back(sm.effective_mfu);
    tflops_.push_back(sm.tflops);
    step_s_.push_back(step_s);
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
  const std::optional<double> cv = coefficient_of_variation(step_s_);
  j["step_time_cv"] = cv ? nlohmann::json(*cv) : nlohmann::json(nullptr);
  if (communicates_) j["comm_pct"] = med(comm_pcts_);
  if (!host_pcts_.empty()) j["host_pct"] = median(host_pcts_);
  return j;
}

std::optional<double> coefficient_of_variation(const std::vector<double>& values) {
  if (values.size() < 2) return std::nullopt;
  double mean = 0;
  for (double v : values) mean += v;
  mean /= double(values.size());
  if (!(mean > 0)) return std::nullopt;
  double var = 0;
  for (double v : values) var += (v - mean) * (v - mean);
  return std::sqrt(var / double(values.size())) / mean;
}

namespace {

// The whitespace-separated numbers of `text`, up to the first that is not one.
std::vector<double> numbers(std::string_view text) {
  std::vector<double> out;
  std::size_t i = 0;
  while (true) {
    i = text.find_first_not_of(" \t", i);
    if (i == std::string_view::npos) break;
    const std::size_t end = std::min(text.find_first_of(" \t\n", i), text.size());
    double v = 0;
    const auto [p, ec] = std::from_chars(text.data() + i, text.data() + end, v);
    if (ec != std::errc() || p != text.data() + end) break;
    out.push_back(v);
    i = end;
  }
  return out;
}

}  // namespace

std::optional<CpuTimes> parse_cpu_times(std::string_view proc_stat, std::string_view proc_self_stat) {
  // /proc/stat: "cpu  user nice system idle iowait irq softirq steal guest guest_nice" (older
  // kernels stop earlier; missing states count 0). Guest time is already inside user and nice.
  const std::string_view line = proc_stat.substr(0, proc_stat.find('\n'));
  if (line.substr(0, 4) != "cpu ") return std::nullopt;
  std::vector<double> c = numbers(line.substr(4));
  if (c.size() < 4) return std::nullopt;
  c.resize(std::max<std::size_t>(c.size(), 8), 0.0);
  CpuTimes t;
  t.busy = c[0] + c[1] + c[2] + c[5] + c[6];
  t.steal = c[7];
  t.total = t.busy + c[3] + c[4] + t.steal;
  // /proc/self/stat: "pid (comm) state ppid ...": utime and stime are fields 14 and 15, the 12th
  // and 13th after the command, which may itself hold spaces and parentheses.
  const std::size_t close = proc_self_stat.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view rest = proc_self_stat.substr(close + 1);
  const std::size_t state = rest.find_first_not_of(' '), after_state = rest.find(' ', state);
  if (after_state == std::string_view::npos) return std::nullopt;
  const std::vector<double> f = numbers(rest.substr(after_state));  // from ppid (field 4) on
  if (f.size() < 12) return std::nullopt;
  t.self = f[10] + f[11];
  return t;
}

std::optional<CpuTimes> read_cpu_times() {
  const auto slurp = [](const char* path) -> std::optional<std::string> {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const std::optional<std::string> machine = slurp("/proc/stat"), self = slurp("/proc/self/stat");
  if (!machine || !self) return std::nullopt;
  return parse_cpu_times(*machine, *self);
}

std::optional<MachineLoad> machine_load(const CpuTimes& before, const CpuTimes& after, double job_self) {
  const double total = after.total - before.total;
  if (!(total > 0)) return std::nullopt;
  const double others = std::max(0.0, after.busy - before.busy - std::max(0.0, job_self));
  const double steal = std::max(0.0, after.steal - before.steal);
  return MachineLoad{std::clamp((others + steal) / total, 0.0, 1.0), std::clamp(steal / total, 0.0, 1.0)};
}

nlohmann::json machine_load_summary(const std::optional<CpuTimes>& before, Communicator& comm) {
  const std::optional<CpuTimes> after = before ? read_cpu_times() : std::nullopt;
  // Every rank's own CPU time and whether it could measure: the job's time on this machine is its
  // ranks' share of the sum (data-parallel ranks do the same work).
  double mine[2] = {after ? after->self - before->self : 0.0, after ? 1.0 : 0.0};
  comm.all_reduce_host(flat_view(mine, DType::f64, 2), ReduceOp::sum);
  const std::optional<MachineLoad> load = after && mine[1] == double(comm.world())
                                              ? machine_load(*before, *after, mine[0] / comm.world() * comm.local_world())
                                              : std::nullopt;
  return {{"machine_load", load ? nlohmann::json(load->load) : nlohmann::json(nullptr)},
          {"cpu_steal", load ? nlohmann::json(load->steal) : nlohmann::json(nullptr)}};
}

}  // namespace ablate
