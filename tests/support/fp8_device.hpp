// Whether the current CUDA device has FP8 matrix products (compute capability 8.9 or later; the
// emulated device answers 9.0): the GPU tests' guard for their FP8 cases.
#pragma once

#include <cuda_runtime.h>

#include "ablate/cuda_check.hpp"

namespace ablate::test {

inline bool device_has_fp8() {
  int device = 0;
  cudaDeviceProp prop{};
  ABLATE_CUDA_CHECK(cudaGetDevice(&device));
  ABLATE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.major * 10 + prop.minor >= 89;
}

}  // namespace ablate::test
