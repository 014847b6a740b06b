// The `adamw8bit` step on a CUDA device: one thread block per quantization block, its codes and
// absmax read once and written once. Per element, exactly the CPU reference's arithmetic
// (adamw8bit.cpp: decode, the adamw update, a non-finite gradient keeping the old values, the new
// absmax, encode), spelled with round-to-nearest intrinsics so no multiply-add is contracted into
// an FMA: the codes and parameters are the CPU's bit for bit. Encoding is DynamicCode::encode's
// branch-free binary search (8 halvings over the thresholds in shared memory), which gives the
// same code as the CPU's bucketed search by construction. Under bf16 products the parameters' bf16
// copy is written as each parameter is stored (no pass of its own).
#include "adamw8bit_kernel.hpp"

#include "ablate/device_math.hpp"

namespace ablate::adamw8bit::cuda {
namespace {

constexpr int kCodes = 256;
constexpr int kThresholds = kCodes + 4;
constexpr float kFloatMax = 3.402823466e+38f;

__device__ __forceinline__ int encode(const float* thresholds, float y) {
  int code = 0;
#pragma unroll
  for (int half = kCodes / 2; half > 0; half >>= 1) code += half & -int(thresholds[code + half] < y);
  return code;
}

// adamw's element update; returns false (and leaves m, v, p as they were) for a non-finite gradient.
__device__ __forceinline__ bool update(const Coefficients& c, float decay, float& p, float g, float& m, float& v) {
  const float gi = __fmul_rn(g, c.grad_scale);
  const bool ok = __fmul_rn(gi, gi) <= kFloatMax;  // false for inf, NaN and overflow
  const float mi = __fadd_rn(__fmul_rn(c.b1, m), __fmul_rn(c.one_minus_b1, gi));
  const float vi = __fadd_rn(__fmul_rn(c.b2, v), __fmul_rn(__fmul_rn(c.one_minus_b2, gi), gi));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.sqrt_bias2), c.eps);
  const float pi = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
  m = ok ? mi : m;
  v = ok ? vi : v;
  p = ok ? pi : p;
  return ok;
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < kThreads / 32 ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__global__ void __launch_bounds__(kThreads) step_kernel(StepArgs a) {
  __shared__ float m_values[kCodes], v_values[kCodes], m_thr[kThresholds], v_thr[kThresholds];
  __shared__ float reduce_scratch[kThreads / 32];
  for (int i = threadIdx.x; i < kThresholds; i += kThreads) {
    if (i < kCodes) {
      m_values[i] = a.m_map.values[i];
      v_values[i] = a.v_map.values[i];
    }
    m_thr[i] = a.m_map.thresholds[i];
    v_thr[i] = a.v_map.thresholds[i];
  }
  __syncthreads();

  // Several quantization blocks per thread block, so the code maps above are loaded once per
  // thread block rather than once per quantization block.
  unsigned int skipped = 0;
  for (int64_t bi = blockIdx.x; bi < a.num_blocks; bi += gridDim.x) {
    const BlockInfo b = a.blocks[bi];
    float* p = a.params + b.param_offset;
    const float* g = a.grads + b.param_offset;
    const float decay = b.decay ? a.c.decay : 1.0f;
    if (!b.quantized) {
      float* m = a.m_fp32 + b.state_offset;
      float* v = a.v_fp32 + b.state_offset;
      for (int j = threadIdx.x; j < b.n; j += kThreads) {
        float pj = p[j], mj = m[j], vj = v[j];
        skipped += update(a.c, decay, pj, g[j], mj, vj) ? 0u : 1u;
        p[j] = pj;
        if (a.params_bf16 != nullptr) a.params_bf16[b.param_offset + j] = device_math::bf16_bits(pj);
        m[j] = mj;
        v[j] = vj;
      }
    } else {
      uint8_t* mc = a.m_codes + b.state_offset;
      uint8_t* vc = a.v_codes + b.state_offset;
      const float m_scale = a.m_absmax[b.absmax_index], v_scale = a.v_absmax[b.absmax_index];
      float m[kPerThread], v[kPerThread];
      float m_max = 0.0f, v_max = 0.0f;
  #pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int j = threadIdx.x + k * kThreads;
        m[k] = 0.0f;
        v[k] = 0.0f;
        if (j < b.n) {
          m[k] = __fmul_rn(m_values[mc[j]], m_scale);
          v[k] = __fmul_rn(v_values[vc[j]], v_scale);
          float pj = p[j];
          skipped += update(a.c, decay, pj, g[j], m[k], v[k]) ? 0u : 1u;
          p[j] = pj;
          if (a.params_bf16 != nullptr) a.params_bf16[b.param_offset + j] = device_math::bf16_bits(pj);
          m_max = fmaxf(m_max, fabsf(m[k]));
          v_max = fmaxf(v_max, v[k]);
        }
      }
      m_max = block_max(m_max, reduce_scratch);
      v_max = block_max(v_max, reduce_scratch);
      if (threadIdx.x == 0) {  // every thread has read the old absmax before the first block_max's barrier
        a.m_absmax[b.absmax_index] = m_max;
        a.v_absmax[b.absmax_index] = v_max;
      }
  #pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int j = threadIdx.x + k * kThreads;
        if (j < b.n) {
          mc[j] = uint8_t(m_max > 0.0f ? encode(m_thr, __fdiv_rn(m[k], m_max)) : a.m_map.zero_code);
          vc[j] = uint8_t(v_max > 0.0f ? encode(v_thr, __fdiv_rn(v[k], v_max)) : a.v_map.zero_code);
        }
      }
    }
  }
  if (skipped > 0) atomicAdd(a.skipped, (unsigned long long)skipped);
}

}  // namespace

cudaError_t launch_step(const StepArgs& args, cudaStream_t stream) {
  if (args.num_blocks <= 0) return cudaSuccess;
  if (args.num_blocks > 0x7fffffff) return cudaErrorInvalidValue;
  // A few thread blocks per SM keep the memory system busy; each walks its share of the blocks.
  int device = 0, sms = 0;
  cudaError_t rc = cudaGetDevice(&device);
  if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (rc != cudaSuccess) return rc;
  const int64_t grid = args.num_blocks < int64_t(sms) * 8 ? args.num_blocks : int64_t(sms) * 8;
  step_kernel<<<unsigned(grid), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ablate::adamw8bit::cuda
