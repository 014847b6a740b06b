// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The engine: one optimizer step over the micro-batches of a global batch, the same on every device
// and at every world size. Used by the trainer, `ablate tune` and the benchmarks.
//
//   1. the job's real targets and positions (all-reduced host scalars): the loss is the mean over
//      every real target of the global batch, so each micro-batch's gradient is scaled by
//      1 / (the job's real targets);
//   2. forward and backward of each micro-batch, accumulating into the gradient buffer;
//   3. the gradient all-reduced (plain data parallel) or reduce-scattered (ZeRO-1: each rank keeps
//      its shard), with the loss sum (and under ZeRO-1 the shard's squared norm) as host scalars
//      summed across the ranks.
//      With [run] bucket_mb > 0 and a communicator that moves data (any but `single`, even with
//      one rank), the last micro-batch's backward pass reduces
//      each gradient bucket (buckets.hpp) as soon as its last write is done: all_reduce, or under
//      ZeRO-1 a reduce of each of its shard pieces to the piece's owner;
//   4. the global gradient norm, and clipping to optimizer.grad_clip;
//   5. the optimizer on this rank's part of the parameters, then (ZeRO-1) their all-gather.
//
// The loss sum and the squared norm are reductions on the device (Device::masked_loss_sum_to,
// squared_norm_to). On one rank, with an optimizer that reads the clip factor on the device
// (Optimizer::reads_device_scale), the factor is formed there too (Device::clip_factor_to) and
// nothing is read back until the step has been enqueued whole: the host never waits inside the
// step, and the loss is checked for being finite at its end. Otherwise the two are read to the
// host after the backward pass (the collectives need them there) and the loss is checked before
// the optimizer runs.
//
// Dropout keys are mix64(seed, step * 4096 + rank * accum + micro): the keys one process of a
// world of one uses for the same micro-batches, so data parallel and accumulation agree.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ablate/batch.hpp"
#include "ablate/communicator.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/optimizer.hpp"

namespace ablate {


struct StepOutcome {
  double loss = 0;           // mean over the job's real targets
  double grad_norm = 0;      // global, before clipping
  int64_t real_targets = 0;  // the job's (all ranks)
  int64_t positions = 0;     // the job's B*T positions
  double comm_s = 0;         // seconds in collectives, waiting for other ranks included
  // FP8 delayed scaling: values the step's products saturated at, in all and in the worst tensor
  // (on several ranks the most any rank saw); -1 where the run has no scaling state.
  int64_t fp8_saturated = -1, fp8_saturated_worst = -1;
  // Seconds the host took to issue the step, from its start to the read of its loss and norm at its
  // end, where nothing before that read waited for the device (one rank, one micro-batch, an
  // optimizer that reads the clip factor on the device, a communicator that moves no data, no FP8
  // scaling state, no op profile) and the device runs its work from a queue (Device::stream): the
  // part of the step the device cannot run ahead of (all of it: a launch-bound step). -1 where the
  // step waited inside or the device has no queue.
  double issue_s = -1;
};

// The part of `table` inside `shard`, offsets relative to the shard's start: what a rank's
// optimizer sees under ZeRO-1. A slice cut by a shard boundary keeps its name and becomes flat.
ParamTable shard_table(const ParamTable& table, Shard shard);

class Engine {
 public:
  // Initialises `optimizer` on this rank's part of the parameters (all of them without ZeRO-1).
  // What it reads of `spec` (kept by value): run.seed (dropout keys), run.bucket_mb (gradient buckets
  // reduced during the backward pass; 0 = off), optimizer grad_clip (0 = off) and shard_state (ZeRO-1).
  Engine(Model& model, Optimizer& optimizer, Communicator& comm, const RunSpec& spec);

  // One optimizer step: `micro` holds this rank's accum micro-batches, `step` counts from 1.
  // A non-finite loss is a runtime error naming the step.
  StepOutcome step(std::span<const Batch> micro, int64_t step, double lr);

  // Per-op timing of the following steps into `sink` (the model's ops and the engine's own), null: off.
  void set_op_times(OpTimes* sink) noexcept;

  // run.cuda_graph: a step whose batch has the layout of the step before (its shape, its documents'
  // places, its count of targets: what the plugins decide launches by) is captured once
  // (Device::begin_capture) and replayed while the layout stays: the batch copied in, the
  // optimizer's values restaged, the graph launched. The steps captured and replayed so far:
  int64_t captured_steps() const noexcept { return captured_; }
  int64_t replayed_steps() const noexcept { return replayed_; }
  // Other work ran on the model's device (an evaluation): it may have moved buffers the captured
  // step names, so the next step is issued call by call again (and captured at the one after).
  void forget_captured_step() noexcept;

  Shard shard() const noexcept { return shard_; }
  const std::vector<GradBucket>& buckets() const noexcept { return buckets_; }
  const ParamTable& optimizer_table() const noexcept { return opt_table_; }

 private:
  void reduce_bucket(const GradBucket& b);

  Model& model_;
  Optimizer& optimizer_;
  Communicator& comm_;
  RunSpec spec_;
  Shard shard_;
  ParamTable opt_table_;
  OpTimes* op_times_ = nullptr;
  std::vector<GradBucket> buckets_;  // empty: one reduction after the backward pass
  Buffer scalars_;                   // the step's loss sum and squared gradient norm (f64) on the model's device
  Buffer factor_;                    // the clip factor (f32) there, for an optimizer that reads it there

  // What a step's plugins decide their launches by, of its batch (one micro-batch).
  struct BatchLayout {
    int32_t rows = 0, seq_len = 0;
    int64_t real_targets = 0;
    std::vector<int32_t> segments;  // start, length of each
    std::vector<int32_t> row_segments;
    bool operator==(const BatchLayout&) const = default;
  };
  enum class Issue { calls, capture, replay };
  Issue issue_for(const Batch& batch, int64_t real_targets);
  std::unique_ptr<CapturedWork> graph_;  // the captured step, for batches of graph_layout_
  BatchLayout graph_layout_, last_layout_;
  bool has_last_ = false;  // last_layout_ is the previous step's
  int64_t captured_ = 0, replayed_ = 0;
};

}  // namespace ablate
