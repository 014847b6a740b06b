// `ablate tune batch-size CONFIG`: grows the micro-batch (1, 2, 4, ...) while it fits the memory
// budget, times a few real training steps (forward, backward, optimizer) at each size, and
// recommends a micro-batch, the accumulation that keeps the global batch, and the learning rate.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/communicator.hpp"
#include "ablate/runtime/engine.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/runtime/trainer.hpp"
#include "commands.hpp"
#include "json_read.hpp"


namespace ablate::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t current_rss() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return int64_t(resident) * int64_t(sysconf(_SC_PAGE_SIZE));
}

struct Trial {
  int64_t batch = 0;
  int64_t estimated_bytes = 0;
  bool fits = false;
  double step_ms = 0;
  double tokens_per_s = 0;
  double real_tokens_per_s = 0;
};

// The options and config values the tuning reads: the sizes tried, the memory budget, and the
// config's micro-batch, rows, accumulation and learning rate.
struct Tuning {
  int64_t max_batch = 0, timed = 0;
  bool plan_only = false;
  double budget_gib = 0;
  int64_t budget = 0;
  std::string budget_source;
  int64_t B0 = 0, T = 0, accum0 = 0;
  double lr0 = 0;
};

// Reads the tuning's options from the command line and its values from the config.
Tuning tuning_of(const po::variables_map& vm, const RunSpec& spec) {
  Tuning tu;
  tu.max_batch = vm["max-batch"].as<int64_t>();
  tu.timed = vm["steps"].as<int64_t>();
  tu.plan_only = vm.count("plan-only") > 0;
  tu.budget_gib = spec.run.memory_budget_gib;
  tu.budget = spec.memory_budget_bytes();
  tu.budget_source = spec.memory_budget_source();
  tu.B0 = spec.batch_size;
  tu.T = spec.seq_len;
  tu.accum0 = spec.run.grad_accum_steps;
  tu.lr0 = spec.lr;
  return tu;
}

// Times `timed` training steps at the trial's micro-batch after one warm-up step, and fills in its
// step time and tokens/s.
void time_trial(Trial& t, Engine& engine, Model& model, DataPipeline& pipe, const Tuning& tu, int64_t& opt_step) {
  double total_s = 0;
  int64_t positions = 0, real = 0;
  for (int64_t s = 0; s <= tu.timed; ++s) {
    const Batch batch = pipe.next().batch;
    const auto t0 = Clock::now();
    const StepOutcome o = engine.step(std::span<const Batch>(&batch, 1), ++opt_step, tu.lr0 * 1e-3);
    model.device().synchronize();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) {
      total_s += dt;
      positions += o.positions;
      real += o.real_targets;
    }
  }
  t.step_ms = 1e3 * total_s / double(tu.timed);
  t.tokens_per_s = double(positions) / total_s;
  t.real_tokens_per_s = double(real) / total_s;
}

// The trials: micro-batches 1, 2, 4, ... up to --max-batch while the plan fits 90% of the budget,
// each timed unless --plan-only; the first that does not fit ends the list.
std::vector<Trial> run_trials(const po::variables_map& vm, Registry& registry, const RunContext& run,
                              const std::shared_ptr<DataSource>& source, Model& model, Engine& engine, int64_t fixed,
                              const Tuning& tu) {
  std::vector<Trial> trials;
  int64_t opt_step = 0;
  for (int64_t b = 1; b <= tu.max_batch; b *= 2) {
    Trial t;
    t.batch = b;
    t.estimated_bytes = fixed + model.activation_bytes(b, tu.T);
    t.fits = double(t.estimated_bytes) <= 0.9 * double(tu.budget);
    if (!t.fits || tu.plan_only) {
      trials.push_back(t);
      if (!t.fits) break;
      continue;
    }
    const std::vector<std::string> sets = {"batching.batch_size=" + std::to_string(b)};
    std::vector<std::string> all = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
    all.insert(all.end(), sets.begin(), sets.end());
    const RunSpec at_b = RunSpec::from(Config::load(vm["config"].as<std::string>(), all, registry));
    auto pipe = Session(at_b, registry, run).pipeline(Split::train, source);
    time_trial(t, engine, model, *pipe, tu, opt_step);
    trials.push_back(t);
    spdlog::info("micro-batch {:>4}: {:.1f} ms/step, {:.0f} tokens/s ({:.0f} real), estimated {:.1f} MiB", b, t.step_ms,
                 t.tokens_per_s, t.real_tokens_per_s, double(t.estimated_bytes) / (1 << 20));
  }
  return trials;
}

