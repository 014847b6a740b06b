// The 8-bit dynamic code of block-wise quantized optimizer state (Dettmers et al., "8-bit Optimizers
// via Block-wise Quantization", 2022): 256 sorted values in [-1, 1] (signed, for the first moment)
// or [0, 1] (unsigned, for the second), dense near zero. A block of values is stored as one fp32
// absmax and one code per value: encode = nearest code of value / absmax, decode = code * absmax.
// Header-only so the optimizer plugin and its tests share one definition.
//
// Construction (the "dynamic tree" of Dettmers 2016, as bitsandbytes builds its maps). Read a code's
// bits from the most significant: [a sign bit, signed map only], then a run of E zero bits, then a
// 1 (the indicator), then the F remaining bits form a linear fraction. The value is
//     +-10^-E * f,  f = the midpoint of the j-th of 2^F equal sub-intervals of [0.1, 1], j < 2^F,
// i.e. f = 0.1 + 0.9 * (j + 0.5) / 2^F. A larger exponent leaves fewer fraction bits, so values near
// zero span many decades while values near 1 are finely spaced.
//  - Signed: 7 bits follow the sign, E = 0..6, F = 6 - E: 64 + 32 + ... + 1 = 127 magnitudes per
//    sign, smallest 0.55e-6, largest 1 - 0.9/128 = 0.99297. All-zero bits give 0. The sign bit on 0
//    would repeat 0; that spare code holds +1 (as bitsandbytes), so the block's absmax element is exact
//    when positive. We also want it exact when negative, so -1 takes the code of the smallest
//    negative magnitude (-0.55e-6; bitsandbytes keeps that one and has no -1): 128 positive values
//    (with 1), 0, and 127 negative values (with -1, down to -3.25e-6 nearest zero).
//  - Unsigned (bitsandbytes' create_dynamic_map(signed=False)): the sign bit becomes one more
//    fraction bit: E = 0..6, F = 7 - E: 128 + 64 + ... + 2 = 254 magnitudes (smallest 0.325e-6),
//    plus 0 and 1.
// Values are computed in double and rounded once to float.
//
// Encoding is exact round-to-nearest with ties (a value exactly halfway between two codes) going to
// the code nearer zero. The code of x is the number of the 255 midpoints between neighbouring codes
// that lie below x (a negative midpoint equal to x counts too, so such a tie rounds up, towards
// zero), found by a branch-free binary search of 8 halvings over a table of float thresholds. A
// midpoint is exact in double (a sum of two floats); its threshold is the float t such that, for
// every float x, t < x exactly when the midpoint is below x (a negative midpoint: at or below x).
// encode_block gives the same codes faster: a bucket table indexed by the float's sign, exponent and
// top 5 mantissa bits (1/32 of an octave) gives the first code its bucket can reach, and the search
// finishes in 2 halvings over the 4 codes from there (no bucket reaches more than 4 codes: checked
// when the table is built). It runs 16 values side by side, so the CPU overlaps their loads. The
// halvings are adamw8bit_math.hpp's, which the CUDA kernel searches the same table with.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "adamw8bit_math.hpp"

namespace ablate::adamw8bit {

class DynamicCode {
 public:
  static constexpr int kCodes = adamw8bit::kCodes;

