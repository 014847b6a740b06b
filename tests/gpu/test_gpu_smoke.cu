// GPU smoke test: the CUDA toolchain, the architectures we build for, and a device that runs a
// kernel. Exits 77 (CTest: skipped) when the machine has no GPU, so CI without one stays green.
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

__global__ void fill_with_index(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = float(i) * 0.5f;
}

#define CHECK_CUDA(call)                                                                                   \
  do {                                                                                                     \
    cudaError_t err_ = (call);                                                                             \
    if (err_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      return 1;                                                                                            \
    }                                                                                                      \
  } while (0)

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, compute capability %d.%d, %.1f GiB\n", prop.name, prop.major, prop.minor,
              double(prop.totalGlobalMem) / (1 << 30));
  const int n = 1000003;  // not a multiple of the block size
  float* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(float)));
  fill_with_index<<<(n + 255) / 256, 256>>>(d, n);
  CHECK_CUDA(cudaGetLastError());
  std::vector<float> h(n, -1.0f);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d));
  for (int i = 0; i < n; ++i) {
    if (h[i] != float(i) * 0.5f) {
      std::fprintf(stderr, "element %d is %g, expected %g\n", i, h[i], float(i) * 0.5f);
      return 1;
    }
  }
  std::printf("1 passed, 0 failed\n");
  return 0;
}
