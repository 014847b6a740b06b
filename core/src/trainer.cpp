// The trainer and its checkpoints (see trainer.hpp).
#include "ablate/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/config.hpp"
#include "ablate/error.hpp"
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

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}

uint64_t mix64(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
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

// Global L2 norm of the gradient buffer, summed in double in a fixed order per thread count.
double global_norm(const std::vector<float>& g) {
  double sum = 0;
  const int64_t n = int64_t(g.size());
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < n; ++i) sum += double(g[std::size_t(i)]) * double(g[std::size_t(i)]);
  return std::sqrt(sum);
}

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

struct Evaluator {
  std::unique_ptr<DataPipeline> pipeline;
  int64_t batches = 0;
  bool available = false;

  double run(Model& model) {
    pipeline->restore({});
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; ++i) {
      const PipelineBatch& pb = pipeline->next();
      sum += model.forward(pb.batch);
      count += pb.batch.real_targets();
    }
    return count > 0 ? sum / double(count) : 0.0;
  }
};

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
  } catch (const json::exception& e) {
    throw_input_error(file.string(), std::string("not a valid checkpoint state: ") + e.what());
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
  load_params(lm.dir / "model.safetensors", lm.model->table(), lm.model->param_data());
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
  if (run.device != "cpu") {
    throw_input_error("run.device", "'" + run.device + "' is not available in this build's trainer; use \"cpu\"");
  }
#ifdef _OPENMP
  omp_set_num_threads(run.threads);
#endif
  return run;
}

int64_t memory_budget_bytes(const Config& config) {
  const double gib = config.section("run").get_float("memory_budget_gib");
  return gib > 0 ? int64_t(gib * double(1ll << 30)) : physical_memory_bytes();
}

