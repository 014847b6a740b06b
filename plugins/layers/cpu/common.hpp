// Shared pieces of the CPU layers: dtype dispatch and view checks, row-major BLAS wrappers for
// float and double, the dropout mask, and the dense (x W^T + b) forward/backward that linear and
// both mlps are built from.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/layer_params.hpp"
#include "ablate/mix.hpp"

namespace ablate::cpu_layers {

// Factories, one per component (defined next to each layer).
std::unique_ptr<Layer> make_embedding();
std::unique_ptr<Layer> make_learned();
std::unique_ptr<Layer> make_rope(double theta);  // [model.rope] theta
std::unique_ptr<Layer> make_layernorm();
std::unique_ptr<Layer> make_rmsnorm();
std::unique_ptr<Layer> make_linear();
std::unique_ptr<Layer> make_gelu_mlp();
std::unique_ptr<Layer> make_swiglu_mlp();
std::unique_ptr<LossLayer> make_cross_entropy(int64_t chunk_rows = 0);  // 0: 256 rows
std::unique_ptr<Layer> make_lora(const Params& own);                    // [adapter.lora] rank, alpha, dropout

// The dtype shared by every view of a call that is set; f32 or f64, on the CPU.
inline DType call_dtype(const char* layer, std::initializer_list<const TensorView*> views) {
  bool found = false;
  DType dtype = DType::f32;
  for (const TensorView* v : views) {
    if (v->data == nullptr) continue;
    if (v->device != DeviceType::cpu) {
      throw_runtime_error(layer, "every tensor must be on the cpu (got a " + std::string(to_string(v->device)) + " tensor)");
    }
    if (!found) {
      dtype = v->dtype;
      found = true;
    } else if (v->dtype != dtype) {
      throw_runtime_error(layer, std::string("all tensors of one call must share a dtype (got ") + to_string(dtype) + " and " +
                                     to_string(v->dtype) + ")");
    }
  }
  if (!found) throw_runtime_error(layer, "the call has no tensors");
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw_runtime_error(layer, std::string("runs on f32 or f64 tensors, got ") + to_string(dtype));
  }
  return dtype;
}

// Calls f(float{}) or f(double{}).
template <class F>
void dispatch(DType dtype, F&& f) {
  if (dtype == DType::f32) {
    f(float{});
  } else {
    f(double{});
  }
}

// A view the call must provide, holding at least `elements` values.
inline void require(const char* layer, const TensorView& v, const char* what, int64_t elements) {
  if (elements == 0) return;
  if (v.data == nullptr) throw_runtime_error(layer, std::string("the call has no '") + what + "' tensor");
  if (v.ndim > 0 && v.numel() < elements) {
    throw_runtime_error(layer, std::string("'") + what + "' holds " + std::to_string(v.numel()) + " values, the call needs " +
                                   std::to_string(elements));
  }
}

// One of the batch's (B, T) id arrays (tokens, targets, positions), as host memory: a CPU layer
// serves a model on the cpu device, whose batch views are the Batch itself.
inline std::span<const int32_t> require_ids(const char* layer, const LayerCall& call, TensorView BatchViews::*field,
                                            const char* what) {
  if (call.batch == nullptr) throw_runtime_error(layer, "the call has no batch");
  const TensorView& v = call.batch->*field;
  if (v.device != DeviceType::cpu || v.dtype != DType::i32)
    throw_runtime_error(layer, std::string("the batch's ") + what + " are not host i32");
  if (v.numel() != call.rows) {
    throw_runtime_error(layer, std::string("the batch has ") + std::to_string(v.numel()) + " " + what + ", the call " +
                                   std::to_string(call.rows) + " rows");
  }
  return {v.as<const int32_t>(), std::size_t(v.numel())};
}

inline void check_spec(const char* layer, const LayerCall& call) {
  if (call.spec == nullptr) throw_runtime_error(layer, "the call has no spec");
  if (call.rows < 0) throw_runtime_error(layer, "negative row count");
  if (call.spec->in <= 0) throw_runtime_error(layer, "spec.in must be positive");
}

inline bool same(const TensorView& a, const TensorView& b) { return a.data != nullptr && a.data == b.data; }

// Loops over fewer values than this run on the calling thread: starting a team costs more.
inline constexpr int64_t kParallelMin = 16384;

// --- BLAS (row-major) -----------------------------------------------------------------------------

inline int blas_dim(int64_t n) {
  if (n > INT_MAX) throw_runtime_error("cpu_layers", "matrix dimension " + std::to_string(n) + " exceeds BLAS int");
  return int(n);
}

// C(M,N) = alpha * op(A) op(B) + beta * C, row-major.
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blas_dim(M), blas_dim(N), blas_dim(K),
              alpha, A, blas_dim(lda), B, blas_dim(ldb), beta, C, blas_dim(ldc));
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda, const double* B,
                 int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blas_dim(M), blas_dim(N), blas_dim(K),
              alpha, A, blas_dim(lda), B, blas_dim(ldb), beta, C, blas_dim(ldc));
}

// y(N) += A(M,N)^T ones(M): the column sums of A added to y.
inline void add_colsum(int64_t M, int64_t N, const float* A, float* y) {
  if (M == 0 || N == 0) return;
  const std::vector<float> ones(std::size_t(M), 1.0f);
  cblas_sgemv(CblasRowMajor, CblasTrans, blas_dim(M), blas_dim(N), 1.0f, A, blas_dim(N), ones.data(), 1, 1.0f, y, 1);
}
inline void add_colsum(int64_t M, int64_t N, const double* A, double* y) {
  if (M == 0 || N == 0) return;
  const std::vector<double> ones(std::size_t(M), 1.0);
  cblas_dgemv(CblasRowMajor, CblasTrans, blas_dim(M), blas_dim(N), 1.0, A, blas_dim(N), ones.data(), 1, 1.0, y, 1);
}

