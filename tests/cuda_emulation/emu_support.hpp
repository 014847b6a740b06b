// Helpers of the emu tests: run a check under every test schedule, naming the schedule in the
// failure so it can be replayed (ABLATE_EMU_SCHEDULE=<name> ctest -R <test>).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "ablate_emu/emu.hpp"

namespace ablate::emu_test {

template <class F>
void for_each_schedule(F&& f) {
  for (const emu::Schedule& s : emu::test_schedules()) {
    emu::ScopedSchedule scoped(s);
    const std::string name = s.name();
    INFO("schedule ", name, " (replay: ABLATE_EMU_SCHEDULE=", name, ")");
    f();
  }
}

}  // namespace ablate::emu_test

namespace ablate::emu_test {

// One line per kernel on standard output: its worst error against its reference over the test's
// cases (ctest -V shows it; docs/kernel-interpreter.md collects them).
inline void report_worst(const char* kernel, double worst_abs, double worst_rel) {
  std::printf("emu-worst-error %s abs %.3g rel %.3g\n", kernel, worst_abs, worst_rel);
}

}  // namespace ablate::emu_test

namespace ablate::emu_test {

// Host vectors to and from (interpreted) device memory.
template <class T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& h) {
  cuda::DeviceBuffer<T> d;
  d.upload(h.data(), h.size());
  return d;
}
template <class T>
std::vector<T> to_host(const cuda::DeviceBuffer<T>& d) {
  std::vector<T> h(d.size());
  d.download(h.data());
  return h;
}

inline uint32_t bits_of(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x = 0.0f;
  std::memcpy(&x, &u, 4);
  return x;
}
inline float bf16_to_float(uint16_t b) { return float_of(uint32_t(b) << 16); }

// The reference bf16 rounding of the kernel tests, worked out in double without reading a float's
// bit layout: the value scaled by the ulp of its binade (8 significant bits, or the subnormal ulp
// 2^-133), rounded to an integer by nearbyint (to nearest, ties to even), scaled back; 2^128 and
// above is infinity, a NaN stays a quiet NaN of its sign.
inline uint16_t bf16_nearest(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return uint16_t(sign | 0x7fc0);
  const double a = std::fabs(x);
  if (std::isinf(a)) return uint16_t(sign | 0x7f80);
  if (a == 0.0) return sign;
  int e = 0;
  (void)std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(e, -125) - 8);
  const double r = std::nearbyint(a / ulp) * ulp;
  if (r >= 0x1p128) return uint16_t(sign | 0x7f80);
  return uint16_t(sign | (bits_of(float(r)) >> 16));  // float(r) is exact: r has 8 significant bits
}

// The column sums the FP8 path's tiled kernels take (plugins/layers/cuda/fp8_kernels.hpp), in their
// order: per 32-row tile, each of 8 threads its rows y, y + 8, y + 16, y + 24 in order, then the 8
// threads in order, then the tiles in order, added to `sums`: f32 arithmetic in that order, bit for
// bit. x: rows x cols, leading dimension ld.
inline std::vector<float> tiled_column_sums(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld,
                                            std::vector<float> sums) {
  for (int64_t c = 0; c < cols; ++c) {
    float total = 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
      float tile = 0.0f;
      for (int64_t y = 0; y < 8; ++y) {
        float t = 0.0f;
        for (int64_t r = r0 + y; r < std::min(r0 + 32, rows); r += 8) t += x[std::size_t(r * ld + c)];
        tile += t;
      }
      total += tile;
    }
    sums[std::size_t(c)] += total;
  }
  return sums;
}

}  // namespace ablate::emu_test
