// The FP8 scaling kernels of the CUDA layers (plugins/layers/cuda/fp8_kernels.cu), run by the kernel
// interpreter through their launchers under every test schedule, against definitions written here:
// FP8 rounding as the nearest value of the format's table (built from the OCP FP8 definition: sign,
// exponent field, mantissa; ties to the even code; beyond the largest finite value, that value),
// amax as the largest |x| (NaN kept), the packed and transposed layouts by index, and the slots'
// update by a host simulation of the amax history (its max passes over NaNs; a NaN or zero keeps
// the scale). Odd sizes, strided sources, a tile-crossing transpose, saturation counted.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "emu_support.hpp"
#include "fp8_kernels.hpp"

using namespace ablate;
using ablate::cuda_layers::Fp8Format;
using ablate::emu_test::for_each_schedule;
using ablate::emu_test::to_device;
using ablate::emu_test::to_host;

namespace {

struct Entry {
  double value;
  uint8_t code;
};

// The format's non-negative finite values with their codes, increasing.
std::vector<Entry> table(Fp8Format f) {
  const bool e4m3 = f == Fp8Format::e4m3;
  const int man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, fields = e4m3 ? 16 : 31;
  std::vector<Entry> t;
  for (int e = 0; e < fields; ++e) {
    for (int m = 0; m < (1 << man); ++m) {
      if (e4m3 && e == 15 && m == 7) continue;
      const double v = e == 0 ? std::ldexp(m, 1 - bias - man) : std::ldexp((1 << man) + m, e - bias - man);
      t.push_back({v, uint8_t((e << man) | m)});
    }
  }
  return t;
}

// The saturating round to nearest even of a float, from the table.
uint8_t reference_fp8(float x, Fp8Format f) {
  static const std::vector<Entry> tables[2] = {table(Fp8Format::e4m3), table(Fp8Format::e5m2)};
  const std::vector<Entry>& t = tables[int(f)];
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return uint8_t(sign | 0x7F);
  const double a = std::fabs(double(x));
  if (a >= t.back().value) return uint8_t(sign | t.back().code);
  const auto hi = std::lower_bound(t.begin(), t.end(), a, [](const Entry& e, double v) { return e.value < v; });
  if (hi->value == a) return uint8_t(sign | hi->code);
  const auto lo = hi - 1;
  const double dlo = a - lo->value, dhi = hi->value - a;
  const Entry& pick = dlo < dhi ? *lo : dhi < dlo ? *hi : ((lo->code & 1) == 0 ? *lo : *hi);
  return uint8_t(sign | pick.code);
}

float float_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> spread(std::size_t n, float range, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = range * u(rng) * std::abs(u(rng));  // many small values, some large
  return x;
}

// The pack of x (rows x cols, leading dimension ld) scaled by s, by index: K-contiguous rows of
// `cols` (not transposed) or of `rows` (transposed), padded with zeros to a multiple of 16; with x's
// amax and the count of values the scaling saturates.
struct PackReference {
  std::vector<uint8_t> codes;
  int64_t ld = 0;
  float amax = 0;
  unsigned over = 0;
};
PackReference pack_reference(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld, float s, Fp8Format f,
                             bool transposed) {
  PackReference p;
  p.ld = ((transposed ? rows : cols) + 15) / 16 * 16;
  p.codes.assign(std::size_t((transposed ? cols : rows) * p.ld), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[std::size_t(r * ld + c)];
      p.codes[transposed ? std::size_t(c * p.ld + r) : std::size_t(r * p.ld + c)] = reference_fp8(v * s, f);
      p.amax = std::max(p.amax, std::fabs(v));
      p.over += std::fabs(v * s) > cuda_layers::kFp8Max[int(f)] ? 1u : 0u;
    }
  }
  return p;
}

}  // namespace

