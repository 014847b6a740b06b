// Results tables and reports (see report.hpp). The tables are written here; the plots are drawn
// by matplotlib in ablate_plots.py from a small JSON description of what to draw.
#include "report.hpp"
#include "commands.hpp"
#include "json_read.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/safetensors.hpp"

namespace ablate::cli {

namespace fs = std::filesystem;
namespace po = boost::program_options;
using json = nlohmann::json;

namespace {

// An arm's directory name as arms.json gives it: one plain path component, never a way out of
// the sweep directory.
std::string arm_name(const fs::path& arms_json, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    throw_input_error(arms_json.string(), "arm name '" + echo_value(name) + "' is not a plain directory name");
  }
  return name;
}

// The columns of results.csv / results.json taken from each arm's summary.json.
const char* const kSummaryColumns[] = {"final_loss",      "val_loss",         "tokens_per_s",  "real_tokens_per_s",
                                       "mfu",             "effective_mfu",    "mem_peak_bytes", "optimizer_state_bytes",
                                       "data_wait_pct"};

std::string csv_cell(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
    return q + "\"";
  }
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v.get<double>());
    return buf;
  }
  return json_text(v);
}

std::string fmt_num(const json& v, const char* f) {
  if (!v.is_number()) return "–";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v.get<double>());
  return buf;
}

std::string fmt_si(const json& v) {
  if (!v.is_number()) return "–";
  const double x = v.get<double>();
  char buf[32];
  if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
  else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", x);
  return buf;
}

std::string fmt_mib(const json& v) {
  if (!v.is_number()) return "–";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v.get<double>() / double(1 << 20));
  return buf;
}

std::string fmt_pct(const json& v) {
  if (!v.is_number()) return "–";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * v.get<double>());
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

fs::path plot_script() {
  if (const char* env = std::getenv("ABLATE_PLOTS_SCRIPT"); env && *env) return fs::absolute(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return exe.parent_path().parent_path() / "share" / "ablate" / "ablate_plots.py";
}

// Runs the plotting script on `spec` in `dir`; returns "" or what went wrong. The description's
// paths are relative to `dir`: a path there need not be UTF-8, as JSON text must.
std::string draw(const fs::path& dir, const json& spec) {
  const fs::path spec_path = dir / ".plots.json";
  write_file_atomic(spec_path, json_text(spec, 1));
  const fs::path script = plot_script();
  if (!fs::exists(script)) return "the plotting script is not installed (" + script.string() + ")";
  const char* py_env = std::getenv("ABLATE_PYTHON");
  std::string py = py_env && *py_env ? py_env : "python3";
  if (py.find('/') != std::string::npos) py = fs::absolute(py).string();  // the script runs in `dir`
  const std::string cmd = "cd -- " + shell_quote(dir.string()) + " && " + shell_quote(py) + " " + shell_quote(script.string()) +
                          " " + shell_quote(spec_path.filename().string()) + " 2>&1";
  std::string output;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return "cannot run " + cmd;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = pclose(pipe);
  fs::remove(spec_path);
  if (status != 0) {
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    return output.empty() ? "the plotting script failed (" + cmd + ")" : output;
  }
  return "";
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const std::string& x : items) out += (out.empty() ? "" : sep) + x;
  return out;
}

// A plain TOML value as text: strings as they are, numbers as the sweep labels them (a double's
// shortest text, with ".0" when it would read as an integer), booleans as true/false.
json toml_value_text(const toml::node& v) {
  if (const auto* s = v.as_string()) return s->get();
  if (const auto* i = v.as_integer()) return std::to_string(i->get());
  if (const auto* b = v.as_boolean()) return b->get() ? "true" : "false";
  if (const auto* f = v.as_floating_point()) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, f->get());
    std::string t(buf, r.ptr);
    if (std::isfinite(f->get()) && t.find_first_of(".eE") == std::string::npos) t += ".0";
    return t;
  }
  return nullptr;
}

