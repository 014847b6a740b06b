// FP8 for kernels compiled by the interpreter and for the emulated libraries: the two formats of
// the OCP 8-bit floating point specification (v1.0) as CUDA names them, converted from float
// rounding to nearest even and to float exactly.
//   E4M3: bias 7, no infinities; S.1111.111 is NaN, so the largest finite is S.1111.110 = 448;
//         subnormals down to 2^-9.
//   E5M2: IEEE 754 style, bias 15: S.11111.00 is infinity, S.11111.{01,10,11} NaN; the largest
//         finite is 57344; subnormals down to 2^-16.
// __NV_SATFINITE: a value beyond the largest finite (an infinity included) becomes the largest
// finite of its sign. __NV_NOSAT: it becomes NaN in E4M3 (which has no infinity), infinity in E5M2.
// NaN converts to NaN (0x7F with the input's sign) in both.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

using __nv_fp8_storage_t = unsigned char;

enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

namespace ablate_emu_fp8 {

struct Format {
  int man_bits;  // explicit mantissa bits
  int emin;      // exponent of the smallest normal
  double max;    // largest finite
};
inline Format format(__nv_fp8_interpretation_t f) { return f == __NV_E4M3 ? Format{3, -6, 448.0} : Format{2, -14, 57344.0}; }

}  // namespace ablate_emu_fp8

inline __nv_fp8_storage_t __nv_cvt_double_to_fp8(double x, __nv_saturation_t saturate, __nv_fp8_interpretation_t kind) {
  const ablate_emu_fp8::Format f = ablate_emu_fp8::format(kind);
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  if (std::isnan(x)) return __nv_fp8_storage_t(sign | 0x7Fu);
  const double a = std::fabs(x);
  const auto overflow = [&]() -> __nv_fp8_storage_t {
    if (saturate == __NV_SATFINITE) return __nv_fp8_storage_t(sign | (kind == __NV_E4M3 ? 0x7Eu : 0x7Bu));
    return __nv_fp8_storage_t(sign | (kind == __NV_E4M3 ? 0x7Fu : 0x7Cu));
  };
  if (std::isinf(a)) return overflow();
  if (a == 0.0) return __nv_fp8_storage_t(sign);
  // The spacing of the format at a's binade (the subnormals' below the smallest normal); a / q is
  // exact in double and nearbyint rounds it to nearest even.
  int e = std::ilogb(a);
  if (e < f.emin) e = f.emin;
  const double q = std::ldexp(1.0, e - f.man_bits);
  const double r = std::nearbyint(a / q) * q;
  if (r > f.max) return overflow();
  if (r == 0.0) return __nv_fp8_storage_t(sign);
  const int re = std::ilogb(r);
  unsigned field, mantissa;
  if (re < f.emin) {  // subnormal
    field = 0;
    mantissa = unsigned(std::ldexp(r, f.man_bits - f.emin));
  } else {
    field = unsigned(re - f.emin + 1);
    mantissa = unsigned(std::ldexp(r, f.man_bits - re)) - (1u << f.man_bits);
  }
  return __nv_fp8_storage_t(sign | (field << f.man_bits) | mantissa);
}

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate, __nv_fp8_interpretation_t kind) {
  return __nv_cvt_double_to_fp8(double(x), saturate, kind);
}

// The value of an FP8 code, exactly (every FP8 value is a float).
inline float ablate_emu_fp8_to_float(__nv_fp8_storage_t x, __nv_fp8_interpretation_t kind) {
  const ablate_emu_fp8::Format f = ablate_emu_fp8::format(kind);
  const bool negative = (x & 0x80u) != 0;
  const unsigned field = (x & 0x7Fu) >> f.man_bits, mantissa = x & ((1u << f.man_bits) - 1u);
  const unsigned top = kind == __NV_E4M3 ? 15u : 31u;
  float v;
  if (kind == __NV_E4M3 && field == top && mantissa == (1u << f.man_bits) - 1u) {
    v = NAN;
  } else if (kind == __NV_E5M2 && field == top) {
    v = mantissa == 0 ? INFINITY : NAN;
  } else if (field == 0) {
    v = float(std::ldexp(double(mantissa), f.emin - f.man_bits));
  } else {
    v = float(std::ldexp(double(mantissa + (1u << f.man_bits)), int(field) - 1 + f.emin - f.man_bits));
  }
  return negative ? -v : v;
}

struct __nv_fp8_e4m3 {
  __nv_fp8_storage_t __x;
  __nv_fp8_e4m3() = default;
  explicit __nv_fp8_e4m3(float f) : __x(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)) {}
  explicit operator float() const { return ablate_emu_fp8_to_float(__x, __NV_E4M3); }
};
struct __nv_fp8_e5m2 {
  __nv_fp8_storage_t __x;
  __nv_fp8_e5m2() = default;
  explicit __nv_fp8_e5m2(float f) : __x(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2)) {}
  explicit operator float() const { return ablate_emu_fp8_to_float(__x, __NV_E5M2); }
};
