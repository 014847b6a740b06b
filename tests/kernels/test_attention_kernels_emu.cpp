// `naive_cuda`'s kernels (plugins/naive/attention_kernels.cu), run by the kernel interpreter
// through the plugin's own launch helpers under every test schedule, against float64 loops written
// here: the segment starts of packed, padded and empty rows, 1 to 1100 of them, and of segments no
// batcher makes (cut at the row's end, or outside the row) (fill_i32 and segment_starts_kernel); the
// masked causal softmax of each query over its own segment and its lse, on rows of 1 to 257
// keys (past 256 a thread walks two columns); P recomputed from a saved lse; the row dots
// D = sum_d dO O; dS = P (dP - D); the GQA head sums (ratios 1, 2, 3); the pointer arrays of the
// batched products. Keys a query must not see hold huge scores, so a kernel that reads them is
// wrong by far; outputs start as a sentinel, so an element a kernel skips shows.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "attention_kernels.hpp"
#include "attention_support.hpp"
#include "emu_support.hpp"

using namespace ablate;
namespace nc = ablate::naive_cuda;
using test::RowLayout;
using ablate::emu_test::to_device;
using ablate::emu_test::to_host;

namespace {

constexpr double kU = 0x1p-24;  // a float's unit roundoff
const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kHidden = 1e30f;  // the score of a key the query must not see

// The worst error of a kernel over its cases and schedules: absolute, and relative to the
// magnitude its tolerance is stated against.
struct Worst {
  double abs = 0.0, rel = 0.0;
};

// The elements of one launch outside their tolerance: how many, and the first described.
class Tally {
 public:
  explicit Tally(Worst& w) : worst_(w) {}
  void near(int64_t at, double got, double want, double tol, double scale) {
    const double err = std::abs(got - want);
    if (!(err <= tol)) miss(at, got, want, tol);
    if (std::isfinite(err)) {
      worst_.abs = std::max(worst_.abs, err);
      if (scale > 0.0) worst_.rel = std::max(worst_.rel, err / scale);
    }
  }
  template <class V>
  void exact(int64_t at, V got, V want) {
    if (!(got == want)) miss(at, got, want, 0);
  }
  int64_t bad() const { return bad_; }
  const std::string& first() const { return first_; }

 private:
  template <class V>
  void miss(int64_t at, V got, V want, double tol) {
    if (bad_++ == 0) {
      std::ostringstream s;
      s.precision(9);
      s << "element " << at << ": got " << got << ", want " << want << " (tolerance " << tol << ")";
      first_ = s.str();
    }
  }
  Worst& worst_;
  int64_t bad_ = 0;
  std::string first_;
};

#define CHECK_TALLY(t) CHECK_MESSAGE((t).bad() == 0, (t).bad(), " elements wrong, first ", (t).first())

// B rows of T positions, each row's segments as (start, length) pairs.
struct Layout {
  int32_t T = 0;
  std::vector<RowLayout> rows;
  int64_t B() const { return int64_t(rows.size()); }
};

// Each position's segment start, searched for among its row's segments; -1 where none holds it.
// A segment starting outside the row holds nothing; one running past the end is cut at it.
std::vector<int32_t> expected_starts(const Layout& l) {
  std::vector<int32_t> s(std::size_t(l.B() * l.T), -1);
  for (int64_t r = 0; r < l.B(); ++r) {
    for (int32_t t = 0; t < l.T; ++t) {
      for (auto [start, length] : l.rows[std::size_t(r)]) {
        if (start >= 0 && start < l.T && start <= t && t < int64_t(start) + length) s[std::size_t(r * l.T + t)] = start;
      }
    }
  }
  return s;
}

// The layouts of the softmax cases: T 1, 7, 45 and 257 with full rows, padding tails, rows of
// padding only, segments of length 1, random packings.
std::vector<Layout> softmax_layouts() {
  std::mt19937 rng(11);
  return {
      {1, {{{0, 1}}, {}}},
      {7, {{{0, 7}}, {{0, 3}}, {}, {{0, 1}, {1, 1}, {2, 1}, {3, 4}}, {{0, 2}, {2, 3}}}},
      {45, {{{0, 45}}, test::random_packed_row(45, rng), {{0, 1}, {1, 44}}, {{0, 20}}, {}}},
      {257, {{{0, 257}}}},
  };
}
// Query heads per layout above: B * H * T rows of 6, 70, 1125 and 257.
constexpr int64_t kSoftmaxHeads[] = {3, 2, 5, 1};

// Scores (B, H, T, T): the keys query i sees around a row offset (-60, 0 or 35, so only a
// max-subtracted softmax stays finite), every other key kHidden.
std::vector<float> random_scores(const Layout& l, int64_t H, const std::vector<int32_t>& starts, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 3.0f);
  const int64_t T = l.T;
  std::vector<float> s(std::size_t(l.B() * H * T * T));
  for (int64_t z = 0; z < l.B() * H; ++z) {
    for (int64_t i = 0; i < T; ++i) {
      const int32_t start = starts[std::size_t((z / H) * T + i)];
      const float offset = std::array<float, 3>{-60.0f, 0.0f, 35.0f}[std::size_t((z * T + i) % 3)];
      for (int64_t j = 0; j < T; ++j) {
        s[std::size_t((z * T + i) * T + j)] = (start >= 0 && j >= start && j <= i) ? offset + n(rng) : kHidden;
      }
    }
  }
  return s;
}

