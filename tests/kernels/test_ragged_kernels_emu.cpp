// `cudnn_flash`'s own kernels (plugins/cudnn_flash/ragged_kernels.cu), run by the kernel
// interpreter through the plugin's launch helpers under every test schedule: the ragged metadata of
// packed rows (lengths and q, kv and stat offsets, with the empty entries up to the graph's bound)
// against both ragged.hpp's host twin and a walk of the rows written here (token r * T + start, and
// for rows the segments tile, the prefix sums of the lengths); the padded lengths; f32 -> bf16
// against emu_support.hpp's float64 round to nearest even (ties, subnormals, overflow; a NaN input
// only to a NaN); bf16 -> f32 with padding zeroed against a float64 decoding of the bits; the
// zeroing of padding in bf16 tensors and in the softmax statistics, token-major and head-major.
// Every result is exact, so compared bit for bit; elements a kernel must not touch keep a sentinel.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "attention_support.hpp"
#include "emu_support.hpp"
#include "ragged_kernels.hpp"

using namespace ablate;
using namespace ablate::cudnn_flash;
using test::RowLayout;
using ablate::emu_test::bf16_nearest;
using ablate::emu_test::bits_of;
using ablate::emu_test::float_of;
using ablate::emu_test::to_device;
using ablate::emu_test::to_host;

namespace {

constexpr int32_t kSentinel = 12345;

// The elements of one launch that differ from what they must be: how many, and the first.
class Tally {
 public:
  template <class V>
  void exact(int64_t at, V got, V want) {
    if (!(got == want) && bad_++ == 0) {
      std::ostringstream s;
      s << "element " << at << ": got " << +got << ", want " << +want;
      first_ = s.str();
    }
  }
  int64_t bad() const { return bad_; }
  const std::string& first() const { return first_; }

 private:
  int64_t bad_ = 0;
  std::string first_;
};

#define CHECK_TALLY(t) CHECK_MESSAGE((t).bad() == 0, (t).bad(), " elements wrong, first ", (t).first())

// B rows of T positions, each row's segments as (start, length) pairs.
struct Layout {
  int32_t T = 0;
  std::vector<RowLayout> rows;
  int32_t B() const { return int32_t(rows.size()); }
  int32_t segments() const {
    int32_t n = 0;
    for (const RowLayout& r : rows) n += int32_t(r.size());
    return n;
  }
};

// A row cut into random segments back to back, no padding.
RowLayout tiled_row(int32_t T, std::mt19937& rng) {
  RowLayout row;
  std::uniform_int_distribution<int32_t> len(1, std::max(1, T / 3));
  for (int32_t at = 0; at < T;) {
    const int32_t n = std::min(len(rng), T - at);
    row.push_back({at, n});
    at += n;
  }
  return row;
}

bool tiled(const Layout& l) {
  for (const RowLayout& row : l.rows) {
    int32_t at = 0;
    for (auto [start, length] : row) {
      if (start != at) return false;
      at += length;
    }
    if (at != l.T) return false;
  }
  return true;
}

// The metadata of the packed layout: lengths[bound], offsets[bound + 1] each.
struct Metadata {
  std::vector<int32_t> lengths, q, kv, stats;
};

// Walking the rows: entry after entry, token r * T + start; then the empty entries, at the end.
Metadata walk(const Layout& l, const RaggedShape& s, int32_t bound) {
  Metadata m;
  const auto push = [&](int64_t token) {
    m.q.push_back(int32_t(token * s.heads * s.head_dim));
    m.kv.push_back(int32_t(token * s.kv_heads * s.head_dim));
    m.stats.push_back(int32_t(token * s.heads));
  };
  for (std::size_t r = 0; r < l.rows.size(); ++r) {
    for (auto [start, length] : l.rows[r]) {
      m.lengths.push_back(length);
      push(int64_t(r) * l.T + start);
    }
  }
  while (int32_t(m.lengths.size()) < bound) m.lengths.push_back(0);
  while (int32_t(m.q.size()) < bound + 1) push(int64_t(l.B()) * l.T);
  return m;
}

// The same from ragged.hpp's host twin of the kernel.
Metadata host_twin(const Layout& l, const RaggedShape& s, int32_t bound) {
  Metadata m{std::vector<int32_t>(std::size_t(bound)), std::vector<int32_t>(std::size_t(bound) + 1),
             std::vector<int32_t>(std::size_t(bound) + 1), std::vector<int32_t>(std::size_t(bound) + 1)};
  const std::vector<int32_t> segments = test::flat_segments(l.rows), offsets = test::row_offsets(l.rows);
  fill_ragged_host(l.segments(), bound, segments.data(), offsets.data(), s, m.lengths.data(), m.q.data(), m.kv.data(), m.stats.data());
  return m;
}

// The value of a bf16 from its bits, in float64: sign, exponent and 7 fraction bits.
double bf16_decode(uint16_t b) {
  const double sign = (b & 0x8000u) != 0 ? -1.0 : 1.0;
  const int exponent = (b >> 7) & 0xFF, fraction = b & 0x7F;
  if (exponent == 0xFF) return fraction != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(double(fraction), -133);  // subnormal: fraction 2^-126 2^-7
  return sign * std::ldexp(128.0 + fraction, exponent - 127 - 7);
}

// Values per position (heads * D): odd widths, the widest only where the rows are few.
std::vector<int64_t> per_position_widths(const Layout& l) {
  if (l.B() > 100) return {1, 31};
  return {1, 31, 45, 257};
}

bool bf16_is_nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0; }

