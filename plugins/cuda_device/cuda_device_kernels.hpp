// Launchers of the cuda device's kernels, all on the given stream, none synchronising.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::cuda_device {

// Blocks of the reductions: each writes one double partial sum; the host (or launch_sum_partials,
// on the device) adds the partials in block order, so a sum does not depend on scheduling.
inline constexpr int kReduceBlocks = 256;
inline constexpr int kThreads = 256;

void launch_fill(float* x, int64_t n, float value, cudaStream_t stream);
void launch_scale(float* x, int64_t n, float factor, cudaStream_t stream);
// y = device_math::bf16_bits(x), elementwise.
void launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// y (n) = the NF4 values of codes and absmax (nf4.hpp), one element per thread step.
void launch_dequantize_nf4(const uint8_t* codes, const float* absmax, float* y, int64_t n, cudaStream_t stream);
// partials: kReduceBlocks doubles in device memory.
void launch_squared_norm(const float* x, int64_t n, double* partials, cudaStream_t stream);
void launch_masked_loss_sum(const float* losses, const int32_t* targets, int64_t n, double* partials, cudaStream_t stream);
// *out = the kReduceBlocks partials summed in block order from 0 (as the host sums them), or
// (add) *out + that sum: one thread.
void launch_sum_partials(const double* partials, double* out, bool add, cudaStream_t stream);
// *factor = device_math::clip_factor(sqrt(*squared_norm), clip): one thread.
void launch_clip_factor(const double* squared_norm, double clip, float* factor, cudaStream_t stream);

}  // namespace ablate::cuda_device
