// The CUDA layers' kernels other than the norms (plugins/layers/cuda/layer_kernels.cu, the bf16
// conversion of ablate/cuda_launch.cuh and epilogue_kernels.cu's bias pass), run by the kernel
// interpreter through their launch helpers under every test schedule, on odd shapes: dropout and
// its gradient, gelu (f32, and bf16 pre and post), swiglu (f32, and bf16 gate, up, h and gradients), copies, the table lookups and the deterministic
// scatter-add, the bf16 conversions, rope (f32 and bf16) and the classifier's softmax rows. The
// references are float64 loops written here: the dropout mask drawn from mix64 per flat element,
// the formulas of dense_math.hpp's header in double with tolerances from the float arithmetic;
// and emu_support.hpp's bf16 rounding to nearest even in float64. Buffers carry a sentinel tail
// (and padding) that the kernels must not write.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "ablate/mix.hpp"
#include "emu_support.hpp"
#include "epilogue_kernels.hpp"
#include "fp8_kernels.hpp"
#include "layer_kernels.hpp"

using namespace ablate;
using namespace ablate::cuda_layers;
using ablate::emu_test::bf16_nearest;
using ablate::emu_test::bf16_to_float;
using ablate::emu_test::bits_of;
using ablate::emu_test::float_of;
using ablate::emu_test::to_device;
using ablate::emu_test::to_host;

namespace {

constexpr double kU = 0x1p-24;  // float's unit roundoff
constexpr float kSentinel = 12345.0f;
constexpr uint16_t kSentinelBits = 12345;
constexpr std::size_t kTail = 37;  // sentinel elements after every output
const double kNaN = std::numeric_limits<double>::quiet_NaN();

constexpr std::size_t sz(int64_t v) { return static_cast<std::size_t>(v); }

bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

// A bf16 result of float arithmetic that is within `tol` of `want`: the nearest bf16 to want,
// or its other neighbour where want lies within tol of the midpoint between them.
bool bf16_close(uint16_t got, double want, double tol) {
  const double g = bf16_to_float(got), n = bf16_to_float(bf16_nearest(want));
  return std::fabs(g - want) <= std::fabs(n - want) + 2 * tol;
}

std::vector<float> normals(std::size_t n, double sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = float(dist(rng));
  return v;
}

// `v` followed by the sentinel tail.
std::vector<float> with_tail(std::vector<float> v) {
  v.insert(v.end(), kTail, kSentinel);
  return v;
}

// Mismatches of one check: how many, and the first described.
class Failures {
 public:
  template <class F>
  void expect(bool ok, F&& describe) {
    if (ok) return;
    if (count_++ == 0) first_ = describe();
  }
  int64_t count() const { return count_; }
  const std::string& first() const { return first_; }

 private:
  int64_t count_ = 0;
  std::string first_;
};

void expect_none(const Failures& f, const std::string& what) {
  CHECK_MESSAGE(f.count() == 0, what, ": ", f.count(), " mismatches, the first ", f.first());
}

std::string at(int64_t i, double got, double want) {
  return "at " + std::to_string(i) + ": got " + std::to_string(got) + " (bits of float " + std::to_string(bits_of(float(got))) +
         "), want " + std::to_string(want);
}

// The elements past n keep the sentinel.
void expect_tail(const std::vector<float>& v, std::size_t n, const std::string& what) {
  Failures f;
  for (std::size_t i = n; i < v.size(); ++i) f.expect(same_bits(v[i], kSentinel), [&] { return at(int64_t(i), v[i], kSentinel); });
  expect_none(f, what + " (sentinel tail)");
}

// The worst error of a kernel over its cases: absolute, and relative to the magnitude its
// tolerance is stated against.
struct Worst {
  double abs = 0, rel = 0;
  void add(double err, double scale) {
    abs = std::max(abs, err);
    if (scale > 0) rel = std::max(rel, err / scale);
  }
};

// Difference of two results that must be equal bit for bit, or both NaN (0 then).
double bit_error(float got, float want) {
  if (std::isnan(want) && std::isnan(got)) return 0;
  if (same_bits(got, want)) return 0;
  return std::isnan(got) || std::isnan(want) ? std::numeric_limits<double>::infinity() : std::fabs(double(got) - double(want));
}

// --- dropout -------------------------------------------------------------------------------------

// The mask of flat element i: dropped (0) when the top 53 bits of mix64(key, i), as a fraction of
// 2^53, fall below p; kept with factor scale otherwise; 1 when dropout is off.
float mask_of(const DropoutArgs& d, uint64_t i) {
  if (!(d.p > 0.0)) return 1.0f;
  const uint64_t draw = mix64(d.key, i) >> 11;
  return double(draw) < d.p * 0x1p53 ? 0.0f : d.scale;
}

DropoutArgs dropout(double p, uint64_t key) {
  DropoutArgs d;
  d.p = p;
  d.key = key;
  d.scale = p > 0 ? float(1.0 / (1.0 - p)) : 1.0f;
  return d;
}

// Element counts of the elementwise kernels: rows 1, 7, 257, 1100 of widths 1, 31, 45, 100.
const std::vector<int64_t> kCounts = {1, 7 * 31, 257 * 45, 1100 * 45, 31 * 100};

// --- rope ----------------------------------------------------------------------------------------

struct RopeShape {
  int64_t rows, heads, D;
};

std::vector<int32_t> positions_for(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(sz(rows));
  for (auto& x : p) x = int32_t(rng() % 4096);
  p[0] = 0;
  if (rows > 2) p[sz(rows - 1)] = 131071;
  return p;
}

// The rotation of element j of (rows, heads, D) in double, and the magnitude its float error is
// stated against (|x1| + |x2| of its pair).
void rope_reference(const std::vector<double>& x, const std::vector<int32_t>& pos, const RopeShape& s, double theta, double sign,
                    std::vector<double>& out, std::vector<double>& mag) {
  const int64_t half = s.D / 2;
  out.assign(x.size(), 0.0);
  mag.assign(x.size(), 0.0);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t base = (r * s.heads + h) * s.D;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(pos[sz(r)]) * std::exp(-2.0 * double(i) / double(s.D) * std::log(theta));
        const double c = std::cos(angle), sn = sign * std::sin(angle);
        const double x1 = x[sz(base + i)], x2 = x[sz(base + half + i)];
        out[sz(base + i)] = x1 * c - x2 * sn;
        out[sz(base + half + i)] = x2 * c + x1 * sn;
        mag[sz(base + i)] = mag[sz(base + half + i)] = std::fabs(x1) + std::fabs(x2);
      }
    }
  }
}

// --- the scatter-add ------------------------------------------------------------------------------

// The index of each row, the rows made of (index, count) runs and then shuffled.
std::vector<int32_t> runs_shuffled(const std::vector<std::pair<int32_t, int>>& runs, uint64_t seed) {
  std::vector<int32_t> idx;
  for (const auto& [t, k] : runs) idx.insert(idx.end(), sz(k), t);
  std::shuffle(idx.begin(), idx.end(), std::mt19937_64(seed));
  return idx;
}

// grads after the scatter-add in the order the launcher documents: rows sorted stably by index
// (as signed integers), the sorted positions cut into chunks of 256; each chunk's piece of a run
// summed in float in row order from 0; a run within one chunk added into its table row, a run
// crossing chunk edges as its first piece plus each later piece in chunk order, then added.
std::vector<float> scatter_documented_order(const std::vector<int32_t>& index, const std::vector<float>& d,
                                            const std::vector<float>& g0, int64_t cols, int64_t limit, const DropoutArgs& drop) {
  const int64_t rows = int64_t(index.size());
  std::vector<int64_t> order(sz(rows));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return index[sz(a)] < index[sz(b)]; });
  std::vector<float> g = g0;
  for (int64_t p = 0; p < rows;) {
    int64_t q = p;
    const int32_t t = index[sz(order[sz(p)])];
    while (q < rows && index[sz(order[sz(q)])] == t) ++q;  // the run is [p, q)
    if (t >= 0 && t < limit) {
      for (int64_t c = 0; c < cols; ++c) {
        float total = 0.0f;
        bool first = true;
        for (int64_t a = p; a < q;) {
          const int64_t b = std::min(q, (a / 256 + 1) * 256);  // this chunk's piece [a, b)
          float piece = 0.0f;
          for (int64_t k = a; k < b; ++k) {
            const int64_t i = order[sz(k)] * cols + c;
            piece += d[sz(i)] * mask_of(drop, uint64_t(i));
          }
          total = first ? piece : total + piece;
          first = false;
          a = b;
        }
        g[sz(t * cols + c)] += total;
      }
    }
    p = q;
  }
  return g;
}

