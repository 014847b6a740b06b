// Norms over the last dimension: `layernorm` (weight, optional bias) and `rmsnorm` (weight only).
// Row statistics are accumulated in double. Saved: layernorm mean and rstd per row (mean in the
// first `rows` values, rstd in the next `rows`); rmsnorm rstd per row. Parameter gradients are
// summed per column block over the rows in order, so they are the same every run.
#include "common.hpp"

namespace ablate::cpu_layers {
namespace {

template <class T>
struct NormViews {
  const T* x;
  T* y;
  const T* w;
  const T* b;  // null without bias
  T* saved;
};

class NormBase : public Layer {
 public:
  LayerRole role() const override { return LayerRole::norm; }

 protected:
  // Checks the common shapes and returns the dtype.
  static DType check_forward(const char* name, const LayerCall& call, int64_t params, int64_t saved) {
    check_spec(name, call);
    const DType dt = call_dtype(name, {&call.x, &call.y, &call.params, &call.saved});
    const int64_t n = call.rows * call.spec->in;
    require(name, call.x, "x", n);
    require(name, call.y, "y", n);
    require(name, call.params, "params", params);
    if (saved > 0) require(name, call.saved, "saved", saved);
    if (same(call.x, call.y)) throw_runtime_error(name, "y must not alias x (backward reads x again)");
    return dt;
  }
  static DType check_backward(const char* name, const LayerCall& call, int64_t params, int64_t saved) {
    check_spec(name, call);
    const DType dt = call_dtype(name, {&call.x, &call.d_y, &call.d_x, &call.params, &call.grads, &call.saved});
    const int64_t n = call.rows * call.spec->in;
    require(name, call.x, "x", n);
    require(name, call.d_y, "d_y", n);
    require(name, call.params, "params", params);
    if (call.grads.data != nullptr) require(name, call.grads, "grads", params);  // none: frozen parameters
    if (saved > 0) require(name, call.saved, "saved", saved);
    if (call.d_x.data != nullptr) {
      require(name, call.d_x, "d_x", n);
      if (same(call.d_x, call.x)) throw_runtime_error(name, "d_x must not alias x");
    }
    return dt;
  }
};

// --- layernorm ------------------------------------------------------------------------------------

class LayerNorm final : public NormBase {
 public:
  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::norm(false, spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t rows) const override { return 2 * rows; }

  void forward(const LayerCall& call) override {
    const LayerSpec* s = call.spec;
    const int64_t in = s != nullptr ? s->in : 0;
    const int64_t np = s != nullptr && s->bias ? 2 * in : in;
    const DType dt = check_forward(kName, call, np, 2 * call.rows);
    const double eps = s->eps;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = call.x.as<T>();
      T* y = call.y.as<T>();
      const T* w = call.params.as<T>();
      const T* b = s->bias ? w + in : nullptr;
      T* mean_out = call.saved.as<T>();
      T* rstd_out = mean_out + call.rows;
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
      for (int64_t r = 0; r < call.rows; ++r) {
        const T* xr = x + r * in;
        double sum = 0.0;
        for (int64_t c = 0; c < in; ++c) sum += double(xr[c]);
        const double mean = sum / double(in);
        double var = 0.0;
        for (int64_t c = 0; c < in; ++c) {
          const double d = double(xr[c]) - mean;
          var += d * d;
        }
        var /= double(in);
        const double rstd = 1.0 / std::sqrt(var + eps);
        const T m = T(mean), rs = T(rstd);
        mean_out[r] = m;
        rstd_out[r] = rs;
        T* yr = y + r * in;
        for (int64_t c = 0; c < in; ++c) {
          const T v = (xr[c] - m) * rs * w[c];
          yr[c] = b != nullptr ? v + b[c] : v;
        }
      }
    });
  }

