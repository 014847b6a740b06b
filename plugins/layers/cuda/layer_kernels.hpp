// Launchers of the CUDA layers' kernels other than the norms (layer_kernels.cu). Every launcher
// enqueues on `stream` and returns without synchronising; the host layer checks cudaGetLastError.
// The arithmetic per element is dense_math.hpp's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::cuda_layers {

struct DropoutArgs {
  double p = 0.0;  // 0 = off
  uint64_t key = 0;
  float scale = 1.0f;  // 1 / (1 - p)
};

// y = (residual or 0) + t * mask, elementwise over n values (t may be y when residual is null).
void launch_dropout_residual(const float* t, const float* residual, float* y, int64_t n, DropoutArgs d, cudaStream_t stream);
// The same with the residual and y in bf16 (the residual stream held so): y = bf16(residual + t *
// mask), the f32 sum rounded once; y may alias the residual.
void launch_dropout_residual(const float* t, const uint16_t* residual, uint16_t* y, int64_t n, DropoutArgs d, cudaStream_t stream);
// out = dy * mask (the gradient through the forward's dropout).
void launch_dropout_grad(const float* dy, float* out, int64_t n, DropoutArgs d, cudaStream_t stream);

void launch_gelu_forward(const float* pre, float* post, int64_t n, cudaStream_t stream);
// dh *= gelu'(pre)
void launch_gelu_backward(const float* pre, float* dh, int64_t n, cudaStream_t stream);
// A GELU MLP's hidden activation kept in bf16 (bf16 products), from the f32 pre-activation t:
// pre = bf16(t), post = bf16(gelu(t)), as cuBLASLt's GELU_AUX epilogue writes them into bf16.
void launch_gelu_forward_bf16(const float* t, uint16_t* pre, uint16_t* post, int64_t n, cudaStream_t stream);
// Its gradient: dh *= gelu'(pre) with pre in bf16 (dh keeps the f32 values, for the bias gradient's
// column sums) and dpre = bf16(dh), as cuBLASLt's DGELU epilogue writes a bf16 output.
void launch_gelu_backward_bf16(const uint16_t* pre, float* dh, uint16_t* dpre, int64_t n, cudaStream_t stream);
// The same from a bf16 dh (rows x cols, an FP8 product's bf16 output), in one read: dpre =
// bf16(dh * gelu'(pre)); with db set, db(cols) += the column sums of the f32 values before that
// rounding (the bias gradient below the GELU), per 32-row tile in row order into `partials`
// (fp8_column_partials(rows, cols) floats), then over the tiles in order: the same bits run to run.
void launch_gelu_backward_bf16_sums(const uint16_t* pre, const uint16_t* dh, uint16_t* dpre, int64_t rows, int64_t cols,
                                    float* partials, float* db, cudaStream_t stream);
void launch_swiglu_forward(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream);
// From dh (held in du on entry): dg and du.
void launch_swiglu_backward(const float* g, const float* u, float* du, float* dg, int64_t n, cudaStream_t stream);
// The SwiGLU MLP with gate and up held in bf16 (bf16 products write them so): h = bf16(silu(g) u)
// from their bf16 values (widened exactly); backward from bf16 g, u and dh, dg = bf16(swiglu_dg)
// and du = bf16(swiglu_du), each the f32 kernel's value on the same inputs, rounded once.
void launch_swiglu_forward_bf16(const uint16_t* g, const uint16_t* u, uint16_t* h, int64_t n, cudaStream_t stream);
void launch_swiglu_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dh, uint16_t* dg, uint16_t* du, int64_t n,
                                 cudaStream_t stream);

// y[r, :] = table[index[r], :] * mask; an index outside [0, limit) gives a row of NaN (never a
// read out of bounds), so a bad batch shows as a non-finite loss.
void launch_gather_rows(const int32_t* index, const float* table, float* y, int64_t rows, int64_t cols, int64_t limit, DropoutArgs d,
                        cudaStream_t stream);