struct ScatterCase {
  std::vector<int32_t> index;
  int64_t cols, limit;
  DropoutArgs drop;
};

void check_scatter(const ScatterCase& sc, uint64_t seed, Worst& worst) {
  const int64_t rows = int64_t(sc.index.size()), cols = sc.cols, limit = sc.limit;
  const std::vector<float> d = normals(sz(rows * cols), 1.0, seed);
  const std::vector<float> g0 = normals(sz(limit * cols), 0.5, seed + 1);
  // float64: the initial value plus every kept row's term. Each term's product is rounded once
  // and passes through at most m + 1 float additions (its piece, the pieces' chain, the table
  // value), m the run's length: within (m + 2) u of the sum of magnitudes.
  std::vector<double> want(g0.begin(), g0.end()), mags(g0.size());
  std::vector<int64_t> terms(sz(limit), 0);
  for (std::size_t i = 0; i < g0.size(); ++i) mags[i] = std::fabs(double(g0[i]));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = sc.index[sz(r)];
    if (t < 0 || t >= limit) continue;
    ++terms[sz(t)];
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const double v = double(d[sz(i)]) * double(mask_of(sc.drop, uint64_t(i)));
      want[sz(t * cols + c)] += v;
      mags[sz(t * cols + c)] += std::fabs(v);
    }
  }
  const std::vector<float> ordered = scatter_documented_order(sc.index, d, g0, cols, limit, sc.drop);
  std::vector<float> first_run;
  const std::string what = "scatter_add_rows rows " + std::to_string(rows) + " cols " + std::to_string(cols);
  emu_test::for_each_schedule([&] {
    auto di = to_device(sc.index);
    auto dd = to_device(d);
    auto dg = to_device(with_tail(g0));
    scatter_add_rows(di.data(), dd.data(), dg.data(), rows, cols, limit, sc.drop, nullptr);
    const std::vector<float> got = to_host(dg);
    Failures sum, bits, untouched;
    for (int64_t t = 0; t < limit; ++t) {
      for (int64_t c = 0; c < cols; ++c) {
        const std::size_t j = sz(t * cols + c);
        if (terms[sz(t)] == 0) {
          untouched.expect(same_bits(got[j], g0[j]), [&] { return at(int64_t(j), got[j], g0[j]); });
          continue;
        }
        const double err = std::fabs(double(got[j]) - want[j]), tol = double(terms[sz(t)] + 2) * kU * mags[j];
        worst.add(err, mags[j]);
        sum.expect(err <= tol, [&] { return at(int64_t(j), got[j], want[j]) + " tol " + std::to_string(tol); });
        bits.expect(same_bits(got[j], ordered[j]), [&] { return at(int64_t(j), got[j], ordered[j]); });
      }
    }
    expect_none(sum, what + " against the float64 sums");
    expect_none(bits, what + " against the documented summation order");
    expect_none(untouched, what + " (table rows no index names)");
    expect_tail(got, g0.size(), what);
    if (first_run.empty()) first_run = got;
    CHECK_MESSAGE(std::memcmp(first_run.data(), got.data(), got.size() * sizeof(float)) == 0, what, ": the same bits every run");
  });
}

// --- the classifier rows ----------------------------------------------------------------------------

struct CrossEntropyCase {
  int64_t n, out, real_out;
};

// One shape of the classifier rows, with and/or without the gradient; `ignored` the fraction of
// rows whose target is -1.
// bf16: the logits are bf16 (the values below rounded first, and the reference computed from the
// rounded values), the bf16 kernel runs, and its gradient is the bf16 rounding of its f32 one (half
// a bf16 step more, 2^-8 of the value); its one-pass sum rescales as its max grows (one float exp
// more per column a thread reads).
void check_cross_entropy(const CrossEntropyCase& cc, double ignored, std::initializer_list<bool> grads, Worst& worst_loss,
                         Worst& worst_grad, bool bf16 = false) {
  const int64_t n = cc.n, out = cc.out, real = cc.real_out;
  std::mt19937_64 rng(uint64_t(n * out + real));
  std::vector<float> z = normals(sz(n * out), 3.0, uint64_t(n + out));
  const double rescales = bf16 ? double((real + 511) / 512) : 0.0;
  std::vector<int32_t> targets(sz(n));
  for (auto& t : targets) t = std::uniform_real_distribution<double>(0, 1)(rng) < ignored ? -1 : int32_t(rng() % uint64_t(real));
  // Special rows: ignored (-1), bad targets (-2, in the padding, past the row, INT32_MAX), a
  // constant row, a row of wide logits, a near-certain target (cancellation in p - 1).
  const int32_t special_targets[] = {-1, -2, int32_t(out - 1), int32_t(out + 3), std::numeric_limits<int32_t>::max()};
  for (std::size_t k = 0; k < std::size(special_targets) && k < targets.size(); ++k) targets[k] = special_targets[k];
  if (n == 1) targets[0] = 3;
  if (n >= 7) {
    targets[5] = 4, targets[6] = 2;
    for (int64_t c = 0; c < out; ++c) z[sz(5 * out + c)] = 1.5f;
    for (int64_t c = 0; c < out; ++c) z[sz(6 * out + c)] = float(std::ldexp(double(z[sz(6 * out + c)]), 5));
    z[sz(6 * out + targets[6])] = 90.0f;
  }
  if (n >= 10) {
    targets[9] = 7;
    z[sz(9 * out)] = -1e30f;
    z[sz(9 * out + targets[9])] = 60.0f;
  }
  // The padded columns hold values above every real logit: they must not enter the row's max.
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = real; c < out; ++c) z[sz(r * out + c)] = 150.0f + float(c);
  }
  std::vector<uint16_t> zb;
  if (bf16) {
    for (float& v : z) zb.push_back(bf16_nearest(double(v)));
    for (std::size_t i = 0; i < z.size(); ++i) z[i] = bf16_to_float(zb[i]);
  }
  const float scale = 0.37f;
  // float64: lse = max + log(sum exp(z - max)), loss = lse - z_t, dz = scale (p - onehot). The
  // kernel's exps are float (~1u each, and z - max one rounding): the lse within
  // u (4 + |lse| + max |z - max|); its float gradient rounds lse to float and z - lse once more.
  std::vector<double> loss(sz(n)), tol_loss(sz(n)), dz(sz(n * out)), tol_dz(sz(n * out));
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = targets[sz(r)];
    const float* zr = z.data() + r * out;
    if (t < 0 || t >= real) {
      loss[sz(r)] = t == -1 ? 0.0 : kNaN;
      for (int64_t c = 0; c < out; ++c) dz[sz(r * out + c)] = 0.0, tol_dz[sz(r * out + c)] = 0.0;
      continue;
    }
    double mx = -std::numeric_limits<double>::infinity(), spread = 0, sum = 0;
    for (int64_t c = 0; c < real; ++c) mx = std::max(mx, double(zr[c]));
    for (int64_t c = 0; c < real; ++c) {
      sum += std::exp(double(zr[c]) - mx);
      spread = std::max(spread, std::fabs(double(zr[c]) - mx));
    }
    const double lse = mx + std::log(sum);
    loss[sz(r)] = lse - double(zr[t]);
    tol_loss[sz(r)] = kU * (4 + 2 * rescales + std::fabs(lse) + spread + std::fabs(loss[sz(r)]));
    for (int64_t c = 0; c < out; ++c) {
      const std::size_t k = sz(r * out + c);
      if (c >= real) {
        dz[k] = tol_dz[k] = 0.0;
        continue;
      }
      const double p = std::exp(double(zr[c]) - lse);
      dz[k] = scale * (p - (c == t ? 1.0 : 0.0));
      tol_dz[k] =
          8 * kU * scale * (p * (2 + 2 * rescales + std::fabs(lse) + std::fabs(double(zr[c]) - lse) + spread) + (c == t ? 1.0 : 0.0)) +
          (bf16 ? 0x1p-8 * std::fabs(dz[k]) * 1.01 + 1e-38 : 1e-38);  // the bf16 rounding; float underflow
    }
  }
  const std::string shape = "n " + std::to_string(n) + " out " + std::to_string(out) + " real_out " + std::to_string(real);
  emu_test::for_each_schedule([&] {
    for (const bool with_grad : grads) {
      auto dz_dev = to_device(with_tail(z));
      auto dt = to_device(targets);
      auto dl = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
      std::vector<float> got_z;
      if (bf16) {
        std::vector<uint16_t> tailed = zb;
        tailed.insert(tailed.end(), kTail, uint16_t(0x7FED));
        auto zb_dev = to_device(tailed);
        launch_cross_entropy_rows_bf16(zb_dev.data(), n, out, real, dt.data(), dl.data(), with_grad, scale, nullptr);
        const std::vector<uint16_t> got_b = to_host(zb_dev);
        for (std::size_t i = n * out; i < got_b.size(); ++i) CHECK(got_b[i] == 0x7FED);  // nothing past the rows
        for (std::size_t i = 0; i < sz(n * out); ++i) got_z.push_back(bf16_to_float(got_b[i]));
        got_z.insert(got_z.end(), kTail, kSentinel);
      } else {
        launch_cross_entropy_rows(dz_dev.data(), n, out, real, dt.data(), dl.data(), with_grad, scale, nullptr);
        got_z = to_host(dz_dev);
      }
      const std::vector<float> got_l = to_host(dl);
      Failures fl, fz;
      for (int64_t r = 0; r < n; ++r) {
        const std::size_t k = sz(r);
        const double want = loss[k];
        const bool ok = std::isnan(want) ? std::isnan(got_l[k]) : std::fabs(got_l[k] - want) <= tol_loss[k];
        if (!std::isnan(want)) worst_loss.add(std::fabs(got_l[k] - want), std::fabs(want));
        fl.expect(ok, [&] { return "row " + at(r, got_l[k], want) + " target " + std::to_string(targets[k]); });
        for (int64_t c = 0; c < out; ++c) {
          const std::size_t j = sz(r * out + c);
          if (!with_grad) {
            fz.expect(same_bits(got_z[j], z[j]), [&] { return "logits unchanged " + at(int64_t(j), got_z[j], z[j]); });
            continue;
          }
          const double e = std::fabs(got_z[j] - dz[j]);
          worst_grad.add(e, scale);
          // Padded columns and ignored or bad rows: exactly 0.
          fz.expect(tol_dz[j] == 0 ? same_bits(got_z[j], 0.0f) : e <= tol_dz[j], [&] {
            return "row " + std::to_string(r) + " column " + std::to_string(c) + " " + at(int64_t(j), got_z[j], dz[j]);
          });
        }
      }
      const std::string what = shape + (with_grad ? " with grad" : " without grad");
      expect_none(fl, "cross_entropy_rows losses " + what);
      expect_none(fz, "cross_entropy_rows logits " + what);
      expect_tail(got_z, sz(n * out), "cross_entropy_rows logits");
      expect_tail(got_l, sz(n), "cross_entropy_rows losses");
    }
  });
}

}  // namespace