TrainResult train(const Config& config, Registry& registry, const TrainOptions& options) {
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

  const RunContext run = training_context(config);
  const int64_t memory_bytes = memory_budget_bytes(config);
  const std::string memory_source = run_p.get_float("memory_budget_gib") > 0 ? "run.memory_budget_gib" : "physical memory";

  // Run directory: refuse to start over a run that already has checkpoints.
  const fs::path dir = options.run_dir;
  const fs::path ckpt_root = dir / "checkpoints";
  const bool has_checkpoint = fs::exists(ckpt_root / "latest");
  if (options.resume && !has_checkpoint) {
    throw_input_error(dir.string(), "--resume: this run directory has no checkpoint to resume from");
  }
  if (!options.resume && has_checkpoint) {
    throw_input_error(dir.string(), "already holds a run with checkpoints; pass --resume to continue it, or --run-dir to "
                                    "start a new one elsewhere");
  }
  fs::create_directories(ckpt_root);

  // Data.
  auto source = make_data_source(config, registry, run);
  auto train_data = DataPipeline::from_config(config, registry, run, Split::train, source);
  Evaluator eval;
  eval.batches = run_p.get_int("eval_batches");
  eval.available = source->size(Split::validation) > 0 && eval.batches > 0;
  if (eval.available) eval.pipeline = DataPipeline::from_config(config, registry, run, Split::validation, source);

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
  const std::string opt_name = config.selected("optimizer");
  auto optimizer = registry.create<Optimizer>(Kind::optimizer, opt_name,
                                              {opt_p, config.implementation("optimizer", opt_name), run});
  optimizer->init(model.table(), DeviceType::cpu);
  const LrSchedule schedule = LrSchedule::from(config.section("schedule"), opt_p.get_float("lr"), steps);

  int64_t start_step = 0;
  if (options.resume) {
    const fs::path cdir = resolve_checkpoint(dir);
    const CheckpointState st = read_checkpoint_state(cdir);
    if (st.parameters != model.num_params() || st.model != mo.describe()) {
      throw_input_error((cdir / "state.json").string(), "the checkpoint's model (" + st.model + ", " +
                                                            std::to_string(st.parameters) + " parameters) does not match the config's (" +
                                                            mo.describe() + ", " + std::to_string(model.num_params()) + ")");
    }
    if (st.optimizer != opt_name) {
      throw_input_error((cdir / "state.json").string(), "the checkpoint was written by optimizer '" + st.optimizer +
                                                            "', the config selects '" + opt_name + "'");
    }
    if (st.config_hash != config.hash()) {
      spdlog::warn("the config differs from the one the checkpoint was written with ({} vs {}): the continued run is "
                   "not the uninterrupted one", config.hash(), st.config_hash);
    }
    load_params(cdir / "model.safetensors", model.table(), model.param_data());
    SafetensorsFile of;
    try {
      of = read_safetensors(cdir / "optimizer.safetensors");
    } catch (const Error& e) {
      throw_input_error((cdir / "optimizer.safetensors").string(), std::string("cannot read the optimizer state: ") + e.what());
    }
    optimizer->load_state(of.tensors);
    train_data->restore(st.cursor);
    start_step = st.step;
    spdlog::info("resuming {} from step {}", cdir.string(), st.step);
  } else {
    model.init_params(run.seed);
  }

  // What the run is, for reproduction.
  write_file_atomic(dir / "config.toml", config.to_toml());
  {
    json plugins = json::array();
    for (const ComponentInfo* info : registry.all()) {
      plugins.push_back({{"kind", std::string(to_string(info->kind))}, {"name", info->name}, {"version", info->version},
                         {"library", info->library}});
    }
    write_json_atomic(dir / "run.json", {{"ablate_version", ABLATE_VERSION_STRING},
                                         {"device", run.device},
                                         {"threads", run.threads},
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
  // Loggers: every sink of [logging] sinks, opened with where the run starts.
  LoggerSet loggers;
  {
    LogContext lc;
    lc.run_dir = dir.string();
    lc.config_toml = config.to_toml();
    lc.run_name = fs::absolute(dir).lexically_normal().filename().string();
    if (lc.run_name.empty()) lc.run_name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
    lc.start_step = start_step;
    lc.total_steps = steps;
    lc.log_every = log_every;
    for (const std::string& name : config.selected_list("logging")) {
      if (registry.find(Kind::logger, name) == nullptr) {
        const std::vector<std::string> valid = registry.names(Kind::logger);
        std::string list;
        for (const std::string& v : valid) list += (list.empty() ? "" : ", ") + v;
        throw_input_error("logging.sinks", "unknown logger '" + name + "' (loaded: " + (list.empty() ? "none" : list) + ")");
      }
      loggers.sinks.push_back(registry.create<Logger>(Kind::logger, name, {log_p, config.implementation("logging", name), run}));
      loggers.sinks.back()->open(lc);
    }
  }

  // The CPU's peak when none is configured: the measured fp32 matrix-product rate.
  const double configured_peak = config.section("metrics").get_float("peak_tflops");
  const double peak = configured_peak > 0 ? configured_peak : model.measure_matmul_tflops();
  spdlog::info("model: {} parameters ({}); activations {:.1f} MiB per micro-batch; optimizer {} ({:.1f} MiB state)",
               model.num_params(), mo.describe(), double(model.activation_bytes(B, T)) / (1 << 20), opt_name,
               double(optimizer->state_bytes()) / (1 << 20));
  spdlog::info("training {} steps of {} x {} x {} tokens on {} thread(s); peak {:.3f} TFLOP/s ({}); run dir {}", steps, accum, B,
               T, run.threads, peak, configured_peak > 0 ? "configured" : "measured",
               dir.string());

  auto save_checkpoint = [&](int64_t step) {
    const fs::path final_dir = ckpt_root / step_name(step);
    const fs::path tmp = ckpt_root / ("." + step_name(step) + ".tmp");
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    SafetensorsFile mf;
    mf.tensors = param_tensors(model.table(), model.param_data());
    mf.metadata["format"] = "ablate";
    write_safetensors(tmp / "model.safetensors", mf);
    SafetensorsFile of;
    of.tensors = optimizer->save_state();
    write_safetensors(tmp / "optimizer.safetensors", of);
    write_file_atomic(tmp / "config.toml", config.to_toml());
    write_json_atomic(tmp / "state.json", {{"step", step},
                                           {"data_cursor", cursor_json(train_data->cursor())},
                                           {"seed", run.seed},
                                           {"rng", {{"dropout_key", "mix(seed, step, micro-batch)"}}},
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
  };

  TrainResult result;
  result.run_dir = dir;
  std::vector<double> tps, rtps, mfus, emfus, tfl, waits;
  std::vector<Batch> micro(static_cast<std::size_t>(accum));
  std::vector<double> micro_wait(static_cast<std::size_t>(accum));
  const auto t_run = Clock::now();
  double last_val = -1;
  double first_loss = -1;
  bool stopped = false;

  for (int64_t step = start_step + 1; step <= steps; ++step) {
    const auto t0 = Clock::now();
    int64_t real = 0, positions = 0;
    double wait_ms = 0;
    for (int64_t m = 0; m < accum; ++m) {
      const PipelineBatch& pb = train_data->next();
      micro[std::size_t(m)] = pb.batch;
      wait_ms += pb.wait_ms;
      real += pb.batch.real_targets();
      positions += pb.batch.positions_total();
    }
    model.zero_grads();
    double loss_sum = 0;
    const double scale = real > 0 ? 1.0 / double(real) : 0.0;
    for (int64_t m = 0; m < accum; ++m) {
      loss_sum += model.forward_backward(micro[std::size_t(m)], scale, mix64(run.seed, uint64_t(step) * 4096 + uint64_t(m)));
    }
    const double loss = real > 0 ? loss_sum / double(real) : 0.0;
    if (!std::isfinite(loss)) {
      throw_runtime_error("train", "loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                                       "; lower optimizer.lr or enable optimizer.grad_clip");
    }
    const double norm = global_norm(model.grad_data());
    if (grad_clip > 0 && norm > grad_clip) {
      const float c = float(grad_clip / (norm + 1e-6));
      std::vector<float>& g = model.grad_data();
      const int64_t n = int64_t(g.size());
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) g[std::size_t(i)] *= c;
    }
    const double lr = schedule.at(step);
    optimizer->step(model.table(), model.params(), model.grads(), lr, step);
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
    sm.mfu = peak > 0 ? sm.tflops / peak : 0.0;
    sm.effective_mfu = peak > 0 ? fpt * double(real) / step_s / 1e12 / peak : 0.0;
    sm.data_wait_pct = 100.0 * wait_ms / sm.step_ms;
    sm.mem_peak_bytes = peak_rss_bytes();
    sm.optimizer_state_bytes = optimizer->state_bytes();
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
      last_val = eval.run(model);
      sm.extra.push_back({"val_loss", last_val});
    }
    if (step % log_every == 0 || step == steps || do_eval) {
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

  const PipelineStats ps = train_data->stats();
  json summary = {{"status", stopped ? "stopped" : "completed"},
                  {"steps", result.steps},
                  {"resumed_from", start_step},
                  {"parameters", model.num_params()},
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
                  {"mem_peak_bytes", peak_rss_bytes()},
                  {"optimizer_state_bytes", optimizer->state_bytes()},
                  {"wall_s", seconds_since(t_run)},
                  {"config_hash", config.hash()}};
  loggers.close();
  write_json_atomic(dir / "summary.json", summary);
  spdlog::info("done: loss {:.4f} -> {:.4f}{}, {} tok/s median, mfu {:.1f}%, {:.1f}s; run dir {}", first_loss, result.final_loss,
               last_val >= 0 ? fmt::format(" (val {:.4f})", last_val) : std::string(), si(median(tps)), 100.0 * median(mfus),
               seconds_since(t_run), dir.string());
  return result;
}

}  // namespace ablate
