// `ablate doctor RUN_DIR [--json]`: reads a run's resolved config, run.json, summary.json and
// metrics.jsonl and names what holds the run back, ranked, each finding with the numbers behind it
// and the change to make. The finding ids are stable: noisy_timings, diverged, loss_spike,
// above_uniform, warmup_blowup, eval_plateau, eval_stalled, padding, input_bound, memory_headroom,
// memory_tight, attention, precision, optimizer_memory, communication, launch_bound, step_jitter.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "ablate/runtime/defaults.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/metrics.hpp"
#include "commands.hpp"
#include "json_read.hpp"

namespace ablate::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Finding {
  std::string id;
  std::string severity;  // high | medium | low
  std::string message;
  std::string change;  // the change to make, as the user would type it
  json evidence = json::object();
  std::optional<double> expected_speedup;
};

int severity_rank(const std::string& s) { return s == "high" ? 0 : s == "medium" ? 1 : 2; }

std::string fmt(const char* f, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gib(double bytes) { return fmt("%.2f GiB", bytes / double(1ll << 30)); }

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const std::size_t i = std::size_t(pos);
  const double f = pos - double(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

// The run, as the doctor reads it.
struct Run {
  fs::path dir;
  toml::table config;
  json info = json::object();     // run.json
  json summary = json::object();  // summary.json (absent for a run still going or killed)
  std::vector<json> steps;        // metrics.jsonl

  template <typename T>
  T cfg(const char* section, const char* key, T fallback) const {
    return config[section][key].value_or(fallback);
  }
};

Run load_run(const fs::path& dir) {
  Run r;
  r.dir = dir;
  if (!fs::is_directory(dir)) throw_input_error(dir.string(), "not a directory (expected a run directory made by `ablate train`)");
  const fs::path cfg = dir / "config.toml";
  if (!fs::exists(cfg)) throw_input_error(dir.string(), "no config.toml: not a run directory made by `ablate train`");
  const std::string cfg_text = read_regular_file(cfg, "run config", kMaxRunTomlBytes);
  try {
    r.config = toml::parse(cfg_text, cfg.string());
  } catch (const toml::parse_error& e) {
    throw_input_error(cfg.string() + ":" + std::to_string(e.source().begin.line), std::string(e.description()));
  }
  // Only the fields the doctor reads, each of its type (json_read.hpp): a damaged file is an input
  // error naming it. run.json and summary.json may be missing (a run killed early, or still going).
  r.info = read_json_file_if_present(dir / "run.json", kRunJson).value_or(json::object());
  r.summary = read_json_file_if_present(dir / "summary.json", kSummaryJson).value_or(json::object());
  const fs::path m = dir / "metrics.jsonl";
  auto steps = read_jsonl_file_if_present(m, kMetricsLine);
  if (!steps) {
    throw_input_error(m.string(), "missing: the doctor reads the per-step metrics the `jsonl` logger writes (add \"jsonl\" "
                                  "to [logging] sinks)");
  }
  r.steps = std::move(*steps);
  if (r.steps.empty()) throw_input_error(m.string(), "holds no steps yet: nothing to diagnose");
  return r;
}

std::vector<double> column(const std::vector<json>& rows, const char* key, bool skip_first) {
  std::vector<double> out;
  for (std::size_t i = skip_first && rows.size() > 1 ? 1 : 0; i < rows.size(); ++i) {
    if (rows[i].contains(key) && rows[i][key].is_number()) out.push_back(rows[i][key].get<double>());
  }
  return out;
}

// The mean of `v` and its standard deviation over the mean (population form, as summary.json's
// step_time_cv); the spread is nullopt for fewer than two values.
struct Spread {
  double mean = 0;
  std::optional<double> cv;
};
Spread spread_of(const std::vector<double>& v) {
  Spread s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  double var = 0;
  for (double x : v) var += (x - s.mean) * (x - s.mean);
  if (v.size() >= 2 && s.mean > 0) s.cv = std::sqrt(var / double(v.size())) / s.mean;
  return s;
}

// ---- timings: whether the run's step times measure the run or the machine's other work -------

// Above these the timings are unusable for throughput: steps of equal work on a machine the run
// has to itself vary by a few percent; over 0.25 the median of a short run moves by several
// percent from one run to the next, the size of most differences being compared. Other processes
// taking over a quarter of the machine's CPU time (steal included) compete for the run's cores,
// caches and memory bandwidth.
constexpr double kNoisyCv = 0.25;
constexpr double kBusyMachine = 0.25;

struct Timing {
  std::optional<double> cv, load, steal;
  std::string cv_of = "step time";  // or "time per position", where the steps' positions vary
  bool unusable = false;
};

// The steps whose time the noise is judged on: the first (warm-up) and evaluation steps left out.
std::vector<std::size_t> timed_steps(const std::vector<json>& steps) {
  std::vector<std::size_t> out;
  for (std::size_t i = 1; i < steps.size(); ++i) {
    if (!steps[i].contains("val_loss") && steps[i].contains("step_ms")) out.push_back(i);
  }
  return out;
}

Timing judge_timing(const Run& run) {
  Timing t;
  if (run.summary.contains("machine_load")) t.load = run.summary["machine_load"].get<double>();
  if (run.summary.contains("cpu_steal")) t.steal = run.summary["cpu_steal"].get<double>();
  // Padded and bucketed rows vary in length, and the step time with them: there the spread of the
  // time per position is the noise. Elsewhere summary.json's step_time_cv (every counted step, not
  // only the logged ones), else the logged steps'.
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const json& m : run.steps) {
    const double n = m.value("tokens", 0.0);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  std::vector<double> per;
  for (std::size_t i : timed_steps(run.steps)) {
    const double ms = run.steps[i]["step_ms"].get<double>(), n = run.steps[i].value("tokens", 0.0);
    per.push_back(hi > lo && n > 0 ? ms / n : ms);
  }
  if (hi > lo) {
    t.cv = spread_of(per).cv;
    t.cv_of = "time per position";
  } else if (run.summary.contains("step_time_cv")) {
    t.cv = run.summary["step_time_cv"].get<double>();
  } else {
    t.cv = spread_of(per).cv;
  }
  t.unusable = (t.cv && *t.cv > kNoisyCv) || (t.load && *t.load > kBusyMachine);
  return t;
}

std::optional<Finding> noisy_timings(const Timing& t, bool host_device) {
  if (!t.unusable) return std::nullopt;
  Finding f;
  f.id = "noisy_timings";
  f.severity = "high";
  f.evidence = {{"step_time_cv", t.cv ? json(*t.cv) : json(nullptr)},
                {"cv_of", t.cv_of},
                {"machine_load", t.load ? json(*t.load) : json(nullptr)},
                {"cpu_steal", t.steal ? json(*t.steal) : json(nullptr)},
                {"cv_limit", kNoisyCv},
                {"machine_load_limit", kBusyMachine}};
  std::vector<std::string> why;
  if (t.cv && *t.cv > kNoisyCv) {
    why.push_back("the " + t.cv_of + fmt(" varies by a coefficient of variation of %.2f", *t.cv) + fmt(" (over %.2f)", kNoisyCv));
  }
  if (t.load && *t.load > kBusyMachine) {
    why.push_back(fmt("other processes used %.0f%% of the machine's CPU time during the run", 100 * *t.load) +
                  fmt(" (over %.0f%%", 100 * kBusyMachine) +
                  (t.steal && *t.steal >= 0.005 ? fmt("; %.0f%% stolen by the hypervisor)", 100 * *t.steal) : std::string(")")));
  }
  f.message = "this run's timings are unusable: " + why[0] + (why.size() > 1 ? "; " + why[1] : std::string()) +
              ". Its tokens/s, MFU and data-wait figures measure the machine as much as the run: compare "
              "throughput only from a run on a quiet machine; the findings below that rest on timings are qualified";
  f.change = host_device ? "rerun with the cores to itself (nothing else running), or --set run.threads=N below the "
                           "number of idle cores"
                         : "rerun with the device and its host cores to itself";
  return f;
}

// A timing-based finding measured while the timings were unusable: no expected speed-up, and said.
void qualify(Finding& f) {
  f.message += " (measured while the timings were unusable, see noisy_timings: confirm on a quiet machine)";
  f.evidence["timings_unusable"] = true;
  f.expected_speedup.reset();
}

// ---- the loss: spikes and divergence --------------------------------------------------------

// One logged step's loss, gradient norm and learning rate; NaN where the file holds none (null:
// the NaN or infinity the trainer wrote).
struct LossPoint {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
};

std::vector<LossPoint> loss_points(const std::vector<json>& steps) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<LossPoint> out;
  for (const json& m : steps) {
    out.push_back({m["step"].get<int64_t>(), m.value("loss", nan), m.value("grad_norm", nan), m.value("lr", nan)});
  }
  return out;
}

// A spike: the loss jumps over kSpikeSigmas robust standard deviations and kSpikeRise of itself
// above its level (the median of the previous kSpikeWindow logged losses), stays over kHoldSigmas
// and kHoldRise above it at the next logged step (the update broke the weights: a hard batch
// alone is back at the level one step later), and the gradient norm at the step or the one
// before (the update that raised it) is at least kGradJump times its median over the window. The
// spread is that of successive differences (1.4826 x their median absolute deviation, over
// sqrt 2), so a falling loss does not widen it, with a floor of kSpreadFloor of the level.
// Measured on 50 clean tiny quickstart runs (seeds, batchings, micro-batches): single steps
// reach 19% and 7 spreads above the level with the gradient norm at 2-30x its median (small
// batches of hard documents), but no two steps in a row come within 60% of these thresholds.
constexpr std::size_t kSpikeWindow = 20, kSpikeHistory = 10;
constexpr double kSpikeSigmas = 6, kSpikeRise = 0.10, kHoldSigmas = 3, kHoldRise = 0.05, kSpreadFloor = 0.005, kGradJump = 2;

struct Spike {
  int64_t first_step = 0, last_step = 0;  // the logged steps it held over the level
  double level = 0, spread = 0;           // before it
  double loss = 0;                        // the highest in it
  double grad_norm = 0;                   // the largest at it or the step before (inf: not finite; NaN: not logged)
  double usual_grad_norm = 0;             // the median before it
  double lr = 0;                          // at its first step
};

std::vector<Spike> find_spikes(const std::vector<LossPoint>& pts) {
  const bool have_grad = std::any_of(pts.begin(), pts.end(), [](const LossPoint& p) { return std::isfinite(p.grad_norm); });
  // The gradient norm of pts[i], where the file holds one; a null among numbers was infinite.
  const auto norm = [&](std::size_t i) {
    return std::isfinite(pts[i].grad_norm) || !have_grad ? pts[i].grad_norm : std::numeric_limits<double>::infinity();
  };
  std::vector<std::size_t> fin;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (std::isfinite(pts[i].loss)) fin.push_back(i);
  }
  std::vector<Spike> out;
  for (std::size_t k = kSpikeHistory; k + 1 < fin.size(); ++k) {
    std::vector<double> losses, diffs, grads;
    for (std::size_t j = k - std::min(k, kSpikeWindow); j < k; ++j) {
      const LossPoint& p = pts[fin[j]];
      if (!losses.empty()) diffs.push_back(p.loss - losses.back());
      losses.push_back(p.loss);
      if (std::isfinite(p.grad_norm)) grads.push_back(p.grad_norm);
    }
    const double level = median_of(losses), center = median_of(diffs);
    for (double& d : diffs) d = std::abs(d - center);
    const double spread = std::max(1.4826 * median_of(diffs) / std::sqrt(2.0), kSpreadFloor * std::abs(level));
    const auto above = [&](std::size_t j, double sigmas, double rise) {
      return pts[fin[j]].loss - level >= std::max(sigmas * spread, rise * std::abs(level));
    };
    if (!above(k, kSpikeSigmas, kSpikeRise) || !above(k + 1, kHoldSigmas, kHoldRise)) continue;
    double g = norm(fin[k]);
    if (fin[k] > 0 && !std::isnan(norm(fin[k] - 1))) g = std::isnan(g) ? norm(fin[k] - 1) : std::max(g, norm(fin[k] - 1));
    const double usual = median_of(grads);
    if (have_grad && !(usual > 0 && g >= kGradJump * usual)) continue;
    Spike s{pts[fin[k]].step, pts[fin[k]].step, level, spread, pts[fin[k]].loss, have_grad ? g : std::nan(""), usual, pts[fin[k]].lr};
    for (; k + 1 < fin.size() && above(k + 1, kHoldSigmas, kHoldRise); ++k) {
      s.last_step = pts[fin[k + 1]].step;
      s.loss = std::max(s.loss, pts[fin[k + 1]].loss);
      if (have_grad) s.grad_norm = std::max(s.grad_norm, norm(fin[k + 1]));
    }
    out.push_back(s);
  }
  return out;
}

