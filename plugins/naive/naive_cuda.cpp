// The `naive_cuda` attention backend: exact causal softmax attention on a CUDA device in f32, with
// every score materialised: the baseline `cudnn_flash` must beat, and the fallback where cuDNN
// cannot serve. Per (row b, head h), as one batched cuBLAS product over all of them:
//   S = scale Q K^T          (T x T; GQA: head h reads kv head h / (H / Hkv))
//   P = softmax(S) masked    (keys [segment start, i] of query i's own segment; lse kept in `saved`)
//   O = P V
// Backward recomputes S and P from q, k and lse, then
//   dP = dO V^T,  D_i = dot(dO_i, O_i),  dS = P (dP - D),  dQ = scale dS K,
//   dK = scale dS^T Q,  dV = P^T dO
// (with GQA, dK and dV per query head into a workspace, then summed over each group in head order,
// so every result is the same run to run). Padding positions see no key: their P rows are zero, so
// their outputs and every gradient through them are zero. Work is T^2 per (b, h) whatever the
// segments: this is the naive baseline, and its memory is two (B, H, T, T) f32 blocks in backward
// (supports() refuses a problem whose blocks exceed 32 GiB).
//
// cuBLAS is column-major: a row-major X (r x c, leading dimension ld) is the column-major X^T, so
// each product below is written for the transposes (the comment at each call gives the row-major
// product it computes). run.dtype = "tf32" runs the products on TF32 tensor cores, and so does
// "bf16". Under "bf16" the model may hold q, k, v, the output and the gradients in bf16
// (bf16_activations, bf16_gradients): they are widened to f32 copies in the workspace (exactly)
// and the outputs (out, d_q, d_k, d_v) rounded to bf16 once at the end (device_math::bf16_bits),
// so the arithmetic is the f32 one on the bf16 values.
//
// FP8 attention ([attention.naive_cuda] fp8 = true, under run.dtype "fp8" or "fp8_e4m3"): the
// reference of what an FP8 attention computes, at naive speed, for ablations of its numerics. The
// products read FP8 values, each tensor rounded on its f32 copy to the FP8 values a product would
// read (launch_fp8_round_*: fp8(x s) / s, nearest even, saturating), the arithmetic between them
// f32 as above (true f32 products, not TF32):
//   q, k, v     E4M3, each tensor scaled by its own amax (current scaling), in both passes (the
//               same values, so the same codes);
//   P           E4M3 with the fixed scale 448 (probabilities never exceed 1) before it meets V,
//               forward and in dV = P^T dO; the softmax, its lse and its backward use P unrounded;
//   dO          E5M2 under "fp8" (E4M3 under "fp8_e4m3"), its own amax, for dP = dO V^T, for dV and
//               for D = rowsum(dO * O) (so that D is the row sum of P dP over the rounded values);
//   dS          E5M2 ("fp8") or E4M3, its own amax, before dQ = scale dS K and dK = scale dS^T Q.
// O and the gradients are written in bf16 as under bf16. The model holds q, k, v, out and their
// gradients in bf16 under an FP8 run.dtype; supports() refuses a problem that does not.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <mutex>
#include <string>

#include "ablate/attention.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "attention_kernels.hpp"

namespace ablate::naive_cuda {
namespace {

constexpr const char* kWhere = "naive_cuda";
constexpr double kMaxScoreBytes = 32.0 * double(1ull << 30);

void check_cublas(cublasStatus_t rc, const char* call, const char* file, int line) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw_runtime_error(std::string(file) + ":" + std::to_string(line),
                      std::string(call) + " failed: " + cublasGetStatusName(rc) + ": " + cublasGetStatusString(rc));
}
#define ABLATE_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

// Scratch slots, each grown on the stream and kept (cuda::StreamScratch).
class Workspace {
 public:
  void* get(int slot, std::size_t bytes, cudaStream_t stream) { return slots_[slot].get(bytes, stream); }

