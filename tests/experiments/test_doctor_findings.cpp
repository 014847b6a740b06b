// The doctor's findings about the loss and about the timings. A real tiny run gives the run
// directory; its metrics.jsonl is then replaced by losses planted here (a falling curve with
// bounded noise, a spike at a known step, a loss going non-finite or rising at the end) and its
// summary.json given planted timing figures, so each finding is checked against what was planted.
// Real runs check the other side: clean tiny quickstart runs give no loss finding, and one with a
// learning rate far too large and no clipping does spike. summary.json's step_time_cv is checked
// against the run's own logged step times.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// tests/probes/probe_inputs.py's tiny model: a run of a hundred steps takes well under a second.
const std::string kTiny = " --set model.d_model=32 --set model.n_layers=1 --set model.n_heads=2 --set batching.seq_len=32"
                          " --set model.max_seq_len=32 --set run.eval_batches=1 --set run.threads=1 --set data.workers=0";

fs::path train(const TempDir& tmp, const std::string& name, const std::string& sets) {
  const fs::path run = tmp.path() / name;
  const auto t =
      run_ablate("train " + std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml" + kTiny + sets + " --run-dir " + run.string());
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  return run;
}

json doctor(const fs::path& run) {
  const auto d = run_ablate("doctor " + run.string() + " --json");
  INFO(d.output);
  REQUIRE(d.exit_code == 0);
  return json::parse(d.output);
}

std::optional<json> finding(const json& findings, const std::string& id) {
  for (const json& f : findings) {
    if (f["id"] == id) return f;
  }
  return std::nullopt;
}

// A cpu run's directory made to read as a GPU run's: its config's device and run.json's device
// answers (as a GPU's plugin gives them); returns the run.json written.
json as_gpu_run(const fs::path& run, const json& info) {
  std::string config = slurp(run / "config.toml");
  config.replace(config.find("device = \"cpu\""), 14, "device = \"cuda\"");
  std::ofstream(run / "config.toml") << config;
  json gpu_info = info;
  gpu_info["device_capabilities"] = {{"host_memory", false}, {"reduced_precision_products", true}, {"collective", "nccl"}};
  std::ofstream(run / "run.json") << gpu_info.dump();
  return gpu_info;
}

// The finding `id` once summary.json says the run reached `mfu` with step-time spread `cv` on an
// otherwise idle machine (the rest of the summary as the run wrote it).
std::optional<json> with_timing(const fs::path& run, const std::string& id, double mfu, double cv) {
  json summary = read_json(run / "summary.json");
  summary["mfu"] = mfu;
  summary["step_time_cv"] = cv;
  summary["machine_load"] = 0.0;
  std::ofstream(run / "summary.json") << summary.dump();
  return finding(doctor(run), id);
}

// The planted loss without noise: falling from 4.2 towards 2.2.
double curve(int64_t step) { return 2.2 + 2.0 * std::exp(-double(step) / 25.0); }
constexpr double kNoise = 0.03;  // the planted noise lies in [-kNoise, kNoise]
constexpr double kGrad = 0.6;    // the planted gradient norm's centre

// A run's own rows, written back with losses and gradient norms planted: `loss(step, noisy)` and
// `grad(step, noisy)` get the planted values with their noise and return the ones to write (NaN:
// null, as the trainer writes a NaN or an infinity).
struct Planter {
  fs::path run;
  std::vector<json> rows = metrics(run);

  template <typename Loss, typename Grad>
  void operator()(Loss loss, Grad grad) const {
    std::mt19937 gen(7);
    const auto unit = [&] { return double(gen()) / 4294967296.0 - 0.5; };  // [-0.5, 0.5), the same everywhere
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      const int64_t s = r["step"].get<int64_t>();
      const double l = loss(s, curve(s) + 2 * kNoise * unit()), g = grad(s, kGrad + 0.2 * unit());
      r["loss"] = std::isfinite(l) ? json(l) : json(nullptr);
      r["grad_norm"] = std::isfinite(g) ? json(g) : json(nullptr);
      out << r.dump() << "\n";
    }
  }
};

double same(int64_t, double v) { return v; }

}  // namespace

