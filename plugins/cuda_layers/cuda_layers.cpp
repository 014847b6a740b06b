// `cuda_layers`: layers on a CUDA device, registered for device "cuda" under the names of their
// CPU twins, so an experiment's [model] means the same on both devices. Today: the norms
// (`layernorm`, `rmsnorm`), f32, with the CPU layers' parameters, saved values and gradient
// contract (parameter gradients accumulate, the input gradient is written or accumulated as the
// call asks); tests/layers runs each against the CPU layers in float64 on a GPU.
#include <cuda_runtime.h>

#include <string>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/plugin.hpp"
#include "norm_kernels.hpp"

namespace ablate::cuda_layers {
namespace {

void require_f32(const char* layer, const TensorView& t, const char* what, int64_t elements) {
  if (elements == 0) return;
  if (t.data == nullptr) throw_runtime_error(layer, std::string("the call has no '") + what + "' tensor");
  if (t.dtype != DType::f32 || t.device != DeviceType::cuda) {
    throw_runtime_error(layer, std::string("'") + what + "' must be f32 on the cuda device, it is " + to_string(t.dtype) +
                                   " on " + to_string(t.device));
  }
  if (t.numel() < elements) {
    throw_runtime_error(layer, std::string("'") + what + "' holds " + std::to_string(t.numel()) + " values, the call needs " +
                                   std::to_string(elements));
  }
}

std::string param_name(const std::string& prefix, const char* leaf) { return prefix + "." + leaf; }

class Norm final : public Layer {
 public:
  Norm(bool rms, const char* name) : rms_(rms), name_(name) {}
  LayerRole role() const override { return LayerRole::norm; }

  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    table.add(param_name(prefix, "weight"), {spec.in}, false, 0.0, 1.0);
    if (!rms_ && spec.bias) table.add(param_name(prefix, "bias"), {spec.in}, false, 0.0, 0.0);
  }
  int64_t activation_elements(const LayerSpec&, int64_t rows) const override { return rms_ ? rows : 2 * rows; }

  void forward(const LayerCall& call) override {
    const int64_t in = check(call), n = call.rows * in;
    require_f32(name_, call.x, "x", n);
    require_f32(name_, call.y, "y", n);
    if (call.x.data == call.y.data) throw_runtime_error(name_, "y must not alias x (backward reads x again)");
    const float* w = call.params.as<const float>();
    launch_norm_forward(rms_, call.x.as<const float>(), w, bias(call, w), call.y.as<float>(), call.saved.as<float>(), call.rows,
                        in, float(call.spec->eps), stream(call));
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  void backward(const LayerCall& call) override {
    const int64_t in = check(call), n = call.rows * in;
    require_f32(name_, call.x, "x", n);
    require_f32(name_, call.d_y, "d_y", n);
    require_f32(name_, call.grads, "grads", params_of(*call.spec));
    if (call.d_x.data != nullptr) {
      require_f32(name_, call.d_x, "d_x", n);
      if (call.d_x.data == call.x.data) throw_runtime_error(name_, "d_x must not alias x");
    }
    float* dw = call.grads.as<float>();
    float* db = !rms_ && call.spec->bias ? dw + in : nullptr;
    launch_norm_backward(rms_, call.x.as<const float>(), call.params.as<const float>(), call.d_y.as<const float>(),
                         call.saved.as<const float>(), call.d_x.data != nullptr ? call.d_x.as<float>() : nullptr,
                         call.input_grad == GradMode::accumulate, dw, db, call.rows, in, stream(call));
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

 private:
  int64_t params_of(const LayerSpec& s) const { return !rms_ && s.bias ? 2 * s.in : s.in; }
  const float* bias(const LayerCall& call, const float* w) const { return !rms_ && call.spec->bias ? w + call.spec->in : nullptr; }
  static cudaStream_t stream(const LayerCall& call) { return static_cast<cudaStream_t>(call.stream); }
  int64_t check(const LayerCall& call) const {
    if (call.spec == nullptr || call.spec->in <= 0 || call.rows < 0) throw_runtime_error(name_, "the call has no valid spec or rows");
    require_f32(name_, call.params, "params", params_of(*call.spec));
    require_f32(name_, call.saved, "saved", activation_elements(*call.spec, call.rows));
    return call.spec->in;
  }
  bool rms_;
  const char* name_;
};

void register_components(Registrar& r) {
  const auto add = [&r](const char* name, const char* doc, bool rms) {
    ComponentInfo info;
    info.kind = Kind::layer;
    info.name = name;
    info.version = "1.0.0";
    info.doc = doc;
    info.devices = {"cuda"};
    info.factory = [rms, name](const ComponentArgs&) -> std::unique_ptr<Component> { return std::make_unique<Norm>(rms, name); };
    r.add(std::move(info));
  };
  add("layernorm", "layer norm with weight and optional bias on a CUDA device (f32; warp per row)", false);
  add("rmsnorm", "RMS norm with weight on a CUDA device (f32; warp per row)", true);
}

}  // namespace
}  // namespace ablate::cuda_layers

ABLATE_PLUGIN("cuda_layers", "1.0.0", ablate::cuda_layers::register_components)