// The float64 softmax of one query row over the keys [lo, hi]: probabilities, max and lse.
struct RowSoftmax {
  std::vector<double> p;
  double max = 0.0, lse = 0.0;
};
RowSoftmax softmax_row(const float* s, int64_t lo, int64_t hi) {
  RowSoftmax r;
  r.max = -std::numeric_limits<double>::infinity();
  for (int64_t j = lo; j <= hi; ++j) r.max = std::max(r.max, double(s[j]));
  double sum = 0.0;
  for (int64_t j = lo; j <= hi; ++j) sum += std::exp(double(s[j]) - r.max);
  for (int64_t j = lo; j <= hi; ++j) r.p.push_back(std::exp(double(s[j]) - r.max) / sum);
  r.lse = r.max + std::log(sum);
  return r;
}

}  // namespace

TEST_CASE("segment starts: each position its segment's start, padding -1, for 1 to 1100 rows") {
  std::mt19937 rng(5);
  std::vector<Layout> layouts = softmax_layouts();
  Layout many{7, {}};  // 1100 rows
  for (int r = 0; r < 1100; ++r) {
    switch (r % 5) {
      case 0: many.rows.push_back({{0, 7}}); break;
      case 1: many.rows.push_back({{0, 3}}); break;
      case 2: many.rows.push_back({}); break;
      case 3: many.rows.push_back({{0, 1}, {1, 1}, {2, 5}}); break;
      default: many.rows.push_back(test::random_packed_row(7, rng)); break;
    }
  }
  layouts.push_back(many);
  // Segments no batcher makes: one running past the row's end is cut there; one starting outside
  // the row writes nothing.
  layouts.push_back({7, {{{0, 2}, {5, 9}}, {{2, 3}, {9, 2}}, {{-3, 5}, {2, 4}}, {{6, 1}}}});
  Worst worst;
  for (const Layout& l : layouts) {
    INFO("T " << l.T << " rows " << l.B());
    const std::vector<int32_t> segments = test::flat_segments(l.rows), offsets = test::row_offsets(l.rows), want = expected_starts(l);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<int32_t> d_segments = to_device(segments.empty() ? std::vector<int32_t>{0} : segments);
      const cuda::DeviceBuffer<int32_t> d_offsets = to_device(offsets);
      cuda::DeviceBuffer<int32_t> d_starts = to_device(std::vector<int32_t>(want.size(), 12345));
      nc::launch_segment_starts(d_segments.data(), d_offsets.data(), int32_t(l.B()), l.T, d_starts.data(), nullptr);
      const std::vector<int32_t> got = to_host(d_starts);
      Tally t(worst);
      for (std::size_t i = 0; i < got.size(); ++i) t.exact(int64_t(i), got[i], want[i]);
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("fill_i32", worst.abs, worst.rel);
  emu_test::report_worst("segment_starts_kernel", worst.abs, worst.rel);
}

TEST_CASE("softmax rows: the masked causal softmax per segment and its lse, T 1 to 257") {
  std::mt19937 rng(17);
  const std::vector<Layout> layouts = softmax_layouts();
  Worst worst;
  for (std::size_t c = 0; c < layouts.size(); ++c) {
    const Layout& l = layouts[c];
    const int64_t B = l.B(), H = kSoftmaxHeads[c], T = l.T;
    INFO("B " << B << " H " << H << " T " << T);
    const std::vector<int32_t> starts = expected_starts(l);
    const std::vector<float> scores = random_scores(l, H, starts, rng);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<int32_t> d_starts = to_device(starts);
      cuda::DeviceBuffer<float> d_scores = to_device(scores);
      cuda::DeviceBuffer<float> d_lse = to_device(std::vector<float>(std::size_t(B * H * T), kNaN));
      nc::launch_softmax_rows(d_scores.data(), d_lse.data(), d_starts.data(), B, H, T, nullptr);
      const std::vector<float> p = to_host(d_scores), lse = to_host(d_lse);
      Tally tp(worst), tl(worst);
      for (int64_t z = 0; z < B * H; ++z) {
        for (int64_t i = 0; i < T; ++i) {
          const int64_t row = z * T + i;
          const int32_t start = starts[std::size_t((z / H) * T + i)];
          const float* s = scores.data() + row * T;
          if (start < 0) {  // padding: no key, every probability 0 and the lse 0
            for (int64_t j = 0; j < T; ++j) tp.exact(row * T + j, p[std::size_t(row * T + j)], 0.0f);
            tl.exact(row, lse[std::size_t(row)], 0.0f);
            continue;
          }
          const RowSoftmax want = softmax_row(s, start, i);
          const double n = double(i - start + 1);
          for (int64_t j = 0; j < T; ++j) {
            const double got = p[std::size_t(row * T + j)];
            if (j < start || j > i) {
              tp.exact(row * T + j, got, 0.0);
              continue;
            }
            // exp(s - max) carries the rounding of s - max (u |s - max| relative) and its own
            // (2u); the float sum of n terms in (0, 1] at most n u relative; the division u.
            const double pw = want.p[std::size_t(j - start)];
            tp.near(row * T + j, got, pw, (std::abs(double(s[j]) - want.max) + n + 4.0) * kU * pw, pw);
          }
          // lse = max + log(sum): the sum's n u relative error is an absolute n u in the log; log
          // and the addition round at most u |log(sum)| + u |lse| more (log(sum) <= log(n)).
          tl.near(row, lse[std::size_t(row)], want.lse, (n + 4.0 + 2.0 * std::log(n) + std::abs(want.lse)) * kU,
                  std::max(std::abs(want.lse), 1.0));
        }
      }
      CHECK_TALLY(tp);
      CHECK_TALLY(tl);
    });
  }
  emu_test::report_worst("softmax_rows_kernel", worst.abs, worst.rel);
}

