// `ablate sweep` and `ablate report`: an ablation study as one command. A sweep file names a base
// experiment, overrides applied to every arm, and a grid (the cross product of its axes), an
// explicit list of arms, or a random search over ranges. Each arm is an ordinary run directory
// under the sweep's directory, trained by a child `ablate train` process (so one arm's crash cannot
// take the others with it): here (the local launcher) or as a Slurm array task (sweep_slurm.cpp).
// The sweep then gathers every arm's summary into results.csv / results.json and writes the report.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/atomic_file.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/runtime/trainer.hpp"
#include "commands.hpp"
#include "json_read.hpp"
#include "report.hpp"
#include "sweep.hpp"

namespace ablate::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace sweep;

namespace {

// arms.json's `peak_tflops_set`: the peak an earlier start of the sweep measured and gave every
// arm as `--set metrics.peak_tflops=TEXT`; anything but a number > 0 there is an input error.
std::string peak_tflops_text(const fs::path& arms_json, const std::string& text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v <= 0) {
    throw_input_error(arms_json.string(),
                      "field 'peak_tflops_set' is string \"" + echo_value(text) + "\"; expected the text of a number > 0 (TFLOP/s)");
  }
  return text;
}

json arm_overrides_json(const Arm& a) {
  json o = json::object();
  for (const Override& x : a.overrides) o[x.key] = x.label;
  return o;
}

// One arm's plan: its `--set`s (common, then its own but the slurm.* ones, then the repeat's seed,
// then the jsonl logger the report reads), checked by loading the experiment they make.
ArmPlan plan_arm(const Sweep& s, const Arm& a, const fs::path& out, const std::string& launcher) {
  ArmPlan p;
  p.arm = a;
  p.dir = out / a.name;
  p.overrides = arm_overrides_json(a);
  const std::string where = s.file.string() + " arm '" + a.name + "'";
  if (launcher == "local" && a.resources.ranks() > 1) {
    throw_input_error(where, "asks for " + std::to_string(a.resources.ranks()) +
                                 " ranks (slurm.nodes x slurm.tasks_per_node); the local launcher trains one process per "
                                 "arm: use --launcher slurm");
  }
  for (const Override& o : s.common) p.sets.push_back(o.key + "=" + o.value);
  for (const Override& o : a.overrides) {
    if (o.key.rfind("slurm.", 0) != 0) p.sets.push_back(o.key + "=" + o.value);
  }
  Registry registry;
  registry.load_directories(Registry::default_search_path());
  try {
    const RunSpec spec = RunSpec::from(Config::load(s.base, p.sets, registry));
    if (s.repeats > 1) p.sets.push_back("run.seed=" + std::to_string(int64_t(spec.run.seed) + a.repeat));
    std::vector<std::string> sinks;
    for (const Choice& sink : spec.loggers) sinks.push_back(sink.name);
    if (std::find(sinks.begin(), sinks.end(), "jsonl") == sinks.end()) {
      sinks.push_back("jsonl");  // the report reads metrics.jsonl
      p.sets.push_back("logging.sinks=" + join(sinks, ","));
    }
    p.steps = spec.run.steps;
    p.eval_every = spec.run.eval_every;
  } catch (const Error& e) {
    throw_input_error(where, e.what());
  }
  if (s.early_stop.enabled()) {
    if (p.eval_every <= 0) {
      throw_input_error(where, "sweep.early_stop compares validation losses, and this arm never evaluates (run.eval_every = 0)");
    }
    if (s.early_stop.rungs.back() >= p.steps) {
      throw_input_error(where, "sweep.early_stop's last rung (step " + std::to_string(s.early_stop.rungs.back()) +
                                   ") is not before the arm's last step (run.steps = " + std::to_string(p.steps) + ")");
    }
  }
  return p;
}

