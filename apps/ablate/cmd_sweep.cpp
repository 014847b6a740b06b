// `ablate sweep` and `ablate report`: an ablation study as one command. A sweep file names a base
// experiment, overrides applied to every arm, and either a grid (the cross product of its axes) or
// an explicit list of arms. Each arm is an ordinary run directory under the sweep's directory,
// trained by a child `ablate train` process (so one arm's crash cannot take the others with it);
// the sweep then gathers every arm's summary into results.csv / results.json and writes the report.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "ablate/atomic_file.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/model.hpp"
#include "ablate/pipeline.hpp"
#include "ablate/trainer.hpp"
#include "ablate/safetensors.hpp"
#include "commands.hpp"
#include "json_read.hpp"
#include "report.hpp"

extern char** environ;

namespace ablate::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// arms.json's `peak_tflops_set`: the peak an earlier start of the sweep measured and gave every
// arm as `--set metrics.peak_tflops=TEXT`; anything but a number > 0 there is an input error.
std::string peak_tflops_text(const fs::path& arms_json, const std::string& text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v <= 0) {
    throw_input_error(arms_json.string(), "field 'peak_tflops_set' is string \"" + echo_value(text) +
                                              "\"; expected the text of a number > 0 (TFLOP/s)");
  }
  return text;
}

