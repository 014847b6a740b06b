// The arithmetic of `adamw8bit` that its two implementations share: the CPU step
// (adamw8bit_cpu.cpp) and the CUDA kernel (adamw8bit_kernel.cu) both call these functions, so they
// compute the same values by construction. C++17, __host__ __device__ under nvcc, no CUDA headers.
//   - The code search: the code of y is the number of thresholds (DynamicCode's table, 260 floats,
//     [k] between values[k-1] and values[k], +inf past 255) below y, found in 8 halvings; or, the
//     same code with three dependent loads instead of eight, from the bucket table (indexed by y's
//     sign, exponent and top mantissa bits: the first code the bucket reaches) and 2 halvings over
//     the 4 codes from there.
//   - Block quantization: a moment is decoded as the code's value times its block's absmax and
//     encoded as the code of value / absmax (the zero code for a block whose absmax is 0).
//   - The per-element update: adamw's (PyTorch AdamW: decoupled weight decay on the parameter
//     before the moment update, bias corrections, eps after the bias-corrected sqrt(v)); an element
//     whose gradient, or its square, is not finite keeps its parameter and moments.
// Each multiply, add, divide and square root is spelled through `Ops`, rounded once to nearest: the
// CPU's plain operators (the plugin is compiled with -ffp-contract=off) or the kernel's __f*_rn
// intrinsics (nvcc would otherwise contract a multiply and an add into an FMA). Ops provides
// static mul, add, sub, div and sqrt of floats.
#pragma once

#include <cstdint>
#include <cstring>

#include "ablate/mix.hpp"  // ABLATE_HOST_DEVICE

// Inlined wherever called, on the host and in the kernel (nvcc's __forceinline__ is this
// attribute), so the kernel keeps the values it passes by reference in registers.
#define ABLATE_ADAMW8BIT_INLINE ABLATE_HOST_DEVICE inline __attribute__((always_inline))

namespace ablate::adamw8bit {

inline constexpr int kCodes = 256;
inline constexpr int kThresholds = kCodes + 4;
inline constexpr float kFloatMax = 3.402823466e+38f;  // FLT_MAX

// The bucket table's layout: exponents below 2^-23 (values under 1.2e-7, all nearest to 0) share the
// lowest row, those of 1 and above the highest; each row splits an octave into 2^kBucketBits.
inline constexpr uint32_t kMinExponent = 127 - 23, kMaxExponent = 127, kBucketBits = 5;
inline constexpr uint32_t kExponents = kMaxExponent - kMinExponent + 1;
inline constexpr int kBuckets = int(2 * kExponents) << kBucketBits;  // 1536 one-byte entries

// A step's scalars, formed in double and rounded once to float (AdamW8bitState::coefficients).
// The gradient used is g * grad_scale (norm clipping in the same pass).
struct Coefficients {
  float step_size, sqrt_bias2, b1, b2, eps, one_minus_b1, one_minus_b2, decay, grad_scale;
};

// One halving of the code search: the code moves up by `half` when its threshold lies below y.
ABLATE_ADAMW8BIT_INLINE int search_halving(const float* thresholds, int code, int half, float y) {
  return code + (half & -int(thresholds[code + half] < y));
}

// The nearest code of y: 8 halvings over all 255 thresholds, written out (no loop to unroll). y is
// normally in [-1, 1] or [0, 1]; outside, the end code; NaN gives 0.
ABLATE_ADAMW8BIT_INLINE int search_code(const float* thresholds, float y) {
  int code = search_halving(thresholds, 0, 128, y);
  code = search_halving(thresholds, code, 64, y);
  code = search_halving(thresholds, code, 32, y);
  code = search_halving(thresholds, code, 16, y);
  code = search_halving(thresholds, code, 8, y);
  code = search_halving(thresholds, code, 4, y);
  code = search_halving(thresholds, code, 2, y);
  return search_halving(thresholds, code, 1, y);
}

// The bucket of a float's bits: its sign, its exponent clamped to [kMinExponent, kMaxExponent], its
// top kBucketBits mantissa bits.
ABLATE_ADAMW8BIT_INLINE int bucket_of(float y) {
  uint32_t bits;
  memcpy(&bits, &y, sizeof bits);
  const uint32_t sign = bits >> 31;
  uint32_t e = (bits >> 23) & 0xffu;
  e = e < kMinExponent ? kMinExponent : e > kMaxExponent ? kMaxExponent : e;
  const uint32_t m = (bits >> (23 - kBucketBits)) & ((1u << kBucketBits) - 1);
  return int(((sign * kExponents + (e - kMinExponent)) << kBucketBits) | m);
}

// search_code(thresholds, y) through the bucket table `first` (DynamicCode::bucket_first(): no
// bucket reaches more than 4 codes, checked when the table is built): 3 dependent loads.
ABLATE_ADAMW8BIT_INLINE int search_bucketed(const float* thresholds, const uint8_t* first, float y) {
  const int code = search_halving(thresholds, int(first[bucket_of(y)]), 2, y);
  return search_halving(thresholds, code, 1, y);
}

// A moment from its code and its block's absmax.
template <class Ops>
ABLATE_ADAMW8BIT_INLINE float decode(const float* values, uint8_t code, float absmax) {
  return Ops::mul(values[code], absmax);
}

// The code of a moment in a block whose new absmax is `absmax` (value / absmax is in [-1, 1]
// exactly: division rounds correctly); a block whose absmax is 0 holds only zero codes.
template <class Ops>
ABLATE_ADAMW8BIT_INLINE uint8_t encode(const float* thresholds, uint8_t zero_code, float x, float absmax) {
  return absmax > 0.0f ? uint8_t(search_code(thresholds, Ops::div(x, absmax))) : zero_code;
}

// encode() through the bucket table `first`: the same code.
template <class Ops>
ABLATE_ADAMW8BIT_INLINE uint8_t encode_bucketed(const float* thresholds, const uint8_t* first, uint8_t zero_code, float x,
                                                float absmax) {
  return absmax > 0.0f ? uint8_t(search_bucketed(thresholds, first, Ops::div(x, absmax))) : zero_code;
}

// adamw's update of one element in fp32: p, m and v in and out, g the raw gradient, `decay` the
// slice's factor (c.decay, or 1 where weight decay does not apply). Every value is computed and a
// non-finite gradient's are not kept (no branches); returns whether they were.
template <class Ops>
ABLATE_ADAMW8BIT_INLINE bool update_element(const Coefficients& c, float decay, float& p, float g, float& m, float& v) {
  const float gi = Ops::mul(g, c.grad_scale);
  const bool ok = Ops::mul(gi, gi) <= kFloatMax;  // false for inf, NaN and overflow
  const float mi = Ops::add(Ops::mul(c.b1, m), Ops::mul(c.one_minus_b1, gi));
  const float vi = Ops::add(Ops::mul(c.b2, v), Ops::mul(Ops::mul(c.one_minus_b2, gi), gi));
  const float denom = Ops::add(Ops::div(Ops::sqrt(vi), c.sqrt_bias2), c.eps);
  const float pi = Ops::sub(Ops::mul(p, decay), Ops::div(Ops::mul(c.step_size, mi), denom));
  m = ok ? mi : m;
  v = ok ? vi : v;
  p = ok ? pi : p;
  return ok;
}

}  // namespace ablate::adamw8bit
