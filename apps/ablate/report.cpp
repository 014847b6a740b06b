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

#include <boost/math/distributions/students_t.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/safetensors.hpp"

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
const char* const kSummaryColumns[] = {"final_loss",    "val_loss",       "tokens_per_s",          "real_tokens_per_s", "mfu",
                                       "effective_mfu", "mem_peak_bytes", "optimizer_state_bytes", "data_wait_pct"};

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
  const std::string cmd = "cd -- " + shell_quote(dir.string()) + " && " + shell_quote(py) + " " + shell_quote(script.string()) + " " +
                          shell_quote(spec_path.filename().string()) + " 2>&1";
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
    throw_input_error(option,
                      "'" + name + "' could be " + join(hits, " or ") + "; give the full name (factors: " + join(factors) + ")");
  }
  throw_input_error(option, "unknown factor '" + name + "' (factors of " + where + ": " + join(factors) + ")");
}

// ---- statistics over an arm group's repeats ---------------------------------------------------

// The two-sided 95% quantile of Student's t with `df` degrees of freedom (Welch's need not be whole).
double t975(double df) {
  namespace bm = boost::math;
  return bm::quantile(bm::complement(bm::students_t_distribution<double>(df), 0.025));
}

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// One metric over a group's repeats: n, the mean, and for n >= 2 the sample standard deviation and
// the 95% interval of the mean (Student's t with n - 1 degrees of freedom); NaN where there is none.
struct Spread {
  std::size_t n = 0;
  double mean = NAN, sd = NAN, ci_low = NAN, ci_high = NAN;
};

Spread spread_of(const std::vector<double>& x) {
  Spread s;
  s.n = x.size();
  if (x.empty()) return s;
  double sum = 0;
  for (double v : x) sum += v;
  s.mean = sum / double(s.n);
  if (s.n < 2) return s;
  double squares = 0;
  for (double v : x) squares += (v - s.mean) * (v - s.mean);
  s.sd = std::sqrt(squares / double(s.n - 1));
  const double half = t975(double(s.n - 1)) * s.sd / std::sqrt(double(s.n));
  s.ci_low = s.mean - half;
  s.ci_high = s.mean + half;
  return s;
}

// An estimate with its 95% interval (NaN bounds: there is none).
struct Estimate {
  double value = NAN, low = NAN, high = NAN;
};

// mean(a) - mean(b) with Welch's interval (Welch-Satterthwaite degrees of freedom); an interval needs
// n >= 2 on both sides. With no spread on either side the difference is exact: the interval is the point.
Estimate welch_difference(const std::vector<double>& a, const std::vector<double>& b) {
  const Spread sa = spread_of(a), sb = spread_of(b);
  Estimate e;
  e.value = sa.mean - sb.mean;
  if (sa.n < 2 || sb.n < 2) return e;
  const double va = sa.sd * sa.sd / double(sa.n), vb = sb.sd * sb.sd / double(sb.n);
  const double se = std::sqrt(va + vb);
  if (se == 0) {
    e.low = e.high = e.value;
    return e;
  }
  double df = (va + vb) * (va + vb) / (va * va / double(sa.n - 1) + vb * vb / double(sb.n - 1));
  if (!(df > 0) || !std::isfinite(df)) df = double(std::min(sa.n, sb.n) - 1);  // spreads too small to square
  const double half = t975(df) * se;
  e.low = e.value - half;
  e.high = e.value + half;
  return e;
}

// The ratio of geometric means a / b with the Welch interval of the difference of the logs,
// exponentiated; NaN when a value is not > 0.
Estimate welch_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> la, lb;
  for (double v : a) la.push_back(v > 0 ? std::log(v) : NAN);
  for (double v : b) lb.push_back(v > 0 ? std::log(v) : NAN);
  const Estimate d = welch_difference(la, lb);
  return {std::exp(d.value), std::exp(d.low), std::exp(d.high)};
}