// The layouts of the padding tests: rows of 1, 7 and 257 positions, 1, 7, 2 and 1100 rows, with
// padding tails, rows of padding only, segments of length 1.
std::vector<Layout> padding_layouts() {
  std::mt19937 rng(3);
  std::vector<Layout> l{
      {1, {{{0, 1}}}},
      {7, {{{0, 7}}, {{0, 3}}, {}, {{0, 1}, {1, 1}, {2, 5}}, {{0, 2}, {2, 3}}, {{0, 1}}, {}}},
      {257, {{{0, 257}}, {{0, 100}, {100, 1}, {101, 150}}}},
      {7, {}},
  };
  for (int r = 0; r < 1100; ++r) l[3].rows.push_back(r % 4 == 0 ? RowLayout{} : test::random_packed_row(7, rng));
  return l;
}

}  // namespace

TEST_CASE("build_ragged: lengths and offsets of packed rows, the empty entries up to the bound at the end") {
  std::mt19937 rng(13);
  struct Case {
    Layout layout;
    int32_t H, Hkv, D;
    std::vector<int32_t> bounds;  // past the segment count
  };
  std::vector<Case> cases;
  cases.push_back({{1, {{{0, 1}}, {}, {{0, 1}}}}, 4, 4, 64, {2, 3, 8}});
  cases.push_back({{7, {{{0, 7}}, {{0, 3}}, {}, {{0, 1}, {1, 1}, {2, 5}}, {{0, 2}, {2, 3}}}}, 6, 2, 20, {7, 10, 20}});
  cases.push_back({{45, {tiled_row(45, rng), tiled_row(45, rng), {{0, 45}}, tiled_row(45, rng)}}, 3, 1, 45, {}});
  cases.push_back({{257, {{{0, 257}}, {{0, 100}, {100, 1}, {101, 150}}, {}}}, 2, 2, 64, {4, 6}});
  cases.push_back({{3, {{}, {}}}, 4, 2, 8, {0, 2}});  // no segment at all
  Layout many{7, {}};                                 // 1100 rows
  for (int r = 0; r < 1100; ++r) many.rows.push_back(r % 3 == 0 ? tiled_row(7, rng) : test::random_packed_row(7, rng));
  cases.push_back({many, 6, 3, 20, {}});
  Layout many_tiled{7, {}};
  for (int r = 0; r < 1100; ++r) many_tiled.rows.push_back(tiled_row(7, rng));
  cases.push_back({many_tiled, 2, 1, 31, {}});
  for (Case& c : cases) {
    const int32_t S = c.layout.segments();
    c.bounds.insert(c.bounds.begin(), S);
    c.bounds.push_back(2 * std::max(S, 1) + 1);
  }
  for (const Case& c : cases) {
    const Layout& l = c.layout;
    const RaggedShape shape{l.B(), l.T, c.H, c.Hkv, c.D};
    const int32_t S = l.segments();
    const std::vector<int32_t> segments = test::flat_segments(l.rows), offsets = test::row_offsets(l.rows);
    for (int32_t bound : c.bounds) {
      INFO("T " << l.T << " rows " << l.B() << " segments " << S << " bound " << bound << " H " << c.H << " Hkv " << c.Hkv << " D "
                << c.D);
      const Metadata want = walk(l, shape, bound), twin = host_twin(l, shape, bound);
      CHECK(twin.lengths == want.lengths);
      CHECK(twin.q == want.q);
      CHECK(twin.kv == want.kv);
      CHECK(twin.stats == want.stats);
      if (tiled(l)) {
        // Rows the segments tile hold no padding: an entry's token is the sum of the lengths before it.
        Metadata sums;
        int64_t token = 0;
        for (int32_t i = 0; i <= bound; ++i) {
          sums.q.push_back(int32_t(token * c.H * c.D));
          sums.kv.push_back(int32_t(token * c.Hkv * c.D));
          sums.stats.push_back(int32_t(token * c.H));
          if (i < bound) token += want.lengths[std::size_t(i)];
        }
        CHECK(token == int64_t(l.B()) * l.T);
        CHECK(sums.q == want.q);
        CHECK(sums.kv == want.kv);
        CHECK(sums.stats == want.stats);
      }
      emu_test::for_each_schedule([&] {
        const cuda::DeviceBuffer<int32_t> d_segments = to_device(segments), d_offsets = to_device(offsets);
        // One slot past each array: the kernel must leave it.
        const std::vector<int32_t> fresh_lengths(std::size_t(bound) + 1, kSentinel), fresh(std::size_t(bound) + 2, kSentinel);
        cuda::DeviceBuffer<int32_t> d_lengths = to_device(fresh_lengths), d_q = to_device(fresh), d_kv = to_device(fresh),
                                    d_stats = to_device(fresh);
        launch_build_ragged(d_segments.data(), d_offsets.data(), S, bound, shape, d_lengths.data(), d_q.data(), d_kv.data(),
                            d_stats.data(), nullptr);
        Tally t;
        const std::vector<int32_t> lengths = to_host(d_lengths), q = to_host(d_q), kv = to_host(d_kv), stats = to_host(d_stats);
        for (int32_t i = 0; i < bound; ++i) t.exact(i, lengths[std::size_t(i)], want.lengths[std::size_t(i)]);
        t.exact(bound, lengths[std::size_t(bound)], kSentinel);
        CHECK_TALLY(t);
        for (const auto& [got, expected] : {std::pair{&q, &want.q}, std::pair{&kv, &want.kv}, std::pair{&stats, &want.stats}}) {
          Tally o;
          for (int32_t i = 0; i <= bound; ++i) o.exact(i, (*got)[std::size_t(i)], (*expected)[std::size_t(i)]);
          o.exact(bound + 1, (*got)[std::size_t(bound) + 1], kSentinel);
          CHECK_TALLY(o);
        }
      });
    }
  }
  emu_test::report_worst("build_ragged_kernel", 0.0, 0.0);
}