 private:
  cuda::StreamScratch slots_[8];
};

enum Slot { kSegStart, kScores, kGradScores, kRowD, kPointers, kGroupTmp, kWide, kAmax };
enum AmaxOf { kAmaxQ, kAmaxK, kAmaxV, kAmaxDO, kAmaxDS, kAmaxCount };

// FP8 attention: on, and the gradients' format (E5M2 under run.dtype "fp8", E4M3 under "fp8_e4m3").
struct Fp8Attention {
  bool on = false;
  bool e5m2_grads = true;
};
enum Ptr { kQ, kK, kV, kO, kS, kDO, kDS, kDQ, kDK, kDV, kPtrCount };

class NaiveCuda final : public Attention {
 public:
  // FP8 attention's products run in true f32: TF32's rounding of the FP8 values times their inverse
  // scales would be a rounding point of its own.
  NaiveCuda(bool tf32, Fp8Attention fp8) : tf32_(tf32 && !fp8.on), fp8_(fp8) {}
  ~NaiveCuda() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }

  std::string supports(const AttentionProblem& p) const override {
    if (p.device != DeviceType::cuda) return "naive_cuda runs on a CUDA device (run.device = \"cuda\")";
    if (p.dtype != DType::f32) {
      return std::string("naive_cuda computes in f32 with f32 gradients (q, k, v and out may be bf16); the problem is ") +
             to_string(p.dtype);
    }
    if (p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0) return "heads, kv_heads and head_dim must be positive";
    if (p.heads % p.kv_heads != 0) {
      return "heads (" + std::to_string(p.heads) + ") is not a multiple of kv_heads (" + std::to_string(p.kv_heads) + ")";
    }
    if (fp8_.on && !(p.bf16_qkv && p.bf16_out && p.bf16_grads)) {
      return "naive_cuda's FP8 attention ([attention.naive_cuda] fp8) reads q, k, v, out and their gradients held in bf16, as "
             "the model holds them under run.dtype \"fp8\" or \"fp8_e4m3\"; this problem holds some in f32";
    }
    const double bytes = 2.0 * double(p.batch) * p.heads * double(p.seq_len) * double(p.seq_len) * sizeof(float);
    if (bytes > kMaxScoreBytes) {
      return "its backward holds two (B, H, T, T) f32 score blocks, " + std::to_string(int64_t(bytes / double(1 << 20))) +
             " MiB at batch " + std::to_string(p.batch) + " x seq_len " + std::to_string(p.seq_len) +
             " (at most 32 GiB): use a smaller micro-batch or a flash backend";
    }
    return "";
  }

  int64_t saved_elements(const AttentionProblem& p) const override { return int64_t(p.batch) * p.heads * p.seq_len; }

  // The workspace slots at their largest (backward's): scores and their gradients (B*H*T*T each),
  // a row value per (b, h, t), with GQA the per-query-head dK and dV, the segment starts, the
  // batched products' pointer arrays, and the f32 copies of the tensors held in bf16.
  int64_t workspace_bytes(const AttentionProblem& p) const override {
    const int64_t z = int64_t(p.batch) * p.heads, T = p.seq_len, positions = int64_t(p.batch) * T;
    int64_t bytes = 2 * z * T * T * 4 + z * T * 4 + positions * 4 + int64_t(kPtrCount) * z * 8;
    if (p.kv_heads > 0 && p.heads / p.kv_heads > 1) bytes += 2 * positions * p.heads * p.head_dim * 4;
    return bytes + wide_elements(p) * 4 + (fp8_.on ? int64_t(kAmaxCount) * 4 : 0);
  }

  bool bf16_activations() const override { return true; }
  bool bf16_gradients() const override { return true; }

  void forward(const AttentionCall& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_attention_forward_tensors(kWhere, c, DeviceType::cuda);
    const AttentionProblem& p = *c.problem;
    const BatchViews& batch = *c.batch;
    const TensorView &q = c.q, &k = c.k, &v = c.v, &out = c.out, &saved = c.saved;
    check(p, batch, saved);
    const Dims d = dims(p);
    if (d.z == 0 || d.T == 0) return;
    const cudaStream_t st = prepare(p, batch, c.stream);
    float* scores = static_cast<float*>(ws_.get(kScores, std::size_t(d.z * d.T * d.T) * sizeof(float), st));
    const Wide w = widen(p, {q, k, v, {}, {}, {}, {}, {}}, st);
    round_qkv(p, w, st);
    float* o = p.bf16_out ? w.out : out.as<float>();
    fill(kQ, w.q, d.qb, d.D, 1, st);
    fill(kK, w.k, d.kb, d.D, d.group, st);
    fill(kV, w.v, d.kb, d.D, d.group, st);
    fill(kO, o, d.qb, d.D, 1, st);
    fill(kS, scores, d.H * d.T * d.T, d.T * d.T, 1, st);
    // S (T_q x T_k) = scale Q K^T
    batched(CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, d.D, d.scale, kK, d.kld, kQ, d.qld, 0.0f, kS, d.T, d.z);
    launch_softmax_rows(scores, saved.as<float>(), seg_start_, d.B, d.H, d.T, st);
    if (fp8_.on) launch_fp8_round_fixed(scores, d.z * d.T * d.T, kProbScale, false, st);  // P as it meets V
    // O (T_q x D) = P V
    batched(CUBLAS_OP_N, CUBLAS_OP_N, d.D, d.T, d.T, 1.0f, kV, d.kld, kS, d.T, 0.0f, kO, d.qld, d.z);
    if (p.bf16_out) launch_round_bf16(o, static_cast<uint16_t*>(out.data), d.B * d.qb, st);
    check_launch();
  }

