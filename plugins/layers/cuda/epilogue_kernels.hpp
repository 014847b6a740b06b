// The passes that stand in for a cuBLASLt epilogue the product cannot fuse (gemm.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::cuda_layers {

// y(rows, cols) += bias(cols) on every row (packed), enqueued on `stream`.
void launch_add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace ablate::cuda_layers