// The recommendation, and the largest micro-batches that fit, measured and by the plan.
struct Recommendation {
  int64_t largest = 0;                          // the largest trial that fits
  std::map<std::string, int64_t> by_recompute;  // the largest that fits by the plan, per run.recompute mode
  int64_t global = 0;                           // the config's global batch, in rows
  int64_t batch = 0, accum = 0;                 // the recommended micro-batch and accumulation
  double lr = 0;                                // and learning rate
};

// The recommendation: the smallest micro-batch within 3% of the best measured tokens/s (the same
// speed for less memory), with the accumulation that keeps the config's global batch; when the
// micro-batch alone exceeds that global batch, the square-root rule scales the learning rate.
Recommendation recommend(const std::vector<Trial>& trials, const Model& model, int64_t fixed, const Tuning& tu) {
  Recommendation r;
  double best = 0;
  for (const Trial& t : trials) best = std::max(best, t.fits ? t.real_tokens_per_s : 0.0);
  int64_t rec = tu.B0;
  for (const Trial& t : trials) {
    if (t.fits && t.real_tokens_per_s >= 0.97 * best) {
      rec = t.batch;
      break;
    }
  }
  for (const Trial& t : trials)
    if (t.fits) r.largest = t.batch;
  if (tu.plan_only && r.largest > 0) rec = r.largest;  // nothing measured: the largest that fits
  if (r.largest == 0) {
    throw_input_error(tu.budget_gib > 0 ? "run.memory_budget_gib" : "tune",
                      "even a micro-batch of 1 row needs an estimated " + std::to_string(trials.front().estimated_bytes >> 20) +
                          " MiB, over 90% of the " + std::to_string(tu.budget >> 20) + " MiB budget (" + tu.budget_source + ")");
  }
  // What activation recomputation would allow, by the plan alone (not measured): the largest doubling
  // up to --max-batch whose estimate fits under each mode.
  for (const char* mode : {"none", "mlp", "block"}) {
    int64_t fits = 0;
    for (int64_t b = 1; b <= tu.max_batch; b *= 2) {
      const int64_t bytes = fixed + model.activation_plan(b, tu.T, mode).bytes();
      if (double(bytes) > 0.9 * double(tu.budget)) break;
      fits = b;
    }
    r.by_recompute[mode] = fits;
  }
  r.global = tu.B0 * tu.accum0;
  r.batch = rec;
  r.accum = std::max<int64_t>(1, (r.global + rec / 2) / rec);
  r.lr = rec * r.accum > r.global ? tu.lr0 * std::sqrt(double(rec * r.accum) / double(r.global)) : tu.lr0;
  return r;
}

// Prints the trials and the recommendation as JSON (--json).
void print_json(const std::vector<Trial>& trials, const Recommendation& r, const Tuning& tu) {
  json j = {{"budget_bytes", tu.budget}, {"budget_source", tu.budget_source}, {"seq_len", tu.T}, {"trials", json::array()}};
  for (const Trial& t : trials) {
    j["trials"].push_back({{"batch_size", t.batch},
                           {"fits", t.fits},
                           {"estimated_bytes", t.estimated_bytes},
                           {"step_ms", t.step_ms},
                           {"tokens_per_s", t.tokens_per_s},
                           {"real_tokens_per_s", t.real_tokens_per_s}});
  }
  j["largest_fitting"] = r.largest;
  j["plan_only"] = tu.plan_only;
  j["largest_fitting_by_recompute"] = r.by_recompute;
  j["recommended"] = {{"batch_size", r.batch}, {"grad_accum_steps", r.accum}, {"lr", r.lr}};
  std::cout << json_text(j, 2) << "\n";
}