  void backward(const AttentionCall& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_attention_backward_tensors(kWhere, c, DeviceType::cuda);
    const AttentionProblem& p = *c.problem;
    const BatchViews& batch = *c.batch;
    const TensorView &q = c.q, &k = c.k, &v = c.v, &out = c.out, &saved = c.saved, &d_out = c.d_out, &d_q = c.d_q, &d_k = c.d_k,
                     &d_v = c.d_v;
    check(p, batch, saved);
    const Dims d = dims(p);
    if (d.z == 0 || d.T == 0) return;
    const cudaStream_t st = prepare(p, batch, c.stream);
    const std::size_t block = std::size_t(d.z * d.T * d.T) * sizeof(float);
    float* probs = static_cast<float*>(ws_.get(kScores, block, st));
    float* grads = static_cast<float*>(ws_.get(kGradScores, block, st));
    float* d_row = static_cast<float*>(ws_.get(kRowD, std::size_t(d.z * d.T) * sizeof(float), st));
    // With GQA, dK and dV of each query head first (B, T, H, D each), then their group sums.
    const Wide w = widen(p, {q, k, v, out, d_out, d_q, d_k, d_v}, st);
    float* amax = round_qkv(p, w, st);
    if (fp8_.on) round_current(w.d_out, d.B * d.qb, amax + kAmaxDO, fp8_.e5m2_grads, st);
    float* dk_heads = w.d_k;
    float* dv_heads = w.d_v;
    int64_t kv_head_ld = d.kld, kv_head_b = d.kb;
    if (d.group > 1) {
      float* tmp = static_cast<float*>(ws_.get(kGroupTmp, 2 * std::size_t(d.B * d.T * d.H * d.D) * sizeof(float), st));
      dk_heads = tmp;
      dv_heads = tmp + d.B * d.T * d.H * d.D;
      kv_head_ld = d.qld;
      kv_head_b = d.qb;
    }
    fill(kQ, w.q, d.qb, d.D, 1, st);
    fill(kK, w.k, d.kb, d.D, d.group, st);
    fill(kV, w.v, d.kb, d.D, d.group, st);
    fill(kS, probs, d.H * d.T * d.T, d.T * d.T, 1, st);
    fill(kDO, w.d_out, d.qb, d.D, 1, st);
    fill(kDS, grads, d.H * d.T * d.T, d.T * d.T, 1, st);
    fill(kDQ, w.d_q, d.qb, d.D, 1, st);
    fill(kDK, dk_heads, kv_head_b, d.D, 1, st);
    fill(kDV, dv_heads, kv_head_b, d.D, 1, st);
    // S = scale Q K^T, then P from the saved lse (in place).
    batched(CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, d.D, d.scale, kK, d.kld, kQ, d.qld, 0.0f, kS, d.T, d.z);
    launch_recompute_p(probs, saved.as<const float>(), seg_start_, d.B, d.H, d.T, st);
    // dP (T_q x T_k) = dO V^T
    batched(CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, d.D, 1.0f, kV, d.kld, kDO, d.qld, 0.0f, kDS, d.T, d.z);
    launch_row_dot(w.d_out, w.out, d_row, d.B, d.T, d.H, d.D, st);
    launch_softmax_backward(probs, grads, d_row, d.B, d.H, d.T, st);  // dP -> dS
    if (fp8_.on) {                                                    // dS as dQ's and dK's products read it, P as dV's
      round_current(grads, d.z * d.T * d.T, amax + kAmaxDS, fp8_.e5m2_grads, st);
      launch_fp8_round_fixed(probs, d.z * d.T * d.T, kProbScale, false, st);
    }
    // dQ (T_q x D) = scale dS K
    batched(CUBLAS_OP_N, CUBLAS_OP_N, d.D, d.T, d.T, d.scale, kK, d.kld, kDS, d.T, 0.0f, kDQ, d.qld, d.z);
    // dK (T_k x D) = scale dS^T Q, per query head
    batched(CUBLAS_OP_N, CUBLAS_OP_T, d.D, d.T, d.T, d.scale, kQ, d.qld, kDS, d.T, 0.0f, kDK, kv_head_ld, d.z);
    // dV (T_k x D) = P^T dO, per query head
    batched(CUBLAS_OP_N, CUBLAS_OP_T, d.D, d.T, d.T, 1.0f, kDO, d.qld, kS, d.T, 0.0f, kDV, kv_head_ld, d.z);
    if (d.group > 1) {
      launch_group_sum(dk_heads, w.d_k, d.B, d.T, d.H, d.Hkv, d.D, st);
      launch_group_sum(dv_heads, w.d_v, d.B, d.T, d.H, d.Hkv, d.D, st);
    }
    if (p.bf16_grads) {  // the f32 gradients rounded once into the problem's bf16 ones
      launch_round_bf16(w.d_q, static_cast<uint16_t*>(d_q.data), d.B * d.qb, st);
      launch_round_bf16(w.d_k, static_cast<uint16_t*>(d_k.data), d.B * d.kb, st);
      launch_round_bf16(w.d_v, static_cast<uint16_t*>(d_v.data), d.B * d.kb, st);
    }
    check_launch();
  }