TEST_CASE("build_padded: each row's one segment length, 0 for a row of padding, 1 to 1100 rows") {
  std::mt19937 rng(17);
  std::vector<Layout> layouts{{1, {{{0, 1}}}},
                              {1, {{}}},
                              {7, {{{0, 7}}, {{0, 3}}, {}, {{0, 1}}, {{0, 6}}, {}, {{0, 2}}}},
                              {257, {{{0, 257}}, {}, {{0, 200}}}},
                              {45, {}}};
  std::uniform_int_distribution<int32_t> len(0, 45);
  for (int r = 0; r < 1100; ++r) {
    const int32_t n = len(rng);
    layouts.back().rows.push_back(n == 0 ? RowLayout{} : RowLayout{{0, n}});
  }
  for (const Layout& l : layouts) {
    INFO("T " << l.T << " rows " << l.B());
    const std::vector<int32_t> segments = test::flat_segments(l.rows), offsets = test::row_offsets(l.rows);
    std::vector<int32_t> want;
    for (const RowLayout& row : l.rows) want.push_back(row.empty() ? 0 : row.front().second);
    std::vector<int32_t> twin(want.size());
    fill_padded_host(segments.data(), offsets.data(), l.B(), twin.data());
    CHECK(twin == want);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<int32_t> d_segments = to_device(segments), d_offsets = to_device(offsets);
      cuda::DeviceBuffer<int32_t> d_lengths = to_device(std::vector<int32_t>(want.size() + 1, kSentinel));
      launch_build_padded(d_segments.data(), d_offsets.data(), l.B(), d_lengths.data(), nullptr);
      const std::vector<int32_t> got = to_host(d_lengths);
      Tally t;
      for (std::size_t r = 0; r < want.size(); ++r) t.exact(int64_t(r), got[r], want[r]);
      t.exact(int64_t(want.size()), got.back(), kSentinel);
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("build_padded_kernel", 0.0, 0.0);
}

TEST_CASE("to_bf16: round to nearest even, ties, subnormals, overflow to infinity, NaN") {
  std::mt19937 rng(19);
  std::vector<float> special;
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x3F800000u, 0xBF800000u, 0x7F800000u, 0xFF800000u,  // 0, 1, inf
                     0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F808001u, 0xBF818000u,               // ties, near ties
                     0x7F7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0xFF7F8000u, 0x7F7EFFFFu,               // overflow or not
                     0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u, 0x00007FFFu, 0x007FFFFFu,  // subnormals
                     0x00800000u, 0x007F8000u, 0x807FC000u,                                         // into the normals
                     0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu, 0xFF812345u}) {            // NaNs
    special.push_back(float_of(u));
  }
  std::uniform_int_distribution<uint32_t> any_bits;
  std::normal_distribution<float> nd(0.0f, 10.0f);
  std::vector<std::vector<float>> inputs;
  for (std::size_t n : {std::size_t(1), std::size_t(31), std::size_t(257), std::size_t(45 * 1100)}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) {
      switch (i % 4) {
        case 0: x[i] = float_of(any_bits(rng)); break;
        case 1: x[i] = nd(rng); break;
        case 2: x[i] = float_of((any_bits(rng) & 0xFFFF0000u) | 0x8000u); break;  // exactly between two bf16
        default: x[i] = special[i / 4 % special.size()]; break;
      }
    }
    inputs.push_back(x);
  }
  inputs.push_back(special);
  for (const std::vector<float>& x : inputs) {
    INFO("n " << x.size());
    std::vector<uint16_t> want(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) want[i] = bf16_nearest(x[i]);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<float> d_x = to_device(x);
      cuda::DeviceBuffer<uint16_t> d_y = to_device(std::vector<uint16_t>(x.size() + 1, uint16_t(0xABCD)));
      launch_to_bf16(d_x.data(), d_y.data(), int64_t(x.size()), nullptr);
      const std::vector<uint16_t> got = to_host(d_y);
      Tally t;
      for (std::size_t i = 0; i < x.size(); ++i) {
        // NaN has no single answer (the interpreter keeps the payload, a GPU may make it
        // canonical): only that the result is a NaN.
        if (std::isnan(x[i])) {
          t.exact(int64_t(i), bf16_is_nan(got[i]), true);
        } else {
          t.exact(int64_t(i), got[i], want[i]);
        }
      }
      t.exact(int64_t(x.size()), got.back(), uint16_t(0xABCD));
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("to_bf16_kernel", 0.0, 0.0);
}