TEST_CASE(
    "doctor finds a planted loss spike: its steps, the loss before and after, the gradient norm, and lr, warmup and clip from the config") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=120");
  const Planter plant{run};
  REQUIRE(plant.rows.size() == 120);

  // Steps 80-82 above the level (a spike that lasts: the weights, not one hard batch), the
  // gradient norm at 7.5 at step 80; back at the curve from step 83.
  const auto spiked = [](int64_t s, double v) { return v + (s == 80 ? 1.2 : s == 81 ? 0.8 : s == 82 ? 0.4 : 0.0); };
  const auto jump = [](int64_t s, double g) { return s == 80 ? 7.5 : g; };
  plant(spiked, jump);
  const json findings = doctor(run);
  const std::optional<json> f = finding(findings, "loss_spike");
  REQUIRE(f.has_value());
  CHECK_FALSE(finding(findings, "diverged").has_value());
  const json& spikes = (*f)["evidence"]["spikes"];
  REQUIRE(spikes.size() == 1);
  const json& s = spikes[0];
  CHECK(s["first_step"] == 80);
  CHECK(s["last_step"] == 82);
  // The level is the median of the 20 losses before it: within the planted curve's range there.
  CHECK(s["loss_before"].get<double>() >= curve(79) - kNoise);
  CHECK(s["loss_before"].get<double>() <= curve(60) + kNoise);
  CHECK(s["loss"].get<double>() == doctest::Approx(curve(80) + 1.2).epsilon(kNoise / 3));
  CHECK(s["grad_norm"].get<double>() == 7.5);
  CHECK(s["grad_norm_before"].get<double>() == doctest::Approx(kGrad).epsilon(0.2));
  CHECK(s["lr_at_spike"].get<double>() == doctest::Approx(plant.rows[79]["lr"].get<double>()));
  CHECK((*f)["severity"] == "medium");  // back at the curve by the end; the rise over a quarter
  CHECK(contains((*f)["message"].get<std::string>(), "over steps 80-82"));
  // The quickstart's lr 3e-3, warm-up 20 steps and clip 1.0: half the lr, twice the warm-up.
  CHECK(contains((*f)["change"].get<std::string>(), "--set optimizer.lr=0.0015 --set schedule.warmup_steps=40"));
  CHECK_FALSE(contains((*f)["change"].get<std::string>(), "grad_clip="));
  CHECK((*f)["evidence"]["grad_clip"].get<double>() == 1.0);

  SUBCASE("without clipping the change turns it on") {
    std::string config = slurp(run / "config.toml");
    REQUIRE(contains(config, "grad_clip = 1.0"));
    config.replace(config.find("grad_clip = 1.0"), 15, "grad_clip = 0.0");
    std::ofstream(run / "config.toml") << config;
    const std::optional<json> g = finding(doctor(run), "loss_spike");
    REQUIRE(g.has_value());
    CHECK(contains((*g)["change"].get<std::string>(), "--set optimizer.grad_clip=1.0"));
  }
  SUBCASE("a spike the run does not come back from is high") {
    plant([](int64_t s, double v) { return s >= 80 ? v + 1.2 : v; }, jump);
    const std::optional<json> g = finding(doctor(run), "loss_spike");
    REQUIRE(g.has_value());
    CHECK((*g)["severity"] == "high");
    CHECK((*g)["evidence"]["spikes"][0]["last_step"] == 120);
  }
  SUBCASE("the same curve without the spike, or with only half of it, is no finding") {
    plant(same, same);
    CHECK_FALSE(finding(doctor(run), "loss_spike").has_value());
    plant(spiked, same);  // the loss jumps, the gradient norm does not
    CHECK_FALSE(finding(doctor(run), "loss_spike").has_value());
    plant(same, jump);  // the gradient norm jumps, the loss does not
    CHECK_FALSE(finding(doctor(run), "loss_spike").has_value());
    // One hard batch: step 80 alone far above the level, step 81 back on the curve.
    plant([](int64_t s, double v) { return s == 80 ? v + 1.2 : v; }, jump);
    CHECK_FALSE(finding(doctor(run), "loss_spike").has_value());
    CHECK_FALSE(finding(doctor(run), "diverged").has_value());
  }
}

