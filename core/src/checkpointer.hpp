// The trainer's checkpoints: one directory per saved step, written by every rank together and
// moved into place by rank 0, and the resume that reads one back (see trainer.hpp for the layout).
//   checkpoints/step_NNNNNNNN/{model.safetensors, optimizer[.rank_R-of-W].safetensors, state.json,
//                              config.toml}
//   checkpoints/latest   the name of the newest complete checkpoint
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "ablate/communicator.hpp"
#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/safetensors.hpp"
#include "ablate/runtime/trainer.hpp"

namespace ablate {

struct RunSpec;

// A JSON file of the run directory, written atomically (safetensors.hpp's write_file_atomic).
void write_json_file(const std::filesystem::path& path, const nlohmann::json& value);

// A data cursor as state.json holds it: {"draw": N, "pending": [...]}, each pending entry a piece
// [document, begin, end] or a run [document, begin, end, length] of consecutive pieces of one
// document cut at `length` tokens (the last one possibly shorter). Positions only, never tokens.
nlohmann::json cursor_json(const DataCursor& cursor);
// The cursor read back; `name` ("data_cursor") and `file` name what is wrong in an input error.
DataCursor cursor_from(const nlohmann::json& j, const std::string& name, const std::filesystem::path& file);

class Checkpointer {
 public:
  // Where it writes and the optimizer's name; the rest it reads from the RunSpec: [checkpoint] keep,
  // [optimizer] shard_state (ZeRO-1: one optimizer file per rank), run.seed and run.steps (a
  // checkpoint past it is refused by resume).
  struct Setup {
    std::filesystem::path run_dir;
    std::string optimizer;
  };
  Checkpointer(const Setup& setup, const RunSpec& spec, Communicator& comm);

  // Every rank takes part: each writes its data cursor (and its optimizer shard), rank 0 the
  // model, config and state, then moves the finished directory into place and updates `latest`.
  // `loss` is the step's training loss, `val_loss` its validation loss (NaN: not evaluated).
  void save(int64_t step, Model& model, const Optimizer& optimizer, const DataPipeline& data, double loss, double val_loss);
  // Restores the model, this rank's optimizer state and data cursor from the run directory's
  // latest checkpoint; returns its state (step, losses). A checkpoint of another world size has its
  // ranks' data cursors merged and dealt to this job's ranks (reshard.hpp), and its optimizer state
  // (or one of another optimizer.shard_state) re-cut for this job's shards when the state is one
  // value per parameter. A checkpoint of another model or optimizer, or one that cannot be dealt or
  // re-cut, is an input error naming the file, before anything is changed.
  CheckpointState resume(Model& model, Optimizer& optimizer, DataPipeline& data);

 private:
  void load_optimizer_state(Optimizer& optimizer, const CheckpointState& st, const SafetensorsFile& of,
                            const std::filesystem::path& state_file) const;
  SafetensorsFile read_optimizer_file(const std::filesystem::path& file) const;
  std::vector<NamedTensor> resplit_optimizer_state(const std::filesystem::path& checkpoint_dir, const CheckpointState& st,
                                                   int64_t trainable, const std::filesystem::path& state_file) const;
  std::string optimizer_file(int rank) const;
  void remove_old_checkpoints(int64_t written) const;
  Setup s_;
  const RunSpec& spec_;
  Communicator& comm_;
  std::filesystem::path root_;  // run_dir / "checkpoints"
};

}  // namespace ablate