// One peak for every arm, so that their MFU columns compare: the base's [metrics] peak_tflops, or
// on the CPU the matrix-product rate measured once here (kept in arms.json for reruns).
std::string set_common_peak(const Sweep& s, const fs::path& out, std::vector<ArmPlan>& plans) {
  // What an earlier start of this sweep recorded; damaged is an input error, before anything is written.
  const std::optional<json> earlier = read_json_file_if_present(out / "arms.json", kArmsJson);
  Registry registry;
  registry.load_directories(Registry::default_search_path());
  const RunSpec spec = RunSpec::from(Config::load(s.base, plans.front().sets, registry));
  // Other devices have a table of peaks. No device is made to ask: a GPU context would stay held by
  // this process while every arm trains.
  if (spec.peak_tflops > 0 || spec.run.device != "cpu") return "";
  const RunContext run = spec.context();
  std::string peak_text;
  if (earlier && earlier->contains("peak_tflops_set")) {
    peak_text = peak_tflops_text(out / "arms.json", (*earlier)["peak_tflops_set"].get<std::string>());
  } else {
    const Session session(spec, registry, run);
    const std::unique_ptr<Model> model = session.model(session.data_source()->vocab_size());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", model->measure_matmul_tflops());
    peak_text = buf;
  }
  for (ArmPlan& p : plans) {
    const bool own =
        std::any_of(p.arm.overrides.begin(), p.arm.overrides.end(), [](const Override& o) { return o.key == "metrics.peak_tflops"; });
    if (!own) p.sets.push_back("metrics.peak_tflops=" + peak_text);
  }
  return peak_text;
}

void write_arms_json(const Sweep& s, const fs::path& out, const std::vector<ArmPlan>& plans, const std::string& peak_text) {
  json order = {{"name", s.name}, {"base", s.base.string()}, {"axes", s.axes}, {"repeats", s.repeats}, {"arms", json::array()}};
  if (!peak_text.empty()) order["peak_tflops_set"] = peak_text;
  if (!s.baseline.empty()) order["baseline"] = s.baseline;
  if (s.search == "random") order["search"] = {{"method", "random"}, {"seed", s.random.seed}, {"samples", s.random.samples}};
  if (s.early_stop.enabled()) {
    order["early_stop"] = {{"rungs", s.early_stop.rungs}, {"fraction", s.early_stop.fraction}, {"min_arms", s.early_stop.min_arms}};
  }
  order["launcher"] = s.launcher;
  for (const ArmPlan& p : plans) order["arms"].push_back(p.arm.name);
  // Each arm group's expected speed-up over the group listed before it ([[sweep.arms]] expected).
  json expected = json::object();
  for (const ArmPlan& p : plans) {
    if (p.arm.expected > 0) expected[p.arm.group] = p.arm.expected;
  }
  if (!expected.empty()) order["expected"] = expected;
  write_json_file(out / "arms.json", order);
}

void print_arms(const Sweep& s, const fs::path& out, const std::vector<ArmPlan>& plans) {
  std::cout << "sweep '" << s.name << "': " << plans.size() << " arm(s) from " << s.base.string() << " into " << out.string();
  if (s.search == "random") std::cout << " (random search, seed " << s.random.seed << ")";
  std::cout << "\n";
  for (const ArmPlan& p : plans) {
    std::cout << "  " << p.arm.name << ":";
    for (const std::string& x : p.sets) std::cout << " " << x;
    if (p.arm.resources.ranks() > 1 || s.launcher == "slurm") {
      std::cout << " [slurm: " << p.arm.resources.nodes << " node(s) x " << p.arm.resources.tasks_per_node << " task(s)]";
    }
    std::cout << "\n";
  }
}

int finish_local(const fs::path& out, const ReportOptions& report, std::size_t failed, std::size_t total) {
  write_sweep_results(out);
  try {
    write_report(out, report);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::input) throw;  // a damaged file: exit 2 naming it (results.csv is written)
    spdlog::warn("report: {}", e.what());
  }
  std::cout << "results: " << (out / "results.csv").string() << ", report: " << (out / "report.md").string() << "\n";
  if (failed > 0) {
    spdlog::error("{} of {} arm(s) failed; their errors are in results.csv and each arm's train.log", failed, total);
    return 1;
  }
  return 0;
}

// `ablate sweep --status DIR|SWEEP.toml`: the sweep directory it names.
fs::path status_dir(const po::variables_map& vm, const std::vector<std::string>& sets) {
  const fs::path given = vm["sweep"].as<std::string>();
  if (fs::is_directory(given)) return given;
  const Sweep s = read_sweep(given, sets);
  return vm.count("out") ? fs::path(vm["out"].as<std::string>()) : fs::path("sweeps") / s.name;
}

}  // namespace

