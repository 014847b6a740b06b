// The `adamw8bit` step on a CUDA device: one warp per quantization block (the default block of
// 256 values is 8 per lane), reductions by warp shuffles alone, and each lane's loads of a chunk
// issued before its arithmetic. A block of one chunk (256 values or fewer) is read once and written
// once, held in registers from the update to the encoding; a longer block (up to kMaxBlockSize)
// is updated twice from the same inputs, the first pass storing nothing but giving the new absmax.
// Per element, the CPU implementation's arithmetic, from the same functions (adamw8bit_math.hpp:
// decode, the adamw update, a non-finite gradient keeping the old values, encode against the new
// absmax), spelled with round-to-nearest intrinsics (DeviceOps) so no multiply-add is contracted
// into an FMA: the codes and parameters are the CPU's bit for bit. Encoding is the CPU's bucketed
// search (adamw8bit_math.hpp's search_bucketed: the bucket table and the thresholds in shared
// memory, one load of the value's bucket and 2 halvings, three dependent loads where a binary search
// over every threshold takes eight). Under bf16 products the parameters' bf16 copy is written as
// each parameter is stored (no pass of its own).
#include "adamw8bit_kernel.hpp"

#include "ablate/device_math.hpp"

namespace ablate::adamw8bit::cuda {
namespace {

constexpr int kBlocksPerSm = 4;

// adamw8bit_math.hpp's operations, each rounded once to nearest and never contracted.
struct DeviceOps {
  static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
  static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
  static __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
  static __device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
};

// adamw's element update; returns false (and leaves m, v, p as they were) for a non-finite gradient.
__device__ __forceinline__ bool update(const Coefficients& c, float decay, float& p, float g, float& m, float& v) {
  return update_element<DeviceOps>(c, decay, p, g, m, v);
}

constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;  // quantization blocks a thread block works on at once
constexpr int kChunk = 256;               // values a warp holds at once
constexpr int kPerLane = kChunk / kWarp;

__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// The values c0 + lane + k * kWarp of a quantized block: codes, parameters and gradients loaded
// (all before the first use), moments decoded, the update applied in registers. Nothing is stored.
// Returns how many of the lane's gradients were not finite.
__device__ __forceinline__ unsigned update_chunk(const StepArgs& a, const BlockInfo& b, int c0, int lane, float decay,
                                                 const float* m_values, const float* v_values, float m_scale, float v_scale,
                                                 float (&m)[kPerLane], float (&v)[kPerLane], float (&p)[kPerLane]) {
  const uint8_t* __restrict__ mc = a.m_codes + b.state_offset;
  const uint8_t* __restrict__ vc = a.v_codes + b.state_offset;
  const float* __restrict__ params = a.params + b.param_offset;
  const float* __restrict__ grads = a.grads + b.param_offset;
  uint8_t mcode[kPerLane], vcode[kPerLane];
  float g[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = c0 + lane + k * kWarp;
    if (j < b.n) {
      mcode[k] = mc[j];
      vcode[k] = vc[j];
      p[k] = params[j];
      g[k] = grads[j];
    }
  }
  unsigned skipped = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    m[k] = 0.0f;
    v[k] = 0.0f;
    if (c0 + lane + k * kWarp < b.n) {
      m[k] = decode<DeviceOps>(m_values, mcode[k], m_scale);
      v[k] = decode<DeviceOps>(v_values, vcode[k], v_scale);
      skipped += update(a.c, decay, p[k], g[k], m[k], v[k]) ? 0u : 1u;
    }
  }
  return skipped;
}

// A block's largest |m| and v over the lane's values of one chunk (zeros past the block's end).
__device__ __forceinline__ void chunk_max(const float (&m)[kPerLane], const float (&v)[kPerLane], float& m_max, float& v_max) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    m_max = fmaxf(m_max, fabsf(m[k]));
    v_max = fmaxf(v_max, v[k]);
  }
}

// An fp32 block: the adamw update, kPerLane values a lane at a time, loads first.
__device__ __forceinline__ unsigned fp32_block(const StepArgs& a, const BlockInfo& b, int lane, float decay) {
  float* __restrict__ params = a.params + b.param_offset;
  const float* __restrict__ grads = a.grads + b.param_offset;
  float* __restrict__ m = a.m_fp32 + b.state_offset;
  float* __restrict__ v = a.v_fp32 + b.state_offset;
  unsigned skipped = 0;
  for (int c0 = 0; c0 < b.n; c0 += kChunk) {
    float pk[kPerLane], gk[kPerLane], mk[kPerLane], vk[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = c0 + lane + k * kWarp;
      if (j < b.n) {
        pk[k] = params[j];
        gk[k] = grads[j];
        mk[k] = m[j];
        vk[k] = v[j];
      }
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = c0 + lane + k * kWarp;
      if (j < b.n) {
        skipped += update(a.c, decay, pk[k], gk[k], mk[k], vk[k]) ? 0u : 1u;
        params[j] = pk[k];
        if (a.params_bf16 != nullptr) a.params_bf16[b.param_offset + j] = device_math::bf16_bits(pk[k]);
        m[j] = mk[k];
        v[j] = vk[k];
      }
    }
  }
  return skipped;
}