// Prints the trials as a table, then the recommendation and what it rests on.
void print_table(const std::vector<Trial>& trials, const Recommendation& r, const Tuning& tu) {
  std::printf("memory budget %.2f GiB (%s), T = %lld\n\n%10s %10s %12s %14s %14s\n", double(tu.budget) / double(1ll << 30),
              tu.budget_source.c_str(), static_cast<long long>(tu.T), "micro-batch", "step ms", "tokens/s", "real tokens/s",
              "est. MiB");
  for (const Trial& t : trials) {
    if (!t.fits || tu.plan_only) {
      std::printf("%10lld %10s %12s %14s %14.1f%s\n", static_cast<long long>(t.batch), "-", "-", "-",
                  double(t.estimated_bytes) / (1 << 20), t.fits ? "" : "  (over 90% of the budget)");
    } else {
      std::printf("%10lld %10.1f %12.0f %14.0f %14.1f\n", static_cast<long long>(t.batch), t.step_ms, t.tokens_per_s,
                  t.real_tokens_per_s, double(t.estimated_bytes) / (1 << 20));
    }
  }
  std::printf("\nlargest micro-batch that fits (of those tried): %lld\n", static_cast<long long>(r.largest));
  std::printf("by the plan, with run.recompute = none / mlp / block: %lld / %lld / %lld (up to --max-batch)\n",
              static_cast<long long>(r.by_recompute.at("none")), static_cast<long long>(r.by_recompute.at("mlp")),
              static_cast<long long>(r.by_recompute.at("block")));
  std::printf("recommended: --set batching.batch_size=%lld --set run.grad_accum_steps=%lld --set optimizer.lr=%.3g\n",
              static_cast<long long>(r.batch), static_cast<long long>(r.accum), r.lr);
  std::printf("  (%s; the accumulation keeps the global batch of %lld rows%s)\n",
              tu.plan_only ? "the largest micro-batch that fits by the plan: nothing was timed"
                           : "the smallest micro-batch within 3% of the best real tokens/s",
              static_cast<long long>(r.global),
              r.batch * r.accum > r.global ? "; it exceeds it, so the lr follows the square-root rule" : " and the lr");
}

// `ablate tune batch-size`: builds the model and a one-process engine, runs the trials, and prints
// the recommendation.
int tune_batch_size(const Args& args) {
  po::options_description desc("ablate tune batch-size CONFIG [--set k=v ...]");
  po::positional_options_description pos;
  add_experiment_options(desc, pos);
  desc.add_options()("max-batch", int_option("max-batch", 1, 1048576)->default_value(64), "largest micro-batch tried")(
      "steps", int_option("steps", 1, 1000000)->default_value(3), "steps timed at each size (after one warm-up step)")(
      "plan-only", "no training steps: the sizes that fit by the memory plan alone, the largest recommended")(
      "json", "print the trials and the recommendation as JSON");
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm,
                    "ablate tune batch-size CONFIG [--set k=v ...] [--max-batch N] [--steps N] [--plan-only] [--json]")) {
    return 0;
  }
  Registry registry;
  const RunSpec spec = RunSpec::from(load_experiment(vm, registry));
  const Session session(spec, registry);
  const RunContext& run = session.run();
  const Tuning tu = tuning_of(vm, spec);

  auto source = session.data_source();
  const std::unique_ptr<Model> made = session.model(source->vocab_size());
  Model& model = *made;
  model.init_params(run.seed);
  auto optimizer = session.optimizer();
  // One process, one micro-batch per step: the trainer's engine with the one-process communicator.
  auto single = session.one_process_communicator();
  RunSpec one_process = spec;
  one_process.run.grad_accum_steps = 1;
  one_process.shard_state = false;
  Engine engine(model, *optimizer, *single, one_process);
  // What does not grow with the micro-batch, measured now: the process as it stands (parameters,
  // gradients, optimizer state, libraries: a host device's memory) or what the model's device holds
  // (its buffers) with the optimizer's state, whichever is more: the second is what a GPU fills.
  const int64_t fixed = std::max<int64_t>(current_rss(), model.device().memory_in_use() + optimizer->state_bytes());

  const std::vector<Trial> trials = run_trials(vm, registry, run, source, model, engine, fixed, tu);
  const Recommendation r = recommend(trials, model, fixed, tu);
  if (vm.count("json")) {
    print_json(trials, r, tu);
  } else {
    print_table(trials, r, tu);
  }
  return 0;
}

}  // namespace

int cmd_tune(const Args& args) {
  return dispatch(
      "tune", args,
      {{"batch-size", tune_batch_size, "ablate tune batch-size CONFIG [--set k=v ...] [--max-batch N] [--steps N] [--json]"}});
}

}  // namespace ablate::cli
