// The experiment as the runtime uses it: every key of a Config that the runtime reads, read once
// (RunSpec::from) into typed fields, and each chosen implementation with its keys. The trainer,
// `ablate tune`, `ablate data`, `ablate import`, sweeps, the benchmarks and checkpoint loading make
// one RunSpec and hand each module the part it needs; no module takes the Config itself
// (run_spec.cpp and config.cpp are the only readers of its sections: tests/core/config_read_once.py).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/schema.hpp"

namespace ablate {

class Config;

// A chosen implementation: its name, the keys common to its kind (the section's core keys) and its
// own keys (the section's sub-table for it), as its factory takes them.
struct Choice {
  std::string section;   // "data", "optimizer", ...
  bool present = false;  // false: the experiment has no such section and the kind has no default
  std::string name;
  Params common;
  Params own;
};

// [run]'s keys.
struct RunKeys {
  uint64_t seed = 0;
  std::string device, dtype, recompute, communicator;
  std::string fp8_scaling = "current", fp8_amax_reduction = "max";  // run.dtype fp8: how the scales are set
  int64_t fp8_amax_history = 16;
  std::string residual_dtype = "fp32";  // the residual stream's type: fp32, or bf16 under bf16 products
  int threads = 0;                      // 0 = every core
  int64_t steps = 0, grad_accum_steps = 1, eval_every = 0, eval_batches = 0, profile_steps = 0;
  double memory_budget_gib = 0;  // 0 = the memory the process may have (physical, or a lower ulimit -v / -d)
  double bucket_mb = 0;
  bool cuda_graph = false;  // replay captured steps (Engine)
};

// [model]'s keys and the layers' own tables: what ModelOptions::from turns into a model's shape.
struct ModelKeys {
  Params keys;                                           // [model]'s core keys
  std::map<std::string, Params, std::less<>> layer_own;  // [model.<layer>] of each chosen layer that has keys
  std::string init_from;                                 // model.init_from ("" = fresh weights)
  bool has_attention = false;                            // an [attention] section (a model alone may have none)
  Choice attention;
  Choice adapter;  // [adapter] (present: the base frozen, adapters train)
};

struct RunSpec {
  RunKeys run;
  Params run_keys;  // [run]'s keys as the communicator's factory takes them
  ModelKeys model;
  Choice data, sampler, batching, optimizer, schedule;
  // Every batcher's own keys that the experiment resolves (the chosen one's, and any it gives).
  std::map<std::string, Params, std::less<>> batching_own;
  std::vector<Choice> loggers;  // [logging] sinks, in order
  // [[eval]] tables, in order: `name` the evaluator, `common` its label/every/enabled, `own` its keys.
  std::vector<Choice> evals;
  // run.communicator's own keys for every communicator it may resolve to ("auto": any loaded one).
  std::map<std::string, Params> communicator_own;

  // [data]
  int data_workers = 0, data_prefetch = 0, data_debug_every = 0;
  bool data_debug_stats = false;
  // [batching]
  int64_t batch_size = 0, seq_len = 0;
  int64_t token_budget = 0;  // the bucketed batcher's, when it is chosen and sets one (0 = none)
  // [optimizer], [checkpoint], [logging], [metrics]
  double lr = 0, grad_clip = 0;
  bool shard_state = false;
  int64_t checkpoint_every = 0, checkpoint_keep = 1, log_every = 1;
  double peak_tflops = 0;  // 0 = from the device

  // The config itself, as checkpoints and run files record it.
  std::string config_toml, config_hash, config_source;

  static RunSpec from(const Config& config);

  // `c` itself, or an input error naming the missing section (a component section without a
  // default implementation is absent until the experiment gives it).
  const Choice& require(const Choice& c) const;
  // The communicator `name` (run.communicator once "auto" is resolved) with its keys.
  Choice communicator(const std::string& name) const;

  // The run's context before ranks are known: seed, device, dtype and threads (use_cpu_threads
  // applies run.threads to OpenMP).
  RunContext context() const;
  // The host memory budget in bytes: run.memory_budget_gib, else the memory the process may have
  // (the machine's physical memory, or its address-space or data limit where that is lower).
  int64_t memory_budget_bytes() const;
  bool memory_budget_configured() const noexcept { return run.memory_budget_gib > 0; }
  // Where memory_budget_bytes() comes from: "run.memory_budget_gib", "physical memory" or the limit's name.
  std::string memory_budget_source() const;
};

}  // namespace ablate
