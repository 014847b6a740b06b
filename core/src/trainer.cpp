// The trainer and its checkpoints (see trainer.hpp).
#include "ablate/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/communicator.hpp"
#include "ablate/config.hpp"
#include "ablate/error.hpp"
#include "ablate/launch_env.hpp"
#include "ablate/mix.hpp"
#include "ablate/pipeline.hpp"
#include "ablate/registry.hpp"
#include "ablate/safetensors.hpp"
#include "ablate/schedule.hpp"
#include "ablate/version.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ablate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }


int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}


std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json cursor_json(const DataCursor& c) {
  json pending = json::array();
  for (const PendingPiece& p : c.pending) pending.push_back({p.document, p.begin, p.end});
  return {{"draw", c.draw}, {"pending", pending}};
}

DataCursor cursor_from(const json& j) {
  DataCursor c;
  c.draw = j.at("draw").get<uint64_t>();
  for (const json& p : j.at("pending")) c.pending.push_back({p.at(0).get<uint64_t>(), p.at(1).get<int32_t>(), p.at(2).get<int32_t>()});
  return c;
}

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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string si(double x) {
  char buf[32];
  if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
  else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", x);
  return buf;
}

TensorView host_view(double* data, int64_t n) { return flat_view(data, DType::f64, n); }

std::vector<NamedTensor> param_tensors(const ParamTable& table, const std::vector<float>& data) {
  std::vector<NamedTensor> out;
  for (const ParamSlice& s : table.slices) {
    NamedTensor t;
    t.name = s.name;
    t.dtype = DType::f32;
    t.shape = s.shape;
    t.bytes.resize(std::size_t(s.numel()) * 4);
    std::memcpy(t.bytes.data(), data.data() + s.offset, t.bytes.size());
    out.push_back(std::move(t));
  }
  return out;
}

void load_params(const fs::path& file, const ParamTable& table, std::vector<float>& data) {
  SafetensorsFile f;
  try {
    f = read_safetensors(file);
  } catch (const Error& e) {
    throw_input_error(file.string(), std::string("cannot read the checkpoint's parameters: ") + e.what());
  }
  for (const ParamSlice& s : table.slices) {
    const NamedTensor* t = f.find(s.name);
    if (t == nullptr) throw_input_error(file.string(), "the checkpoint has no tensor '" + s.name + "': it was written for another model");
    if (t->shape != s.shape || t->dtype != DType::f32) {
      std::string want, got;
      for (int64_t d : s.shape) want += (want.empty() ? "" : "x") + std::to_string(d);
      for (int64_t d : t->shape) got += (got.empty() ? "" : "x") + std::to_string(d);
      throw_input_error(file.string(), "tensor '" + s.name + "' is " + got + " in the checkpoint, the model expects " + want +
                                           ": the checkpoint does not match the config's [model]");
    }
    std::memcpy(data.data() + s.offset, t->bytes.data(), t->bytes.size());
  }
  if (f.tensors.size() != table.slices.size()) {
    throw_input_error(file.string(), "the checkpoint has " + std::to_string(f.tensors.size()) + " tensors, the model " +
                                         std::to_string(table.slices.size()) + ": it was written for another model");
  }
}

void write_json_atomic(const fs::path& p, const json& j) { write_file_atomic(p, j.dump(2) + "\n"); }

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
    comm.all_reduce(host_view(acc, 2), ReduceOp::sum);
    return acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  }
};