std::string printf_text(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string loss_text(double v) { return printf_text("%.4f", v); }
// Three significant digits in k or M: "1.51k", "13.3k", "2.04M".
std::string rate_text(double v) {
  const double scale = std::fabs(v) >= 1e6 ? 1e6 : std::fabs(v) >= 1e3 ? 1e3 : 1;
  const double x = v / scale;
  const int decimals = std::fabs(x) >= 100 ? 0 : std::fabs(x) >= 10 ? 1 : 2;
  return printf_text(("%." + std::to_string(decimals) + "f").c_str(), x) + (scale == 1e6 ? "M" : scale == 1e3 ? "k" : "");
}
std::string share_text(double v) { return fmt_pct(json(v)); }
std::string mib_text(double v) { return fmt_mib(json(v)); }
// A ratio's number, with three decimals when `near` (the estimate it belongs to) is within 10% of 1,
// where two would round a real difference away; an interval's ends take their estimate's decimals.
std::string ratio_text(double v, double near) { return printf_text(std::fabs(near - 1) < 0.1 ? "%.3f" : "%.2f", v); }

// The metrics summarised over repeats and compared with the baseline.
struct StatMetric {
  std::string key;    // the results column (an evaluation's: eval/<label>/<metric>, in the row's "evals")
  std::string label;  // its name in report.md
  bool ratio;         // compared as arm / baseline (else as arm - baseline)
  bool lower_better;
  std::string more;  // the words for a larger value than the baseline's
  std::string less;  // and for a smaller one
  std::string (*show)(double);
  bool eval = false;  // an evaluation's primary metric
};

const StatMetric kStatMetrics[] = {
    {"val_loss", "val loss", false, true, "higher loss", "lower loss", loss_text},
    {"best_val_loss", "best val loss", false, true, "higher loss", "lower loss", loss_text},
    {"real_tokens_per_s", "real tokens/s", true, false, "faster", "slower", rate_text},
    {"mfu", "MFU", true, false, "higher MFU", "lower MFU", share_text},
    {"mem_peak_bytes", "peak MiB", true, true, "more memory", "less memory", mib_text},
};

std::string eval_text(double v) { return printf_text("%.4f", v); }

// The metrics a sweep's statistics cover: the fixed ones, then each evaluation's primary metric
// (results.json's "evals": label, metric, higher_is_better), compared as a difference.
std::vector<StatMetric> stat_metrics(const json& evals) {
  std::vector<StatMetric> out(std::begin(kStatMetrics), std::end(kStatMetrics));
  for (const json& e : evals) {
    const std::string label = e.value("label", ""), metric = e.value("metric", "");
    const bool higher = e.value("higher_is_better", true);
    const std::string name = label + " " + metric;
    out.push_back({"eval/" + label + "/" + metric, name, false, !higher, "higher " + name, "lower " + name, eval_text, true});
  }
  return out;
}

// A results row's value of a metric: its column, or for an evaluation the row's "evals" entry.
double row_value(const json& r, const StatMetric& m) {
  const json* where = &r;
  std::string key = m.key;
  if (m.eval) {
    if (!r.contains("evals") || !r["evals"].is_object()) return NAN;
    where = &r["evals"];
    key = m.key.substr(5);  // <label>/<metric>
  }
  return where->contains(key) && (*where)[key].is_number() ? (*where)[key].get<double>() : NAN;
}

// The evaluations of a sweep's summaries, each once in the order first met: label, primary metric, direction.
json sweep_evals(const std::vector<json>& summaries) {
  json out = json::array();
  for (const json& summary : summaries) {
    if (!summary.contains("evals")) continue;
    for (const auto& [label, e] : summary["evals"].items()) {
      const bool known = std::any_of(out.begin(), out.end(), [&](const json& x) { return x["label"] == label; });
      if (!known)
        out.push_back({{"label", label}, {"metric", e.value("primary", "")}, {"higher_is_better", e.value("higher_is_better", true)}});
    }
  }
  return out;
}

// The completed repeats of one arm (its group: the arm's name without the repeat suffix).
struct ArmGroup {
  std::string name;
  std::map<std::string, std::vector<double>> values;  // metric -> one value per completed repeat that has it
  std::size_t completed = 0;
  double step_time_cv = NAN;  // the largest of its runs' step-time coefficients of variation, NaN: none known
  std::string noisiest;       // the run that had it
  double machine_load = NAN;  // the largest machine load its runs saw, NaN: none known
};

// Every group of the results rows, in the order of their first arm (one without a completed repeat too).
std::vector<ArmGroup> arm_groups(const json& rows, const std::vector<StatMetric>& metrics) {
  std::vector<ArmGroup> groups;
  for (const json& r : rows) {
    const std::string g = r.value("group", r.value("arm", ""));
    auto it = std::find_if(groups.begin(), groups.end(), [&](const ArmGroup& x) { return x.name == g; });
    if (it == groups.end()) it = groups.insert(groups.end(), ArmGroup{g, {}, 0, NAN, "", NAN});
    if (r.value("status", "") != "completed") continue;
    ++it->completed;
    // The rows as written carry nulls; as read back (json_read.hpp) they leave them out.
    const auto number = [&r](const char* key) { return r.contains(key) && r[key].is_number() ? r[key].get<double>() : NAN; };
    for (const StatMetric& m : metrics) {
      if (std::isfinite(row_value(r, m))) it->values[m.key].push_back(row_value(r, m));
    }
    if (const double cv = number("step_time_cv"); std::isfinite(cv) && !(cv <= it->step_time_cv)) {
      it->step_time_cv = cv;
      it->noisiest = r.value("arm", "");
    }
    it->machine_load = std::fmax(it->machine_load, number("machine_load"));
  }
  return groups;
}

// The baseline group: `requested` (arms.json's or results.json's `baseline`, named by `where`), else
// the first group with a completed repeat, else the first. "" when there is no group at all.
std::string baseline_group(const std::vector<ArmGroup>& groups, const std::string& requested, const std::string& where) {
  std::string names;
  for (const ArmGroup& g : groups) names += (names.empty() ? "" : ", ") + g.name;
  if (!requested.empty()) {
    if (std::none_of(groups.begin(), groups.end(), [&](const ArmGroup& g) { return g.name == requested; })) {
      throw_input_error(where, "field 'baseline' is string \"" + echo_value(requested) +
                                   "\", which names no arm; expected one of: " + echo_value(names, 400));
    }
    return requested;
  }
  for (const ArmGroup& g : groups) {
    if (g.completed > 0) return g.name;
  }
  return groups.empty() ? "" : groups.front().name;
}

const std::vector<double>& values_of(const ArmGroup& g, const StatMetric& m) {
  static const std::vector<double> none;
  const auto it = g.values.find(m.key);
  return it == g.values.end() ? none : it->second;
}

// `arm` against `base` on one metric: arm - base for a difference, arm / base for a ratio.
Estimate versus(const StatMetric& m, const ArmGroup& arm, const ArmGroup& base) {
  return m.ratio ? welch_ratio(values_of(arm, m), values_of(base, m)) : welch_difference(values_of(arm, m), values_of(base, m));
}

std::string n_text(std::size_t a, std::size_t b) {
  return a == b ? "n=" + std::to_string(a) : "n=" + std::to_string(a) + " vs " + std::to_string(b);
}

// An estimate in words: "faster by 1.28x [1.21, 1.35]", "lower loss by 0.0310 [0.0120, 0.0500]",
// "no difference detected at n=2 (+0.0040 [-0.0100, 0.0180])"; without an interval (a side with
// one repeat) the point, saying so. "" when there is nothing to compare.
std::string verdict(const StatMetric& m, const Estimate& e, std::size_t n_arm, std::size_t n_base) {
  if (!std::isfinite(e.value)) return "";
  const double none = m.ratio ? 1.0 : 0.0;  // the value of no difference
  const bool interval = std::isfinite(e.low) && std::isfinite(e.high);
  const bool more = interval ? e.low > none : e.value > none;
  const bool less = interval ? e.high < none : e.value < none;
  const std::string n = n_text(n_arm, n_base);
  // The size of a difference, as a positive number: a ratio below 1 as its inverse ("slower by 1.25x").
  const double shown = m.ratio && e.value < 1 ? 1 / e.value : e.value;
  const auto size = [&](double v) { return m.ratio ? ratio_text(v >= 1 ? v : 1 / v, shown) : loss_text(std::fabs(v)); };
  if (!more && !less) {
    if (!interval) return "no difference (" + n + ": no interval)";
    if (e.low == e.high) return "no difference (the same in every repeat, " + n + ")";
    const std::string point = m.ratio ? ratio_text(e.value, e.value) + "x" : printf_text("%+.4f", e.value);
    const auto bound = [&](double v) { return m.ratio ? ratio_text(v, e.value) : loss_text(v); };
    return "no difference detected at " + n + " (" + point + " [" + bound(e.low) + ", " + bound(e.high) + "])";
  }
  std::string out = std::string(more ? m.more : m.less) + " by " + size(e.value) + (m.ratio ? "x" : "");
  if (interval) out += " [" + size(more ? e.low : e.high) + ", " + size(more ? e.high : e.low) + "]";
  else out += " (" + n + ": no interval)";
  return out;
}

// The results columns of a group's statistics, in order: per metric mean, sd, n, ci_low, ci_high,
// then against the baseline the difference (losses) or ratio (the others) with its interval, and the verdict.
std::vector<std::string> group_columns(const std::vector<StatMetric>& metrics) {
  std::vector<std::string> out;
  for (const StatMetric& m : metrics) {
    const std::string k = m.key, vs = k + (m.ratio ? "_ratio" : "_diff");
    for (const std::string& c :
         {k + "_mean", k + "_sd", k + "_n", k + "_ci_low", k + "_ci_high", vs, vs + "_low", vs + "_high", k + "_verdict"}) {
      out.push_back(c);
    }
  }
  return out;
}

// A group's row of statistics (group_columns(), then `group` and `baseline`).
json group_row(const ArmGroup& g, const ArmGroup& base, const std::vector<StatMetric>& metrics) {
  json row = {{"group", g.name}, {"baseline", g.name == base.name}};
  for (const StatMetric& m : metrics) {
    const std::string k = m.key, vs = k + (m.ratio ? "_ratio" : "_diff");
    const Spread s = spread_of(values_of(g, m));
    row[k + "_mean"] = number_or_null(s.mean);
    row[k + "_sd"] = number_or_null(s.sd);
    row[k + "_n"] = s.n;
    row[k + "_ci_low"] = number_or_null(s.ci_low);
    row[k + "_ci_high"] = number_or_null(s.ci_high);
    const Estimate e = g.name == base.name ? Estimate{} : versus(m, g, base);
    row[vs] = number_or_null(e.value);
    row[vs + "_low"] = number_or_null(e.low);
    row[vs + "_high"] = number_or_null(e.high);
    row[k + "_verdict"] = g.name == base.name ? "baseline" : verdict(m, e, s.n, values_of(base, m).size());
  }
  return row;
}

// "Lowest validation loss: ..." for one metric: the leader is named a winner only when its interval
// against every other arm excludes no difference; else the arms it cannot be told from are listed.
std::string leader_line(const StatMetric& m, const std::vector<ArmGroup>& groups, const std::string& title) {
  std::vector<const ArmGroup*> ranked;
  for (const ArmGroup& g : groups) {
    if (!values_of(g, m).empty()) ranked.push_back(&g);
  }
  if (ranked.empty()) return "";
  const auto mean = [&](const ArmGroup* g) { return spread_of(values_of(*g, m)).mean; };
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const ArmGroup* a, const ArmGroup* b) { return m.lower_better ? mean(a) < mean(b) : mean(a) > mean(b); });
  const ArmGroup& best = *ranked.front();
  const Spread s = spread_of(values_of(best, m));
  std::string shown = m.show(s.mean);
  if (s.n >= 2) shown += " [" + m.show(s.ci_low) + ", " + m.show(s.ci_high) + "], n=" + std::to_string(s.n);
  if (ranked.size() == 1) return title + ": **" + best.name + "** (" + shown + "), the only arm with a value.";
  const double none = m.ratio ? 1.0 : 0.0;
  std::vector<const ArmGroup*> tied = {&best};
  for (std::size_t i = 1; i < ranked.size(); ++i) {
    const Estimate e = versus(m, best, *ranked[i]);
    const bool apart = std::isfinite(e.low) && (m.lower_better ? e.high < none : e.low > none);
    if (!apart) tied.push_back(ranked[i]);
  }
  const ArmGroup& second = *ranked[1];
  const Estimate lead = versus(m, best, second);
  const std::size_t n_best = values_of(best, m).size(), n_second = values_of(second, m).size();
  if (tied.size() == 1) {
    return title + ": **" + best.name + "** (" + shown + "): " + verdict(m, lead, n_best, n_second) + " than the runner-up `" +
           second.name + "`.";
  }
  std::vector<std::string> names;
  for (const ArmGroup* g : tied) names.push_back("`" + g->name + "` (" + m.show(mean(g)) + ")");
  std::string line = title + ": no winner: " + join(names) + " cannot be told apart";
  if (std::isfinite(lead.low)) {
    line += "; the leader against the runner-up: " + verdict(m, lead, n_best, n_second);
  } else {
    line += " (no interval: an arm with a single run has none; set `repeats` in [sweep])";
  }
  return line + ".";
}