TEST_CASE("fp8 pack: an FP8 product's operand from f32 or bf16 with a leading dimension, transposed or not, padded with zeros") {
  std::mt19937 rng(17);
  // (rows, cols, ld): a padded width, a strided source, tiles crossing every edge.
  for (const auto& [rows, cols, ld] : {std::tuple<int64_t, int64_t, int64_t>{5, 13, 13}, {37, 70, 75}, {33, 16, 16}}) {
    for (const bool transposed : {false, true}) {
      for (const bool bf16 : {false, true}) {
        for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
          CAPTURE(rows);
          CAPTURE(cols);
          CAPTURE(transposed);
          CAPTURE(bf16);
          CAPTURE(int(f));
          std::vector<float> x = spread(std::size_t(rows * ld), 900.0f, rng);
          std::vector<uint16_t> xb(x.size());
          for (std::size_t i = 0; i < x.size(); ++i) {
            xb[i] = uint16_t(emu_test::bits_of(x[i]) >> 16);  // truncated: any bf16 value will do
            if (bf16) x[i] = float_bits(uint32_t(xb[i]) << 16);
          }
          const float s = f == Fp8Format::e4m3 ? 0.625f : 3.0f;
          const PackReference ref = pack_reference(x, rows, cols, ld, s, f, transposed);
          const std::vector<uint8_t>& expect = ref.codes;
          const int64_t y_ld = ref.ld;
          const float amax = ref.amax;
          const unsigned over = ref.over;
          for_each_schedule([&] {
            const auto dx = to_device(x);
            const auto dxb = to_device(xb);
            const void* src = bf16 ? static_cast<const void*>(dxb.data()) : static_cast<const void*>(dx.data());
            const auto scale = to_device(std::vector<float>{s});
            auto y = to_device(std::vector<uint8_t>(expect.size() + 5, 0xAB));
            auto dmax = to_device(std::vector<float>{1.0f});
            auto dover = to_device(std::vector<float>{5.0f});
            const auto no_scale = to_device(std::vector<float>(std::size_t(cuda_layers::kFp8SlotHeader), 0.0f));
            cuda_layers::launch_fp8_slot_amax(src, bf16, rows, cols, ld, no_scale.data(), dmax.data(), nullptr);
            auto dmax_pack = to_device(std::vector<float>{0.0f});
            cuda_layers::launch_fp8_pack(src, bf16, rows, cols, ld, transposed, scale.data(), f, y.data(), y_ld, dover.data(),
                                         dmax_pack.data(), nullptr);
            CHECK(to_host(dmax_pack)[0] == amax);  // the same pass's amax
            const auto got = to_host(y);
            for (std::size_t i = 0; i < expect.size(); ++i) {
              INFO("element " << i);
              CHECK(int(got[i]) == int(expect[i]));
            }
            for (std::size_t i = expect.size(); i < got.size(); ++i) CHECK(got[i] == 0xAB);  // nothing written past the end
            CHECK(to_host(dmax)[0] == std::max(1.0f, amax));  // max-ed into what was there; the columns past cols unread
            CHECK(to_host(dover)[0] == 5.0f + float(over));   // added to what was there
          });
        }
      }
    }
  }
}

