// The trainer (see trainer.hpp): the run's settings read once, the run directory, the data, the
// model and its engine, then the loop that reads like a recipe: take the micro-batches, one engine
// step, the step's metrics, evaluation, logging, checkpoints. Device differences live behind the
// Device (device.hpp), the schedule of collectives in the engine (engine.hpp), the files of a
// checkpoint in the checkpointer (checkpointer.hpp), the metric definitions in run_metrics.hpp.
#include "ablate/logger.hpp"
#include "ablate/runtime/trainer.hpp"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/atomic_file.hpp"
#include "ablate/communicator.hpp"
#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/engine.hpp"
#include "ablate/runtime/evaluation.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/launch_env.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/safetensors.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/schedule.hpp"
#include "ablate/version.hpp"
#include "checkpointer.hpp"
#include "host_memory.hpp"
#include "run_metrics.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ablate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Closes every sink once, also when training leaves by an exception.
struct LoggerSet {
  std::vector<std::unique_ptr<Logger>> sinks;
  void close() {
    for (auto& l : sinks) l->close();
    sinks.clear();
  }
  ~LoggerSet() {
    try {
      close();
    } catch (...) {
    }
  }
};

std::string si(double x) {
  char buf[32];
  if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
  else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", x);
  return buf;
}


// Refuses to start over a run that already has checkpoints (or to resume one that has none);
// rank 0 creates the directory once every rank has looked.
void prepare_run_dir(const TrainOptions& options, Communicator& comm, int64_t steps) {
  const fs::path& dir = options.run_dir;
  const bool has_checkpoint = ablate::has_checkpoint(dir);
  // A finished run stays as it is: resuming it would rewrite its summary with an empty one.
  if (options.resume && fs::exists(dir / "summary.json")) {
    // A FIFO, device or directory there is refused (exit 2); a damaged regular file is not.
    const std::string text = read_regular_file(dir / "summary.json", "run summary", kMaxJsonBytes);
    json summary;
    try {
      if (json_too_deep_at(text) == std::string::npos) summary = json::parse(text);
    } catch (const json::exception&) {
      summary = json();  // unreadable: the checkpoint decides, as for a killed run
    }
    if (summary.is_object() && summary.value("status", "") == "completed" && summary.value("steps", int64_t(0)) >= steps) {
      throw_input_error(dir.string(), "--resume: this run finished at step " + std::to_string(summary.value("steps", int64_t(0))) +
                                          " of " + std::to_string(steps) + "; nothing to resume (raise run.steps to train further)");
    }
  }
  if (options.resume && !has_checkpoint) {
    throw_input_error(dir.string(), "--resume: this run directory has no checkpoint to resume from" +
                                        std::string(comm.world() > 1 ? " (with several machines the run directory must be "
                                                                       "on a filesystem every rank sees)"
                                                                     : ""));
  }
  if (!options.resume && has_checkpoint) {
    throw_input_error(dir.string(), "already holds a run with checkpoints; pass --resume to continue it, or --run-dir to "
                                    "start a new one elsewhere");
  }
  // The files the run writes at its start and end: anything but a regular file by one of their names
  // (a directory where summary.json goes) is exit 2 now, not a failed write after training.
  if (comm.rank() == 0) {
    check_output_file(dir / "config.toml", "resolved config");
    check_output_file(dir / "run.json", "run record");
    check_output_file(dir / "summary.json", "run summary");
    check_output_directory(dir / "checkpoints", "the run's checkpoint directory");
  }
  comm.barrier();
  if (comm.rank() == 0) fs::create_directories(dir / "checkpoints");
}

// Evaluation sees the same batches whatever the world size: every rank reads the validation
// stream of a world of one, forwards the batches i with i % world == rank, and the loss sums and
// target counts are all-reduced.
struct Evaluator {
  std::unique_ptr<DataPipeline> pipeline;
  int64_t batches = 0;
  bool available = false;

  double run(Model& model, Communicator& comm) {
    pipeline->restore({});
    double acc[2] = {0, 0};  // loss sum, real targets
    for (int64_t i = 0; i < batches; ++i) {
      const PipelineBatch& pb = pipeline->next();
      if (i % comm.world() != comm.rank()) continue;
      acc[0] += model.forward(pb.batch);
      acc[1] += double(pb.batch.real_targets());
    }
    comm.all_reduce_host(flat_view(acc, DType::f64, 2), ReduceOp::sum);
    return acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  }
};

