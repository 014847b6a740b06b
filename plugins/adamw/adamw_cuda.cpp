// The `adamw_fused` optimizer: adamw's maths (PyTorch AdamW: decoupled weight decay, bias
// corrections, eps after the bias-corrected sqrt(v)) on a CUDA device, one kernel over the flat
// fp32 parameter buffer per step (adamw_fused_kernel.cu), bit for bit the CPU `adamw`'s results;
// the clip factor (from the host, or read in the kernel where the device formed it) is applied as
// each gradient is read and, under bf16 products, the parameters' bf16 copy is written in the same
// pass.
// State: fp32 moments in device memory, 8 bytes per parameter, saved and loaded under adamw's
// tensor names, so a checkpoint moves between the two.
#include <cmath>
#include <cstring>
#include <vector>

#include "ablate/adamw_keys.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/plugin.hpp"
#include "adamw_fused_kernel.hpp"

namespace {

using ablate::adamw_fused::DecayRun;

constexpr const char* kName = "adamw_fused";

struct Hyper {
  double weight_decay, beta1, beta2, eps;
};

class AdamWFused final : public ablate::Optimizer {
 public:
  explicit AdamWFused(Hyper h) : h_(h) {}

  void init(const ablate::ParamTable& table, ablate::DeviceType device) override {
    if (device != ablate::DeviceType::cuda) {
      ablate::throw_input_error("optimizer.name", "adamw_fused runs on a CUDA device; use adamw on the CPU");
    }
    std::vector<DecayRun> runs;
    for (const ablate::ParamSlice& s : table.slices) {
      const int32_t decay = s.decay ? 1 : 0;
      if (!runs.empty() && runs.back().decay == decay && runs.back().end == s.offset) {
        runs.back().end = s.offset + s.numel();
      } else {
        if (s.offset != (runs.empty() ? 0 : runs.back().end)) {
          ablate::throw_runtime_error(kName, "the parameter table has a gap before '" + s.name + "'");
        }
        runs.push_back({s.offset + s.numel(), decay, 0});
      }
    }
    if ((runs.empty() ? 0 : runs.back().end) != table.total) {
      ablate::throw_runtime_error(kName, "the parameter table's slices do not cover its total");
    }
    total_ = table.total;
    runs_.upload(runs.data(), runs.size());
    m_.resize(std::size_t(total_));
    v_.resize(std::size_t(total_));
    m_.fill_zero();
    v_.fill_zero();
    staged_ = pinned_coefficients();
    c_device_.resize(1);
    // Those copies ran on the legacy default stream, which does not order the model's non-blocking one.
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void step(const ablate::ParamTable& table, ablate::TensorView params, ablate::TensorView grads,
            const ablate::StepArgs& args) override {
    const int64_t step = args.step;
    if (step < 1) ablate::throw_runtime_error(kName, "step counts from 1");
    if (table.total != total_ || params.numel() != total_ || grads.numel() != total_) {
      ablate::throw_runtime_error(kName, "parameter or gradient buffer does not match the parameter table given to init");
    }
    if (params.device != ablate::DeviceType::cuda || grads.device != ablate::DeviceType::cuda || params.dtype != ablate::DType::f32 ||
        grads.dtype != ablate::DType::f32) {
      ablate::throw_runtime_error(kName, "parameters and gradients must be f32 buffers on the CUDA device");
    }
    const Coefficients c = coefficients(args);
    const auto stream = args.stream.as<cudaStream_t>();
    // Under capture the coefficients travel through pinned host memory and a captured copy, which
    // each replay repeats after restage() has rewritten them.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ABLATE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    const Coefficients* c_device = nullptr;
    if (capture != cudaStreamCaptureStatusNone) {
      *staged_.get() = c;
      ABLATE_CUDA_CHECK(cudaMemcpyAsync(c_device_.data(), staged_.get(), sizeof(Coefficients), cudaMemcpyHostToDevice, stream));
      c_device = c_device_.data();
    }
    ABLATE_CUDA_CHECK(ablate::adamw_fused::launch_step(params.as<float>(), grads.as<float>(), m_.data(), v_.data(),
                                                       static_cast<uint16_t*>(args.params_bf16), total_, runs_.data(),
                                                       int32_t(runs_.size()), c, c_device, args.grad_scale_device, stream));
  }

  bool writes_bf16() const override { return true; }
  bool reads_device_scale() const override { return true; }
  bool capturable() const override { return true; }
  void restage(const ablate::StepArgs& args) override { *staged_.get() = coefficients(args); }

  int64_t state_bytes() const override { return int64_t(m_.bytes() + v_.bytes()); }

  std::vector<ablate::NamedTensor> save_state() const override {
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());  // the last step was enqueued on the model's stream
    return {pack("exp_avg", m_), pack("exp_avg_sq", v_)};
  }