// The value `key` ("optimizer.name") has in a run's resolved config.toml: what an arm that does
// not override a factor ran with. null when the file or the key is missing or the file does not
// parse; a config.toml that is no regular file, or past kMaxRunTomlBytes, is an input error.
json resolved_value(const fs::path& config_toml, const std::string& key) {
  std::error_code ec;
  if (!fs::exists(config_toml, ec)) return nullptr;
  const std::string text = read_regular_file(config_toml, "run config", kMaxRunTomlBytes);
  try {
    const toml::table t = toml::parse(text, config_toml.string());
    const toml::node* v = t.at_path(key).node();
    return v ? toml_value_text(*v) : json(nullptr);
  } catch (const toml::parse_error&) {
    return nullptr;
  }
}

std::string resolve_factor(const char* option, const std::string& name, const std::vector<std::string>& factors,
                           const std::string& where) {
  if (name.empty()) return "";
  if (std::find(factors.begin(), factors.end(), name) != factors.end()) return name;
  if (factors.empty()) {
    throw_input_error(option, "unknown factor '" + name + "': " + where + " has no factors (they are a sweep's axes)");
  }
  std::vector<std::string> hits;
  for (const std::string& f : factors) {
    if (f.rfind(name + ".", 0) == 0) hits.push_back(f);
  }
  if (hits.size() == 1) return hits.front();
  if (hits.size() > 1) {
    throw_input_error(option, "'" + name + "' could be " + join(hits, " or ") + "; give the full name (factors: " + join(factors) + ")");
  }
  throw_input_error(option, "unknown factor '" + name + "' (factors of " + where + ": " + join(factors) + ")");
}

}  // namespace

void add_report_options(po::options_description& desc) {
  desc.add_options()("smooth", float_option("smooth", 0.0, 1.0, true)->default_value(0.0, "0"),
                     "smooth the training-loss curves with an exponential moving average of this weight, in [0, 1) "
                     "(0.9: strong; the raw curve stays faint behind)")(
      "log-y", po::bool_switch(), "loss on a log scale")(
      "color-by", po::value<std::string>()->value_name("FACTOR"),
      "the sweep factor (axis) that picks the curves' colours (default: the first)")(
      "style-by", po::value<std::string>()->value_name("FACTOR"),
      "the sweep factor that picks the curves' line styles (default: the first other one)");
}

