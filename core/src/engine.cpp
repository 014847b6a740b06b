// The engine: one optimizer step (see engine.hpp).
#include "ablate/runtime/engine.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "ablate/runtime/run_spec.hpp"
#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/mix.hpp"

namespace ablate {

namespace {

using Clock = std::chrono::steady_clock;

// The shard's part of a flat f32 buffer.
TensorView slice(TensorView v, Shard shard) { return flat_view(v.as<float>() + shard.offset, DType::f32, shard.count, v.device); }

TensorView host_f64(double* data, int64_t n) { return flat_view(data, DType::f64, n); }

// run.cuda_graph's conditions: a step that can be recorded once and replayed as it is (exit 2 with
// the key that stands in the way otherwise).
void require_capturable(Model& model, const Optimizer& optimizer, const Communicator& comm, const RunSpec& spec) {
  const auto refuse = [](const std::string& key, const std::string& why) {
    throw_input_error(key, "run.cuda_graph = true needs " + why);
  };
  const Device& device = model.device();
  if (!device.capabilities().step_capture) {
    refuse("run.device", "a device whose queue can be captured (cuda); " + device.describe() + " has none");
  }
  if (comm.world() > 1 || comm.moves_data()) {
    refuse("run.communicator", "one rank and a communicator that moves no data (single): collectives are not captured");
  }
  if (spec.shard_state) refuse("optimizer.shard_state", "the optimizer's state unsharded (the step then reads its norm on the host)");
  if (!optimizer.capturable() || !optimizer.reads_device_scale()) {
    refuse("optimizer.name", "an optimizer that can be captured (adamw_fused): '" + spec.optimizer.name + "' cannot");
  }
  if (spec.run.grad_accum_steps != 1) refuse("run.grad_accum_steps", "one micro-batch a step (run.grad_accum_steps = 1)");
  if (model.draws_random()) {
    refuse("model.dropout", "no dropout (model.dropout and an adapter's dropout 0): a replayed step would draw one step's masks");
  }
  if (spec.run.dtype.rfind("fp8", 0) == 0 && spec.run.fp8_scaling == "delayed") {
    refuse("run.fp8_scaling", "current FP8 scaling: delayed scaling reads its saturation counts on the host each step");
  }
}

}  // namespace

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

Engine::Engine(Model& model, Optimizer& optimizer, Communicator& comm, const RunSpec& spec)
    : model_(model), optimizer_(optimizer), comm_(comm), spec_(spec) {
  // What trains: every parameter, or with an adapter the adapters alone (the base has no gradient).
  const int64_t n = model.num_trainable();
  shard_ = spec_.shard_state ? shard_of(n, comm.world(), comm.rank()) : Shard{0, n};
  opt_table_ = spec_.shard_state ? shard_table(model.trainable_table(), shard_) : model.trainable_table();
  optimizer_.init(opt_table_, model.device().type());
  comm_.set_stream(model.device().stream());
  scalars_ = model.device().alloc(DType::f64, 2);
  factor_ = model.device().alloc(DType::f32, 1);
  if (comm.moves_data() && spec_.run.bucket_mb > 0) {
    const int64_t elements = std::max<int64_t>(1, int64_t(spec_.run.bucket_mb * 1e6 / double(sizeof(float))));
    buckets_ = plan_buckets(n, model.gradient_writes(), elements);
  }
  if (spec_.run.cuda_graph) require_capturable(model, optimizer, comm, spec_);
}

void Engine::forget_captured_step() noexcept {
  graph_.reset();
  has_last_ = false;
}

// How this step is issued: call by call (a profiled step, which waits around each op; a layout
// that differs from the step before's, whose plugins may allocate or plan anew), captured (the
// second step in a row with one layout) or replayed (the captured step's layout again).
Engine::Issue Engine::issue_for(const Batch& batch, int64_t real_targets) {
  if (!spec_.run.cuda_graph) return Issue::calls;
  if (op_times_ != nullptr) {
    forget_captured_step();
    return Issue::calls;
  }
  BatchLayout now{batch.rows, batch.seq_len, real_targets, {}, batch.row_segments};
  now.segments.reserve(2 * batch.segments.size());
  for (const Segment& g : batch.segments) {
    now.segments.push_back(g.start);
    now.segments.push_back(g.length);
  }
  if (graph_ && now == graph_layout_) return Issue::replay;
  graph_.reset();
  const bool again = has_last_ && now == last_layout_;
  last_layout_ = std::move(now);
  has_last_ = true;
  if (!again) return Issue::calls;
  graph_layout_ = last_layout_;
  return Issue::capture;
}

// A ready bucket across the ranks: all of it (plain data parallel), or each piece of it that lies in
// a rank's shard to that rank (ZeRO-1: the owner alone needs the sum).
void Engine::reduce_bucket(const GradBucket& b) {
  const TensorView grads = model_.grads();
  if (!spec_.shard_state) {
    comm_.all_reduce(slice(grads, Shard{b.begin, b.end - b.begin}), ReduceOp::sum);
    return;
  }
  for (int r = 0; r < comm_.world(); ++r) {
    const Shard s = shard_of(grads.numel(), comm_.world(), r);
    const int64_t lo = std::max(b.begin, s.offset), hi = std::min(b.end, s.offset + s.count);
    if (lo < hi) comm_.reduce(slice(grads, Shard{lo, hi - lo}), ReduceOp::sum, r);
  }
}

void Engine::set_op_times(OpTimes* sink) noexcept {
  op_times_ = sink;
  model_.set_op_times(sink);
}

namespace {

// What the phases of one engine step share: the engine's parts, the profile sink and the outcome
// being filled (its seconds in collectives among them).
struct StepContext {
  Model& model;
  Communicator& comm;
  const RunSpec& spec;
  Shard shard;
  OpTimes* op_times;
  Device& device;
  TensorView scalars;  // this rank's loss sum and squared gradient norm: two f64 on the device
  StepOutcome out;
  double sums[2] = {0, 0};  // the two read to the host (the job's, once summed across ranks)
  bool read = false;        // whether they have been