  void load_state(const std::vector<ablate::NamedTensor>& state) override {
    const std::size_t bytes = std::size_t(total_) * sizeof(float);
    int seen[2] = {0, 0};
    for (const ablate::NamedTensor& t : state) {  // everything is checked before anything changes
      if (t.name != "exp_avg" && t.name != "exp_avg_sq") {
        ablate::throw_input_error("adamw_fused state", "unexpected tensor '" + t.name + "'");
      }
      if (++seen[t.name == "exp_avg" ? 0 : 1] > 1)
        ablate::throw_input_error("adamw_fused state", "tensor '" + t.name + "' appears twice");
      if (t.dtype != ablate::DType::f32 || t.bytes.size() != bytes) {
        ablate::throw_input_error("adamw_fused state", "tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                                                           " bytes, expected " + std::to_string(bytes) + " (f32, one per parameter)");
      }
    }
    // A state missing a moment would resume with it zeroed, silently.
    if (seen[0] == 0 || seen[1] == 0) {
      ablate::throw_input_error("adamw_fused state",
                                std::string("tensor '") + (seen[0] == 0 ? "exp_avg" : "exp_avg_sq") + "' is missing");
    }
    // The copies run on the legacy default stream, which the model's non-blocking stream does not
    // order: a step still queued there reads m and v, so it finishes first.
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
    for (const ablate::NamedTensor& t : state) {
      ablate::cuda::DeviceBuffer<float>& dst = t.name == "exp_avg" ? m_ : v_;
      ABLATE_CUDA_CHECK(cudaMemcpy(dst.data(), t.bytes.data(), bytes, cudaMemcpyHostToDevice));
    }
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());  // before any step on the model's stream reads them
  }

 private:
  static ablate::NamedTensor pack(const char* name, const ablate::cuda::DeviceBuffer<float>& v) {
    ablate::NamedTensor t{name, ablate::DType::f32, {int64_t(v.size())}, {}};
    t.bytes.resize(v.bytes());
    v.download(reinterpret_cast<float*>(t.bytes.data()));
    return t;
  }

  using Coefficients = ablate::adamw_fused::Coefficients;

  // The step's scalars, formed in double and rounded once (as adamw does on the cpu).
  Coefficients coefficients(const ablate::StepArgs& args) const {
    const double lr = args.lr;
    const double bias1 = 1.0 - std::pow(h_.beta1, double(args.step));
    const double bias2 = 1.0 - std::pow(h_.beta2, double(args.step));
    return {float(lr / bias1), float(std::sqrt(bias2)), float(h_.beta1),       float(h_.beta2),
            float(h_.eps),     float(1.0 - h_.beta1),   float(1.0 - h_.beta2), float(1.0 - lr * h_.weight_decay),
            args.grad_scale};
  }

  // Pinned host memory: a captured copy reads it each time the graph runs.
  struct FreeHost {
    void operator()(Coefficients* p) const noexcept { cudaFreeHost(p); }
  };
  static std::unique_ptr<Coefficients, FreeHost> pinned_coefficients() {
    Coefficients* p = nullptr;
    ABLATE_CUDA_CHECK(cudaMallocHost(&p, sizeof(Coefficients)));
    *p = Coefficients{};
    return std::unique_ptr<Coefficients, FreeHost>(p);
  }

  Hyper h_;
  int64_t total_ = 0;
  std::unique_ptr<Coefficients, FreeHost> staged_;     // this step's coefficients for a captured copy
  ablate::cuda::DeviceBuffer<Coefficients> c_device_;  // where that copy puts them
  ablate::cuda::DeviceBuffer<DecayRun> runs_;
  ablate::cuda::DeviceBuffer<float> m_, v_;
};

std::unique_ptr<ablate::Component> make(const ablate::ComponentArgs& a) {
  const ablate::adamw_keys::Hyper k = ablate::adamw_keys::read(a.own);
  return std::make_unique<AdamWFused>(Hyper{k.weight_decay, k.beta1, k.beta2, k.eps});
}

// One algorithm, one name on every device: `adamw` on cuda is this kernel (the cpu's `adamw` is the
// adamw plugin, whose results it gives bit for bit), so a run moves to the GPU by run.device alone.
// `adamw_fused` is its former name, kept so that old experiments still run.
void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::optimizer,
         "adamw",
         "1.0.0",
         "AdamW (on a CUDA device: one kernel per step, fp32 state, 8 bytes per parameter, the CPU adamw's results bit "
         "for bit)",
         ablate::adamw_keys::schema(),
         make,
         "",
         {"cuda"}});
  r.add({ablate::Kind::optimizer,
         kName,
         "1.0.0",
         "deprecated name of adamw on a CUDA device (the same kernel), kept for old experiments: write adamw",
         {},
         make,
         "",
         {"cuda"}});
  r.share_keys(ablate::Kind::optimizer, kName, ablate::adamw_keys::kFamily);  // its keys are adamw's, in [optimizer.adamw]
}

}  // namespace

ABLATE_PLUGIN("adamw_fused", "1.0.0", register_components)
