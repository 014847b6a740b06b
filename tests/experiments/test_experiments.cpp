// Experiments through the `ablate` program: a 2x2 sweep on a tiny model gives four run directories,
// a four-row results table and the plots; a rerun skips the finished arms; a failing arm is
// recorded and the others go on; bad sweep files are refused (exit 2) before any arm runs; the
// doctor finds padding on a padded run and not on a packed one; report and tune work on a run;
// the report's plot options are checked and reach the plots' description with each run's factors.
#include <doctest/doctest.h>

#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string quickstart() { return std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml"; }

// A tiny quickstart: a few seconds per arm.
const char* const kTinySet = R"(
"model.d_model" = 32
"model.n_layers" = 2
"model.n_heads" = 2
"model.max_seq_len" = 64
"batching.batch_size" = 4
"batching.seq_len" = 64
"run.threads" = 2
"run.steps" = 12
"run.eval_every" = 6
"run.eval_batches" = 2
"checkpoint.every" = 6
"data.synthetic_probes.documents" = 400
"data.synthetic_probes.validation_documents" = 20
)";

const std::string kTinyFlags = " --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.max_seq_len=64"
                               " --set batching.batch_size=4 --set batching.seq_len=64 --set run.threads=2 --set run.eval_batches=2"
                               " --set data.synthetic_probes.documents=400 --set data.synthetic_probes.validation_documents=20";

std::vector<std::string> lines(const fs::path& p) {
  std::istringstream in(slurp(p));
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

// Every plot `ablate report` draws.
const char* const kPlots[] = {"loss_vs_step.png", "loss_vs_time.png", "loss_vs_real_tokens.png", "throughput.png", "padding.png"};

bool have_matplotlib() { return run_command("python3 -c 'import matplotlib'").exit_code == 0; }

std::string grid_sweep() {
  return "base = \"" + quickstart() + "\"\n[sweep]\nname = \"tiny\"\n[sweep.set]\n" + kTinySet +
         "[sweep.grid]\n\"batching.name\" = [\"padded\", \"packed\"]\n\"schedule.name\" = [\"cosine\", \"constant\"]\n";
}

}  // namespace

