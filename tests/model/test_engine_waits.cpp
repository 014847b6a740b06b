// Where the engine's step waits for the device. On one rank, with an optimizer that reads the clip
// factor on the device (Optimizer::reads_device_scale), the loss sum, the gradient norm and the
// clip factor stay on the device (Device::masked_loss_sum_to, squared_norm_to, clip_factor_to) and
// the step reads nothing back until all of it is enqueued: one read, at its end. Counted here on
// a device that wraps the cpu device and counts every call that brings a value to the host or
// waits (download, squared_norm, masked_loss_sum, synchronize). Both ways (the factor on the
// device, or on the host from the norm read after the backward pass) train to the same bits, with
// clipping binding at every step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ablate/communicator.hpp"
#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/engine.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/registry.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

// The cpu device, with a count of the calls that return a value to the host or wait for the device.
class CountingDevice final : public Device {
 public:
  explicit CountingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  int64_t waits = 0;

  DeviceType type() const noexcept override { return inner_->type(); }
  DeviceCapabilities capabilities() const override { return inner_->capabilities(); }
  std::string describe() const override { return inner_->describe(); }
  Buffer alloc(DType dtype, int64_t count) override { return inner_->alloc(dtype, count); }
  void release(void* data) noexcept override { inner_->release(data); }
  int64_t memory_in_use() const override { return inner_->memory_in_use(); }
  int64_t memory_peak() const override { return inner_->memory_peak(); }
  int64_t memory_capacity() const override { return inner_->memory_capacity(); }
  void upload(TensorView dst, const void* host) override { inner_->upload(dst, host); }
  void download(void* host, TensorView src) override {
    ++waits;
    inner_->download(host, src);
  }
  void upload_batch(const Batch& batch, DeviceBatch& out) override { inner_->upload_batch(batch, out); }
  void fill(TensorView x, float value) override { inner_->fill(x, value); }
  double squared_norm(TensorView x) override {
    ++waits;
    return inner_->squared_norm(x);
  }
  void scale(TensorView x, float factor) override { inner_->scale(x, factor); }
  double masked_loss_sum(TensorView losses, TensorView targets) override {
    ++waits;
    return inner_->masked_loss_sum(losses, targets);
  }
  // The device's own reductions (the cpu device's are its host ones: the inner device's calls,
  // not counted, as a GPU's kernels would not be).
  void masked_loss_sum_to(TensorView losses, TensorView targets, TensorView out, bool add) override {
    inner_->masked_loss_sum_to(losses, targets, out, add);
  }
  void squared_norm_to(TensorView x, TensorView out) override { inner_->squared_norm_to(x, out); }
  void clip_factor_to(TensorView squared_norm, double clip, TensorView factor) override {
    inner_->clip_factor_to(squared_norm, clip, factor);
  }
  void to_bf16(TensorView dst, TensorView src) override { inner_->to_bf16(dst, src); }
  void dequantize_nf4(TensorView dst, TensorView codes, TensorView absmax) override { inner_->dequantize_nf4(dst, codes, absmax); }
  void copy(TensorView dst, TensorView src) override { inner_->copy(dst, src); }
  void synchronize() override {
    ++waits;
    inner_->synchronize();
  }
  double peak_tflops(DType dtype) const override { return inner_->peak_tflops(dtype); }

 private:
  std::unique_ptr<Device> inner_;
};

// Plain SGD, p -= lr * g * factor, with the factor from the host (grad_scale) or, when `on_device`,
// read where the engine formed it (grad_scale_device); it notes the device's waits when it runs.
class Sgd final : public Optimizer {
 public:
  Sgd(bool on_device, const CountingDevice& device) : on_device_(on_device), device_(device) {}
  int64_t waits_at_step = -1;
  float factor = 0;

  void init(const ParamTable&, DeviceType) override {}
  void step(const ParamTable&, TensorView params, TensorView grads, const StepArgs& args) override {
    waits_at_step = device_.waits;
    CHECK((args.grad_scale_device != nullptr) == on_device_);
    factor = on_device_ ? *args.grad_scale_device : args.grad_scale;
    float* p = params.as<float>();
    const float* g = grads.as<const float>();
    for (int64_t i = 0; i < params.numel(); ++i) p[i] -= float(args.lr) * (g[i] * factor);
  }
  bool reads_device_scale() const override { return on_device_; }
  int64_t state_bytes() const override { return 0; }
  std::vector<NamedTensor> save_state() const override { return {}; }
  void load_state(const std::vector<NamedTensor>&) override {}

