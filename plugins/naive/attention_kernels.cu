// `naive_cuda`'s kernels: the segment layout per position, the masked softmax rows and their
// backward, the row dots of backward, the GQA head sums and the pointer arrays of the batched
// products. Reductions are block trees in a fixed order, so results repeat run to run.
#include <cuda_fp8.h>

#include <cfloat>

#include "ablate/cuda_launch.cuh"
#include "attention_kernels.hpp"
#include "naive_math.hpp"

namespace ablate::naive_cuda {
namespace {

using cuda::blocks_for;
using cuda::kThreads;

__global__ void fill_i32(int32_t* p, int64_t n, int32_t v) { ABLATE_GRID_STRIDE(i, n) p[i] = v; }

// One block per row: its segments' positions get their segment's start.
__global__ void segment_starts_kernel(const int32_t* segments, const int32_t* row_segments, int32_t T, int32_t* seg_start) {
  const int32_t b = blockIdx.x;
  for (int32_t s = row_segments[b]; s < row_segments[b + 1]; ++s) {
    const int32_t start = segments[2 * s], length = segments[2 * s + 1];
    if (start < 0 || start >= T) continue;  // never in a batch the batchers make; no write outside the row
    const int32_t end = length < T - start ? length : T - start;
    for (int32_t t = threadIdx.x; t < end; t += blockDim.x) seg_start[int64_t(b) * T + start + t] = start;
  }
}

template <class Op>
__device__ float block_reduce(float v, float* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (int(threadIdx.x) < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const float out = shared[0];
  __syncthreads();
  return out;
}

// One block per (z, i) row of scores.
__global__ void softmax_rows_kernel(float* scores, float* lse, const int32_t* seg_start, int64_t H, int64_t T) {
  __shared__ float red[kThreads];
  const int64_t row = blockIdx.x, z = row / T, i = row % T, b = z / H;
  float* s = scores + row * T;
  const KeyRange r = key_range(seg_start[b * T + i], i);
  float mx = -FLT_MAX;
  for (int64_t j = r.lo + threadIdx.x; j <= r.hi; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = block_reduce(mx, red, [](float a, float c) { return fmaxf(a, c); });
  float sum = 0.0f;
  for (int64_t j = r.lo + threadIdx.x; j <= r.hi; j += blockDim.x) sum += expf(s[j] - mx);
  sum = block_reduce(sum, red, [](float a, float c) { return a + c; });
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) s[j] = (j >= r.lo && j <= r.hi) ? softmax_p(s[j], mx, sum) : 0.0f;
  if (threadIdx.x == 0) lse[row] = r.lo <= r.hi ? row_lse(mx, sum) : 0.0f;
}

__global__ void recompute_p_kernel(float* scores, const float* lse, const int32_t* seg_start, int64_t H, int64_t T, int64_t n) {
  ABLATE_GRID_STRIDE(k, n) {
    const int64_t row = k / T, j = k % T, z = row / T, i = row % T, b = z / H;
    const KeyRange r = key_range(seg_start[b * T + i], i);
    scores[k] = (j >= r.lo && j <= r.hi) ? softmax_p_lse(scores[k], lse[row]) : 0.0f;
  }
}

// One warp per (b, t, h): d_row[(b*H + h)*T + t] = dot(d_out, out) over D.
__global__ void row_dot_kernel(const float* d_out, const float* out, float* d_row, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; warp < B * T * H; warp += warps) {
    const int64_t h = warp % H, bt = warp / H, t = bt % T, b = bt / T;
    const float* a = d_out + warp * D;
    const float* c = out + warp * D;
    float acc = 0.0f;
    for (int64_t d = lane; d < D; d += 32) acc += a[d] * c[d];
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) d_row[(b * H + h) * T + t] = acc;
  }
}

__global__ void softmax_backward_kernel(const float* p, float* dp, const float* d_row, int64_t T, int64_t n) {
  ABLATE_GRID_STRIDE(k, n) dp[k] = softmax_ds(p[k], dp[k], d_row[k / T]);
}

__global__ void group_sum_kernel(const float* tmp, float* out, int64_t n, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t group = H / Hkv;
  ABLATE_GRID_STRIDE(k, n) {
    const int64_t d = k % D, g = (k / D) % Hkv, bt = k / (D * Hkv);
    const float* src = tmp + (bt * H + g * group) * D + d;
    float acc = 0.0f;
    for (int64_t m = 0; m < group; ++m) acc += src[m * D];
    out[k] = acc;
  }
}

__global__ void fill_pointers_kernel(float** ptrs, const float* base, int64_t count, int64_t H, int64_t stride_b, int64_t stride_h,
                                     int64_t group) {
  ABLATE_GRID_STRIDE(z, count) ptrs[z] = const_cast<float*>(base + (z / H) * stride_b + ((z % H) / group) * stride_h);
}

}  // namespace