// Divergence: a loss that is not finite (null in metrics.jsonl, or a null gradient norm among
// numbers), or one rising over the last quarter of the logged steps (at least kTailSteps): a line
// fitted to it rises by over kTailRise of its start, with a slope over kTailT of its standard
// errors (a steady run's tail is flat or falling; independent noise alone puts t above 4 in about
// 2 of 10,000 tails of 30 steps).
constexpr std::size_t kTailSteps = 10;
constexpr double kTailRise = 0.05, kTailT = 4;

struct Divergence {
  std::optional<int64_t> nonfinite_step;  // the first logged step without a finite loss or norm
  std::optional<int64_t> tail_from, tail_to;
  double tail_start = 0, tail_end = 0, slope_t = 0;  // the fitted line's ends, slope / its error
};

std::optional<Divergence> find_divergence(const std::vector<LossPoint>& pts) {
  Divergence d;
  const bool have_grad = std::any_of(pts.begin(), pts.end(), [](const LossPoint& p) { return std::isfinite(p.grad_norm); });
  for (const LossPoint& p : pts) {
    if (!std::isfinite(p.loss) || (have_grad && !std::isfinite(p.grad_norm))) {
      d.nonfinite_step = p.step;
      break;
    }
  }
  std::vector<const LossPoint*> fin;
  for (const LossPoint& p : pts) {
    if (std::isfinite(p.loss)) fin.push_back(&p);
  }
  if (fin.size() >= 2 * kTailSteps) {
    const std::size_t m = std::max(kTailSteps, fin.size() / 4);
    const std::vector<const LossPoint*> tail(fin.end() - std::ptrdiff_t(m), fin.end());
    double mx = 0, my = 0;
    for (const LossPoint* p : tail) {
      mx += double(p->step);
      my += p->loss;
    }
    mx /= double(m);
    my /= double(m);
    double sxx = 0, sxy = 0;
    for (const LossPoint* p : tail) {
      sxx += (double(p->step) - mx) * (double(p->step) - mx);
      sxy += (double(p->step) - mx) * (p->loss - my);
    }
    if (sxx > 0) {
      const double slope = sxy / sxx;
      double sse = 0;
      for (const LossPoint* p : tail) sse += std::pow(p->loss - my - slope * (double(p->step) - mx), 2);
      const double se = std::sqrt(sse / double(m - 2) / sxx);
      const double x0 = double(tail.front()->step), x1 = double(tail.back()->step);
      const double y0 = my + slope * (x0 - mx), y1 = my + slope * (x1 - mx);
      const double t = se > 0 ? slope / se : slope > 0 ? std::numeric_limits<double>::infinity() : 0.0;
      if (t > kTailT && y1 - y0 > kTailRise * std::abs(y0)) {
        d.tail_from = tail.front()->step;
        d.tail_to = tail.back()->step;
        d.tail_start = y0;
        d.tail_end = y1;
        d.slope_t = t;
      }
    }
  }
  if (!d.nonfinite_step && !d.tail_from) return std::nullopt;
  return d;
}