std::string where(const std::string& file, const toml::source_region& r) {
  return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// A TOML value as the text `--set` takes (strings quoted, so "1" stays a string).
std::string value_text(const toml::node& v) {
  if (v.is_floating_point()) {  // the shortest text that reads back as the same double
    char buf[64];
    const double d = v.as_floating_point()->get();
    const auto r = std::to_chars(buf, buf + sizeof buf, d);
    std::string t(buf, r.ptr);
    if (std::isfinite(d) && t.find_first_of(".eE") == std::string::npos) t += ".0";
    return t;
  }
  std::ostringstream s;
  v.visit([&](auto&& x) { s << x; });
  return s.str();
}

// A short, file-name-safe rendering of a value for arm names: letters, digits, '.', '_', '-', and
// never "." or ".." (which would name the sweep directory or its parent).
std::string value_label(const toml::node& v) {
  std::string t = v.is_string() ? v.as_string()->get() : value_text(v);
  std::string out;
  for (char c : t) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (out == "." || out == "..") out = std::string(out.size(), '_');
  return out.empty() ? "x" : out;
}

// Sweeps larger than this are refused before their arms are listed (each arm is a training run).
constexpr double kMaxArms = 10000;

struct Override {
  std::string key;    // "batching.name"
  std::string value;  // TOML text
  std::string label;  // "packed"
};

struct Arm {
  std::string name;  // directory name
  std::string group; // name without the repeat suffix (what the report aggregates over)
  int repeat = 0;
  std::vector<Override> overrides;  // the arm's own (grid or list), not the common ones
};

struct Sweep {
  fs::path file;
  fs::path base;
  std::string name;
  int repeats = 1;
  std::string baseline;          // the arm group the report compares the others with ("": the first)
  std::vector<Override> common;  // [sweep.set]
  std::vector<std::string> axes;
  std::vector<Arm> arms;
};

// An arm's name is its directory inside the sweep's: never one of the files the sweep and its
// report write there, never hidden (the lock, temporary files), and short enough for a file name
// with its repeat suffix.
void require_arm_name(const std::string& file, const std::string& name) {
  static const std::set<std::string> reserved = {"arms.json",   "results.json",   "results.csv",       "report.md",
                                                 "sweep.toml",  "loss_vs_step.png", "loss_vs_time.png", "throughput.png",
                                                 "padding.png", "loss_vs_real_tokens.png"};
  constexpr std::size_t kMaxArmName = 128;
  if (name.front() == '.' || reserved.count(name) > 0) {
    throw_input_error(file + " arm '" + echo_value(name) + "'",
                      "the name is taken by a file the sweep writes in its directory (or is hidden, like .lock): choose "
                      "another with `name = ...` in [[sweep.arms]]");
  }
  if (name.size() > kMaxArmName) {
    throw_input_error(file + " arm '" + echo_value(name) + "'",
                      "the name is " + std::to_string(name.size()) + " bytes; an arm's directory name may be at most " +
                          std::to_string(kMaxArmName) + ": give the arms shorter names with [[sweep.arms]] name = ...");
  }
}

Sweep read_sweep(const fs::path& file) {
  // Only a regular file (a FIFO would wait forever, /dev/zero never end), a few KB of TOML.
  const std::string text = read_regular_file(file, "sweep file", kMaxExperimentBytes);
  toml::table root;
  try {
    root = toml::parse(text, file.string());
  } catch (const toml::parse_error& e) {
    throw_input_error(where(file.string(), e.source()), std::string(e.description()));
  }
  const std::string f = file.string();
  Sweep s;
  s.file = file;
  for (const auto& [k, v] : root) {
    if (k != "base" && k != "sweep") {
      throw_input_error(where(f, v.source()), "unknown key '" + std::string(k.str()) + "' (a sweep file has `base` and [sweep])");
    }
  }
  const toml::node* base = root.get("base");
  if (base == nullptr || !base->is_string()) {
    throw_input_error(f, "missing `base = \"path/to/experiment.toml\"` (the experiment every arm starts from)");
  }
  const fs::path b = base->as_string()->get();
  // Relative to the sweep file first, then to the working directory.
  const fs::path beside = file.parent_path() / b;
  if (b.is_relative() && fs::exists(beside)) s.base = beside;
  else if (fs::exists(b)) s.base = b;
  else throw_input_error(where(f, base->source()) + " base", "'" + b.string() + "' exists neither beside the sweep file (" +
                                                                 beside.string() + ") nor in the working directory");

  const toml::table* sw = root.get_as<toml::table>("sweep");
  s.name = file.stem().string();
  toml::table empty;
  if (sw == nullptr) sw = &empty;
  for (const auto& [k, v] : *sw) {
    const std::string key(k.str());
    if (key != "name" && key != "repeats" && key != "baseline" && key != "set" && key != "grid" && key != "arms") {
      throw_input_error(where(f, v.source()), "unknown key 'sweep." + key + "' (expected name, repeats, baseline, set, grid, arms)");
    }
  }
  if (const toml::node* n = sw->get("name")) {
    if (!n->is_string() || n->as_string()->get().empty()) throw_input_error(where(f, n->source()) + " sweep.name", "expected a non-empty string");
    s.name = n->as_string()->get();
    // It names the default output directory, sweeps/<name>: one plain path component.
    if (s.name == "." || s.name == ".." || s.name.find('/') != std::string::npos) {
      throw_input_error(where(f, n->source()) + " sweep.name", "'" + s.name + "' is not a plain directory name");
    }
  }
  if (const toml::node* n = sw->get("repeats")) {
    if (!n->is_integer() || n->as_integer()->get() < 1 || n->as_integer()->get() > 100) {
      throw_input_error(where(f, n->source()) + " sweep.repeats", "expected an integer in [1, 100]");
    }
    s.repeats = int(n->as_integer()->get());
  }
  auto overrides_of = [&](const toml::table& t, const std::string& path, bool allow_name) {
    std::vector<Override> out;
    for (const auto& [k, v] : t) {
      const std::string key(k.str());
      if (allow_name && key == "name") continue;
      if (std::count(key.begin(), key.end(), '.') < 1 || v.is_table()) {
        throw_input_error(where(f, v.source()) + " " + path + "." + key,
                          "expected a quoted dotted key such as \"optimizer.lr\" = 0.001");
      }
      out.push_back({key, value_text(v), value_label(v)});
    }
    return out;
  };
  if (const toml::node* n = sw->get("set")) {
    if (!n->is_table()) throw_input_error(where(f, n->source()) + " sweep.set", "expected a table of \"section.key\" = value");
    s.common = overrides_of(*n->as_table(), "sweep.set", false);
  }
  const toml::node* grid = sw->get("grid");
  const toml::node* arms = sw->get("arms");
  if (grid && arms) throw_input_error(where(f, arms->source()), "give either [sweep.grid] or [[sweep.arms]], not both");
  std::vector<Arm> base_arms;
  if (grid) {
    if (!grid->is_table()) throw_input_error(where(f, grid->source()) + " sweep.grid", "expected a table of \"section.key\" = [values]");
    double count = s.repeats;  // the product of the axes' lengths, counted before anything is listed
    for (const auto& [k, v] : *grid->as_table()) count *= v.is_array() ? double(std::max<std::size_t>(1, v.as_array()->size())) : 1.0;
    if (count > kMaxArms) {
      throw_input_error(where(f, grid->source()) + " sweep.grid", "makes " + std::to_string(int64_t(std::min(count, 9e18))) +
                                                                       " arms (with repeats); a sweep has at most 10000");
    }
    std::vector<Arm> acc(1);
    for (const auto& [k, v] : *grid->as_table()) {
      const std::string key(k.str());
      if (!v.is_array() || v.as_array()->empty()) {
        throw_input_error(where(f, v.source()) + " sweep.grid." + key, "expected a non-empty list of values");
      }
      if (std::count(key.begin(), key.end(), '.') < 1) {
        throw_input_error(where(f, v.source()) + " sweep.grid." + key, "expected a quoted dotted key such as \"batching.name\"");
      }
      s.axes.push_back(key);
      std::vector<Arm> next;
      for (const Arm& a : acc) {
        for (const toml::node& el : *v.as_array()) {
          Arm b2 = a;
          b2.overrides.push_back({key, value_text(el), value_label(el)});
          next.push_back(b2);
        }
      }
      acc = std::move(next);
    }
    base_arms = std::move(acc);
  } else if (arms) {
    if (!arms->is_array_of_tables()) throw_input_error(where(f, arms->source()) + " sweep.arms", "expected [[sweep.arms]] tables");
    if (double(arms->as_array()->size()) * s.repeats > kMaxArms) {
      throw_input_error(where(f, arms->source()) + " sweep.arms", std::to_string(arms->as_array()->size()) + " arms x " +
                                                                      std::to_string(s.repeats) + " repeats; a sweep has at most 10000");
    }
    std::set<std::string> keys;
    for (const toml::node& el : *arms->as_array()) {
      const toml::table& t = *el.as_table();
      Arm a;
      a.overrides = overrides_of(t, "sweep.arms", true);
      if (const toml::node* n = t.get("name")) {
        if (!n->is_string()) throw_input_error(where(f, n->source()) + " sweep.arms.name", "expected a string");
        a.name = value_label(*n);
      }
      for (const Override& o : a.overrides) keys.insert(o.key);
      base_arms.push_back(a);
    }
    s.axes.assign(keys.begin(), keys.end());
  } else {
    base_arms.push_back(Arm{});
  }
  // Names: given, or the values joined; made unique.
  std::map<std::string, int> seen;
  for (Arm& a : base_arms) {
    if (a.name.empty()) {
      for (const Override& o : a.overrides) a.name += (a.name.empty() ? "" : "-") + o.label;
      if (a.name.empty()) a.name = "base";
    }
    if (int n = seen[a.name]++; n > 0) a.name += "-" + std::to_string(n + 1);
  }
  for (const Arm& a : base_arms) require_arm_name(f, a.name);
  if (const toml::node* n = sw->get("baseline")) {
    std::string names;
    for (const Arm& a : base_arms) names += (names.empty() ? "" : ", ") + a.name;
    const auto named = [&](const Arm& a) { return n->is_string() && a.name == n->as_string()->get(); };
    if (std::none_of(base_arms.begin(), base_arms.end(), named)) {
      const std::string held = n->is_string() ? "'" + echo_value(n->as_string()->get()) + "' names no arm" : "is not a string";
      throw_input_error(where(f, n->source()) + " sweep.baseline",
                        held + "; expected the name of an arm without its repeat suffix, one of: " + echo_value(names, 400));
    }
    s.baseline = n->as_string()->get();
  }
  for (const Arm& a : base_arms) {
    for (int r = 0; r < s.repeats; ++r) {
      Arm x = a;
      x.group = a.name;
      x.repeat = r;
      if (s.repeats > 1) x.name = a.name + "-r" + std::to_string(r + 1);
      s.arms.push_back(x);
    }
  }
  return s;
}

fs::path self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw_runtime_error("sweep", "cannot find the ablate executable (/proc/self/exe)");
  return p;
}