 private:
  struct Dims {
    int64_t B, T, H, Hkv, D, group, z;
    int64_t qld, kld;  // row strides of q (and out, d_q, d_out) and of k (and v)
    int64_t qb, kb;    // strides between batch rows
    float scale;
  };

  static Dims dims(const AttentionProblem& p) {
    Dims d{};
    d.B = p.batch;
    d.T = p.seq_len;
    d.H = p.heads;
    d.Hkv = p.kv_heads;
    d.D = p.head_dim;
    d.group = d.H / d.Hkv;
    d.z = d.B * d.H;
    d.qld = d.H * d.D;
    d.kld = d.Hkv * d.D;
    d.qb = d.T * d.qld;
    d.kb = d.T * d.kld;
    d.scale = float(1.0 / std::sqrt(double(d.D)));
    return d;
  }

  // Values (f32) of the copies the tensors held in bf16 take: q and out (B T H D), k and v
  // (B T Hkv D) each; with bf16 gradients d_out and d_q (B T H D), d_k and d_v (B T Hkv D).
  static int64_t wide_elements(const AttentionProblem& p) {
    const int64_t positions = int64_t(p.batch) * p.seq_len, nq = positions * p.heads * p.head_dim,
                  nkv = positions * p.kv_heads * p.head_dim;
    return (p.bf16_qkv ? nq + 2 * nkv : 0) + (p.bf16_out ? nq : 0) + (p.bf16_grads ? 2 * nq + 2 * nkv : 0);
  }