// A throughput comparison whose difference is smaller than the step-time noise of the runs behind it
// (summary.json's step_time_cv, where the trainer wrote it): a note saying so, else "".
std::string noise_note(const ArmGroup& a, const ArmGroup& b, double ratio) {
  const ArmGroup& noisier = std::isnan(b.step_time_cv) || a.step_time_cv > b.step_time_cv ? a : b;
  const double cv = noisier.step_time_cv;
  if (!std::isfinite(cv) || !std::isfinite(ratio) || cv <= std::fabs(ratio - 1)) return "";
  const double load = std::fmax(a.machine_load, b.machine_load);
  return "`" + a.name + "` against `" + b.name + "`: real tokens/s differ by " + printf_text("%.1f%%", 100 * std::fabs(ratio - 1)) +
         ", less than the step-time noise of these runs (coefficient of variation up to " + printf_text("%.1f%%", 100 * cv) +
         ", in `" + noisier.noisiest + "`" +
         (std::isfinite(load) ? "; machine load up to " + printf_text("%.2f", load) : std::string()) +
         "): the difference may be the machine's, not the arm's";
}

// A metric over a group's repeats as a table cell: "mean ± sd [low, high]", or one run's value.
std::string spread_cell(const StatMetric& m, const ArmGroup& g) {
  const Spread s = spread_of(values_of(g, m));
  if (s.n == 0) return "–";
  if (s.n == 1) return m.show(s.mean) + " (n=1: no interval)";
  return m.show(s.mean) + " ± " + m.show(s.sd) + " [" + m.show(s.ci_low) + ", " + m.show(s.ci_high) + "]";
}

