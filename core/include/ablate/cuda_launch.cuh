// Launch shapes shared by the plugins' element-wise kernels (CUDA sources only): 256 threads a
// block, a grid capped so that large tensors are walked by grid-stride loops, never an empty grid.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ablate/device_math.hpp"

namespace ablate::cuda {

inline constexpr int kThreads = 256;

// Blocks for n elements at one element a thread, at least 1 (an empty grid is a launch error) and at
// most 65535 * 16; the kernels' grid-stride loops cover the rest.
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : (b < 65535 * 16 ? b : 65535 * 16));
}

}  // namespace ablate::cuda

// for (i = this thread's first element; i < n; i += every thread of the grid)
#define ABLATE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

namespace ablate::cuda {

namespace detail {
static __global__ void to_bf16_kernel(const float* src, uint16_t* dst, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) dst[i] = device_math::bf16_bits(src[i]);
}
static __global__ void from_bf16_kernel(const uint16_t* src, float* dst, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) dst[i] = device_math::bf16_value(src[i]);
}
}  // namespace detail

// dst[i] = the nearest bf16 of src[i] (device_math::bf16_bits), i < n, enqueued on `stream`: the
// one f32 -> bf16 conversion of the CUDA plugins (the device's weight copy, operands, cuDNN's inputs).
inline void launch_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  if (n > 0) detail::to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
}

// dst[i] = the f32 value of the bf16 src[i] (exact), i < n, enqueued on `stream`.
inline void launch_bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n > 0) detail::from_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
}

}  // namespace ablate::cuda