TEST_CASE("a 2x2 sweep gives four run directories, a four-row results table, the report and its plots, a rerun skips them") {
  TempDir tmp;
  const fs::path file = tmp.write("tiny.toml", grid_sweep());
  const fs::path out = tmp.path() / "out";
  const auto r = run_ablate("sweep " + file.string() + " --out " + out.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<std::string> arms = {"padded-cosine", "padded-constant", "packed-cosine", "packed-constant"};
  for (const std::string& a : arms) {
    CAPTURE(a);
    CHECK(fs::exists(out / a / "metrics.jsonl"));
    CHECK(json::parse(slurp(out / a / "summary.json"))["status"] == "completed");
    CHECK(json::parse(slurp(out / a / "arm.json"))["status"] == "completed");
  }
  // The arm's overrides reached its run: its resolved config says so.
  CHECK(contains(slurp(out / "padded-constant" / "config.toml"), "name = \"constant\""));
  CHECK(contains(slurp(out / "padded-constant" / "config.toml"), "name = \"padded\""));

  const auto csv = lines(out / "results.csv");
  REQUIRE(csv.size() == 5);
  CHECK(csv[0].rfind("arm,repeat,batching.name,schedule.name,status,final_loss,val_loss,tokens_per_s,real_tokens_per_s,mfu,"
                     "effective_mfu,mem_peak_bytes,optimizer_state_bytes,data_wait_pct,wall_s,error",
                     0) == 0);
  CHECK(csv[1].rfind("padded-cosine,0,padded,cosine,completed,", 0) == 0);
  const json results = json::parse(slurp(out / "results.json"));
  REQUIRE(results["arms"].size() == 4);
  for (const json& row : results["arms"]) {
    // The table's numbers are the arm's own summary.
    const json summary = json::parse(slurp(out / row["arm"].get<std::string>() / "summary.json"));
    CHECK(row["final_loss"].get<double>() == summary["final_loss"].get<double>());
    CHECK(row["real_tokens_per_s"].get<double>() == summary["real_tokens_per_s"].get<double>());
    CHECK(row["tokens_per_s"].get<double>() > 0);
  }
  // Padded rows carry padding: over the run, fewer real tokens than positions (summed, not the
  // table's medians: a median step may be one without padding, depending on which steps ran slow).
  CHECK(results["arms"][0]["effective_mfu"].get<double>() <= results["arms"][0]["mfu"].get<double>());
  int64_t real = 0, positions = 0;
  for (const json& m : metrics(out / "padded-cosine")) {
    real += m["real_tokens"].get<int64_t>();
    positions += m["tokens"].get<int64_t>();
  }
  CHECK(real < positions);

  const std::string report = slurp(out / "report.md");
  for (const std::string& a : arms) CHECK(contains(report, "| " + a + " |"));
  if (have_matplotlib()) {
    for (const char* png : kPlots) {
      CAPTURE(png);
      REQUIRE(fs::exists(out / png));
      CHECK(slurp(out / png).substr(1, 3) == "PNG");
      CHECK(contains(report, std::string("](") + png + ")"));
    }
  } else {
    MESSAGE("matplotlib is missing: plots not checked");
  }

  // A rerun skips the finished arms: nothing is trained again.
  const auto before = fs::last_write_time(out / "packed-cosine" / "metrics.jsonl");
  const auto again = run_ablate("sweep " + file.string() + " --out " + out.string());
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  std::size_t skipped = 0;
  for (std::size_t p = again.output.find("already completed, skipped"); p != std::string::npos;
       p = again.output.find("already completed, skipped", p + 1)) {
    ++skipped;
  }
  CHECK(skipped == 4);
  CHECK(fs::last_write_time(out / "packed-cosine" / "metrics.jsonl") == before);
  CHECK(lines(out / "results.csv").size() == 5);
}

TEST_CASE("a failing arm is recorded with its error and the other arms still run") {
  TempDir tmp;
  const std::string text = "base = \"" + quickstart() + "\"\n[sweep]\nname = \"fail\"\n[sweep.set]\n" + kTinySet +
                           "[[sweep.arms]]\nname = \"too-long\"\n\"batching.seq_len\" = 128\n"
                           "[[sweep.arms]]\nname = \"fine\"\n\"optimizer.lr\" = 0.001\n";
  const fs::path file = tmp.write("fail.toml", text);
  const fs::path out = tmp.path() / "out";
  const auto r = run_ablate("sweep " + file.string() + " --out " + out.string());
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "too-long: FAILED"));
  const json results = json::parse(slurp(out / "results.json"));
  REQUIRE(results["arms"].size() == 2);
  CHECK(results["arms"][0]["status"] == "failed");
  CHECK(contains(results["arms"][0]["error"].get<std::string>(), "max_seq_len"));
  CHECK(results["arms"][1]["status"] == "completed");
  CHECK(json::parse(slurp(out / "fine" / "summary.json"))["status"] == "completed");
  CHECK(contains(slurp(out / "results.csv"), "too-long,0,128,,failed"));
}