// The part of `table` inside `shard`, offsets relative to the shard's start: what a rank's
// optimizer sees under ZeRO-1. A slice cut by a shard boundary keeps its name and becomes flat.
ParamTable shard_table(const ParamTable& table, Shard shard) {
  ParamTable out;
  out.total = shard.count;
  const int64_t end = shard.offset + shard.count;
  for (const ParamSlice& s : table.slices) {
    const int64_t lo = std::max(s.offset, shard.offset), hi = std::min(s.offset + s.numel(), end);
    if (lo >= hi) continue;
    ParamSlice piece = s;
    piece.offset = lo - shard.offset;
    if (hi - lo != s.numel()) piece.shape = {hi - lo};
    out.slices.push_back(std::move(piece));
  }
  return out;
}

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
  comm.all_gather(flat_view(all.data(), DType::i32, 4 * world));
  std::string config_ranks, data_ranks;
  for (int r = 1; r < world; ++r) {
    const int32_t* x = all.data() + 4 * r;
    if (x[0] != all[0] || x[1] != all[1]) config_ranks += (config_ranks.empty() ? "" : ", ") + std::to_string(r);
    if (x[2] != all[2] || x[3] != all[3]) data_ranks += (data_ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!config_ranks.empty()) {
    throw_input_error(where, "rank(s) " + config_ranks + " resolved another experiment than rank 0 (this is rank " +
                                 std::to_string(rank) + ", config hash " + config_hash +
                                 "): start every rank with the same config file and --set overrides");
  }
  if (!data_ranks.empty()) {
    throw_input_error(where, "rank(s) " + data_ranks + " read other data or built another model than rank 0 (this is rank " +
                                 std::to_string(rank) + ": " + data_and_model +
                                 "): every rank must see the same data files and plugins");
  }
}