int cmd_sweep(const Args& args) {
  po::options_description desc("ablate sweep SWEEP.toml [--out DIR] [--parallel N] [--launcher local|slurm] [--status]");
  po::positional_options_description pos;
  desc.add_options()("sweep", po::value<std::string>()->required(), "sweep file (TOML); with --status also a sweep directory")(
      "out", po::value<std::string>(), "sweep directory (default: sweeps/<sweep.name>)")(
      "parallel", int_option("parallel", 1, 64)->default_value(1), "arms trained at once (local launcher)")(
      "launcher", po::value<std::string>(), "local (this machine) or slurm (one sbatch job array); default: sweep.launcher")(
      "status", "show each arm's state (Slurm's queue, the run directories) and stop")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a [sweep] or [slurm] key: KEY=VALUE (repeatable)")(
      "dry-run", "list the arms and their overrides, validate them, and stop");
  add_report_options(desc);
  pos.add("sweep", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm,
                    "ablate sweep SWEEP.toml [--out DIR] [--parallel N] [--launcher local|slurm] [--set KEY=VALUE] [--status] "
                    "[--dry-run] [--smooth W] [--log-y] [--color-by FACTOR] [--style-by FACTOR]")) {
    return 0;
  }
  std::vector<std::string> sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>();
  if (vm.count("status")) return slurm_status(status_dir(vm, sets));
  if (vm.count("launcher")) {
    const std::string l = vm["launcher"].as<std::string>();
    if (l != "local" && l != "slurm") throw_input_error("--launcher '" + echo_value(l) + "'", "expected local or slurm");
    sets.push_back("sweep.launcher=\"" + l + "\"");
  }
  const int parallel = int(vm["parallel"].as<int64_t>());
  const Sweep s = read_sweep(vm["sweep"].as<std::string>(), sets);
  // The report's options are checked against the sweep's axes now, not after the arms have run.
  const ReportOptions report = report_options(vm);
  resolve_report_factors(report, s.axes, "sweep " + s.file.string());
  const fs::path out = vm.count("out") ? fs::path(vm["out"].as<std::string>()) : fs::path("sweeps") / s.name;
  check_output_directory(out, "the sweep directory");

  // Every arm's experiment is validated before any arm runs: a typo fails now, not an hour in.
  std::vector<ArmPlan> plans;
  for (const Arm& a : s.arms) plans.push_back(plan_arm(s, a, out, s.launcher));
  for (const ArmPlan& p : plans) check_output_directory(p.dir, "an arm's run directory");
  const std::string peak_text = set_common_peak(s, out, plans);
  print_arms(s, out, plans);
  if (vm.count("dry-run")) return 0;

  fs::create_directories(out);
  const DirectoryLock lock(out, "the sweep directory");  // one sweep (or submission) per directory at a time
  for (ArmPlan& p : plans) decide_start(p);              // reads every arm's files before anything is written
  write_file_atomic(out / "sweep.toml", read_regular_file(s.file, "sweep file", kMaxExperimentBytes));
  write_arms_json(s, out, plans, peak_text);
  write_plan(out, s, plans);
  if (s.launcher == "slurm") return submit_slurm(s, out, plans);
  for (const ArmPlan& p : plans) clear_for_restart(p);
  const std::size_t failed = run_local(s, plans, parallel);
  return finish_local(out, report, failed, plans.size());
}

int cmd_report(const Args& args) {
  po::options_description desc("ablate report DIR");
  po::positional_options_description pos;
  desc.add_options()("dir", po::value<std::string>()->required(), "a run directory or a sweep directory");
  add_report_options(desc);
  pos.add("dir", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate report DIR [--smooth W] [--log-y] [--color-by FACTOR] [--style-by FACTOR]")) {
    return 0;
  }
  const fs::path dir = vm["dir"].as<std::string>();
  const ReportOptions options = report_options(vm);
  if (fs::exists(dir / "arms.json")) write_sweep_results(dir);
  const fs::path md = write_report(dir, options);
  std::cout << md.string() << "\n";
  return 0;
}

}  // namespace ablate::cli