TEST_CASE("dropout with a residual and its gradient keep or drop each element by its mix64 draw") {
  Worst worst_res, worst_grad;
  for (const double p : {0.0, 0.3}) {
    const DropoutArgs drop = dropout(p, 0x5eed0000ull + uint64_t(p * 10));
    for (const int64_t n : kCounts) {
      const std::vector<float> t = normals(sz(n), 1.0, uint64_t(n) + 1), res = normals(sz(n), 2.0, uint64_t(n) + 2);
      const std::vector<float> dy = normals(sz(n), 1.0, uint64_t(n) + 3);
      // Each is one float product (and one sum): rounded as the kernel's float arithmetic is.
      std::vector<float> want_res(sz(n)), want_alone(sz(n)), want_grad(sz(n));
      int64_t dropped = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float m = mask_of(drop, uint64_t(i));
        dropped += m == 0.0f;
        want_alone[sz(i)] = t[sz(i)] * m;
        want_res[sz(i)] = res[sz(i)] + want_alone[sz(i)];
        want_grad[sz(i)] = dy[sz(i)] * m;
      }
      if (n > 10000) CHECK(std::fabs(double(dropped) / double(n) - p) < 0.02);
      const std::string shape = "n " + std::to_string(n) + " p " + std::to_string(p);
      emu_test::for_each_schedule([&] {
        auto dt = to_device(t);
        auto dr = to_device(res);
        auto dy_dev = to_device(dy);
        // With a residual, without one, and in place (t is y).
        for (int mode = 0; mode < 3; ++mode) {
          auto y = to_device(mode == 2 ? with_tail(t) : with_tail(std::vector<float>(sz(n), kSentinel)));
          launch_dropout_residual(mode == 2 ? y.data() : dt.data(), mode == 0 ? dr.data() : nullptr, y.data(), n, drop, nullptr);
          const std::vector<float> got = to_host(y);
          const std::vector<float>& want = mode == 0 ? want_res : want_alone;
          Failures f;
          for (int64_t i = 0; i < n; ++i) {
            const double e = bit_error(got[sz(i)], want[sz(i)]);
            worst_res.add(e, std::fabs(want[sz(i)]));
            f.expect(e == 0, [&] { return at(i, got[sz(i)], want[sz(i)]); });
          }
          expect_none(f, "dropout_residual mode " + std::to_string(mode) + " " + shape);
          expect_tail(got, sz(n), "dropout_residual " + shape);
        }
        auto out = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
        launch_dropout_grad(dy_dev.data(), out.data(), n, drop, nullptr);
        const std::vector<float> got = to_host(out);
        Failures f;
        for (int64_t i = 0; i < n; ++i) {
          const double e = bit_error(got[sz(i)], want_grad[sz(i)]);
          worst_grad.add(e, std::fabs(want_grad[sz(i)]));
          f.expect(e == 0, [&] { return at(i, got[sz(i)], want_grad[sz(i)]); });
        }
        expect_none(f, "dropout_grad " + shape);
        expect_tail(got, sz(n), "dropout_grad " + shape);
      });
    }
  }
  emu_test::report_worst("dropout_residual", worst_res.abs, worst_res.rel);
  emu_test::report_worst("dropout_grad", worst_grad.abs, worst_grad.rel);
}

TEST_CASE("gelu forward and backward follow the tanh approximation") {
  Worst worst_fwd, worst_bwd;
  const double c0 = std::sqrt(2.0 / std::numbers::pi), c1 = 0.044715;
  for (const int64_t n : kCounts) {
    std::vector<float> x = normals(sz(n), 2.5, uint64_t(n) + 10);
    const float special[] = {0.0f, -0.0f, 1e-20f, -1e-20f, 0.5f, -0.5f, 3.0f, -3.0f, 5.5f, -5.5f, 9.0f, -9.0f};
    for (std::size_t k = 0; k < std::size(special) && k < x.size(); ++k) x[k] = special[k];
    for (float& v : x) v = std::clamp(v, -9.0f, 9.0f);
    const std::vector<float> dh = normals(sz(n), 1.0, uint64_t(n) + 11);
    // gelu(x) = x s, s = sigmoid(2u), u = c0 (x + c1 x^3); gelu' = s + 2 x s (1 - s) u'.
    // The kernel's u carries a few roundings (a relative error of at most ~8u), which exp turns
    // into a relative error of s of (1 - s) |2u| 8u; the rest is a few roundings of the result. The
    // gradient's (1 - s) is s's error absolutely.
    std::vector<double> y(sz(n)), tol_y(sz(n)), g(sz(n)), tol_g(sz(n)), mag_g(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      const double v = x[sz(i)], u = c0 * (v + c1 * v * v * v), du = c0 * (1 + 3 * c1 * v * v);
      const double s = 1 / (1 + std::exp(-2 * u)), es = s * kU * (4 + 8 * (1 - s) * std::fabs(2 * u));
      y[sz(i)] = v * s;
      tol_y[sz(i)] = 2 * std::fabs(v) * (es + kU * s) + 1e-40;
      const double T = 2 * v * s * (1 - s) * du, d = dh[sz(i)];
      g[sz(i)] = d * (s + T);
      mag_g[sz(i)] = std::fabs(d) * (s + std::fabs(T));
      tol_g[sz(i)] =
          2 * std::fabs(d) *
              (es + 8 * kU * std::fabs(T) + std::fabs(2 * v * du) * (s * (es + kU * (1 - s)) + (1 - s) * es) + kU * std::fabs(s + T)) +
          kU * std::fabs(g[sz(i)]) + 1e-40;
    }
    emu_test::for_each_schedule([&] {
      auto dx = to_device(x);
      auto post = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
      launch_gelu_forward(dx.data(), post.data(), n, nullptr);
      auto ddh = to_device(with_tail(dh));
      launch_gelu_backward(dx.data(), ddh.data(), n, nullptr);
      const std::vector<float> got_y = to_host(post), got_g = to_host(ddh);
      Failures fy, fg;
      for (int64_t i = 0; i < n; ++i) {
        const std::size_t k = sz(i);
        const double ey = std::fabs(got_y[k] - y[k]), eg = std::fabs(got_g[k] - g[k]);
        worst_fwd.add(ey, std::fabs(y[k]));
        worst_bwd.add(eg, mag_g[k]);
        fy.expect(ey <= tol_y[k], [&] { return at(i, got_y[k], y[k]) + " x " + std::to_string(x[k]); });
        fg.expect(eg <= tol_g[k], [&] { return at(i, got_g[k], g[k]) + " x " + std::to_string(x[k]); });
      }
      expect_none(fy, "gelu forward n " + std::to_string(n));
      expect_none(fg, "gelu backward n " + std::to_string(n));
      expect_tail(got_y, sz(n), "gelu forward");
      expect_tail(got_g, sz(n), "gelu backward");
    });
  }
  emu_test::report_worst("gelu_forward", worst_fwd.abs, worst_fwd.rel);
  emu_test::report_worst("gelu_backward", worst_bwd.abs, worst_bwd.rel);
}