// --- dropout ---------------------------------------------------------------------------------------

// Inverted dropout whose mask is a pure function of (key, element index): element i is dropped when
// a uniform number in [0, 1) drawn from splitmix64(key ^ splitmix64(i)) is below p; kept elements
// are scaled by 1/(1-p). Backward regenerates the same mask.
struct Dropout {
  double p = 0.0;
  uint64_t key = 0;
  double scale = 1.0;
  bool on() const { return p > 0.0; }
  template <class T>
  T factor(uint64_t index) const {
    const double u = double(mix64(key, index) >> 11) * 0x1.0p-53;
    return u < p ? T(0) : T(scale);
  }
};

inline Dropout make_dropout(const char* layer, const LayerCall& call) {
  Dropout d;
  if (!(call.dropout >= 0.0 && call.dropout < 1.0)) {
    throw_input_error(layer, "dropout must be in [0, 1), got " + std::to_string(call.dropout));
  }
  d.p = call.dropout;
  d.key = call.dropout_key;
  d.scale = d.p > 0.0 ? 1.0 / (1.0 - d.p) : 1.0;
  return d;
}

// Rows processed at once where a temporary (rows, out) block is needed (dropout with a residual,
// masked output gradients).
inline constexpr int64_t kDenseChunk = 128;

// --- dense: y = [residual +] dropout(x W^T + b) -----------------------------------------------------
//
// x (rows, in), W (out, in), b (out) or null, y (rows, out); residual (rows, out) or null and may be
// y itself.
template <class T>
void dense_forward(const T* x, int64_t rows, int64_t in, int64_t out, const T* W, const T* b, T* y, const T* residual,
                   const Dropout& drop) {
  if (rows == 0) return;
  if (!drop.on()) {
    T beta = T(0);
    if (residual != nullptr) {
      if (residual != y) std::memcpy(y, residual, std::size_t(rows * out) * sizeof(T));
      beta = T(1);
    }
    gemm(false, true, rows, out, in, T(1), x, in, W, in, beta, y, out);
    if (b != nullptr) {
#pragma omp parallel for schedule(static) if (rows * out >= kParallelMin)
      for (int64_t r = 0; r < rows; ++r) {
        T* yr = y + r * out;
        for (int64_t c = 0; c < out; ++c) yr[c] += b[c];
      }
    }
    return;
  }
  if (residual == nullptr) {
    gemm(false, true, rows, out, in, T(1), x, in, W, in, T(0), y, out);
#pragma omp parallel for schedule(static) if (rows * out >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      T* yr = y + r * out;
      for (int64_t c = 0; c < out; ++c) {
        const T v = b != nullptr ? yr[c] + b[c] : yr[c];
        yr[c] = v * drop.factor<T>(uint64_t(r * out + c));
      }
    }
    return;
  }
  std::vector<T> tmp(std::size_t(std::min(rows, kDenseChunk) * out));
  for (int64_t r0 = 0; r0 < rows; r0 += kDenseChunk) {
    const int64_t n = std::min(kDenseChunk, rows - r0);
    gemm(false, true, n, out, in, T(1), x + r0 * in, in, W, in, T(0), tmp.data(), out);
#pragma omp parallel for schedule(static) if (n * out >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = r0 + i;
      const T* t = tmp.data() + i * out;
      const T* res = residual + r * out;
      T* yr = y + r * out;
      for (int64_t c = 0; c < out; ++c) {
        const T v = b != nullptr ? t[c] + b[c] : t[c];
        yr[c] = res[c] + v * drop.factor<T>(uint64_t(r * out + c));
      }
    }
  }
}

// Backward of dense_forward for output gradient dy (rows, out): dx (rows, in) = dy' W (written, or
// added when accumulate; skipped when null), dW += dy'^T x (skipped when null: frozen weights),
// db += colsum(dy') (skipped when null),
// where dy' is dy with the forward's dropout mask applied.
template <class T>
void dense_backward(const T* dy, int64_t rows, int64_t in, int64_t out, const T* x, const T* W, T* dW, T* db, T* dx, bool accumulate,
                    const Dropout& drop) {
  if (rows == 0) return;
  const T beta = accumulate ? T(1) : T(0);
  if (!drop.on()) {
    if (dx != nullptr) gemm(false, false, rows, in, out, T(1), dy, out, W, in, beta, dx, in);
    if (dW != nullptr) gemm(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dW, in);
    if (db != nullptr) add_colsum(rows, out, dy, db);
    return;
  }
  std::vector<T> tmp(std::size_t(std::min(rows, kDenseChunk) * out));
  for (int64_t r0 = 0; r0 < rows; r0 += kDenseChunk) {
    const int64_t n = std::min(kDenseChunk, rows - r0);
#pragma omp parallel for schedule(static) if (n * out >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = r0 + i;
      const T* g = dy + r * out;
      T* t = tmp.data() + i * out;
      for (int64_t c = 0; c < out; ++c) t[c] = g[c] * drop.factor<T>(uint64_t(r * out + c));
    }
    if (dx != nullptr) gemm(false, false, n, in, out, T(1), tmp.data(), out, W, in, beta, dx + r0 * in, in);
    if (dW != nullptr) gemm(true, false, out, in, n, T(1), tmp.data(), out, x + r0 * in, in, T(1), dW, in);
    if (db != nullptr) add_colsum(n, out, tmp.data(), db);
  }
}

// Column blocks for deterministic scatter-adds (embedding and position tables): each thread owns a
// block of columns and walks every row in order, so each sum is formed in the same order every run.
inline constexpr int64_t kColumnBlock = 64;

}  // namespace ablate::cpu_layers