// The change that steadies training, from the run's own settings: half the peak learning rate,
// twice the warm-up (or a twentieth of the run where there is none), and clipping where it is off.
std::string steadier(const Run& run, json& evidence) {
  const double lr = run.cfg("optimizer", "lr", 0.0), clip = run.cfg("optimizer", "grad_clip", 0.0);
  const int64_t warmup = run.cfg("schedule", "warmup_steps", int64_t(0)), steps = run.cfg("run", "steps", int64_t(0));
  const int64_t new_warmup = warmup > 0 ? 2 * warmup : std::max<int64_t>(10, steps / 20);
  evidence["lr"] = lr;
  evidence["warmup_steps"] = warmup;
  evidence["grad_clip"] = clip;
  std::string change = "--set optimizer.lr=" + fmt("%.3g", lr / 2) + " --set schedule.warmup_steps=" + std::to_string(new_warmup);
  if (clip <= 0) change += " --set optimizer.grad_clip=1.0";
  change += fmt(" (now lr %.3g", lr) + ", warmup " + std::to_string(warmup) + " steps, " +
            (clip > 0 ? fmt("gradient norm clipped at %.3g)", clip) : std::string("no clipping)"));
  return change;
}

std::optional<Finding> loss_spike(const Run& run, const std::vector<LossPoint>& pts) {
  const std::vector<Spike> spikes = find_spikes(pts);
  if (spikes.empty()) return std::nullopt;
  // The message names the largest (by its rise over its level) and the first.
  const Spike& s = *std::max_element(spikes.begin(), spikes.end(),
                                     [](const Spike& a, const Spike& b) { return a.loss / a.level < b.loss / b.level; });
  // Recovered: the median of the last five logged losses is back under the spike's hold threshold.
  std::vector<double> end;
  for (auto it = pts.rbegin(); it != pts.rend() && end.size() < 5; ++it) {
    if (std::isfinite(it->loss)) end.push_back(it->loss);
  }
  const double end_level = median_of(end);
  const bool recovered = end_level < s.level + std::max(kHoldSigmas * s.spread, kHoldRise * std::abs(s.level));
  Finding f;
  f.id = "loss_spike";
  f.severity = !recovered ? "high" : s.loss > 1.25 * s.level ? "medium" : "low";
  json list = json::array();
  for (std::size_t i = 0; i < spikes.size() && i < 5; ++i) {
    const Spike& x = spikes[i];
    list.push_back({{"first_step", x.first_step},
                    {"last_step", x.last_step},
                    {"loss_before", x.level},
                    {"loss", x.loss},
                    {"sigmas", (x.loss - x.level) / x.spread},
                    {"grad_norm", std::isfinite(x.grad_norm) ? json(x.grad_norm) : json(nullptr)},
                    {"grad_norm_before", x.usual_grad_norm},
                    {"lr_at_spike", std::isfinite(x.lr) ? json(x.lr) : json(nullptr)}});
  }
  f.evidence = {{"spikes", list}, {"spike_count", spikes.size()}, {"loss_at_end", end_level}};
  const std::string where = s.first_step == s.last_step
                                ? "at step " + std::to_string(s.first_step)
                                : "over steps " + std::to_string(s.first_step) + "-" + std::to_string(s.last_step);
  f.message = fmt("the loss jumped from %.4g", s.level) + fmt(" to %.4g ", s.loss) + where +
              fmt(" (%.0f standard deviations above its level over the previous logged steps)", (s.loss - s.level) / s.spread);
  if (std::isfinite(s.grad_norm)) {
    f.message += fmt(" with the gradient norm at %.3g", s.grad_norm) + fmt(" (%.3g before)", s.usual_grad_norm);
  } else if (std::isinf(s.grad_norm)) {
    f.message += fmt(" with a gradient norm that was not finite (%.3g before)", s.usual_grad_norm);
  }
  if (spikes.size() > 1) {
    f.message += "; " + std::to_string(spikes.size()) + " spikes in all, the first at step " + std::to_string(spikes[0].first_step);
  }
  f.message +=
      recovered ? fmt("; it came back (%.4g at the end)", end_level) : fmt("; it has not come back (%.4g at the end)", end_level);
  f.change = steadier(run, f.evidence);
  return f;
}

std::optional<Finding> diverged(const Run& run, const std::vector<LossPoint>& pts) {
  const std::optional<Divergence> d = find_divergence(pts);
  if (!d) return std::nullopt;
  Finding f;
  f.id = "diverged";
  f.severity = "high";
  std::vector<std::string> what;
  if (d->nonfinite_step) {
    f.evidence["nonfinite_step"] = *d->nonfinite_step;
    what.push_back("the loss or gradient norm is not finite (null in metrics.jsonl) from step " + std::to_string(*d->nonfinite_step));
  }
  if (d->tail_from) {
    f.evidence["rising_from_step"] = *d->tail_from;
    f.evidence["rising_to_step"] = *d->tail_to;
    f.evidence["fitted_loss_start"] = d->tail_start;
    f.evidence["fitted_loss_end"] = d->tail_end;
    f.evidence["slope_t"] = d->slope_t;
    what.push_back("the loss rises over the last logged steps: a line fitted to steps " + std::to_string(*d->tail_from) + "-" +
                   std::to_string(*d->tail_to) + fmt(" goes from %.4g", d->tail_start) + fmt(" to %.4g", d->tail_end) +
                   fmt(" (slope %.1f standard errors above zero)", d->slope_t));
  }
  f.message = "training diverged: " + what[0] + (what.size() > 1 ? "; " + what[1] : std::string());
  f.change = steadier(run, f.evidence);
  return f;
}

// The loss of predicting every token uniformly is ln V. A logged loss over it by more than
// kUniformMargin of it, past the first kUniformGrace logged steps (the initial loss sits at about ln V
// by construction), means the updates undid everything the model had learned: a learning rate too
// large for the model, its batch or its warm-up.
constexpr double kUniformMargin = 0.05;
constexpr std::size_t kUniformGrace = 1;

// The median of the last `n` finite logged losses.
double loss_at_end(const std::vector<LossPoint>& pts, std::size_t n = 5) {
  std::vector<double> end;
  for (auto it = pts.rbegin(); it != pts.rend() && end.size() < n; ++it) {
    if (std::isfinite(it->loss)) end.push_back(it->loss);
  }
  return median_of(end);
}