TEST_CASE("gelu with its hidden activation in bf16: pre and post the f32 kernel's values rounded, the gradient from bf16 pre") {
  // The f32 kernels are checked against float64 above; the bf16 ones must give their values bit
  // for bit, rounded to the nearest bf16 where they write bf16: pre = bf16(t), post = bf16 of the
  // f32 kernel's gelu(t) (from t itself, not from its rounding), and backward the f32 kernel's
  // dh * gelu'(p) for p = bf16(t) as its input, kept in f32 and written rounded. add_bf16 adds
  // bf16 values exactly (each one widened, then one f32 sum).
  for (const int64_t n : kCounts) {
    std::vector<float> t = normals(sz(n), 2.5, uint64_t(n) + 40);
    for (float& v : t) v = std::clamp(v, -9.0f, 9.0f);
    const std::vector<float> dh = normals(sz(n), 1.0, uint64_t(n) + 41), dst0 = normals(sz(n), 1.0, uint64_t(n) + 42);
    std::vector<float> t_rounded(sz(n));
    std::vector<uint16_t> t_bits(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      t_bits[sz(i)] = bf16_nearest(t[sz(i)]);
      t_rounded[sz(i)] = bf16_to_float(t_bits[sz(i)]);
    }
    emu_test::for_each_schedule([&] {
      auto dt = to_device(t), dtr = to_device(t_rounded);
      auto post32 = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
      launch_gelu_forward(dt.data(), post32.data(), n, nullptr);
      auto dh32 = to_device(with_tail(dh));
      launch_gelu_backward(dtr.data(), dh32.data(), n, nullptr);  // from the rounded pre-activation
      const std::vector<uint16_t> tail(sz(n) + kTail, kSentinelBits);
      auto pre16 = to_device(tail), post16 = to_device(tail), dpre16 = to_device(tail);
      launch_gelu_forward_bf16(dt.data(), pre16.data(), post16.data(), n, nullptr);
      auto dh_kept = to_device(with_tail(dh));
      launch_gelu_backward_bf16(pre16.data(), dh_kept.data(), dpre16.data(), n, nullptr);
      auto src16 = to_device(t_bits);
      auto sum = to_device(with_tail(dst0));
      launch_add_bf16(src16.data(), sum.data(), n, nullptr);
      const std::vector<float> want_post = to_host(post32), want_dh = to_host(dh32), got_dh = to_host(dh_kept), got_sum = to_host(sum);
      const std::vector<uint16_t> got_pre = to_host(pre16), got_post = to_host(post16), got_dpre = to_host(dpre16);
      Failures fp, fq, fd, fr, fs, ft;
      for (int64_t i = 0; i < n; ++i) {
        const std::size_t k = sz(i);
        fp.expect(got_pre[k] == t_bits[k], [&] { return "pre at " + std::to_string(i); });
        fq.expect(got_post[k] == bf16_nearest(want_post[k]), [&] { return "post at " + std::to_string(i); });
        fd.expect(same_bits(got_dh[k], want_dh[k]), [&] { return at(i, got_dh[k], want_dh[k]); });
        fr.expect(got_dpre[k] == bf16_nearest(want_dh[k]), [&] { return "dpre at " + std::to_string(i); });
        const float want_sum = dst0[k] + t_rounded[k];
        fs.expect(same_bits(got_sum[k], want_sum), [&] { return at(i, got_sum[k], want_sum); });
      }
      for (std::size_t k = sz(n); k < tail.size(); ++k) {
        ft.expect(got_pre[k] == kSentinelBits && got_post[k] == kSentinelBits && got_dpre[k] == kSentinelBits,
                  [&] { return std::to_string(k); });
      }
      const std::string shape = " n " + std::to_string(n);
      expect_none(fp, "gelu_forward_bf16 pre" + shape);
      expect_none(fq, "gelu_forward_bf16 post" + shape);
      expect_none(fd, "gelu_backward_bf16 dh" + shape);
      expect_none(fr, "gelu_backward_bf16 dpre" + shape);
      expect_none(fs, "add_bf16" + shape);
      expect_none(ft, "gelu bf16 (sentinel tails)" + shape);
      expect_tail(got_dh, sz(n), "gelu_backward_bf16 dh");
      expect_tail(got_sum, sz(n), "add_bf16");
    });
  }
}

TEST_CASE("gelu backward from a bf16 gradient with the bias gradient's column sums: the f32 kernel's values, the sums in tile order") {
  // dpre = bf16 of the f32 kernel's dh * gelu'(pre) (dh and pre bf16 values, widened exactly); db +=
  // the column sums of those f32 values before rounding, in the tiled order (emu_test::tiled_column_sums),
  // and within float's rounding of the float64 sums. Odd shapes: one row, a tile's edge crossed
  // both ways, several tiles of rows.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 5}, {37, 70}, {64, 33}, {100, 32}}) {
    const int64_t n = rows * cols;
    std::vector<uint16_t> pre_bits(sz(n)), dh_bits(sz(n));
    std::vector<float> pre(sz(n)), dh(sz(n));
    const std::vector<float> t = normals(sz(n), 2.5, uint64_t(n) + 50), g = normals(sz(n), 1.0, uint64_t(n) + 51);
    for (int64_t i = 0; i < n; ++i) {
      pre_bits[sz(i)] = bf16_nearest(std::clamp(t[sz(i)], -9.0f, 9.0f));
      dh_bits[sz(i)] = bf16_nearest(g[sz(i)]);
      pre[sz(i)] = bf16_to_float(pre_bits[sz(i)]);
      dh[sz(i)] = bf16_to_float(dh_bits[sz(i)]);
    }
    const std::vector<float> db0 = normals(sz(cols), 1.0, uint64_t(n) + 52);
    emu_test::for_each_schedule([&] {
      auto dpre32 = to_device(pre), dh32 = to_device(dh);
      launch_gelu_backward(dpre32.data(), dh32.data(), n, nullptr);  // the f32 kernel: dh * gelu'(pre)
      const std::vector<float> want = to_host(dh32);
      const std::vector<uint16_t> tail(sz(n) + kTail, kSentinelBits);
      auto dpre16 = to_device(tail), pre16 = to_device(pre_bits), dh16 = to_device(dh_bits);
      auto partials = to_device(std::vector<float>(sz(cuda_layers::fp8_column_partials(rows, cols)), kSentinel));
      auto db = to_device(with_tail(db0));
      launch_gelu_backward_bf16_sums(pre16.data(), dh16.data(), dpre16.data(), rows, cols, partials.data(), db.data(), nullptr);
      auto dpre_only = to_device(tail);  // without db: the same values, no sums
      launch_gelu_backward_bf16_sums(pre16.data(), dh16.data(), dpre_only.data(), rows, cols, nullptr, nullptr, nullptr);
      const std::vector<uint16_t> got = to_host(dpre16), got_only = to_host(dpre_only);
      const std::vector<float> got_db = to_host(db), want_db = emu_test::tiled_column_sums(want, rows, cols, cols, db0);
      Failures fd, fs, fr;
      for (int64_t i = 0; i < n; ++i) {
        fd.expect(got[sz(i)] == bf16_nearest(want[sz(i)]) && got_only[sz(i)] == got[sz(i)],
                  [&] { return "dpre at " + std::to_string(i); });
      }
      for (int64_t c = 0; c < cols; ++c) {
        fs.expect(same_bits(got_db[sz(c)], want_db[sz(c)]), [&] { return at(c, got_db[sz(c)], want_db[sz(c)]); });
        double sum = db0[sz(c)], mag = std::abs(db0[sz(c)]);
        for (int64_t r = 0; r < rows; ++r) {
          sum += double(want[sz(r * cols + c)]);
          mag += std::abs(double(want[sz(r * cols + c)]));
        }
        fr.expect(std::abs(double(got_db[sz(c)]) - sum) <= double(rows + 1) * kU * mag,
                  [&] { return at(c, got_db[sz(c)], float(sum)); });
      }
      const std::string shape = " rows " + std::to_string(rows) + " cols " + std::to_string(cols);
      expect_none(fd, "gelu_backward_bf16_sums dpre" + shape);
      expect_none(fs, "gelu_backward_bf16_sums db, tile order" + shape);
      expect_none(fr, "gelu_backward_bf16_sums db against float64" + shape);
      expect_tail(got_db, sz(cols), "gelu_backward_bf16_sums db");
      for (std::size_t k = sz(n); k < tail.size(); ++k) CHECK(got[k] == kSentinelBits);
    });
  }
}

