// `ablate report` on sweeps written by hand: each arm group's mean, standard deviation and 95%
// interval over its repeats, each group against the baseline (Welch's interval of a difference of
// loss means; for throughput, MFU and memory the log-scale Welch interval of the ratio), the verdicts
// in words, the leader lines, the throughput noise note, and the `baseline` key.
//
// The expected numbers were computed outside ablate, with SciPy 1.17.1 and Python's `statistics`:
//   mean, sd        statistics.mean(x), statistics.stdev(x)
//   group interval  scipy.stats.t.interval(0.95, n - 1, loc=mean, scale=sd / sqrt(n))
//   difference      r = scipy.stats.ttest_ind(a, b, equal_var=False); r.confidence_interval(0.95)
//   ratio           the same on numpy.log(a), numpy.log(b), each end passed through math.exp
// The t quantiles handed to the plots are checked against closed forms: with 1 degree of freedom
// t(0.975) = tan(0.475 pi), with 2 it is 0.95 / sqrt(2 * 0.975 * 0.025).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::size_t count_of(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

constexpr double kMiB = 1 << 20;

// One arm group's repeats: per repeat its final validation loss, real tokens/s, MFU and peak memory.
// Its best validation loss (the lowest metrics.jsonl logged) is 0.01 below the final one.
struct Group {
  std::string name;
  std::vector<double> val_loss, real_tokens_per_s, mfu, mem_peak_bytes;
  std::string summary_extra;  // more summary.json fields, each with a trailing comma
};

const Group kBase{"base", {2.10, 2.13, 2.08}, {1000, 1040, 980}, {0.30, 0.31, 0.29}, {100 * kMiB, 100 * kMiB, 100 * kMiB}, ""};
// The same numbers as the baseline; its runs' step times vary by 20% (the noise note's subject).
const Group kSame{"same",
                  {2.10, 2.13, 2.08},
                  {1000, 1040, 980},
                  {0.30, 0.31, 0.29},
                  {100 * kMiB, 100 * kMiB, 100 * kMiB},
                  R"("step_time_cv": 0.2, "machine_load": 1.5,)"};
const Group kBetter{"better", {1.95, 1.97, 1.96}, {1500, 1530, 1490}, {0.45, 0.46, 0.44}, {80 * kMiB, 80 * kMiB, 80 * kMiB}, ""};
const Group kSingle{"single", {2.00}, {1200}, {0.35}, {90 * kMiB}, ""};

// A finished sweep: arms.json (with `baseline` when given) and per repeat arm.json, summary.json and
// metrics.jsonl (ten steps, validation at steps 5 and 10).
fs::path write_sweep(const fs::path& dir, const std::vector<Group>& groups, const std::string& baseline = "") {
  json order = {{"name", "stats"}, {"base", "base.toml"}, {"axes", json::array()}, {"arms", json::array()}};
  if (!baseline.empty()) order["baseline"] = baseline;
  for (const Group& g : groups) {
    for (std::size_t r = 0; r < g.val_loss.size(); ++r) {
      const std::string arm = g.val_loss.size() > 1 ? g.name + "-r" + std::to_string(r + 1) : g.name;
      order["arms"].push_back(arm);
      const fs::path d = dir / arm;
      fs::create_directories(d);
      std::ofstream(d / "arm.json") << json(
          {{"status", "completed"}, {"repeat", r}, {"group", g.name}, {"overrides", json::object()}});
      std::ofstream(d / "summary.json") << "{" << g.summary_extra
                                        << json({{"status", "completed"},
                                                 {"steps", 10},
                                                 {"final_loss", g.val_loss[r] - 0.05},
                                                 {"val_loss", g.val_loss[r]},
                                                 {"tokens_per_s", g.real_tokens_per_s[r] * 1.25},
                                                 {"real_tokens_per_s", g.real_tokens_per_s[r]},
                                                 {"mfu", g.mfu[r]},
                                                 {"mem_peak_bytes", int64_t(g.mem_peak_bytes[r])}})
                                               .dump()
                                               .substr(1);
      std::ofstream m(d / "metrics.jsonl");
      for (int s = 1; s <= 10; ++s) {
        json row = {{"step", s},         {"loss", 4.0 / (1 + 0.1 * s) + 0.01 * double(r)},
                    {"step_ms", 10.0},   {"tokens", 80},
                    {"real_tokens", 64}, {"elapsed_s", 0.01 * s}};
        if (s == 5) row["val_loss"] = g.val_loss[r] - 0.01;
        if (s == 10) row["val_loss"] = g.val_loss[r];
        m << row.dump() << "\n";
      }
    }
  }
  fs::create_directories(dir);
  std::ofstream(dir / "arms.json") << order.dump(2);
  return dir;
}