 private:
  bool on_device_;
  const CountingDevice& device_;
};

Batch batch(std::mt19937_64& rng) {
  Batch b;
  b.reset(2, 12);
  std::uniform_int_distribution<int32_t> tok(0, 22);
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 12; ++t) {
      b.tokens[r * 12 + t] = tok(rng);
      b.targets[r * 12 + t] = t == 3 ? -1 : tok(rng);  // one position without a target a row
      b.positions[r * 12 + t] = t;
      b.segment_ids[r * 12 + t] = 1;
    }
    b.segments.push_back({0, 12});
    b.row_segments[std::size_t(r + 1)] = int32_t(b.segments.size());
  }
  return b;
}

struct Trained {
  std::vector<float> params;
  std::vector<StepOutcome> steps;
  std::vector<int64_t> waits_before_optimizer, waits_in_step;
  std::vector<float> factors;
};

Trained train(bool on_device) {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  RunContext run;
  run.threads = 2;
  const Params none("run", {});
  auto inner = std::unique_ptr<Device>(static_cast<Device*>(cpu_device_info().factory({none, none, run}).release()));
  auto counting = std::make_unique<CountingDevice>(std::move(inner));
  CountingDevice& device = *counting;
  ModelOptions o;
  o.d_model = 16;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 4;
  o.head_dim = 4;
  o.vocab_size = o.vocab_padded = 23;
  o.max_seq_len = 16;
  o.mlp_hidden = 32;
  Model model(o, registry, run, std::move(counting));
  model.init_params(11);
  Sgd sgd(on_device, device);
  auto comm = registry.create<Communicator>(Kind::communicator, "single", {Params("run", {}), Params("run.single", {}), run},
                                            "run.communicator");
  RunSpec spec;
  spec.grad_clip = 0.05;  // below every step's norm: the factor is always < 1
  Engine engine(model, sgd, *comm, spec);
  std::mt19937_64 rng(3);
  const Batch micro[2] = {batch(rng), batch(rng)};  // two micro-batches: the loss sum accumulates
  Trained t;
  for (int step = 1; step <= 4; ++step) {
    device.waits = 0;
    t.steps.push_back(engine.step(std::span<const Batch>(micro, 2), step, 0.5));
    t.waits_before_optimizer.push_back(sgd.waits_at_step);
    t.waits_in_step.push_back(device.waits);
    t.factors.push_back(sgd.factor);
  }
  model.copy_params_to_host(t.params);
  return t;
}

}  // namespace

TEST_CASE("one rank whose optimizer reads the clip factor on the device: the step reads nothing back until its end, and trains "
          "to the host path's bits") {
  const Trained device = train(true), host = train(false);
  for (std::size_t i = 0; i < device.steps.size(); ++i) {
    INFO("step " << i + 1);
    // Nothing came back before the optimizer was enqueued; the step's one read is the loss sum and
    // the norm together, at its end.
    CHECK(device.waits_before_optimizer[i] == 0);
    CHECK(device.waits_in_step[i] == 1);
    // The host path reads the two after the backward pass, before the optimizer (and the loss sum
    // never per micro-batch).
    CHECK(host.waits_before_optimizer[i] == 1);
    CHECK(host.waits_in_step[i] == 1);
    CHECK(std::isfinite(device.steps[i].loss));
    CHECK(device.steps[i].loss == host.steps[i].loss);
    CHECK(device.steps[i].grad_norm == host.steps[i].grad_norm);
    CHECK(device.steps[i].grad_norm > 0.05);  // clipping binds
    CHECK(device.factors[i] == host.factors[i]);
    CHECK(device.factors[i] == device_math::clip_factor(host.steps[i].grad_norm, 0.05));
    CHECK(device.factors[i] < 1.0f);
  }
  REQUIRE(device.params.size() == host.params.size());
  CHECK(std::memcmp(device.params.data(), host.params.data(), device.params.size() * sizeof(float)) == 0);
}