TEST_CASE("swiglu forward and backward") {
  Worst worst_fwd, worst_bwd_g, worst_bwd_u;
  for (const int64_t n : kCounts) {
    std::vector<float> g = normals(sz(n), 3.0, uint64_t(n) + 20);
    const float special[] = {0.0f, -0.0f, -1.2785f, 30.0f, -30.0f, 1e-20f};
    for (std::size_t k = 0; k < std::size(special) && k < g.size(); ++k) g[k] = special[k];
    const std::vector<float> u = normals(sz(n), 1.0, uint64_t(n) + 21), dh = normals(sz(n), 1.0, uint64_t(n) + 22);
    // s = sigmoid(g) from an exact g: expf, a sum and a quotient, ~4u relative. h = g s u: ~6u.
    // du = dh g s: ~6u. dg = dh u s (1 + g (1 - s)): (1 - s) carries s's error absolutely.
    std::vector<double> h(sz(n)), dg(sz(n)), du(sz(n)), tol_dg(sz(n)), mag_dg(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      const std::size_t k = sz(i);
      const double gv = g[k], s = 1 / (1 + std::exp(-gv));
      h[k] = gv * s * double(u[k]);
      du[k] = double(dh[k]) * gv * s;
      const double lead = double(dh[k]) * double(u[k]) * s;
      dg[k] = lead * (1 + gv * (1 - s));
      mag_dg[k] = std::fabs(lead) * (1 + std::fabs(gv));
      tol_dg[k] = 2 * kU * std::fabs(lead) * (8 * std::fabs(1 + gv * (1 - s)) + std::fabs(gv) * (5 * s + 2 * (1 - s))) + 1e-40;
    }
    emu_test::for_each_schedule([&] {
      auto dgate = to_device(g);
      auto dup = to_device(u);
      auto h32 = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
      launch_swiglu_forward(dgate.data(), dup.data(), h32.data(), n, nullptr);
      auto ddu = to_device(with_tail(dh));
      auto ddg = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
      launch_swiglu_backward(dgate.data(), dup.data(), ddu.data(), ddg.data(), n, nullptr);
      const std::vector<float> got_h = to_host(h32), got_du = to_host(ddu), got_dg = to_host(ddg);
      Failures fh, fg, fu;
      for (int64_t i = 0; i < n; ++i) {
        const std::size_t k = sz(i);
        const double eh = std::fabs(got_h[k] - h[k]);
        worst_fwd.add(eh, std::fabs(h[k]));
        fh.expect(eh <= 8 * kU * std::fabs(h[k]) + 1e-40, [&] { return at(i, got_h[k], h[k]) + " g " + std::to_string(g[k]); });
        const double eu = std::fabs(got_du[k] - du[k]), eg = std::fabs(got_dg[k] - dg[k]);
        worst_bwd_u.add(eu, std::fabs(du[k]));
        worst_bwd_g.add(eg, mag_dg[k]);
        fu.expect(eu <= 8 * kU * std::fabs(du[k]) + 1e-40, [&] { return at(i, got_du[k], du[k]); });
        fg.expect(eg <= tol_dg[k], [&] { return at(i, got_dg[k], dg[k]) + " g " + std::to_string(g[k]); });
      }
      const std::string shape = " n " + std::to_string(n);
      expect_none(fh, "swiglu forward f32" + shape);
      expect_none(fu, "swiglu backward du" + shape);
      expect_none(fg, "swiglu backward dg" + shape);
      expect_tail(got_h, sz(n), "swiglu forward f32");
      expect_tail(got_du, sz(n), "swiglu backward du");
      expect_tail(got_dg, sz(n), "swiglu backward dg");
    });
  }
  emu_test::report_worst("swiglu_forward f32", worst_fwd.abs, worst_fwd.rel);
  emu_test::report_worst("swiglu_backward dg", worst_bwd_g.abs, worst_bwd_g.rel);
  emu_test::report_worst("swiglu_backward du", worst_bwd_u.abs, worst_bwd_u.rel);
}

TEST_CASE("swiglu with gate, up and the gradients in bf16: the f32 kernels' values on the bf16 inputs, rounded once") {
  // The f32 kernels are checked against float64 above; the bf16 ones must give their values on the
  // widened bf16 inputs bit for bit, rounded to the nearest bf16: h = bf16(f32 h(g, u)), dg and du
  // the f32 backward's on (g, u, dh), each rounded.
  for (const int64_t n : kCounts) {
    const std::vector<float> g0 = normals(sz(n), 3.0, uint64_t(n) + 60), u0 = normals(sz(n), 1.0, uint64_t(n) + 61),
                             d0 = normals(sz(n), 1.0, uint64_t(n) + 62);
    std::vector<uint16_t> gb(sz(n)), ub(sz(n)), db(sz(n));
    std::vector<float> g(sz(n)), u(sz(n)), dh(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      const std::size_t k = sz(i);
      gb[k] = bf16_nearest(g0[k]);
      ub[k] = bf16_nearest(u0[k]);
      db[k] = bf16_nearest(d0[k]);
      g[k] = bf16_to_float(gb[k]);
      u[k] = bf16_to_float(ub[k]);
      dh[k] = bf16_to_float(db[k]);
    }
    emu_test::for_each_schedule([&] {
      auto dg32 = to_device(g), du32 = to_device(u), h32 = to_device(std::vector<float>(sz(n))), dd32 = to_device(dh);
      auto dgrad32 = to_device(std::vector<float>(sz(n)));
      launch_swiglu_forward(dg32.data(), du32.data(), h32.data(), n, nullptr);
      launch_swiglu_backward(dg32.data(), du32.data(), dd32.data(), dgrad32.data(), n, nullptr);  // du in place of dh
      const std::vector<float> want_h = to_host(h32), want_du = to_host(dd32), want_dg = to_host(dgrad32);
      const std::vector<uint16_t> tail(sz(n) + kTail, kSentinelBits);
      auto g16 = to_device(gb), u16 = to_device(ub), d16 = to_device(db), h16 = to_device(tail), dg16 = to_device(tail),
           du16 = to_device(tail);
      launch_swiglu_forward_bf16(g16.data(), u16.data(), h16.data(), n, nullptr);
      launch_swiglu_backward_bf16(g16.data(), u16.data(), d16.data(), dg16.data(), du16.data(), n, nullptr);
      const std::vector<uint16_t> got_h = to_host(h16), got_dg = to_host(dg16), got_du = to_host(du16), got_dh = to_host(d16);
      Failures fh, fg, fu, ft;
      for (int64_t i = 0; i < n; ++i) {
        const std::size_t k = sz(i);
        fh.expect(got_h[k] == bf16_nearest(want_h[k]), [&] { return "h at " + std::to_string(i); });
        fg.expect(got_dg[k] == bf16_nearest(want_dg[k]), [&] { return "dg at " + std::to_string(i); });
        fu.expect(got_du[k] == bf16_nearest(want_du[k]) && got_dh[k] == db[k], [&] { return "du at " + std::to_string(i); });
      }
      for (std::size_t k = sz(n); k < tail.size(); ++k) {
        ft.expect(got_h[k] == kSentinelBits && got_dg[k] == kSentinelBits && got_du[k] == kSentinelBits,
                  [&] { return std::to_string(k); });
      }
      const std::string shape = " n " + std::to_string(n);
      expect_none(fh, "swiglu_forward_bf16 h" + shape);
      expect_none(fg, "swiglu_backward_bf16 dg" + shape);
      expect_none(fu, "swiglu_backward_bf16 du (dh unchanged)" + shape);
      expect_none(ft, "swiglu bf16 (sentinel tails)" + shape);
    });
  }
}