std::optional<Finding> above_uniform(const Run& run, const std::vector<LossPoint>& pts) {
  const int64_t vocab = run.info.value("vocab_size", int64_t(0));
  if (vocab < 2) return std::nullopt;  // a run directory written before run.json recorded it
  const double uniform = std::log(double(vocab));
  const LossPoint* worst = nullptr;
  std::size_t over = 0;
  for (std::size_t i = kUniformGrace; i < pts.size(); ++i) {
    if (!std::isfinite(pts[i].loss) || pts[i].loss <= uniform * (1 + kUniformMargin)) continue;
    ++over;
    if (worst == nullptr || pts[i].loss > worst->loss) worst = &pts[i];
  }
  if (worst == nullptr) return std::nullopt;
  const double end = loss_at_end(pts);
  const bool still = end > uniform;
  Finding f;
  f.id = "above_uniform";
  f.severity = still ? "high" : "medium";
  f.evidence = {{"uniform_loss", uniform},
                {"vocab_size", vocab},
                {"worst_step", worst->step},
                {"worst_loss", worst->loss},
                {"steps_above", over},
                {"loss_at_end", end},
                {"grad_norm_at_worst", std::isfinite(worst->grad_norm) ? json(worst->grad_norm) : json(nullptr)}};
  f.message = fmt("the loss rose to %.4g", worst->loss) + " at step " + std::to_string(worst->step) +
              fmt(", above ln %.0f", double(vocab)) + fmt(" = %.4g, the loss of predicting every token uniformly", uniform) + " (" +
              std::to_string(over) + " logged step(s) over it)" +
              (std::isfinite(worst->grad_norm) ? fmt(", gradient norm %.3g", worst->grad_norm) : std::string()) +
              ": those updates undid what the model had learned; " +
              (still ? fmt("it ends at %.4g, still above it", end) : fmt("it ends at %.4g", end));
  f.change = steadier(run, f.evidence);
  return f;
}

// A warm-up blow-up: while the learning rate is still rising (steps up to schedule.warmup_steps),
// the loss climbs over the first logged loss by more than kWarmupRise of it and stays over it by
// kWarmupHold at the next logged step. A healthy warm-up only lowers the loss from where the
// initialisation puts it; the learning rate reached by then is too large for the model.
constexpr double kWarmupRise = 0.15, kWarmupHold = 0.05;

std::optional<Finding> warmup_blowup(const Run& run, const std::vector<LossPoint>& pts) {
  const int64_t warmup = run.cfg("schedule", "warmup_steps", int64_t(0));
  std::vector<const LossPoint*> fin;
  for (const LossPoint& p : pts) {
    if (std::isfinite(p.loss)) fin.push_back(&p);
  }
  if (warmup <= 0 || fin.size() < 3) return std::nullopt;
  const double first = fin[0]->loss;
  const LossPoint* peak = nullptr;
  for (std::size_t i = 1; i + 1 < fin.size() && fin[i]->step <= warmup; ++i) {
    if (fin[i]->loss > first * (1 + kWarmupRise) && fin[i + 1]->loss > first * (1 + kWarmupHold) &&
        (peak == nullptr || fin[i]->loss > peak->loss)) {
      peak = fin[i];
    }
  }
  if (peak == nullptr) return std::nullopt;
  const double end = loss_at_end(pts);
  Finding f;
  f.id = "warmup_blowup";
  f.severity = end > first ? "high" : "medium";
  f.evidence = {{"first_loss", first},
                {"peak_step", peak->step},
                {"peak_loss", peak->loss},
                {"lr_at_peak", std::isfinite(peak->lr) ? json(peak->lr) : json(nullptr)},
                {"grad_norm_at_peak", std::isfinite(peak->grad_norm) ? json(peak->grad_norm) : json(nullptr)},
                {"loss_at_end", end}};
  f.message = "during the warm-up (" + std::to_string(warmup) + fmt(" steps) the loss rose from %.4g", first) +
              fmt(" to %.4g", peak->loss) + " at step " + std::to_string(peak->step) +
              (std::isfinite(peak->lr) ? fmt(" with the learning rate at %.3g", peak->lr) : std::string()) +
              (std::isfinite(peak->grad_norm) ? fmt(" and the gradient norm at %.3g", peak->grad_norm) : std::string()) +
              ": a warm-up only lowers the loss from where the initialisation puts it, so the rate reached there is too "
              "large" +
              fmt("; the loss ends at %.4g", end);
  f.change = steadier(run, f.evidence);
  return f;
}

// The validation loss stops improving while the training loss falls: at least kPlateauEvals
// evaluations after the best one, the last over it by kPlateauRise of it, and the training loss
// (the median of the kPlateauWindow logged losses up to each point) lower at the end than at the
// best evaluation by kPlateauFall of it. The model fits its training data and no longer what it is
// evaluated on (it memorises, or the evaluation has saturated): more steps buy nothing.
constexpr std::size_t kPlateauEvals = 2, kPlateauWindow = 5;
constexpr double kPlateauRise = 0.01, kPlateauFall = 0.03;