// Both layouts from one read (launch_fp8_pack_both): each the pack of its own layout above, by
// index, the amax and the saturated values counted once; also where the plain layout's padding
// reaches past the transposing tiles' columns' edge (cols 40 -> 48) and a strided bf16 source.
TEST_CASE("fp8 pack both: the untransposed and transposed packs from one read, as the two packs write them") {
  std::mt19937 rng(19);
  for (const auto& [rows, cols, ld] : {std::tuple<int64_t, int64_t, int64_t>{5, 13, 13}, {37, 70, 75}, {33, 40, 41}, {64, 16, 16}}) {
    for (const bool bf16 : {false, true}) {
      for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(bf16);
        CAPTURE(int(f));
        std::vector<float> x = spread(std::size_t(rows * ld), 900.0f, rng);
        std::vector<uint16_t> xb(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
          xb[i] = uint16_t(emu_test::bits_of(x[i]) >> 16);
          if (bf16) x[i] = float_bits(uint32_t(xb[i]) << 16);
        }
        const float s = f == Fp8Format::e4m3 ? 0.625f : 3.0f;
        const PackReference p = pack_reference(x, rows, cols, ld, s, f, false), t = pack_reference(x, rows, cols, ld, s, f, true);
        const std::vector<uint8_t>&plain = p.codes, &transposed = t.codes;
        const int64_t plain_ld = p.ld, t_ld = t.ld;
        for_each_schedule([&] {
          const auto dx = to_device(x);
          const auto dxb = to_device(xb);
          const void* src = bf16 ? static_cast<const void*>(dxb.data()) : static_cast<const void*>(dx.data());
          const auto scale = to_device(std::vector<float>{s});
          auto yp = to_device(std::vector<uint8_t>(plain.size() + 5, 0xAB));
          auto yt = to_device(std::vector<uint8_t>(transposed.size() + 5, 0xAB));
          auto dmax = to_device(std::vector<float>{0.0f});
          auto dover = to_device(std::vector<float>{2.0f});
          cuda_layers::launch_fp8_pack_both(src, bf16, rows, cols, ld, scale.data(), f, yp.data(), plain_ld, yt.data(), t_ld,
                                            dover.data(), dmax.data(), nullptr);
          const auto got_p = to_host(yp), got_t = to_host(yt);
          int64_t wrong_p = 0, wrong_t = 0;
          for (std::size_t i = 0; i < plain.size(); ++i) wrong_p += got_p[i] != plain[i] ? 1 : 0;
          for (std::size_t i = 0; i < transposed.size(); ++i) wrong_t += got_t[i] != transposed[i] ? 1 : 0;
          CHECK(wrong_p == 0);
          CHECK(wrong_t == 0);
          for (std::size_t i = plain.size(); i < got_p.size(); ++i) CHECK(got_p[i] == 0xAB);  // nothing past the end
          for (std::size_t i = transposed.size(); i < got_t.size(); ++i) CHECK(got_t[i] == 0xAB);
          CHECK(to_host(dmax)[0] == p.amax);
          CHECK(to_host(dover)[0] == 2.0f + float(p.over));  // once, not once a layout
        });
      }
    }
  }
}

