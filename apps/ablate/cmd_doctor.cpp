// `ablate doctor RUN_DIR [--json]`: reads a run's resolved config, run.json, summary.json and
// metrics.jsonl and names what holds the run back, ranked, each finding with the numbers behind it
// and the change to make. The finding ids are stable: padding, input_bound, memory_headroom,
// attention, optimizer_memory, step_jitter.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

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
  std::string change;    // the change to make, as the user would type it
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

std::vector<Finding> diagnose(const Run& run) {
  std::vector<Finding> out;
  const std::string device = run.cfg("run", "device", std::string("cpu"));
  const std::string batching = run.cfg("batching", "name", std::string("packed"));
  const std::string attention = run.cfg("attention", "name", std::string("naive_cpu"));
  const std::string optimizer = run.cfg("optimizer", "name", std::string("adamw"));
  const int64_t B = run.cfg("batching", "batch_size", int64_t(1));
  const int64_t accum = run.cfg("run", "grad_accum_steps", int64_t(1));
  const int64_t world = run.info.value("world", int64_t(1));  // data-parallel ranks
  const double lr = run.cfg("optimizer", "lr", 0.0);
  const int64_t workers = run.cfg("data", "workers", int64_t(1));
  const int64_t prefetch = run.cfg("data", "prefetch", int64_t(4));

  // Padding: positions computed on that carry no target.
  const double pad = median_of(column(run.steps, "padding_fraction", false));
  if (pad > 0.30) {
    Finding f;
    f.id = "padding";
    f.severity = pad > 0.5 ? "high" : "medium";
    f.expected_speedup = 1.0 / std::max(1e-6, 1.0 - pad);
    f.evidence = {{"padding_fraction", pad}, {"real_fraction", 1.0 - pad}, {"batching", batching},
                  {"mfu", run.summary.value("mfu", json(nullptr))}, {"effective_mfu", run.summary.value("effective_mfu", json(nullptr))}};
    if (batching != "packed") {
      f.message = fmt("%.1f%% of the positions computed are padding with `", 100 * pad) + batching +
                  "` batching: packing documents into rows turns them into real tokens, " +
                  fmt("about %.2fx the real tokens/s at the same step time", *f.expected_speedup);
      f.change = "--set batching.name=packed";
    } else {
      f.message = fmt("%.1f%% of the positions are padding even with `packed` batching: rows end with space no document fits",
                      100 * pad);
      f.change = "raise batching.packed.max_segments_per_row, or a shorter batching.seq_len";
    }
    out.push_back(f);
  }

  // Input-bound: the trainer waits for the data pipeline.
  const double wait = median_of(column(run.steps, "data_wait_pct", true));
  if (wait > 10.0) {
    Finding f;
    f.id = "input_bound";
    f.severity = wait > 30 ? "high" : "medium";
    f.expected_speedup = 1.0 / std::max(1e-6, 1.0 - wait / 100.0);
    const std::string stage = run.summary.value("data_bottleneck", std::string("read"));
    f.evidence = {{"data_wait_pct", wait}, {"slowest_stage", stage}, {"workers", workers}, {"prefetch", prefetch}};
    f.message = fmt("the trainer waits for data %.1f%% of each step (median); the slowest pipeline stage is `", wait) + stage +
                "`" + (stage == "read" ? " (reading or generating documents)" : stage == "batch" ? " (forming batches)" : "");
    f.change = "--set data.workers=" + std::to_string(std::max<int64_t>(2, workers * 2)) +
               " --set data.prefetch=" + std::to_string(std::max<int64_t>(8, prefetch * 2));
    out.push_back(f);
  }

  // Memory headroom: a larger micro-batch fits.
  const double mem = run.info.value("memory_bytes", 0.0);
  const double peak = quantile(column(run.steps, "mem_peak_bytes", false), 1.0);
  const double act = run.info.value("activation_bytes", 0.0);
  if (mem > 0 && peak > 0 && peak < 0.5 * mem && act > 0 && B > 0) {
    const double per_row = act / double(B);
    int64_t nb = B;
    while (nb < B * 64 && peak + double(nb * 2 - B) * per_row <= 0.8 * mem) nb *= 2;
    if (nb > B) {
      Finding f;
      f.id = "memory_headroom";
      f.severity = "low";
      const int64_t new_accum = std::max<int64_t>(1, (B * accum + nb - 1) / nb);
      f.evidence = {{"mem_peak_bytes", peak},         {"memory_bytes", mem},
                    {"memory_source", run.info.value("memory_source", std::string())},
                    {"peak_fraction", peak / mem},    {"activation_bytes_per_row", per_row},
                    {"batch_size", B},                {"suggested_batch_size", nb},
                    {"grad_accum_steps", accum},      {"lr", lr}};
      f.message = "peak memory " + gib(peak) + fmt(" is %.1f%% of ", 100 * peak / mem) + gib(mem) + " (" +
                  run.info.value("memory_source", std::string("memory")) + "): micro-batch " + std::to_string(nb) +
                  " instead of " + std::to_string(B) + " fits (estimated from " + fmt("%.1f MiB", per_row / (1 << 20)) +
                  " of activations per row)";
      const std::string bs = "--set batching.batch_size=" + std::to_string(nb);
      if (nb <= B * accum) {
        f.change = bs + " --set run.grad_accum_steps=" + std::to_string(new_accum) + " (the same global batch of " +
                   std::to_string(world * B * accum) + " rows: the lr stays)";
      } else {
        const double lr_global = lr * std::sqrt(double(nb) / double(B * accum));
        f.change = bs + " --set run.grad_accum_steps=1 --set optimizer.lr=" + fmt("%.3g", lr_global) +
                   " (the global batch grows from " + std::to_string(world * B * accum) + " to " + std::to_string(world * nb) +
                   " rows: the lr by the square-root rule)";
        f.evidence["sqrt_scaled_lr"] = lr_global;
      }
      out.push_back(f);
    }
  }

  // Memory tight: the peak near the budget, and recomputation would free activations.
  const std::string recompute = run.info.value("recompute", std::string("none"));
  if (mem > 0 && peak > 0.85 * mem && run.info.contains("activation_bytes_by_recompute")) {
    const json& by = run.info["activation_bytes_by_recompute"];
    const std::string next = recompute == "none" ? "mlp" : recompute == "mlp" ? "block" : "";
    const double now = by.value(recompute, 0.0), then = next.empty() ? 0.0 : by.value(next, 0.0);
    Finding f;
    f.id = "memory_tight";
    f.severity = peak > 0.95 * mem ? "high" : "medium";
    f.evidence = {{"mem_peak_bytes", peak}, {"memory_bytes", mem}, {"peak_fraction", peak / mem},
                  {"recompute", recompute}, {"activation_bytes", now}};
    f.message = "peak memory " + gib(peak) + fmt(" is %.1f%% of ", 100 * peak / mem) + gib(mem) + " (" +
                run.info.value("memory_source", std::string("memory")) + ")";
    if (!next.empty() && then > 0 && then < now) {
      f.evidence["recompute_suggested"] = next;
      f.evidence["activation_bytes_suggested"] = then;
      f.message += ": recomputing " + std::string(next == "mlp" ? "the MLPs' hidden activations" : "each block") +
                   " in backward frees " + fmt("%.1f MiB", (now - then) / (1 << 20)) + fmt(" of %.1f MiB", now / (1 << 20)) +
                   " of activations for about " + (next == "mlp" ? "a sixth" : "a fifth") +
                   " more time per token (docs/training.md)";
      f.change = "--set run.recompute=" + next;
    } else {
      f.message += ": lower batching.batch_size, with run.grad_accum_steps keeping the global batch";
      f.change = "--set batching.batch_size=" + std::to_string(std::max<int64_t>(1, B / 2)) +
                 " --set run.grad_accum_steps=" + std::to_string(accum * 2);
    }
    out.push_back(f);
  }

  // Attention: the naive backend on a GPU.
  if (device == "cuda" && attention.rfind("naive", 0) == 0) {
    Finding f;
    f.id = "attention";
    f.severity = "high";
    f.evidence = {{"device", device}, {"attention", attention}};
    f.message = "`" + attention + "` materialises every score matrix on the GPU; cuDNN's flash attention never does";
    f.change = "--set attention.name=cudnn_flash";
    out.push_back(f);
  }

  // Precision: a GPU run in fp32 or tf32, where bf16 products run at the tensor cores' bf16 rate
  // and hold the activations only products read at half the bytes.
  const std::string dtype = run.cfg("run", "dtype", std::string("fp32"));
  if (device == "cuda" && dtype != "bf16") {
    const std::string gpu = run.info.value("device_name", std::string());
    const double tf32 = peak_tflops_for_device(gpu, "tf32"), bf16 = peak_tflops_for_device(gpu, "bf16");
    Finding f;
    f.id = "precision";
    f.severity = dtype == "fp32" ? "high" : "medium";
    f.evidence = {{"device", device}, {"device_name", gpu}, {"dtype", dtype}};
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
    out.push_back(f);
  }

  // Optimizer memory.
  const double state = run.summary.value("optimizer_state_bytes", run.steps.back().value("optimizer_state_bytes", 0.0));
  if (mem > 0 && state > 0.25 * mem && optimizer != "adamw8bit") {
    Finding f;
    f.id = "optimizer_memory";
    f.severity = "medium";
    f.evidence = {{"optimizer_state_bytes", state}, {"memory_bytes", mem}, {"state_fraction", state / mem}, {"optimizer", optimizer}};
    f.message = "the optimizer state (" + gib(state) + fmt(") is %.0f%% of the memory", 100 * state / mem) +
                ": 8-bit block-wise state takes about 0.27x of it";
    f.change = "--set optimizer.name=adamw8bit";
    out.push_back(f);
  }

  // Communication: a data-parallel step spends much of its time in collectives (the gradient
  // exchange, and waiting there for the slowest rank). Its cost per step is fixed by the gradient's
  // size, so more accumulation per exchange amortises it.
  const double comm = median_of(column(run.steps, "comm_pct", true));
  const double step_ms = median_of(column(run.steps, "step_ms", true));
  if (comm > 15.0 && step_ms > 0) {
    const double c = step_ms * comm / 100.0, w = std::max(1e-9, step_ms - c);
    const int64_t k = std::clamp<int64_t>(int64_t(std::ceil(9.0 * c / w)), 2, 64);  // brings it to 10%
    Finding f;
    f.id = "communication";
    f.severity = comm > 30 ? "high" : "medium";
    f.expected_speedup = double(k) * (c + w) / (c + double(k) * w);
    const double lr_new = lr * std::sqrt(double(k));
    f.evidence = {{"comm_pct", comm},     {"step_ms", step_ms}, {"world", world},
                  {"communicator", run.info.value("communicator", std::string())},
                  {"grad_accum_steps", accum}, {"accumulation_factor", k}, {"sqrt_scaled_lr", lr_new}};
    f.message = fmt("%.1f%% of each step (median) is spent in collectives across ", comm) + std::to_string(world) +
                " ranks: the gradient exchange, and waiting there for the slowest rank. Its cost is fixed per step, so "
                "more micro-batches per exchange amortise it";
    f.change = "--set run.grad_accum_steps=" + std::to_string(accum * k) + " --set optimizer.lr=" + fmt("%.3g", lr_new) +
               " (the global batch grows " + std::to_string(k) + "x: the lr by the square-root rule), or fewer ranks with "
               "more threads each";
    out.push_back(f);
  }

  // Unstable step time (the first step and steps that ran an evaluation are left out).
  std::vector<double> ms;
  for (std::size_t i = 1; i < run.steps.size(); ++i) {
    if (!run.steps[i].contains("val_loss") && run.steps[i].contains("step_ms")) ms.push_back(run.steps[i]["step_ms"].get<double>());
  }
  if (ms.size() >= 8) {
    const double p50 = quantile(ms, 0.5), p90 = quantile(ms, 0.9), mx = quantile(ms, 1.0);
    double mean = 0;
    for (double x : ms) mean += x;
    mean /= double(ms.size());
    double var = 0;
    for (double x : ms) var += (x - mean) * (x - mean);
    const double cv = std::sqrt(var / double(ms.size())) / mean;
    if (cv > 0.15 || p90 > 1.3 * p50) {
      Finding f;
      f.id = "step_jitter";
      f.severity = cv > 0.5 ? "medium" : "low";
      if (mean > p50 * 1.01) f.expected_speedup = mean / p50;
      f.evidence = {{"step_ms_p50", p50}, {"step_ms_p90", p90}, {"step_ms_max", mx}, {"step_ms_mean", mean}, {"cv", cv},
                    {"steps", ms.size()}};
      f.message = fmt("step time is unstable: median %.1f ms, ", p50) + fmt("p90 %.1f ms, ", p90) + fmt("max %.1f ms ", mx) +
                  fmt("(coefficient of variation %.2f)", cv);
      f.change = device == "cpu" ? "give the run the machine (other processes share its cores), or --set run.threads=N below "
                                   "the core count; batching by similar lengths (bucketed) steadies padded step times"
                                 : "look for host synchronisation and data waits in slow steps; bucketed or packed batching "
                                   "steadies step times";
      out.push_back(f);
    }
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
  std::cout << "doctor: " << run.dir.string() << " (" << run.cfg("run", "device", std::string("cpu")) << ", "
            << run.steps.size() << " logged steps, batching " << run.cfg("batching", "name", std::string("?")) << ", attention "
            << run.cfg("attention", "name", std::string("?")) << ", optimizer " << run.cfg("optimizer", "name", std::string("?"))
            << ")\n";
  if (findings.empty()) {
    std::cout << "nothing found: padding, data wait, memory headroom, attention backend, optimizer memory and step time all "
                 "look healthy\n";
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
