// `cross_entropy`: the fused classifier. Per row, logits z = x W^T (no bias), softmax over the
// first real_out columns, loss = logsumexp(z) - z[target]; rows whose target is -1 get loss 0 and
// no gradient. When d_x is set the same pass writes d_x = dz W and adds dz^T x to the weight
// gradient, with dz = grad_scale (softmax - onehot) (0 on padded columns). Rows are processed in
// chunks of kChunk ([model.cross_entropy] chunk_rows where set), so only (chunk, out) logits live
// at once (the scratch).
#include "common.hpp"

namespace ablate::cpu_layers {
namespace {

constexpr int64_t kChunk = 256;

class CrossEntropy final : public LossLayer {
 public:
  explicit CrossEntropy(int64_t chunk_rows) : chunk_(chunk_rows > 0 ? chunk_rows : kChunk) {}
  LayerRole role() const override { return LayerRole::classifier; }

  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    layer_params::classifier(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return std::min(rows, chunk_) * s.out; }

  void loss(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const bool with_grad = call.d_x.data != nullptr;
    const DType dt = call_dtype(kName, {&call.x, &call.params, &call.scratch, &call.losses, &call.logits, &call.d_x, &call.grads});
    layer_params::check_classifier(s);
    const int64_t rows = call.rows, in = s.in, out = s.out, real_out = s.real_out;
    require(kName, call.x, "x", rows * in);
    require(kName, call.params, "params", out * in);
    require(kName, call.losses, "losses", rows);
    require(kName, call.scratch, "scratch", std::min(rows, chunk_) * out);
    if (call.logits.data != nullptr) require(kName, call.logits, "logits", rows * out);
    if (with_grad) {
      require(kName, call.d_x, "d_x", rows * in);
      if (call.grads.data != nullptr) require(kName, call.grads, "grads", out * in);  // none: a frozen head
      if (same(call.d_x, call.x)) throw_runtime_error(kName, "d_x must not alias x");
    }
    const std::span<const int32_t> targets = require_ids(kName, call, &BatchViews::targets, "targets");
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t t = targets[std::size_t(r)];
      if (t != -1 && (t < 0 || t >= real_out)) {
        throw_input_error(kName, "target " + std::to_string(t) + " at " + std::to_string(r) + " is outside [0, " +
                                     std::to_string(real_out) + ") and not -1");
      }
    }
    const bool accumulate = call.input_grad == GradMode::accumulate;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = call.x.as<T>();
      const T* W = call.params.as<T>();
      T* z = call.scratch.as<T>();
      T* losses = call.losses.as<T>();
      T* logits = call.logits.as<T>();
      const T scale = T(call.grad_scale);
      for (int64_t r0 = 0; r0 < rows; r0 += chunk_) {
        const int64_t n = std::min(chunk_, rows - r0);
        const T* xc = x + r0 * in;
        gemm(false, true, n, out, in, T(1), xc, in, W, in, T(0), z, out);
        if (logits != nullptr) std::memcpy(logits + r0 * out, z, std::size_t(n * out) * sizeof(T));
#pragma omp parallel for schedule(static) if (n * out >= kParallelMin)
        for (int64_t i = 0; i < n; ++i) {
          const int32_t target = targets[std::size_t(r0 + i)];
          T* zr = z + i * out;
          if (target < 0) {
            losses[r0 + i] = T(0);
            if (with_grad) std::fill(zr, zr + out, T(0));
            continue;
          }
          T mx = zr[0];
          for (int64_t c = 1; c < real_out; ++c) mx = std::max(mx, zr[c]);
          double sum = 0.0;
          for (int64_t c = 0; c < real_out; ++c) sum += double(std::exp(zr[c] - mx));
          const double lse = double(mx) + std::log(sum);
          losses[r0 + i] = T(lse - double(zr[target]));
          if (with_grad) {
            const T lse_t = T(lse);
            for (int64_t c = 0; c < real_out; ++c) zr[c] = scale * std::exp(zr[c] - lse_t);
            for (int64_t c = real_out; c < out; ++c) zr[c] = T(0);
            zr[target] -= scale;
          }
        }
        if (with_grad) {
          gemm(false, false, n, in, out, T(1), z, out, W, in, accumulate ? T(1) : T(0), call.d_x.as<T>() + r0 * in, in);
          if (call.grads.data != nullptr) gemm(true, false, out, in, n, T(1), z, out, xc, in, T(1), call.grads.as<T>(), in);
        }
      }
    });
  }

 private:
  static constexpr const char* kName = "cross_entropy";
  int64_t chunk_;
};

}  // namespace

std::unique_ptr<LossLayer> make_cross_entropy(int64_t chunk_rows) { return std::make_unique<CrossEntropy>(chunk_rows); }

}  // namespace ablate::cpu_layers
