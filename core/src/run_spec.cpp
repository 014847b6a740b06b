// RunSpec::from: the one place the runtime reads a Config's sections (run_spec.hpp).
#include "ablate/runtime/run_spec.hpp"

#include "ablate/error.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/trainer.hpp"
#include "host_memory.hpp"

namespace ablate {

namespace {

Choice choice(const Config& config, std::string_view section) {
  Choice c;
  c.section = std::string(section);
  if (!config.has_section(section)) return c;
  c.present = true;
  c.name = config.selected(section);
  c.common = config.section(section);
  c.own = config.implementation(section, c.name);
  return c;
}

ModelKeys model_keys(const Config& config) {
  ModelKeys m;
  m.keys = config.section("model");
  // The chosen layers' own tables ([model.<layer name>]), for every key of [model] naming a layer.
  for (const std::string& key : find_section_spec("model")->layer_keys) {
    const std::string name = m.keys.get_string(key);
    if (config.has_implementation("model", name)) m.layer_own.insert_or_assign(name, config.implementation("model", name));
  }
  m.init_from = m.keys.get_string("init_from");
  if (config.has_section("attention")) {
    m.has_attention = true;
    m.attention = choice(config, "attention");
  }
  m.adapter = choice(config, "adapter");
  return m;
}

RunKeys read_run_keys(const Params& run) {
  RunKeys r;
  r.seed = uint64_t(run.get_int("seed"));
  r.device = run.get_string("device");
  r.dtype = run.get_string("dtype");
  r.fp8_scaling = run.get_string("fp8_scaling");
  r.fp8_amax_history = run.get_int("fp8_amax_history");
  r.fp8_amax_reduction = run.get_string("fp8_amax_reduction");
  r.residual_dtype = run.get_string("residual_dtype");
  r.recompute = run.get_string("recompute");
  r.communicator = run.get_string("communicator");
  r.threads = int(run.get_int("threads"));
  r.steps = run.get_int("steps");
  r.grad_accum_steps = run.get_int("grad_accum_steps");
  r.eval_every = run.get_int("eval_every");
  r.eval_batches = run.get_int("eval_batches");
  r.profile_steps = run.get_int("profile_steps");
  r.memory_budget_gib = run.get_float("memory_budget_gib");
  r.bucket_mb = run.get_float("bucket_mb");
  r.cuda_graph = run.get_bool("cuda_graph");
  return r;
}

}  // namespace

RunSpec RunSpec::from(const Config& config) {
  RunSpec s;
  s.run_keys = config.section("run");
  s.run = read_run_keys(s.run_keys);
  s.model = model_keys(config);
  s.data = choice(config, "data");
  s.sampler = choice(config, "sampler");
  s.batching = choice(config, "batching");
  s.optimizer = choice(config, "optimizer");
  s.schedule = choice(config, "schedule");
  for (const std::string& name : config.implementations("batching"))
    s.batching_own.insert_or_assign(name, config.implementation("batching", name));
  for (const std::string& name : config.implementations("run"))
    s.communicator_own.insert_or_assign(name, config.implementation("run", name));
  const Params logging = config.section("logging");
  for (const std::string& name : config.selected_list("logging"))
    s.loggers.push_back({"logging", true, name, logging, config.implementation("logging", name)});

  for (const Config::EvalEntry& e : config.evals()) s.evals.push_back({"eval", true, e.common.get_string("name"), e.common, e.own});

  if (s.data.present) {
    s.data_workers = int(s.data.common.get_int("workers"));
    s.data_prefetch = int(s.data.common.get_int("prefetch"));
    s.data_debug_stats = s.data.common.get_bool("debug_stats");
    s.data_debug_every = int(s.data.common.get_int("debug_every"));
  }
  if (s.batching.present) {
    s.batch_size = s.batching.common.get_int("batch_size");
    s.seq_len = s.batching.common.get_int("seq_len");
    if (s.batching.own.has("token_budget")) s.token_budget = s.batching.own.get_int("token_budget");
  }
  if (s.optimizer.present) {
    s.lr = s.optimizer.common.get_float("lr");
    s.grad_clip = s.optimizer.common.get_float("grad_clip");
    s.shard_state = s.optimizer.common.get_bool("shard_state");
  }
  const Params ckpt = config.section("checkpoint");
  s.checkpoint_every = ckpt.get_int("every");
  s.checkpoint_keep = ckpt.get_int("keep");
  s.log_every = logging.get_int("every");
  s.peak_tflops = config.section("metrics").get_float("peak_tflops");

  s.config_toml = config.to_toml();
  s.config_hash = config.hash();
  s.config_source = config.source();
  return s;
}

const Choice& RunSpec::require(const Choice& c) const {
  if (!c.present) throw_input_error(config_source, "the experiment has no [" + c.section + "] section and it has no default");
  return c;
}

Choice RunSpec::communicator(const std::string& name) const {
  Choice c{"run", true, name, run_keys, {}};
  if (auto it = communicator_own.find(name); it != communicator_own.end()) c.own = it->second;
  return c;
}

RunContext RunSpec::context() const {
  RunContext c;
  c.seed = run.seed;
  c.device = run.device;
  c.dtype = run.dtype;
  c.fp8_scaling = run.fp8_scaling;
  c.fp8_amax_history = run.fp8_amax_history;
  c.fp8_amax_reduction = run.fp8_amax_reduction;
  c.residual_dtype = run.residual_dtype;
  c.threads = use_cpu_threads(run.threads);
  return c;
}

std::string RunSpec::memory_budget_source() const {
  return memory_budget_configured() ? "run.memory_budget_gib" : physical_memory_source();
}

int64_t RunSpec::memory_budget_bytes() const {
  return run.memory_budget_gib > 0 ? int64_t(run.memory_budget_gib * double(1ll << 30)) : physical_memory_bytes();
}

}  // namespace ablate
