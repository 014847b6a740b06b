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
#include "ablate/model.hpp"
#include "ablate/optimizer.hpp"

namespace ablate {

class Config;
class Registry;

struct TrainOptions {
  std::filesystem::path run_dir;   // created when missing
  bool resume = false;             // continue from run_dir's latest checkpoint
  int64_t stop_at = 0;             // > 0: checkpoint and stop after this step, as an interruption would
  // Called after every logged step (after the console line); may be empty.
  std::function<void(const StepMetrics&)> on_step;
};

struct TrainResult {
  int64_t steps = 0;            // optimizer steps done (in total, including before a resume)
  double final_loss = 0;        // loss of the last step
  double val_loss = -1;         // last evaluation (-1 when none)
  std::vector<double> losses;   // the loss of every step this process ran
  std::filesystem::path run_dir;
};

TrainResult train(const Config& config, Registry& registry, const TrainOptions& options);

// [run] communicator with "auto" resolved: mpi (cpu) or nccl (cuda) when the launcher's environment
// (OMPI_COMM_WORLD_SIZE, or SLURM_NTASKS under srun) says the job has several ranks, else single.
// An explicit "single" in a job of several ranks is an input error: every rank would train alone
// into the same run directory.
std::string resolve_communicator(const Config& config);

// The run facts of [run] (seed, device, threads: 0 = all cores), with the CPU thread count applied
// to OpenMP. A device this build cannot train on is an input error naming run.device.
RunContext training_context(const Config& config);
// The CPU threads the model's work uses from now on (0 = every core); returns the number.
int use_cpu_threads(int threads);
// The memory the run may use: [run] memory_budget_gib, else the machine's physical memory.
int64_t memory_budget_bytes(const Config& config);
// Refuses (input error naming batching.batch_size) sizes whose `in_flight` host batches alone
// exceed the memory budget, before any batch is allocated; `why` says what is in flight.
void require_batch_memory(const Config& config, int64_t in_flight, const std::string& why);

// ---- checkpoints ----

struct CheckpointState {
  int64_t step = 0;
  // The training loss of that step and the validation loss when it was evaluated (NaN when the
  // checkpoint does not record them): what a resume at the last step reports in summary.json.
  double loss = std::numeric_limits<double>::quiet_NaN();
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  DataCursor cursor;
  uint64_t seed = 0;
  std::string config_hash;
  std::string model;          // ModelOptions::describe()
  int64_t parameters = 0;
  int64_t vocab_size = 0;     // the model's real vocabulary (the data's, when [model] left it 0)
  std::string optimizer;      // the optimizer's name
  // Data parallel: the job's world size, one data cursor per rank (cursor == cursors[0]), and
  // with optimizer.shard_state the optimizer state as one file per rank (else one file).
  int world = 1;
  std::vector<DataCursor> cursors;
  bool shard_state = false;
  std::vector<std::string> optimizer_files;
};

// `path` is a checkpoint directory or a run directory (its latest checkpoint; without
// checkpoints/latest, as a run killed between saving a checkpoint and naming it leaves it, the
// newest complete one). Input error (exit 2) when there is none or `latest` names an incomplete one.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);
// The run directory's complete checkpoint (checkpoints/step_N holding state.json) of the highest
// step, if any.
std::optional<std::filesystem::path> newest_complete_checkpoint(const std::filesystem::path& run_dir);
// Whether the run directory has something to resume from: checkpoints/latest or a complete
// checkpoint. Training over such a directory without --resume is refused.
bool has_checkpoint(const std::filesystem::path& run_dir);
CheckpointState read_checkpoint_state(const std::filesystem::path& checkpoint_dir);
// Writes `model`'s weights as the run directory's checkpoint of step 0 (no optimizer state, data
// at its start) with the experiment `config`, for weights that come from elsewhere (`ablate import
// hf`): eval, sample, export and [model] init_from read it. `provenance` goes into state.json as
// "imported_from".
void write_initial_checkpoint(const std::filesystem::path& run_dir, const Config& config, Model& model,
                              const nlohmann::json& provenance);
// `[model] init_from`: the parameters of an ablate run or checkpoint directory, or of a Hugging
// Face checkpoint directory, into `model` (whose [model] must be theirs: an input error naming the
// key or tensor otherwise).
void init_from_weights(Model& model, const std::filesystem::path& from);

// A model restored from a checkpoint for evaluation, sampling or export.
struct LoadedModel {
  std::unique_ptr<Config> config;
  std::unique_ptr<Model> model;
  CheckpointState state;
  std::filesystem::path dir;
};
// Parameters holding a NaN or an infinity are an input error naming the tensor and index unless
// `allow_nonfinite` (eval/sample --allow-nonfinite, for looking at a diverged run), which warns.
LoadedModel load_model(const std::filesystem::path& path, Registry& registry, bool allow_nonfinite = false);

}  // namespace ablate