// An interpreter for the plotting script that keeps a copy of the description it was given.
std::string spy_python(const TempDir& tmp) {
  const fs::path spy = tmp.write("spy-python.sh", "#!/bin/sh\ncp \"$2\" \"$(dirname \"$2\")/spec-seen.json\"\nexec python3 \"$@\"\n");
  fs::permissions(spy, fs::perms::owner_all, fs::perm_options::add);
  return "ABLATE_PYTHON=" + spy.string();
}

bool have_matplotlib() { return run_command("python3 -c 'import matplotlib'").exit_code == 0; }

// `ablate report DIR`: 0 with the plots drawn, 1 without matplotlib (report.md and the results are written either way).
std::string report(const fs::path& dir, const std::string& env = "") {
  const auto r = run_ablate("report " + dir.string(), env);
  INFO(r.output);
  CHECK(r.exit_code == (have_matplotlib() ? 0 : 1));
  return slurp(dir / "report.md");
}

std::map<std::string, json> groups_by_name(const json& results) {
  std::map<std::string, json> out;
  for (const json& g : results["groups"]) out[g["group"].get<std::string>()] = g;
  return out;
}

void check_close(const json& v, double want) {
  REQUIRE(v.is_number());
  CHECK(v.get<double>() == doctest::Approx(want).epsilon(1e-9));
}

}  // namespace