// report.md's sections on the arm groups: the leaders, each group over its repeats (when any has
// more than one), and each against the baseline.
void write_group_sections(std::ostringstream& md, const std::vector<ArmGroup>& groups, const std::string& baseline,
                          const std::vector<StatMetric>& metrics) {
  std::size_t most = 0, compared = 0;
  for (const ArmGroup& g : groups) {
    most = std::max(most, g.completed);
    compared += g.completed > 0 ? 1 : 0;
  }
  const auto find = [&](const char* key) {
    return *std::find_if(metrics.begin(), metrics.end(), [&](const StatMetric& m) { return m.key == key; });
  };
  std::vector<std::string> leaders = {leader_line(find("val_loss"), groups, "Lowest validation loss"),
                                      leader_line(find("real_tokens_per_s"), groups, "Most real tokens/s")};
  for (const StatMetric& m : metrics) {  // each evaluation ranks the arms too
    if (m.eval) leaders.push_back(leader_line(m, groups, (m.lower_better ? "Lowest " : "Highest ") + m.label));
  }
  for (const std::string& line : leaders) {
    if (!line.empty()) md << line << "\n\n";
  }
  const auto header = [&md, &metrics](const std::string& last) {
    md << "| arm | n |";
    for (const StatMetric& m : metrics) md << " " << (m.key == "mem_peak_bytes" ? last : m.label) << " |";
    md << "\n|---|---:|";
    for (std::size_t i = 0; i < metrics.size(); ++i) md << "---:|";
    md << "\n";
  };
  if (most >= 2) {
    md << "## Arms over their repeats\n\nMean ± standard deviation over each arm's completed repeats, and in brackets the 95% "
          "confidence interval of the mean (Student's t); an arm with one run has no interval.\n\n";
    header("peak MiB");
    for (const ArmGroup& g : groups) {
      md << "| " << g.name << " | " << g.completed << " |";
      for (const StatMetric& m : metrics) md << " " << spread_cell(m, g) << " |";
      md << "\n";
    }
    md << "\n";
  }
  const auto base = std::find_if(groups.begin(), groups.end(), [&](const ArmGroup& g) { return g.name == baseline; });
  if (compared < 2 || base == groups.end()) return;
  md << "## Against the baseline `" << baseline
     << "`\n\nLosses as the difference of means (arm - baseline), throughput, MFU "
        "and memory as the ratio arm / baseline (of geometric means), each with its 95% interval (Welch's t; ratios on the log "
        "scale); \"no difference detected\" when the interval holds no difference.\n\n";
  if (base->completed == 0) {
    md << "The baseline has no completed run: nothing to compare with.\n\n";
    return;
  }
  header("peak memory");
  std::vector<std::string> notes;
  for (const ArmGroup& g : groups) {
    md << "| " << g.name << " | " << g.completed << " |";
    for (const StatMetric& m : metrics) {
      if (g.name == baseline) {
        md << " baseline |";
        continue;
      }
      const Estimate e = versus(m, g, *base);
      const std::string words = verdict(m, e, values_of(g, m).size(), values_of(*base, m).size());
      std::string note = m.key == "real_tokens_per_s" ? noise_note(g, *base, e.value) : "";
      if (!note.empty()) notes.push_back(note);
      md << " " << (words.empty() ? "–" : words) << (note.empty() ? "" : " (noisy: see below)") << " |";
    }
    md << "\n";
  }
  md << "\n";
  for (const std::string& n : notes) md << "- " << n << ".\n";
  if (!notes.empty()) md << "\n";
}

