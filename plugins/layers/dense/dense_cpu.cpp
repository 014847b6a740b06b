// Dense layers: `linear` (y = x W^T + b), `gelu_mlp` (proj(gelu_tanh(fc(x)))) and `swiglu_mlp`
// (down(silu(gate(x)) * up(x))). Weights are (out, in) as PyTorch stores them. When the call has a
// residual, y = residual + dropout(f(x)) (the residual may be y itself); the residual's gradient is
// d_y, which the model shares, so backward never writes it.
#include "common.hpp"

namespace ablate::cpu_layers {
namespace {

struct DenseCheck {
  DType dtype;
  Dropout drop;
};

// Checks a dense-like call; `in` and `out` are the layer's input and output widths.
DenseCheck check_dense_forward(const char* name, const LayerCall& call, int64_t in, int64_t out, int64_t params, int64_t saved) {
  const DType dt = call_dtype(name, {&call.x, &call.y, &call.residual, &call.params, &call.saved});
  require(name, call.x, "x", call.rows * in);
  require(name, call.y, "y", call.rows * out);
  require(name, call.params, "params", params);
  if (saved > 0) require(name, call.saved, "saved", saved);
  if (call.residual.data != nullptr) require(name, call.residual, "residual", call.rows * out);
  if (same(call.x, call.y)) throw_runtime_error(name, "y must not alias x");
  return {dt, make_dropout(name, call)};
}

DenseCheck check_dense_backward(const char* name, const LayerCall& call, int64_t in, int64_t out, int64_t params, int64_t saved,
                                int64_t scratch) {
  const DType dt = call_dtype(name, {&call.x, &call.d_y, &call.d_x, &call.params, &call.grads, &call.saved, &call.scratch});
  require(name, call.x, "x", call.rows * in);
  require(name, call.d_y, "d_y", call.rows * out);
  require(name, call.params, "params", params);
  if (call.grads.data != nullptr) require(name, call.grads, "grads", params);  // none: frozen parameters
  if (saved > 0) require(name, call.saved, "saved", saved);
  if (scratch > 0) require(name, call.scratch, "scratch", scratch);
  if (call.d_x.data != nullptr) {
    require(name, call.d_x, "d_x", call.rows * in);
    if (same(call.d_x, call.d_y) || same(call.d_x, call.x)) throw_runtime_error(name, "d_x must not alias d_y or x");
  }
  return {dt, make_dropout(name, call)};
}

namespace lp = layer_params;
template <class T>
const T* at(const TensorView& v, int64_t offset) {
  return offset < 0 ? nullptr : v.as<T>() + offset;
}
template <class T>
T* at_mut(const TensorView& v, int64_t offset) {
  return offset < 0 || v.data == nullptr ? nullptr : v.as<T>() + offset;
}

// --- linear ---------------------------------------------------------------------------------------

class Linear final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::linear; }

  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    lp::linear(spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const lp::Dense p = lp::dense(0, s.in, s.out, s.bias);
    const DenseCheck c = check_dense_forward(kName, call, s.in, s.out, p.end, 0);
    dispatch(c.dtype, [&](auto tag) {
      using T = decltype(tag);
      dense_forward<T>(call.x.as<T>(), call.rows, s.in, s.out, at<T>(call.params, p.weight), at<T>(call.params, p.bias),
                       call.y.as<T>(), call.residual.as<T>(), c.drop);
    });
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const lp::Dense p = lp::dense(0, s.in, s.out, s.bias);
    const DenseCheck c = check_dense_backward(kName, call, s.in, s.out, p.end, 0, 0);
    dispatch(c.dtype, [&](auto tag) {
      using T = decltype(tag);
      dense_backward<T>(call.d_y.as<T>(), call.rows, s.in, s.out, call.x.as<T>(), at<T>(call.params, p.weight),
                        at_mut<T>(call.grads, p.weight), at_mut<T>(call.grads, p.bias), call.d_x.as<T>(),
                        call.input_grad == GradMode::accumulate, c.drop);
    });
  }

 private:
  static constexpr const char* kName = "linear";
};

// --- gelu_mlp -------------------------------------------------------------------------------------

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Computed as
// x * sigmoid(2u), the same function (0.5 (1 + tanh(u)) = sigmoid(2u)) with one exp instead of the
// tanh (whose libm form goes through expm1 and was a quarter of a CPU training step).
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;

template <class T>
T gelu_sigmoid(T x) {  // sigmoid(2u) = 0.5 (1 + tanh(u))
  const T u = T(kGeluK) * (x + T(kGeluC) * x * x * x);
  return T(1) / (T(1) + std::exp(T(-2) * u));
}
template <class T>
T gelu(T x) {
  return x * gelu_sigmoid(x);
}
template <class T>
T gelu_grad(T x) {
  // d/dx [x s(2u)] = s + x * 2 s (1 - s) * u'
  const T s = gelu_sigmoid(x);
  return s + x * T(2) * s * (T(1) - s) * T(kGeluK) * (T(1) + T(3.0 * kGeluC) * x * x);
}

