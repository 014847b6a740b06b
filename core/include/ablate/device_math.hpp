// The per-element arithmetic of the Device seam's reductions, shared by the cpu device and the
// cuda device's kernels (__host__ __device__ under nvcc), so both compute the same terms and
// differ only in the order of summation.
#pragma once

#include <cstdint>

#include "ablate/mix.hpp"  // ABLATE_HOST_DEVICE

namespace ablate::device_math {

// A term of the squared norm: the square of an fp32 gradient element, in double.
ABLATE_HOST_DEVICE inline double square_term(float g) { return double(g) * double(g); }

// A term of the masked loss sum: the position's loss when it has a target, else nothing.
ABLATE_HOST_DEVICE inline double masked_loss_term(float loss, int32_t target) { return target >= 0 ? double(loss) : 0.0; }

// Clipping: an element scaled in fp32.
ABLATE_HOST_DEVICE inline float scaled(float g, float factor) { return g * factor; }

// Norm clipping's factor for a gradient of global norm `norm` under optimizer.grad_clip `clip`:
// 1 where clipping is off (clip <= 0) or the norm is within it (a NaN norm too), else
// clip / (norm + 1e-6), formed in double and rounded once to float.
ABLATE_HOST_DEVICE inline float clip_factor(double norm, double clip) {
  return clip > 0 && norm > clip ? float(clip / (norm + 1e-6)) : 1.0f;
}

// The bf16 nearest to x (its 16 bits: the high half of an f32), ties to even; a NaN stays a quiet
// NaN of the same sign, infinities stay infinite, and a finite value past bf16's largest rounds to
// infinity, as IEEE rounding does. The copies of bf16 products (weights and operands) use it.
ABLATE_HOST_DEVICE inline uint16_t bf16_bits(float x) {
  uint32_t u = 0;
#ifdef __CUDA_ARCH__
  u = __float_as_uint(x);
#else
  __builtin_memcpy(&u, &x, 4);
#endif
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) return uint16_t((u >> 16) | 0x0040u);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// The f32 a bf16 (its 16 bits) stands for: exact.
ABLATE_HOST_DEVICE inline float bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x = 0.0f;
  __builtin_memcpy(&x, &u, 4);
  return x;
#endif
}

// An activation written as the type its tensor holds: f32 as it is, bf16 (its bits) rounded by
// bf16_bits. Kernels whose output the model may hold in bf16 store through these.
ABLATE_HOST_DEVICE inline void store_value(float* p, float v) { *p = v; }
ABLATE_HOST_DEVICE inline void store_value(uint16_t* p, float v) { *p = bf16_bits(v); }
// And read back as f32 (exactly).
ABLATE_HOST_DEVICE inline float load_value(float v) { return v; }
ABLATE_HOST_DEVICE inline float load_value(uint16_t bits) { return bf16_value(bits); }

}  // namespace ablate::device_math