  // The signed map (first moment) or the unsigned map (second moment).
  static DynamicCode make(bool is_signed) {
    std::vector<double> v;
    v.reserve(kCodes);
    const int exponents = 7;
    for (int e = 0; e < exponents; ++e) {
      const int fraction_bits = (is_signed ? 6 : 7) - e;
      const int n = 1 << fraction_bits;
      const double scale = std::pow(10.0, -double(e));
      for (int j = 0; j < n; ++j) {
        const double f = 0.1 + 0.9 * (double(j) + 0.5) / double(n);
        v.push_back(scale * f);
        // The signed map's smallest negative magnitude gives its code to -1 (see above).
        if (is_signed && !(e == exponents - 1 && j == 0)) v.push_back(-scale * f);
      }
    }
    v.push_back(0.0);
    v.push_back(1.0);
    if (is_signed) v.push_back(-1.0);
    std::sort(v.begin(), v.end());
    DynamicCode c;
    for (int i = 0; i < kCodes; ++i) c.values_[std::size_t(i)] = float(v[std::size_t(i)]);
    const double inf = std::numeric_limits<double>::infinity();
    const float finf = std::numeric_limits<float>::infinity();
    c.thresholds_.fill(finf);  // entries past 255: never below any x
    c.thresholds_[0] = -finf;  // never read
    for (int k = 1; k < kCodes; ++k) {
      const double mid = (double(c.values_[std::size_t(k - 1)]) + double(c.values_[std::size_t(k)])) / 2.0;
      // Ties towards zero: a float x equal to a negative midpoint must count it (no double lies
      // between the midpoint and the one just below it).
      const double t = mid < 0.0 ? std::nextafter(mid, -inf) : mid;
      // For a float x, "t < x" is "x > the largest float <= t".
      float f = float(t);
      if (double(f) > t) f = std::nextafter(f, -finf);
      c.thresholds_[std::size_t(k)] = f;
    }
    // Buckets: every float whose (sign, clamped exponent, top mantissa bits) is the bucket's encodes
    // within [first, first + 3]. The lowest exponent bucket reaches down to 0, the highest up to inf.
    for (uint32_t sign = 0; sign < 2; ++sign) {
      for (uint32_t e = kMinExponent; e <= kMaxExponent; ++e) {
        for (uint32_t m = 0; m < (1u << kBucketBits); ++m) {
          const uint32_t first_bits = (sign << 31) | (e << 23) | (m << (23 - kBucketBits));
          const uint32_t last_bits = first_bits | ((1u << (23 - kBucketBits)) - 1);
          float a = std::bit_cast<float>(first_bits), b = std::bit_cast<float>(last_bits);
          if (e == kMinExponent) a = sign ? -0.0f : 0.0f;
          if (e == kMaxExponent) b = sign ? -finf : finf;
          const int ca = c.encode(a), cb = c.encode(b);
          const int lo = std::min(ca, cb), hi = std::max(ca, cb);
          if (hi - lo > 3) throw std::logic_error("dynamic code: a bucket reaches more than 4 codes");
          c.bucket_first_[std::size_t(bucket_of(std::bit_cast<float>(first_bits)))] = uint8_t(lo);
        }
      }
    }
    return c;
  }

  // The nearest code of x, by a binary search of 8 halvings over all 255 thresholds (x is normally
  // in [-1, 1] or [0, 1]; outside, the end code; NaN gives 0).
  uint8_t encode(float x) const noexcept { return uint8_t(search_code(thresholds_.data(), x)); }
  float decode(uint8_t code) const noexcept { return values_[code]; }

  // out[i] = encode(x[i] / scale) for i < n (scale > 0; x[i] / scale finite).
  void encode_block(const float* x, float scale, uint8_t* out, int64_t n) const noexcept {
    constexpr int kLanes = 16;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      float y[kLanes];
      int code[kLanes];
      for (int l = 0; l < kLanes; ++l) y[l] = x[i + l] / scale;
      for (int l = 0; l < kLanes; ++l) code[l] = bucket_first_[std::size_t(bucket_of(y[l]))];
      for (int half = 2; half > 0; half >>= 1) {
        for (int l = 0; l < kLanes; ++l) code[l] = search_halving(thresholds_.data(), code[l], half, y[l]);
      }
      for (int l = 0; l < kLanes; ++l) out[i + l] = uint8_t(code[l]);
    }
    for (; i < n; ++i) out[i] = encode_one(x[i] / scale);
  }

  // encode(y) through the bucket table (what encode_block does for one value).
  uint8_t encode_one(float y) const noexcept { return uint8_t(search_bucketed(thresholds_.data(), bucket_first_.data(), y)); }

  const std::array<float, kCodes>& values() const noexcept { return values_; }  // sorted ascending
  // encode()'s search table: [k] lies between values()[k-1] and values()[k]; +inf past 255.
  const std::array<float, kThresholds>& thresholds() const noexcept { return thresholds_; }
  // encode_one()'s bucket table: per bucket (adamw8bit_math.hpp's bucket_of) the first code it reaches.
  const std::array<uint8_t, kBuckets>& bucket_first() const noexcept { return bucket_first_; }
  uint8_t zero_code() const noexcept { return encode(0.0f); }

 private:
  std::array<float, kCodes> values_{};
  std::array<float, kThresholds> thresholds_{};   // [k]: between values_[k-1] and values_[k]; +inf past 255
  std::array<uint8_t, kBuckets> bucket_first_{};  // per bucket (bucket_of) the first code it reaches
};

}  // namespace ablate::adamw8bit