TEST_CASE("doctor says diverged for a loss that is not finite and for one rising over the end of the run") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=120");
  const Planter plant{run};
  const double nan = std::nan("");

  plant([&](int64_t s, double v) { return s == 100 ? nan : v; }, [&](int64_t s, double g) { return s == 100 ? nan : g; });
  std::optional<json> f = finding(doctor(run), "diverged");
  REQUIRE(f.has_value());
  CHECK(f->at("severity") == "high");
  CHECK(f->at("evidence")["nonfinite_step"] == 100);
  CHECK(contains(f->at("message").get<std::string>(), "from step 100"));
  CHECK(contains(f->at("change").get<std::string>(), "--set optimizer.lr=0.0015"));

  // Falling to step 80, then rising 0.02 per step: the last quarter (steps 91-120) rises 0.58.
  plant([](int64_t s, double v) { return s > 80 ? v + 0.02 * double(s - 80) : v; }, same);
  f = finding(doctor(run), "diverged");
  REQUIRE(f.has_value());
  const json& e = f->at("evidence");
  CHECK(e["rising_from_step"] == 91);
  CHECK(e["rising_to_step"] == 120);
  const double planted = (curve(120) + 0.8) - (curve(91) + 0.22);
  CHECK(e["fitted_loss_end"].get<double>() - e["fitted_loss_start"].get<double>() == doctest::Approx(planted).epsilon(0.15));
  CHECK_FALSE(e.contains("nonfinite_step"));

  // The same rise at half a percent of the loss over the quarter is noise-sized: no finding.
  plant([](int64_t s, double v) { return s > 90 ? v + 0.0004 * double(s - 90) : v; }, same);
  CHECK_FALSE(finding(doctor(run), "diverged").has_value());
}

TEST_CASE("real runs: clean tiny quickstart runs give no loss finding, one with lr 1 and no clipping spikes") {
  TempDir tmp;
  for (const char* seed : {"1", "2", "3"}) {
    CAPTURE(seed);
    const json findings = doctor(train(tmp, std::string("clean") + seed, std::string(" --set run.steps=300 --set run.seed=") + seed));
    for (const char* id : {"loss_spike", "diverged", "above_uniform", "warmup_blowup", "eval_plateau"}) {
      CAPTURE(id);
      CHECK_FALSE(finding(findings, id).has_value());
    }
  }
  const fs::path wild = train(tmp, "wild",
                              " --set run.steps=200 --set optimizer.lr=1.0 --set optimizer.grad_clip=0 "
                              "--set schedule.name=constant");
  const std::optional<json> f = finding(doctor(wild), "loss_spike");
  REQUIRE(f.has_value());
  // The largest spike the doctor names, checked against the run's own log.
  double worst = 0;
  for (const json& s : (*f)["evidence"]["spikes"]) {
    CHECK(s["loss"].get<double>() > 1.1 * s["loss_before"].get<double>());
    bool logged = false;
    for (const json& m : metrics(wild))
      logged |= m["step"] == s["first_step"] && m["loss"].get<double>() >= 1.1 * s["loss_before"].get<double>();
    CHECK(logged);
    worst = std::max(worst, s["loss"].get<double>() / s["loss_before"].get<double>());
  }
  CHECK(worst > 1.5);
  CHECK(contains((*f)["change"].get<std::string>(),
                 "--set optimizer.lr=0.5 --set schedule.warmup_steps=40 --set optimizer.grad_clip=1.0"));
}

TEST_CASE("summary.json's step_time_cv is the spread of the counted steps' times, machine_load and cpu_steal are fractions") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=30");
  const json summary = read_json(run / "summary.json");
  std::vector<double> ms;
  for (const json& m : metrics(run)) {
    if (m["step"].get<int64_t>() > 1) ms.push_back(m["step_ms"].get<double>());  // the first step is warm-up
  }
  REQUIRE(ms.size() == 29);
  double mean = 0, var = 0;
  for (double x : ms) mean += x / double(ms.size());
  for (double x : ms) var += (x - mean) * (x - mean) / double(ms.size());
  CHECK(summary["step_time_cv"].get<double>() == doctest::Approx(std::sqrt(var) / mean).epsilon(1e-6));
#ifdef __linux__
  const double load = summary["machine_load"].get<double>(), steal = summary["cpu_steal"].get<double>();
  CHECK(load >= 0);
  CHECK(load <= 1);
  CHECK(steal >= 0);
  CHECK(steal <= load);
#endif
}