  TensorView loss_sum() const { return flat_view(scalars.data, DType::f64, 1, scalars.device); }
  TensorView squared_norm() const { return flat_view(static_cast<double*>(scalars.data) + 1, DType::f64, 1, scalars.device); }
  // Both to the host in one copy: where the device is still working, this waits for it.
  void read_sums() {
    device.download(sums, scalars);
    read = true;
  }

  // A collective, its seconds added to the step's communication time (and the profile's "collectives").
  template <class F>
  void timed(F&& collective) {
    if (op_times != nullptr) device.synchronize();
    const auto c0 = Clock::now();
    collective();
    const double s = std::chrono::duration<double>(Clock::now() - c0).count();
    out.comm_s += s;
    if (op_times != nullptr) op_times->add("collectives", s);
  }
  // An engine op timed when profiling (the device synchronised on both sides).
  template <class F>
  void profiled(const char* op, F&& f) {
    if (op_times == nullptr) return f();
    device.synchronize();
    const auto c0 = Clock::now();
    f();
    device.synchronize();
    op_times->add(op, std::chrono::duration<double>(Clock::now() - c0).count());
  }
};

// 1. The loss is the mean over every real target of the global batch: the count comes first.
void count_targets(StepContext& c, std::span<const Batch> micro) {
  double counts[2] = {0, 0};  // real targets, positions: this rank's, then the job's
  for (const Batch& b : micro) {
    counts[0] += double(b.real_targets());
    counts[1] += double(b.positions_total());
  }
  c.timed([&] { c.comm.all_reduce_host(host_f64(counts, 2), ReduceOp::sum); });
  c.out.real_targets = int64_t(counts[0]);
  c.out.positions = int64_t(counts[1]);
}

// 2. Forward and backward of each micro-batch, each of `buckets` reduced by `reduce_bucket` as the
// last one's backward pass finishes it; this rank's loss sum is left in c.loss_sum on the device.
template <class ReduceBucket>
void forward_backward(StepContext& c, std::span<const Batch> micro, int64_t step, const std::vector<GradBucket>& buckets,
                      ReduceBucket&& reduce_bucket) {
  c.profiled("zero gradients", [&] { c.model.zero_grads(); });
  const double scale = c.out.real_targets > 0 ? 1.0 / double(c.out.real_targets) : 0.0;
  const uint64_t first_key = uint64_t(c.comm.rank()) * uint64_t(micro.size());
  // With buckets, the last micro-batch's backward pass reduces each bucket once it is ready.
  std::size_t next_bucket = 0;
  auto reduce_ready = [&](std::size_t write) {
    while (next_bucket < buckets.size() && buckets[next_bucket].ready_after <= write) {
      c.timed([&] { reduce_bucket(buckets[next_bucket]); });
      ++next_bucket;
    }
  };
  struct HookGuard {  // the hook never outlives this step, whatever throws
    Model& m;
    ~HookGuard() { m.set_gradient_hook({}); }
  } guard{c.model};
  for (std::size_t m = 0; m < micro.size(); ++m) {
    const uint64_t key = mix64(c.spec.run.seed, uint64_t(step) * 4096 + first_key + m);
    if (!buckets.empty() && m + 1 == micro.size()) c.model.set_gradient_hook(reduce_ready);
    c.model.forward_backward(micro[m], scale, key, c.loss_sum(), m > 0);
  }
  c.model.set_gradient_hook({});
  reduce_ready(std::numeric_limits<std::size_t>::max());  // any bucket no write reached (none, by the plan)
}

// 3-4. Gradient reduction (what the buckets have not `reduced`) and the global norm, left on the
// device where one rank has all of both (`on_device`); else read to the host and, across ranks,
// summed there: c.sums holds the job's loss sum and squared norm.
void reduce_gradients(StepContext& c, bool reduced, bool on_device) {
  // join() is where a device communicator's collectives, issued without waiting, are waited for:
  // the time there is what was not hidden. The device finishes the backward pass first, outside
  // the timing (the norm below waits for it anyway), so the collectives' time is communication
  // alone, not the compute queued before it.
  if (c.comm.moves_data()) c.device.synchronize();
  if (c.spec.shard_state) {
    if (!reduced) c.timed([&] { c.comm.reduce_scatter(c.model.grads(), ReduceOp::sum); });
    c.timed([&] { c.comm.join(); });
    c.profiled("gradient norm", [&] { c.device.squared_norm_to(slice(c.model.grads(), c.shard), c.squared_norm()); });
    c.read_sums();
    c.timed([&] { c.comm.all_reduce_host(host_f64(c.sums, 2), ReduceOp::sum); });
    return;
  }
  if (c.comm.world() > 1 || reduced) {
    c.timed([&] {
      if (c.comm.world() > 1) {
        c.device.download(&c.sums[0], c.loss_sum());
        c.comm.all_reduce_host(host_f64(c.sums, 1), ReduceOp::sum);
      }
      if (!reduced) c.comm.all_reduce(c.model.grads(), ReduceOp::sum);
      c.comm.join();
    });
  }
  c.profiled("gradient norm", [&] { c.device.squared_norm_to(c.model.grads(), c.squared_norm()); });
  if (on_device) return;
  if (c.comm.world() == 1) {
    c.read_sums();
  } else {  // the loss sum is the job's, summed above: the norm alone
    c.device.download(&c.sums[1], c.squared_norm());
    c.read = true;
  }
}

// The step's loss and gradient norm from the sums read to the host; a loss that is not finite
// ends the run.
void take_sums(StepContext& c, int64_t step) {
  c.out.loss = c.out.real_targets > 0 ? c.sums[0] / double(c.out.real_targets) : 0.0;
  c.out.grad_norm = std::sqrt(c.sums[1]);
  if (!std::isfinite(c.out.loss)) {
    throw_runtime_error("train", "loss is " + std::to_string(c.out.loss) + " at step " + std::to_string(step) +
                                     "; lower optimizer.lr or enable optimizer.grad_clip");
  }
}

// 5. The clipping factor, then the optimizer on this rank's part of `table` and everyone's parts to
// everyone. Norm clipping is a factor the optimizer applies as it reads each gradient (no pass of
// its own): formed on the device where the norm stayed there (the optimizer reads it there), else
// on the host from the norm read (the loss then checked first).
void update_params(StepContext& c, Optimizer& optimizer, const ParamTable& table, int64_t step, double lr, TensorView factor) {
  StepArgs args{lr, step, 1.0f, c.device.stream()};
  if (c.read) {
    take_sums(c, step);
    args.grad_scale = device_math::clip_factor(c.out.grad_norm, c.spec.grad_clip);
  } else {
    c.device.clip_factor_to(c.squared_norm(), c.spec.grad_clip, factor);
    args.grad_scale_device = factor.as<const float>();
  }

  // Where the products read a bf16 copy of the weights, an optimizer that can writes it in its own
  // pass; under ZeRO-1 the copy is made after the all-gather (the step sees only this rank's shard).
  const TensorView copy = c.model.params_bf16();
  const bool all_train = c.model.frozen_params() == 0;  // the copy's offsets are the whole table's
  if (copy.data != nullptr && !c.spec.shard_state && all_train && optimizer.writes_bf16()) args.params_bf16 = copy.data;

  c.profiled("optimizer",
             [&] { optimizer.step(table, slice(c.model.trainable_params(), c.shard), slice(c.model.grads(), c.shard), args); });
  if (c.spec.shard_state) {
    c.timed([&] {
      c.comm.all_gather(c.model.trainable_params());
      c.comm.join();
    });
  }
  c.model.params_changed(args.params_bf16 != nullptr);  // the bf16 weight copy (where the optimizer wrote none), the layers' caches
}

// 6. The layers' scaling state (FP8 delayed scaling) steps on: each site's amax of this step, the
// max across the ranks (every rank then holds the same scales), pushed into its history. True when
// there was one (its report was read from the device).
bool end_step(StepContext& c) {
  const TensorView state = c.model.scaling_state();
  if (state.data == nullptr) return false;
  if (c.comm.world() > 1) {
    c.timed([&] {
      c.comm.all_reduce(state, ReduceOp::max);
      c.comm.join();
    });
  }
  c.profiled("scaling state", [&] { c.model.end_step(); });
  const ScalingReport r = c.model.scaling_report();
  c.out.fp8_saturated = r.saturated;
  c.out.fp8_saturated_worst = r.worst;
  return true;
}

}  // namespace

StepOutcome Engine::step(std::span<const Batch> micro, int64_t step, double lr) {
  const auto t0 = Clock::now();
  StepContext c{model_, comm_, spec_, shard_, op_times_, model_.device(), scalars_.view(), {}};
  // One rank with an optimizer that reads the clip factor on the device: the step enqueues its
  // work and reads its loss and norm once, at its end.
  const bool on_device = comm_.world() == 1 && !spec_.shard_state && optimizer_.reads_device_scale();
  count_targets(c, micro);
  const Issue issue = micro.size() == 1 ? issue_for(micro[0], c.out.real_targets) : Issue::calls;
  bool scaling_read = false;
  if (issue != Issue::calls) model_.upload_batch(micro[0], issue == Issue::capture);  // outside the graph: host memory
  if (issue == Issue::replay) {
    StepArgs args{lr, step, 1.0f, c.device.stream()};
    args.grad_scale_device = factor_.view().as<const float>();
    optimizer_.restage(args);
    graph_->replay();
    model_.params_changed(true);  // the host's record of it (the replay wrote any bf16 copy)
    ++replayed_;
  } else {
    if (issue == Issue::capture) c.device.begin_capture();
    try {
      forward_backward(c, micro, step, buckets_, [this](const GradBucket& b) { reduce_bucket(b); });
      reduce_gradients(c, !buckets_.empty(), on_device);
      update_params(c, optimizer_, opt_table_, step, lr, factor_.view());
      scaling_read = end_step(c);
    } catch (...) {
      if (issue == Issue::capture) c.device.abort_capture();
      throw;
    }
    if (issue == Issue::capture) {
      graph_ = c.device.end_capture();  // nothing has run yet: the graph's first launch is this step
      graph_->replay();
      ++captured_;
    }
  }
  if (!c.read) {
    // Where nothing waited for the device so far, the host's issuing of the step. (A communicator
    // that moves data synchronises before its collectives; a second micro-batch's copy from the
    // host's pageable memory may wait for the first one's work.)
    const bool waited = scaling_read || micro.size() != 1 || c.op_times != nullptr || c.comm.moves_data();
    if (!waited && c.device.stream() != nullptr) c.out.issue_s = std::chrono::duration<double>(Clock::now() - t0).count();
    c.read_sums();
    take_sums(c, step);
  }
  return c.out;
}

}  // namespace ablate