TEST_CASE("copy_or_add copies or accumulates, and add_bias adds the bias to every row") {
  Worst worst_copy, worst_bias;
  for (const int64_t n : kCounts) {
    const std::vector<float> src = normals(sz(n), 1.0, uint64_t(n) + 30), dst0 = normals(sz(n), 1.0, uint64_t(n) + 31);
    emu_test::for_each_schedule([&] {
      auto ds = to_device(src);
      for (const bool acc : {false, true}) {
        auto dd = to_device(with_tail(dst0));
        launch_copy_or_add(ds.data(), dd.data(), n, acc, nullptr);
        const std::vector<float> got = to_host(dd);
        Failures f;
        for (int64_t i = 0; i < n; ++i) {
          const std::size_t k = sz(i);
          const float want = acc ? dst0[k] + src[k] : src[k];
          const double e = bit_error(got[k], want);
          worst_copy.add(e, std::fabs(want));
          f.expect(e == 0, [&] { return at(i, got[k], want); });
        }
        expect_none(f, std::string("copy_or_add ") + (acc ? "accumulate" : "copy") + " n " + std::to_string(n));
        expect_tail(got, sz(n), "copy_or_add");
      }
    });
  }
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 31}, {257, 45}, {1100, 100}, {3, 257}}) {
    const std::vector<float> y0 = normals(sz(rows * cols), 1.0, uint64_t(rows * cols) + 32);
    const std::vector<float> bias = normals(sz(cols), 1.0, uint64_t(cols) + 33);
    emu_test::for_each_schedule([&] {
      auto dy = to_device(with_tail(y0));
      auto db = to_device(bias);
      launch_add_bias(dy.data(), db.data(), rows, cols, nullptr);
      const std::vector<float> got = to_host(dy);
      Failures f;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const std::size_t k = sz(r * cols + c);
          const float want = y0[k] + bias[sz(c)];
          const double e = bit_error(got[k], want);
          worst_bias.add(e, std::fabs(want));
          f.expect(e == 0, [&] { return at(int64_t(k), got[k], want); });
        }
      }
      expect_none(f, "add_bias rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      expect_tail(got, sz(rows * cols), "add_bias");
    });
  }
  emu_test::report_worst("copy_or_add", worst_copy.abs, worst_copy.rel);
  emu_test::report_worst("add_bias", worst_bias.abs, worst_bias.rel);
}

TEST_CASE("gather_rows and add_rows look up table rows, NaN for an index out of range") {
  Worst worst_gather, worst_add;
  const int64_t limit = 50;
  const int32_t bad[] = {
      -1, -7, int32_t(limit), int32_t(limit + 5), std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 31}, {257, 45}, {1100, 100}, {13, 257}}) {
    std::mt19937_64 rng(uint64_t(rows * 1000 + cols));
    std::vector<int32_t> index(sz(rows));
    for (auto& t : index) t = rng() % 8 == 0 ? bad[rng() % std::size(bad)] : int32_t(rng() % uint64_t(limit));
    if (rows == 7) index[3] = -1;
    const std::vector<float> table = normals(sz(limit * cols), 1.0, uint64_t(rows) + 40);
    const std::vector<float> x = normals(sz(rows * cols), 1.0, uint64_t(rows) + 41);
    const std::string shape = "rows " + std::to_string(rows) + " cols " + std::to_string(cols);
    for (const double p : {0.0, 0.25}) {
      const DropoutArgs drop = dropout(p, 0xabcdefull + uint64_t(cols));
      emu_test::for_each_schedule([&] {
        auto di = to_device(index);
        auto dt = to_device(table);
        auto dy = to_device(with_tail(std::vector<float>(sz(rows * cols), kSentinel)));
        launch_gather_rows(di.data(), dt.data(), dy.data(), rows, cols, limit, drop, nullptr);
        const std::vector<float> got = to_host(dy);
        Failures f;
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t t = index[sz(r)];
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t i = r * cols + c;
            const float want = t < 0 || t >= limit ? float(kNaN) : table[sz(t * cols + c)] * mask_of(drop, uint64_t(i));
            const double e = bit_error(got[sz(i)], want);
            worst_gather.add(e, std::fabs(want));
            f.expect(e == 0, [&] { return at(i, got[sz(i)], want); });
          }
        }
        expect_none(f, "gather_rows " + shape + " p " + std::to_string(p));
        expect_tail(got, sz(rows * cols), "gather_rows");
      });
    }
    emu_test::for_each_schedule([&] {
      auto di = to_device(index);
      auto dt = to_device(table);
      auto dx = to_device(with_tail(x));
      auto dy = to_device(with_tail(std::vector<float>(sz(rows * cols), kSentinel)));
      launch_add_rows(di.data(), dt.data(), dx.data(), dy.data(), rows, cols, limit, nullptr);
      launch_add_rows(di.data(), dt.data(), dx.data(), dx.data(), rows, cols, limit, nullptr);  // y aliasing x
      for (const auto* buf : {&dy, &dx}) {
        const std::vector<float> got = to_host(*buf);
        Failures f;
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t t = index[sz(r)];
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t i = r * cols + c;
            const float want = t < 0 || t >= limit ? float(kNaN) : x[sz(i)] + table[sz(t * cols + c)];
            const double e = bit_error(got[sz(i)], want);
            worst_add.add(e, std::fabs(want));
            f.expect(e == 0, [&] { return at(i, got[sz(i)], want); });
          }
        }
        expect_none(f, std::string("add_rows ") + (buf == &dx ? "in place " : "") + shape);
        expect_tail(got, sz(rows * cols), "add_rows");
      }
    });
  }
  emu_test::report_worst("gather_rows", worst_gather.abs, worst_gather.rel);
  emu_test::report_worst("add_rows", worst_add.abs, worst_add.rel);
}

TEST_CASE("the residual stream in bf16: gather_rows, add_rows and dropout_residual round their f32 values once") {
  // The bf16 twins must write the nearest bf16 to what the f32 kernels compute in float (checked
  // bit for bit above), from bf16 inputs widened exactly: the embedding's lookup (dropout too), a
  // position table added in place, a projection's f32 output dropped out and added to a bf16
  // residual (separate, and in place: y is the residual). An index out of range gives a NaN.
  const int64_t limit = 50;
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 31}, {257, 45}, {13, 257}}) {
    std::mt19937_64 rng(uint64_t(rows * 977 + cols));
    std::vector<int32_t> index(sz(rows));
    for (auto& t : index) t = rng() % 9 == 0 ? -1 : int32_t(rng() % uint64_t(limit));
    const int64_t n = rows * cols;
    const std::vector<float> table = normals(sz(limit * cols), 1.0, uint64_t(rows) + 60);
    const std::vector<float> t = normals(sz(n), 1.0, uint64_t(rows) + 61);
    const std::vector<float> x_wide = normals(sz(n), 3.0, uint64_t(rows) + 62);
    std::vector<uint16_t> x_bits(sz(n));
    std::vector<float> x(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      x_bits[sz(i)] = bf16_nearest(x_wide[sz(i)]);
      x[sz(i)] = bf16_to_float(x_bits[sz(i)]);
    }
    const std::string shape = "rows " + std::to_string(rows) + " cols " + std::to_string(cols);
    for (const double p : {0.0, 0.25}) {
      const DropoutArgs drop = dropout(p, 0xfeedull + uint64_t(cols));
      std::vector<float> gather(sz(n)), added(sz(n)), dropped(sz(n));
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t k = index[sz(r)];
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const bool bad = k < 0 || k >= limit;
          gather[sz(i)] = bad ? float(kNaN) : table[sz(k * cols + c)] * mask_of(drop, uint64_t(i));
          added[sz(i)] = bad ? float(kNaN) : x[sz(i)] + table[sz(k * cols + c)];
          dropped[sz(i)] = x[sz(i)] + t[sz(i)] * mask_of(drop, uint64_t(i));
        }
      }
      emu_test::for_each_schedule([&] {
        const std::vector<uint16_t> tail(sz(n) + kTail, kSentinelBits);
        std::vector<uint16_t> x_tail = x_bits;
        x_tail.insert(x_tail.end(), kTail, kSentinelBits);
        auto di = to_device(index);
        auto dt = to_device(table);
        auto dproduct = to_device(t);
        auto g16 = to_device(tail), a16 = to_device(x_tail), r16 = to_device(x_tail), y16 = to_device(tail),
             in_place = to_device(x_tail);
        launch_gather_rows(di.data(), dt.data(), g16.data(), rows, cols, limit, drop, nullptr);
        launch_add_rows(di.data(), dt.data(), a16.data(), a16.data(), rows, cols, limit, nullptr);
        launch_dropout_residual(dproduct.data(), r16.data(), y16.data(), n, drop, nullptr);
        launch_dropout_residual(dproduct.data(), in_place.data(), in_place.data(), n, drop, nullptr);
        const struct {
          const char* what;
          std::vector<uint16_t> got;
          const std::vector<float>& want;
        } cases[] = {{"gather_rows bf16", to_host(g16), gather},
                     {"add_rows bf16 in place", to_host(a16), added},
                     {"dropout_residual bf16", to_host(y16), dropped},
                     {"dropout_residual bf16 in place", to_host(in_place), dropped}};
        for (const auto& c : cases) {
          Failures f;
          for (int64_t i = 0; i < n; ++i) {
            const uint16_t g = c.got[sz(i)];
            const float w = c.want[sz(i)];
            const bool ok = std::isnan(w) ? std::isnan(bf16_to_float(g)) : g == bf16_nearest(w);
            f.expect(ok, [&] { return at(i, bf16_to_float(g), w); });
          }
          for (std::size_t k = sz(n); k < c.got.size(); ++k)
            f.expect(c.got[k] == kSentinelBits, [&] { return "tail " + std::to_string(k); });
          expect_none(f, std::string(c.what) + " " + shape + " p " + std::to_string(p));
        }
      });
    }
  }
}