// The column sums a pack takes beside its codes (an output gradient's bias gradient): in every
// layout (plain, transposed, both at once) the codes as without sums, and the sums the same bits,
// in the kernel's order (emu_test::tiled_column_sums), and within float's rounding of the float64 sums; added
// to what the vector held. Odd sizes, strided f32 and bf16 sources, several tiles of rows.
TEST_CASE("fp8 pack with column sums: the codes as without, the sums in tile order in every layout") {
  std::mt19937 rng(23);
  for (const auto& [rows, cols, ld] : {std::tuple<int64_t, int64_t, int64_t>{5, 13, 13}, {37, 70, 75}, {100, 40, 41}}) {
    for (const bool bf16 : {false, true}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(bf16);
      std::vector<float> x = spread(std::size_t(rows * ld), 900.0f, rng);
      std::vector<uint16_t> xb(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        xb[i] = uint16_t(emu_test::bits_of(x[i]) >> 16);
        if (bf16) x[i] = float_bits(uint32_t(xb[i]) << 16);
      }
      const Fp8Format f = Fp8Format::e5m2;
      const float s = 3.0f;
      const PackReference p = pack_reference(x, rows, cols, ld, s, f, false), t = pack_reference(x, rows, cols, ld, s, f, true);
      std::vector<float> sums0(static_cast<std::size_t>(cols));
      for (int64_t c = 0; c < cols; ++c) sums0[std::size_t(c)] = float(c) - 7.5f;
      const std::vector<float> want = emu_test::tiled_column_sums(x, rows, cols, ld, sums0);
      for (int64_t c = 0; c < cols; ++c) {
        double sum = sums0[std::size_t(c)], mag = std::fabs(sums0[std::size_t(c)]);
        for (int64_t r = 0; r < rows; ++r) {
          sum += double(x[std::size_t(r * ld + c)]);
          mag += std::fabs(double(x[std::size_t(r * ld + c)]));
        }
        CHECK(std::fabs(double(want[std::size_t(c)]) - sum) <= double(rows + 1) * 0x1p-24 * mag);  // the order is a sum's
      }
      for_each_schedule([&] {
        const auto dx = to_device(x);
        const auto dxb = to_device(xb);
        const void* src = bf16 ? static_cast<const void*>(dxb.data()) : static_cast<const void*>(dx.data());
        const auto scale = to_device(std::vector<float>{s});
        const std::size_t n_partials = std::size_t(cuda_layers::fp8_column_partials(rows, cols));
        for (int layout = 0; layout < 3; ++layout) {  // plain, transposed, both
          CAPTURE(layout);
          auto yp = to_device(std::vector<uint8_t>(p.codes.size() + 5, 0xAB));
          auto yt = to_device(std::vector<uint8_t>(t.codes.size() + 5, 0xAB));
          auto partials = to_device(std::vector<float>(n_partials, -1.0f));
          auto sums = to_device(sums0);
          const cuda_layers::Fp8ColumnSums cs{sums.data(), partials.data()};
          if (layout == 0) {
            cuda_layers::launch_fp8_pack(src, bf16, rows, cols, ld, false, scale.data(), f, yp.data(), p.ld, nullptr, nullptr, nullptr,
                                         cs);
          } else if (layout == 1) {
            cuda_layers::launch_fp8_pack(src, bf16, rows, cols, ld, true, scale.data(), f, yt.data(), t.ld, nullptr, nullptr, nullptr,
                                         cs);
          } else {
            cuda_layers::launch_fp8_pack_both(src, bf16, rows, cols, ld, scale.data(), f, yp.data(), p.ld, yt.data(), t.ld, nullptr,
                                              nullptr, nullptr, cs);
          }
          const auto got_p = to_host(yp), got_t = to_host(yt);
          const auto got = to_host(sums);
          int64_t wrong = 0;
          if (layout != 1) {
            for (std::size_t i = 0; i < p.codes.size(); ++i) wrong += got_p[i] != p.codes[i] ? 1 : 0;
          } else {
            for (std::size_t i = 0; i < got_p.size(); ++i) wrong += got_p[i] != 0xAB ? 1 : 0;  // untouched
          }
          if (layout != 0) {
            for (std::size_t i = 0; i < t.codes.size(); ++i) wrong += got_t[i] != t.codes[i] ? 1 : 0;
          } else {
            for (std::size_t i = 0; i < got_t.size(); ++i) wrong += got_t[i] != 0xAB ? 1 : 0;
          }
          CHECK(wrong == 0);
          int64_t off = 0;
          for (int64_t c = 0; c < cols; ++c)
            off += emu_test::bits_of(got[std::size_t(c)]) != emu_test::bits_of(want[std::size_t(c)]) ? 1 : 0;
          CHECK(off == 0);
        }
      });
    }
  }
}

TEST_CASE("fp8 amax: a NaN anywhere in the operand makes the amax NaN") {
  std::mt19937 rng(7);
  std::vector<float> x = spread(1003, 5.0f, rng);
  x[517] = float_bits(0x7FC00000u);
  for_each_schedule([&] {
    const auto dx = to_device(x);
    const auto no_scale = to_device(std::vector<float>(std::size_t(cuda_layers::kFp8SlotHeader), 0.0f));
    auto amax = to_device(std::vector<float>{0.0f});
    cuda_layers::launch_fp8_slot_amax(dx.data(), false, 17, 59, 59, no_scale.data(), amax.data(), nullptr);
    CHECK(std::isnan(to_host(amax)[0]));
  });
}

