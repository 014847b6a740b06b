// The per-element arithmetic of the norms, shared by the CUDA kernels (norm_kernels.cu) and the
// host check of them (tests/layers/test_cuda_layers_math.cpp, against the cpu_layers norms):
//   layernorm  y = (x - mean) rstd w + b,     rstd = 1 / sqrt(var + eps)
//   rmsnorm    y = x rstd w,                  rstd = 1 / sqrt(mean(x^2) + eps)
//   backward   xhat = (x - mean) rstd (rmsnorm: x rstd), dxhat = dy w,
//              layernorm dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
//              rmsnorm   dx = rstd (dxhat - xhat mean(dxhat xhat))
// Row statistics are accumulated in float by the kernels (the CPU layers use double; the tolerance
// of the device tests covers the difference).
#pragma once

#include <cmath>

#include "ablate/mix.hpp"  // ABLATE_HOST_DEVICE

namespace ablate::cuda_layers {

ABLATE_HOST_DEVICE inline float norm_rstd(float mean_square_or_var, float eps) { return 1.0f / sqrtf(mean_square_or_var + eps); }

ABLATE_HOST_DEVICE inline float layernorm_out(float x, float mean, float rstd, float w, float b) { return (x - mean) * rstd * w + b; }

ABLATE_HOST_DEVICE inline float rmsnorm_out(float x, float rstd, float w) { return x * rstd * w; }

// dx of one element from the row's means of dxhat (zero for rmsnorm) and of dxhat * xhat.
ABLATE_HOST_DEVICE inline float norm_dx(float dxhat, float xhat, float mean_dxhat, float mean_dxhat_xhat, float rstd) {
  return rstd * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
}

}  // namespace ablate::cuda_layers