TEST_CASE("store_f32: bf16 widened exactly to f32, padding positions 0") {
  std::mt19937 rng(23);
  std::uniform_int_distribution<uint32_t> any_bits(0, 0xFFFF);
  for (const Layout& l : padding_layouts()) {
    const int64_t positions = int64_t(l.B()) * l.T;
    const std::vector<int32_t> ids = test::make_batch(l.T, l.rows).segment_ids;
    for (int64_t per : per_position_widths(l)) {
      INFO("T " << l.T << " rows " << l.B() << " per position " << per);
      std::vector<uint16_t> src(std::size_t(positions * per));
      for (uint16_t& b : src) b = uint16_t(any_bits(rng));
      emu_test::for_each_schedule([&] {
        const cuda::DeviceBuffer<uint16_t> d_src = to_device(src);
        const cuda::DeviceBuffer<int32_t> d_ids = to_device(ids);
        cuda::DeviceBuffer<float> d_dst = to_device(std::vector<float>(src.size(), float_of(0x7FC0DEADu)));
        launch_store_f32(d_src.data(), d_dst.data(), positions, per, d_ids.data(), nullptr);
        const std::vector<float> got = to_host(d_dst);
        Tally t;
        for (int64_t p = 0; p < positions; ++p) {
          for (int64_t k = 0; k < per; ++k) {
            const int64_t i = p * per + k;
            const float g = got[std::size_t(i)];
            if (ids[std::size_t(p)] == 0) {
              t.exact(i, bits_of(g), 0u);  // +0
              continue;
            }
            const double v = bf16_decode(src[std::size_t(i)]);
            if (std::isnan(v)) {
              t.exact(i, std::isnan(g), true);
            } else {
              t.exact(i, bits_of(g), bits_of(float(v)));  // every bf16 is a float: exact, sign of 0 too
            }
          }
        }
        CHECK_TALLY(t);
      });
    }
  }
  emu_test::report_worst("store_f32_kernel", 0.0, 0.0);
}