std::optional<Finding> eval_plateau(const Run& run) {
  std::vector<std::pair<int64_t, double>> val;
  std::vector<std::pair<int64_t, double>> train;
  for (const json& m : run.steps) {
    const int64_t step = m["step"].get<int64_t>();
    if (m.contains("val_loss") && m["val_loss"].is_number()) val.emplace_back(step, m["val_loss"].get<double>());
    if (m.contains("loss") && m["loss"].is_number()) train.emplace_back(step, m["loss"].get<double>());
  }
  if (val.size() < kPlateauEvals + 2) return std::nullopt;
  const auto best = std::min_element(val.begin(), val.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const std::size_t after = std::size_t(val.end() - best) - 1;
  const auto& last = val.back();
  if (after < kPlateauEvals || !(last.second > best->second * (1 + kPlateauRise))) return std::nullopt;
  const auto train_at = [&](int64_t step) {  // the median of the logged training losses up to `step`
    std::vector<double> w;
    for (auto it = train.rbegin(); it != train.rend() && w.size() < kPlateauWindow; ++it) {
      if (it->first <= step) w.push_back(it->second);
    }
    return median_of(w);
  };
  const double train_best = train_at(best->first), train_last = train_at(last.first);
  if (!(train_last < train_best * (1 - kPlateauFall))) return std::nullopt;
  Finding f;
  f.id = "eval_plateau";
  f.severity = "medium";
  f.evidence = {{"best_val_step", best->first},   {"best_val_loss", best->second},    {"last_val_step", last.first},
                {"last_val_loss", last.second},   {"train_loss_at_best", train_best}, {"train_loss_at_end", train_last},
                {"evaluations_after_best", after}};
  f.message = fmt("the validation loss has not improved since step %.0f", double(best->first)) + fmt(" (%.4g; ", best->second) +
              std::to_string(after) + fmt(" evaluations since, the last %.4g", last.second) + " at step " +
              std::to_string(last.first) + fmt(") while the training loss fell from %.4g", train_best) + fmt(" to %.4g", train_last) +
              ": the model fits its training data, not what it is evaluated on";
  f.change = "--set run.steps=" + std::to_string(best->first) +
             " (where the validation loss was best), or more data or "
             "regularisation (--set model.dropout=0.1, a larger optimizer.adamw.weight_decay)";
  return f;
}

// An evaluation whose primary metric (summary.json's evals) has not improved over its last
// kStallEvals evaluations while the training loss fell by kPlateauFall: what the run still learns
// is not what the task measures. The first such evaluation, with its numbers.
constexpr std::size_t kStallEvals = 3;

std::optional<Finding> eval_stalled(const Run& run) {
  if (!run.summary.contains("evals")) return std::nullopt;
  const json evals = run.summary["evals"];
  for (const auto& [label, e] : evals.items()) {
    const std::string metric = e.value("primary", ""), key = "eval/" + label + "/" + metric;
    const bool higher = e.value("higher_is_better", true);
    std::vector<std::pair<int64_t, double>> points, train;
    for (const json& m : run.steps) {
      const int64_t step = m["step"].get<int64_t>();
      if (m.contains(key) && m[key].is_number()) points.emplace_back(step, m[key].get<double>());
      if (m.contains("loss") && m["loss"].is_number()) train.emplace_back(step, m["loss"].get<double>());
    }
    if (points.size() < kStallEvals + 2) continue;
    const auto better = [&](double a, double b) { return higher ? a > b : a < b; };
    auto best = points.begin();
    for (auto it = points.begin(); it != points.end(); ++it) {
      if (better(it->second, best->second)) best = it;
    }
    const std::size_t after = std::size_t(points.end() - best) - 1;
    if (after < kStallEvals) continue;
    const auto train_at = [&](int64_t step) {  // the median of the logged training losses up to `step`
      std::vector<double> w;
      for (auto it = train.rbegin(); it != train.rend() && w.size() < kPlateauWindow; ++it) {
        if (it->first <= step) w.push_back(it->second);
      }
      return median_of(w);
    };
    const double train_best = train_at(best->first), train_last = train_at(points.back().first);
    if (!(train_last < train_best * (1 - kPlateauFall))) continue;
    Finding f;
    f.id = "eval_stalled";
    f.severity = "low";
    f.evidence = {{"eval", label},
                  {"metric", metric},
                  {"best_step", best->first},
                  {"best", best->second},
                  {"last_step", points.back().first},
                  {"last", points.back().second},
                  {"evaluations_after_best", after},
                  {"train_loss_at_best", train_best},
                  {"train_loss_at_end", train_last}};
    f.message = "the evaluation " + label + " has not improved its " + metric + fmt(" since step %.0f", double(best->first)) +
                fmt(" (%.4g; ", best->second) + std::to_string(after) +
                fmt(" evaluations since, the last %.4g", points.back().second) +
                fmt(") while the training loss fell from %.4g", train_best) + fmt(" to %.4g", train_last) +
                ": what the run still learns is not what " + label + " measures";
    f.change = "--set run.steps=" + std::to_string(best->first) + " reaches the same " + label + " " + metric +
               " sooner; or look at the task (`ablate eval --checkpoint " + run.dir.string() + " --eval " + label +
               " --details items.jsonl`) and at what the training data teaches";
    return f;
  }
  return std::nullopt;
}

// The run's settings the findings below read: its config's choices and run.json's ranks and memory.
struct Settings {
  std::string device, batching, attention, optimizer;
  // What the device answered (run.json's device_capabilities): it computes in the host's memory
  // (a CPU), and it has reduced-precision matrix units (a GPU's tensor cores).
  bool host_memory = true, reduced_precision = false;
  std::vector<std::string> other_attention;  // attention backends registered for the run's device, besides its own
  int64_t B = 1, accum = 1, world = 1, workers = 1, prefetch = 4;
  double lr = 0;
  double mem = 0, peak = 0;  // the memory budget and the highest logged peak, in bytes
};

// Reads the settings from the run's config, run.json and metrics.
Settings settings_of(const Run& run) {
  Settings s;
  s.device = run.cfg("run", "device", std::string("cpu"));
  s.batching = run.cfg("batching", "name", std::string(defaults::batcher));
  s.attention = run.cfg("attention", "name", std::string(defaults::attention));
  if (const auto it = run.info.find("device_capabilities"); it != run.info.end() && it->is_object()) {
    s.host_memory = it->value("host_memory", true);
    s.reduced_precision = it->value("reduced_precision_products", false);
  } else {  // a run directory written before run.json recorded them: the two devices there were
    s.host_memory = s.device == "cpu";
    s.reduced_precision = s.device == "cuda";
  }
  if (const auto it = run.info.find("plugins"); it != run.info.end() && it->is_array()) {
    for (const json& p : *it) {
      if (!p.is_object() || p.value("kind", "") != "attention" || p.value("name", "") == s.attention) continue;
      const json devices = p.value("devices", json::array());
      if (devices.is_array() && std::find(devices.begin(), devices.end(), json(s.device)) != devices.end()) {
        s.other_attention.push_back(p.value("name", ""));
      }
    }
  }
  s.optimizer = run.cfg("optimizer", "name", std::string(defaults::optimizer));
  s.B = run.cfg("batching", "batch_size", int64_t(1));
  s.accum = run.cfg("run", "grad_accum_steps", int64_t(1));
  s.world = run.info.value("world", int64_t(1));  // data-parallel ranks
  s.lr = run.cfg("optimizer", "lr", 0.0);
  s.workers = run.cfg("data", "workers", int64_t(1));
  s.prefetch = run.cfg("data", "prefetch", int64_t(4));
  s.mem = run.info.value("memory_bytes", 0.0);
  s.peak = quantile(column(run.steps, "mem_peak_bytes", false), 1.0);
  return s;
}

// Padding: positions computed on that carry no target.
std::optional<Finding> padding(const Run& run, const Settings& s) {
  const double pad = median_of(column(run.steps, "padding_fraction", false));
  if (!(pad > 0.30)) return std::nullopt;
  Finding f;
  f.id = "padding";
  f.severity = pad > 0.5 ? "high" : "medium";
  f.expected_speedup = 1.0 / std::max(1e-6, 1.0 - pad);
  f.evidence = {{"padding_fraction", pad},
                {"real_fraction", 1.0 - pad},
                {"batching", s.batching},
                {"mfu", run.summary.value("mfu", json(nullptr))},
                {"effective_mfu", run.summary.value("effective_mfu", json(nullptr))}};
  if (s.batching != "packed") {
    f.message = fmt("%.1f%% of the positions computed are padding with `", 100 * pad) + s.batching +
                "` batching: packing documents into rows turns them into real tokens, " +
                fmt("about %.2fx the real tokens/s at the same step time", *f.expected_speedup);
    f.change = "--set batching.name=packed";
  } else {
    f.message =
        fmt("%.1f%% of the positions are padding even with `packed` batching: rows end with space no document fits", 100 * pad);
    f.change = "raise batching.packed.max_segments_per_row, or a shorter batching.seq_len";
  }
  return f;
}

// Input-bound: the trainer waits for the data pipeline.
std::optional<Finding> input_bound(const Run& run, const Settings& s, const Timing& timing) {
  const double wait = median_of(column(run.steps, "data_wait_pct", true));
  if (!(wait > 10.0)) return std::nullopt;
  Finding f;
  f.id = "input_bound";
  f.severity = wait > 30 ? "high" : "medium";
  f.expected_speedup = 1.0 / std::max(1e-6, 1.0 - wait / 100.0);
  const std::string stage = run.summary.value("data_bottleneck", std::string("read"));
  f.evidence = {{"data_wait_pct", wait}, {"slowest_stage", stage}, {"workers", s.workers}, {"prefetch", s.prefetch}};
  f.message = fmt("the trainer waits for data %.1f%% of each step (median); the slowest pipeline stage is `", wait) + stage + "`" +
              (stage == "read"    ? " (reading or generating documents)"
               : stage == "batch" ? " (forming batches)"
                                  : "");
  f.change = "--set data.workers=" + std::to_string(std::max<int64_t>(2, s.workers * 2)) +
             " --set data.prefetch=" + std::to_string(std::max<int64_t>(8, s.prefetch * 2));
  if (timing.unusable) qualify(f);
  return f;
}

// Memory headroom: a larger micro-batch fits, and it would run faster. Only a memory-bound run
// gains: a GPU whose products reach under kMemoryBoundMfu of its peak at this micro-batch spends
// its steps on what a step costs whatever its size (reading the weights, launching kernels, the
// optimizer's pass), which more rows per step amortise. A CPU computes its products at its cores'
// rate from a few dozen rows on (its memory keeps up with its arithmetic): a larger micro-batch
// there changes the optimisation, not the tokens/s. Unusable timings leave the MFU unknown.
std::optional<Finding> memory_headroom(const Run& run, const Settings& s, const Timing& timing) {
  constexpr double kMemoryBoundMfu = 0.3;
  const double mem = s.mem, peak = s.peak;
  const int64_t B = s.B, accum = s.accum, world = s.world;
  const double act = run.info.value("activation_bytes", 0.0);
  const double mfu = run.summary.value("mfu", -1.0);
  const bool memory_bound = !s.host_memory && mfu >= 0 && mfu < kMemoryBoundMfu && !timing.unusable;
  if (!(memory_bound && mem > 0 && peak > 0 && peak < 0.5 * mem && act > 0 && B > 0)) return std::nullopt;
  const double per_row = act / double(B);
  int64_t nb = B;
  while (nb < B * 64 && peak + double(nb * 2 - B) * per_row <= 0.8 * mem) nb *= 2;
  if (nb <= B) return std::nullopt;
  Finding f;
  f.id = "memory_headroom";
  f.severity = "low";
  const int64_t new_accum = std::max<int64_t>(1, (B * accum + nb - 1) / nb);
  f.evidence = {{"mem_peak_bytes", peak},
                {"memory_bytes", mem},
                {"memory_source", run.info.value("memory_source", std::string())},
                {"peak_fraction", peak / mem},
                {"activation_bytes_per_row", per_row},
                {"batch_size", B},
                {"suggested_batch_size", nb},
                {"grad_accum_steps", accum},
                {"lr", s.lr},
                {"mfu", mfu},
                {"memory_bound_below_mfu", kMemoryBoundMfu}};
  f.message = fmt("the GPU reaches %.1f%% of its peak (MFU) at this micro-batch, and peak memory ", 100 * mfu) + gib(peak) +
              fmt(" is %.1f%% of ", 100 * peak / mem) + gib(mem) + " (" + run.info.value("memory_source", std::string("memory")) +
              "): micro-batch " + std::to_string(nb) + " instead of " + std::to_string(B) + " fits (estimated from " +
              fmt("%.1f MiB", per_row / (1 << 20)) +
              " of activations per row) and spreads each step's fixed costs over more rows; `ablate tune batch-size` "
              "measures the gain";
  const std::string bs = "--set batching.batch_size=" + std::to_string(nb);
  if (nb <= B * accum) {
    f.change = bs + " --set run.grad_accum_steps=" + std::to_string(new_accum) + " (the same global batch of " +
               std::to_string(world * B * accum) + " rows: the lr stays)";
  } else {
    const double lr_global = s.lr * std::sqrt(double(nb) / double(B * accum));
    f.change = bs + " --set run.grad_accum_steps=1 --set optimizer.lr=" + fmt("%.3g", lr_global) + " (the global batch grows from " +
               std::to_string(world * B * accum) + " to " + std::to_string(world * nb) +
               " rows: this lr is the square-root rule's suggestion, to verify with a short run at it and at the "
               "current lr, not a rule)";
    f.evidence["sqrt_scaled_lr"] = lr_global;
  }
  return f;
}

// Memory tight: the peak near the budget, and recomputation would free activations.
std::optional<Finding> memory_tight(const Run& run, const Settings& s) {
  const double mem = s.mem, peak = s.peak;
  const std::string recompute = run.info.value("recompute", std::string("none"));
  if (!(mem > 0 && peak > 0.85 * mem && run.info.contains("activation_bytes_by_recompute"))) return std::nullopt;
  const json& by = run.info["activation_bytes_by_recompute"];
  const std::string next = recompute == "none" ? "mlp" : recompute == "mlp" ? "block" : "";
  const double now = by.value(recompute, 0.0), then = next.empty() ? 0.0 : by.value(next, 0.0);
  Finding f;
  f.id = "memory_tight";
  f.severity = peak > 0.95 * mem ? "high" : "medium";
  f.evidence = {{"mem_peak_bytes", peak},
                {"memory_bytes", mem},
                {"peak_fraction", peak / mem},
                {"recompute", recompute},
                {"activation_bytes", now}};
  f.message = "peak memory " + gib(peak) + fmt(" is %.1f%% of ", 100 * peak / mem) + gib(mem) + " (" +
              run.info.value("memory_source", std::string("memory")) + ")";
  if (!next.empty() && then > 0 && then < now) {
    f.evidence["recompute_suggested"] = next;
    f.evidence["activation_bytes_suggested"] = then;
    f.message += ": recomputing " + std::string(next == "mlp" ? "the MLPs' hidden activations" : "each block") +
                 " in backward frees " + fmt("%.1f MiB", (now - then) / (1 << 20)) + fmt(" of %.1f MiB", now / (1 << 20)) +
                 " of activations for about " + (next == "mlp" ? "a sixth" : "a fifth") + " more time per token (docs/training.md)";
    f.change = "--set run.recompute=" + next;
  } else {
    f.message += ": lower batching.batch_size, with run.grad_accum_steps keeping the global batch";
    f.change = "--set batching.batch_size=" + std::to_string(std::max<int64_t>(1, s.B / 2)) +
               " --set run.grad_accum_steps=" + std::to_string(s.accum * 2);
  }
  return f;
}

// Attention: a naive backend on a device with its own memory, where another backend is registered
// for the device (one that, unlike the naive ones, never materialises the score matrices).
std::optional<Finding> attention(const Settings& s) {
  if (s.host_memory || s.attention.rfind("naive", 0) != 0) return std::nullopt;
  std::string better;
  for (const std::string& name : s.other_attention) {
    if (name.rfind("naive", 0) != 0) {
      better = name;
      break;
    }
  }
  if (better.empty()) return std::nullopt;
  Finding f;
  f.id = "attention";
  f.severity = "high";
  f.evidence = {{"device", s.device}, {"attention", s.attention}, {"registered_for_device", s.other_attention}};
  f.message = "`" + s.attention + "` materialises every score matrix in the device's memory; `" + better + "` never does";
  f.change = "--set attention.name=" + better;
  return f;
}

// Precision: a GPU run in fp32 or tf32, where bf16 products run at the tensor cores' bf16 rate
// and hold the activations only products read at half the bytes.
std::optional<Finding> precision(const Run& run, const Settings& s) {
  const std::string dtype = run.cfg("run", "dtype", std::string("fp32"));
  if (!(s.reduced_precision && !holds_bf16(dtype))) return std::nullopt;
  const std::string gpu = run.info.value("device_name", std::string());
  const double tf32 = peak_tflops_for_device(gpu, "tf32"), bf16 = peak_tflops_for_device(gpu, "bf16");
  Finding f;
  f.id = "precision";
  f.severity = dtype == "fp32" ? "high" : "medium";
  f.evidence = {{"device", s.device}, {"device_name", gpu}, {"dtype", dtype}};
  f.message = "run.dtype = \"" + dtype + "\" on a GPU: " +
              (dtype == "fp32" ? "true fp32 products, without tensor cores" : "TF32 products, at half the bf16 tensor-core rate") +
              "; bf16 products (fp32 master weights, gradients and optimizer state) also hold the activations only "
              "products read at half the bytes";
  if (tf32 > 0 && bf16 > 0) {  // the device table knows this GPU
    f.evidence["peak_tflops_tf32"] = tf32;
    f.evidence["peak_tflops_bf16"] = bf16;
    f.message += fmt(" (this GPU's dense peaks: TF32 %.0f", tf32) + fmt(", bf16 %.0f TFLOP/s)", bf16);
  }
  f.change = "--set run.dtype=bf16";
  return f;
}

// FP8 saturation: under delayed scaling a tensor whose magnitude outgrew the amax history's has its
// largest values clipped to the format's largest (metrics' fp8_saturated, counted in the
// quantising pass). A shorter history follows the growth sooner; current scaling never clips.
std::optional<Finding> fp8_saturation(const Run& run) {
  const std::vector<double> sat = column(run.steps, "fp8_saturated", false);
  const std::vector<double> worst = column(run.steps, "fp8_saturated_worst", false);
  double total = 0, most = 0;
  int64_t steps = 0;
  for (double v : sat) {
    total += v;
    steps += v > 0 ? 1 : 0;
  }
  for (double v : worst) most = std::max(most, v);
  if (steps == 0) return std::nullopt;
  const double share = double(steps) / double(sat.size());
  const int64_t history = run.cfg("run", "fp8_amax_history", int64_t(16));
  Finding f;
  f.id = "fp8_saturation";
  f.severity = share > 0.05 ? "medium" : "low";
  f.evidence = {{"saturated_values", total},
                {"steps_saturating", steps},
                {"steps_logged", int64_t(sat.size())},
                {"worst_tensor_step", most},
                {"fp8_amax_history", history}};
  f.message = fmt("FP8 delayed scaling clipped %.0f values", total) + fmt(" to the format's largest in %.0f", double(steps)) +
              fmt(" of %.0f logged steps", double(sat.size())) + fmt(" (at most %.0f in one tensor in a step)", most) +
              ": tensors grew past the scale their amax history of " + std::to_string(history) + " steps set";
  f.change = history > 1 ? "--set run.fp8_amax_history=" + std::to_string(std::max<int64_t>(1, history / 4))
                         : std::string("--set run.fp8_scaling=current");
  return f;
}

// Optimizer memory.
std::optional<Finding> optimizer_memory(const Run& run, const Settings& s) {
  const double mem = s.mem;
  const double state = run.summary.value("optimizer_state_bytes", run.steps.back().value("optimizer_state_bytes", 0.0));
  if (!(mem > 0 && state > 0.25 * mem && s.optimizer != "adamw8bit")) return std::nullopt;
  Finding f;
  f.id = "optimizer_memory";
  f.severity = "medium";
  f.evidence = {{"optimizer_state_bytes", state}, {"memory_bytes", mem}, {"state_fraction", state / mem}, {"optimizer", s.optimizer}};
  f.message = "the optimizer state (" + gib(state) + fmt(") is %.0f%% of the memory", 100 * state / mem) +
              ": 8-bit block-wise state takes about 0.27x of it";
  f.change = "--set optimizer.name=adamw8bit";
  return f;
}

// Communication: a data-parallel step spends much of its time in collectives (the gradient
// exchange, and waiting there for the slowest rank). Its cost per step is fixed by the gradient's
// size, so more accumulation per exchange amortises it.
std::optional<Finding> communication(const Run& run, const Settings& s, const Timing& timing) {
  const double comm = median_of(column(run.steps, "comm_pct", true));
  const double step_ms = median_of(column(run.steps, "step_ms", true));
  if (!(comm > 15.0 && step_ms > 0)) return std::nullopt;
  const double c = step_ms * comm / 100.0, w = std::max(1e-9, step_ms - c);
  const int64_t k = std::clamp<int64_t>(int64_t(std::ceil(9.0 * c / w)), 2, 64);  // brings it to 10%
  Finding f;
  f.id = "communication";
  f.severity = comm > 30 ? "high" : "medium";
  f.expected_speedup = double(k) * (c + w) / (c + double(k) * w);
  const double lr_new = s.lr * std::sqrt(double(k));
  f.evidence = {{"comm_pct", comm},
                {"step_ms", step_ms},
                {"world", s.world},
                {"communicator", run.info.value("communicator", std::string())},
                {"grad_accum_steps", s.accum},
                {"accumulation_factor", k},
                {"sqrt_scaled_lr", lr_new}};
  f.message = fmt("%.1f%% of each step (median) is spent in collectives across ", comm) + std::to_string(s.world) +
              " ranks: the gradient exchange, and waiting there for the slowest rank. Its cost is fixed per step, so "
              "more micro-batches per exchange amortise it";
  f.change = "--set run.grad_accum_steps=" + std::to_string(s.accum * k) + " --set optimizer.lr=" + fmt("%.3g", lr_new) +
             " (the global batch grows " + std::to_string(k) +
             "x: the square-root rule's lr, a suggestion to verify "
             "with a short run), or fewer ranks with more threads each";
  if (timing.unusable) qualify(f);
  return f;
}

// Whether run.cuda_graph would be accepted for the run (engine.cpp's require_capturable, read from
// its resolved config and run.json): one rank, a communicator that moves no data, one micro-batch,
// adamw unsharded, no dropout (nor an adapter's), no FP8 delayed scaling.
bool can_capture_steps(const Run& run, const Settings& s) {
  const std::string adapter = run.cfg("adapter", "name", std::string());
  const double adapter_dropout = adapter.empty() ? 0.0 : run.config["adapter"][adapter]["dropout"].value_or(0.0);
  const std::string dtype = run.cfg("run", "dtype", std::string("fp32"));
  const bool delayed_fp8 = dtype.rfind("fp8", 0) == 0 && run.cfg("run", "fp8_scaling", std::string("current")) == "delayed";
  return s.world == 1 && run.info.value("communicator", std::string("single")) == "single" && s.accum == 1 &&
         (s.optimizer == "adamw" || s.optimizer == "adamw_fused") && !run.cfg("optimizer", "shard_state", false) &&
         run.cfg("model", "dropout", 0.0) == 0.0 && adapter_dropout == 0.0 && !delayed_fp8;
}

// Launch-bound: the host issues a step's kernels no faster than the GPU runs them, so the GPU waits
// between them (many short kernels: a small model or micro-batch). `host_pct` is the host's issuing
// time over the step's own (the engine's StepOutcome::issue_s), logged only where nothing inside
// the step waits for the device and the device runs its work from a queue; an emulated device runs
// each kernel as it is issued, so its share says nothing. A step at high MFU is the GPU's work (a
// queue full of long kernels also holds the host back), not the launches'.
std::optional<Finding> launch_bound(const Run& run, const Settings& s, const Timing& timing) {
  constexpr double kLaunchBoundHostPct = 85.0, kBusyMfu = 0.3;
  const std::vector<double> pcts = column(run.steps, "host_pct", true);
  if (pcts.empty() || s.host_memory || run.info.value("device_name", std::string()).find("emulated") != std::string::npos) {
    return std::nullopt;
  }
  const double host = median_of(pcts);
  const auto mfu_it = run.summary.find("mfu");
  const double mfu = mfu_it != run.summary.end() && mfu_it->is_number() ? mfu_it->get<double>() : -1.0;
  if (!(host >= kLaunchBoundHostPct) || mfu >= kBusyMfu) return std::nullopt;
  Finding f;
  f.id = "launch_bound";
  f.severity = host >= 95.0 ? "high" : "medium";
  f.evidence = {{"host_pct", host},
                {"step_ms", median_of(column(run.steps, "step_ms", true))},
                {"batch_size", s.B},
                {"mfu", mfu >= 0 ? json(mfu) : json(nullptr)}};
  f.message = fmt("the host takes %.0f%% of each step (median) to issue its kernels: the GPU finishes each one before the "
                  "next arrives and waits (launch-bound: many short kernels, a small model or micro-batch)",
                  host);
  const std::string batch = "--set batching.batch_size=" + std::to_string(2 * s.B) +
                            " (each kernel does twice the work, their number stays the same: up to 2x the tokens/s while "
                            "the GPU still waits for the host), if memory allows";
  // A captured step replays the launches as one graph, where the run allows it and is not doing so
  // already.
  const bool graph = !run.cfg("run", "cuda_graph", false) && can_capture_steps(run, s);
  f.evidence["cuda_graph"] = run.cfg("run", "cuda_graph", false);
  f.change = graph ? "--set run.cuda_graph=true (each step replayed as one captured graph where its batch layout repeats: "
                     "dense rows); or " +
                         batch
                   : batch;
  if (timing.unusable) qualify(f);
  return f;
}

// Unstable step time (the first step and steps that ran an evaluation are left out); where the
// timings are unusable, noisy_timings has said it.
std::optional<Finding> step_jitter(const Run& run, const Settings& s, const Timing& timing) {
  std::vector<double> ms;
  for (std::size_t i : timed_steps(run.steps)) ms.push_back(run.steps[i]["step_ms"].get<double>());
  if (!(ms.size() >= 8 && !timing.unusable)) return std::nullopt;
  const double p50 = quantile(ms, 0.5), p90 = quantile(ms, 0.9), mx = quantile(ms, 1.0);
  const Spread sp = spread_of(ms);
  const double mean = sp.mean, cv = sp.cv.value_or(0.0);
  if (!(cv > 0.15 || p90 > 1.3 * p50)) return std::nullopt;
  Finding f;
  f.id = "step_jitter";
  f.severity = cv > 0.5 ? "medium" : "low";
  if (mean > p50 * 1.01) f.expected_speedup = mean / p50;
  f.evidence = {{"step_ms_p50", p50},   {"step_ms_p90", p90}, {"step_ms_max", mx},
                {"step_ms_mean", mean}, {"cv", cv},           {"steps", ms.size()}};
  f.message = fmt("step time is unstable: median %.1f ms, ", p50) + fmt("p90 %.1f ms, ", p90) + fmt("max %.1f ms ", mx) +
              fmt("(coefficient of variation %.2f)", cv);
  f.change = s.host_memory ? "give the run the machine (other processes share its cores), or --set run.threads=N below "
                             "the core count; batching by similar lengths (bucketed) steadies padded step times"
                           : "look for host synchronisation and data waits in slow steps; bucketed or packed batching "
                             "steadies step times";
  return f;
}

// Every finding for the run, ranked: by severity, then by expected speed-up (ties keep this order).
std::vector<Finding> diagnose(const Run& run) {
  const Settings s = settings_of(run);
  // Whether the timings can be trusted; the training's stability; then the run's speed and memory.
  const Timing timing = judge_timing(run);
  const std::vector<LossPoint> losses = loss_points(run.steps);
  const std::optional<Finding> found[] = {noisy_timings(timing, s.host_memory),
                                          diverged(run, losses),
                                          loss_spike(run, losses),
                                          above_uniform(run, losses),
                                          warmup_blowup(run, losses),
                                          eval_plateau(run),
                                          eval_stalled(run),
                                          padding(run, s),
                                          input_bound(run, s, timing),
                                          memory_headroom(run, s, timing),
                                          memory_tight(run, s),
                                          attention(s),
                                          precision(run, s),
                                          fp8_saturation(run),
                                          optimizer_memory(run, s),
                                          communication(run, s, timing),
                                          launch_bound(run, s, timing),
                                          step_jitter(run, s, timing)};
  std::vector<Finding> out;
  for (const std::optional<Finding>& f : found) {
    if (f) out.push_back(*f);
  }
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    if (severity_rank(a.severity) != severity_rank(b.severity)) return severity_rank(a.severity) < severity_rank(b.severity);
    return a.expected_speedup.value_or(1.0) > b.expected_speedup.value_or(1.0);
  });
  return out;
}

}  // namespace