TEST_CASE("report: mean, sd and 95% interval per arm group, and each group against the baseline, as SciPy computes them") {
  TempDir tmp;
  const fs::path dir = write_sweep(tmp.path() / "main", {kBase, kSame, kBetter, kSingle});
  const std::string md = report(dir, spy_python(tmp));
  const json results = read_json(dir / "results.json");
  CHECK(results["baseline"] == "base");  // none named: the first arm
  auto g = groups_by_name(results);
  REQUIRE(g.size() == 4);

  // Over the repeats.
  check_close(g["base"]["val_loss_mean"], 2.1033333333333335);
  check_close(g["base"]["val_loss_sd"], 0.02516611478423574);
  CHECK(g["base"]["val_loss_n"] == 3);
  check_close(g["base"]["val_loss_ci_low"], 2.040817238539576);
  check_close(g["base"]["val_loss_ci_high"], 2.165849428127091);
  check_close(g["base"]["best_val_loss_mean"], 2.0933333333333337);  // the lowest logged, not the last
  check_close(g["base"]["best_val_loss_ci_low"], 2.0308172385395764);
  check_close(g["base"]["real_tokens_per_s_mean"], 1006.6666666666666);
  check_close(g["base"]["real_tokens_per_s_sd"], 30.550504633038933);
  check_close(g["base"]["real_tokens_per_s_ci_low"], 930.7750059947315);
  check_close(g["base"]["real_tokens_per_s_ci_high"], 1082.5583273386019);
  check_close(g["better"]["val_loss_sd"], 0.010000000000000009);
  check_close(g["better"]["val_loss_ci_low"], 1.9351586228824966);
  check_close(g["better"]["val_loss_ci_high"], 1.9848413771175033);
  check_close(g["better"]["real_tokens_per_s_ci_low"], 1454.9552165412442);
  check_close(g["better"]["real_tokens_per_s_ci_high"], 1558.3781167920893);
  // One run: a mean, no spread, no interval.
  check_close(g["single"]["val_loss_mean"], 2.0);
  CHECK(g["single"]["val_loss_n"] == 1);
  CHECK(g["single"]["val_loss_sd"].is_null());
  CHECK(g["single"]["val_loss_ci_low"].is_null());
  CHECK(g["single"]["val_loss_ci_high"].is_null());

  // Against the baseline: Welch's interval of the difference (losses), of the log ratio (the others).
  CHECK(g["base"]["val_loss_verdict"] == "baseline");
  CHECK(g["base"]["val_loss_diff"].is_null());
  check_close(g["same"]["val_loss_diff"], 0.0);
  check_close(g["same"]["val_loss_diff_low"], -0.05705052361651962);
  check_close(g["same"]["val_loss_diff_high"], 0.05705052361651962);
  CHECK(g["same"]["val_loss_verdict"] == "no difference detected at n=3 (+0.0000 [-0.0571, 0.0571])");
  check_close(g["same"]["real_tokens_per_s_ratio_low"], 0.9337977749855323);
  check_close(g["same"]["real_tokens_per_s_ratio_high"], 1.070895676545699);
  CHECK(g["same"]["real_tokens_per_s_verdict"] == "no difference detected at n=3 (1.000x [0.934, 1.071])");
  check_close(g["same"]["mfu_ratio_low"], 0.9271900008757562);
  check_close(g["same"]["mfu_ratio_high"], 1.078527593109797);

  check_close(g["better"]["val_loss_diff"], -0.14333333333333353);
  check_close(g["better"]["val_loss_diff_low"], -0.1974852305479616);
  check_close(g["better"]["val_loss_diff_high"], -0.08918143611870546);
  CHECK(g["better"]["val_loss_verdict"] == "lower loss by 0.1433 [0.0892, 0.1975]");
  check_close(g["better"]["best_val_loss_diff_low"], -0.19748523054796183);
  check_close(g["better"]["real_tokens_per_s_ratio"], 1.4970507198787);
  check_close(g["better"]["real_tokens_per_s_ratio_low"], 1.4048081238959997);
  check_close(g["better"]["real_tokens_per_s_ratio_high"], 1.5953501547769031);
  CHECK(g["better"]["real_tokens_per_s_verdict"] == "faster by 1.50x [1.40, 1.60]");
  check_close(g["better"]["mfu_ratio"], 1.5003089216662018);
  check_close(g["better"]["mfu_ratio_low"], 1.4014387687966947);
  check_close(g["better"]["mfu_ratio_high"], 1.6061542684193728);
  CHECK(g["better"]["mfu_verdict"] == "higher MFU by 1.50x [1.40, 1.61]");
  // Every repeat used the same memory on both sides: the ratio is exact, its interval the point.
  check_close(g["better"]["mem_peak_bytes_ratio"], 0.8);
  check_close(g["better"]["mem_peak_bytes_ratio_low"], 0.8);
  CHECK(g["better"]["mem_peak_bytes_verdict"] == "less memory by 1.25x [1.25, 1.25]");

  // One run against three: the point estimate, and no interval.
  check_close(g["single"]["val_loss_diff"], 2.0 - 2.1033333333333335);
  CHECK(g["single"]["val_loss_diff_low"].is_null());
  CHECK(g["single"]["val_loss_verdict"] == "lower loss by 0.1033 (n=1 vs 3: no interval)");
  CHECK(g["single"]["real_tokens_per_s_verdict"] == "faster by 1.19x (n=1 vs 3: no interval)");

  // Each arm row keeps its own numbers, the best validation loss among them.
  for (const json& row : results["arms"]) {
    CAPTURE(row["arm"]);
    CHECK(row["best_val_loss"].get<double>() == doctest::Approx(row["val_loss"].get<double>() - 0.01));
  }

  // results.csv: the group's columns on each of its arms' rows.
  std::istringstream csv(slurp(dir / "results.csv"));
  std::string header, line;
  std::getline(csv, header);
  CHECK(contains(header, ",group,val_loss_mean,val_loss_sd,val_loss_n,val_loss_ci_low,val_loss_ci_high,val_loss_diff,"
                         "val_loss_diff_low,val_loss_diff_high,val_loss_verdict,best_val_loss_mean,"));
  CHECK(contains(header, ",real_tokens_per_s_ratio,real_tokens_per_s_ratio_low,real_tokens_per_s_ratio_high,"));
  std::size_t better_rows = 0;
  while (std::getline(csv, line)) {
    if (line.rfind("better-r", 0) == 0) {
      ++better_rows;
      CAPTURE(line);
      CHECK(contains(line, ",better,1.96,0.01,3,1.93515862,1.98484138,-0.143333333,-0.197485231,-0.0891814361,"
                           "\"lower loss by 0.1433 [0.0892, 0.1975]\","));  // quoted: it holds commas
    }
  }
  CHECK(better_rows == 3);

  // report.md: the groups over their repeats, the comparisons, the leaders, the noise note.
  CHECK(contains(md, "| better | 3 | 1.9600 ± 0.0100 [1.9352, 1.9848] |"));
  CHECK(contains(md, "| single | 1 | 2.0000 (n=1: no interval) |"));
  CHECK(contains(md, "## Against the baseline `base`"));
  CHECK(contains(md, "| base | 3 | baseline | baseline | baseline | baseline | baseline |"));
  CHECK(contains(md, "| better | 3 | lower loss by 0.1433 [0.0892, 0.1975] | lower loss by 0.1433 [0.0892, 0.1975] | "
                     "faster by 1.50x [1.40, 1.60] | higher MFU by 1.50x [1.40, 1.61] | less memory by 1.25x [1.25, 1.25] |"));
  // `single` has no interval, so `better` cannot be named the winner on loss.
  CHECK(contains(md, "Lowest validation loss: no winner: `better` (1.9600), `single` (2.0000) cannot be told apart (no interval: "
                     "an arm with a single run has none; set `repeats` in [sweep])."));
  // The throughput noise: only `same` has runs whose step times vary (by 20%, more than its 0% difference).
  CHECK(count_of(md, "(noisy: see below)") == 1);
  CHECK(contains(md, "no difference detected at n=3 (1.000x [0.934, 1.071]) (noisy: see below)"));
  CHECK(contains(md, "- `same` against `base`: real tokens/s differ by 0.0%, less than the step-time noise of these runs "
                     "(coefficient of variation up to 20.0%, in `same-r1`; machine load up to 1.50)"));

  // The plots get the t quantiles for the group sizes they meet.
  const json spec = read_json(dir / "spec-seen.json");
  const double pi = std::acos(-1.0);
  CHECK(spec["t975"]["2"].get<double>() == doctest::Approx(std::tan(0.475 * pi)).epsilon(1e-12));
  CHECK(spec["t975"]["3"].get<double>() == doctest::Approx(0.95 / std::sqrt(2 * 0.975 * 0.025)).epsilon(1e-12));
  CHECK(spec["smooth"].get<double>() == doctest::Approx(0.6));  // several arms: smoothed by default
  const auto raw = run_ablate("report " + dir.string() + " --smooth 0", spy_python(tmp));
  INFO(raw.output);
  CHECK(read_json(dir / "spec-seen.json")["smooth"] == 0.0);
}