TEST_CASE("fp8 delayed-scaling slots: a fresh slot scales by the operand's own amax, then by its history; updates as a ring") {
  using cuda_layers::fp8_slot_floats;
  using cuda_layers::kFp8SlotHeader;
  const int64_t history = 3, floats = fp8_slot_floats(history);
  const float nan = float_bits(0x7FC00000u);
  std::mt19937 rng(19);
  const std::vector<float> x = spread(300, 7.0f, rng);
  float amax_x = 0;
  for (float v : x) amax_x = std::max(amax_x, std::fabs(v));
  for (const bool use_max : {true, false}) {
    CAPTURE(use_max);
    for_each_schedule([&] {
      // Two slots: one used (E4M3), one never used (left as it is by the update).
      auto slots = to_device(std::vector<float>(std::size_t(2 * floats), 0.0f));
      auto scratch = to_device(std::vector<float>{0.0f, 0.0f, 0.0f});  // amax, scale, inverse
      const auto dx = to_device(x);
      // Fresh: the operand's own amax gives the scale.
      cuda_layers::launch_fp8_slot_amax(dx.data(), false, 20, 15, 15, slots.data(), scratch.data(), nullptr);
      cuda_layers::launch_fp8_slot_scale(slots.data(), 448.0f, scratch.data(), scratch.data() + 1, scratch.data() + 2, nullptr);
      auto got = to_host(scratch);
      CHECK(got[0] == 0.0f);  // reset for the next use
      CHECK(got[1] == 448.0f / amax_x);
      CHECK(got[2] == 1.0f / (448.0f / amax_x));
      CHECK(to_host(slots)[3] == 448.0f);
      // The step's amax and saturated count as the quantising pass records them, then updates with
      // amaxes 2, 8, 4, NaN, 1:
      // the ring holds the last three; the scale is 448 over their max (or the newest), kept on NaN.
      const std::vector<float> amaxes = {2.0f, 8.0f, 4.0f, nan, 1.0f};
      std::vector<float> ring(std::size_t(history), 0.0f);
      float want_scale = 0.0f;
      for (std::size_t k = 0; k < amaxes.size(); ++k) {
        CAPTURE(k);
        auto host = to_host(slots);
        host[0] = amaxes[k];
        host[5] = float(k + 3);  // values saturated in the step
        slots.upload(host.data(), host.size());
        cuda_layers::launch_fp8_update_slots(slots.data(), 2, history, use_max, nullptr);
        ring[k % std::size_t(history)] = amaxes[k];
        float a = amaxes[k];
        if (use_max) {
          for (std::size_t i = 0; i < std::min<std::size_t>(k + 1, std::size_t(history)); ++i) a = std::fmax(a, ring[i]);
        }
        if (a > 0.0f && std::isfinite(a)) want_scale = 448.0f / a;
        host = to_host(slots);
        CHECK(host[0] == 0.0f);
        CHECK(host[4] == float(k + 1));
        CHECK(host[5] == 0.0f);
        CHECK(host[6] == float(k + 3));
        CHECK(host[1] == want_scale);
        CHECK(host[2] == 1.0f / want_scale);
        for (int64_t i = 0; i < history; ++i) {
          const float h = host[std::size_t(kFp8SlotHeader + i)], r = ring[std::size_t(i)];
          CHECK((h == r || (std::isnan(h) && std::isnan(r))));
        }
        for (int64_t i = floats; i < 2 * floats; ++i) CHECK(host[std::size_t(i)] == 0.0f);  // the unused slot
      }
      // With a scale set, the amax pass reads nothing and the slot's scale is the one used.
      scratch = to_device(std::vector<float>{0.0f, 0.0f, 0.0f});
      cuda_layers::launch_fp8_slot_amax(dx.data(), false, 20, 15, 15, slots.data(), scratch.data(), nullptr);
      CHECK(to_host(scratch)[0] == 0.0f);
      cuda_layers::launch_fp8_slot_scale(slots.data(), 448.0f, scratch.data(), scratch.data() + 1, scratch.data() + 2, nullptr);
      got = to_host(scratch);
      CHECK(got[1] == want_scale);
      CHECK(got[2] == 1.0f / want_scale);
    });
  }
}
