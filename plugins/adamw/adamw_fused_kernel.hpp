// The `adamw_fused` step kernel's host interface (C++17, no ablate headers: nvcc compiles the
// kernel, the plugin calls it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::adamw_fused {

// A run of consecutive parameters with one weight-decay flag: it ends (exclusive) at `end`. The
// runs are sorted and cover the buffer; the run of element i is the first with end > i.
struct DecayRun {
  int64_t end = 0;
  int32_t decay = 0;  // 1: decoupled weight decay applies
  int32_t pad = 0;
};

// The step's scalars, formed in double on the host and rounded once (as adamw does); the gradient
// used is g * grad_scale (norm clipping in the same pass).
struct Coefficients {
  float step_size, sqrt_bias2, b1, b2, eps, one_minus_b1, one_minus_b2, decay, grad_scale;
};

// One AdamW step over n elements of p, from g, updating m and v, on `stream`; where p_bf16 is not
// null, each new p is also written there rounded to bf16 (device_math::bf16_bits); where
// grad_scale is not null, the gradient's factor is that float in device memory instead of
// c.grad_scale; where c_device is not null, the coefficients are that struct in device memory
// instead of c (a captured step: written before each replay). Returns the launch's error.
cudaError_t launch_step(float* p, const float* g, float* m, float* v, uint16_t* p_bf16, int64_t n, const DecayRun* runs,
                        int32_t num_runs, const Coefficients& c, const Coefficients* c_device, const float* grad_scale,
                        cudaStream_t stream);

}  // namespace ablate::adamw_fused