TEST_CASE("scatter_add_rows sums each index's rows deterministically, across chunk edges") {
  Worst worst;
  std::mt19937_64 rng(7);
  auto random_index = [&](int64_t rows, int64_t limit) {
    std::vector<int32_t> idx(sz(rows));
    for (auto& t : idx) t = int32_t(int64_t(rng() % uint64_t(limit + 4)) - 2);  // [-2, limit + 2)
    return idx;
  };
  // Random indices: every run short, crossing chunk edges where the sort puts it.
  check_scatter({random_index(1, 5), 45, 5, dropout(0.0, 0)}, 100, worst);
  check_scatter({random_index(7, 3), 257, 3, dropout(0.5, 11)}, 101, worst);
  check_scatter({random_index(257, 40), 31, 40, dropout(0.0, 0)}, 102, worst);
  check_scatter({random_index(1100, 60), 45, 60, dropout(0.2, 12)}, 103, worst);
  check_scatter({random_index(1100, 9), 257, 9, dropout(0.0, 0)}, 104, worst);
  // Runs placed on the edges (limit 6): a skipped negative run across the first edge, runs ending
  // exactly at an edge, one filling a chunk, one starting at an edge and crossing the next, a run
  // of one row, one spanning three chunks, a skipped run at the limit crossing an edge.
  const std::vector<std::pair<int32_t, int>> edges = {{-3, 260}, {0, 252}, {1, 256}, {2, 300}, {3, 1}, {4, 600}, {6, 300}, {5, 3}};
  check_scatter({runs_shuffled(edges, 1), 33, 6, dropout(0.0, 0)}, 105, worst);
  check_scatter({runs_shuffled(edges, 2), 1, 6, dropout(0.3, 13)}, 106, worst);
  // One index holding most rows (spanning four chunks), among others and skipped ones.
  std::vector<std::pair<int32_t, int>> heavy = {{7, 700}, {-1, 100}, {20, 50}, {std::numeric_limits<int32_t>::max(), 3}};
  for (int32_t t = 0; t < 20; ++t) heavy.push_back({t == 7 ? 19 : t, 1 + t % 13});
  check_scatter({runs_shuffled(heavy, 3), 45, 20, dropout(0.1, 14)}, 107, worst);
  emu_test::report_worst("scatter_add_rows (iota, scatter_chunks, scatter_crossing_runs)", worst.abs, worst.rel);
}

TEST_CASE("to_bf16 rounds to the nearest bf16, ties to even, strided and contiguous") {
  std::vector<float> specials;
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x00800000u, 0x3f808000u,
                     0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf808000u, 0xbf818000u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
                     0xff7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xff800001u, 0xffc12345u, 0x7fbfffffu}) {
    specials.push_back(float_of(u));
  }
  std::mt19937_64 rng(77);
  Worst worst;
  struct Shape {
    int64_t rows, cols, ld;
  };
  for (const Shape& s :
       std::vector<Shape>{{1, 1, 3}, {7, 31, 32}, {257, 45, 64}, {1100, 100, 101}, {1, 1, 1}, {7, 257, 257}, {1100, 45, 45}}) {
    const int64_t n = s.rows * s.cols;
    std::vector<float> src(sz(s.rows * s.ld), float(kNaN));  // NaN in the padding, never read
    std::vector<float> packed(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      float v = 0;
      switch (rng() % 4) {
        case 0: v = float_of((uint32_t(rng()) & 0xffff0000u) | 0x8000u); break;  // a tie
        case 1: v = float_of(uint32_t(rng())); break;                            // any bits
        default: v = float(std::ldexp(std::normal_distribution<double>(0, 1)(rng), int(rng() % 40) - 20));
      }
      if (i < int64_t(specials.size())) v = specials[sz(i)];
      packed[sz(i)] = v;
      src[sz((i / s.cols) * s.ld + i % s.cols)] = v;
    }
    std::vector<uint16_t> want(sz(n));
    std::vector<bool> want_nan(sz(n));
    for (int64_t i = 0; i < n; ++i) {
      want[sz(i)] = bf16_nearest(packed[sz(i)]);
      want_nan[sz(i)] = std::isnan(packed[sz(i)]);
    }
    const std::string shape = "rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols) + " ld " + std::to_string(s.ld);
    emu_test::for_each_schedule([&] {
      auto ds = to_device(src);
      auto dd = to_device(std::vector<uint16_t>(sz(n) + kTail, kSentinelBits));
      launch_to_bf16(ds.data(), s.rows, s.cols, s.ld, dd.data(), nullptr);
      const std::vector<uint16_t> got = to_host(dd);
      Failures f, tail;
      for (int64_t i = 0; i < n; ++i) {
        const std::size_t k = sz(i);
        const uint16_t g = got[k];
        // A NaN stays a NaN of the same sign (its payload is not specified); the rest bit for bit.
        const bool ok =
            want_nan[k] ? ((g & 0x7f80u) == 0x7f80u && (g & 0x7fu) != 0 && (g & 0x8000u) == (want[k] & 0x8000u)) : g == want[k];
        if (!want_nan[k]) worst.add(ok ? 0.0 : std::fabs(double(bf16_to_float(g)) - double(bf16_to_float(want[k]))), 0);
        f.expect(ok, [&] {
          return "at " + std::to_string(i) + " (f32 bits " + std::to_string(bits_of(packed[k])) + "): bits " + std::to_string(g) +
                 ", want " + std::to_string(want[k]);
        });
      }
      for (std::size_t k = sz(n); k < got.size(); ++k) tail.expect(got[k] == kSentinelBits, [&] { return std::to_string(k); });
      expect_none(f, "to_bf16 " + shape);
      expect_none(tail, "to_bf16 (sentinel tail) " + shape);
    });
  }
  emu_test::report_worst("to_bf16 (strided and contiguous)", worst.abs, worst.rel);
}

