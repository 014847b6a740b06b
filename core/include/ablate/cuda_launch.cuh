// Launch shapes shared by the plugins' element-wise kernels (CUDA sources only): 256 threads a
// block, a grid capped so that large tensors are walked by grid-stride loops, never an empty grid.
#pragma once

#include <cstdint>

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
