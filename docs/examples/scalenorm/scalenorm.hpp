// ScaleNorm (Nguyen and Salazar, 2019), an example of a norm added as a plugin built out of tree:
// y = g * x / sqrt(mean(x^2) + eps) over each row's `in` values, with one learned scalar g per use
// (initialised to init_g, 1 by default: at the start an RMS norm without per-channel weights).
// The layer contract (ablate/layer.hpp): role norm; parameters declared into the flat buffer; the
// inverse RMS of each row kept from forward to backward (`saved`); parameter gradients accumulated
// (+=); the input gradient written, or added when the call asks for GradMode::accumulate.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <ablate/layer.hpp>

namespace scalenorm {

class ScaleNorm final : public ablate::Layer {
 public:
  explicit ScaleNorm(double init_g = 1.0) : init_g_(init_g) {}
  ablate::LayerRole role() const override { return ablate::LayerRole::norm; }
  void declare_params(const ablate::LayerSpec&, const std::string& prefix, ablate::ParamTable& table) const override {
    table.add(prefix.empty() ? "g" : prefix + ".g", {1}, false, 0.0, init_g_);  // no decay, value init_g
  }
  int64_t activation_elements(const ablate::LayerSpec&, int64_t rows) const override { return rows; }

  void forward(const ablate::LayerCall& call) override {
    check(call, false);
    if (call.x.dtype == ablate::DType::f64) forward_as<double>(call);
    else forward_as<float>(call);
  }
  void backward(const ablate::LayerCall& call) override {
    check(call, true);
    if (call.x.dtype == ablate::DType::f64) backward_as<double>(call);
    else backward_as<float>(call);
  }

 private:
  static void need(const ablate::TensorView& t, const char* what, int64_t n, ablate::DType dtype) {
    if (t.data == nullptr || t.numel() < n || t.dtype != dtype || t.device != ablate::DeviceType::cpu) {
      throw std::invalid_argument(std::string("scalenorm: ") + what + " must be a CPU view of at least " + std::to_string(n) +
                                  " values of the call's dtype (f32 or f64)");
    }
  }
  static void check(const ablate::LayerCall& c, bool backward) {
    if (c.spec == nullptr || c.spec->in <= 0 || c.rows < 0) throw std::invalid_argument("scalenorm: no spec or rows");
    const ablate::DType dt = c.x.dtype;
    if (dt != ablate::DType::f32 && dt != ablate::DType::f64) throw std::invalid_argument("scalenorm: f32 or f64 only");
    const int64_t n = c.rows * c.spec->in;
    need(c.x, "x", n, dt);
    need(c.params, "params", 1, dt);
    need(c.saved, "saved", c.rows, dt);
    if (!backward) {
      need(c.y, "y", n, dt);
      if (c.y.data == c.x.data) throw std::invalid_argument("scalenorm: y must not alias x (backward reads x)");
      return;
    }
    need(c.d_y, "d_y", n, dt);
    need(c.grads, "grads", 1, dt);
    if (c.d_x.data != nullptr) need(c.d_x, "d_x", n, dt);
  }

  template <class T>
  static void forward_as(const ablate::LayerCall& c) {
    const int64_t in = c.spec->in;
    const T* x = c.x.as<T>();
    T* y = c.y.as<T>();
    T* r_out = c.saved.as<T>();
    const T g = c.params.as<T>()[0];
    for (int64_t r = 0; r < c.rows; ++r) {
      const T* xr = x + r * in;
      double ss = 0.0;
      for (int64_t i = 0; i < in; ++i) ss += double(xr[i]) * double(xr[i]);
      const T rinv = T(1.0 / std::sqrt(ss / double(in) + c.spec->eps));
      r_out[r] = rinv;
      for (int64_t i = 0; i < in; ++i) y[r * in + i] = g * (xr[i] * rinv);
    }
  }

  // xhat = x r; dg += sum dy xhat; dxhat = g dy; dx = r (dxhat - xhat mean(dxhat xhat)).
  template <class T>
  static void backward_as(const ablate::LayerCall& c) {
    const int64_t in = c.spec->in;
    const T* x = c.x.as<T>();
    const T* dy = c.d_y.as<T>();
    const T* r_saved = c.saved.as<T>();
    const T g = c.params.as<T>()[0];
    T* dx = c.d_x.as<T>();
    const bool add = c.input_grad == ablate::GradMode::accumulate;
    double dg = 0.0;
    for (int64_t r = 0; r < c.rows; ++r) {
      const T* xr = x + r * in;
      const T* dyr = dy + r * in;
      const double rinv = double(r_saved[r]);
      double dot = 0.0;  // sum dxhat xhat
      for (int64_t i = 0; i < in; ++i) {
        const double xhat = double(xr[i]) * rinv;
        dg += double(dyr[i]) * xhat;
        dot += double(g) * double(dyr[i]) * xhat;
      }
      if (dx == nullptr) continue;
      const double mean_dot = dot / double(in);
      for (int64_t i = 0; i < in; ++i) {
        const double xhat = double(xr[i]) * rinv;
        const T v = T(rinv * (double(g) * double(dyr[i]) - xhat * mean_dot));
        dx[r * in + i] = add ? dx[r * in + i] + v : v;
      }
    }
    c.grads.as<T>()[0] += T(dg);
  }
  double init_g_;
};

}  // namespace scalenorm