TEST_CASE("doctor calls timings unusable past the CV or machine-load limit, names the number, and qualifies throughput advice") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=30");
  json summary = read_json(run / "summary.json");
  const auto timing = [&](double cv, double load, double steal) {
    summary["step_time_cv"] = cv;
    summary["machine_load"] = load;
    summary["cpu_steal"] = steal;
    std::ofstream(run / "summary.json") << summary.dump();
    return doctor(run);
  };
  CHECK_FALSE(finding(timing(0.05, 0.02, 0.0), "noisy_timings").has_value());
  CHECK_FALSE(finding(timing(0.25, 0.25, 0.0), "noisy_timings").has_value());  // at the limits: still usable

  std::optional<json> f = finding(timing(0.4, 0.02, 0.0), "noisy_timings");
  REQUIRE(f.has_value());
  CHECK(f->at("severity") == "high");
  CHECK(f->at("evidence")["step_time_cv"].get<double>() == 0.4);
  CHECK(contains(f->at("message").get<std::string>(), "coefficient of variation of 0.40"));

  f = finding(timing(0.05, 0.6, 0.1), "noisy_timings");
  REQUIRE(f.has_value());
  CHECK(f->at("evidence")["machine_load"].get<double>() == 0.6);
  CHECK(contains(f->at("message").get<std::string>(), "other processes used 60% of the machine's CPU time"));
  CHECK(contains(f->at("message").get<std::string>(), "10% stolen by the hypervisor"));
  CHECK_FALSE(finding(timing(0.05, 0.6, 0.1), "step_jitter").has_value());  // said once, by noisy_timings

  // The data wait planted at 40% of every step: input_bound, with its expected speed-up where the
  // timings are usable and without it (qualified) where they are not.
  const std::vector<json> rows = metrics(run);
  {
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      r["data_wait_pct"] = 40.0;
      out << r.dump() << "\n";
    }
  }
  std::optional<json> wait = finding(timing(0.05, 0.02, 0.0), "input_bound");
  REQUIRE(wait.has_value());
  CHECK((*wait)["expected_speedup"].get<double>() == doctest::Approx(1.0 / 0.6));
  CHECK_FALSE((*wait)["evidence"].contains("timings_unusable"));
  wait = finding(timing(0.05, 0.6, 0.0), "input_bound");
  REQUIRE(wait.has_value());
  CHECK_FALSE(wait->contains("expected_speedup"));
  CHECK((*wait)["evidence"]["timings_unusable"] == true);
  CHECK(contains((*wait)["message"].get<std::string>(), "see noisy_timings"));
}

TEST_CASE("doctor advises a larger micro-batch only for a memory-bound GPU run with headroom, the lr as a suggestion to verify") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=12");
  // A CPU run computes at its cores' rate: headroom alone (this run's peak is under 1% of the
  // machine's memory) is no reason for another batch size.
  const json info = read_json(run / "run.json");
  REQUIRE(info["memory_bytes"].get<double>() > 2 * metrics(run).back()["mem_peak_bytes"].get<double>());
  CHECK_FALSE(finding(doctor(run), "memory_headroom").has_value());

  // The cpu answered that it computes in host memory without reduced-precision units: no GPU advice.
  CHECK(info["device_capabilities"]["host_memory"] == true);
  CHECK(info["device_capabilities"]["reduced_precision_products"] == false);
  CHECK_FALSE(finding(doctor(run), "attention").has_value());
  CHECK_FALSE(finding(doctor(run), "precision").has_value());

  // The same run as if on a GPU (its device's answers in run.json): memory-bound below 30% MFU
  // with quiet timings.
  json gpu_info = as_gpu_run(run, info);
  const auto with = [&](double mfu, double cv) { return with_timing(run, "memory_headroom", mfu, cv); };
  const std::optional<json> f = with(0.1, 0.02);
  REQUIRE(f.has_value());
  const int64_t nb = (*f)["evidence"]["suggested_batch_size"].get<int64_t>();
  CHECK(nb > 8);
  CHECK((*f)["evidence"]["mfu"].get<double>() == 0.1);
  // The global batch grows (no accumulation to trade): the square-root rule's lr, said to be verified.
  const double lr = 3e-3 * std::sqrt(double(nb) / 8.0);
  CHECK((*f)["evidence"]["sqrt_scaled_lr"].get<double>() == doctest::Approx(lr));
  CHECK(contains((*f)["change"].get<std::string>(), "suggestion, to verify"));
  CHECK_FALSE(with(0.6, 0.02).has_value());  // compute-bound
  CHECK_FALSE(with(0.1, 0.5).has_value());   // timings unusable: its MFU is not a measurement

  // fp32 products on a device with reduced-precision units: bf16 advised.
  const std::optional<json> precision = finding(doctor(run), "precision");
  REQUIRE(precision.has_value());
  CHECK((*precision)["severity"] == "high");
  CHECK(contains((*precision)["change"].get<std::string>(), "run.dtype=bf16"));

  // A naive attention backend there: the advice names a backend the run's plugins register for its
  // device, and there is none without one.
  std::string config = slurp(run / "config.toml");
  config.replace(config.find("name = \"naive_cpu\""), 18, "name = \"naive_cuda\"");
  std::ofstream(run / "config.toml") << config;
  gpu_info["plugins"] = json::array({{{"kind", "attention"}, {"name", "naive_cpu"}, {"devices", {"cpu"}}}});
  std::ofstream(run / "run.json") << gpu_info.dump();
  CHECK_FALSE(finding(doctor(run), "attention").has_value());
  gpu_info["plugins"].push_back({{"kind", "attention"}, {"name", "naive_cuda"}, {"devices", {"cuda"}}});
  gpu_info["plugins"].push_back({{"kind", "attention"}, {"name", "flash_x"}, {"devices", {"cuda"}}});
  std::ofstream(run / "run.json") << gpu_info.dump();
  const std::optional<json> attention = finding(doctor(run), "attention");
  REQUIRE(attention.has_value());
  CHECK((*attention)["change"] == "--set attention.name=flash_x");
}