// One arm group's expected speed-up against what was measured, as report.md's words: whether the
// measured ratio's 95% interval holds the expectation.
std::string expectation_verdict(double expected, const Estimate& e) {
  if (!std::isfinite(e.value)) return "–";
  if (!std::isfinite(e.low)) return "no interval (one run a side: set `repeats`)";
  if (e.high < expected) return "less than expected";
  if (e.low > expected) return "more than expected";
  return "as expected (the interval holds it)";
}

// "Expected against measured": for sweeps whose [[sweep.arms]] give `expected` (a claimed speed-up
// of each arm over the one listed before it, as a table of optimisations that each add one), the
// claim beside the measured ratio of real tokens/s with its 95% interval, step by step and
// cumulatively from the first arm.
void write_expected_section(std::ostringstream& md, const std::vector<ArmGroup>& groups, const json& expected,
                            const std::vector<StatMetric>& metrics) {
  if (expected.empty() || groups.size() < 2) return;
  const StatMetric& rate =
      *std::find_if(metrics.begin(), metrics.end(), [](const StatMetric& m) { return m.key == "real_tokens_per_s"; });
  md << "## Expected against measured\n\nEach arm's expected speed-up (`expected` in `[[sweep.arms]]`) over the arm before it, "
        "beside the measured ratio of real tokens/s (geometric means over the repeats, with its 95% interval: Welch's t on "
        "the log scale), and both multiplied up from the first arm `"
     << groups.front().name << "`.\n\n| arm | expected | measured | verdict | expected from `" << groups.front().name
     << "` | measured from `" << groups.front().name << "` |\n|---|---:|---:|---|---:|---:|\n";
  double cumulative = 1;
  for (std::size_t i = 1; i < groups.size(); ++i) {
    const ArmGroup& g = groups[i];
    const double e = expected.contains(g.name) && expected[g.name].is_number() ? expected[g.name].get<double>() : NAN;
    cumulative *= e;
    const Estimate step = welch_ratio(values_of(g, rate), values_of(groups[i - 1], rate));
    const Estimate total = welch_ratio(values_of(g, rate), values_of(groups.front(), rate));
    const auto shown = [](const Estimate& x) {
      if (!std::isfinite(x.value)) return std::string("–");
      std::string out = ratio_text(x.value, x.value) + "x";
      if (std::isfinite(x.low)) out += " [" + ratio_text(x.low, x.value) + ", " + ratio_text(x.high, x.value) + "]";
      return out;
    };
    md << "| " << g.name << " | " << (std::isfinite(e) ? ratio_text(e, e) + "x" : std::string("–")) << " | " << shown(step) << " | "
       << (std::isfinite(e) ? expectation_verdict(e, step) : std::string("–")) << " | "
       << (std::isfinite(cumulative) ? ratio_text(cumulative, cumulative) + "x" : std::string("–")) << " | " << shown(total) << " |\n";
  }
  md << "\n";
}

}  // namespace

void add_report_options(po::options_description& desc) {
  desc.add_options()("smooth", float_option("smooth", 0.0, 1.0, true),
                     "smooth the training-loss curves with an exponential moving average of this weight, in [0, 1) "
                     "(0.9: strong; the raw curve stays faint behind; 0: raw; default: 0.6 when several arms are drawn, "
                     "else raw)")("log-y", po::bool_switch(), "loss on a log scale")(
      "color-by", po::value<std::string>()->value_name("FACTOR"),
      "the sweep factor (axis) that picks the curves' colours (default: the first)")(
      "style-by", po::value<std::string>()->value_name("FACTOR"),
      "the sweep factor that picks the curves' line styles (default: the first other one)");
}

ReportOptions report_options(const po::variables_map& vm) {
  ReportOptions o;
  if (vm.count("smooth")) o.smooth = vm["smooth"].as<double>();
  if (o.smooth && !(*o.smooth >= 0.0 && *o.smooth < 1.0)) {
    throw_input_error("--smooth", printf_text("%g", *o.smooth) + " is not a weight in [0, 1) (0: raw curves; 0.9: strong smoothing)");
  }
  o.log_y = vm.count("log-y") && vm["log-y"].as<bool>();
  if (vm.count("color-by")) o.color_by = vm["color-by"].as<std::string>();
  if (vm.count("style-by")) o.style_by = vm["style-by"].as<std::string>();
  return o;
}