// The shard's part of a flat f32 buffer.
TensorView slice(TensorView v, Shard shard) {
  return flat_view(v.as<float>() + shard.offset, DType::f32, shard.count, v.device);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

fs::path resolve_checkpoint(const fs::path& path) {
  if (!fs::exists(path)) throw_input_error(path.string(), "no such checkpoint or run directory");
  if (fs::exists(path / "state.json")) return path;
  const fs::path latest = path / "checkpoints" / "latest";
  if (fs::exists(latest)) {
    std::string name = read_text(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    const fs::path dir = path / "checkpoints" / name;
    if (!fs::exists(dir / "state.json")) throw_input_error(latest.string(), "names '" + name + "', which is not a complete checkpoint");
    return dir;
  }
  throw_input_error(path.string(), "is neither a checkpoint (no state.json) nor a run directory with checkpoints/latest");
}

CheckpointState read_checkpoint_state(const fs::path& dir) {
  const fs::path file = dir / "state.json";
  CheckpointState s;
  try {
    const json j = json::parse(read_text(file));
    s.step = j.at("step").get<int64_t>();
    s.cursor = cursor_from(j.at("data_cursor"));
    s.seed = j.at("seed").get<uint64_t>();
    s.config_hash = j.at("config_hash").get<std::string>();
    s.model = j.at("model").get<std::string>();
    s.parameters = j.at("parameters").get<int64_t>();
    s.optimizer = j.at("optimizer").get<std::string>();
    s.vocab_size = j.at("vocab_size").get<int64_t>();
    s.world = j.value("world", 1);
    s.shard_state = j.value("shard_state", false);
    if (j.contains("data_cursors")) {
      for (const json& c : j.at("data_cursors")) s.cursors.push_back(cursor_from(c));
    } else {
      s.cursors.push_back(s.cursor);
    }
    if (j.contains("optimizer_files")) {
      s.optimizer_files = j.at("optimizer_files").get<std::vector<std::string>>();
    } else {
      s.optimizer_files.push_back("optimizer.safetensors");
    }
  } catch (const json::exception& e) {
    throw_input_error(file.string(), std::string("not a valid checkpoint state: ") + e.what());
  }
  if (s.world < 1 || int64_t(s.cursors.size()) != s.world ||
      int64_t(s.optimizer_files.size()) != (s.shard_state ? s.world : 1)) {
    throw_input_error(file.string(), "not a valid checkpoint state: world " + std::to_string(s.world) + " with " +
                                         std::to_string(s.cursors.size()) + " data cursors and " +
                                         std::to_string(s.optimizer_files.size()) + " optimizer files");
  }
  return s;
}

LoadedModel load_model(const fs::path& path, Registry& registry) {
  LoadedModel lm;
  lm.dir = resolve_checkpoint(path);
  lm.state = read_checkpoint_state(lm.dir);
  const fs::path cfg = lm.dir / "config.toml";
  if (!fs::exists(cfg)) throw_input_error(lm.dir.string(), "checkpoint has no config.toml");
  lm.config = std::make_unique<Config>(Config::parse(read_text(cfg), cfg.string(), {}, registry, lm.dir));
  RunContext run;
  run.seed = lm.state.seed;
  run.device = "cpu";
  const ModelOptions mo = ModelOptions::from(*lm.config, lm.state.vocab_size);
  lm.model = std::make_unique<Model>(mo, registry, run);
  std::vector<float> values(std::size_t(lm.model->num_params()));
  load_params(lm.dir / "model.safetensors", lm.model->table(), values);
  lm.model->load_params_from_host(values);
  return lm;
}

// ---------------------------------------------------------------------------------------------

RunContext training_context(const Config& config) {
  const Params run_p = config.section("run");
  RunContext run;
  run.seed = uint64_t(run_p.get_int("seed"));
  run.device = run_p.get_string("device");
  run.threads = int(run_p.get_int("threads"));
  if (run.threads == 0) run.threads = int(std::max(1u, std::thread::hardware_concurrency()));
#ifdef _OPENMP
  omp_set_num_threads(run.threads);
#endif
  return run;
}

int64_t memory_budget_bytes(const Config& config) {
  const double gib = config.section("run").get_float("memory_budget_gib");
  return gib > 0 ? int64_t(gib * double(1ll << 30)) : physical_memory_bytes();
}

std::string resolve_communicator(const Config& config) {
  const Params run_p = config.section("run");
  const std::string chosen = run_p.get_string("communicator");
  launch::LaunchEnv env;
  try {
    env = launch::read_launch_env();
  } catch (const std::invalid_argument& e) {
    throw_input_error("launcher environment", e.what());
  }
  if (chosen == kAutoCommunicator) {
    if (env.world <= 1) return "single";
    return run_p.get_string("device") == "cuda" ? "nccl" : "mpi";
  }
  if (chosen == "single" && env.world > 1) {
    throw_input_error("run.communicator", "is \"single\" but the " + env.launcher + " launcher started " +
                                              std::to_string(env.world) + " ranks: each would train alone into the same "
                                              "run directory; set communicator = \"mpi\" (CPU), \"nccl\" (GPU) or \"auto\"");
  }
  return chosen;
}

namespace {

TrainResult train_ranks(const Config& config, Registry& registry, const TrainOptions& options, Communicator& comm,
                        const RunContext& run, const std::string& comm_name) {
  const Params run_p = config.section("run");
  const Params opt_p = config.section("optimizer");
  const Params ckpt_p = config.section("checkpoint");
  const Params log_p = config.section("logging");
  const int64_t steps = run_p.get_int("steps");
  const int64_t accum = run_p.get_int("grad_accum_steps");
  const int64_t eval_every = run_p.get_int("eval_every");
  const int64_t ckpt_every = ckpt_p.get_int("every");
  const int64_t keep = ckpt_p.get_int("keep");
  const int64_t log_every = log_p.get_int("every");
  const double grad_clip = opt_p.get_float("grad_clip");
  const bool shard_state = opt_p.get_bool("shard_state");
  const int64_t memory_bytes = memory_budget_bytes(config);
  const std::string memory_source = run_p.get_float("memory_budget_gib") > 0 ? "run.memory_budget_gib" : "physical memory";
  const int rank = run.rank, world = run.world;
  const bool lead = rank == 0;

  // Run directory: refuse to start over a run that already has checkpoints.
  const fs::path dir = options.run_dir;
  const fs::path ckpt_root = dir / "checkpoints";
  const bool has_checkpoint = fs::exists(ckpt_root / "latest");
  if (options.resume && !has_checkpoint) {
    throw_input_error(dir.string(), "--resume: this run directory has no checkpoint to resume from" +
                                        std::string(world > 1 ? " (with several machines the run directory must be on a "
                                                                "filesystem every rank sees)"
                                                              : ""));
  }
  if (!options.resume && has_checkpoint) {
    throw_input_error(dir.string(), "already holds a run with checkpoints; pass --resume to continue it, or --run-dir to "
                                    "start a new one elsewhere");
  }
  comm.barrier();  // every rank has looked before rank 0 writes anything
  if (lead) fs::create_directories(ckpt_root);

  // Data: each rank draws its own share of the training documents (the sampler deals them out).
  auto source = make_data_source(config, registry, run);
  auto train_data = DataPipeline::from_config(config, registry, run, Split::train, source);
  Evaluator eval;
  eval.batches = run_p.get_int("eval_batches");
  eval.available = source->size(Split::validation) > 0 && eval.batches > 0;
  if (eval.available) {
    RunContext one = run;  // the validation batches of a world of one, split among the ranks
    one.rank = 0;
    one.world = 1;
    eval.pipeline = DataPipeline::from_config(config, registry, one, Split::validation, source);
  }

  // Model and optimizer.
  const ModelOptions mo = ModelOptions::from(config, source->vocab_size());
  Model model(mo, registry, run);
  const Params batching = config.section("batching");
  const int64_t B = batching.get_int("batch_size"), T = batching.get_int("seq_len");
  if (T > mo.max_seq_len) {
    throw_input_error("batching.seq_len", std::to_string(T) + " exceeds model.max_seq_len " + std::to_string(mo.max_seq_len));
  }
  if (const std::string why = model.attention_supports(B, T); !why.empty()) {
    throw_input_error("attention.name", "'" + mo.attention + "' cannot serve this model: " + why);
  }
  if (world > 1) require_same_experiment(comm, config.hash(), source->describe() + "; " + mo.describe(), config.source());
  const std::string opt_name = config.selected("optimizer");
  auto optimizer = registry.create<Optimizer>(Kind::optimizer, opt_name,
                                              {opt_p, config.implementation("optimizer", opt_name), run});
  // ZeRO-1: this rank's optimizer owns the contiguous shard `mine` of the flat parameter buffer.
  const int64_t n_params = model.num_params();
  const Shard mine = shard_state ? shard_of(n_params, world, rank) : Shard{0, n_params};
  const ParamTable opt_table = shard_state ? shard_table(model.table(), mine) : model.table();
  optimizer->init(opt_table, model.device().type());
  const LrSchedule schedule = LrSchedule::from(config.section("schedule"), opt_p.get_float("lr"), steps);
  auto optimizer_file = [&](int r) -> std::string {
    if (!shard_state) return "optimizer.safetensors";
    char buf[64];
    std::snprintf(buf, sizeof buf, "optimizer.rank_%05d-of-%05d.safetensors", r, world);
    return buf;
  };

  int64_t start_step = 0;
  if (options.resume) {
    const fs::path cdir = resolve_checkpoint(dir);
    const fs::path state_file = cdir / "state.json";
    const CheckpointState st = read_checkpoint_state(cdir);
    if (st.parameters != model.num_params() || st.model != mo.describe()) {
      throw_input_error(state_file.string(), "the checkpoint's model (" + st.model + ", " + std::to_string(st.parameters) +
                                                 " parameters) does not match the config's (" + mo.describe() + ", " +
                                                 std::to_string(model.num_params()) + ")");
    }
    if (st.optimizer != opt_name) {
      throw_input_error(state_file.string(), "the checkpoint was written by optimizer '" + st.optimizer +
                                                 "', the config selects '" + opt_name + "'");
    }
    if (st.world != world) {
      throw_input_error(state_file.string(), "the checkpoint was written by a job of " + std::to_string(st.world) +
                                                 " rank(s), this job has " + std::to_string(world) +
                                                 ": every rank's place in the data is its own, so resume with " +
                                                 std::to_string(st.world) + " rank(s)" +
                                                 (st.world > 1 ? " (mpirun -np " + std::to_string(st.world) + ")" : ""));
    }
    if (st.shard_state != shard_state) {
      throw_input_error(state_file.string(), std::string("the checkpoint's optimizer state is ") +
                                                 (st.shard_state ? "sharded over the ranks (optimizer.shard_state = true)"
                                                                 : "whole (optimizer.shard_state = false)") +
                                                 ": resume with the same optimizer.shard_state");
    }
    if (st.config_hash != config.hash()) {
      spdlog::warn("the config differs from the one the checkpoint was written with ({} vs {}): the continued run is "
                   "not the uninterrupted one", config.hash(), st.config_hash);
    }
    std::vector<float> values(std::size_t(model.num_params()));
    load_params(cdir / "model.safetensors", model.table(), values);
    model.load_params_from_host(values);
    const fs::path ofile = cdir / st.optimizer_files[std::size_t(shard_state ? rank : 0)];
    SafetensorsFile of;
    try {
      of = read_safetensors(ofile);
    } catch (const Error& e) {
      throw_input_error(ofile.string(), std::string("cannot read the optimizer state: ") + e.what());
    }
    optimizer->load_state(of.tensors);
    train_data->restore(st.cursors[std::size_t(rank)]);
    start_step = st.step;
    spdlog::info("resuming {} from step {}", cdir.string(), st.step);
  } else {
    model.init_params(run.seed);
  }
  if (world > 1) {  // one model for every rank, whatever each computed: rank 0's
    TensorView p = model.params();
    comm.broadcast(p, 0);
  }

  // What the run is, for reproduction.
  if (lead) {
    write_file_atomic(dir / "config.toml", config.to_toml());
    json plugins = json::array();
    for (const ComponentInfo* info : registry.all()) {
      plugins.push_back({{"kind", std::string(to_string(info->kind))}, {"name", info->name}, {"version", info->version},
                         {"library", info->library}});
    }
    write_json_atomic(dir / "run.json", {{"ablate_version", ABLATE_VERSION_STRING},
                                         {"device", run.device},
                                         {"threads", run.threads},
                                         {"world", world},
                                         {"communicator", comm_name},
                                         {"shard_state", shard_state},
                                         {"parameters", model.num_params()},
                                         {"model", mo.describe()},
                                         {"config_hash", config.hash()},
                                         {"memory_bytes", memory_bytes},
                                         {"memory_source", memory_source},
                                         {"param_bytes", int64_t(model.num_params()) * 4},
                                         {"grad_bytes", int64_t(model.num_params()) * 4},
                                         {"activation_bytes", model.activation_bytes(B, T)},
                                         {"batch_size", B},
                                         {"seq_len", T},
                                         {"grad_accum_steps", accum},
                                         {"plugins", plugins}});
  }
  // Loggers (rank 0): every sink of [logging] sinks, opened with where the run starts.
  LoggerSet loggers;
  for (const std::string& name : config.selected_list("logging")) {
    if (registry.find(Kind::logger, name) == nullptr) {
      const std::vector<std::string> valid = registry.names(Kind::logger);
      std::string list;
      for (const std::string& v : valid) list += (list.empty() ? "" : ", ") + v;
      throw_input_error("logging.sinks", "unknown logger '" + name + "' (loaded: " + (list.empty() ? "none" : list) + ")");
    }
  }
  if (lead) {
    LogContext lc;
    lc.run_dir = dir.string();
    lc.config_toml = config.to_toml();
    lc.run_name = fs::absolute(dir).lexically_normal().filename().string();
    if (lc.run_name.empty()) lc.run_name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
    lc.start_step = start_step;
    lc.total_steps = steps;
    lc.log_every = log_every;
    for (const std::string& name : config.selected_list("logging")) {
      loggers.sinks.push_back(registry.create<Logger>(Kind::logger, name, {log_p, config.implementation("logging", name), run}));
      loggers.sinks.back()->open(lc);
    }
  }

  // The peak of one rank (configured, else on the CPU the measured fp32 matrix-product rate, every
  // rank measuring at once as they will train), and of the job: the sum over ranks.
  const double configured_peak = config.section("metrics").get_float("peak_tflops");
  double peak = configured_peak > 0 ? configured_peak : model.measure_matmul_tflops();
  double job_peak = peak;
  comm.all_reduce(host_view(&job_peak, 1), ReduceOp::sum);
  peak = job_peak / world;
  spdlog::info("model: {} parameters ({}); activations {:.1f} MiB per micro-batch; optimizer {} ({:.1f} MiB state{})",
               model.num_params(), mo.describe(), double(model.activation_bytes(B, T)) / (1 << 20), opt_name,
               double(optimizer->state_bytes()) / (1 << 20), shard_state ? " per rank: ZeRO-1" : "");
  if (world > 1) {
    spdlog::info("data parallel: {} ranks over {}, {} thread(s) each; global batch {} x {} x {} x {} tokens", world, comm_name,
                 run.threads, world, accum, B, T);
  }
  spdlog::info("training {} steps of {} x {} x {} tokens{} on {} thread(s); peak {:.3f} TFLOP/s ({}); run dir {}", steps, accum, B,
               T, world > 1 ? " per rank" : "", run.threads, peak, configured_peak > 0 ? "configured" : "measured",
               dir.string());

  // Every rank takes part: each writes its data cursor (and its optimizer shard), rank 0 the rest,
  // then rank 0 moves the finished directory into place.
  auto save_checkpoint = [&](int64_t step) {
    const fs::path final_dir = ckpt_root / step_name(step);
    const fs::path tmp = ckpt_root / ("." + step_name(step) + ".tmp");
    if (lead) {
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    }
    comm.barrier();
    char cname[48];
    std::snprintf(cname, sizeof cname, "cursor.rank_%05d.json", rank);
    write_json_atomic(tmp / cname, cursor_json(train_data->cursor()));
    if (shard_state || lead) {
      SafetensorsFile of;
      of.tensors = optimizer->save_state();
      write_safetensors(tmp / optimizer_file(rank), of);
    }
    comm.barrier();
    if (lead) {
      SafetensorsFile mf;
      std::vector<float> values;
      model.copy_params_to_host(values);
      mf.tensors = param_tensors(model.table(), values);
      mf.metadata["format"] = "ablate";
      write_safetensors(tmp / "model.safetensors", mf);
      write_file_atomic(tmp / "config.toml", config.to_toml());
      json cursors = json::array();
      for (int r = 0; r < world; ++r) {
        std::snprintf(cname, sizeof cname, "cursor.rank_%05d.json", r);
        cursors.push_back(json::parse(read_text(tmp / cname)));
        fs::remove(tmp / cname);
      }
      json ofiles = json::array();
      for (int r = 0; r < (shard_state ? world : 1); ++r) ofiles.push_back(optimizer_file(r));
      write_json_atomic(tmp / "state.json", {{"step", step},
                                             {"data_cursor", cursors[0]},
                                             {"data_cursors", cursors},
                                             {"world", world},
                                             {"shard_state", shard_state},
                                             {"optimizer_files", ofiles},
                                             {"seed", run.seed},
                                             {"rng", {{"dropout_key", "mix(seed, step, rank * accum + micro-batch)"}}},
                                             {"config_hash", config.hash()},
                                             {"model", mo.describe()},
                                             {"parameters", model.num_params()},
                                             {"vocab_size", mo.vocab_size},
                                             {"optimizer", opt_name}});
      fs::remove_all(final_dir);
      fs::rename(tmp, final_dir);
      write_file_atomic(ckpt_root / "latest", step_name(step) + "\n");
      // Keep the newest `keep` complete checkpoints.
      std::vector<fs::path> all;
      for (const auto& e : fs::directory_iterator(ckpt_root)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.rfind("step_", 0) == 0) all.push_back(e.path());
      }
      std::sort(all.begin(), all.end());
      for (std::size_t i = 0; i + std::size_t(keep) < all.size(); ++i) fs::remove_all(all[i]);
    }
    comm.barrier();  // the checkpoint is complete for every rank
  };

  TrainResult result;
  result.run_dir = dir;
  std::vector<double> tps, rtps, mfus, emfus, tfl, waits, comm_pcts;
  std::vector<Batch> micro(static_cast<std::size_t>(accum));
  const auto t_run = Clock::now();
  double last_val = -1;
  double first_loss = -1;
  bool stopped = false;
  Device& device = model.device();

  for (int64_t step = start_step + 1; step <= steps; ++step) {
    const auto t0 = Clock::now();
    double counts[2] = {0, 0};  // real targets, positions: this rank's, then the job's
    double wait_ms = 0;
    for (int64_t m = 0; m < accum; ++m) {
      const PipelineBatch& pb = train_data->next();
      micro[std::size_t(m)] = pb.batch;
      wait_ms += pb.wait_ms;
      counts[0] += double(pb.batch.real_targets());
      counts[1] += double(pb.batch.positions_total());
    }
    // Time inside collectives, waiting for the slowest rank included.
    double comm_s = 0;
    auto timed = [&comm_s](auto&& collective) {
      const auto c0 = Clock::now();
      collective();
      comm_s += seconds_since(c0);
    };
    // The loss is the mean over every real target of the global batch: the count comes first.
    timed([&] { comm.all_reduce(host_view(counts, 2), ReduceOp::sum); });
    const int64_t real = int64_t(counts[0]), positions = int64_t(counts[1]);
    model.zero_grads();
    double sums[2] = {0, 0};  // loss sum, squared gradient norm of this rank's shard (ZeRO-1)
    const double scale = real > 0 ? 1.0 / double(real) : 0.0;
    for (int64_t m = 0; m < accum; ++m) {
      const uint64_t key = mix64(run.seed, uint64_t(step) * 4096 + uint64_t(rank * accum + m));
      sums[0] += model.forward_backward(micro[std::size_t(m)], scale, key);
    }
    double norm = 0;
    if (shard_state) {
      timed([&] { comm.reduce_scatter(model.grads(), ReduceOp::sum); });
      sums[1] = device.squared_norm(slice(model.grads(), mine));
      timed([&] { comm.all_reduce(host_view(sums, 2), ReduceOp::sum); });
      norm = std::sqrt(sums[1]);
    } else {
      if (world > 1) {
        timed([&] {
          comm.all_reduce(host_view(sums, 1), ReduceOp::sum);
          comm.all_reduce(model.grads(), ReduceOp::sum);
        });
      }
      norm = std::sqrt(device.squared_norm(model.grads()));
    }
    const double loss = real > 0 ? sums[0] / double(real) : 0.0;
    if (!std::isfinite(loss)) {
      throw_runtime_error("train", "loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                                       "; lower optimizer.lr or enable optimizer.grad_clip");
    }
    if (grad_clip > 0 && norm > grad_clip) {
      device.scale(slice(model.grads(), mine), float(grad_clip / (norm + 1e-6)));
    }
    const double lr = schedule.at(step);
    if (shard_state) {
      optimizer->step(opt_table, slice(model.params(), mine), slice(model.grads(), mine), lr, step);
      timed([&] { comm.all_gather(model.params()); });
    } else {
      optimizer->step(model.table(), model.params(), model.grads(), lr, step);
    }
    const double step_s = seconds_since(t0);

    StepMetrics sm;
    sm.step = step;
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = norm;
    sm.step_ms = step_s * 1e3;
    sm.tokens = positions;
    sm.real_tokens = real;
    sm.padding_fraction = positions > 0 ? 1.0 - double(real) / double(positions) : 0.0;
    sm.tokens_per_s = double(positions) / step_s;
    sm.real_tokens_per_s = double(real) / step_s;
    const double fpt = model.flops_per_token(micro[0].seq_len);
    sm.tflops = fpt * double(positions) / step_s / 1e12;
    sm.mfu = job_peak > 0 ? sm.tflops / job_peak : 0.0;
    sm.effective_mfu = job_peak > 0 ? fpt * double(real) / step_s / 1e12 / job_peak : 0.0;
    sm.data_wait_pct = 100.0 * wait_ms / sm.step_ms;
    sm.mem_peak_bytes = device.memory_peak();
    sm.optimizer_state_bytes = optimizer->state_bytes();
    if (world > 1) {
      sm.extra.push_back({"comm_pct", 100.0 * comm_s / step_s});
      if (step > start_step + 1 || steps - start_step == 1) comm_pcts.push_back(100.0 * comm_s / step_s);
    }
    if (first_loss < 0) first_loss = loss;
    result.losses.push_back(loss);
    result.final_loss = loss;
    result.steps = step;
    if (step > start_step + 1 || steps - start_step == 1) {  // the first step carries warm-up costs
      tps.push_back(sm.tokens_per_s);
      rtps.push_back(sm.real_tokens_per_s);
      mfus.push_back(sm.mfu);
      emfus.push_back(sm.effective_mfu);
      tfl.push_back(sm.tflops);
    }
    waits.push_back(sm.data_wait_pct);

    const bool do_eval = eval.available && ((eval_every > 0 && step % eval_every == 0) || step == steps);
    if (do_eval) {
      last_val = eval.run(model, comm);
      sm.extra.push_back({"val_loss", last_val});
    }
    if (lead && (step % log_every == 0 || step == steps || do_eval)) {
      sm.extra.push_back({"elapsed_s", seconds_since(t_run)});
      for (auto& l : loggers.sinks) l->log(sm);
      if (options.on_step) options.on_step(sm);
    }
    const bool stopping = options.stop_at > 0 && step == options.stop_at && step < steps;
    if ((ckpt_every > 0 && step % ckpt_every == 0) || step == steps || stopping) save_checkpoint(step);
    if (stopping) {
      stopped = true;
      spdlog::info("stopping after step {} (--stop-at); `ablate train ... --resume` continues", step);
      break;
    }
  }
  result.val_loss = last_val;

  // The largest memory peak of any rank.
  double mem_peak = double(model.device().memory_peak());
  comm.all_reduce(host_view(&mem_peak, 1), ReduceOp::max);
  const PipelineStats ps = train_data->stats();
  json summary = {{"status", stopped ? "stopped" : "completed"},
                  {"steps", result.steps},
                  {"resumed_from", start_step},
                  {"parameters", model.num_params()},
                  {"world", world},
                  {"first_loss", first_loss},
                  {"final_loss", result.final_loss},
                  {"val_loss", last_val < 0 ? json(nullptr) : json(last_val)},
                  {"tokens_per_s", median(tps)},
                  {"real_tokens_per_s", median(rtps)},
                  {"tflops", median(tfl)},
                  {"mfu", median(mfus)},
                  {"effective_mfu", median(emfus)},
                  {"peak_tflops", peak},
                  {"data_wait_pct", median(waits)},
                  {"data_bottleneck", ps.bottleneck()},
                  {"mem_peak_bytes", int64_t(mem_peak)},
                  {"optimizer_state_bytes", optimizer->state_bytes()},
                  {"wall_s", seconds_since(t_run)},
                  {"config_hash", config.hash()}};
  if (world > 1) summary["comm_pct"] = median(comm_pcts);
  loggers.close();
  if (lead) write_json_atomic(dir / "summary.json", summary);
  spdlog::info("done: loss {:.4f} -> {:.4f}{}, {} tok/s median, mfu {:.1f}%, {:.1f}s; run dir {}", first_loss, result.final_loss,
               last_val >= 0 ? fmt::format(" (val {:.4f})", last_val) : std::string(), si(median(tps)), 100.0 * median(mfus),
               seconds_since(t_run), dir.string());
  return result;
}

}  // namespace

TrainResult train(const Config& config, Registry& registry, const TrainOptions& options) {
  RunContext run = training_context(config);
  const Params run_p = config.section("run");
  // The ranks of the job. Every rank runs this function; rank 0 alone writes the run directory.
  const std::string comm_name = resolve_communicator(config);
  auto comm = registry.create<Communicator>(Kind::communicator, comm_name,
                                            {run_p, config.implementation("run", comm_name), run});
  run.rank = comm->rank();
  run.world = comm->world();
  if (run_p.get_int("threads") == 0 && comm->local_world() > 1) {  // the machine's cores, shared
    run.threads = std::max(1, int(std::max(1u, std::thread::hardware_concurrency())) / comm->local_world());
#ifdef _OPENMP
    omp_set_num_threads(run.threads);
#endif
  }
  if (run.rank != 0) spdlog::set_level(spdlog::level::warn);  // one voice: rank 0's
  // A rank that leaves with an error ends the job: the others would wait in their next collective
  // until the timeout. (Errors every rank meets alike end every rank alike, with the same code.)
  try {
    return train_ranks(config, registry, options, *comm, run, comm_name);
  } catch (const Error& e) {
    comm->abort_job_at_exit(e.exit_code(), e.what());
    throw;
  } catch (const std::exception& e) {
    comm->abort_job_at_exit(1, e.what());
    throw;
  }
}

}  // namespace ablate