TEST_CASE("doctor finds a loss above a uniform prediction and a warm-up blow-up, with the run's own numbers") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=120");
  const Planter plant{run};
  REQUIRE(plant.rows.size() == 120);
  REQUIRE(read_json(run / "run.json")["vocab_size"] == 80);
  const double uniform = std::log(80.0);  // 4.382; the planted curve starts at 4.2, under it
  // Steps 6-14 blown up during the quickstart's 20-step warm-up, at most 7.0 at step 10, then back.
  const auto blown = [](int64_t s, double v) { return s >= 6 && s <= 14 ? 7.0 - 0.25 * double(std::abs(s - 10)) : v; };
  plant(blown, same);
  const json findings = doctor(run);
  const std::optional<json> u = finding(findings, "above_uniform");
  REQUIRE(u.has_value());
  const json& e = (*u)["evidence"];
  CHECK(e["uniform_loss"].get<double>() == doctest::Approx(uniform));
  CHECK(e["worst_step"] == 10);
  CHECK(e["worst_loss"].get<double>() == 7.0);
  CHECK(e["steps_above"] == 9);         // 6.0 at steps 6 and 14 is over 1.05 x 4.382 = 4.60 too
  CHECK((*u)["severity"] == "medium");  // back under it by the end
  CHECK(contains((*u)["message"].get<std::string>(), "the loss rose to 7 at step 10, above ln 80 = 4.382"));
  CHECK(contains((*u)["change"].get<std::string>(), "--set optimizer.lr=0.0015 --set schedule.warmup_steps=40"));
  const std::optional<json> w = finding(findings, "warmup_blowup");
  REQUIRE(w.has_value());
  CHECK((*w)["evidence"]["peak_step"] == 10);
  CHECK((*w)["evidence"]["peak_loss"].get<double>() == 7.0);
  CHECK((*w)["evidence"]["first_loss"].get<double>() == doctest::Approx(curve(1)).epsilon(kNoise));
  CHECK((*w)["evidence"]["lr_at_peak"].get<double>() == doctest::Approx(plant.rows[9]["lr"].get<double>()));
  CHECK(contains((*w)["message"].get<std::string>(), "during the warm-up (20 steps) the loss rose from"));

  SUBCASE("a run that never comes back is high on both") {
    plant([](int64_t s, double v) { return s >= 6 ? 7.0 : v; }, same);
    const json f = doctor(run);
    REQUIRE(finding(f, "above_uniform").has_value());
    CHECK((*finding(f, "above_uniform"))["severity"] == "high");
    REQUIRE(finding(f, "warmup_blowup").has_value());
    CHECK((*finding(f, "warmup_blowup"))["severity"] == "high");
  }
  SUBCASE("a blow-up after the warm-up is above uniform but no warm-up finding") {
    plant([](int64_t s, double v) { return s >= 60 && s <= 64 ? 6.5 : v; }, same);
    const json f = doctor(run);
    CHECK(finding(f, "above_uniform").has_value());
    CHECK_FALSE(finding(f, "warmup_blowup").has_value());
  }
  SUBCASE("a rise that stays under both thresholds, one step alone, or the clean curve: no finding") {
    // 15% over the first loss needs 4.74; 4.55 is under it and under 1.05 ln 80 = 4.60.
    plant([](int64_t s, double v) { return s >= 6 && s <= 14 ? 4.55 : v; }, same);
    CHECK_FALSE(finding(doctor(run), "warmup_blowup").has_value());
    CHECK_FALSE(finding(doctor(run), "above_uniform").has_value());
    plant([](int64_t s, double v) { return s == 10 ? 7.0 : v; }, same);  // one hard batch: not held
    CHECK_FALSE(finding(doctor(run), "warmup_blowup").has_value());
    plant(same, same);
    const json f = doctor(run);
    CHECK_FALSE(finding(f, "above_uniform").has_value());
    CHECK_FALSE(finding(f, "warmup_blowup").has_value());
  }
  SUBCASE("a run directory whose run.json predates vocab_size gets no uniform finding") {
    plant(blown, same);
    json info = read_json(run / "run.json");
    info.erase("vocab_size");
    std::ofstream(run / "run.json") << info.dump();
    CHECK_FALSE(finding(doctor(run), "above_uniform").has_value());
    CHECK(finding(doctor(run), "warmup_blowup").has_value());
  }
}

