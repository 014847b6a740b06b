// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The trainer: steps of gradient-accumulated micro-batches (loss = mean over the real targets of the
// whole global batch), LR schedule, global-norm clipping, the optimizer, evaluation on the
// validation split, docs/architecture.md's metrics per step, and atomic checkpoints that resume bit for bit.
//
// Data parallel (docs/distributed.md): under mpirun or srun every rank runs train() with its own
// share of each batch; the loss is normalised by the real targets of all ranks together, gradients
// are all-reduced (or reduce-scattered for ZeRO-1, optimizer.shard_state), and rank 0 writes the
// run directory (a shared filesystem for several machines), checkpoints and logs.
//
// A run directory holds:
//   config.toml          the resolved experiment (every default filled in)
//   run.json             plugin files and versions, device, threads, parameter count
//   metrics.jsonl        one object per logged step (and one per evaluation, with val_loss)
//   summary.json         the run's outcome: final losses, throughput, MFU, wall time, status
//   checkpoints/step_NNNNNNNN/{model.safetensors, optimizer.safetensors, state.json, config.toml}
//   checkpoints/latest   the name of the newest complete checkpoint
#pragma once

#include <cstdint>
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/data.hpp"
#include "ablate/metrics.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/optimizer.hpp"

namespace ablate {

class Config;
class Registry;

struct TrainOptions {
  std::filesystem::path run_dir;  // created when missing
  bool resume = false;            // continue from run_dir's latest checkpoint
  int64_t stop_at = 0;            // > 0: checkpoint and stop after this step, as an interruption would
  // Set (by a signal handler: `ablate train` sets it on SIGUSR1, a scheduler's warning before it
  // preempts the job) to checkpoint after the step under way and stop, as --stop-at does; every
  // rank stops after the same step. Null: never.
  const std::atomic<bool>* preempt = nullptr;
  // Called after every logged step (after the console line); may be empty.
  std::function<void(const StepMetrics&)> on_step;
};

struct TrainResult {
  int64_t steps = 0;           // optimizer steps done (in total, including before a resume)
  bool preempted = false;      // stopped by TrainOptions::preempt (a checkpoint at `steps`)
  double final_loss = 0;       // loss of the last step
  double val_loss = -1;        // last evaluation (-1 when none)
  std::vector<double> losses;  // the loss of every step this process ran
  std::filesystem::path run_dir;
};

// Reads `config` once into a RunSpec and trains the run its Session builds (data pipelines, model,
// optimizer, schedule, communicator, loggers; the engine and checkpoints on top).
TrainResult train(const Config& config, Registry& registry, const TrainOptions& options);

// The CPU threads the model's work uses from now on (0 = every core); returns the number.
int use_cpu_threads(int threads);
// Refuses (input error naming batching.batch_size) sizes whose `in_flight` host batches alone
// exceed the memory budget, before any batch is allocated; `why` says what is in flight.
void require_batch_memory(const RunSpec& spec, int64_t in_flight, const std::string& why);

}  // namespace ablate