ReportOptions report_options(const po::variables_map& vm) {
  ReportOptions o;
  o.smooth = vm.count("smooth") ? vm["smooth"].as<double>() : 0.0;
  if (!(o.smooth >= 0.0 && o.smooth < 1.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", o.smooth);
    throw_input_error("--smooth", std::string(buf) + " is not a weight in [0, 1) (0: raw curves; 0.9: strong smoothing)");
  }
  o.log_y = vm.count("log-y") && vm["log-y"].as<bool>();
  if (vm.count("color-by")) o.color_by = vm["color-by"].as<std::string>();
  if (vm.count("style-by")) o.style_by = vm["style-by"].as<std::string>();
  return o;
}

ReportOptions resolve_report_factors(const ReportOptions& options, const std::vector<std::string>& factors,
                                     const std::string& where) {
  ReportOptions o = options;
  o.color_by = resolve_factor("--color-by", options.color_by, factors, where);
  o.style_by = resolve_factor("--style-by", options.style_by, factors, where);
  if (!o.color_by.empty() && o.color_by == o.style_by) {
    throw_input_error("--style-by", "'" + o.style_by + "' is the --color-by factor too; give each option its own (factors: " +
                                        join(factors) + ")");
  }
  return o;
}

void write_sweep_results(const fs::path& sweep_dir) {
  // Every file is read (an arm that never ran or never finished has no arm.json or summary.json;
  // a damaged one is an input error) before results.json and results.csv are replaced.
  const fs::path arms_json = sweep_dir / "arms.json";
  const json order = read_json_file(arms_json, kArmsJson);
  const std::vector<std::string> axes = order.value("axes", std::vector<std::string>());
  json rows = json::array();
  for (const std::string& listed : order["arms"].get<std::vector<std::string>>()) {
    const std::string name = arm_name(arms_json, listed);
    const fs::path d = sweep_dir / name;
    const json arm = read_json_file_if_present(d / "arm.json", kArmJson).value_or(json::object());
    const json summary = read_json_file_if_present(d / "summary.json", kSummaryJson).value_or(json::object());
    if (arm.value("status", "") == "completed") read_jsonl_file_if_present(d / "metrics.jsonl", kMetricsLine);  // the plots read it
    json row = {{"arm", name}, {"group", arm.value("group", name)}, {"repeat", arm.value("repeat", int64_t(0))}};
    row["overrides"] = arm.value("overrides", json::object());
    std::string status = arm.value("status", "not run");
    if (status == "running") status = "interrupted";
    row["status"] = status;
    for (const char* c : kSummaryColumns) row[c] = summary.contains(c) ? summary[c] : json(nullptr);
    row["wall_s"] = arm.contains("wall_s") && status == "completed" ? arm["wall_s"] : summary.value("wall_s", json(nullptr));
    row["steps"] = summary.value("steps", json(nullptr));
    row["error"] = arm.value("error", "");
    row["run_dir"] = name;
    rows.push_back(row);
  }
  json results = {{"sweep", order.value("name", "")}, {"base", order.value("base", "")}, {"axes", axes}, {"arms", rows}};
  write_file_atomic(sweep_dir / "results.json", json_text(results, 2) + "\n");

  std::ostringstream csv;
  csv << "arm,repeat";
  for (const std::string& a : axes) csv << "," << csv_cell(a);
  csv << ",status";
  for (const char* c : kSummaryColumns) csv << "," << c;
  csv << ",wall_s,error\n";
  for (const json& r : rows) {
    csv << csv_cell(r["arm"]) << "," << r["repeat"].get<int64_t>();
    for (const std::string& a : axes) csv << "," << csv_cell(r["overrides"].value(a, json("")));
    csv << "," << csv_cell(r["status"]);
    for (const char* c : kSummaryColumns) csv << "," << csv_cell(r[c]);
    csv << "," << csv_cell(r["wall_s"]) << "," << csv_cell(r["error"]) << "\n";
  }
  write_file_atomic(sweep_dir / "results.csv", csv.str());
}

// A run's metrics.jsonl as the plots (Python) read it, relative to the report's directory `dir`
// (`run` is the run's directory relative to it, "" for `dir` itself): read typed here first, so
// that a damaged line is an input error naming it (and a FIFO or device there never hangs the
// plots). A missing one is the plots' business: an arm that never started.
static std::string metrics_for_plots(const fs::path& dir, const fs::path& run) {
  const fs::path m = run / "metrics.jsonl";
  read_jsonl_file_if_present(dir / m, kMetricsLine);
  return m.string();
}

fs::path write_report(const fs::path& dir, const ReportOptions& options) {
  const bool sweep = fs::exists(dir / "arms.json");
  if (!sweep && !fs::exists(dir / "metrics.jsonl")) {
    throw_input_error(dir.string(), "neither a sweep directory (arms.json) nor a run directory (metrics.jsonl)");
  }
  std::ostringstream md;
  // The plots are drawn in `dir`: the paths in their description are relative to it.
  json spec = {{"out_dir", "."}, {"runs", json::array()}, {"throughput", json::array()}};
  const json results = sweep ? read_json_file(dir / "results.json", kResultsJson) : json::object();
  const std::vector<std::string> axes = results.value("axes", std::vector<std::string>());
  // Colour by one factor, line style by another (the first two unless chosen), markers for the rest.
  ReportOptions plot = resolve_report_factors(options, axes, (sweep ? "sweep directory " : "run directory ") + dir.string());
  for (const std::string& a : axes) {
    if (plot.color_by.empty() && a != plot.style_by) plot.color_by = a;
    else if (plot.style_by.empty() && a != plot.color_by) plot.style_by = a;
  }
  spec["factors"] = axes;
  spec["color_by"] = plot.color_by.empty() ? json(nullptr) : json(plot.color_by);
  spec["style_by"] = plot.style_by.empty() ? json(nullptr) : json(plot.style_by);
  spec["smooth"] = plot.smooth;
  spec["log_y"] = plot.log_y;
  std::size_t most_repeats = 1;
  if (sweep) {
    spec["title"] = "sweep " + results.value("sweep", std::string());
    md << "# Sweep `" << results.value("sweep", std::string()) << "`\n\n";
    md << "Base experiment `" << results.value("base", std::string()) << "`";
    if (!axes.empty()) {
      md << "; axes";
      for (std::size_t i = 0; i < axes.size(); ++i) md << (i ? ", " : " ") << "`" << axes[i] << "`";
    }
    md << ". Throughput and MFU are medians over each run's steps (the first excluded); losses are the last step's "
          "training loss and the last validation loss.\n\n";
    md << "| arm |";
    for (const std::string& a : axes) md << " " << a << " |";
    md << " status | train loss | val loss | tokens/s | real tokens/s | MFU | effective MFU | peak MiB | optimizer MiB | "
          "data wait | wall s |\n|---|";
    for (std::size_t i = 0; i < axes.size(); ++i) md << "---|";
    md << "---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    std::map<std::string, json> groups;  // group -> {tokens_per_s: [...], real: [...]}
    std::vector<std::string> group_order;
    const json* best_val = nullptr;
    const json* fastest = nullptr;
    std::vector<std::string> failures;
    const json arms = results.value("arms", json::array());  // best_val and fastest point into it
    for (const json& r : arms) {
      // A row's field, null where the row has none (results.json's nulls are read as absent).
      const auto cell = [&r](const char* key) { return r.value(key, json(nullptr)); };
      const json overrides = r.value("overrides", json::object());
      md << "| " << r.value("arm", "") << " |";
      for (const std::string& a : axes) md << " " << overrides.value(a, "") << " |";
      md << " " << r.value("status", "") << " | " << fmt_num(cell("final_loss"), "%.4f") << " | " << fmt_num(cell("val_loss"), "%.4f")
         << " | " << fmt_si(cell("tokens_per_s")) << " | " << fmt_si(cell("real_tokens_per_s")) << " | " << fmt_pct(cell("mfu"))
         << " | " << fmt_pct(cell("effective_mfu")) << " | " << fmt_mib(cell("mem_peak_bytes")) << " | "
         << fmt_mib(cell("optimizer_state_bytes")) << " | " << fmt_num(cell("data_wait_pct"), "%.1f%%") << " | "
         << fmt_num(cell("wall_s"), "%.1f") << " |\n";
      if (r.value("status", "") == "failed") failures.push_back(r.value("arm", "") + ": " + r.value("error", ""));
      if (r.value("status", "") != "completed") continue;
      const std::string g = r.value("group", r.value("arm", ""));
      if (!groups.count(g)) {
        group_order.push_back(g);
        groups[g] = {{"group", g}, {"tokens_per_s", json::array()}, {"real_tokens_per_s", json::array()}};
      }
      groups[g]["tokens_per_s"].push_back(cell("tokens_per_s"));
      groups[g]["real_tokens_per_s"].push_back(cell("real_tokens_per_s"));
      most_repeats = std::max(most_repeats, groups[g]["tokens_per_s"].size());
      const fs::path run_dir = dir / r.value("run_dir", "");
      json factors = json::object();
      for (const std::string& a : axes) {
        // An arm of an explicit list may leave a factor to the base experiment: its resolved value.
        factors[a] = overrides.contains(a) ? overrides[a] : resolved_value(run_dir / "config.toml", a);
      }
      spec["runs"].push_back({{"label", r.value("arm", "")},
                              {"group", g},
                              {"metrics", metrics_for_plots(dir, r.value("run_dir", ""))},
                              {"factors", factors}});
      if (r.contains("val_loss") && (!best_val || r["val_loss"].get<double>() < (*best_val)["val_loss"].get<double>())) best_val = &r;
      if (r.contains("real_tokens_per_s") &&
          (!fastest || r["real_tokens_per_s"].get<double>() > (*fastest)["real_tokens_per_s"].get<double>())) {
        fastest = &r;
      }
    }
    md << "\n";
    if (best_val) md << "Lowest validation loss: **" << (*best_val)["arm"].get<std::string>() << "** (" << fmt_num((*best_val)["val_loss"], "%.4f") << "). ";
    if (fastest) md << "Most real tokens/s: **" << (*fastest)["arm"].get<std::string>() << "** (" << fmt_si((*fastest)["real_tokens_per_s"]) << ").";
    md << "\n\n";
    if (!failures.empty()) {
      md << "Failed arms:\n\n";
      for (const std::string& f : failures) md << "- " << f << "\n";
      md << "\n";
    }
    for (const std::string& g : group_order) spec["throughput"].push_back(groups[g]);
  } else {
    const json summary = read_json_file_if_present(dir / "summary.json", kSummaryJson).value_or(json::object());
    const std::string name = fs::absolute(dir).lexically_normal().filename().string();
    spec["title"] = "run " + name;
    md << "# Run `" << name << "`\n\n| metric | value |\n|---|---:|\n";
    md << "| status | " << summary.value("status", "incomplete") << " |\n";
    md << "| steps | " << fmt_num(summary.value("steps", json(nullptr)), "%.0f") << " |\n";
    md << "| parameters | " << fmt_si(summary.value("parameters", json(nullptr))) << " |\n";
    md << "| first / final training loss | " << fmt_num(summary.value("first_loss", json(nullptr)), "%.4f") << " / "
       << fmt_num(summary.value("final_loss", json(nullptr)), "%.4f") << " |\n";
    md << "| validation loss | " << fmt_num(summary.value("val_loss", json(nullptr)), "%.4f") << " |\n";
    md << "| tokens/s (real) | " << fmt_si(summary.value("tokens_per_s", json(nullptr))) << " ("
       << fmt_si(summary.value("real_tokens_per_s", json(nullptr))) << ") |\n";
    md << "| MFU (effective) | " << fmt_pct(summary.value("mfu", json(nullptr))) << " (" << fmt_pct(summary.value("effective_mfu", json(nullptr)))
       << ") |\n";
    md << "| data wait | " << fmt_num(summary.value("data_wait_pct", json(nullptr)), "%.1f%%") << " |\n";
    md << "| peak memory MiB | " << fmt_mib(summary.value("mem_peak_bytes", json(nullptr))) << " |\n";
    md << "| optimizer state MiB | " << fmt_mib(summary.value("optimizer_state_bytes", json(nullptr))) << " |\n";
    md << "| wall s | " << fmt_num(summary.value("wall_s", json(nullptr)), "%.1f") << " |\n\n";
    spec["runs"].push_back({{"label", name},
                            {"group", name},
                            {"metrics", metrics_for_plots(dir, "")},
                            {"factors", json::object()}});
  }
  const std::string whiskers = most_repeats > 1 ? " (bars: median of the repeats; whiskers: their range)" : "";
  const std::vector<std::pair<std::string, std::string>> plots = {
      {"loss_vs_step.png", "Loss against step"},
      {"loss_vs_time.png", "Loss against wall-clock time"},
      {"loss_vs_real_tokens.png", "Loss against real (non-padding) tokens seen"},
      {"throughput.png", sweep ? "Throughput per arm" + whiskers : "Throughput per step"},
      {"padding.png", (sweep ? "Padding per arm" + whiskers : std::string("Padding")) + ": share of batch positions that were padding"}};
  const std::string err = spec["runs"].empty() ? std::string("no completed run to plot") : draw(dir, spec);
  if (err.empty()) {
    md << "Loss curves: ";
    if (!plot.color_by.empty()) md << "colour by `" << plot.color_by << "`";
    else md << "one colour per " << (sweep ? "arm" : "run");
    if (!plot.style_by.empty()) md << ", line style by `" << plot.style_by << "`";
    std::vector<std::string> rest;
    for (const std::string& a : axes) {
      if (a != plot.color_by && a != plot.style_by) rest.push_back("`" + a + "`");
    }
    if (!rest.empty()) md << ", markers by " << join(rest);
    md << "; training loss as lines";
    if (plot.smooth > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", plot.smooth);
      md << " smoothed by an exponential moving average of weight " << buf << " (the raw curve faint behind)";
    }
    md << ", validation loss as hollow circles" << (plot.log_y ? "; loss on a log scale" : "") << ".\n\n";
    for (const auto& [file, caption] : plots) md << "## " << caption << "\n\n![" << caption << "](" << file << ")\n\n";
  } else {
    md << "_Plots not drawn: " << err << "_\n";
  }
  const fs::path out = dir / "report.md";
  write_file_atomic(out, md.str());
  if (!err.empty()) throw_runtime_error("report", "plots not drawn: " + err + " (report.md has the table)");
  return out;
}

}  // namespace ablate::cli