TEST_CASE("rope rotates each head's pairs by position, f32 forward, inverse and accumulating, and bf16") {
  Worst worst_f32, worst_bf16;
  const std::vector<RopeShape> shapes = {{1, 1, 2}, {7, 3, 6}, {257, 5, 10}, {1100, 2, 64}, {3, 1, 128}};
  for (const RopeShape& s : shapes) {
    const int64_t n = s.rows * s.heads * s.D;
    const std::vector<int32_t> pos = positions_for(s.rows, uint64_t(n));
    const std::vector<float> x = normals(sz(n), 1.0, uint64_t(n) + 50), acc0 = normals(sz(n), 1.0, uint64_t(n) + 51);
    const std::vector<double> xd(x.begin(), x.end());
    const std::string shape = "rows " + std::to_string(s.rows) + " heads " + std::to_string(s.heads) + " D " + std::to_string(s.D);
    for (const double theta : {10000.0, 500000.0}) {
      std::vector<double> fwd, inv, mag;
      rope_reference(xd, pos, s, theta, 1.0, fwd, mag);
      rope_reference(xd, pos, s, theta, -1.0, inv, mag);
      // cos and sin rounded to float, two products and a sum: within 4u of |x1| + |x2|; the
      // accumulation one more rounding of the result.
      emu_test::for_each_schedule([&] {
        auto dp = to_device(pos);
        auto dsrc = to_device(with_tail(x));
        auto out = to_device(with_tail(std::vector<float>(sz(n), kSentinel)));
        auto inplace = to_device(with_tail(x));
        auto acc = to_device(with_tail(acc0));
        launch_rope(dp.data(), dsrc.data(), out.data(), s.rows, s.heads, s.D, theta, false, false, nullptr);
        launch_rope(dp.data(), inplace.data(), inplace.data(), s.rows, s.heads, s.D, theta, true, false, nullptr);
        launch_rope(dp.data(), dsrc.data(), acc.data(), s.rows, s.heads, s.D, theta, true, true, nullptr);
        const std::vector<float> got_fwd = to_host(out), got_inv = to_host(inplace), got_acc = to_host(acc), got_src = to_host(dsrc);
        Failures ff, fi, fa, fs;
        for (int64_t j = 0; j < n; ++j) {
          const std::size_t k = sz(j);
          const double tol = 4 * kU * mag[k], want_acc = double(acc0[k]) + inv[k];
          const double ef = std::fabs(got_fwd[k] - fwd[k]), ei = std::fabs(got_inv[k] - inv[k]), ea = std::fabs(got_acc[k] - want_acc);
          worst_f32.add(std::max(ef, ei), mag[k]);
          worst_f32.add(ea, mag[k] + std::fabs(want_acc));
          ff.expect(ef <= tol, [&] { return at(j, got_fwd[k], fwd[k]); });
          fi.expect(ei <= tol, [&] { return at(j, got_inv[k], inv[k]); });
          fa.expect(ea <= tol + kU * std::fabs(want_acc), [&] { return at(j, got_acc[k], want_acc); });
          fs.expect(same_bits(got_src[k], x[k]), [&] { return at(j, got_src[k], x[k]); });
        }
        const std::string what = shape + " theta " + std::to_string(theta);
        expect_none(ff, "rope f32 forward " + what);
        expect_none(fi, "rope f32 inverse in place " + what);
        expect_none(fa, "rope f32 inverse accumulating " + what);
        expect_none(fs, "rope f32 source unchanged " + what);
        expect_tail(got_fwd, sz(n), "rope f32 forward");
        expect_tail(got_inv, sz(n), "rope f32 inverse");
        expect_tail(got_acc, sz(n), "rope f32 accumulating");
      });
    }
    // bf16: q and k held in bf16, rotated in f32 and rounded to the nearest bf16.
    std::vector<uint16_t> xb(sz(n));
    for (std::size_t k = 0; k < xb.size(); ++k) xb[k] = bf16_nearest(x[k]);
    std::vector<double> xbd(xb.size());
    for (std::size_t k = 0; k < xb.size(); ++k) xbd[k] = bf16_to_float(xb[k]);
    std::vector<double> fwd, mag;
    rope_reference(xbd, pos, s, 10000.0, 1.0, fwd, mag);
    emu_test::for_each_schedule([&] {
      std::vector<uint16_t> padded = xb;
      padded.insert(padded.end(), kTail, kSentinelBits);
      auto dp = to_device(pos);
      auto dsrc = to_device(padded);
      auto out = to_device(std::vector<uint16_t>(sz(n) + kTail, kSentinelBits));
      auto inplace = to_device(padded);
      launch_rope(dp.data(), dsrc.data(), out.data(), s.rows, s.heads, s.D, 10000.0, nullptr);
      launch_rope(dp.data(), inplace.data(), inplace.data(), s.rows, s.heads, s.D, 10000.0, nullptr);
      for (const auto* buf : {&out, &inplace}) {
        const std::vector<uint16_t> got = to_host(*buf);
        Failures f, tail;
        for (int64_t j = 0; j < n; ++j) {
          const std::size_t k = sz(j);
          const double tol = 4 * kU * mag[k];
          worst_bf16.add(std::fabs(double(bf16_to_float(got[k])) - fwd[k]), mag[k]);
          f.expect(bf16_close(got[k], fwd[k], tol), [&] { return at(j, bf16_to_float(got[k]), fwd[k]); });
        }
        for (std::size_t k = sz(n); k < got.size(); ++k) tail.expect(got[k] == kSentinelBits, [&] { return std::to_string(k); });
        expect_none(f, std::string("rope bf16 ") + (buf == &inplace ? "in place " : "") + shape);
        expect_none(tail, "rope bf16 (sentinel tail) " + shape);
      }
    });
  }
  emu_test::report_worst("rope f32", worst_f32.abs, worst_f32.rel);
  emu_test::report_worst("rope bf16 (vs float64)", worst_bf16.abs, worst_bf16.rel);
}

TEST_CASE("cross_entropy_rows gives each row's loss and logit gradient, padding and ignored rows zero") {
  Worst worst_loss, worst_grad;
  for (const CrossEntropyCase& cc : std::vector<CrossEntropyCase>{{1, 45, 45}, {7, 48, 45}, {257, 1000, 1000}, {7, 1024, 1000}}) {
    check_cross_entropy(cc, 0.0, {false, true}, worst_loss, worst_grad);
  }
  emu_test::report_worst("cross_entropy_rows loss", worst_loss.abs, worst_loss.rel);
  emu_test::report_worst("cross_entropy_rows dz", worst_grad.abs, worst_grad.rel);
}

TEST_CASE("cross_entropy_rows over 1100 rows, most of them ignored as in a padded batch") {
  // A block whose row is ignored returns before its barriers: the interpreter runs it cheaply.
  Worst worst_loss, worst_grad;
  check_cross_entropy({1100, 45, 45}, 0.75, {true}, worst_loss, worst_grad);
  emu_test::report_worst("cross_entropy_rows loss (1100 rows)", worst_loss.abs, worst_loss.rel);
  emu_test::report_worst("cross_entropy_rows dz (1100 rows)", worst_grad.abs, worst_grad.rel);
}

TEST_CASE("cross_entropy_rows_bf16: bf16 logits in one pass for max and sum, the gradient in place in bf16") {
  Worst worst_loss, worst_grad;
  for (const CrossEntropyCase& cc :
       std::vector<CrossEntropyCase>{{1, 45, 45}, {7, 48, 45}, {257, 1000, 1000}, {7, 1024, 1000}, {3, 2049, 2000}}) {
    check_cross_entropy(cc, 0.0, {false, true}, worst_loss, worst_grad, /*bf16=*/true);
  }
  check_cross_entropy({300, 45, 45}, 0.75, {true}, worst_loss, worst_grad, /*bf16=*/true);
  emu_test::report_worst("cross_entropy_rows_bf16 loss", worst_loss.abs, worst_loss.rel);
  emu_test::report_worst("cross_entropy_rows_bf16 dz (with its bf16 rounding)", worst_grad.abs, worst_grad.rel);
}

TEST_CASE("add_column_sums (and its bf16 twin) fills its ones vector over the whole grid before refusing the cuBLASLt product") {
  // fill_kernel writes only the workspace's ones, which only the product (cuBLASLt, not run by the
  // interpreter) reads: what is checked is that it runs over blocks_for(rows) blocks of 256
  // threads, within its allocation's guard, exactly when the ones vector grows.
  static int64_t largest = 0;
  int step = 0;
  emu_test::for_each_schedule([&] {
    for (const int64_t rows : {int64_t(1100 + step), int64_t(7), int64_t(1101 + step)}) {
      cuda::DeviceBuffer<float> m(sz(rows * 45)), db(45);
      const emu::Stats before = emu::stats();
      CHECK_THROWS_WITH(add_column_sums(m.data(), db.data(), rows, 45, nullptr), doctest::Contains("cuBLASLt"));
      const emu::Stats after = emu::stats();
      const bool grows = rows > largest;
      largest = std::max(largest, rows);
      const uint64_t blocks = uint64_t((rows + 255) / 256);
      CHECK(after.launches - before.launches == (grows ? 1u : 0u));
      CHECK(after.threads - before.threads == (grows ? blocks * 256 : 0u));
      // Its bf16 twin shares the ones vector: no fill when it is large enough, then the product.
      cuda::DeviceBuffer<uint16_t> m16(sz(rows * 45));
      CHECK_THROWS_WITH(add_column_sums_bf16(m16.data(), db.data(), rows, 45, nullptr), doctest::Contains("cuBLASLt"));
      CHECK(emu::stats().launches == after.launches);
    }
    step += 2;
  });
}