// Everything `ablate train` is given for one arm, except --resume / --run-dir.
struct ArmPlan {
  Arm arm;
  std::vector<std::string> sets;  // "key=value", common then the arm's own then the repeat's seed
  json overrides;                  // the arm's own overrides, for results
  fs::path dir;
  bool done = false;
  bool resume = false;
  bool restart = false;  // an earlier attempt with other overrides is there: started afresh
};

json arm_overrides_json(const Arm& a) {
  json o = json::object();
  for (const Override& x : a.overrides) o[x.key] = x.label;
  return o;
}

std::string last_error_line(const fs::path& log) {
  std::string text;
  std::error_code ec;
  if (!fs::exists(log, ec)) return text;
  try {
    text = read_regular_file(log, "training log", kMaxLogBytes);
  } catch (const Error& e) {  // the arm's failure is recorded all the same
    return std::string("no error line: ") + e.what();
  }
  std::istringstream in(text);
  std::string line, last, any;
  while (std::getline(in, line)) {
    if (line.rfind("error: ", 0) == 0) last = line.substr(7);
    if (!line.empty()) any = line;
  }
  return last.empty() ? any : last;
}

pid_t spawn_train(const fs::path& exe, const Sweep& s, const ArmPlan& p) {
  std::vector<std::string> argv = {exe.string(), "train", s.base.string()};
  for (const std::string& x : p.sets) {
    argv.push_back("--set");
    argv.push_back(x);
  }
  argv.push_back("--run-dir");
  argv.push_back(p.dir.string());
  if (p.resume) argv.push_back("--resume");
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = (p.dir / "train.log").string();
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw_runtime_error("sweep", "cannot start " + exe.string() + ": " + std::strerror(rc));
  return pid;
}