// The same with y in bf16 (the residual stream held so): each value rounded once.
void launch_gather_rows(const int32_t* index, const float* table, uint16_t* y, int64_t rows, int64_t cols, int64_t limit,
                        DropoutArgs d, cudaStream_t stream);
// y = x + table[index[r], :] (y may alias x); out-of-range index as above.
void launch_add_rows(const int32_t* index, const float* table, const float* x, float* y, int64_t rows, int64_t cols, int64_t limit,
                     cudaStream_t stream);
// The same with x and y in bf16: y = bf16(x + table row), the f32 sum rounded once.
void launch_add_rows(const int32_t* index, const float* table, const uint16_t* x, uint16_t* y, int64_t rows, int64_t cols,
                     int64_t limit, cudaStream_t stream);
// grads[index[r], :] += d[r, :] * mask for every row, deterministically (no atomics, the same every
// run): rows are sorted by index (stable); the sorted rows are cut into fixed chunks of 256, each
// chunk's runs of equal index summed in row order by one thread per column, a run that crosses
// chunk edges through per-chunk partials summed in chunk order. Table rows no index names are not
// touched; rows whose index is outside [0, limit) are skipped.
void scatter_add_rows(const int32_t* index, const float* d, float* grads, int64_t rows, int64_t cols, int64_t limit, DropoutArgs drop,
                      cudaStream_t stream);
// dst (rows, cols), packed, = the bf16 rounding (bf16_bits) of src (rows, cols) with leading
// dimension ld: the operands of the bf16 products.
void launch_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, cudaStream_t stream);
// dst = src, or dst += src (accumulate).
void launch_copy_or_add(const float* src, float* dst, int64_t n, bool accumulate, cudaStream_t stream);
// dst += the bf16 values src (a bias gradient cuBLASLt wrote in a bf16 output's type).
void launch_add_bf16(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);

// Rotary embedding of (rows, heads, D) in place or into dst (see dense_math.hpp); inverse for
// backward; accumulate adds into dst.
void launch_rope(const int32_t* positions, const float* src, float* dst, int64_t rows, int64_t heads, int64_t D, double theta,
                 bool inverse, bool accumulate, cudaStream_t stream);
// The forward rotation of q or k held in bf16 (computed in f32, rounded by bf16_bits), in place or not.
void launch_rope(const int32_t* positions, const uint16_t* src, uint16_t* dst, int64_t rows, int64_t heads, int64_t D, double theta,
                 cudaStream_t stream);

// db(cols) += column sums of m(rows, cols), as a cuBLASLt product with a ones vector (a fixed
// order, so the same every run).
void add_column_sums(const float* m, float* db, int64_t rows, int64_t cols, cudaStream_t stream);
// The same of bf16 values (a bf16 product of ones and m: each value exact, the sums in fp32).
void add_column_sums_bf16(const uint16_t* m, float* db, int64_t rows, int64_t cols, cudaStream_t stream);

// The classifier's rows: for each of `n` rows of logits z (n, out), the softmax over the first
// real_out columns gives losses[i] (0 where targets[i] is -1, NaN where a target is out of range)
// and, with_grad, overwrites z with scale (softmax - onehot) (0 on padded columns and ignored rows).
void launch_cross_entropy_rows(float* z, int64_t n, int64_t out, int64_t real_out, const int32_t* targets, float* losses,
                               bool with_grad, float scale, cudaStream_t stream);
// The same on logits held in bf16 (the classifier under bf16 products): one pass keeps each
// thread's running max and the sum of exp(z - max) (rescaled when the max grows, summed in double),
// the block combines them into the log-sum-exp, and with_grad a second pass overwrites z with the
// gradient rounded to bf16 (nearest even). Two passes over 2-byte logits where the f32 rows take
// three over 4-byte ones, and the gradient is the bf16 operand of the two products after it.
void launch_cross_entropy_rows_bf16(uint16_t* z, int64_t n, int64_t out, int64_t real_out, const int32_t* targets, float* losses,
                                    bool with_grad, float scale, cudaStream_t stream);

}  // namespace ablate::cuda_layers