TEST_CASE("a bad sweep file or a bad arm is refused with exit 2 before any arm runs") {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  SUBCASE("TOML syntax: the file and line are named") {
    const fs::path f = tmp.write("bad.toml", "base = \"" + quickstart() + "\"\n[sweep\n");
    const auto r = run_ablate("sweep " + f.string() + " --out " + out.string());
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "bad.toml:2"));
  }
  SUBCASE("an unknown key of an arm names the arm and the key") {
    const fs::path f = tmp.write("bad.toml", "base = \"" + quickstart() + "\"\n[sweep.grid]\n\"optimizer.lrr\" = [0.1, 0.2]\n");
    const auto r = run_ablate("sweep " + f.string() + " --out " + out.string());
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "arm '0.1'"));
    CHECK(contains(r.output, "lrr"));
  }
  SUBCASE("a missing base experiment") {
    const fs::path f = tmp.write("bad.toml", "base = \"nowhere.toml\"\n");
    const auto r = run_ablate("sweep " + f.string() + " --out " + out.string());
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "nowhere.toml"));
  }
  SUBCASE("grid and arms together") {
    const fs::path f =
        tmp.write("bad.toml",
                  "base = \"" + quickstart() + "\"\n[sweep.grid]\n\"optimizer.lr\" = [0.1]\n[[sweep.arms]]\n\"optimizer.lr\" = 0.2\n");
    const auto r = run_ablate("sweep " + f.string() + " --out " + out.string());
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "not both"));
  }
  SUBCASE("a grid of 10^12 arms is refused by its count, before any arm is listed") {
    std::string axes;  // 12 axes of 10 values
    for (const char* k : {"run.seed", "optimizer.lr", "optimizer.eps", "optimizer.beta1", "optimizer.beta2", "optimizer.weight_decay",
                          "optimizer.grad_clip", "model.dropout", "schedule.warmup_steps", "run.eval_batches", "batching.batch_size",
                          "data.synthetic_probes.documents"}) {
      axes += std::string("\"") + k + "\" = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n";
    }
    const fs::path f = tmp.write("huge.toml", "base = \"" + quickstart() + "\"\n[sweep.grid]\n" + axes);
    const auto r = run_ablate("sweep " + f.string() + " --out " + out.string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "1000000000000 arms"));
  }
  SUBCASE("names that would leave the sweep directory") {
    const fs::path f =
        tmp.write("dots.toml", "base = \"" + quickstart() + "\"\n[sweep]\nname = \"..\"\n[sweep.grid]\n\"optimizer.lr\" = [0.1]\n");
    const auto r = run_ablate("sweep " + f.string());
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "not a plain directory name"));
    // An arm named ".." becomes "__": its directory stays inside the sweep's.
    const fs::path g =
        tmp.write("arm.toml", "base = \"" + quickstart() + "\"\n[[sweep.arms]]\nname = \"..\"\n\"optimizer.lr\" = 0.1\n");
    const auto d = run_ablate("sweep " + g.string() + " --out " + out.string() + " --dry-run");
    INFO(d.output);
    CHECK(d.exit_code == 0);
    CHECK(contains(d.output, "  __:"));
  }
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("doctor finds padding on a padded run of synthetic_probes and not on a packed one") {
  TempDir tmp;
  for (const char* batching : {"padded", "packed"}) {
    CAPTURE(batching);
    const fs::path run = tmp.path() / batching;
    // Rows of 512 positions: the probe logs' documents (mostly 130 to 300 tokens) leave half of a
    // padded row empty.
    const auto t = run_ablate("train " + quickstart() + kTinyFlags +
                              " --set model.max_seq_len=512 --set batching.seq_len=512 --set batching.batch_size=2"
                              " --set run.steps=10 --set batching.name=" +
                              batching + " --run-dir " + run.string());
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    const auto d = run_ablate("doctor " + run.string() + " --json");
    INFO(d.output);
    REQUIRE(d.exit_code == 0);
    const json findings = json::parse(d.output);
    REQUIRE(findings.is_array());
    const json* padding = nullptr;
    for (const json& f : findings) {
      for (const char* k : {"id", "severity", "message", "evidence"}) CHECK(f.contains(k));
      if (f["id"] == "padding") padding = &f;
    }
    if (std::string(batching) == "padded") {
      REQUIRE(padding != nullptr);
      const double pf = (*padding)["evidence"]["padding_fraction"].get<double>();
      CHECK(pf > 0.3);
      CHECK((*padding)["expected_speedup"].get<double>() == doctest::Approx(1.0 / (1.0 - pf)));
      CHECK(contains((*padding)["change"].get<std::string>(), "batching.name=packed"));
      const auto text = run_ablate("doctor " + run.string());
      CHECK(contains(text.output, "padding"));
    } else {
      CHECK(padding == nullptr);
    }
  }
  const auto missing = run_ablate("doctor " + (tmp.path() / "nothing").string());
  CHECK(missing.exit_code == 2);
}