int cmd_doctor(const Args& args) {
  po::options_description desc("ablate doctor RUN_DIR [--json]");
  po::positional_options_description pos;
  desc.add_options()("run", po::value<std::string>()->required(), "run directory")("json", "print the findings as JSON");
  pos.add("run", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate doctor RUN_DIR [--json]")) return 0;
  const Run run = load_run(vm["run"].as<std::string>());
  const std::vector<Finding> findings = diagnose(run);
  if (vm.count("json")) {
    json arr = json::array();
    for (const Finding& f : findings) {
      json j = {{"id", f.id}, {"severity", f.severity}, {"message", f.message}, {"change", f.change}, {"evidence", f.evidence}};
      if (f.expected_speedup) j["expected_speedup"] = *f.expected_speedup;
      arr.push_back(j);
    }
    std::cout << json_text(arr, 2) << "\n";
    return 0;
  }
  std::cout << "doctor: " << run.dir.string() << " (" << run.cfg("run", "device", std::string("cpu")) << ", " << run.steps.size()
            << " logged steps, batching " << run.cfg("batching", "name", std::string("?")) << ", attention "
            << run.cfg("attention", "name", std::string("?")) << ", optimizer " << run.cfg("optimizer", "name", std::string("?"))
            << ")\n";
  if (findings.empty()) {
    std::cout << "nothing found: the loss (no spike, no divergence, never above a uniform prediction, no warm-up blow-up, "
                 "validation still improving), timings, padding, data wait, memory, attention backend, "
                 "precision, optimizer memory, kernel launches and step time all look healthy\n";
    return 0;
  }
  int i = 0;
  for (const Finding& f : findings) {
    std::cout << "\n" << ++i << ". [" << f.severity << "] " << f.id << ": " << f.message << "\n";
    std::cout << "   evidence: ";
    bool first = true;
    for (const auto& [k, v] : f.evidence.items()) {
      std::cout << (first ? "" : ", ") << k << "=" << (v.is_number_float() ? fmt("%.4g", v.get<double>()) : json_text(v));
      first = false;
    }
    std::cout << "\n   change:   " << f.change;
    if (f.expected_speedup) std::cout << fmt("\n   expected: %.2fx", *f.expected_speedup);
    std::cout << "\n";
  }
  return 0;
}

}  // namespace ablate::cli