TEST_CASE("zero_padding_bf16: padding positions become +0, every other value keeps its bits") {
  std::mt19937 rng(29);
  std::uniform_int_distribution<uint32_t> any_bits(0, 0xFFFF);
  for (const Layout& l : padding_layouts()) {
    const int64_t positions = int64_t(l.B()) * l.T;
    const std::vector<int32_t> ids = test::make_batch(l.T, l.rows).segment_ids;
    for (int64_t per : per_position_widths(l)) {
      INFO("T " << l.T << " rows " << l.B() << " per position " << per);
      std::vector<uint16_t> data(std::size_t(positions * per));
      for (uint16_t& b : data) b = uint16_t(any_bits(rng));
      emu_test::for_each_schedule([&] {
        const cuda::DeviceBuffer<int32_t> d_ids = to_device(ids);
        cuda::DeviceBuffer<uint16_t> d_data = to_device(data);
        launch_zero_padding_bf16(d_data.data(), positions, per, d_ids.data(), nullptr);
        const std::vector<uint16_t> got = to_host(d_data);
        Tally t;
        for (int64_t p = 0; p < positions; ++p) {
          for (int64_t k = 0; k < per; ++k) {
            const std::size_t i = std::size_t(p * per + k);
            t.exact(int64_t(i), got[i], ids[std::size_t(p)] == 0 ? uint16_t(0) : data[i]);
          }
        }
        CHECK_TALLY(t);
      });
    }
  }
  emu_test::report_worst("zero_padding_bf16_kernel", 0.0, 0.0);
}

TEST_CASE("zero_padding_stats: the statistics of padding positions 0, (B, T, H) and (B, H, T)") {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 5.0f);
  for (const Layout& l : padding_layouts()) {
    const int64_t B = l.B(), T = l.T;
    const std::vector<int32_t> ids = test::make_batch(l.T, l.rows).segment_ids;
    for (int64_t H : {int64_t(1), int64_t(3), int64_t(13)}) {
      for (bool token_major : {true, false}) {
        INFO("T " << T << " rows " << B << " heads " << H << (token_major ? " (B, T, H)" : " (B, H, T)"));
        std::vector<float> stats(std::size_t(B * T * H));
        for (std::size_t i = 0; i < stats.size(); ++i) stats[i] = i % 7 == 3 ? float_of(0x7FC0BEEFu) : nd(rng);
        emu_test::for_each_schedule([&] {
          const cuda::DeviceBuffer<int32_t> d_ids = to_device(ids);
          cuda::DeviceBuffer<float> d_stats = to_device(stats);
          launch_zero_padding_stats(d_stats.data(), d_ids.data(), B, T, H, token_major, nullptr);
          const std::vector<float> got = to_host(d_stats);
          Tally t;
          for (int64_t b = 0; b < B; ++b) {
            for (int64_t s = 0; s < T; ++s) {
              const bool padding = ids[std::size_t(b * T + s)] == 0;
              for (int64_t h = 0; h < H; ++h) {
                const std::size_t i = std::size_t(token_major ? (b * T + s) * H + h : (b * H + h) * T + s);
                t.exact(int64_t(i), bits_of(got[i]), padding ? 0u : bits_of(stats[i]));
              }
            }
          }
          CHECK_TALLY(t);
        });
      }
    }
  }
  emu_test::report_worst("zero_padding_stats_kernel", 0.0, 0.0);
}
