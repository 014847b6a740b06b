// Timing on a CUDA stream for the GPU benchmarks: the median of CUDA-event times, and the device's
// copy bandwidth (the rate memory-bound passes are predicted at).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "ablate/cuda_check.hpp"

namespace ablate::bench {

// Median milliseconds of `call` (which enqueues work on `stream`) over `iters` timed calls, after
// `warmup` untimed ones (plan and graph builds, first-touch allocations).
template <class F>
double median_event_ms(cudaStream_t stream, int iters, F&& call, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) call();
  cudaEvent_t start = nullptr, stop = nullptr;
  ABLATE_CUDA_CHECK(cudaEventCreate(&start));
  ABLATE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, iters); ++i) {
    ABLATE_CUDA_CHECK(cudaEventRecord(start, stream));
    call();
    ABLATE_CUDA_CHECK(cudaEventRecord(stop, stream));
    ABLATE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    ABLATE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Bytes read plus bytes written per second by a device-to-device copy of `bytes` (1 GiB unless
// told) on `stream`.
inline double copy_bandwidth(cudaStream_t stream, std::size_t bytes = std::size_t(1) << 30) {
  cuda::DeviceBuffer<unsigned char> src(bytes), dst(bytes);
  src.fill_zero();
  const double ms = median_event_ms(stream, 5, [&] {
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * double(bytes) / (ms * 1e-3);
}

}  // namespace ablate::bench