// At least 2 thread blocks an SM: 128 registers a thread (a few spilled) instead of the 159 the
// compiler would take for one block. Measured on an H200 (bench/results/2026-11-26-h200): 2.09 ms
// a step of GPT-2 124M against 3.52 ms for one block an SM and 3.00 ms for three (80 registers,
// spilling more).
__global__ void __launch_bounds__(kThreads, 2) step_kernel(StepArgs a) {
  if (a.grad_scale != nullptr) a.c.grad_scale = *a.grad_scale;  // the clip factor the device formed
  __shared__ float m_values[kCodes], v_values[kCodes], m_thr[kThresholds], v_thr[kThresholds];
  __shared__ uint8_t m_bucket[kBuckets], v_bucket[kBuckets];
  for (int i = threadIdx.x; i < kThresholds; i += kThreads) {
    if (i < kCodes) {
      m_values[i] = a.m_map.values[i];
      v_values[i] = a.v_map.values[i];
    }
    m_thr[i] = a.m_map.thresholds[i];
    v_thr[i] = a.v_map.thresholds[i];
  }
  for (int i = threadIdx.x; i < kBuckets; i += kThreads) {
    m_bucket[i] = a.m_map.bucket_first[i];
    v_bucket[i] = a.v_map.bucket_first[i];
  }
  __syncthreads();

  // Each warp walks its share of the quantization blocks (the block index is the same in all of
  // its lanes, so every shuffle below has all 32).
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  unsigned int skipped = 0;
  for (int64_t bi = int64_t(blockIdx.x) * kWarps + int64_t(threadIdx.x) / kWarp; bi < a.num_blocks; bi += warps) {
    const BlockInfo b = a.blocks[bi];
    const float decay = b.decay ? a.c.decay : 1.0f;
    if (!b.quantized) {
      skipped += fp32_block(a, b, lane, decay);
      continue;
    }
    // Every lane reads the old absmax here, before the shuffles that lane 0 waits on to write it.
    const float m_scale = a.m_absmax[b.absmax_index], v_scale = a.v_absmax[b.absmax_index];
    const bool one_chunk = b.n <= kChunk;
    float m[kPerLane], v[kPerLane], p[kPerLane];
    float m_max = 0.0f, v_max = 0.0f;
    if (!one_chunk) {
      for (int c0 = 0; c0 < b.n; c0 += kChunk) {
        update_chunk(a, b, c0, lane, decay, m_values, v_values, m_scale, v_scale, m, v, p);
        chunk_max(m, v, m_max, v_max);
      }
      m_max = warp_max(m_max);
      v_max = warp_max(v_max);
    }
    uint8_t* __restrict__ mc = a.m_codes + b.state_offset;
    uint8_t* __restrict__ vc = a.v_codes + b.state_offset;
    float* __restrict__ params = a.params + b.param_offset;
    for (int c0 = 0; c0 < b.n; c0 += kChunk) {
      skipped += update_chunk(a, b, c0, lane, decay, m_values, v_values, m_scale, v_scale, m, v, p);
      if (one_chunk) {
        chunk_max(m, v, m_max, v_max);
        m_max = warp_max(m_max);
        v_max = warp_max(v_max);
      }
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int j = c0 + lane + k * kWarp;
        if (j < b.n) {
          params[j] = p[k];
          if (a.params_bf16 != nullptr) a.params_bf16[b.param_offset + j] = device_math::bf16_bits(p[k]);
          mc[j] = encode_bucketed<DeviceOps>(m_thr, m_bucket, a.m_map.zero_code, m[k], m_max);
          vc[j] = encode_bucketed<DeviceOps>(v_thr, v_bucket, a.v_map.zero_code, v[k], v_max);
        }
      }
    }
    if (lane == 0) {
      a.m_absmax[b.absmax_index] = m_max;
      a.v_absmax[b.absmax_index] = v_max;
    }
  }
  if (skipped > 0) atomicAdd(a.skipped, (unsigned long long)skipped);
}

}  // namespace

cudaError_t launch_step(const StepArgs& args, cudaStream_t stream) {
  if (args.num_blocks <= 0) return cudaSuccess;
  if (args.num_blocks > 0x7fffffff) return cudaErrorInvalidValue;
  // A warp per quantization block; at most 4 thread blocks per SM (twice what its registers hold
  // at once), each warp then walking its share of the blocks.
  int device = 0, sms = 0;
  cudaError_t rc = cudaGetDevice(&device);
  if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (rc != cudaSuccess) return rc;
  const int64_t needed = (args.num_blocks + kWarps - 1) / kWarps;
  const int64_t grid = needed < int64_t(sms) * kBlocksPerSm ? needed : int64_t(sms) * kBlocksPerSm;
  step_kernel<<<unsigned(grid), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ablate::adamw8bit::cuda