TEST_CASE("recompute P: exp(s - lse) on the keys a query sees, 0 elsewhere, T 1 to 257") {
  std::mt19937 rng(19);
  const std::vector<Layout> layouts = softmax_layouts();
  Worst worst;
  for (std::size_t c = 0; c < layouts.size(); ++c) {
    const Layout& l = layouts[c];
    const int64_t B = l.B(), H = kSoftmaxHeads[c], T = l.T;
    INFO("B " << B << " H " << H << " T " << T);
    const std::vector<int32_t> starts = expected_starts(l);
    const std::vector<float> scores = random_scores(l, H, starts, rng);
    // The saved lse as forward leaves it: the row's log-sum-exp in float, 0 for padding.
    std::vector<float> lse(std::size_t(B * H * T), 0.0f);
    for (int64_t row = 0; row < B * H * T; ++row) {
      const int64_t z = row / T, i = row % T;
      const int32_t start = starts[std::size_t((z / H) * T + i)];
      if (start >= 0) lse[std::size_t(row)] = float(softmax_row(scores.data() + row * T, start, i).lse);
    }
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<int32_t> d_starts = to_device(starts);
      const cuda::DeviceBuffer<float> d_lse = to_device(lse);
      cuda::DeviceBuffer<float> d_scores = to_device(scores);
      nc::launch_recompute_p(d_scores.data(), d_lse.data(), d_starts.data(), B, H, T, nullptr);
      const std::vector<float> p = to_host(d_scores);
      Tally t(worst);
      for (int64_t row = 0; row < B * H * T; ++row) {
        const int64_t z = row / T, i = row % T;
        const int32_t start = starts[std::size_t((z / H) * T + i)];
        for (int64_t j = 0; j < T; ++j) {
          const int64_t k = row * T + j;
          if (start < 0 || j < start || j > i) {
            t.exact(k, p[std::size_t(k)], 0.0f);
            continue;
          }
          // s - lse rounds to u |s - lse| (relative in the exponential), exp itself about 2u.
          const double x = double(scores[std::size_t(k)]) - double(lse[std::size_t(row)]);
          const double want = std::exp(x);
          t.near(k, p[std::size_t(k)], want, (std::abs(x) + 3.0) * kU * want, want);
        }
      }
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("recompute_p_kernel", worst.abs, worst.rel);
}

TEST_CASE("row dot: D (B, H, T) = sum over D of dO O, D 1 to 100 (not multiples of 32)") {
  std::mt19937 rng(23);
  struct Case {
    int64_t B, T, H, D;
  };
  Worst worst;
  for (const Case& c : {Case{1, 1, 1, 1}, Case{2, 7, 3, 20}, Case{2, 45, 13, 45}, Case{1, 257, 2, 64}, Case{3, 7, 2, 100}}) {
    INFO("B " << c.B << " T " << c.T << " H " << c.H << " D " << c.D);
    const int64_t n = c.B * c.T * c.H * c.D;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> d_out(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
    for (float& x : d_out) x = nd(rng);
    for (float& x : out) x = 4.0f * nd(rng);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<float> dd = to_device(d_out), dout = to_device(out);
      cuda::DeviceBuffer<float> d_row = to_device(std::vector<float>(std::size_t(c.B * c.H * c.T), kNaN));
      nc::launch_row_dot(dd.data(), dout.data(), d_row.data(), c.B, c.T, c.H, c.D, nullptr);
      const std::vector<float> got = to_host(d_row);
      Tally t(worst);
      for (int64_t b = 0; b < c.B; ++b) {
        for (int64_t h = 0; h < c.H; ++h) {
          for (int64_t i = 0; i < c.T; ++i) {
            const int64_t at = ((b * c.T + i) * c.H + h) * c.D;
            double want = 0.0, mag = 0.0;
            for (int64_t d = 0; d < c.D; ++d) {
              want += double(d_out[std::size_t(at + d)]) * double(out[std::size_t(at + d)]);
              mag += std::abs(double(d_out[std::size_t(at + d)]) * double(out[std::size_t(at + d)]));
            }
            // A float sum of D rounded products: (D + 1) u relative to the sum of magnitudes.
            const int64_t k = (b * c.H + h) * c.T + i;
            t.near(k, got[std::size_t(k)], want, (double(c.D) + 2.0) * kU * mag, mag);
          }
        }
      }
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("row_dot_kernel", worst.abs, worst.rel);
}

TEST_CASE("softmax backward: dS = P (dP - D) in place, T 1 to 257") {
  std::mt19937 rng(29);
  struct Case {
    int64_t B, H, T;
  };
  Worst worst;
  for (const Case& c : {Case{1, 3, 1}, Case{5, 2, 7}, Case{5, 5, 45}, Case{2, 1, 257}}) {
    INFO("B " << c.B << " H " << c.H << " T " << c.T);
    const int64_t rows = c.B * c.H * c.T, n = rows * c.T;
    std::uniform_real_distribution<float> u01(0.0f, 1.0f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> p(static_cast<std::size_t>(n)), dp(static_cast<std::size_t>(n)), d_row(static_cast<std::size_t>(rows));
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = (k / c.T) % c.T, j = k % c.T;
      p[std::size_t(k)] = j > i ? 0.0f : u01(rng);  // 0 for the keys after the query, as softmax leaves them
      dp[std::size_t(k)] = 2.0f * nd(rng);
    }
    for (float& x : d_row) x = 2.0f * nd(rng);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<float> d_p = to_device(p), d_d = to_device(d_row);
      cuda::DeviceBuffer<float> d_dp = to_device(dp);
      nc::launch_softmax_backward(d_p.data(), d_dp.data(), d_d.data(), c.B, c.H, c.T, nullptr);
      const std::vector<float> got = to_host(d_dp);
      Tally t(worst);
      for (int64_t k = 0; k < n; ++k) {
        const double pk = p[std::size_t(k)], dpk = dp[std::size_t(k)], dr = d_row[std::size_t(k / c.T)];
        // Two roundings: the difference (u |dP - D|) and the product (u).
        const double mag = pk * (std::abs(dpk) + std::abs(dr));
        t.near(k, got[std::size_t(k)], pk * (dpk - dr), 2.0 * (1.0 + kU) * kU * mag, mag);
      }
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("softmax_backward_kernel", worst.abs, worst.rel);
}

TEST_CASE("group sum: each kv head the sum of its query heads in head order, GQA 1, 2 and 3") {
  std::mt19937 rng(31);
  struct Case {
    int64_t B, T, H, Hkv, D;
  };
  Worst worst;
  for (const Case& c : {Case{1, 1, 1, 1, 1}, Case{2, 7, 6, 6, 20}, Case{2, 7, 6, 3, 45}, Case{1, 45, 6, 2, 64}, Case{1, 257, 4, 2, 31},
                        Case{2, 550, 3, 1, 20}}) {
    INFO("B " << c.B << " T " << c.T << " H " << c.H << " Hkv " << c.Hkv << " D " << c.D);
    const int64_t group = c.H / c.Hkv;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> tmp(std::size_t(c.B * c.T * c.H * c.D));
    for (float& x : tmp) x = nd(rng);
    emu_test::for_each_schedule([&] {
      const cuda::DeviceBuffer<float> d_tmp = to_device(tmp);
      cuda::DeviceBuffer<float> d_out = to_device(std::vector<float>(std::size_t(c.B * c.T * c.Hkv * c.D), kNaN));
      nc::launch_group_sum(d_tmp.data(), d_out.data(), c.B, c.T, c.H, c.Hkv, c.D, nullptr);
      const std::vector<float> got = to_host(d_out);
      Tally t(worst);
      for (int64_t bt = 0; bt < c.B * c.T; ++bt) {
        for (int64_t g = 0; g < c.Hkv; ++g) {
          for (int64_t d = 0; d < c.D; ++d) {
            double want = 0.0, mag = 0.0;
            for (int64_t h = g * group; h < (g + 1) * group; ++h) {
              const double x = tmp[std::size_t((bt * c.H + h) * c.D + d)];
              want += x;
              mag += std::abs(x);
            }
            // A float sum of `group` terms: (group - 1) u relative to their magnitudes (exact for 1).
            const int64_t k = (bt * c.Hkv + g) * c.D + d;
            t.near(k, got[std::size_t(k)], want, double(group - 1) * kU * mag, mag);
          }
        }
      }
      CHECK_TALLY(t);
    });
  }
  emu_test::report_worst("group_sum_kernel", worst.abs, worst.rel);
}

TEST_CASE("fill pointers: one operand per (b, h), the kv head of a GQA group, up to 1104 products") {
  struct Case {
    int64_t B, T, H, Hkv, D;
  };
  Worst worst;
  for (const Case& c : {Case{1, 1, 1, 1, 1}, Case{2, 7, 6, 3, 20}, Case{3, 45, 6, 2, 45}, Case{184, 7, 6, 6, 20}}) {
    INFO("B " << c.B << " T " << c.T << " H " << c.H << " Hkv " << c.Hkv << " D " << c.D);
    const int64_t count = c.B * c.H;
    // The plugin's operands: q-shaped (B, T, H, D), kv-shaped (B, T, Hkv, D) shared by a group of
    // query heads, and the (B, H, T, T) score blocks.
    struct Operand {
      int64_t stride_b, stride_h, group;
    };
    for (const Operand& o :
         {Operand{c.T * c.H * c.D, c.D, 1}, Operand{c.T * c.Hkv * c.D, c.D, c.H / c.Hkv}, Operand{c.H * c.T * c.T, c.T * c.T, 1}}) {
      INFO("stride_b " << o.stride_b << " stride_h " << o.stride_h << " group " << o.group);
      const std::vector<float> base(std::size_t(c.B * o.stride_b));
      emu_test::for_each_schedule([&] {
        // Two more slots than products: they must keep their null.
        cuda::DeviceBuffer<float*> d_ptrs = to_device(std::vector<float*>(std::size_t(count + 2), nullptr));
        nc::launch_fill_pointers(d_ptrs.data(), base.data(), count, c.H, o.stride_b, o.stride_h, o.group, nullptr);
        const std::vector<float*> got = to_host(d_ptrs);
        Tally t(worst);
        for (int64_t b = 0; b < c.B; ++b) {
          for (int64_t h = 0; h < c.H; ++h) {
            const int64_t z = b * c.H + h, kv = h / o.group;  // the operand's head for query head h
            const auto want =
                reinterpret_cast<std::uintptr_t>(base.data()) + std::uintptr_t(b * o.stride_b + kv * o.stride_h) * sizeof(float);
            t.exact(z, reinterpret_cast<std::uintptr_t>(got[std::size_t(z)]), want);
          }
        }
        t.exact(count, got[std::size_t(count)], static_cast<float*>(nullptr));
        t.exact(count + 1, got[std::size_t(count + 1)], static_cast<float*>(nullptr));
        CHECK_TALLY(t);
      });
    }
  }
  emu_test::report_worst("fill_pointers_kernel", worst.abs, worst.rel);
}

// FP8 attention's rounding kernels (naive_cuda's [attention.naive_cuda] fp8): the amax is the
// largest |x| (a NaN anywhere makes it NaN, max-ed into what the slot held); rounding by a
// tensor's own amax gives fp8(x s) / s with s = fp8_max / amax (1 for an amax of zero or NaN), and
// by a fixed scale the same with that scale: against the OCP definition (nearest even, saturating),
// each value's code found by search over the format's finite values here.
namespace {

// The FP8 value nearest v (ties to the even code, beyond the largest finite value that value).
float fp8_nearest(float v, bool e5m2) {
  const int man = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  double best = 0, best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 128; ++c) {
    if (e5m2 ? c >= 0x7C : c == 0x7F) continue;  // infinities and NaNs
    const int e = c >> man, m = c & ((1 << man) - 1);
    const double value = e == 0 ? std::ldexp(m, 1 - bias - man) : std::ldexp((1 << man) + m, e - bias - man);
    const double d = std::fabs(std::fabs(double(v)) - value);
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best_d = d;
      best = value;
    }
  }
  return float(std::copysign(best, double(v)));
}

}  // namespace

TEST_CASE("FP8 attention's rounding: amax, rounding by the tensor's own amax and by a fixed scale, as the OCP formats define") {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (const int64_t count : {int64_t(1), int64_t(300), int64_t(4099)}) {
    for (const bool e5m2 : {false, true}) {
      CAPTURE(count);
      CAPTURE(e5m2);
      std::vector<float> x(static_cast<std::size_t>(count));
      for (float& e : x) e = n(rng);
      float amax = 0.0f;
      for (float e : x) amax = std::max(amax, std::fabs(e));
      const float top = e5m2 ? 57344.0f : 448.0f, s = top / amax, inv = 1.0f / s;
      emu_test::for_each_schedule([&] {
        auto d = to_device(x), fixed = to_device(x);
        auto slot = to_device(std::vector<float>{0.0f});
        naive_cuda::launch_fp8_amax(d.data(), count, slot.data(), nullptr);
        CHECK(to_host(slot)[0] == amax);
        naive_cuda::launch_fp8_round_current(d.data(), count, slot.data(), e5m2, nullptr);
        naive_cuda::launch_fp8_round_fixed(fixed.data(), count, 7.5f, e5m2, nullptr);
        const std::vector<float> got = to_host(d), got_fixed = to_host(fixed);
        int64_t wrong = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          wrong += got[i] != fp8_nearest(x[i] * s, e5m2) * inv ? 1 : 0;
          wrong += got_fixed[i] != fp8_nearest(x[i] * 7.5f, e5m2) * (1.0f / 7.5f) ? 1 : 0;
        }
        CHECK(wrong == 0);
      });
    }
  }
  emu_test::for_each_schedule([] {
    // A NaN makes the amax NaN; an amax of zero or NaN rounds with the scale 1.
    std::vector<float> x = {1.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), 0.5f};
    auto d = to_device(x);
    auto slot = to_device(std::vector<float>{0.25f});
    naive_cuda::launch_fp8_amax(d.data(), 4, slot.data(), nullptr);
    CHECK(std::isnan(to_host(slot)[0]));
    auto z = to_device(std::vector<float>{0.0f});
    auto y = to_device(std::vector<float>{0.3f, 500.0f});
    naive_cuda::launch_fp8_round_current(y.data(), 2, z.data(), false, nullptr);
    const std::vector<float> got = to_host(y);
    CHECK(got[0] == fp8_nearest(0.3f, false));
    CHECK(got[1] == 448.0f);  // saturated
  });
}
