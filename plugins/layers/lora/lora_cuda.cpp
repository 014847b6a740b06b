// LoRA on a CUDA device: the CPU twin's adapter (lora_cpu.cpp beside this file has the arithmetic and
// the parameter layout, A (rank, in) then B (out, rank)) with its products through cuBLASLt in
// fp32 whatever run.dtype says (the adapters are small; the model holds their inputs in f32) and
// the dropout masks of the CPU layers (dense_math.hpp), bit for bit the same elements dropped.
#include <cmath>

#include "ablate/layer_params.hpp"
#include "common.hpp"

namespace ablate::cuda_layers {
namespace {

constexpr const char* kName = "lora";

// C(M, N) = alpha op(A) op(B) + beta C, row-major, fp32.
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc, cudaStream_t stream) {
  if (M == 0 || N == 0 || K == 0) return;
  GemmCall g;
  g.ta = ta;
  g.tb = tb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A;
  g.lda = lda;
  g.B = B;
  g.ldb = ldb;
  g.alpha = alpha;
  g.beta = beta;
  g.D = C;
  g.ldc = ldc;
  g.mode = MatmulMode::f32;
  gemm(g, stream);
}

class Lora final : public layer_params::LoraFace {
 public:
  explicit Lora(const layer_params::LoraKeys& k) : LoraFace(k), scale_(float(scale())) {}

  // u = drop(x) A^T (saved), y += s u B^T.
  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t rows = call.rows, in = s.in, out = s.out, r = rank_;
    require_f32(kName, call.x, "x", rows * in);
    require_f32(kName, call.y, "y", rows * out);
    require_f32(kName, call.params, "params", r * (in + out));
    require_f32(kName, call.saved, "saved", rows * r);
    const DropoutArgs drop = dropout_of(kName, call);
    if (drop.p > 0.0) require_f32(kName, call.scratch, "scratch", rows * in);
    const cudaStream_t st = stream_of(call);
    const float* A = call.params.as<const float>();
    const float* B = A + r * in;
    const float* x = dropped(call, drop, in, st);
    product(false, true, rows, r, in, 1.0f, x, in, A, in, 0.0f, call.saved.as<float>(), r, st);
    product(false, true, rows, out, r, scale_, call.saved.as<const float>(), r, B, r, 1.0f, call.y.as<float>(), out, st);
    check_launch(kName);
  }

  // dB += s g^T u; t = s g B; dA += t^T drop(x); d_x += mask * (t A).
  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t rows = call.rows, in = s.in, out = s.out, r = rank_;
    require_f32(kName, call.x, "x", rows * in);
    require_f32(kName, call.d_y, "d_y", rows * out);
    require_f32(kName, call.params, "params", r * (in + out));
    require_f32(kName, call.grads, "grads", r * (in + out));
    require_f32(kName, call.saved, "saved", rows * r);
    const DropoutArgs drop = dropout_of(kName, call);
    require_f32(kName, call.scratch, "scratch", rows * ((drop.p > 0.0 ? in : 0) + r));
    if (call.d_x.data != nullptr) require_f32(kName, call.d_x, "d_x", rows * in);
    const cudaStream_t st = stream_of(call);
    const float* A = call.params.as<const float>();
    const float* B = A + r * in;
    float* dA = call.grads.as<float>();
    float* dB = dA + r * in;
    const float* u = call.saved.as<const float>();
    const float* g = call.d_y.as<const float>();
    const float* x = dropped(call, drop, in, st);
    float* t = call.scratch.as<float>() + (drop.p > 0.0 ? rows * in : 0);
    product(true, false, out, r, rows, scale_, g, out, u, r, 1.0f, dB, r, st);
    product(false, false, rows, r, out, scale_, g, out, B, r, 0.0f, t, r, st);
    product(true, false, r, in, rows, 1.0f, t, r, x, in, 1.0f, dA, in, st);
    if (call.d_x.data != nullptr) {
      float* dx = call.d_x.as<float>();
      if (drop.p == 0.0) {
        product(false, false, rows, in, r, 1.0f, t, r, A, in, 1.0f, dx, in, st);
      } else {  // drop(x) is read: (t A) goes there, then d_x += its masked values
        float* tmp = call.scratch.as<float>();
        product(false, false, rows, in, r, 1.0f, t, r, A, in, 0.0f, tmp, in, st);
        launch_dropout_residual(tmp, dx, dx, rows * in, drop, st);
      }
    }
    check_launch(kName);
  }

 private:
  // x itself without dropout, else drop(x) written into the scratch.
  static const float* dropped(const LayerCall& call, const DropoutArgs& drop, int64_t in, cudaStream_t st) {
    if (drop.p == 0.0) return call.x.as<const float>();
    float* d = call.scratch.as<float>();
    launch_dropout_residual(call.x.as<const float>(), nullptr, d, call.rows * in, drop, st);
    return d;
  }

  float scale_;
};

}  // namespace

// [adapter.lora] rank, alpha and dropout (layer_params::lora_keys; its defaults where a caller gives none).
std::unique_ptr<Layer> make_lora(const Params& own) { return std::make_unique<Lora>(layer_params::read_lora_keys(own)); }

}  // namespace ablate::cuda_layers
