// The project's one 64-bit mixer: splitmix64's finaliser (Steele, Lea, Flood 2014), and keys
// derived from two values with it. Every seeded choice that must be a pure function of its inputs
// uses these: parameter initialisation, dropout keys and masks, sampler permutations. Host and
// device code share them (__host__ __device__ under nvcc), so a CUDA kernel draws the CPU's masks.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ABLATE_HOST_DEVICE __host__ __device__
#else
#define ABLATE_HOST_DEVICE
#endif

namespace ablate {

ABLATE_HOST_DEVICE inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A key from two values (order matters): splitmix64(a ^ splitmix64(b)).
ABLATE_HOST_DEVICE inline uint64_t mix64(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

}  // namespace ablate