void write_json_file(const fs::path& p, const json& j) { write_file_atomic(p, json_text(j, 2) + "\n"); }

}  // namespace

// ---------------------------------------------------------------------------------------------

int cmd_sweep(const Args& args) {
  po::options_description desc("ablate sweep SWEEP.toml [--out DIR] [--parallel N]");
  po::positional_options_description pos;
  desc.add_options()("sweep", po::value<std::string>()->required(), "sweep file (TOML)")(
      "out", po::value<std::string>(), "sweep directory (default: sweeps/<sweep.name>)")(
      "parallel", int_option("parallel", 1, 64)->default_value(1), "arms trained at once")(
      "dry-run", "list the arms and their overrides, validate them, and stop");
  add_report_options(desc);
  pos.add("sweep", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm,
                    "ablate sweep SWEEP.toml [--out DIR] [--parallel N] [--dry-run] [--smooth W] [--log-y] [--color-by FACTOR] "
                    "[--style-by FACTOR]")) {
    return 0;
  }
  const int parallel = int(vm["parallel"].as<int64_t>());
  const Sweep s = read_sweep(vm["sweep"].as<std::string>());
  // The report's options are checked against the sweep's axes now, not after the arms have run.
  const ReportOptions report = report_options(vm);
  resolve_report_factors(report, s.axes, "sweep " + s.file.string());
  const fs::path out = vm.count("out") ? fs::path(vm["out"].as<std::string>()) : fs::path("sweeps") / s.name;
  check_output_directory(out, "the sweep directory");

  // Every arm's experiment is validated before any arm runs: a typo fails now, not an hour in.
  std::vector<ArmPlan> plans;
  for (const Arm& a : s.arms) {
    ArmPlan p;
    p.arm = a;
    p.dir = out / a.name;
    p.overrides = arm_overrides_json(a);
    for (const Override& o : s.common) p.sets.push_back(o.key + "=" + o.value);
    for (const Override& o : a.overrides) p.sets.push_back(o.key + "=" + o.value);
    Registry registry;
    registry.load_directories(Registry::default_search_path());
    try {
      Config c = Config::load(s.base, p.sets, registry);
      if (s.repeats > 1) {
        p.sets.push_back("run.seed=" + std::to_string(c.section("run").get_int("seed") + a.repeat));
      }
      std::vector<std::string> sinks = c.selected_list("logging");
      if (std::find(sinks.begin(), sinks.end(), "jsonl") == sinks.end()) {
        sinks.push_back("jsonl");  // the report reads metrics.jsonl
        std::string list;
        for (const std::string& x : sinks) list += (list.empty() ? "" : ",") + x;
        p.sets.push_back("logging.sinks=" + list);
      }
    } catch (const Error& e) {
      throw_input_error(s.file.string() + " arm '" + a.name + "'", e.what());
    }
    plans.push_back(std::move(p));
  }
  // One peak for every arm, so that their MFU columns compare: the base's [metrics] peak_tflops, or
  // on the CPU the matrix-product rate measured once here (kept in arms.json for reruns).
  // What an earlier start of this sweep recorded; damaged is an input error, before anything is written.
  const std::optional<json> earlier = read_json_file_if_present(out / "arms.json", kArmsJson);
  std::string peak_text;
  {
    Registry registry;
    registry.load_directories(Registry::default_search_path());
    const Config c = Config::load(s.base, plans.front().sets, registry);
    if (c.section("metrics").get_float("peak_tflops") <= 0 && c.section("run").get_string("device") == "cpu") {
      if (earlier && earlier->contains("peak_tflops_set")) {
        peak_text = peak_tflops_text(out / "arms.json", (*earlier)["peak_tflops_set"].get<std::string>());
      } else {
        const RunContext run = training_context(c);
        auto source = make_data_source(c, registry, run);
        Model model(ModelOptions::from(c, source->vocab_size()), registry, run);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", model.measure_matmul_tflops());
        peak_text = buf;
      }
      for (ArmPlan& p : plans) {
        const bool own = std::any_of(p.arm.overrides.begin(), p.arm.overrides.end(),
                                     [](const Override& o) { return o.key == "metrics.peak_tflops"; });
        if (!own) p.sets.push_back("metrics.peak_tflops=" + peak_text);
      }
    }
  }
  std::cout << "sweep '" << s.name << "': " << plans.size() << " arm(s) from " << s.base.string() << " into " << out.string() << "\n";
  for (const ArmPlan& p : plans) {
    std::cout << "  " << p.arm.name << ":";
    for (const std::string& x : p.sets) std::cout << " " << x;
    std::cout << "\n";
  }
  if (vm.count("dry-run")) return 0;

  fs::create_directories(out);
  const DirectoryLock lock(out, "the sweep directory");  // one sweep per directory, for its whole life

  // Finished arms (same overrides, summary says completed) are skipped; an interrupted arm with a
  // checkpoint resumes from it; anything else starts afresh (its old log kept beside). Every arm's
  // files are read (typed: a damaged one is an input error naming it) before anything is written,
  // so that nothing is retrained over, or removed, on the strength of a file that did not read.
  for (ArmPlan& p : plans) {
    const auto arm = read_json_file_if_present(p.dir / "arm.json", kArmJson);
    const auto summary = read_json_file_if_present(p.dir / "summary.json", kSummaryJson);
    const bool same = arm && arm->value("sets", std::vector<std::string>()) == p.sets;
    if (same && summary && summary->value("status", "") == "completed") {
      read_jsonl_file_if_present(p.dir / "metrics.jsonl", kMetricsLine);  // the report reads it
      p.done = true;
    } else if (same && has_checkpoint(p.dir)) {  // latest, or a complete checkpoint it did not name yet
      p.resume = true;
    } else if (fs::exists(p.dir)) {
      if (has_checkpoint(p.dir)) {
        throw_input_error(p.dir.string(), "holds a run with other overrides than this sweep's arm '" + p.arm.name +
                                              "'; move it away or use another --out");
      }
      p.restart = true;
    }
  }
  write_file_atomic(out / "sweep.toml", read_regular_file(s.file, "sweep file", kMaxExperimentBytes));
  {
    json order = {{"name", s.name}, {"base", s.base.string()}, {"axes", s.axes}, {"repeats", s.repeats}, {"arms", json::array()}};
    if (!peak_text.empty()) order["peak_tflops_set"] = peak_text;
    if (!s.baseline.empty()) order["baseline"] = s.baseline;
    for (const ArmPlan& p : plans) order["arms"].push_back(p.arm.name);
    write_json_file(out / "arms.json", order);
  }
  for (const ArmPlan& p : plans) {
    if (!p.restart) continue;
    if (fs::exists(p.dir / "train.log")) fs::rename(p.dir / "train.log", p.dir / "train.previous.log");
    fs::remove(p.dir / "summary.json");
  }

  const fs::path exe = self_exe();
  using Clock = std::chrono::steady_clock;
  std::map<pid_t, std::pair<std::size_t, Clock::time_point>> running;
  std::size_t next = 0, finished = 0, failed = 0;
  const std::size_t total = plans.size();
  auto record = [&](ArmPlan& p, const std::string& status, int code, double wall, const std::string& error) {
    json a = {{"name", p.arm.name}, {"group", p.arm.group}, {"repeat", p.arm.repeat}, {"overrides", p.overrides},
              {"sets", p.sets},     {"status", status},     {"exit_code", code},      {"wall_s", wall}};
    if (!error.empty()) a["error"] = error;
    write_json_file(p.dir / "arm.json", a);
  };
  while (next < total || !running.empty()) {
    while (next < total && int(running.size()) < parallel) {
      ArmPlan& p = plans[next++];
      if (p.done) {
        ++finished;
        std::cout << "[" << finished << "/" << total << "] " << p.arm.name << ": already completed, skipped\n" << std::flush;
        continue;
      }
      fs::create_directories(p.dir);
      record(p, "running", 0, 0, "");
      const pid_t pid = spawn_train(exe, s, p);
      running[pid] = {next - 1, Clock::now()};
      std::cout << "      " << p.arm.name << ": training" << (p.resume ? " (resuming)" : "") << ", log " << (p.dir / "train.log").string()
                << "\n"
                << std::flush;
    }
    if (running.empty()) continue;
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw_runtime_error("sweep", std::string("waitpid: ") + std::strerror(errno));
    }
    auto it = running.find(pid);
    if (it == running.end()) continue;
    ArmPlan& p = plans[it->second.first];
    const double wall = std::chrono::duration<double>(Clock::now() - it->second.second).count();
    running.erase(it);
    ++finished;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    // The summary the arm's training wrote; one that does not read fails the arm, with the reason.
    std::optional<json> summary;
    std::string unreadable;
    try {
      summary = read_json_file_if_present(p.dir / "summary.json", kSummaryJson);
    } catch (const Error& e) {
      unreadable = e.what();
    }
    if (code == 0 && summary && summary->value("status", "") == "completed") {
      record(p, "completed", 0, wall, "");
      char line[256];
      std::snprintf(line, sizeof line, "loss %.4f, %.0f tok/s, %.1f s", summary->value("final_loss", std::nan("")),
                    summary->value("tokens_per_s", std::nan("")), wall);
      std::cout << "[" << finished << "/" << total << "] " << p.arm.name << ": done, " << line << "\n" << std::flush;
    } else {
      ++failed;
      std::string err = unreadable.empty() ? last_error_line(p.dir / "train.log") : unreadable;
      if (WIFSIGNALED(status)) err = "killed by signal " + std::to_string(WTERMSIG(status)) + (err.empty() ? "" : ": " + err);
      record(p, "failed", code, wall, err);
      std::cout << "[" << finished << "/" << total << "] " << p.arm.name << ": FAILED (exit " << code << "): " << err << "\n"
                << std::flush;
    }
  }

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
