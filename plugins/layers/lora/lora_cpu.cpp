// LoRA (Hu et al., 2021) as a layer of role adapter: beside a frozen linear y = x W^T + b, two
// trainable matrices A (rank, in) and B (out, rank) add
//
//   y += s * drop(x) A^T B^T,        s = alpha / rank
//
// computed as u = drop(x) A^T (rows, rank), kept for backward, then y += s u B^T. Backward, with
// g = d_y (rows, out):
//
//   dB += s g^T u,   t = s g B (rows, rank),   dA += t^T drop(x),   d_x += mask * (t A) / (1 - p)
//
// The parameters' layout and initialisation (A random, B zero: the adapted model starts as the base)
// are layer_params::lora, shared with the cuda registration. The parameter names are the linear's prefix with `lora_A` and
// `lora_B`, the shapes PEFT stores (`ablate export --format peft` writes them under PEFT's names).
// Keys: its own, [adapter.lora] rank, alpha and dropout (layer_params::lora_keys, the same schema on
// every device; the model applies the dropout it answers); [adapter] targets and base_dtype are the
// model's. The cuda registration of the same name is lora_cuda.cpp beside this file; each is
// registered by its device's library (../cpu/cpu_layers.cpp, ../cuda/cuda_layers.cpp).
#include "common.hpp"

namespace ablate::cpu_layers {

namespace {

constexpr const char* kName = "lora";

class Lora final : public layer_params::LoraFace {
 public:
  explicit Lora(const layer_params::LoraKeys& k) : LoraFace(k), scale_(scale()) {}

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const DType dt = call_dtype(kName, {&call.x, &call.y, &call.params, &call.saved, &call.scratch});
    require(kName, call.x, "x", call.rows * s.in);
    require(kName, call.y, "y", call.rows * s.out);
    require(kName, call.params, "params", rank_ * (s.in + s.out));
    require(kName, call.saved, "saved", call.rows * rank_);
    const Dropout drop = make_dropout(kName, call);
    if (drop.on()) require(kName, call.scratch, "scratch", call.rows * s.in);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* A = call.params.as<T>();
      const T* B = A + rank_ * s.in;
      T* u = call.saved.as<T>();
      const T* x = dropped<T>(call, drop, s.in);
      gemm(false, true, call.rows, rank_, s.in, T(1), x, s.in, A, s.in, T(0), u, rank_);
      gemm(false, true, call.rows, s.out, rank_, T(scale_), u, rank_, B, rank_, T(1), call.y.as<T>(), s.out);
    });
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const DType dt = call_dtype(kName, {&call.x, &call.d_y, &call.d_x, &call.params, &call.grads, &call.saved, &call.scratch});
    require(kName, call.x, "x", call.rows * s.in);
    require(kName, call.d_y, "d_y", call.rows * s.out);
    require(kName, call.params, "params", rank_ * (s.in + s.out));
    require(kName, call.grads, "grads", rank_ * (s.in + s.out));
    require(kName, call.saved, "saved", call.rows * rank_);
    const Dropout drop = make_dropout(kName, call);
    require(kName, call.scratch, "scratch", call.rows * ((drop.on() ? s.in : 0) + rank_));
    if (call.d_x.data != nullptr) require(kName, call.d_x, "d_x", call.rows * s.in);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const int64_t rows = call.rows, in = s.in, out = s.out, r = rank_;
      const T* A = call.params.as<T>();
      const T* B = A + r * in;
      T* dA = call.grads.as<T>();
      T* dB = dA + r * in;
      const T* u = call.saved.as<T>();
      const T* g = call.d_y.as<T>();
      const T* x = dropped<T>(call, drop, in);  // the same mask again: a pure function of the key
      T* t = call.scratch.as<T>() + (drop.on() ? rows * in : 0);
      gemm(true, false, out, r, rows, T(scale_), g, out, u, r, T(1), dB, r);
      gemm(false, false, rows, r, out, T(scale_), g, out, B, r, T(0), t, r);
      gemm(true, false, r, in, rows, T(1), t, r, x, in, T(1), dA, in);
      if (call.d_x.data == nullptr) return;
      T* dx = call.d_x.as<T>();
      if (!drop.on()) {
        gemm(false, false, rows, in, r, T(1), t, r, A, in, T(1), dx, in);
        return;
      }
      T* tmp = call.scratch.as<T>();  // drop(x) is no longer needed: (t A) goes there, then masked
      gemm(false, false, rows, in, r, T(1), t, r, A, in, T(0), tmp, in);
#pragma omp parallel for schedule(static) if (rows * in >= kParallelMin)
      for (int64_t i = 0; i < rows * in; ++i) dx[i] += tmp[i] * drop.factor<T>(uint64_t(i));
    });
  }

 private:
  // x itself without dropout, else drop(x) written into the scratch.
  template <class T>
  static const T* dropped(const LayerCall& call, const Dropout& drop, int64_t in) {
    const T* x = call.x.as<T>();
    if (!drop.on()) return x;
    T* d = call.scratch.as<T>();
    const int64_t n = call.rows * in;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) d[i] = x[i] * drop.factor<T>(uint64_t(i));
    return d;
  }

  double scale_;
};

}  // namespace

std::unique_ptr<Layer> make_lora(const Params& own) { return std::make_unique<Lora>(layer_params::read_lora_keys(own)); }

}  // namespace ablate::cpu_layers
