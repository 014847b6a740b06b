// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// Checkpoints of a run directory (implemented in core/src/checkpointer.cpp): what one records
// (state.json), finding the one to resume or load, writing one for imported weights, and the model
// restored from one for evaluation, sampling and export. The layout is trainer.hpp's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/data.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/run_spec.hpp"

namespace ablate {

class Config;

class Registry;

struct CheckpointState {
  int64_t step = 0;
  // The training loss of that step and the validation loss when it was evaluated (NaN when the
  // checkpoint does not record them): what a resume at the last step reports in summary.json.
  double loss = std::numeric_limits<double>::quiet_NaN();
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  DataCursor cursor;
  uint64_t seed = 0;
  std::string config_hash;
  std::string model;  // ModelOptions::describe()
  int64_t parameters = 0;
  int64_t vocab_size = 0;  // the model's real vocabulary (the data's, when [model] left it 0)
  std::string optimizer;   // the optimizer's name
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
// at its start) with the experiment `spec`, for weights that come from elsewhere (`ablate import
// hf`): eval, sample, export and [model] init_from read it. `provenance` goes into state.json as
// "imported_from".
void write_initial_checkpoint(const std::filesystem::path& run_dir, const RunSpec& spec, Model& model,
                              const nlohmann::json& provenance);
// `[model] init_from`: the parameters of an ablate run or checkpoint directory, or of a Hugging
// Face checkpoint directory, into `model` (whose [model] must be theirs: an input error naming the
// key or tensor otherwise).
void init_from_weights(Model& model, const std::filesystem::path& from);

// A model restored from a checkpoint for evaluation, sampling or export.
struct LoadedModel {
  std::unique_ptr<Config> config;
  std::unique_ptr<RunSpec> spec;  // read from `config` once
  std::unique_ptr<Model> model;
  CheckpointState state;
  std::filesystem::path dir;
};
// Parameters holding a NaN or an infinity are an input error naming the tensor and index unless
// `allow_nonfinite` (eval/sample --allow-nonfinite, for looking at a diverged run), which warns.
// `overrides` (--set) apply to the checkpoint's config as to an experiment file's.
LoadedModel load_model(const std::filesystem::path& path, Registry& registry, bool allow_nonfinite = false,
                       const std::vector<std::string>& overrides = {});

}  // namespace ablate