TEST_CASE("report names a winner only when its interval against every other arm excludes no difference") {
  TempDir tmp;
  SUBCASE("clearly different arms: the winner, with its margin over the runner-up") {
    const fs::path dir = write_sweep(tmp.path() / "clear", {kBase, kSame, kBetter});
    const std::string md = report(dir);
    CHECK(contains(md, "Lowest validation loss: **better** (1.9600 [1.9352, 1.9848], n=3): lower loss by 0.1433 [0.0892, 0.1975] "
                       "than the runner-up `base`."));
    CHECK(contains(
        md, "Most real tokens/s: **better** (1.51k [1.45k, 1.56k], n=3): faster by 1.50x [1.40, 1.60] than the runner-up `base`."));
  }
  SUBCASE("identical arms: no winner, no difference detected") {
    Group twin = kBase;
    twin.name = "twin";
    const fs::path dir = write_sweep(tmp.path() / "tie", {kBase, twin});
    const std::string md = report(dir);
    CHECK(contains(md, "Lowest validation loss: no winner: `base` (2.1033), `twin` (2.1033) cannot be told apart; the leader against "
                       "the runner-up: no difference detected at n=3 (+0.0000 [-0.0571, 0.0571])."));
    CHECK(contains(md, "| twin | 3 | no difference detected at n=3 (+0.0000 [-0.0571, 0.0571]) |"));
    CHECK_FALSE(contains(md, "noisy"));  // no run says how its step times varied
  }
  SUBCASE("one run per arm: no interval, no winner, and no table of repeats") {
    Group other = kSingle;
    other.name = "other";
    other.val_loss = {2.2};
    const fs::path dir = write_sweep(tmp.path() / "ones", {kSingle, other});
    const std::string md = report(dir);
    CHECK(contains(md, "Lowest validation loss: no winner: `single` (2.0000), `other` (2.2000) cannot be told apart (no interval: "
                       "an arm with a single run has none; set `repeats` in [sweep])."));
    CHECK(contains(md, "| other | 1 | higher loss by 0.2000 (n=1: no interval) |"));
    CHECK_FALSE(contains(md, "## Arms over their repeats"));
    const json results = read_json(dir / "results.json");
    CHECK(results["groups"][1]["val_loss_diff_low"].is_null());
  }
}