  // The tensors of a pass (forward passes none for out and the gradients: it rounds its own out).
  struct Tensors {
    TensorView q, k, v, out, d_out, d_q, d_k, d_v;
  };
  // The f32 tensors the products read and write: the problem's own, or for those held in bf16
  // their f32 copies in the workspace. Inputs given are widened (exactly); forward's out and
  // backward's d_q, d_k, d_v are only given room (the caller rounds them into the bf16 tensors).
  struct Wide {
    float *q, *k, *v, *out, *d_out, *d_q, *d_k, *d_v;
  };
  Wide widen(const AttentionProblem& p, const Tensors& in, cudaStream_t st) {
    const auto f = [](const TensorView& t) { return static_cast<float*>(t.data); };
    Wide w{f(in.q), f(in.k), f(in.v), f(in.out), f(in.d_out), f(in.d_q), f(in.d_k), f(in.d_v)};
    if (!p.bf16_qkv && !p.bf16_out && !p.bf16_grads) return w;
    float* at = static_cast<float*>(ws_.get(kWide, std::size_t(wide_elements(p)) * sizeof(float), st));
    const auto copy = [&](TensorView t, int64_t n) {
      float* dst = at;
      at += n;
      if (t.data != nullptr) launch_widen_bf16(static_cast<const uint16_t*>(t.data), dst, n, st);
      return dst;
    };
    const int64_t positions = int64_t(p.batch) * p.seq_len, nq = positions * p.heads * p.head_dim,
                  nkv = positions * p.kv_heads * p.head_dim;
    if (p.bf16_qkv) {
      w.q = copy(in.q, nq);
      w.k = copy(in.k, nkv);
      w.v = copy(in.v, nkv);
    }
    if (p.bf16_out) w.out = copy(in.out, nq);
    if (p.bf16_grads) {
      w.d_out = copy(in.d_out, nq);
      w.d_q = copy(TensorView{}, nq);
      w.d_k = copy(TensorView{}, nkv);
      w.d_v = copy(TensorView{}, nkv);
    }
    return w;
  }

  // The problem, the batch's layout and saved; the tensors are check_attention_*_tensors'.
  void check(const AttentionProblem& p, const BatchViews& batch, const TensorView& saved) const {
    if (const std::string why = supports(p); !why.empty()) throw_runtime_error(kWhere, why);
    if (batch.device != DeviceType::cuda || batch.rows != p.batch || batch.seq_len != p.seq_len) {
      throw_runtime_error(kWhere, "the batch's segment layout is not on the cuda device or does not match the problem");
    }
    if (saved.device != DeviceType::cuda || saved.dtype != DType::f32 || saved.numel() != saved_elements(p)) {
      throw_runtime_error(kWhere, "saved must hold batch * heads * seq_len f32 values on the cuda device");
    }
  }

  // The handle, the stream and the per-position segment starts of this batch.
  cudaStream_t prepare(const AttentionProblem& p, const BatchViews& batch, Stream stream) {
    const cudaStream_t st = stream.as<cudaStream_t>();
    if (handle_ == nullptr) ABLATE_CUBLAS_CHECK(cublasCreate(&handle_));
    ABLATE_CUBLAS_CHECK(cublasSetStream(handle_, st));
    seg_start_ = static_cast<int32_t*>(ws_.get(kSegStart, std::size_t(p.batch) * p.seq_len * sizeof(int32_t), st));
    launch_segment_starts(batch.segments.as<const int32_t>(), batch.row_segments.as<const int32_t>(), p.batch, p.seq_len, seg_start_,
                          st);
    pointers_ = static_cast<float**>(ws_.get(kPointers, std::size_t(kPtrCount) * std::size_t(p.batch) * p.heads * sizeof(float*), st));
    z_ = int64_t(p.batch) * p.heads;
    heads_ = p.heads;
    return st;
  }

  // Pointer array `which`: base + b * stride_b + (h / group) * stride_h for every (b, h).
  void fill(Ptr which, const void* base, int64_t stride_b, int64_t stride_h, int64_t group, cudaStream_t st) {
    launch_fill_pointers(pointers_ + which * z_, static_cast<const float*>(base), z_, heads_, stride_b, stride_h, group, st);
  }

