// Launchers of `naive_cuda`'s kernels (attention_kernels.cu). Layouts: q, out, d_q (B, T, H, D);
// k, v (B, T, Hkv, D); scores and probabilities one T x T block per (b, h) at z = b*H + h, row i =
// query i; lse and D (B, H, T). All enqueue on `stream` and return at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::naive_cuda {

// seg_start (B*T): the first position of the segment holding each position, -1 for padding, from
// the batch's segments (S, 2) and row_segments (B + 1).
void launch_segment_starts(const int32_t* segments, const int32_t* row_segments, int32_t rows, int32_t T, int32_t* seg_start,
                           cudaStream_t stream);

// Scores -> probabilities in place (keys outside a query's range become 0), lse (B, H, T).
void launch_softmax_rows(float* scores, float* lse, const int32_t* seg_start, int64_t B, int64_t H, int64_t T, cudaStream_t stream);

// Backward: scores -> probabilities in place from the saved lse.
void launch_recompute_p(float* scores, const float* lse, const int32_t* seg_start, int64_t B, int64_t H, int64_t T,
                        cudaStream_t stream);

// d_row (B, H, T) = sum over D of d_out * out.
void launch_row_dot(const float* d_out, const float* out, float* d_row, int64_t B, int64_t T, int64_t H, int64_t D,
                    cudaStream_t stream);

// dP -> dS in place: dS = P (dP - D_row).
void launch_softmax_backward(const float* p, float* dp, const float* d_row, int64_t B, int64_t H, int64_t T, cudaStream_t stream);

// out (B, T, Hkv, D) = sum over each kv head's `group` query heads of tmp (B, T, H, D), in head order.
void launch_group_sum(const float* tmp, float* out, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, cudaStream_t stream);

// ptrs[z] = base + (z / H) * stride_b + ((z % H) / group) * stride_h, for z in [0, count): the
// operands of one batched matrix product per (b, h).
void launch_fill_pointers(float** ptrs, const float* base, int64_t count, int64_t H, int64_t stride_b, int64_t stride_h, int64_t group,
                          cudaStream_t stream);

// dst[i] = the f32 value of the bf16 src[i] (exact); dst[i] = the nearest bf16 of src[i]
// (device_math::bf16_bits): q, k, v and out where the model holds them in bf16.
void launch_widen_bf16(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);
void launch_round_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream);

// FP8 attention ([attention.naive_cuda] fp8): a tensor's values rounded in place to the FP8 values
// the products would read, x = fp8(x s) / s (E4M3 when !e5m2, else E5M2; nearest even, saturating),
// per tensor:
//   current scaling: s = fp8_max / amax(x), amax taken by launch_fp8_amax into *amax (zeroed by the
//                    caller first; 1 for an amax of zero or not finite);
//   a fixed scale:   s given (the probabilities, which never exceed 1: s = 448).
void launch_fp8_amax(const float* x, int64_t n, float* amax, cudaStream_t stream);
void launch_fp8_round_current(float* x, int64_t n, const float* amax, bool e5m2, cudaStream_t stream);
void launch_fp8_round_fixed(float* x, int64_t n, float scale, bool e5m2, cudaStream_t stream);

}  // namespace ablate::naive_cuda