// Every rank must train the same experiment on the same data: a rank started with other overrides,
// or reading other files, would silently average another run's gradients into the job. Each rank
// contributes two fingerprints (the resolved config; the data source and model as they describe
// themselves), every rank sees all of them, and every rank refuses alike.
void require_same_experiment(Communicator& comm, const std::string& config_hash, const std::string& data_and_model,
                             const std::string& where) {
  const int world = comm.world(), rank = comm.rank();
  const uint64_t mine[2] = {fnv1a(config_hash), fnv1a(data_and_model)};
  std::vector<int32_t> all(std::size_t(4 * world), 0);
  std::memcpy(all.data() + 4 * rank, mine, sizeof mine);
  comm.all_gather_host(flat_view(all.data(), DType::i32, 4 * world));
  std::string config_ranks, data_ranks;
  for (int r = 1; r < world; ++r) {
    const int32_t* x = all.data() + 4 * r;
    if (x[0] != all[0] || x[1] != all[1]) config_ranks += (config_ranks.empty() ? "" : ", ") + std::to_string(r);
    if (x[2] != all[2] || x[3] != all[3]) data_ranks += (data_ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  // Other data first: it says what each rank read (relative data paths resolve against each
  // rank's working directory, so they also change the resolved config).
  if (!data_ranks.empty()) {
    throw_input_error(where, "rank(s) " + data_ranks + " read other data or built another model than rank 0 (this is rank " +
                                 std::to_string(rank) + ": " + data_and_model +
                                 "): every rank must see the same data files and plugins");
  }
  if (!config_ranks.empty()) {
    throw_input_error(where, "rank(s) " + config_ranks + " resolved another experiment than rank 0 (this is rank " +
                                 std::to_string(rank) + ", config hash " + config_hash +
                                 "): start every rank in the same directory with the same config file and --set overrides");
  }
}

json capabilities_json(const DeviceCapabilities& c) {
  return {{"host_memory", c.host_memory},
          {"reduced_precision_products", c.reduced_precision_products},
          {"fp8_products", c.fp8_products},
          {"collective", c.collective}};
}

// The activation plan's bytes by what holds them: f32 and bf16 values of the arena, and the
// plugins' own workspace (activation_bytes is their sum).
json bytes_by_dtype(const ActivationPlan& p) {
  return {{"f32", p.f32_bytes()}, {"bf16", p.bf16_bytes()}, {"workspace", p.workspace_bytes}};
}

// run.json: what the run is, for reproduction.
void write_run_json(const fs::path& dir, const RunSpec& spec, const Registry& registry, const RunContext& run,
                    const std::string& comm_name, Model& model) {
  const int64_t B = spec.batch_size, T = spec.seq_len;
  json plugins = json::array();
  for (const ComponentInfo* info : registry.all()) {
    plugins.push_back({{"kind", std::string(to_string(info->kind))},
                       {"name", info->name},
                       {"version", info->version},
                       {"library", info->library},
                       {"devices", info->devices}});
  }
  write_json_file(dir / "run.json", {{"ablate_version", ABLATE_VERSION_STRING},
                                     {"device", run.device},
                                     {"device_name", model.device().describe()},
                                     {"device_capabilities", capabilities_json(model.device().capabilities())},
                                     {"threads", run.threads},
                                     {"world", run.world},
                                     {"communicator", comm_name},
                                     {"shard_state", spec.shard_state},
                                     {"parameters", model.num_params()},
                                     {"trainable_parameters", model.num_trainable()},
                                     {"frozen_parameters", model.frozen_params()},
                                     {"nf4_parameters", model.nf4_params()},
                                     {"nf4_bytes", model.nf4_bytes()},
                                     {"model", model.options().describe()},
                                     {"vocab_size", model.options().vocab_size},
                                     {"config_hash", spec.config_hash},
                                     {"memory_bytes", spec.memory_budget_bytes()},
                                     {"memory_source", spec.memory_budget_source()},
                                     {"param_bytes", int64_t(model.num_params()) * 4},
                                     {"grad_bytes", int64_t(model.num_trainable()) * 4},
                                     {"activation_bytes", model.activation_bytes(B, T)},
                                     {"activation_bytes_by_dtype", bytes_by_dtype(model.activation_plan(B, T))},
                                     {"activation_bytes_by_recompute",
                                      {{"none", model.activation_plan(B, T, "none").bytes()},
                                       {"mlp", model.activation_plan(B, T, "mlp").bytes()},
                                       {"block", model.activation_plan(B, T, "block").bytes()}}},
                                     {"recompute", model.options().recompute},
                                     {"batch_size", B},
                                     {"seq_len", T},
                                     {"grad_accum_steps", spec.run.grad_accum_steps},
                                     {"plugins", plugins}});
}

// Every sink of [logging] sinks (rank 0 writes them; every rank checks the names).
void open_loggers(LoggerSet& loggers, const Session& session, const fs::path& dir, int64_t start_step,
                  const std::vector<std::string>& eval_metrics) {
  const RunSpec& spec = session.spec();
  loggers.sinks = session.loggers();
  if (loggers.sinks.empty()) return;
  LogContext lc;
  lc.run_dir = dir.string();
  lc.config_toml = spec.config_toml;
  lc.run_name = fs::absolute(dir).lexically_normal().filename().string();
  if (lc.run_name.empty()) lc.run_name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  lc.start_step = start_step;
  lc.total_steps = spec.run.steps;
  lc.log_every = spec.log_every;
  lc.extra_metrics = eval_metrics;
  for (auto& sink : loggers.sinks) sink->open(lc);
}

// The op profile of run.profile_steps: profile.json (ms per step and share of the profiled step
// time per op, largest first) and the same as a table in the log.
void write_profile(const fs::path& dir, const OpTimes& times, int64_t steps, double step_s, bool lead) {
  if (steps <= 0) return;
  std::vector<std::pair<std::string, double>> ops(times.seconds.begin(), times.seconds.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  double timed_s = 0;
  for (const auto& [op, s] : ops) timed_s += s;
  json rows = json::array();
  std::string table =
      fmt::format("op profile over the last {} step(s), {:.2f} ms per step (device synchronised around each op):", steps,
                  1e3 * step_s / double(steps));
  for (const auto& [op, s] : ops) {
    const double ms = 1e3 * s / double(steps), share = step_s > 0 ? s / step_s : 0.0;
    rows.push_back(
        {{"op", op}, {"ms_per_step", ms}, {"calls_per_step", double(times.calls.at(op)) / double(steps)}, {"share", share}});
    table += fmt::format("\n  {:<20} {:>10.3f} ms {:>6.1f}%", op, ms, 100.0 * share);
  }
  const double other = std::max(0.0, step_s - timed_s);
  table += fmt::format("\n  {:<20} {:>10.3f} ms {:>6.1f}%", "(untimed)", 1e3 * other / double(steps),
                       step_s > 0 ? 100.0 * other / step_s : 0.0);
  spdlog::info("{}", table);
  if (lead) {
    write_json_file(dir / "profile.json", {{"steps", steps},
                                           {"step_ms", 1e3 * step_s / double(steps)},
                                           {"ops", rows},
                                           {"untimed_ms_per_step", 1e3 * other / double(steps)}});
  }
}

// What a frozen base does not keep: the gradients and optimizer state its parameters would have if
// they trained with this optimizer (its state per trainable parameter), 0 when everything trains.
int64_t frozen_state_bytes(Model& model, const Optimizer& optimizer) {
  if (model.frozen_params() == 0) return 0;
  const double state_per_param = double(optimizer.state_bytes()) / double(model.num_trainable());
  return int64_t(double(model.frozen_params()) * (4.0 + state_per_param));
}

// The run's memory, planned before step 1: parameters, gradients, optimizer state, the activation
// arena of the largest micro-batch and the plugins' workspaces for it (attention scores, bf16 copies). A run that cannot fit is refused with both numbers
// before anything is trained (the arena is only planned, never allocated, to know it).
void require_memory(const RunSpec& spec, Model& model, const Optimizer& optimizer) {
  const int64_t grads = model.num_trainable() * 4, params = model.state_bytes() - grads, state = optimizer.state_bytes();
  const int64_t acts = model.activation_bytes(spec.batch_size, spec.seq_len);
  const int64_t needed = params + grads + state + acts;
  const int64_t capacity = model.device().memory_capacity();
  const bool configured = spec.memory_budget_configured();
  int64_t budget = configured ? spec.memory_budget_bytes() : capacity;
  if (configured && capacity > 0) budget = std::min(budget, capacity);
  if (budget <= 0 || needed <= budget) return;
  const auto mib = [](int64_t b) { return fmt::format("{:.1f} MiB", double(b) / double(1 << 20)); };
  throw_input_error("batching.batch_size",
                    fmt::format("a micro-batch of {} x {} needs {} ({} parameters, {} gradients, {} optimizer state, {} "
                                "activations and workspaces) but {} has {} ({}); lower batching.batch_size (`ablate tune batch-size` "
                                "finds the largest that fits) or batching.seq_len",
                                spec.batch_size, spec.seq_len, mib(needed), mib(params), mib(grads), mib(state), mib(acts),
                                model.device().describe(), mib(budget), configured ? "run.memory_budget_gib" : "the device's memory"));
}

// Before anything is allocated: the host memory the config's sizes certainly need (the batches in
// flight, and the parameters the model's layers declare, with their gradients) must fit the budget,
// so that a product like batch_size x seq_len that no machine holds is an input error naming the
// keys rather than a bad_alloc or the OOM killer. require_memory checks the whole plan once the
// model exists.
void require_host_memory(const Session& session, const DeviceCapabilities& device, int64_t vocab) {
  const RunSpec& spec = session.spec();
  const int64_t budget = spec.memory_budget_bytes();
  if (budget <= 0) return;
  const double gib = double(1ll << 30);
  // Every batch in flight (queued, being built by each worker, held by the trainer).
  require_batch_memory(spec, spec.data_prefetch + spec.data_workers + 2, "data.prefetch + data.workers + 2");
  if (!device.host_memory) return;  // the parameters live in the device's memory, checked by require_memory
  // Parameters and gradients in fp32 (optimizer state comes on top), counted by the layers.
  const ModelOptions o = session.model_options(vocab);
  const double params = double(Model::count_params(o, session.registry(), session.run()));
  if (params * 8.0 > double(budget)) {
    throw_input_error("model.d_model",
                      fmt::format("the model needs at least {:.1f} GiB for its parameters and gradients (d_model {}, "
                                  "n_layers {}, max_seq_len {}) but the budget is {:.1f} GiB ({}); lower model.d_model, "
                                  "model.n_layers or model.max_seq_len",
                                  params * 8.0 / gib, o.d_model, o.n_layers, o.max_seq_len, double(budget) / gib,
                                  spec.memory_budget_source()));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

int use_cpu_threads(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  return threads;
}

void require_batch_memory(const RunSpec& spec, int64_t in_flight, const std::string& why) {
  const int64_t budget = spec.memory_budget_bytes();
  if (budget <= 0) return;
  const int64_t b = spec.batch_size, t = spec.seq_len;
  // Each batch holds four int32 arrays (tokens, targets, positions, segment ids) of its positions;
  // the bucketed batcher's rows (token_budget / bound) hold about token_budget positions.
  const double positions = std::max(double(b) * double(t), double(spec.token_budget));
  const double bytes = double(in_flight) * positions * 16.0, gib = double(1ll << 30);
  if (bytes <= double(budget)) return;
  throw_input_error("batching.batch_size",
                    fmt::format("batch_size x seq_len = {} x {} needs at least {:.1f} GiB of batch buffers ({} batches "
                                "in flight: {}) but the budget is {:.1f} GiB ({}); lower batching.batch_size or "
                                "batching.seq_len",
                                b, t, bytes / gib, in_flight, why, double(budget) / gib, spec.memory_budget_source()));
}

namespace {

// What a run is built from, in the order it is built and so destroyed in the reverse order (the
// run directory's lock last): its settings, data, model, optimizer, engine and checkpoints.
struct TrainingSetup {
  const Session& session;
  const RunSpec& spec;
  const TrainOptions& options;
  Communicator& comm;
  const RunContext& run;
  const std::string& comm_name;
  const bool lead;
  const fs::path dir;
  std::optional<DirectoryLock> lock;
  std::shared_ptr<DataSource> source;
  std::unique_ptr<DataPipeline> train_data;
  Evaluator eval;
  std::unique_ptr<Device> device;  // the run's, until the model takes it
  std::unique_ptr<Model> model;
  std::string opt_name;
  std::unique_ptr<Optimizer> optimizer;
  std::optional<Engine> engine;
  std::optional<Checkpointer> checkpoints;
  std::vector<EvalTask> evals;  // the enabled [[eval]] tables
  std::optional<ModelEvalView> eval_view;

  // The run's session and arguments; set_up builds the rest.
  TrainingSetup(const Session& session, const TrainOptions& options, Communicator& comm, const std::string& comm_name)
      : session(session),
        spec(session.spec()),
        options(options),
        comm(comm),
        run(session.run()),
        comm_name(comm_name),
        lead(run.rank == 0),
        dir(options.run_dir) {}
};

// Where a run stands, shared by the phases after set-up: the step it starts from, its loggers, the
// result and metrics of its steps, the op profile.
struct TrainingProgress {
  int64_t start_step = 0;
  CheckpointState resumed;
  LoggerSet loggers;
  PeakFlops peak;
  TrainResult result;
  std::optional<RunMetrics> metrics;
  std::vector<Batch> micro;
  Clock::time_point t_run;
  std::optional<CpuTimes> cpu_at_start;  // for summary.json's machine_load
  double last_val = -1;
  bool stopped = false;
  OpTimes op_times;
  int64_t profiled_steps = 0;
  double profiled_s = 0;
};

// The enabled [[eval]] tables' evaluators, their tasks read and checked against the model before
// anything trains; they see the model through a view whose forward passes hold at most the
// training micro-batch's positions.
void set_up_evals(TrainingSetup& t) {
  t.evals = t.session.evals();
  if (t.evals.empty()) return;
  t.eval_view.emplace(*t.model, *t.source, t.comm, t.spec.batch_size * t.spec.seq_len);
  prepare_eval_tasks(t.evals, *t.eval_view);
}

// Set-up: the run directory locked and checked, the data, the model, its optimizer, engine and checkpoints.
void set_up(TrainingSetup& t) {
  const RunSpec& spec = t.spec;
  const Session& session = t.session;
  // One run per directory, held until train_ranks returns (rank 0 writes there; the others wait
  // for its verdict in prepare_run_dir's barrier).
  if (t.lead) t.lock.emplace(t.dir, "the run directory");
  prepare_run_dir(t.options, t.comm, spec.run.steps);

  // Data: each rank draws its own share of the training documents (the sampler deals them out);
  // the validation batches are those of a world of one, split among the ranks by Evaluator::run.
  t.source = session.data_source();
  require_host_memory(session, t.device->capabilities(), t.source->vocab_size());
  t.train_data = session.pipeline(Split::train, t.source);
  t.eval.batches = spec.run.eval_batches;
  t.eval.available = t.source->size(Split::validation) > 0 && t.eval.batches > 0;
  if (t.eval.available) t.eval.pipeline = session.pipeline(Split::validation, t.source);

  // Model (refused before training when a micro-batch cannot be served), optimizer, engine, checkpoints.
  t.model = session.model(t.source->vocab_size(), std::move(t.device));
  Model& model = *t.model;
  session.require_serves_batches(model);
  if (t.run.world > 1) {
    require_same_experiment(t.comm, spec.config_hash, t.source->describe() + "; " + model.options().describe(), spec.config_source);
  }
  t.opt_name = spec.require(spec.optimizer).name;
  t.optimizer = session.optimizer();
  t.engine.emplace(model, *t.optimizer, t.comm, spec);
  require_memory(spec, model, *t.optimizer);
  t.checkpoints.emplace(Checkpointer::Setup{t.dir, t.opt_name}, spec, t.comm);
  set_up_evals(t);
}

// Where the run starts: a checkpoint (--resume), the weights of model.init_from or a fresh
// initialisation; then every rank holds rank 0's parameters.
void resume_or_init(TrainingSetup& t, TrainingProgress& p) {
  Model& model = *t.model;
  if (t.options.resume) {
    p.resumed = t.checkpoints->resume(model, *t.optimizer, *t.train_data);
    p.start_step = p.resumed.step;
  } else if (const std::string& from = t.spec.model.init_from; !from.empty()) {
    model.init_params(t.run.seed);  // then overwritten: the random draws stay those of a fresh run
    init_from_weights(model, from);
  } else {
    model.init_params(t.run.seed);
  }
  if (t.run.world > 1) {  // one model for every rank: rank 0's
    t.comm.broadcast(model.params(), 0);
    t.comm.join();
    model.params_changed();
  }
}

// The run's outputs opened and its set-up announced: the loggers, config.toml and run.json, the
// peak FLOP/s, and the log lines that say what is trained where.
void open_outputs(TrainingSetup& t, TrainingProgress& p) {
  const RunSpec& spec = t.spec;
  const RunContext& run = t.run;
  const int64_t B = spec.batch_size, T = spec.seq_len, accum = spec.run.grad_accum_steps;
  Model& model = *t.model;
  // The loggers first: a resumed run's logs are checked as they are opened, and a damaged one stops
  // the run before config.toml and run.json are rewritten.
  std::vector<std::string> eval_metrics;
  for (const EvalTask& e : t.evals) {
    for (const std::string& name : e.logged_names()) eval_metrics.push_back(name);
  }
  open_loggers(p.loggers, t.session, t.dir, p.start_step, eval_metrics);
  if (t.lead) {
    write_file_atomic(t.dir / "config.toml", t.spec.config_toml);
    write_run_json(t.dir, spec, t.session.registry(), run, t.comm_name, model);
  }
  p.peak = resolve_peak(t.spec, model, t.comm);
  spdlog::info("model: {} parameters ({}); activations {:.1f} MiB per micro-batch; optimizer {} ({:.1f} MiB state{}); "
               "device {}",
               model.num_params(), model.options().describe(), double(model.activation_bytes(B, T)) / (1 << 20), t.opt_name,
               double(t.optimizer->state_bytes()) / (1 << 20), spec.shard_state ? " per rank: ZeRO-1" : "", model.device().describe());
  if (model.frozen_params() > 0) {
    spdlog::info("adapter: {} trainable parameters of {} ({:.3f}%); the frozen base's gradients and optimizer state, "
                 "{:.1f} MiB, are not kept",
                 model.num_trainable(), model.num_params(), 100.0 * double(model.num_trainable()) / double(model.num_params()),
                 double(frozen_state_bytes(model, *t.optimizer)) / (1 << 20));
  }
  if (model.nf4_params() > 0) {
    spdlog::info("nf4 base: {} weights in {:.2f} MiB instead of {:.2f} MiB in fp32 ({:.2f}x smaller)", model.nf4_params(),
                 double(model.nf4_bytes()) / (1 << 20), double(model.nf4_params()) * 4.0 / (1 << 20),
                 double(model.nf4_params()) * 4.0 / double(model.nf4_bytes()));
  }
  if (run.world > 1) {
    spdlog::info("data parallel: {} ranks over {}, {} thread(s) each; global batch {} x {} x {} x {} tokens", run.world, t.comm_name,
                 run.threads, run.world, accum, B, T);
  }
  if (!t.engine->buckets().empty()) {
    spdlog::info("gradients reduced in {} buckets of up to {} MB as the last micro-batch's backward pass finishes them{}",
                 t.engine->buckets().size(), spec.run.bucket_mb, spec.shard_state ? " (each shard's part to its owner)" : "");
  }
  const std::string peak = p.peak.rank_tflops > 0 ? fmt::format("peak {:.3f} TFLOP/s ({})", p.peak.rank_tflops, p.peak.source)
                                                  : "no peak, no MFU (" + p.peak.source + ")";
  spdlog::info("training {} steps of {} x {} x {} tokens{} on {} thread(s); {}; run dir {}", spec.run.steps, accum, B, T,
               run.world > 1 ? " per rank" : "", run.threads, peak, t.dir.string());
}

// Before the first step: the result and metrics started, the run's clock and CPU times taken; a run
// resumed at its last step takes its losses from that checkpoint.
void begin_steps(TrainingSetup& t, TrainingProgress& p) {
  p.result.run_dir = t.dir;
  p.result.steps = p.start_step;
  const int64_t steps = t.spec.run.steps;
  p.metrics.emplace(p.start_step, steps, p.peak, t.run.world > 1 || t.comm.moves_data());
  p.micro.resize(static_cast<std::size_t>(t.spec.run.grad_accum_steps));
  p.t_run = Clock::now();
  p.cpu_at_start = read_cpu_times();
  if (p.start_step == steps && t.options.resume) {
    // Stopped after its last checkpoint but before summary.json: the summary is completed from
    // that checkpoint (its losses; the validation loss evaluated again where it does not hold one).
    p.result.final_loss = std::isfinite(p.resumed.loss) ? p.resumed.loss : std::numeric_limits<double>::quiet_NaN();
    p.last_val = std::isfinite(p.resumed.val_loss) ? p.resumed.val_loss : t.eval.available ? t.eval.run(*t.model, t.comm) : -1;
    spdlog::info("step {} of {} is already trained: completing the run's summary", p.start_step, steps);
  }
}

// Whether TrainOptions::preempt asks to stop after this step, on every rank alike: with several
// ranks a signal reaches each at its own moment, so the flags are all-reduced (max) every step.
bool preempt_requested(TrainingSetup& t) {
  if (t.options.preempt == nullptr) return false;
  double flag = t.options.preempt->load() ? 1.0 : 0.0;
  if (t.run.world > 1) t.comm.all_reduce_host(flat_view(&flag, DType::f64, 1), ReduceOp::max);
  return flag > 0;
}

// The step loop: per step the micro-batches, the engine step, its metrics, evaluation, logging and
// checkpoint, until run.steps or --stop-at.
void train_steps(TrainingSetup& t, TrainingProgress& p, const Schedule* schedule) {
  const RunSpec& spec = t.spec;
  const int64_t steps = spec.run.steps, eval_every = spec.run.eval_every;
  Model& model = *t.model;
  Engine& engine = *t.engine;
  for (int64_t step = p.start_step + 1; step <= steps; ++step) {
    const bool profiling = step > steps - spec.run.profile_steps;
    engine.set_op_times(profiling ? &p.op_times : nullptr);
    const auto t0 = Clock::now();
    double wait_ms = 0;
    for (Batch& b : p.micro) wait_ms += t.train_data->next_into(b);  // handed over, not copied
    const double lr = schedule->at(step);
    const StepOutcome outcome = engine.step(p.micro, step, lr);
    model.device().synchronize();
    engine.set_op_times(nullptr);  // evaluation is not part of the step
    const double step_s = seconds_since(t0);
    if (profiling) {
      ++p.profiled_steps;
      p.profiled_s += step_s;
    }
    StepMetrics sm = p.metrics->record(step, lr, outcome, step_s, wait_ms, model.flops_per_token(p.micro[0].seq_len),
                                       model.device().memory_peak(), t.optimizer->state_bytes());
    p.result.losses.push_back(outcome.loss);
    p.result.final_loss = outcome.loss;
    p.result.steps = step;

    const bool do_eval = t.eval.available && ((eval_every > 0 && step % eval_every == 0) || step == steps);
    if (do_eval) {
      p.last_val = t.eval.run(model, t.comm);
      sm.extra.push_back({"val_loss", p.last_val});
    }
    bool evaluated = false;  // the [[eval]] tables due after this step
    for (EvalTask& e : t.evals) {
      if (!e.due(step, steps, eval_every)) continue;
      run_eval_task(e, *t.eval_view, step, &sm.extra);
      evaluated = true;
    }
    if (do_eval || evaluated) engine.forget_captured_step();  // the model's buffers served other batches
    if (t.lead && (step % spec.log_every == 0 || step == steps || do_eval || evaluated)) {
      sm.extra.push_back({"elapsed_s", seconds_since(p.t_run)});
      for (auto& l : p.loggers.sinks) l->log(sm);
      if (t.options.on_step) t.options.on_step(sm);
    }
    const bool preempted = preempt_requested(t) && step < steps;
    const bool stopping = (t.options.stop_at > 0 && step == t.options.stop_at && step < steps) || preempted;
    if ((spec.checkpoint_every > 0 && step % spec.checkpoint_every == 0) || step == steps || stopping) {
      t.checkpoints->save(step, model, *t.optimizer, *t.train_data, outcome.loss,
                          do_eval ? p.last_val : std::numeric_limits<double>::quiet_NaN());
    }
    if (stopping) {
      p.stopped = true;
      p.result.preempted = preempted;
      spdlog::info("stopping after step {} ({}); `ablate train ... --resume` continues", step,
                   preempted ? "preempted: SIGUSR1, a checkpoint written" : "--stop-at");
      break;
    }
  }
}

// run.cuda_graph: how many of this process's steps were captured and replayed, said once where
// none was replayed (every step's batch had another layout than the one before it).
void cuda_graph_summary(const Engine& engine, int64_t steps, json& summary) {
  summary["captured_steps"] = engine.captured_steps();
  summary["replayed_steps"] = engine.replayed_steps();
  if (engine.replayed_steps() == 0 && steps > 2) {
    spdlog::warn("run.cuda_graph: no step was replayed: each step's batch had another layout than the step before "
                 "(packed or padded rows); dense rows (one document of the full length a row) replay every step");
  } else {
    spdlog::info("run.cuda_graph: {} of {} steps replayed from a captured step", engine.replayed_steps(), steps);
  }
}

// The end of the run: the op profile, summary.json (with every rank's memory peak) and the last log line.
TrainResult finish(TrainingSetup& t, TrainingProgress& p) {
  TrainResult& result = p.result;
  Model& model = *t.model;
  result.val_loss = p.last_val;
  write_profile(t.dir, p.op_times, p.profiled_steps, p.profiled_s, t.lead);

  // The largest memory peak of any rank.
  double mem_peak = double(model.device().memory_peak());
  t.comm.all_reduce_host(flat_view(&mem_peak, DType::f64, 1), ReduceOp::max);
  json summary = p.metrics->summary();
  summary.update(machine_load_summary(p.cpu_at_start, t.comm));
  if (!t.evals.empty()) summary["evals"] = evals_summary(t.evals);
  if (t.spec.run.cuda_graph) cuda_graph_summary(*t.engine, result.steps - p.start_step, summary);
  summary.update({{"status", p.result.preempted ? "preempted"
                             : p.stopped        ? "stopped"
                                                : "completed"},
                  {"steps", result.steps},
                  {"resumed_from", p.start_step},
                  {"parameters", model.num_params()},
                  {"trainable_parameters", model.num_trainable()},
                  {"frozen_state_bytes_saved", frozen_state_bytes(model, *t.optimizer)},
                  {"world", t.run.world},
                  {"final_loss", std::isfinite(result.final_loss) ? json(result.final_loss) : json(nullptr)},
                  {"val_loss", p.last_val < 0 ? json(nullptr) : json(p.last_val)},
                  {"data_bottleneck", t.train_data->stats().bottleneck()},
                  {"mem_peak_bytes", int64_t(mem_peak)},
                  {"optimizer_state_bytes", t.optimizer->state_bytes()},
                  {"wall_s", seconds_since(p.t_run)},
                  {"config_hash", t.spec.config_hash}});
  p.loggers.close();
  if (t.lead) write_json_file(t.dir / "summary.json", summary);
  const std::string val_text = p.last_val >= 0 ? fmt::format(" (val {:.4f})", p.last_val) : std::string();
  if (result.steps == p.start_step) {
    spdlog::info("done: no step left to train; final loss {:.4f}{}; summary.json completed; run dir {}", result.final_loss, val_text,
                 t.dir.string());
  } else {
    const std::string mfu = p.peak.job_tflops > 0 ? fmt::format("mfu {:.1f}%", 100.0 * p.metrics->median_mfu()) : "no mfu";
    spdlog::info("done: loss {:.4f} -> {:.4f}{}, {} tok/s median, {}, {:.1f}s; run dir {}", p.metrics->first_loss(), result.final_loss,
                 val_text, si(p.metrics->median_tokens_per_s()), mfu, seconds_since(p.t_run), t.dir.string());
  }
  return std::move(result);
}

// The run on this rank, phase by phase: set-up, the starting point, the outputs, the steps, the end.
TrainResult train_ranks(const Session& session, const TrainOptions& options, Communicator& comm, const std::string& comm_name,
                        std::unique_ptr<Device> device) {
  TrainingSetup t(session, options, comm, comm_name);
  t.device = std::move(device);
  set_up(t);
  const std::unique_ptr<Schedule> schedule = session.schedule();
  TrainingProgress p;
  resume_or_init(t, p);
  open_outputs(t, p);
  begin_steps(t, p);
  train_steps(t, p, schedule.get());
  return finish(t, p);
}

}  // namespace

TrainResult train(const Config& config, Registry& registry, const TrainOptions& options) {
  const RunSpec spec = RunSpec::from(config);  // the config's one reading
  Session session(spec, registry);
  // The device first: a communicator that serves it (nccl) needs it there, and a missing one is
  // an input error naming run.device, not the communicator's failure to find it. Made once: the
  // model takes it.
  std::unique_ptr<Device> device = session.device();
  // The ranks of the job. Every rank runs this function; rank 0 alone writes the run directory.
  const std::string comm_name = session.communicator_name(device->capabilities());
  auto comm = session.communicator(comm_name);
  session.set_ranks(comm->rank(), comm->world());
  if (spec.run.threads == 0 && comm->local_world() > 1) {  // the machine's cores, shared
    session.set_threads(use_cpu_threads(std::max(1, int(std::max(1u, std::thread::hardware_concurrency())) / comm->local_world())));
  }
  if (session.run().rank != 0) spdlog::set_level(spdlog::level::warn);  // one voice: rank 0's
  // A rank that leaves with an error ends the job: the others would wait in their next collective
  // until the timeout. (Errors every rank meets alike end every rank alike, with the same code.)
  try {
    return train_ranks(session, options, *comm, comm_name, std::move(device));
  } catch (const Error& e) {
    comm->abort_job_at_exit(e.exit_code(), e.what());
    throw;
  } catch (const std::exception& e) {
    comm->abort_job_at_exit(1, e.what());
    throw;
  }
}

}  // namespace ablate
