// The sweep file read into a Sweep (see sweep.hpp): every key checked, every error naming the file,
// line and key and what was expected.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/trainer.hpp"
#include "sweep.hpp"

namespace ablate::cli::sweep {

bool Resources::operator<(const Resources& o) const {
  return std::tie(nodes, tasks_per_node, gpus_per_node, cpus_per_task) <
         std::tie(o.nodes, o.tasks_per_node, o.gpus_per_node, o.cpus_per_task);
}

namespace {

std::string where(const std::string& file, const toml::source_region& r) {
  if (r.begin.line == 0 || (r.path && *r.path == "--set")) return "--set (for " + file + ")";
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
std::string label_of(const std::string& t) {
  std::string out;
  for (char c : t) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (out == "." || out == "..") out = std::string(out.size(), '_');
  return out.empty() ? "x" : out;
}
std::string value_label(const toml::node& v) { return label_of(v.is_string() ? v.as_string()->get() : value_text(v)); }

// Sweeps larger than this are refused before their arms are listed (each arm is a training run).
constexpr double kMaxArms = 10000;

// An arm's name is its directory inside the sweep's: never one of the files the sweep and its
// report write there, never hidden (the lock, temporary files), and short enough for a file name
// with its repeat suffix.
void require_arm_name(const std::string& file, const std::string& name) {
  static const std::set<std::string> reserved = {"arms.json",        "results.json",
                                                 "results.csv",      "report.md",
                                                 "sweep.toml",       "loss_vs_step.png",
                                                 "loss_vs_time.png", "throughput.png",
                                                 "padding.png",      "loss_vs_real_tokens.png",
                                                 "plan.json",        "slurm"};
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

// ---- command-line overrides of the sweep file -----------------------------------------------------

std::string toml_quoted(const std::string& text) {
  std::ostringstream s;
  s << toml::value<std::string>(text);
  return s.str();
}

// "slurm.time=00:30:00" into the parsed file: the value as TOML when it reads as one, else as a string.
void apply_set(toml::table& root, const std::string& set) {
  const auto eq = set.find('=');
  const std::string key = set.substr(0, eq);
  if (eq == std::string::npos || key.empty()) throw_input_error("--set '" + echo_value(set) + "'", "expected KEY=VALUE");
  const auto dot = key.find('.');
  const std::string section = key.substr(0, dot);
  if (dot == std::string::npos || (section != "sweep" && section != "slurm") || key.find('.', dot + 1) != std::string::npos) {
    throw_input_error("--set '" + echo_value(set) + "'",
                      "a sweep takes --set for its own [sweep] and [slurm] keys (e.g. slurm.time=00:30:00, "
                      "sweep.repeats=3); an experiment key goes in the sweep file's [sweep.set]");
  }
  const std::string text = set.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text, std::string_view("--set"));
  } catch (const toml::parse_error&) {
    parsed = toml::parse("v = " + toml_quoted(text), std::string_view("--set"));
  }
  toml::table* t = root.get_as<toml::table>(section);
  if (t == nullptr) {
    root.insert_or_assign(section, toml::table{});
    t = root.get_as<toml::table>(section);
  }
  t->insert_or_assign(key.substr(dot + 1), *parsed.get("v"));
}

// ---- the [slurm] section ---------------------------------------------------------------------------

int64_t int_in(const std::string& f, const toml::node& v, const std::string& key, int64_t lo, int64_t hi) {
  if (!v.is_integer() || v.as_integer()->get() < lo || v.as_integer()->get() > hi) {
    throw_input_error(where(f, v.source()) + " " + key,
                      "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v.as_integer()->get();
}

// A word that goes into an #SBATCH line: no white space, quotes or shell specials.
std::string sbatch_word(const std::string& f, const toml::node& v, const std::string& key, const std::string& pattern,
                        const std::string& expected) {
  if (!v.is_string() || !std::regex_match(v.as_string()->get(), std::regex(pattern))) {
    throw_input_error(where(f, v.source()) + " " + key, "expected " + expected);
  }
  return v.as_string()->get();
}

// A resource key, from [slurm] or an arm's "slurm.<key>"; false when `key` is none.
bool set_resource(Resources& r, const std::string& f, const std::string& key, const toml::node& v) {
  if (key == "nodes") r.nodes = int(int_in(f, v, "slurm.nodes", 1, 10000));
  else if (key == "tasks_per_node") r.tasks_per_node = int(int_in(f, v, "slurm.tasks_per_node", 1, 1024));
  else if (key == "gpus_per_node") r.gpus_per_node = int(int_in(f, v, "slurm.gpus_per_node", 0, 64));
  else if (key == "cpus_per_task") r.cpus_per_task = int(int_in(f, v, "slurm.cpus_per_task", 1, 1024));
  else return false;
  return true;
}

SlurmSpec read_slurm(const std::string& f, const toml::table* t, const std::string& sweep_name) {
  SlurmSpec s;
  s.job_name = "ablate-" + sweep_name;
  if (t == nullptr) return s;
  const std::string word = "^[A-Za-z0-9_.,:@+-]+$";
  for (const auto& [k, v] : *t) {
    const std::string key(k.str());
    const std::string full = "slurm." + key;
    if (set_resource(s.resources, f, key, v)) continue;
    if (key == "partition") s.partition = sbatch_word(f, v, full, word, "a partition name (letters, digits, _.,:@+-)");
    else if (key == "account") s.account = sbatch_word(f, v, full, word, "an account name (letters, digits, _.,:@+-)");
    else if (key == "job_name") s.job_name = sbatch_word(f, v, full, word, "a job name (letters, digits, _.,:@+-)");
    else if (key == "time")
      s.time =
          sbatch_word(f, v, full, "^([0-9]+-)?[0-9]+(:[0-9]+){0,2}$", "a time limit such as \"30\", \"02:00:00\" or \"1-12:00:00\"");
    else if (key == "mpi") s.mpi = sbatch_word(f, v, full, "^[a-z0-9_]+$", "srun's --mpi type, e.g. \"pmix\" or \"pmi2\"");
    else if (key == "max_parallel") s.max_parallel = int(int_in(f, v, full, 0, 10000));
    else if (key == "warning_seconds") s.warning_seconds = int(int_in(f, v, full, 0, 65535));
    else if (key == "extra") {
      if (!v.is_array()) throw_input_error(where(f, v.source()) + " " + full, "expected a list of script lines (strings)");
      for (const toml::node& line : *v.as_array()) {
        if (!line.is_string() || line.as_string()->get().find_first_of("\n\r") != std::string::npos) {
          throw_input_error(where(f, line.source()) + " " + full, "expected one script line per string (no newline inside)");
        }
        s.extra.push_back(line.as_string()->get());
      }
    } else {
      const std::vector<std::string> keys = {"partition",     "account",       "time", "job_name",     "nodes", "tasks_per_node",
                                             "gpus_per_node", "cpus_per_task", "mpi",  "max_parallel", "extra", "warning_seconds"};
      throw_input_error(where(f, v.source()), "unknown key '" + full + "'" + did_you_mean(key, keys) +
                                                  " (expected one of partition, account, time, job_name, nodes, tasks_per_node, "
                                                  "gpus_per_node, cpus_per_task, mpi, max_parallel, extra, warning_seconds)");
    }
  }
  return s;
}

// ---- early stopping and random search --------------------------------------------------------------

EarlyStop read_early_stop(const std::string& f, const toml::node& n) {
  if (!n.is_table()) throw_input_error(where(f, n.source()) + " sweep.early_stop", "expected a table with rungs, fraction, min_arms");
  EarlyStop e;
  for (const auto& [k, v] : *n.as_table()) {
    const std::string key(k.str());
    if (key == "rungs") {
      if (!v.is_array() || v.as_array()->empty())
        throw_input_error(where(f, v.source()) + " sweep.early_stop.rungs", "expected a non-empty list of steps");
      for (const toml::node& r : *v.as_array()) {
        const int64_t step = int_in(f, r, "sweep.early_stop.rungs", 1, int64_t(1) << 40);
        if (!e.rungs.empty() && step <= e.rungs.back()) {
          throw_input_error(where(f, r.source()) + " sweep.early_stop.rungs", "expected increasing steps");
        }
        e.rungs.push_back(step);
      }
    } else if (key == "fraction") {
      const auto x = v.value<double>();
      if (!x || !(*x > 0 && *x < 1))
        throw_input_error(where(f, v.source()) + " sweep.early_stop.fraction",
                          "expected a number in (0, 1): the share of arms stopped at a rung");
      e.fraction = *x;
    } else if (key == "min_arms") {
      e.min_arms = int(int_in(f, v, "sweep.early_stop.min_arms", 2, 10000));
    } else {
      throw_input_error(where(f, v.source()), "unknown key 'sweep.early_stop." + key + "'" +
                                                  did_you_mean(key, {"rungs", "fraction", "min_arms"}) +
                                                  " (expected rungs, fraction, min_arms)");
    }
  }
  if (e.rungs.empty()) throw_input_error(where(f, n.source()) + " sweep.early_stop", "missing `rungs = [steps...]`");
  return e;
}

Range read_range(const std::string& f, const std::string& key, const toml::node& v) {
  const std::string path = "sweep.random." + key;
  Range r;
  r.key = key;
  if (std::count(key.begin(), key.end(), '.') < 1)
    throw_input_error(where(f, v.source()) + " " + path, "expected a quoted dotted key such as \"optimizer.lr\"");
  const toml::node* spec = &v;
  if (v.is_table()) {
    const toml::table& t = *v.as_table();
    if (t.size() != 1) {
      throw_input_error(where(f, v.source()) + " " + path, "expected one of { uniform = [lo, hi] }, { log_uniform = [lo, hi] }, "
                                                           "{ int_uniform = [lo, hi] }, { choice = [values] }");
    }
    r.kind = std::string(t.begin()->first.str());
    spec = &t.begin()->second;
  } else {
    r.kind = "choice";  // a plain list is a choice
  }
  if (!spec->is_array() || spec->as_array()->empty())
    throw_input_error(where(f, spec->source()) + " " + path, "expected a non-empty list");
  const toml::array& a = *spec->as_array();
  if (r.kind == "choice") {
    for (const toml::node& el : a) {
      r.choices.push_back(value_text(el));
      r.labels.push_back(value_label(el));
    }
    return r;
  }
  if (r.kind != "uniform" && r.kind != "log_uniform" && r.kind != "int_uniform") {
    throw_input_error(where(f, v.source()) + " " + path,
                      "unknown distribution '" + echo_value(r.kind) + "'" +
                          did_you_mean(r.kind, {"uniform", "log_uniform", "int_uniform", "choice"}) +
                          " (expected uniform, log_uniform, int_uniform or choice)");
  }
  const bool ints = r.kind == "int_uniform";
  if (a.size() != 2 || !(ints ? a[0].is_integer() && a[1].is_integer() : a[0].is_number() && a[1].is_number())) {
    throw_input_error(where(f, spec->source()) + " " + path, std::string("expected [lo, hi], two ") + (ints ? "integers" : "numbers"));
  }
  r.lo = a[0].value<double>().value();
  r.hi = a[1].value<double>().value();
  if (!std::isfinite(r.lo) || !std::isfinite(r.hi) || !(r.lo <= r.hi) || (r.kind == "log_uniform" && !(r.lo > 0))) {
    throw_input_error(where(f, spec->source()) + " " + path,
                      r.kind == "log_uniform" ? "expected 0 < lo <= hi (finite)" : "expected lo <= hi (finite)");
  }
  return r;
}

// Arms from a grid: the cross product of its axes.
std::vector<Arm> grid_arms(const std::string& f, const toml::node& grid, int repeats, std::vector<std::string>& axes) {
  if (!grid.is_table()) throw_input_error(where(f, grid.source()) + " sweep.grid", "expected a table of \"section.key\" = [values]");
  double count = repeats;  // the product of the axes' lengths, counted before anything is listed
  for (const auto& [k, v] : *grid.as_table()) count *= v.is_array() ? double(std::max<std::size_t>(1, v.as_array()->size())) : 1.0;
  if (count > kMaxArms) {
    throw_input_error(where(f, grid.source()) + " sweep.grid",
                      "makes " + std::to_string(int64_t(std::min(count, 9e18))) + " arms (with repeats); a sweep has at most 10000");
  }
  std::vector<Arm> acc(1);
  for (const auto& [k, v] : *grid.as_table()) {
    const std::string key(k.str());
    if (!v.is_array() || v.as_array()->empty())
      throw_input_error(where(f, v.source()) + " sweep.grid." + key, "expected a non-empty list of values");
    if (std::count(key.begin(), key.end(), '.') < 1) {
      throw_input_error(where(f, v.source()) + " sweep.grid." + key, "expected a quoted dotted key such as \"batching.name\"");
    }
    axes.push_back(key);
    std::vector<Arm> next;
    for (const Arm& a : acc) {
      for (const toml::node& el : *v.as_array()) {
        Arm b = a;
        b.overrides.push_back({key, value_text(el), value_label(el)});
        next.push_back(b);
      }
    }
    acc = std::move(next);
  }
  return acc;
}

std::vector<Override> overrides_of(const std::string& f, const toml::table& t, const std::string& path, bool allow_name) {
  std::vector<Override> out;
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (allow_name && (key == "name" || key == "expected")) continue;
    if (std::count(key.begin(), key.end(), '.') < 1 || v.is_table()) {
      throw_input_error(where(f, v.source()) + " " + path + "." + key,
                        "expected a quoted dotted key such as \"optimizer.lr\" = 0.001");
    }
    out.push_back({key, value_text(v), value_label(v)});
  }
  return out;
}

std::vector<Arm> list_arms(const std::string& f, const toml::node& arms, int repeats, std::vector<std::string>& axes) {
  if (!arms.is_array_of_tables()) throw_input_error(where(f, arms.source()) + " sweep.arms", "expected [[sweep.arms]] tables");
  if (double(arms.as_array()->size()) * repeats > kMaxArms) {
    throw_input_error(where(f, arms.source()) + " sweep.arms", std::to_string(arms.as_array()->size()) + " arms x " +
                                                                   std::to_string(repeats) + " repeats; a sweep has at most 10000");
  }
  std::set<std::string> keys;
  std::vector<Arm> out;
  for (const toml::node& el : *arms.as_array()) {
    const toml::table& t = *el.as_table();
    Arm a;
    a.overrides = overrides_of(f, t, "sweep.arms", true);
    if (const toml::node* n = t.get("name")) {
      if (!n->is_string()) throw_input_error(where(f, n->source()) + " sweep.arms.name", "expected a string");
      a.name = value_label(*n);
    }
    if (const toml::node* n = t.get("expected")) {
      const std::optional<double> x = n->value<double>();
      if (!x || !(*x > 0) || !std::isfinite(*x)) {
        throw_input_error(where(f, n->source()) + " sweep.arms.expected",
                          "expected a number > 0: the speed-up in real tokens/s this arm is expected to give over the arm "
                          "listed before it");
      }
      if (out.empty()) {
        throw_input_error(where(f, n->source()) + " sweep.arms.expected",
                          "the first arm has no arm before it to be faster than; give `expected` from the second arm on");
      }
      a.expected = *x;
    }
    for (const Override& o : a.overrides) keys.insert(o.key);
    out.push_back(a);
  }
  axes.assign(keys.begin(), keys.end());
  return out;
}

std::vector<Arm> random_arms(const std::string& f, const toml::table& sw, Sweep& s) {
  const toml::node* n = sw.get("random");
  if (n == nullptr || !n->is_table() || n->as_table()->empty()) {
    throw_input_error(
        f + " sweep.random",
        "search = \"random\" needs [sweep.random] with the ranges, e.g. \"optimizer.lr\" = { log_uniform = [1e-4, 1e-2] }");
  }
  if (s.random.samples == 0) throw_input_error(f + " sweep.samples", "search = \"random\" needs `samples = N` (the number of draws)");
  if (double(s.random.samples) * s.repeats > kMaxArms) {
    throw_input_error(f + " sweep.samples", std::to_string(s.random.samples) + " samples x " + std::to_string(s.repeats) +
                                                " repeats; a sweep has at most 10000");
  }
  std::vector<Range> ranges;
  for (const auto& [k, v] : *n->as_table()) {
    ranges.push_back(read_range(f, std::string(k.str()), v));
    s.axes.push_back(std::string(k.str()));
  }
  std::vector<Arm> out;
  const std::vector<std::vector<Override>> draws = draw_random(ranges, s.random.samples, s.random.seed);
  const int width = int(std::to_string(s.random.samples).size());
  for (std::size_t i = 0; i < draws.size(); ++i) {
    Arm a;
    a.overrides = draws[i];
    std::string num = std::to_string(i + 1);
    a.name = "sample-" + std::string(std::size_t(std::max(0, width - int(num.size()))), '0') + num;
    out.push_back(a);
  }
  return out;
}

// The [sweep] table's scalar keys.
void read_sweep_keys(const std::string& f, const toml::table& sw, Sweep& s) {
  static const std::vector<std::string> known = {"name",   "repeats", "baseline", "set",    "grid",       "arms",
                                                 "search", "samples", "seed",     "random", "early_stop", "launcher"};
  for (const auto& [k, v] : sw) {
    const std::string key(k.str());
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw_input_error(where(f, v.source()), "unknown key 'sweep." + key + "'" + did_you_mean(key, known) +
                                                  " (expected name, repeats, baseline, set, grid, arms, search, samples, seed, "
                                                  "random, early_stop, launcher)");
    }
  }
  if (const toml::node* n = sw.get("name")) {
    if (!n->is_string() || n->as_string()->get().empty())
      throw_input_error(where(f, n->source()) + " sweep.name", "expected a non-empty string");
    s.name = n->as_string()->get();
    // It names the default output directory, sweeps/<name>: one plain path component.
    if (s.name == "." || s.name == ".." || s.name.find('/') != std::string::npos) {
      throw_input_error(where(f, n->source()) + " sweep.name", "'" + s.name + "' is not a plain directory name");
    }
  }
  if (const toml::node* n = sw.get("repeats")) s.repeats = int(int_in(f, *n, "sweep.repeats", 1, 100));
  if (const toml::node* n = sw.get("samples")) s.random.samples = int_in(f, *n, "sweep.samples", 1, 10000);
  if (const toml::node* n = sw.get("seed")) s.random.seed = uint64_t(int_in(f, *n, "sweep.seed", 0, INT64_MAX));
  for (const auto& [key, target, choices] : {std::tuple{"search", &s.search, std::vector<std::string>{"grid", "random"}},
                                             std::tuple{"launcher", &s.launcher, std::vector<std::string>{"local", "slurm"}}}) {
    if (const toml::node* n = sw.get(key)) {
      if (!n->is_string() || std::find(choices.begin(), choices.end(), n->as_string()->get()) == choices.end()) {
        throw_input_error(where(f, n->source()) + " sweep." + key,
                          "expected \"" + choices[0] + "\" or \"" + choices[1] + "\"" +
                              (n->is_string() ? did_you_mean(n->as_string()->get(), choices) : std::string()));
      }
      *target = n->as_string()->get();
    }
  }
  if (s.search == "grid" && (sw.get("samples") || sw.get("random") || sw.get("seed"))) {
    throw_input_error(f + " sweep", "samples, seed and [sweep.random] belong to search = \"random\"; this sweep's search is \"grid\"");
  }
  if (s.search == "random" && (sw.get("grid") || sw.get("arms"))) {
    throw_input_error(f + " sweep", "search = \"random\" draws its arms from [sweep.random]: give no [sweep.grid] or [[sweep.arms]]");
  }
  if (const toml::node* n = sw.get("early_stop")) s.early_stop = read_early_stop(f, *n);
}

// Arm names (given, or the values joined; made unique), then repeats, then resources.
void finish_arms(const std::string& f, const toml::table& sw, std::vector<Arm> base_arms, Sweep& s) {
  std::map<std::string, int> seen;
  for (Arm& a : base_arms) {
    if (a.name.empty()) {
      for (const Override& o : a.overrides) a.name += (a.name.empty() ? "" : "-") + o.label;
      if (a.name.empty()) a.name = "base";
    }
    if (int n = seen[a.name]++; n > 0) a.name += "-" + std::to_string(n + 1);
  }
  for (const Arm& a : base_arms) require_arm_name(f, a.name);
  if (const toml::node* n = sw.get("baseline")) {
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
  for (Arm& a : base_arms) {
    a.resources = s.slurm.resources;
    for (const Override& o : a.overrides) {
      if (o.key.rfind("slurm.", 0) != 0) continue;
      const std::string key = o.key.substr(6);
      toml::table parsed = toml::parse("v = " + o.value);
      if (!set_resource(a.resources, f + " arm '" + a.name + "'", key, *parsed.get("v"))) {
        throw_input_error(f + " arm '" + a.name + "' " + o.key,
                          "an arm may set slurm.nodes, slurm.tasks_per_node, slurm.gpus_per_node or slurm.cpus_per_task");
      }
    }
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
}

fs::path resolve_base(const fs::path& file, const toml::table& root) {
  const std::string f = file.string();
  const toml::node* base = root.get("base");
  if (base == nullptr || !base->is_string())
    throw_input_error(f, "missing `base = \"path/to/experiment.toml\"` (the experiment every arm starts from)");
  const fs::path b = base->as_string()->get();
  // Relative to the sweep file first, then to the working directory.
  const fs::path beside = file.parent_path() / b;
  if (b.is_relative() && fs::exists(beside)) return beside;
  if (fs::exists(b)) return b;
  throw_input_error(where(f, base->source()) + " base", "'" + b.string() + "' exists neither beside the sweep file (" +
                                                            beside.string() + ") nor in the working directory");
}

}  // namespace

std::vector<std::vector<Override>> draw_random(const std::vector<Range>& ranges, int64_t samples, uint64_t seed) {
  std::mt19937_64 bits(seed);
  std::vector<std::vector<Override>> out;
  for (int64_t i = 0; i < samples; ++i) {
    std::vector<Override> draw;
    for (const Range& r : ranges) {
      const double u = double(bits() >> 11) * 0x1.0p-53;
      if (r.kind == "choice") {
        const std::size_t k = std::min(r.choices.size() - 1, std::size_t(u * double(r.choices.size())));
        draw.push_back({r.key, r.choices[k], r.labels[k]});
        continue;
      }
      if (r.kind == "int_uniform") {
        const int64_t v = int64_t(r.lo) + std::min(int64_t(r.hi - r.lo), int64_t(u * (r.hi - r.lo + 1)));
        draw.push_back({r.key, std::to_string(v), std::to_string(v)});
        continue;
      }
      const double x =
          r.kind == "uniform" ? r.lo + u * (r.hi - r.lo) : std::exp(std::log(r.lo) + u * (std::log(r.hi) - std::log(r.lo)));
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g", x);
      double rounded = std::strtod(buf, nullptr);
      rounded = std::clamp(rounded, r.lo, r.hi);  // rounding never leaves the range
      std::snprintf(buf, sizeof buf, "%.6g", rounded);
      std::string text = buf;
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // a float stays a float in TOML
      draw.push_back({r.key, text, label_of(text)});
    }
    out.push_back(std::move(draw));
  }
  return out;
}

Sweep read_sweep(const fs::path& file, const std::vector<std::string>& sets) {
  // Only a regular file (a FIFO would wait forever, /dev/zero never end), a few KB of TOML.
  const std::string text = read_regular_file(file, "sweep file", kMaxExperimentBytes);
  const std::string f = file.string();
  toml::table root;
  try {
    root = toml::parse(text, f);
  } catch (const toml::parse_error& e) {
    throw_input_error(where(f, e.source()), std::string(e.description()));
  }
  for (const std::string& set : sets) apply_set(root, set);
  for (const auto& [k, v] : root) {
    if (k != "base" && k != "sweep" && k != "slurm") {
      throw_input_error(where(f, v.source()),
                        "unknown key '" + std::string(k.str()) + "' (a sweep file has `base`, [sweep] and [slurm])");
    }
  }
  Sweep s;
  s.file = file;
  s.base = resolve_base(file, root);
  s.name = file.stem().string();
  toml::table empty;
  const toml::table* sw = root.get_as<toml::table>("sweep");
  if (root.get("sweep") != nullptr && sw == nullptr)
    throw_input_error(where(f, root.get("sweep")->source()) + " sweep", "expected a table");
  if (sw == nullptr) sw = &empty;
  read_sweep_keys(f, *sw, s);
  if (root.get("slurm") != nullptr && !root.get("slurm")->is_table()) throw_input_error(f + " slurm", "expected a table");
  s.slurm = read_slurm(f, root.get_as<toml::table>("slurm"), s.name);
  if (const toml::node* n = sw->get("set")) {
    if (!n->is_table()) throw_input_error(where(f, n->source()) + " sweep.set", "expected a table of \"section.key\" = value");
    s.common = overrides_of(f, *n->as_table(), "sweep.set", false);
    for (const Override& o : s.common) {
      if (o.key.rfind("slurm.", 0) == 0)
        throw_input_error(f + " sweep.set." + o.key, "Slurm settings common to every arm go in [slurm]");
    }
  }
  const toml::node* grid = sw->get("grid");
  const toml::node* arms = sw->get("arms");
  if (grid && arms) throw_input_error(where(f, arms->source()), "give either [sweep.grid] or [[sweep.arms]], not both");
  std::vector<Arm> base_arms;
  if (s.search == "random") base_arms = random_arms(f, *sw, s);
  else if (grid) base_arms = grid_arms(f, *grid, s.repeats, s.axes);
  else if (arms) base_arms = list_arms(f, *arms, s.repeats, s.axes);
  else base_arms.push_back(Arm{});
  finish_arms(f, *sw, std::move(base_arms), s);
  return s;
}

}  // namespace ablate::cli::sweep