TEST_CASE("doctor finds a validation loss that stopped improving while the training loss fell") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=100 --set run.eval_every=10");
  const std::vector<json> rows = metrics(run);
  // Training losses on the planted curve; validation losses from `val(step)` where the run evaluated.
  const auto plant = [&](auto val, auto loss) {
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      const int64_t s = r["step"].get<int64_t>();
      r["loss"] = loss(s);
      if (r.contains("val_loss")) r["val_loss"] = val(s);
      out << r.dump() << "\n";
    }
  };
  std::size_t evals = 0;
  for (const json& r : rows) evals += r.contains("val_loss");
  REQUIRE(evals == 10);
  // Best at step 50 (2.5), then rising to 3.0 at step 100 while the training loss keeps falling.
  const auto rising = [](int64_t s) { return s <= 50 ? 2.5 + 0.02 * double(50 - s) : 2.5 + 0.01 * double(s - 50); };
  plant(rising, curve);
  const std::optional<json> f = finding(doctor(run), "eval_plateau");
  REQUIRE(f.has_value());
  const json& e = (*f)["evidence"];
  CHECK(e["best_val_step"] == 50);
  CHECK(e["best_val_loss"].get<double>() == 2.5);
  CHECK(e["last_val_step"] == 100);
  CHECK(e["last_val_loss"].get<double>() == doctest::Approx(3.0));
  CHECK(e["evaluations_after_best"] == 5);
  // The training loss's median over the five logged steps up to each point, from the planted curve.
  CHECK(e["train_loss_at_best"].get<double>() == doctest::Approx(curve(48)));
  CHECK(e["train_loss_at_end"].get<double>() == doctest::Approx(curve(98)));
  CHECK(contains((*f)["change"].get<std::string>(), "--set run.steps=50"));

  SUBCASE("a validation loss still falling, flat within a percent, or a training loss flat too: no finding") {
    plant([](int64_t s) { return curve(s) + 0.1; }, curve);
    CHECK_FALSE(finding(doctor(run), "eval_plateau").has_value());
    plant([](int64_t s) { return s <= 50 ? 2.5 + 0.02 * double(50 - s) : 2.5 + 0.0001 * double(s - 50); }, curve);
    CHECK_FALSE(finding(doctor(run), "eval_plateau").has_value());
    plant(rising, [](int64_t s) { return s <= 50 ? curve(s) : curve(50); });
    CHECK_FALSE(finding(doctor(run), "eval_plateau").has_value());
  }
}