// Params: fc.weight (H, C), fc.bias (H), proj.weight (C, H), proj.bias (C); saved: pre-activation
// and activation (rows, H) each; scratch: (rows, H) for their gradient.
class GeluMLP final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::mlp; }

  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    lp::gelu_mlp(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec& s, int64_t rows) const override { return 2 * rows * s.out; }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return rows * s.out; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const lp::GeluMlp o = lp::gelu_mlp_offsets(s);
    const lp::Dense &fc = o.fc, &proj = o.proj;
    const DenseCheck c = check_dense_forward(kName, call, C, C, proj.end, 2 * rows * H);
    dispatch(c.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* pre = call.saved.as<T>();
      T* post = pre + rows * H;
      dense_forward<T>(call.x.as<T>(), rows, C, H, at<T>(call.params, fc.weight), at<T>(call.params, fc.bias), pre, nullptr,
                       Dropout{});
      const int64_t n = rows * H;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) post[i] = gelu(pre[i]);
      dense_forward<T>(post, rows, H, C, at<T>(call.params, proj.weight), at<T>(call.params, proj.bias), call.y.as<T>(),
                       call.residual.as<T>(), c.drop);
    });
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const lp::GeluMlp o = lp::gelu_mlp_offsets(s);
    const lp::Dense &fc = o.fc, &proj = o.proj;
    const DenseCheck c = check_dense_backward(kName, call, C, C, proj.end, 2 * rows * H, rows * H);
    dispatch(c.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* pre = call.saved.as<T>();
      const T* post = pre + rows * H;
      T* d_h = call.scratch.as<T>();
      dense_backward<T>(call.d_y.as<T>(), rows, H, C, post, at<T>(call.params, proj.weight), at_mut<T>(call.grads, proj.weight),
                        at_mut<T>(call.grads, proj.bias), d_h, false, c.drop);
      const int64_t n = rows * H;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) d_h[i] *= gelu_grad(pre[i]);
      dense_backward<T>(d_h, rows, C, H, call.x.as<T>(), at<T>(call.params, fc.weight), at_mut<T>(call.grads, fc.weight),
                        at_mut<T>(call.grads, fc.bias), call.d_x.as<T>(), call.input_grad == GradMode::accumulate, Dropout{});
    });
  }

 private:
  static constexpr const char* kName = "gelu_mlp";
};

// --- swiglu_mlp -----------------------------------------------------------------------------------

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Params: gate.weight (H, C), gate.bias (H), up.weight (H, C), up.bias (H), down.weight (C, H),
// down.bias (C); saved: gate pre-activation g, up u and product h = silu(g) u, (rows, H) each;
// scratch: two (rows, H) gradients.
class SwiGLUMLP final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::mlp; }
  int64_t default_hidden(int64_t d_model) const override { return lp::swiglu_hidden(d_model); }

  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    lp::swiglu_mlp(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec& s, int64_t rows) const override { return 3 * rows * s.out; }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return 2 * rows * s.out; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const lp::SwigluMlp o = lp::swiglu_mlp_offsets(s);
    const lp::Dense &gate = o.gate, &up = o.up, &down = o.down;
    const DenseCheck c = check_dense_forward(kName, call, C, C, down.end, 3 * rows * H);
    dispatch(c.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* g = call.saved.as<T>();
      T* u = g + rows * H;
      T* h = u + rows * H;
      const T* x = call.x.as<T>();
      dense_forward<T>(x, rows, C, H, at<T>(call.params, gate.weight), at<T>(call.params, gate.bias), g, nullptr, Dropout{});
      dense_forward<T>(x, rows, C, H, at<T>(call.params, up.weight), at<T>(call.params, up.bias), u, nullptr, Dropout{});
      const int64_t n = rows * H;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
      dense_forward<T>(h, rows, H, C, at<T>(call.params, down.weight), at<T>(call.params, down.bias), call.y.as<T>(),
                       call.residual.as<T>(), c.drop);
    });
  }

  // dh = dy' Wd; dg = dh u silu'(g) with silu'(g) = s (1 + g (1 - s)); du = dh silu(g).
  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const lp::SwigluMlp o = lp::swiglu_mlp_offsets(s);
    const lp::Dense &gate = o.gate, &up = o.up, &down = o.down;
    const DenseCheck c = check_dense_backward(kName, call, C, C, down.end, 3 * rows * H, 2 * rows * H);
    dispatch(c.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* g = call.saved.as<T>();
      const T* u = g + rows * H;
      const T* h = u + rows * H;
      T* d_u = call.scratch.as<T>();  // holds dh first
      T* d_g = d_u + rows * H;
      const T* x = call.x.as<T>();
      dense_backward<T>(call.d_y.as<T>(), rows, H, C, h, at<T>(call.params, down.weight), at_mut<T>(call.grads, down.weight),
                        at_mut<T>(call.grads, down.bias), d_u, false, c.drop);
      const int64_t n = rows * H;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) {
        const T sg = sigmoid(g[i]);
        const T dh = d_u[i];
        d_g[i] = dh * u[i] * sg * (T(1) + g[i] * (T(1) - sg));
        d_u[i] = dh * g[i] * sg;
      }
      T* d_x = call.d_x.as<T>();
      const bool accumulate = call.input_grad == GradMode::accumulate;
      dense_backward<T>(d_g, rows, C, H, x, at<T>(call.params, gate.weight), at_mut<T>(call.grads, gate.weight),
                        at_mut<T>(call.grads, gate.bias), d_x, accumulate, Dropout{});
      dense_backward<T>(d_u, rows, C, H, x, at<T>(call.params, up.weight), at_mut<T>(call.grads, up.weight),
                        at_mut<T>(call.grads, up.bias), d_x, true, Dropout{});
    });
  }

 private:
  static constexpr const char* kName = "swiglu_mlp";
};

}  // namespace

std::unique_ptr<Layer> make_linear() { return std::make_unique<Linear>(); }
std::unique_ptr<Layer> make_gelu_mlp() { return std::make_unique<GeluMLP>(); }
std::unique_ptr<Layer> make_swiglu_mlp() { return std::make_unique<SwiGLUMLP>(); }

}  // namespace ablate::cpu_layers
