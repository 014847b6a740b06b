// The passes that stand in for a cuBLASLt epilogue the product cannot fuse (epilogue_kernels.hpp).
#include "epilogue_kernels.hpp"

#include "ablate/cuda_launch.cuh"

namespace ablate::cuda_layers {
namespace {

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t cols) {
  ABLATE_GRID_STRIDE(i, n) y[i] += bias[i % cols];
}

}  // namespace

void launch_add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n > 0) add_bias_kernel<<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(y, bias, n, cols);
}

}  // namespace ablate::cuda_layers