TEST_CASE("doctor finds an evaluation that stopped improving while the training loss fell") {
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=100 --set run.eval_every=10");
  const std::vector<json> rows = metrics(run);
  json summary = read_json(run / "summary.json");
  // summary.json as a run with an [[eval]] labelled rows writes it (accuracy: higher is better).
  summary["evals"] = {{"rows",
                       {{"evaluator", "multiple_choice"},
                        {"primary", "acc"},
                        {"higher_is_better", true},
                        {"metrics", {{"acc", 0.5}}},
                        {"step", 100},
                        {"evaluations", 10},
                        {"time_s", 1.0}}}};
  std::ofstream(run / "summary.json") << summary.dump();
  // The planted accuracy where the run evaluated, the training losses on the planted curve.
  const auto plant = [&](auto acc, auto loss) {
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      const int64_t s = r["step"].get<int64_t>();
      r["loss"] = loss(s);
      if (r.contains("val_loss")) r["eval/rows/acc"] = acc(s);
      out << r.dump() << "\n";
    }
  };
  // Best at step 60 (0.62), then 0.6, 0.61, 0.6, 0.5 while the training loss keeps falling.
  const auto stalled = [](int64_t s) { return s <= 60 ? 0.25 + 0.37 * double(s) / 60.0 : s == 100 ? 0.5 : s == 80 ? 0.61 : 0.6; };
  plant(stalled, curve);
  const std::optional<json> f = finding(doctor(run), "eval_stalled");
  REQUIRE(f.has_value());
  const json& e = (*f)["evidence"];
  CHECK(e["eval"] == "rows");
  CHECK(e["metric"] == "acc");
  CHECK(e["best_step"] == 60);
  CHECK(e["best"].get<double>() == doctest::Approx(0.62));
  CHECK(e["last"].get<double>() == doctest::Approx(0.5));
  CHECK(e["evaluations_after_best"] == 4);
  CHECK(e["train_loss_at_best"].get<double>() == doctest::Approx(curve(58)));
  CHECK(contains((*f)["change"].get<std::string>(), "--set run.steps=60"));
  CHECK((*f)["severity"] == "low");

  SUBCASE("an accuracy still rising, one that stalled only lately, or a training loss flat too: no finding") {
    plant([](int64_t s) { return 0.25 + 0.004 * double(s); }, curve);
    CHECK_FALSE(finding(doctor(run), "eval_stalled").has_value());
    plant([](int64_t s) { return s <= 80 ? 0.25 + 0.004 * double(s) : 0.57; }, curve);  // two evaluations since the best
    CHECK_FALSE(finding(doctor(run), "eval_stalled").has_value());
    plant(stalled, [](int64_t s) { return s <= 60 ? curve(s) : curve(60); });
    CHECK_FALSE(finding(doctor(run), "eval_stalled").has_value());
  }
  SUBCASE("a loss-like evaluation (lower is better) that stopped falling") {
    summary["evals"]["rows"]["primary"] = "loss";
    summary["evals"]["rows"]["higher_is_better"] = false;
    std::ofstream(run / "summary.json") << summary.dump();
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      const int64_t s = r["step"].get<int64_t>();
      r["loss"] = curve(s);
      if (r.contains("val_loss")) r["eval/rows/loss"] = s <= 50 ? 3.0 - 0.01 * double(s) : 2.6;
      out << r.dump() << "\n";
    }
    out.close();
    const std::optional<json> g = finding(doctor(run), "eval_stalled");
    REQUIRE(g.has_value());
    CHECK((*g)["evidence"]["best_step"] == 50);
  }
}

TEST_CASE("doctor finds FP8 delayed scaling that saturated, with the counts, and names a shorter amax history") {
  // A real run's directory with fp8_saturated planted into its metrics (a cpu run has none: FP8
  // needs a GPU); the config says what the run would have been.
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=40");
  CHECK_FALSE(finding(doctor(run), "fp8_saturation").has_value());  // no FP8 counts: nothing to say
  const std::vector<json> rows = metrics(run);
  const auto plant = [&](int64_t every, int64_t count) {
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      const int64_t s = r["step"].get<int64_t>();
      r["fp8_saturated"] = s % every == 0 ? 3 * count : 0;
      r["fp8_saturated_worst"] = s % every == 0 ? count : 0;
      out << r.dump() << "\n";
    }
  };
  plant(1000, 5);  // never
  CHECK_FALSE(finding(doctor(run), "fp8_saturation").has_value());
  plant(4, 7);  // steps 4, 8, ..., 40: 10 of 40, 21 values each, 7 in the worst tensor
  const std::optional<json> f = finding(doctor(run), "fp8_saturation");
  REQUIRE(f.has_value());
  CHECK(f->at("severity") == "medium");
  const json& e = f->at("evidence");
  CHECK(e["saturated_values"] == 210.0);
  CHECK(e["steps_saturating"] == 10);
  CHECK(e["steps_logged"] == 40);
  CHECK(e["worst_tensor_step"] == 7.0);
  CHECK(e["fp8_amax_history"] == 16);  // the run's resolved config: the default
  CHECK(contains(f->at("message").get<std::string>(), "clipped 210 values"));
  CHECK(f->at("change") == "--set run.fp8_amax_history=4");
  plant(40, 1);  // one step of 40: low
  CHECK(finding(doctor(run), "fp8_saturation")->at("severity") == "low");
}