ReportOptions resolve_report_factors(const ReportOptions& options, const std::vector<std::string>& factors, const std::string& where) {
  ReportOptions o = options;
  o.color_by = resolve_factor("--color-by", options.color_by, factors, where);
  o.style_by = resolve_factor("--style-by", options.style_by, factors, where);
  if (!o.color_by.empty() && o.color_by == o.style_by) {
    throw_input_error("--style-by",
                      "'" + o.style_by + "' is the --color-by factor too; give each option its own (factors: " + join(factors) + ")");
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
  std::vector<json> summaries;
  for (const std::string& listed : order["arms"].get<std::vector<std::string>>()) {
    const std::string name = arm_name(arms_json, listed);
    const fs::path d = sweep_dir / name;
    const json arm = read_json_file_if_present(d / "arm.json", kArmJson).value_or(json::object());
    const json summary = read_json_file_if_present(d / "summary.json", kSummaryJson).value_or(json::object());
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
    // The lowest validation loss the run logged (metrics.jsonl, which the plots read too).
    double best_val = NAN;
    if (status == "completed") {
      for (const json& m : read_jsonl_file_if_present(d / "metrics.jsonl", kMetricsLine).value_or(std::vector<json>())) {
        if (m.contains("val_loss")) best_val = std::fmin(best_val, m["val_loss"].get<double>());
      }
    }
    row["best_val_loss"] = number_or_null(best_val);
    for (const char* c : {"step_time_cv", "machine_load"}) row[c] = summary.value(c, json(nullptr));
    // Each evaluation's last metrics, as "<label>/<metric>".
    json evals = json::object();
    if (status == "completed" && summary.contains("evals")) {
      for (const auto& [label, e] : summary["evals"].items()) {
        const json metrics = e.value("metrics", json::object());
        for (const auto& [metric, v] : metrics.items()) {
          if (v.is_number()) evals[label + "/" + metric] = v;
        }
      }
      summaries.push_back(summary);
    }
    row["evals"] = evals;
    rows.push_back(row);
  }
  const json eval_list = sweep_evals(summaries);
  const std::vector<StatMetric> metrics = stat_metrics(eval_list);
  const std::vector<ArmGroup> groups = arm_groups(rows, metrics);
  const std::string baseline = baseline_group(groups, order.value("baseline", ""), arms_json.string());
  json group_rows = json::array();
  for (const ArmGroup& g : groups) {
    group_rows.push_back(
        group_row(g, *std::find_if(groups.begin(), groups.end(), [&](const ArmGroup& x) { return x.name == baseline; }), metrics));
  }
  json results = {{"sweep", order.value("name", "")}, {"base", order.value("base", "")}, {"axes", axes}, {"arms", rows}};
  if (!baseline.empty()) results["baseline"] = baseline;
  if (order.contains("expected")) results["expected"] = order["expected"];
  results["evals"] = eval_list;
  results["groups"] = group_rows;
  write_file_atomic(sweep_dir / "results.json", json_text(results, 2) + "\n");

  // One row per arm; its group's statistics repeated on each of the group's rows.
  const std::vector<std::string> stats = group_columns(metrics);
  std::ostringstream csv;
  csv << "arm,repeat";
  for (const std::string& a : axes) csv << "," << csv_cell(a);
  csv << ",status";
  for (const char* c : kSummaryColumns) csv << "," << c;
  csv << ",wall_s,error,best_val_loss,step_time_cv,machine_load,group";
  for (const std::string& c : stats) csv << "," << c;
  csv << "\n";
  for (const json& r : rows) {
    csv << csv_cell(r["arm"]) << "," << r["repeat"].get<int64_t>();
    for (const std::string& a : axes) csv << "," << csv_cell(r["overrides"].value(a, json("")));
    csv << "," << csv_cell(r["status"]);
    for (const char* c : kSummaryColumns) csv << "," << csv_cell(r[c]);
    csv << "," << csv_cell(r["wall_s"]) << "," << csv_cell(r["error"]);
    for (const char* c : {"best_val_loss", "step_time_cv", "machine_load", "group"}) csv << "," << csv_cell(r[c]);
    const auto g = std::find_if(group_rows.begin(), group_rows.end(), [&](const json& x) { return x["group"] == r["group"]; });
    for (const std::string& c : stats) csv << "," << csv_cell((*g)[c]);
    csv << "\n";
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

namespace {

// The plot options with the colour and line-style factors chosen: the first two of `axes` unless
// given; markers tell the rest apart.
ReportOptions plot_options(const ReportOptions& options, const std::vector<std::string>& axes, const std::string& where) {
  ReportOptions plot = resolve_report_factors(options, axes, where);
  for (const std::string& a : axes) {
    if (plot.color_by.empty() && a != plot.style_by) plot.color_by = a;
    else if (plot.style_by.empty() && a != plot.color_by) plot.style_by = a;
  }
  return plot;
}

// How much the plots hold: the most repeats of one arm group, and the groups (or runs) drawn.
struct Drawn {
  std::size_t most_repeats = 1;
  std::size_t groups = 1;
};

// One row of the sweep's runs table.
void write_arm_row(std::ostringstream& md, const json& r, const std::vector<std::string>& axes) {
  // A row's field, null where the row has none (results.json's nulls are read as absent).
  const auto cell = [&r](const char* key) { return r.value(key, json(nullptr)); };
  const json overrides = r.value("overrides", json::object());
  md << "| " << r.value("arm", "") << " |";
  for (const std::string& a : axes) md << " " << overrides.value(a, "") << " |";
  md << " " << r.value("status", "") << " | " << fmt_num(cell("final_loss"), "%.4f") << " | " << fmt_num(cell("val_loss"), "%.4f")
     << " | " << fmt_si(cell("tokens_per_s")) << " | " << fmt_si(cell("real_tokens_per_s")) << " | " << fmt_pct(cell("mfu")) << " | "
     << fmt_pct(cell("effective_mfu")) << " | " << fmt_mib(cell("mem_peak_bytes")) << " | " << fmt_mib(cell("optimizer_state_bytes"))
     << " | " << fmt_num(cell("data_wait_pct"), "%.1f%%") << " | " << fmt_num(cell("wall_s"), "%.1f") << " |\n";
}

// The arms that stopped early and those that failed, each list under its heading (none: nothing).
void write_arm_notes(std::ostringstream& md, const std::vector<std::string>& stopped, const std::vector<std::string>& failures) {
  if (!stopped.empty()) {
    md << "Arms stopped early (sweep.early_stop; not in the statistics or the plots):\n\n";
    for (const std::string& x : stopped) md << "- " << x << "\n";
    md << "\n";
  }
  if (!failures.empty()) {
    md << "Failed arms:\n\n";
    for (const std::string& f : failures) md << "- " << f << "\n";
    md << "\n";
  }
}

// The sweep's runs table, one row per arm, then its stopped and failed arms; each completed arm's
// curves and each group's throughputs go into the plots' description.
Drawn write_runs_table(std::ostringstream& md, json& spec, const fs::path& dir, const json& arms,
                       const std::vector<std::string>& axes) {
  Drawn drawn;
  md << "## Runs\n\n| arm |";
  for (const std::string& a : axes) md << " " << a << " |";
  md << " status | train loss | val loss | tokens/s | real tokens/s | MFU | effective MFU | peak MiB | optimizer MiB | "
        "data wait | wall s |\n|---|";
  for (std::size_t i = 0; i < axes.size(); ++i) md << "---|";
  md << "---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::map<std::string, json> groups;  // group -> {tokens_per_s: [...], real: [...]}
  std::vector<std::string> group_order;
  std::vector<std::string> failures, stopped;
  for (const json& r : arms) {
    const auto cell = [&r](const char* key) { return r.value(key, json(nullptr)); };
    const json overrides = r.value("overrides", json::object());
    write_arm_row(md, r, axes);
    if (r.value("status", "") == "failed") failures.push_back(r.value("arm", "") + ": " + r.value("error", ""));
    if (r.value("status", "") == "stopped") stopped.push_back(r.value("arm", "") + ": " + r.value("error", ""));
    if (r.value("status", "") != "completed") continue;
    const std::string g = r.value("group", r.value("arm", ""));
    if (!groups.count(g)) {
      group_order.push_back(g);
      groups[g] = {{"group", g}, {"tokens_per_s", json::array()}, {"real_tokens_per_s", json::array()}};
    }
    groups[g]["tokens_per_s"].push_back(cell("tokens_per_s"));
    groups[g]["real_tokens_per_s"].push_back(cell("real_tokens_per_s"));
    drawn.most_repeats = std::max(drawn.most_repeats, groups[g]["tokens_per_s"].size());
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
  }
  md << "\n";
  write_arm_notes(md, stopped, failures);
  for (const std::string& g : group_order) spec["throughput"].push_back(groups[g]);
  drawn.groups = group_order.size();
  return drawn;
}

// A sweep's report: its heading and axes, the arm groups' statistics, and the runs table.
Drawn write_sweep_sections(std::ostringstream& md, json& spec, const fs::path& dir, const json& results,
                           const std::vector<std::string>& axes) {
  const json arms = results.value("arms", json::array());
  const std::vector<StatMetric> metrics = stat_metrics(results.value("evals", json::array()));
  const std::vector<ArmGroup> stats = arm_groups(arms, metrics);
  const std::string baseline = baseline_group(stats, results.value("baseline", ""), (dir / "results.json").string());
  spec["title"] = "sweep " + results.value("sweep", std::string());
  md << "# Sweep `" << results.value("sweep", std::string()) << "`\n\n";
  md << "Base experiment `" << results.value("base", std::string()) << "`";
  if (!axes.empty()) {
    md << "; axes";
    for (std::size_t i = 0; i < axes.size(); ++i) md << (i ? ", " : " ") << "`" << axes[i] << "`";
  }
  md << ". Throughput and MFU are medians over each run's steps (the first excluded); losses are the last step's "
        "training loss and the last validation loss; the best validation loss is the lowest the run logged.\n\n";
  write_group_sections(md, stats, baseline, metrics);
  write_expected_section(md, stats, results.value("expected", json::object()), metrics);
  return write_runs_table(md, spec, dir, arms, axes);
}

// A single run's report: its summary as a table of metrics; its curves go into the plots' description.
void write_run_section(std::ostringstream& md, json& spec, const fs::path& dir) {
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
  md << "| MFU (effective) | " << fmt_pct(summary.value("mfu", json(nullptr))) << " ("
     << fmt_pct(summary.value("effective_mfu", json(nullptr))) << ") |\n";
  md << "| data wait | " << fmt_num(summary.value("data_wait_pct", json(nullptr)), "%.1f%%") << " |\n";
  md << "| peak memory MiB | " << fmt_mib(summary.value("mem_peak_bytes", json(nullptr))) << " |\n";
  md << "| optimizer state MiB | " << fmt_mib(summary.value("optimizer_state_bytes", json(nullptr))) << " |\n";
  md << "| wall s | " << fmt_num(summary.value("wall_s", json(nullptr)), "%.1f") << " |\n";
  // Each evaluation's last metrics on one row, its primary metric first.
  const json evals = summary.value("evals", json::object());
  for (const auto& [label, e] : evals.items()) {
    const json metrics = e.value("metrics", json::object());
    const std::string primary = e.value("primary", "");
    std::string cell = primary + " " + fmt_num(metrics.value(primary, json(nullptr)), "%.4f");
    for (const auto& [name, v] : metrics.items()) {
      if (name != primary) cell += ", " + name + " " + fmt_num(v, "%.4g");
    }
    md << "| eval " << label << " (" << e.value("evaluator", "") << ", step " << fmt_num(e.value("step", json(nullptr)), "%.0f")
       << ", " << fmt_num(e.value("time_s", json(nullptr)), "%.1f") << " s) | " << cell << " |\n";
  }
  md << "\n";
  spec["runs"].push_back({{"label", name}, {"group", name}, {"metrics", metrics_for_plots(dir, "")}, {"factors", json::object()}});
}

// The plots drawn: how the loss curves are told apart and drawn, then each plot under its caption.
void write_plot_sections(std::ostringstream& md, const ReportOptions& plot, const std::vector<std::string>& axes, bool sweep,
                         double smooth, std::size_t most_repeats) {
  const std::string whiskers = most_repeats > 1 ? " (bars: mean of the repeats; whiskers: the 95% interval of that mean)" : "";
  const std::vector<std::pair<std::string, std::string>> plots = {
      {"loss_vs_real_tokens.png", "Loss against real (non-padding) tokens seen"},
      {"loss_vs_step.png", "Loss against step"},
      {"loss_vs_time.png", "Loss against wall-clock time"},
      {"throughput.png", sweep ? "Throughput per arm" + whiskers : "Throughput per step"},
      {"padding.png", std::string(sweep ? "Padding per arm" : "Padding") + ": share of batch positions that were padding" + whiskers}};
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
  if (smooth > 0) {
    md << " smoothed by an exponential moving average of weight " << printf_text("%g", smooth) << " (the raw curve faint behind"
       << (plot.smooth ? "" : "; `--smooth 0` draws them raw") << ")";
  }
  md << ", validation loss as hollow circles";
  if (most_repeats > 1) md << "; an arm with repeats as the mean of its repeats with a band for the 95% interval of that mean";
  md << (plot.log_y ? "; loss on a log scale" : "") << ".\n\n";
  for (const auto& [file, caption] : plots) md << "## " << caption << "\n\n![" << caption << "](" << file << ")\n\n";
}

}  // namespace

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
  const ReportOptions plot = plot_options(options, axes, (sweep ? "sweep directory " : "run directory ") + dir.string());
  spec["factors"] = axes;
  spec["color_by"] = plot.color_by.empty() ? json(nullptr) : json(plot.color_by);
  spec["style_by"] = plot.style_by.empty() ? json(nullptr) : json(plot.style_by);
  spec["log_y"] = plot.log_y;
  Drawn drawn;
  if (sweep) {
    drawn = write_sweep_sections(md, spec, dir, results, axes);
    spec["evals"] = results.value("evals", json::array());
  } else {
    write_run_section(md, spec, dir);
    const json summary = read_json_file_if_present(dir / "summary.json", kSummaryJson).value_or(json::object());
    spec["evals"] = json::array();
    const json evals = summary.value("evals", json::object());
    for (const auto& [label, e] : evals.items()) {
      spec["evals"].push_back(
          {{"label", label}, {"metric", e.value("primary", "")}, {"higher_is_better", e.value("higher_is_better", true)}});
    }
  }
  // Several arms overlap: smoothed unless asked otherwise. With repeats, the plots draw each group's
  // mean with its 95% interval; they are given the t quantiles for the group sizes they meet.
  const double smooth = plot.smooth.value_or(drawn.groups > 1 ? kDefaultSmooth : 0.0);
  spec["smooth"] = smooth;
  spec["t975"] = json::object();
  for (std::size_t n = 2; n <= drawn.most_repeats; ++n) spec["t975"][std::to_string(n)] = t975(double(n - 1));
  const std::string err = spec["runs"].empty() ? std::string("no completed run to plot") : draw(dir, spec);
  if (err.empty()) {
    write_plot_sections(md, plot, axes, sweep, smooth, drawn.most_repeats);
    if (!spec["evals"].empty()) {
      md << "## Evaluations against step\n\nEach evaluation's "
         << (sweep ? "primary metric per arm (the mean of its repeats, "
                     "with a band for the 95% interval of that mean)"
                   : "primary metric")
         << ".\n\n![Evaluations against step](evals.png)\n\n";
    }
  } else {
    md << "_Plots not drawn: " << err << "_\n";
  }
  const fs::path out = dir / "report.md";
  write_file_atomic(out, md.str());
  if (!err.empty()) throw_runtime_error("report", "plots not drawn: " + err + " (report.md has the table)");
  return out;
}

}  // namespace ablate::cli