TEST_CASE("the baseline is the sweep's `baseline` when it names one, and one that names no arm is refused with exit 2") {
  TempDir tmp;
  const fs::path dir = write_sweep(tmp.path() / "chosen", {kBase, kSame, kBetter}, "better");
  const std::string md = report(dir);
  CHECK(contains(md, "## Against the baseline `better`"));
  CHECK(contains(md, "| base | 3 | higher loss by 0.1433 [0.0892, 0.1975] |"));
  const json results = read_json(dir / "results.json");
  CHECK(results["baseline"] == "better");
  CHECK(results["groups"][2]["baseline"] == true);

  const fs::path bad = write_sweep(tmp.path() / "bad", {kBase, kBetter}, "nope");
  const auto r = run_ablate("report " + bad.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "arms.json"));
  CHECK(contains(r.output, "field 'baseline' is string \"nope\", which names no arm; expected one of: base, better"));
  CHECK_FALSE(fs::exists(bad / "results.json"));

  // In a sweep file: [sweep] baseline, checked against the arms before anything runs.
  const std::string quickstart = std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml";
  const std::string grid = "base = \"" + quickstart +
                           "\"\n[sweep]\nrepeats = 2\nbaseline = \"%\"\n[sweep.grid]\n\"batching.name\" = [\"padded\", \"packed\"]\n";
  const auto sweep_file = [&](const std::string& name, const std::string& baseline) {
    std::string text = grid;
    text.replace(text.find('%'), 1, baseline);
    return tmp.write(name, text);
  };
  const fs::path out = tmp.path() / "out";
  auto s = run_ablate("sweep " + sweep_file("bad.toml", "padded-r1").string() + " --out " + out.string());
  INFO(s.output);
  CHECK(s.exit_code == 2);
  CHECK(contains(s.output, "sweep.baseline"));
  CHECK(contains(s.output, "'padded-r1' names no arm; expected the name of an arm without its repeat suffix, one of: padded, packed"));
  CHECK_FALSE(fs::exists(out));
  s = run_ablate("sweep " + sweep_file("good.toml", "packed").string() + " --out " + out.string() + " --dry-run");
  INFO(s.output);
  CHECK(s.exit_code == 0);
}
