// The norms on a CUDA device: `layernorm` and `rmsnorm` (also the qk-norm of attention heads), f32
// (the output y, and the qk-norm's x, in bf16 where the model holds them so), with the CPU layers' parameters, saved values
// (mean and rstd per row; rmsnorm rstd) and gradient contract (parameter gradients accumulate, the
// input gradient is written or accumulated as the call asks). Kernels in norm_kernels.cu.
#include "ablate/layer_params.hpp"
#include "common.hpp"
#include "norm_kernels.hpp"

namespace ablate::cuda_layers {
namespace {

class Norm final : public Layer {
 public:
  Norm(bool rms, const char* name) : rms_(rms), name_(name) {}
  LayerRole role() const override { return LayerRole::norm; }
  double default_epsilon() const override { return rms_ ? layer_params::kRmsnormEpsilon : Layer::default_epsilon(); }

  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::norm(rms_, spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t rows) const override { return rms_ ? rows : 2 * rows; }

  // y may be bf16: the model holds a norm's output that only products read in bf16. x and y may
  // both be bf16: the qk-norm of q and k held in bf16.
  bool bf16_product_inputs() const override { return true; }
  bool bf16_attention_inputs() const override { return true; }
  // x (the residual stream) in bf16, y then bf16 too, where the model holds the stream so.
  bool bf16_residual() const override { return true; }

  void forward(const LayerCall& call) override {
    const int64_t in = check(call), n = call.rows * in;
    if (call.x.data == call.y.data) throw_runtime_error(name_, "y must not alias x (backward reads x again)");
    const float* w = call.params.as<const float>();
    float* saved = call.saved.as<float>();
    const float eps = float(call.spec->eps);
    const cudaStream_t st = stream_of(call);
    if (call.x.dtype == DType::bf16) {  // then y too
      require_bf16(name_, call.x, "x", n);
      require_bf16(name_, call.y, "y", n);
      launch_norm_forward(rms_, call.x.as<const uint16_t>(), w, bias(call, w), call.y.as<uint16_t>(), saved, call.rows, in, eps, st);
    } else if (call.y.dtype == DType::bf16) {
      require_f32(name_, call.x, "x", n);
      require_bf16(name_, call.y, "y", n);
      launch_norm_forward(rms_, call.x.as<const float>(), w, bias(call, w), call.y.as<uint16_t>(), saved, call.rows, in, eps, st);
    } else {
      require_f32(name_, call.x, "x", n);
      require_f32(name_, call.y, "y", n);
      launch_norm_forward(rms_, call.x.as<const float>(), w, bias(call, w), call.y.as<float>(), saved, call.rows, in, eps, st);
    }
    check_launch(name_);
  }

  void backward(const LayerCall& call) override {
    const int64_t in = check(call), n = call.rows * in;
    if (call.x.dtype == DType::bf16) {
      require_bf16(name_, call.x, "x", n);
    } else {
      require_f32(name_, call.x, "x", n);
    }
    require_f32(name_, call.d_y, "d_y", n);
    if (call.grads.data != nullptr) require_f32(name_, call.grads, "grads", params_of(*call.spec));  // none: frozen
    if (call.d_x.data != nullptr) {
      require_f32(name_, call.d_x, "d_x", n);
      if (call.d_x.data == call.x.data) throw_runtime_error(name_, "d_x must not alias x");
    }
    float* dw = call.grads.data != nullptr ? call.grads.as<float>() : nullptr;
    float* db = !rms_ && call.spec->bias && dw != nullptr ? dw + in : nullptr;
    const float* w = call.params.as<const float>();
    const float* dy = call.d_y.as<const float>();
    const float* saved = call.saved.as<const float>();
    float* dx = call.d_x.data != nullptr ? call.d_x.as<float>() : nullptr;
    const bool accumulate = call.input_grad == GradMode::accumulate;
    if (call.x.dtype == DType::bf16) {
      launch_norm_backward(rms_, call.x.as<const uint16_t>(), w, dy, saved, dx, accumulate, dw, db, call.rows, in, stream_of(call));
    } else {
      launch_norm_backward(rms_, call.x.as<const float>(), w, dy, saved, dx, accumulate, dw, db, call.rows, in, stream_of(call));
    }
    check_launch(name_);
  }

 private:
  int64_t params_of(const LayerSpec& s) const { return !rms_ && s.bias ? 2 * s.in : s.in; }
  const float* bias(const LayerCall& call, const float* w) const { return !rms_ && call.spec->bias ? w + call.spec->in : nullptr; }
  int64_t check(const LayerCall& call) const {
    if (call.spec == nullptr || call.spec->in <= 0 || call.rows < 0) throw_runtime_error(name_, "the call has no valid spec or rows");
    require_f32(name_, call.params, "params", params_of(*call.spec));
    require_f32(name_, call.saved, "saved", activation_elements(*call.spec, call.rows));
    return call.spec->in;
  }
  bool rms_;
  const char* name_;
};

}  // namespace

std::unique_ptr<Layer> make_norm(bool rms, const char* name) { return std::make_unique<Norm>(rms, name); }

}  // namespace ablate::cuda_layers
