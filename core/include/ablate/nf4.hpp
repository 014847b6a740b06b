// 4-bit NormalFloat (NF4; Dettmers et al., QLoRA, 2023): weights stored as 4-bit indices into a
// code book of 16 values in [-1, 1] (quantiles of a standard normal, with an exact zero), scaled per
// block of 64 consecutive values by the block's largest magnitude (absmax, kept in fp32). The per-
// element arithmetic is shared by the cpu device and the cuda device's kernel (__host__ __device__
// under nvcc), so both dequantize to the same bits.
//
// Layout of a tensor of n values: codes (u8, ceil(n / 2)): value i in the low nibble of byte i / 2
// when i is even, in the high nibble when odd; absmax (f32, ceil(n / 64)): block b's scale.
// A value is code_book[index] * absmax[i / 64]: exact for a value that is a code-book value times
// its block's absmax (a block's absmax itself, and zero, included); otherwise within half the gap
// between the two code-book values around it, times absmax.
#pragma once

#include <cmath>
#include <cstdint>

#include "ablate/mix.hpp"  // ABLATE_HOST_DEVICE

namespace ablate::nf4 {

inline constexpr int64_t kBlock = 64;

// The code book as published with QLoRA (bitsandbytes' NF4 table), ascending.
ABLATE_HOST_DEVICE inline float code_value(uint32_t index) {
  switch (index & 15u) {
    case 0: return -1.0f;
    case 1: return -0.6961928009986877f;
    case 2: return -0.5250730514526367f;
    case 3: return -0.39491748809814453f;
    case 4: return -0.28444138169288635f;
    case 5: return -0.18477343022823334f;
    case 6: return -0.09105003625154495f;
    case 7: return 0.0f;
    case 8: return 0.07958029955625534f;
    case 9: return 0.16093020141124725f;
    case 10: return 0.24611230194568634f;
    case 11: return 0.33791524171829224f;
    case 12: return 0.44070982933044434f;
    case 13: return 0.5626170039176941f;
    case 14: return 0.7229568362236023f;
    default: return 1.0f;
  }
}

// The index of the code-book value nearest to x (x in [-1, 1]; ties to the lower index).
ABLATE_HOST_DEVICE inline uint32_t nearest_code(float x) {
  uint32_t best = 0;
  float gap = 3.0f;
  for (uint32_t i = 0; i < 16; ++i) {
    const float d = fabsf(x - code_value(i));
    if (d < gap) {
      gap = d;
      best = i;
    }
  }
  return best;
}

// Element i of a quantized tensor.
ABLATE_HOST_DEVICE inline float value(const uint8_t* codes, const float* absmax, int64_t i) {
  const uint32_t byte = codes[i / 2];
  return code_value((i & 1) ? byte >> 4 : byte & 15u) * absmax[i / kBlock];
}

inline int64_t code_bytes(int64_t n) { return (n + 1) / 2; }
inline int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
// Bytes one tensor of n values takes: its codes and its fp32 scales.
inline int64_t bytes(int64_t n) { return code_bytes(n) + 4 * blocks(n); }

// Quantizes n values (on the host): each block's absmax, then each value's nearest code of
// value / absmax (an all-zero block has absmax 0 and codes of 0.0). A value that is not finite
// cannot be quantized: returns false and leaves the output partly written.
inline bool quantize(const float* x, int64_t n, uint8_t* codes, float* absmax) {
  for (int64_t b = 0; b < blocks(n); ++b) {
    const int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
    float m = 0.0f;
    for (int64_t i = lo; i < hi; ++i) {
      if (!std::isfinite(x[i])) return false;
      m = std::fmax(m, std::fabs(x[i]));
    }
    absmax[b] = m;
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t c = m > 0.0f ? nearest_code(x[i] / m) : 7u;
      if (i % 2 == 0) codes[i / 2] = uint8_t(c);
      else codes[i / 2] = uint8_t(codes[i / 2] | (c << 4));
    }
  }
  return true;
}

}  // namespace ablate::nf4
