// The `adamw_fused` step: one pass over the flat fp32 buffers (parameters, gradients, both
// moments: 28 bytes of memory traffic per parameter; 30 when it also writes the bf16 copy of the
// parameters that bf16 products read, which then needs no pass of its own). Each element computes exactly what the CPU
// `adamw` does, in the same order with the same rounding: the arithmetic is spelled with the
// round-to-nearest intrinsics, so nvcc cannot contract a multiply and an add into one FMA (which
// rounds once instead of twice) and the results are bit for bit the CPU's.
#include "adamw_fused_kernel.hpp"

#include "ablate/device_math.hpp"

namespace ablate::adamw_fused {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // elements per thread and tile, kThreads apart

__device__ int find_run(const DecayRun* runs, int32_t num_runs, int64_t i) {
  int lo = 0, hi = num_runs - 1;  // the first run with end > i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (runs[mid].end > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// A thread block takes tiles of kThreads x kPerThread elements; element k of a thread is
// tile + k * kThreads + threadIdx.x, so each of a warp's loads and stores covers 128 consecutive
// bytes. Every load of the tile is issued before the first result is needed, so a thread has
// kPerThread x 4 loads in flight rather than one element's.
__global__ void __launch_bounds__(kThreads)
    step_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                uint16_t* __restrict__ p_bf16, int64_t n, const DecayRun* __restrict__ runs, int32_t num_runs, Coefficients c,
                const Coefficients* __restrict__ c_device, const float* __restrict__ grad_scale) {
  if (c_device != nullptr) c = *c_device;                 // a captured step's, written before its replay
  if (grad_scale != nullptr) c.grad_scale = *grad_scale;  // the clip factor the device formed
  const int64_t tile = int64_t(kThreads) * kPerThread;
  const int64_t stride = int64_t(gridDim.x) * tile;
  for (int64_t base = int64_t(blockIdx.x) * tile + threadIdx.x; base < n; base += stride) {
    float pk[kPerThread], gk[kPerThread], mk[kPerThread], vk[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = base + int64_t(k) * kThreads;
      if (i < n) {
        pk[k] = p[i];
        gk[k] = g[i];
        mk[k] = m[i];
        vk[k] = v[i];
      }
    }
    int r = find_run(runs, num_runs, base);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = base + int64_t(k) * kThreads;
      if (i >= n) break;
      while (runs[r].end <= i) ++r;
      const float decay = runs[r].decay ? c.decay : 1.0f;
      const float gi = __fmul_rn(gk[k], c.grad_scale);
      const float mi = __fadd_rn(__fmul_rn(c.b1, mk[k]), __fmul_rn(c.one_minus_b1, gi));
      const float vi = __fadd_rn(__fmul_rn(c.b2, vk[k]), __fmul_rn(__fmul_rn(c.one_minus_b2, gi), gi));
      m[i] = mi;
      v[i] = vi;
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.sqrt_bias2), c.eps);
      const float pi = __fsub_rn(__fmul_rn(pk[k], decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
      p[i] = pi;
      if (p_bf16 != nullptr) p_bf16[i] = device_math::bf16_bits(pi);  // the products' copy, in the same pass
    }
  }
}

}  // namespace

cudaError_t launch_step(float* p, const float* g, float* m, float* v, uint16_t* p_bf16, int64_t n, const DecayRun* runs,
                        int32_t num_runs, const Coefficients& c, const Coefficients* c_device, const float* grad_scale,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t per_block = int64_t(kThreads) * kPerThread;
  const int64_t blocks = (n + per_block - 1) / per_block;
  const int grid = int(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond that
  step_kernel<<<grid, kThreads, 0, stream>>>(p, g, m, v, p_bf16, n, runs, num_runs, c, c_device, grad_scale);
  return cudaGetLastError();
}

}  // namespace ablate::adamw_fused