TEST_CASE("doctor refuses a run.json, summary.json or metrics.jsonl field of the wrong type with exit 2 naming file and field") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + quickstart() + kTinyFlags + " --set run.steps=4 --run-dir " + run.string()).exit_code == 0);
  REQUIRE(run_ablate("doctor " + run.string()).exit_code == 0);
  // One field of a .json file, or of the first line of a .jsonl file, given another value.
  const auto rewrite = [](const fs::path& file, const std::string& key, const json& value) {
    std::vector<std::string> lines;
    std::istringstream in(slurp(file));
    if (file.extension() == ".jsonl") {
      for (std::string l; std::getline(in, l);) lines.push_back(l);
    } else {
      lines.push_back(slurp(file));
    }
    json j = json::parse(lines[0]);
    j[key] = value;
    lines[0] = j.dump();
    std::ofstream out(file);
    for (const auto& l : lines) out << l << "\n";
  };
  const std::string info = slurp(run / "run.json"), summary = slurp(run / "summary.json"), steps = slurp(run / "metrics.jsonl");
  const auto restore = [&] {
    std::ofstream(run / "run.json") << info;
    std::ofstream(run / "summary.json") << summary;
    std::ofstream(run / "metrics.jsonl") << steps;
  };
  const struct {
    const char* file;
    const char* key;
    json value;
    const char* named;
  } cases[] = {{"run.json", "activation_bytes", "lots", "run.json"},
               {"summary.json", "mfu", json::array({1, 2}), "summary.json"},
               {"metrics.jsonl", "step_ms", json::object({{"a", 1}}), "metrics.jsonl:1"}};
  for (const auto& c : cases) {
    CAPTURE(c.file);
    restore();
    rewrite(run / c.file, c.key, c.value);
    const auto d = run_ablate("doctor " + run.string());
    INFO(d.output);
    CHECK(d.exit_code == 2);
    CHECK(contains(d.output, c.named));
    CHECK(contains(d.output, std::string("'") + c.key + "'"));
  }
}

TEST_CASE("doctor suggests activation recomputation when the peak is near the memory budget, with the bytes it frees") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + quickstart() + kTinyFlags + " --set run.steps=4 --run-dir " + run.string()).exit_code == 0);
  json info = read_json(run / "run.json");
  const json by = info["activation_bytes_by_recompute"];
  REQUIRE(by["block"].get<double>() < by["mlp"].get<double>());
  REQUIRE(by["mlp"].get<double>() < by["none"].get<double>());
  CHECK(by["none"] == info["activation_bytes"]);
  // The budget as if the run's peak were 90% of it.
  double peak = 0;
  for (const json& m : metrics(run)) peak = std::max(peak, m["mem_peak_bytes"].get<double>());
  info["memory_bytes"] = peak / 0.9;
  std::ofstream(run / "run.json") << info.dump();
  const auto d = run_ablate("doctor " + run.string() + " --json");
  INFO(d.output);
  REQUIRE(d.exit_code == 0);
  const json* tight = nullptr;
  const json findings = json::parse(d.output);
  for (const json& f : findings) {
    if (f["id"] == "memory_tight") tight = &f;
  }
  REQUIRE(tight != nullptr);
  CHECK(contains((*tight)["change"].get<std::string>(), "run.recompute=mlp"));
  CHECK((*tight)["evidence"]["activation_bytes_suggested"] == by["mlp"]);
  // Already recomputing blocks: nothing more to free that way; a smaller micro-batch instead.
  info["recompute"] = "block";
  std::ofstream(run / "run.json") << info.dump();
  const auto e = run_ablate("doctor " + run.string());
  INFO(e.output);
  CHECK(contains(e.output, "memory_tight"));
  CHECK(contains(e.output, "batching.batch_size="));
}

TEST_CASE("doctor names bf16 for a GPU run in fp32 or tf32, with the GPU's peaks from the table, and not for a CPU run") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + quickstart() + kTinyFlags + " --set run.steps=4 --run-dir " + run.string()).exit_code == 0);
  const auto precision = [&]() -> std::optional<json> {
    const auto d = run_ablate("doctor " + run.string() + " --json");
    INFO(d.output);
    REQUIRE(d.exit_code == 0);
    for (const json& f : json::parse(d.output)) {
      if (f["id"] == "precision") return f;
    }
    return std::nullopt;
  };
  CHECK_FALSE(precision().has_value());  // a CPU run computes in fp32: nothing to change
  // The same run as if it had trained on an H100 in fp32, then in tf32, then in bf16.
  const std::string config = slurp(run / "config.toml");
  json info = read_json(run / "run.json");
  info["device_name"] = "cuda:0 NVIDIA H100 80GB HBM3";
  info["device_capabilities"] = {{"host_memory", false}, {"reduced_precision_products", true}, {"collective", "nccl"}};
  std::ofstream(run / "run.json") << info.dump();
  for (const char* dtype : {"fp32", "tf32", "bf16"}) {
    INFO("run.dtype " << dtype);
    std::string c = config;
    c.replace(c.find("device = \"cpu\""), 14, "device = \"cuda\"");
    c.replace(c.find("dtype = \"fp32\""), 14, std::string("dtype = \"") + dtype + "\"");
    std::ofstream(run / "config.toml") << c;
    const std::optional<json> f = precision();
    if (std::string(dtype) == "bf16") {
      CHECK_FALSE(f.has_value());
      continue;
    }
    REQUIRE(f.has_value());
    CHECK((*f)["change"] == "--set run.dtype=bf16");
    CHECK((*f)["severity"] == (std::string(dtype) == "fp32" ? "high" : "medium"));
    CHECK((*f)["evidence"]["peak_tflops_bf16"].get<double>() == doctest::Approx(989.4));
    CHECK((*f)["evidence"]["peak_tflops_tf32"].get<double>() == doctest::Approx(494.7));
  }
}