  // One batched product per (b, h), column-major: C = alpha op(A) op(B) + beta C.
  void batched(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha, Ptr a, int64_t lda, Ptr b,
               int64_t ldb, float beta, Ptr c, int64_t ldc, int64_t count) {
    const auto as_int = [](int64_t v) {
      if (v > INT32_MAX) throw_runtime_error(kWhere, "a matrix dimension exceeds cuBLAS's int: " + std::to_string(v));
      return int(v);
    };
    const void* const* A = reinterpret_cast<const void* const*>(pointers_ + a * z_);
    const void* const* B = reinterpret_cast<const void* const*>(pointers_ + b * z_);
    void* const* C = reinterpret_cast<void* const*>(pointers_ + c * z_);
    ABLATE_CUBLAS_CHECK(cublasGemmBatchedEx(handle_, ta, tb, as_int(m), as_int(n), as_int(k), &alpha, A, CUDA_R_32F, as_int(lda), B,
                                            CUDA_R_32F, as_int(ldb), &beta, C, CUDA_R_32F, as_int(ldc), as_int(count),
                                            tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // FP8 attention: the scale the probabilities are rounded with (E4M3's largest value: P <= 1).
  static constexpr float kProbScale = 448.0f;

  // FP8 attention: q, k and v's f32 copies rounded to E4M3 (each by its own amax), the amaxes'
  // slots zeroed first; returns them (null when FP8 attention is off).
  float* round_qkv(const AttentionProblem& p, const Wide& w, cudaStream_t st) {
    if (!fp8_.on) return nullptr;
    auto* amax = static_cast<float*>(ws_.get(kAmax, std::size_t(kAmaxCount) * sizeof(float), st));
    ABLATE_CUDA_CHECK(cudaMemsetAsync(amax, 0, std::size_t(kAmaxCount) * sizeof(float), st));
    const int64_t positions = int64_t(p.batch) * p.seq_len, nq = positions * p.heads * p.head_dim,
                  nkv = positions * p.kv_heads * p.head_dim;
    round_current(w.q, nq, amax + kAmaxQ, false, st);
    round_current(w.k, nkv, amax + kAmaxK, false, st);
    round_current(w.v, nkv, amax + kAmaxV, false, st);
    return amax;
  }
  // x's values rounded to FP8 scaled by x's own amax (into *amax, zero before).
  static void round_current(float* x, int64_t n, float* amax, bool e5m2, cudaStream_t st) {
    launch_fp8_amax(x, n, amax, st);
    launch_fp8_round_current(x, n, amax, e5m2, st);
  }

  static void check_launch() {
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) throw_runtime_error(kWhere, std::string("kernel launch failed: ") + cudaGetErrorString(rc));
  }

  bool tf32_;
  Fp8Attention fp8_;
  std::mutex mu_;
  cublasHandle_t handle_ = nullptr;
  Workspace ws_;
  int32_t* seg_start_ = nullptr;
  float** pointers_ = nullptr;  // kPtrCount arrays of z_ device pointers (written by a kernel)
  int64_t z_ = 0, heads_ = 0;
};

void register_components(Registrar& r) {
  ComponentInfo info;
  info.kind = Kind::attention;
  info.name = "naive_cuda";
  info.version = "1.0.0";
  info.doc =
      "exact causal attention on a CUDA device (f32 arithmetic; q, k, v, out and their gradients in bf16 under run.dtype = bf16; "
      "scores materialised, batched cuBLAS products; packed rows block-diagonal, GQA): the baseline and fallback";
  info.devices = {"cuda"};
  info.schema = {param::boolean("fp8", false,
                                "FP8 attention, the reference of its numerics at naive speed (run.dtype \"fp8\" or "
                                "\"fp8_e4m3\" only): q, k, v and the probabilities rounded to E4M3 before their "
                                "products, dO and dS to E5M2 under \"fp8\" (E4M3 under \"fp8_e4m3\"), per-tensor "
                                "current scaling (the probabilities by 448); false: attention in bf16 under FP8 runs")};
  info.factory = [](const ComponentArgs& a) -> std::unique_ptr<Component> {
    Fp8Attention fp8;
    fp8.on = a.own.has("fp8") && a.own.get_bool("fp8");
    if (fp8.on && !fp8_dtype(a.run.dtype)) {
      throw_input_error(a.own.path() + ".fp8", "true needs run.dtype = \"fp8\" or \"fp8_e4m3\" (FP8 products), got \"" + a.run.dtype +
                                                   "\"; set it false or change run.dtype");
    }
    fp8.e5m2_grads = a.run.dtype != "fp8_e4m3";
    return std::make_unique<NaiveCuda>(a.run.dtype == "tf32" || holds_bf16(a.run.dtype), fp8);
  };
  ComponentInfo everywhere = info;  // `naive`, the exact backend's name on every device (naive_cpu on the cpu)
  everywhere.name = "naive";
  everywhere.schema = {};  // the keys naive_cpu's `naive` has: FP8 attention is [attention.naive_cuda] fp8
  everywhere.doc = "exact causal softmax attention on every device (naive_cpu on the cpu, naive_cuda on cuda): the "
                   "reference backend";
  r.add(std::move(info));
  r.add(std::move(everywhere));
}

}  // namespace
}  // namespace ablate::naive_cuda

ABLATE_PLUGIN("naive_cuda", "1.0.0", ablate::naive_cuda::register_components)