void launch_segment_starts(const int32_t* segments, const int32_t* row_segments, int32_t rows, int32_t T, int32_t* seg_start,
                           cudaStream_t stream) {
  const int64_t n = int64_t(rows) * T;
  if (n == 0) return;
  fill_i32<<<blocks_for(n), kThreads, 0, stream>>>(seg_start, n, -1);
  segment_starts_kernel<<<unsigned(rows), kThreads, 0, stream>>>(segments, row_segments, T, seg_start);
}

void launch_softmax_rows(float* scores, float* lse, const int32_t* seg_start, int64_t B, int64_t H, int64_t T, cudaStream_t stream) {
  const int64_t rows = B * H * T;
  if (rows > 0) softmax_rows_kernel<<<unsigned(rows), kThreads, 0, stream>>>(scores, lse, seg_start, H, T);
}

void launch_recompute_p(float* scores, const float* lse, const int32_t* seg_start, int64_t B, int64_t H, int64_t T,
                        cudaStream_t stream) {
  const int64_t n = B * H * T * T;
  if (n > 0) recompute_p_kernel<<<blocks_for(n), kThreads, 0, stream>>>(scores, lse, seg_start, H, T, n);
}

void launch_row_dot(const float* d_out, const float* out, float* d_row, int64_t B, int64_t T, int64_t H, int64_t D,
                    cudaStream_t stream) {
  const int64_t warps = B * T * H;
  if (warps > 0) row_dot_kernel<<<blocks_for(warps * 32), kThreads, 0, stream>>>(d_out, out, d_row, B, T, H, D);
}

void launch_softmax_backward(const float* p, float* dp, const float* d_row, int64_t B, int64_t H, int64_t T, cudaStream_t stream) {
  const int64_t n = B * H * T * T;
  if (n > 0) softmax_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, dp, d_row, T, n);
}

void launch_group_sum(const float* tmp, float* out, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, cudaStream_t stream) {
  const int64_t n = B * T * Hkv * D;
  if (n > 0) group_sum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(tmp, out, n, H, Hkv, D);
}

void launch_fill_pointers(float** ptrs, const float* base, int64_t count, int64_t H, int64_t stride_b, int64_t stride_h, int64_t group,
                          cudaStream_t stream) {
  if (count > 0) fill_pointers_kernel<<<blocks_for(count), kThreads, 0, stream>>>(ptrs, base, count, H, stride_b, stride_h, group);
}

namespace {

// |x|'s bits: for non-negative floats integer order is float order, and NaN's bits exceed every
// number's, so an integer max keeps NaN.
__global__ void fp8_amax_kernel(const float* x, int64_t n, float* amax) {
  unsigned m = 0;
  ABLATE_GRID_STRIDE(i, n) {
    const unsigned b = __float_as_uint(x[i]) & 0x7FFFFFFFu;
    m = b > m ? b : m;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned other = __shfl_xor_sync(0xFFFFFFFFu, m, offset);
    m = other > m ? other : m;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<unsigned*>(amax), m);
}

__device__ float fp8_round(float v, float s, float inv, bool e5m2) {
  if (e5m2) return float(__nv_fp8_e5m2(v * s)) * inv;
  return float(__nv_fp8_e4m3(v * s)) * inv;
}

__global__ void fp8_round_current_kernel(float* x, int64_t n, const float* amax, bool e5m2) {
  const float a = *amax, top = e5m2 ? 57344.0f : 448.0f;
  const float s = a > 0.0f && a <= FLT_MAX ? top / a : 1.0f, inv = 1.0f / s;
  ABLATE_GRID_STRIDE(i, n) x[i] = fp8_round(x[i], s, inv, e5m2);
}

__global__ void fp8_round_fixed_kernel(float* x, int64_t n, float s, bool e5m2) {
  const float inv = 1.0f / s;
  ABLATE_GRID_STRIDE(i, n) x[i] = fp8_round(x[i], s, inv, e5m2);
}

}  // namespace

void launch_fp8_amax(const float* x, int64_t n, float* amax, cudaStream_t stream) {
  if (n > 0) fp8_amax_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, amax);
}

void launch_fp8_round_current(float* x, int64_t n, const float* amax, bool e5m2, cudaStream_t stream) {
  if (n > 0) fp8_round_current_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, amax, e5m2);
}

void launch_fp8_round_fixed(float* x, int64_t n, float scale, bool e5m2, cudaStream_t stream) {
  if (n > 0) fp8_round_fixed_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, scale, e5m2);
}

void launch_widen_bf16(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  cuda::launch_bf16_to_f32(src, dst, n, stream);
}

void launch_round_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  cuda::launch_f32_to_bf16(src, dst, n, stream);
}

}  // namespace ablate::naive_cuda
