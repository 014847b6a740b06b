// The cuda device's kernels: fill and scale (grid-stride, one element per thread step), the two
// reductions (per thread in double over a grid stride, a shared-memory tree per block, one partial
// per block), and one thread that sums the partials or forms the clip factor on the device. The per-element terms are core's device_math, the cpu device's own.
#include "cuda_device_kernels.hpp"

#include "ablate/cuda_launch.cuh"
#include "ablate/device_math.hpp"
#include "ablate/nf4.hpp"

namespace ablate::cuda_device {

namespace {

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = value;
}

__global__ void dequantize_nf4_kernel(const uint8_t* codes, const float* absmax, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = nf4::value(codes, absmax, i);
  }
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] = device_math::scaled(x[i], factor);
  }
}

// The block's sum of `mine` into partials[blockIdx.x] (blockDim.x == kThreads, a power of two).
__device__ void block_sum(double mine, double* partials) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = mine;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

__global__ void squared_norm_kernel(const float* x, int64_t n, double* partials) {
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    sum += device_math::square_term(x[i]);
  }
  block_sum(sum, partials);
}

__global__ void masked_loss_sum_kernel(const float* losses, const int32_t* targets, int64_t n, double* partials) {
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    sum += device_math::masked_loss_term(losses[i], targets[i]);
  }
  block_sum(sum, partials);
}

__global__ void sum_partials_kernel(const double* partials, double* out, bool add) {
  double sum = 0;
  for (int b = 0; b < kReduceBlocks; ++b) sum += partials[b];
  *out = add ? *out + sum : sum;
}

__global__ void clip_factor_kernel(const double* squared_norm, double clip, float* factor) {
  *factor = device_math::clip_factor(sqrt(*squared_norm), clip);
}

}  // namespace

void launch_fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n > 0) fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, value);
}

void launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) { cuda::launch_f32_to_bf16(x, y, n, stream); }

void launch_dequantize_nf4(const uint8_t* codes, const float* absmax, float* y, int64_t n, cudaStream_t stream) {
  if (n > 0) dequantize_nf4_kernel<<<blocks_for(n), kThreads, 0, stream>>>(codes, absmax, y, n);
}

void launch_scale(float* x, int64_t n, float factor, cudaStream_t stream) {
  if (n > 0) scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, factor);
}

void launch_squared_norm(const float* x, int64_t n, double* partials, cudaStream_t stream) {
  squared_norm_kernel<<<kReduceBlocks, kThreads, 0, stream>>>(x, n, partials);
}

void launch_masked_loss_sum(const float* losses, const int32_t* targets, int64_t n, double* partials, cudaStream_t stream) {
  masked_loss_sum_kernel<<<kReduceBlocks, kThreads, 0, stream>>>(losses, targets, n, partials);
}

void launch_sum_partials(const double* partials, double* out, bool add, cudaStream_t stream) {
  sum_partials_kernel<<<1, 1, 0, stream>>>(partials, out, add);
}

void launch_clip_factor(const double* squared_norm, double clip, float* factor, cudaStream_t stream) {
  clip_factor_kernel<<<1, 1, 0, stream>>>(squared_norm, clip, factor);
}

}  // namespace ablate::cuda_device