  // xhat = (x - mean) rstd; dxhat = dy w;
  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)); dw += sum_r dy xhat; db += sum_r dy.
  void backward(const LayerCall& call) override {
    const LayerSpec* s = call.spec;
    const int64_t in = s != nullptr ? s->in : 0;
    const int64_t np = s != nullptr && s->bias ? 2 * in : in;
    const DType dt = check_backward(kName, call, np, 2 * call.rows);
    const bool accumulate = call.input_grad == GradMode::accumulate;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = call.x.as<T>();
      const T* dy = call.d_y.as<T>();
      const T* w = call.params.as<T>();
      T* dw = call.grads.data != nullptr ? call.grads.as<T>() : nullptr;
      T* db = s->bias && dw != nullptr ? dw + in : nullptr;
      const T* mean = call.saved.as<T>();
      const T* rstd = mean + call.rows;
      if (call.d_x.data != nullptr) {
        T* dx = call.d_x.as<T>();
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
        for (int64_t r = 0; r < call.rows; ++r) {
          const T* xr = x + r * in;
          const T* g = dy + r * in;
          const T m = mean[r], rs = rstd[r];
          double s1 = 0.0, s2 = 0.0;
          for (int64_t c = 0; c < in; ++c) {
            const double dxhat = double(g[c]) * double(w[c]);
            s1 += dxhat;
            s2 += dxhat * double((xr[c] - m) * rs);
          }
          const T mean_dxhat = T(s1 / double(in)), mean_dxhat_xhat = T(s2 / double(in));
          T* dxr = dx + r * in;
          for (int64_t c = 0; c < in; ++c) {
            const T xhat = (xr[c] - m) * rs;
            const T v = rs * (g[c] * w[c] - mean_dxhat - xhat * mean_dxhat_xhat);
            dxr[c] = accumulate ? dxr[c] + v : v;
          }
        }
      }
      if (dw == nullptr) return;  // frozen weights: the input gradient is all
      const int64_t blocks = (in + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c0 = blk * kColumnBlock, c1 = std::min(in, c0 + kColumnBlock);
        for (int64_t r = 0; r < call.rows; ++r) {
          const T* xr = x + r * in;
          const T* g = dy + r * in;
          const T m = mean[r], rs = rstd[r];
          for (int64_t c = c0; c < c1; ++c) {
            dw[c] += g[c] * (xr[c] - m) * rs;
            if (db != nullptr) db[c] += g[c];
          }
        }
      }
    });
  }

 private:
  static constexpr const char* kName = "layernorm";
};

// --- rmsnorm --------------------------------------------------------------------------------------

class RMSNorm final : public NormBase {
 public:
  double default_epsilon() const override { return layer_params::kRmsnormEpsilon; }
  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::norm(true, spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t rows) const override { return rows; }

  // y = x rstd w, rstd = 1/sqrt(mean(x^2) + eps).
  void forward(const LayerCall& call) override {
    const int64_t in = call.spec != nullptr ? call.spec->in : 0;
    const DType dt = check_forward(kName, call, in, call.rows);
    const double eps = call.spec->eps;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = call.x.as<T>();
      T* y = call.y.as<T>();
      const T* w = call.params.as<T>();
      T* rstd_out = call.saved.as<T>();
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
      for (int64_t r = 0; r < call.rows; ++r) {
        const T* xr = x + r * in;
        double ss = 0.0;
        for (int64_t c = 0; c < in; ++c) ss += double(xr[c]) * double(xr[c]);
        const T rs = T(1.0 / std::sqrt(ss / double(in) + eps));
        rstd_out[r] = rs;
        T* yr = y + r * in;
        for (int64_t c = 0; c < in; ++c) yr[c] = xr[c] * rs * w[c];
      }
    });
  }

  // xhat = x rstd; dx = rstd (dy w - xhat mean(dy w xhat)); dw += sum_r dy xhat.
  void backward(const LayerCall& call) override {
    const int64_t in = call.spec != nullptr ? call.spec->in : 0;
    const DType dt = check_backward(kName, call, in, call.rows);
    const bool accumulate = call.input_grad == GradMode::accumulate;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = call.x.as<T>();
      const T* dy = call.d_y.as<T>();
      const T* w = call.params.as<T>();
      T* dw = call.grads.data != nullptr ? call.grads.as<T>() : nullptr;
      const T* rstd = call.saved.as<T>();
      if (call.d_x.data != nullptr) {
        T* dx = call.d_x.as<T>();
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
        for (int64_t r = 0; r < call.rows; ++r) {
          const T* xr = x + r * in;
          const T* g = dy + r * in;
          const T rs = rstd[r];
          double s = 0.0;
          for (int64_t c = 0; c < in; ++c) s += double(g[c]) * double(w[c]) * double(xr[c] * rs);
          const T mean_dxhat_xhat = T(s / double(in));
          T* dxr = dx + r * in;
          for (int64_t c = 0; c < in; ++c) {
            const T v = rs * (g[c] * w[c] - xr[c] * rs * mean_dxhat_xhat);
            dxr[c] = accumulate ? dxr[c] + v : v;
          }
        }
      }
      if (dw == nullptr) return;  // frozen weights: the input gradient is all
      const int64_t blocks = (in + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c0 = blk * kColumnBlock, c1 = std::min(in, c0 + kColumnBlock);
        for (int64_t r = 0; r < call.rows; ++r) {
          const T* xr = x + r * in;
          const T* g = dy + r * in;
          const T rs = rstd[r];
          for (int64_t c = c0; c < c1; ++c) dw[c] += g[c] * xr[c] * rs;
        }
      }
    });
  }

 private:
  static constexpr const char* kName = "rmsnorm";
};

}  // namespace

std::unique_ptr<Layer> make_layernorm() { return std::make_unique<LayerNorm>(); }
std::unique_ptr<Layer> make_rmsnorm() { return std::make_unique<RMSNorm>(); }

}  // namespace ablate::cpu_layers