TEST_CASE("doctor finds a launch-bound GPU run from the host's share of its steps, and not on a CPU, an emulated device or "
          "at high MFU") {
  // A real cpu run logs no host_pct (the cpu has no queue to run ahead in: engine.cpp); the same
  // run as if on a GPU, with the host's share planted, checks the finding's thresholds.
  TempDir tmp;
  const fs::path run = train(tmp, "run", " --set run.steps=12");
  const std::vector<json> rows = metrics(run);
  for (const json& r : rows) CHECK_FALSE(r.contains("host_pct"));
  CHECK_FALSE(read_json(run / "summary.json").contains("host_pct"));
  const auto plant = [&](double pct) {
    std::ofstream out(run / "metrics.jsonl");
    for (json r : rows) {
      r["host_pct"] = r["step"] == 1 ? 10.0 : pct;  // the first step (warm-up) is left out of the median
      out << r.dump() << "\n";
    }
  };
  plant(99.0);
  CHECK_FALSE(finding(doctor(run), "launch_bound").has_value());  // a cpu run: the host is the device

  json info = read_json(run / "run.json");
  info["device_name"] = "NVIDIA H100 80GB HBM3 (cuda:0)";
  info = as_gpu_run(run, info);
  const auto with = [&](double mfu, double cv) { return with_timing(run, "launch_bound", mfu, cv); };
  const std::optional<json> f = with(0.05, 0.02);
  REQUIRE(f.has_value());
  CHECK(f->at("severity") == "high");
  CHECK(f->at("evidence")["host_pct"] == 99.0);
  CHECK(f->at("evidence")["batch_size"] == 8);  // the quickstart's
  // The quickstart's single rank, one micro-batch, adamw and no dropout: a captured step first.
  CHECK(f->at("change").get<std::string>().rfind("--set run.cuda_graph=true ", 0) == 0);
  CHECK(contains(f->at("change").get<std::string>(), "or --set batching.batch_size=16 "));
  CHECK(contains(f->at("message").get<std::string>(), "99%"));
  CHECK_FALSE(with(0.45, 0.02).has_value());  // the GPU's own work: a full queue holds the host back too
  const std::optional<json> noisy = with(0.05, 0.5);
  REQUIRE(noisy.has_value());
  CHECK(noisy->at("evidence")["timings_unusable"] == true);
  (void)with(0.05, 0.02);
  plant(90.0);
  CHECK(finding(doctor(run), "launch_bound")->at("severity") == "medium");
  // A run that could not replay captured steps (dropout): the micro-batch alone.
  std::string config = slurp(run / "config.toml");
  REQUIRE(config.find("dropout = 0.0") != std::string::npos);
  std::ofstream(run / "config.toml") << std::string(config).replace(config.find("dropout = 0.0"), 13, "dropout = 0.1");
  CHECK(finding(doctor(run), "launch_bound")->at("change").get<std::string>().rfind("--set batching.batch_size=16 ", 0) == 0);
  std::ofstream(run / "config.toml") << config;
  // Already replaying captured steps: the micro-batch is what is left.
  REQUIRE(config.find("cuda_graph = false") != std::string::npos);
  config.replace(config.find("cuda_graph = false"), 18, "cuda_graph = true");
  std::ofstream(run / "config.toml") << config;
  CHECK(finding(doctor(run), "launch_bound")->at("change").get<std::string>().rfind("--set batching.batch_size=16 ", 0) == 0);
  plant(80.0);
  CHECK_FALSE(finding(doctor(run), "launch_bound").has_value());  // the GPU runs ahead of the host
  plant(99.0);
  info["device_name"] = "NVIDIA H100 80GB HBM3 (emulated on the CPU) (cuda:0)";
  std::ofstream(run / "run.json") << info.dump();
  CHECK_FALSE(finding(doctor(run), "launch_bound").has_value());  // each kernel runs as it is issued
}