TEST_CASE("report on a run directory writes report.md and the plots") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + quickstart() + kTinyFlags + " --set run.steps=8 --run-dir " + run.string()).exit_code == 0);
  const auto r = run_ablate("report " + run.string());
  INFO(r.output);
  if (!have_matplotlib()) {
    CHECK(r.exit_code == 1);
    CHECK(contains(slurp(run / "report.md"), "Plots not drawn"));
    return;
  }
  REQUIRE(r.exit_code == 0);
  const std::string md = slurp(run / "report.md");
  CHECK(contains(md, "| status | completed |"));
  for (const char* png : kPlots) {
    CAPTURE(png);
    CHECK(fs::exists(run / png));
    CHECK(contains(md, std::string("](") + png + ")"));
  }
}

TEST_CASE("tune batch-size measures each micro-batch that fits and recommends one") {
  const auto r = run_ablate("tune batch-size " + quickstart() + kTinyFlags + " --max-batch 4 --steps 1 --json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.output.substr(r.output.find("{\n")));
  REQUIRE(j["trials"].size() == 3);
  for (const json& t : j["trials"]) {
    CHECK(t["fits"] == true);
    CHECK(t["tokens_per_s"].get<double>() > 0);
  }
  CHECK(j["trials"][2]["estimated_bytes"].get<int64_t>() > j["trials"][0]["estimated_bytes"].get<int64_t>());
  const int64_t rec = j["recommended"]["batch_size"].get<int64_t>();
  CHECK((rec == 1 || rec == 2 || rec == 4));
  // The global batch of the config (4 rows) is kept through accumulation.
  CHECK(rec * j["recommended"]["grad_accum_steps"].get<int64_t>() == 4);
  // Recomputation, by the plan: never fewer rows than without it, and the same where nothing binds.
  const json& by = j["largest_fitting_by_recompute"];
  CHECK(by["none"] == j["largest_fitting"]);
  CHECK(by["mlp"].get<int64_t>() >= by["none"].get<int64_t>());
  CHECK(by["block"].get<int64_t>() >= by["mlp"].get<int64_t>());
  // A budget too small for even one row is refused with the numbers, not crashed into.
  const auto small = run_ablate("tune batch-size " + quickstart() + kTinyFlags + " --set run.memory_budget_gib=0.001");
  INFO(small.output);
  CHECK(small.exit_code == 2);
  CHECK(contains(small.output, "run.memory_budget_gib"));
  CHECK(contains(small.output, "even a micro-batch of 1 row"));
}

TEST_CASE("tune batch-size --plan-only trains nothing and recommends the largest micro-batch the plan fits") {
  // The tiny model fits 64 rows in any machine's memory: the plan's answer, with no timing.
  const auto r = run_ablate("tune batch-size " + quickstart() + kTinyFlags + " --max-batch 64 --plan-only --json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.output.substr(r.output.find("{\n")));
  CHECK(j["plan_only"] == true);
  int64_t largest = 0;
  for (const json& t : j["trials"]) {
    CHECK(t["step_ms"].get<double>() == 0.0);  // nothing was timed
    if (t["fits"].get<bool>()) largest = t["batch_size"].get<int64_t>();
  }
  CHECK(j["largest_fitting"] == largest);
  CHECK(j["recommended"]["batch_size"] == largest);
  CHECK(largest == 64);
  CHECK(largest == j["largest_fitting_by_recompute"]["none"].get<int64_t>());
  // Each size fits exactly when its estimate stays under 90% of the budget.
  const json& trials = j["trials"];
  const int64_t budget = j["budget_bytes"].get<int64_t>();
  for (const json& t : trials) {
    CHECK(t["fits"].get<bool>() == (double(t["estimated_bytes"].get<int64_t>()) <= 0.9 * double(budget)));
  }
}

TEST_CASE(
    "report reads a sweep's files typed: nesting, wrong types and escaping arm names exit 2 naming the file, extras are dropped") {
  TempDir tmp;
  const auto write = [](const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  };
  const auto sweep = [&](const std::string& name, const std::string& arms, const std::string& summary) {
    const fs::path d = tmp.path() / name;
    write(d / "arms.json", R"({"name": "s", "base": "b.toml", "axes": [], "arms": )" + arms + "}");
    write(d / "a" / "arm.json", R"({"status": "completed", "repeat": 0, "overrides": {}})");
    write(d / "a" / "summary.json", summary);
    return d;
  };
  const std::string ok_summary = R"({"status": "completed", "steps": 3, "final_loss": 1.5})";
  std::string deep = "1";
  for (int i = 0; i < 5000; ++i) deep = "[" + deep + "]";
  struct Bad {
    fs::path dir;
    std::string file;
    std::string words;
  };
  const Bad bad[] = {
      {sweep("deep", R"(["a"])", R"({"status": "completed", "final_loss": )" + deep + "}"), "summary.json", "nests deeper"},
      {sweep("typed", R"(["a"])", R"({"status": "completed", "final_loss": "low"})"), "summary.json", "field 'final_loss' is string"},
      {sweep("escape", R"([".."])", ok_summary), "arms.json", "not a plain directory name"},
      {sweep("slash", R"(["a/../../x"])", ok_summary), "arms.json", "not a plain directory name"},
      {sweep("arms", R"(7)", ok_summary), "arms.json", "field 'arms' is not a list"},
  };
  for (const Bad& b : bad) {
    INFO(b.dir.string());
    const auto r = run_ablate("report " + b.dir.string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, b.file));
    CHECK(contains(r.output, b.words));
  }
  // Unknown and oversized-in-spirit fields never reach results.json.
  const fs::path extra = sweep("extra", R"(["a"])", R"({"status": "completed", "final_loss": 1.5, "junk": {"x": [1, 2, 3]}})");
  run_ablate("report " + extra.string());  // the plots may fail for want of metrics; results.json comes first
  const json results = read_json(extra / "results.json");
  REQUIRE(results["arms"].size() == 1);
  CHECK(results["arms"][0]["final_loss"] == 1.5);
  CHECK_FALSE(slurp(extra / "results.json").find("junk") != std::string::npos);
}

namespace {

// A finished sweep written by hand (no training): arms.json with `axes`, and per arm arm.json,
// summary.json, metrics.jsonl (64 positions a step, `padding` of them padding, a validation loss
// every 5th step) and, when given, a resolved config.toml.
struct CraftedArm {
  std::string name;
  std::string overrides;  // JSON object
  int padding = 0;
  std::string config_toml;
};

fs::path crafted_sweep(const fs::path& dir, const std::vector<std::string>& axes, const std::vector<CraftedArm>& arms) {
  json order = {{"name", "crafted"}, {"base", "base.toml"}, {"axes", axes}, {"repeats", 1}, {"arms", json::array()}};
  for (const CraftedArm& a : arms) {
    order["arms"].push_back(a.name);
    const fs::path d = dir / a.name;
    fs::create_directories(d);
    std::ofstream(d / "arm.json") << R"({"status": "completed", "repeat": 0, "group": ")" << a.name << R"(", "overrides": )"
                                  << a.overrides << "}";
    const double real_tps = 1000.0 * (64 - a.padding) / 64;
    std::ofstream(d / "summary.json") << R"({"status": "completed", "steps": 20, "final_loss": 2.0, "val_loss": 2.1,)"
                                      << R"( "tokens_per_s": 1000.0, "real_tokens_per_s": )" << real_tps << "}";
    std::ofstream m(d / "metrics.jsonl");
    for (int s = 1; s <= 20; ++s) {
      json row = {{"step", s},
                  {"loss", 4.0 / (1 + 0.1 * s)},
                  {"step_ms", 64.0},
                  {"tokens", 64},
                  {"real_tokens", 64 - a.padding},
                  {"padding_fraction", a.padding / 64.0},
                  {"tokens_per_s", 1000.0},
                  {"real_tokens_per_s", real_tps},
                  {"elapsed_s", 0.064 * s}};
      if (s % 5 == 0) row["val_loss"] = 4.1 / (1 + 0.1 * s);
      m << row.dump() << "\n";
    }
    if (!a.config_toml.empty()) std::ofstream(d / "config.toml") << a.config_toml;
  }
  fs::create_directories(dir);
  std::ofstream(dir / "arms.json") << order.dump(2);
  return dir;
}

std::vector<CraftedArm> grid_arms() {
  std::vector<CraftedArm> out;
  for (const char* b : {"padded", "packed"}) {
    for (const char* o : {"adamw", "adamw8bit"}) {
      out.push_back({std::string(b) + "-" + o, json({{"batching.name", b}, {"optimizer.name", o}}).dump(),
                     std::string(b) == "padded" ? 16 : 0, ""});
    }
  }
  return out;
}

// An interpreter for the plotting script that keeps a copy of the description it was given
// (ablate deletes it after drawing), then runs python3.
std::string spy_python(const TempDir& tmp) {
  const fs::path spy = tmp.write("spy-python.sh", "#!/bin/sh\ncp \"$2\" \"$(dirname \"$2\")/spec-seen.json\"\nexec python3 \"$@\"\n");
  fs::permissions(spy, fs::perms::owner_all, fs::perm_options::add);
  return "ABLATE_PYTHON=" + spy.string();
}

}  // namespace

TEST_CASE("report on a sweep: loss against real tokens, padding per arm, each run's factors in the plots' description") {
  TempDir tmp;
  const fs::path dir = crafted_sweep(tmp.path() / "grid", {"batching.name", "optimizer.name"}, grid_arms());
  const std::string env = spy_python(tmp);
  const bool plots = have_matplotlib();

  // Defaults: colour by the first factor, line style by the second, curves smoothed (several arms
  // overlap), linear loss axis.
  auto r = run_ablate("report " + dir.string(), env);
  INFO(r.output);
  CHECK(r.exit_code == (plots ? 0 : 1));
  json spec = read_json(dir / "spec-seen.json");
  CHECK(spec["factors"] == json({"batching.name", "optimizer.name"}));
  CHECK(spec["color_by"] == "batching.name");
  CHECK(spec["style_by"] == "optimizer.name");
  CHECK(spec["smooth"].get<double>() == doctest::Approx(0.6));
  CHECK(spec["log_y"] == false);
  REQUIRE(spec["runs"].size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    const std::string label = spec["runs"][i]["label"].get<std::string>();
    CAPTURE(label);
    const json& f = spec["runs"][i]["factors"];
    CHECK(label == f["batching.name"].get<std::string>() + "-" + f["optimizer.name"].get<std::string>());
  }
  std::string md = slurp(dir / "report.md");
  if (plots) {
    for (const char* png : kPlots) {
      CAPTURE(png);
      CHECK(slurp(dir / png).substr(1, 3) == "PNG");
      CHECK(contains(md, std::string("](") + png + ")"));
    }
    CHECK(contains(md, "colour by `batching.name`, line style by `optimizer.name`"));
    // One repeat per arm: no whiskers promised.
    CHECK_FALSE(contains(md, "whiskers"));
  }

  // Chosen: colour and style swapped (by section name), smoothed, log scale.
  r = run_ablate("report " + dir.string() + " --smooth 0.9 --log-y --color-by optimizer --style-by batching", env);
  INFO(r.output);
  CHECK(r.exit_code == (plots ? 0 : 1));
  spec = read_json(dir / "spec-seen.json");
  CHECK(spec["color_by"] == "optimizer.name");
  CHECK(spec["style_by"] == "batching.name");
  CHECK(spec["smooth"].get<double>() == doctest::Approx(0.9));
  CHECK(spec["log_y"] == true);
  if (plots) {
    md = slurp(dir / "report.md");
    CHECK(contains(md, "colour by `optimizer.name`, line style by `batching.name`"));
    CHECK(contains(md, "weight 0.9"));
  }

  // One factor: colour only. An arm of an explicit list that leaves a factor to the base gets the
  // value its resolved config ran with.
  const fs::path one =
      crafted_sweep(tmp.path() / "one", {"batching.name"},
                    {{"a", R"({"batching.name": "padded"})", 16, ""}, {"b", R"({"batching.name": "packed"})", 0, ""}});
  r = run_ablate("report " + one.string(), env);
  INFO(r.output);
  spec = read_json(one / "spec-seen.json");
  CHECK(spec["color_by"] == "batching.name");
  CHECK(spec["style_by"].is_null());
  const fs::path listed =
      crafted_sweep(tmp.path() / "listed", {"batching.name", "optimizer.name"},
                    {{"baseline", R"({"batching.name": "padded"})", 16, "[optimizer]\nname = \"adamw\"\nlr = 0.003\n"},
                     {"eight", R"({"batching.name": "packed", "optimizer.name": "adamw8bit"})", 0, ""}});
  r = run_ablate("report " + listed.string(), env);
  INFO(r.output);
  spec = read_json(listed / "spec-seen.json");
  REQUIRE(spec["runs"].size() == 2);
  CHECK(spec["runs"][0]["factors"] == json({{"batching.name", "padded"}, {"optimizer.name", "adamw"}}));
  CHECK(spec["runs"][1]["factors"] == json({{"batching.name", "packed"}, {"optimizer.name", "adamw8bit"}}));
}

TEST_CASE("report's plot options are checked: bad values and unknown factors exit 2 naming the option") {
  TempDir tmp;
  const fs::path dir = crafted_sweep(tmp.path() / "grid", {"batching.name", "optimizer.name"}, grid_arms());
  struct Bad {
    std::string args;
    std::vector<std::string> words;
  };
  const Bad bad[] = {
      {"--smooth 1", {"--smooth", "[0, 1)"}},
      {"--smooth -0.1", {"--smooth", "[0, 1)"}},
      {"--smooth nan", {"--smooth"}},
      {"--smooth lots", {"--smooth"}},
      {"--color-by attention", {"--color-by", "unknown factor 'attention'", "batching.name, optimizer.name"}},
      {"--style-by nope.name", {"--style-by", "unknown factor 'nope.name'", "batching.name, optimizer.name"}},
      {"--color-by batching --style-by batching.name", {"--style-by", "'batching.name' is the --color-by factor too"}},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.args);
    const auto r = run_ablate("report " + dir.string() + " " + b.args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    for (const std::string& w : b.words) CHECK(contains(r.output, w));
  }
  CHECK_FALSE(fs::exists(dir / "report.md"));

  // A section shared by two factors is ambiguous; a run directory has no factors at all.
  const fs::path two = crafted_sweep(tmp.path() / "two", {"optimizer.name", "optimizer.lr"}, {});
  auto r = run_ablate("report " + two.string() + " --color-by optimizer");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--color-by"));
  CHECK(contains(r.output, "could be optimizer.name or optimizer.lr"));
  const fs::path run = tmp.write("run/metrics.jsonl", "{\"step\": 1, \"loss\": 4.0}\n").parent_path();
  r = run_ablate("report " + run.string() + " --style-by batching.name");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--style-by"));
  CHECK(contains(r.output, "has no factors"));

  // `ablate sweep` takes the same options and checks them against its axes before any arm runs.
  const fs::path file = tmp.write("tiny.toml", grid_sweep());
  const fs::path out = tmp.path() / "out";
  r = run_ablate("sweep " + file.string() + " --out " + out.string() + " --smooth 1.5");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--smooth"));
  r = run_ablate("sweep " + file.string() + " --out " + out.string() + " --color-by optimizer");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "batching.name, schedule.name"));
  CHECK_FALSE(fs::exists(out));
  r = run_ablate("sweep " + file.string() + " --out " + out.string() + " --color-by schedule --log-y --dry-run");
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

TEST_CASE("ablate_plots.py: real tokens seen, smoothing, no whiskers for one repeat, colour and style by factor, its files") {
  const std::string src = ABLATE_SOURCE_DIR;
  const auto r = run_command("python3 " + src + "/tests/experiments/test_ablate_plots.py " + src + "/tools/ablate_plots.py");
  INFO(r.output);
  CHECK(r.exit_code == 0);  // matplotlib missing is a failure too: scripts/setup.sh installs it
}
