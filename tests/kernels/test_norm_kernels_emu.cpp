// The norm kernels of the CUDA layers (plugins/layers/norm/norm_kernels.cu), run by the kernel
// interpreter through their launchers (norm_kernels.hpp) under every test schedule, against
// float64 norms written here: the forward (layernorm with and without a bias, rmsnorm; x -> y in
// f32 -> f32, f32 -> bf16 and bf16 -> bf16) with its saved statistics, the input gradient (x in f32
// or bf16, written or added into dx) with the parameter gradients in the same pass (rows of at most
// 1024: a partial per warp of 32 rows; wider rows in two passes), and the parameter gradients alone
// (up to 256 rows added straight into dw and db; more rows summed by chunks into partials, then the
// partials by lanes of chunks),
// on odd row counts and widths. A bf16 output is checked bit for bit as the round-to-nearest-even
// of the kernel's own f32 output from the same input, and every output is checked where the
// kernels must not write (NaN sentinels past the end, dw and db pre-filled and added into).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "emu_support.hpp"
#include "norm_kernels.hpp"

using namespace ablate;
using ablate::emu_test::bf16_nearest;
using ablate::emu_test::bf16_to_float;
using ablate::emu_test::bits_of;
using ablate::emu_test::float_of;
using ablate::emu_test::to_device;

namespace {

constexpr double kU = 0x1p-24;     // the unit roundoff of f32
constexpr double kBf16U = 0x1p-8;  // and of bf16 (8 significant bits)
constexpr float kEps = 1e-5f;
constexpr std::size_t kPad = 5;                  // elements after each output, which no kernel may write
constexpr uint32_t kSentinelBits = 0x7FC0BEEFu;  // a NaN no kernel computes
constexpr uint16_t kSentinelBf16 = 0x7FEDu;

enum class Norm { layernorm_bias, layernorm, rmsnorm };
constexpr Norm kNorms[] = {Norm::layernorm_bias, Norm::layernorm, Norm::rmsnorm};

bool is_rms(Norm n) { return n == Norm::rmsnorm; }
bool has_bias(Norm n) { return n == Norm::layernorm_bias; }
const char* name_of(Norm n) {
  return n == Norm::layernorm_bias ? "layernorm with bias" : n == Norm::layernorm ? "layernorm without bias" : "rmsnorm";
}

template <class T>
T sentinel();
template <>
float sentinel<float>() {
  return float_of(kSentinelBits);
}
template <>
uint16_t sentinel<uint16_t>() {
  return kSentinelBf16;
}

bool is_sentinel(float v) { return bits_of(v) == kSentinelBits; }
bool is_sentinel(uint16_t v) { return v == kSentinelBf16; }

template <class... A>
std::string str(const A&... a) {
  std::ostringstream s;
  s.precision(9);
  (s << ... << a);
  return s.str();
}

// Counts the elements that fail, describing the first (the description is built only then).
struct Failures {
  std::size_t count = 0;
  std::string first;
  template <class F>
  void expect(bool ok, F&& describe) {
    if (!ok && count++ == 0) first = describe();
  }
};

#define CHECK_NO_FAILURES(f) \
  do {                       \
    INFO((f).first);         \
    CHECK((f).count == 0);   \
  } while (0)

// The worst error of a kernel over its cases: absolute, and relative to the magnitude the error
// scales with (the largest |y| of the row; the largest magnitude of dx's terms in the row; the
// magnitudes of a column's terms summed, for dw and db).
struct Worst {
  double abs = 0.0, rel = 0.0;
  void add(double err, double scale) {
    abs = std::max(abs, err);
    rel = std::max(rel, err / std::max(scale, 1e-30));
  }
};

// The depth of a warp's row sum: ceil(in / 32) terms summed by each lane, then 5 shuffle levels.
// A float sum of that depth is within depth * u of the sum of the terms' magnitudes.
double warp_sum_depth(int64_t in) { return double((in + 31) / 32 + 5); }

// The inputs of a case: x (its f32 values, and the bf16 nearest them with their values), the
// weight and bias, an output gradient.
struct Problem {
  int64_t rows = 0, in = 0;
  std::vector<float> x, w, b, dy;
  std::vector<uint16_t> x_bf16;
  std::vector<float> x_bf16_values;
  std::size_t size() const { return std::size_t(rows * in); }
};

Problem make_problem(int64_t rows, int64_t in, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Problem p;
  p.rows = rows;
  p.in = in;
  p.x.resize(p.size());
  p.dy.resize(p.size());
  p.w.resize(std::size_t(in));
  p.b.resize(std::size_t(in));
  for (float& v : p.x) v = 3.0f + 2.0f * n(rng);  // an offset and a scale the norm must remove
  for (auto* v : {&p.w, &p.b, &p.dy}) {
    for (float& e : *v) e = n(rng);
  }
  for (float v : p.x) {
    p.x_bf16.push_back(bf16_nearest(v));
    p.x_bf16_values.push_back(bf16_to_float(p.x_bf16.back()));
  }
  return p;
}

// A row's statistics in float64: mean (0 for rmsnorm), rstd, and the mean magnitude of x.
struct RowStats {
  double mean = 0.0, rstd = 0.0, mean_abs = 0.0;
};

RowStats row_stats(bool rms, const float* x, int64_t in) {
  RowStats s;
  for (int64_t c = 0; c < in; ++c) {
    s.mean += x[c];
    s.mean_abs += std::abs(double(x[c]));
  }
  s.mean = rms ? 0.0 : s.mean / double(in);
  s.mean_abs /= double(in);
  double sq = 0.0;
  for (int64_t c = 0; c < in; ++c) sq += (x[c] - s.mean) * (x[c] - s.mean);
  s.rstd = 1.0 / std::sqrt(sq / double(in) + double(kEps));
  return s;
}

// saved as the forward writes it (layernorm: means then rstds; rmsnorm: rstds), from float64
// statistics rounded to f32, the input of the backward cases.
std::vector<float> saved_from_stats(bool rms, const Problem& p, const std::vector<float>& x) {
  std::vector<float> saved(std::size_t(rms ? p.rows : 2 * p.rows));
  for (int64_t r = 0; r < p.rows; ++r) {
    const RowStats s = row_stats(rms, x.data() + r * p.in, p.in);
    if (rms) {
      saved[std::size_t(r)] = float(s.rstd);
    } else {
      saved[std::size_t(r)] = float(s.mean);
      saved[std::size_t(p.rows + r)] = float(s.rstd);
    }
  }
  return saved;
}

// --- forward ------------------------------------------------------------------------------------

template <class Out>
struct ForwardResult {
  std::vector<Out> y;
  std::vector<float> saved;
};

// The launcher on x (f32 or bf16 bits), y and saved pre-filled with sentinels (and kPad more).
template <class In, class Out>
ForwardResult<Out> run_forward(Norm norm, const Problem& p, const std::vector<In>& x) {
  cuda::DeviceBuffer<In> d_x = to_device(x);
  cuda::DeviceBuffer<float> d_w = to_device(p.w), d_b = to_device(p.b);
  cuda::DeviceBuffer<Out> d_y = to_device(std::vector<Out>(p.size() + kPad, sentinel<Out>()));
  cuda::DeviceBuffer<float> d_saved = to_device(std::vector<float>(std::size_t(2 * p.rows) + kPad, sentinel<float>()));
  cuda_layers::launch_norm_forward(is_rms(norm), d_x.data(), d_w.data(), has_bias(norm) ? d_b.data() : nullptr, d_y.data(),
                                   d_saved.data(), p.rows, p.in, kEps, nullptr);
  ForwardResult<Out> r;
  r.y.resize(d_y.size());
  r.saved.resize(d_saved.size());
  d_y.download(r.y.data());
  d_saved.download(r.saved.data());
  return r;
}

// y (as f32 values) and saved against the float64 norm of x.
//   mean: a warp sum of depth k (warp_sum_depth), then a division: within (k + 1) u mean|x|.
//   rstd: the squares' sum within (k + 3) u relative (the subtraction, the square, the sum; the
//         mean's error enters only squared), halved by the square root, then the root and the
//         division: within (k + 4) u relative.
//   y = ((x - mean) rstd) w + b: |w| rstd times the mean's error, |w xhat| times rstd's error and
//         two roundings, and one rounding of y: within (k + 8) u (|w| (|xhat| + rstd mean|x|) + |y|).
// A bf16 y adds its own rounding, 2^-8 of |y|.
void check_forward(Norm norm, const Problem& p, const std::vector<float>& x, const std::vector<float>& y,
                   const std::vector<float>& saved, bool bf16_y, Worst& worst) {
  const bool rms = is_rms(norm);
  const double k = warp_sum_depth(p.in);
  Failures fy, fs;
  for (int64_t r = 0; r < p.rows; ++r) {
    const RowStats s = row_stats(rms, x.data() + r * p.in, p.in);
    std::vector<double> want(std::size_t(p.in)), tol(std::size_t(p.in));
    double scale = 0.0;
    for (int64_t c = 0; c < p.in; ++c) {
      const double xhat = (x[std::size_t(r * p.in + c)] - s.mean) * s.rstd;
      const double yc = xhat * p.w[std::size_t(c)] + (has_bias(norm) ? p.b[std::size_t(c)] : 0.0);
      double t = (k + 8) * kU * (std::abs(p.w[std::size_t(c)]) * (std::abs(xhat) + (rms ? 0.0 : s.rstd * s.mean_abs)) + std::abs(yc));
      if (bf16_y) t += kBf16U * (std::abs(yc) + t);
      want[std::size_t(c)] = yc;
      tol[std::size_t(c)] = t;
      scale = std::max(scale, std::abs(yc));
    }
    for (int64_t c = 0; c < p.in; ++c) {
      const std::size_t i = std::size_t(r * p.in + c);
      const double err = std::abs(double(y[i]) - want[std::size_t(c)]);
      fy.expect(err <= tol[std::size_t(c)], [&] {
        return str("y[", r, ", ", c, "] = ", y[i], ", float64 ", want[std::size_t(c)], ", tolerance ", tol[std::size_t(c)]);
      });
      if (err == err) worst.add(err, scale);
    }
    const float got_rstd = saved[std::size_t(rms ? r : p.rows + r)];
    const double rstd_err = std::abs(double(got_rstd) - s.rstd);
    fs.expect(rstd_err <= (k + 4) * kU * s.rstd, [&] { return str("rstd of row ", r, " = ", got_rstd, ", float64 ", s.rstd); });
    if (!rms) {
      const float got_mean = saved[std::size_t(r)];
      fs.expect(std::abs(double(got_mean) - s.mean) <= (k + 1) * kU * s.mean_abs,
                [&] { return str("mean of row ", r, " = ", got_mean, ", float64 ", s.mean); });
    }
  }
  for (std::size_t i = std::size_t(rms ? p.rows : 2 * p.rows); i < saved.size(); ++i) {
    fs.expect(is_sentinel(saved[i]), [&] { return str("saved[", i, "] written, past the statistics"); });
  }
  CHECK_NO_FAILURES(fy);
  CHECK_NO_FAILURES(fs);
}

// The elements of y past rows * in keep their sentinel.
template <class Out>
void check_tail_untouched(const Problem& p, const std::vector<Out>& y) {
  Failures f;
  for (std::size_t i = p.size(); i < y.size(); ++i) {
    f.expect(is_sentinel(y[i]), [&] { return str("y[", i, "] written, past rows * in = ", p.size()); });
  }
  CHECK_NO_FAILURES(f);
}

// A bf16 y is the nearest bf16 (ties to even) of the f32 y from the same x, and the statistics
// are the f32 ones, bit for bit.
void check_bf16_of_f32(const ForwardResult<uint16_t>& bf, const ForwardResult<float>& f32, const Problem& p) {
  Failures f;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const uint16_t want = bf16_nearest(f32.y[i]);
    f.expect(bf.y[i] == want,
             [&] { return str("bf16 y[", i, "] = 0x", std::hex, bf.y[i], ", f32 y ", f32.y[i], " rounds to 0x", want); });
  }
  for (std::size_t i = 0; i < f32.saved.size(); ++i) {
    f.expect(bits_of(bf.saved[i]) == bits_of(f32.saved[i]),
             [&] { return str("saved[", i, "] = ", bf.saved[i], " with a bf16 y, ", f32.saved[i], " with an f32 y"); });
  }
  CHECK_NO_FAILURES(f);
}

std::vector<float> bf16_values(const std::vector<uint16_t>& y, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = bf16_to_float(y[i]);
  return v;
}

// --- backward -----------------------------------------------------------------------------------

// dx in float64 from the float64 statistics, with its tolerance. The kernel reads the statistics
// rounded to f32 (saved_from_stats), so its xhat is within 3 u (|xhat| + a), a = rstd |mean|; its
// row means of dxhat and dxhat xhat are warp sums of depth k of terms that carry that error and
// one rounding; dx = rstd (dxhat - m1 - xhat m2) adds five roundings. Altogether within
//   (k + 8) u rstd (|dxhat| + mean|dxhat| + (|xhat| + a) mean(|dxhat| (|xhat| + a))).
// mag is the bracket times rstd: the magnitude of the terms, which the errors are relative to.
void reference_dx(bool rms, const Problem& p, const std::vector<float>& x, std::vector<double>& dx, std::vector<double>& tol,
                  std::vector<double>& mag) {
  dx.assign(p.size(), 0.0);
  tol.assign(p.size(), 0.0);
  mag.assign(p.size(), 0.0);
  const double k = warp_sum_depth(p.in);
  for (int64_t r = 0; r < p.rows; ++r) {
    const RowStats s = row_stats(rms, x.data() + r * p.in, p.in);
    const double a = s.rstd * std::abs(s.mean);
    double m1 = 0.0, m2 = 0.0, mag1 = 0.0, mag2 = 0.0;
    for (int64_t c = 0; c < p.in; ++c) {
      const std::size_t i = std::size_t(r * p.in + c);
      const double xhat = (x[i] - s.mean) * s.rstd, dxhat = double(p.dy[i]) * p.w[std::size_t(c)];
      m1 += dxhat;
      m2 += dxhat * xhat;
      mag1 += std::abs(dxhat);
      mag2 += std::abs(dxhat) * (std::abs(xhat) + a);
    }
    m1 = rms ? 0.0 : m1 / double(p.in);
    m2 /= double(p.in);
    mag1 /= double(p.in);
    mag2 /= double(p.in);
    for (int64_t c = 0; c < p.in; ++c) {
      const std::size_t i = std::size_t(r * p.in + c);
      const double xhat = (x[i] - s.mean) * s.rstd, dxhat = double(p.dy[i]) * p.w[std::size_t(c)];
      dx[i] = s.rstd * (dxhat - m1 - xhat * m2);
      mag[i] = s.rstd * (std::abs(dxhat) + mag1 + (std::abs(xhat) + a) * mag2);
      tol[i] = (k + 8) * kU * mag[i];
    }
  }
}

// The column sums of the parameter gradients in float64 from the kernel's own inputs (x as the
// kernel reads it and the saved f32 statistics), added to the pre-filled dw and db, with their
// tolerance. Each term g (x - mean) rstd carries three roundings; a column is a float sum of
// depth d: up to 256 rows and the add into dw with one chunk; with more, a chunk's 256 rows, a
// lane's `per` partials, the 32 lanes' sums and the add. Within (d + 3) u (sum|term| + |dw0|).
struct ParamRef {
  std::vector<double> dw, db, dw_tol, db_tol, dw_scale, db_scale;
};

double param_sum_depth(int64_t rows) {
  if (rows <= 256) return double(rows);
  const int64_t chunks = (rows + 255) / 256, per = (chunks + 31) / 32;
  return double(256 + per + 32 + 1);
}

ParamRef reference_params(bool rms, const Problem& p, const std::vector<float>& x, const std::vector<float>& saved,
                          const std::vector<float>& dw0, const std::vector<float>& db0) {
  const double d = param_sum_depth(p.rows);
  ParamRef ref;
  const std::size_t in = std::size_t(p.in);
  ref.dw.assign(in, 0.0);
  ref.db.assign(in, 0.0);
  std::vector<double> mag_w(in, 0.0), mag_b(in, 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const double mean = rms ? 0.0 : saved[std::size_t(r)];
    const double rstd = rms ? saved[std::size_t(r)] : saved[std::size_t(p.rows + r)];
    for (std::size_t c = 0; c < in; ++c) {
      const std::size_t i = std::size_t(r) * in + c;
      const double term = double(p.dy[i]) * (x[i] - mean) * rstd;
      ref.dw[c] += term;
      ref.db[c] += p.dy[i];
      mag_w[c] += std::abs(term);
      mag_b[c] += std::abs(double(p.dy[i]));
    }
  }
  for (std::size_t c = 0; c < in; ++c) {
    ref.dw_scale.push_back(mag_w[c]);
    ref.db_scale.push_back(mag_b[c]);
    ref.dw_tol.push_back((d + 3) * kU * (mag_w[c] + std::abs(dw0[c])));
    ref.db_tol.push_back((d + 3) * kU * (mag_b[c] + std::abs(db0[c])));
    ref.dw[c] += dw0[c];
    ref.db[c] += db0[c];
  }
  return ref;
}

struct BackwardResult {
  std::vector<float> dx, dw, db;
};

// Known values dw and db start from (they are added into), and dx where the case accumulates.
std::vector<float> prefill(std::size_t n, float base, float step, int period) {
  std::vector<float> v(n + kPad, sentinel<float>());
  for (std::size_t i = 0; i < n; ++i) v[i] = base + step * float(int(i) % period);
  return v;
}

// The backward launcher: dx (when with_dx) starts as dx0 (accumulate) or NaN sentinels, dw and db
// as their known values, each with kPad sentinels after; db is passed for the biased layernorm.
template <class In>
BackwardResult run_backward(Norm norm, const Problem& p, const std::vector<In>& x, const std::vector<float>& saved, bool with_dx,
                            bool accumulate, const std::vector<float>& dx0, const std::vector<float>& dw0,
                            const std::vector<float>& db0) {
  cuda::DeviceBuffer<In> d_x = to_device(x);
  cuda::DeviceBuffer<float> d_w = to_device(p.w), d_dy = to_device(p.dy), d_saved = to_device(saved);
  cuda::DeviceBuffer<float> d_dx = to_device(accumulate ? dx0 : std::vector<float>(p.size() + kPad, sentinel<float>()));
  cuda::DeviceBuffer<float> d_dw = to_device(dw0), d_db = to_device(db0);
  cuda_layers::launch_norm_backward(is_rms(norm), d_x.data(), d_w.data(), d_dy.data(), d_saved.data(), with_dx ? d_dx.data() : nullptr,
                                    accumulate, d_dw.data(), has_bias(norm) ? d_db.data() : nullptr, p.rows, p.in, nullptr);
  BackwardResult r;
  r.dx.resize(d_dx.size());
  r.dw.resize(d_dw.size());
  r.db.resize(d_db.size());
  d_dx.download(r.dx.data());
  d_dw.download(r.dw.data());
  d_db.download(r.db.data());
  return r;
}

// dw (and db where passed) against the float64 sums; the elements past `in`, and db when it is
// not passed, keep what they held.
void check_params(Norm norm, const Problem& p, const BackwardResult& got, const ParamRef& ref, const std::vector<float>& db0,
                  Worst& worst) {
  Failures f;
  const std::size_t in = std::size_t(p.in);
  for (std::size_t c = 0; c < in; ++c) {
    const double err = std::abs(double(got.dw[c]) - ref.dw[c]);
    f.expect(err <= ref.dw_tol[c],
             [&] { return str("dw[", c, "] = ", got.dw[c], ", float64 ", ref.dw[c], ", tolerance ", ref.dw_tol[c]); });
    if (err == err) worst.add(err, std::max(ref.dw_scale[c], std::abs(ref.dw[c])));
    if (has_bias(norm)) {
      const double eb = std::abs(double(got.db[c]) - ref.db[c]);
      f.expect(eb <= ref.db_tol[c],
               [&] { return str("db[", c, "] = ", got.db[c], ", float64 ", ref.db[c], ", tolerance ", ref.db_tol[c]); });
      if (eb == eb) worst.add(eb, std::max(ref.db_scale[c], std::abs(ref.db[c])));
    } else {
      f.expect(bits_of(got.db[c]) == bits_of(db0[c]), [&] { return str("db[", c, "] written though db was not passed"); });
    }
  }
  for (std::size_t c = in; c < in + kPad; ++c) {
    f.expect(is_sentinel(got.dw[c]) && is_sentinel(got.db[c]), [&] { return str("dw or db [", c, "] written, past in = ", in); });
  }
  CHECK_NO_FAILURES(f);
}

// dx against the float64 backward: written, or added to dx0 (one more rounding of the sum).
void check_dx(bool rms, const Problem& p, const std::vector<float>& x, const BackwardResult& got, bool accumulate,
              const std::vector<float>& dx0, Worst& worst) {
  std::vector<double> want, tol, mag;
  reference_dx(rms, p, x, want, tol, mag);
  Failures f;
  for (int64_t r = 0; r < p.rows; ++r) {
    double scale = 0.0;
    for (int64_t c = 0; c < p.in; ++c) {
      const std::size_t i = std::size_t(r * p.in + c);
      scale = std::max(scale, mag[i] + (accumulate ? std::abs(double(dx0[i])) : 0.0));
    }
    for (int64_t c = 0; c < p.in; ++c) {
      const std::size_t i = std::size_t(r * p.in + c);
      const double w = accumulate ? double(dx0[i]) + want[i] : want[i];
      const double t = accumulate ? tol[i] + kU * (std::abs(double(dx0[i])) + std::abs(want[i]) + tol[i]) : tol[i];
      const double err = std::abs(double(got.dx[i]) - w);
      f.expect(err <= t, [&] { return str("dx[", r, ", ", c, "] = ", got.dx[i], ", float64 ", w, ", tolerance ", t); });
      if (err == err) worst.add(err, scale);
    }
  }
  for (std::size_t i = p.size(); i < got.dx.size(); ++i) {
    f.expect(is_sentinel(got.dx[i]), [&] { return str("dx[", i, "] written, past rows * in = ", p.size()); });
  }
  CHECK_NO_FAILURES(f);
}

// The results of the first schedule, which every other must reproduce bit for bit (the column
// sums are in a fixed order, and nothing else depends on the threads' order either).
struct FirstRun {
  std::vector<std::vector<float>> results;
  std::size_t next = 0;
  void same_as_first(const std::vector<float>& v, const char* what) {
    if (next == results.size()) {
      results.push_back(v);
      ++next;
      return;
    }
    const std::vector<float>& first = results[next++];
    Failures f;
    for (std::size_t i = 0; i < v.size(); ++i) {
      f.expect(bits_of(v[i]) == bits_of(first[i]),
               [&] { return str(what, "[", i, "] = ", v[i], ", ", first[i], " under the first schedule"); });
    }
    CHECK_NO_FAILURES(f);
  }
};

constexpr int64_t kWidths[] = {1, 31, 45, 100, 257};

// The forward's instantiations (x -> y).
enum Io : unsigned { f32_f32 = 1, f32_bf16 = 2, bf16_bf16 = 4, all_io = 7 };

// One forward case through the instantiations `io` names; a bf16 y is checked against the f32
// launch on the same x values.
void forward_case(Norm norm, const Problem& p, unsigned io, Worst& worst) {
  if ((io & (f32_f32 | f32_bf16)) != 0) {
    const ForwardResult<float> f32 = run_forward<float, float>(norm, p, p.x);
    if ((io & f32_f32) != 0) {
      check_forward(norm, p, p.x, f32.y, f32.saved, false, worst);
      check_tail_untouched(p, f32.y);
    }
    if ((io & f32_bf16) != 0) {
      const ForwardResult<uint16_t> bf = run_forward<float, uint16_t>(norm, p, p.x);
      check_bf16_of_f32(bf, f32, p);
      check_forward(norm, p, p.x, bf16_values(bf.y, p.size()), bf.saved, true, worst);
      check_tail_untouched(p, bf.y);
    }
  }
  if ((io & bf16_bf16) != 0) {
    const ForwardResult<uint16_t> bf = run_forward<uint16_t, uint16_t>(norm, p, p.x_bf16);
    check_bf16_of_f32(bf, run_forward<float, float>(norm, p, p.x_bf16_values), p);
    check_forward(norm, p, p.x_bf16_values, bf16_values(bf.y, p.size()), bf.saved, true, worst);
    check_tail_untouched(p, bf.y);
  }
}

const char* io_name(unsigned io) {
  return io == f32_f32 ? "f32 -> f32" : io == f32_bf16 ? "f32 -> bf16" : io == bf16_bf16 ? "bf16 -> bf16" : "every x -> y";
}

// One input gradient case (the parameter gradients of the same launch are checked too).
void input_grad_case(Norm norm, const Problem& p, bool bf16_x, bool accumulate, Worst& worst, Worst& params) {
  const std::vector<float>& x = bf16_x ? p.x_bf16_values : p.x;
  const std::vector<float> saved = saved_from_stats(is_rms(norm), p, x);
  const std::vector<float> dx0 = prefill(p.size(), -1.625f, 0.25f, 13);
  const std::vector<float> dw0 = prefill(std::size_t(p.in), 2.5f, -0.75f, 7);
  const std::vector<float> db0 = prefill(std::size_t(p.in), -3.0f, 1.25f, 5);
  const BackwardResult got = bf16_x ? run_backward(norm, p, p.x_bf16, saved, true, accumulate, dx0, dw0, db0)
                                    : run_backward(norm, p, p.x, saved, true, accumulate, dx0, dw0, db0);
  check_dx(is_rms(norm), p, x, got, accumulate, dx0, worst);
  check_params(norm, p, got, reference_params(is_rms(norm), p, x, saved, dw0, db0), db0, params);
}

// A case of many rows: rows / 8 blocks of 256 threads, some 4 us a thread in the interpreter, so
// these few stand for the rest (every width, norm and variant runs at 1 and 7 rows).
struct LargeCase {
  int64_t rows, in;
  Norm norm;
  unsigned io;              // forward
  bool bf16_x, accumulate;  // input gradient
};

}  // namespace

TEST_CASE("the norms' forward matches float64, and a bf16 y is the f32 y rounded to nearest even") {
  const LargeCase large[] = {
      {257, 31, Norm::layernorm_bias, f32_f32 | f32_bf16, false, false},
      {257, 100, Norm::layernorm, f32_bf16, false, false},
      {257, 257, Norm::rmsnorm, bf16_bf16, false, false},
      {1100, 45, Norm::layernorm_bias, f32_f32, false, false},
      // Past 1024 values a row is read three times instead of held in registers.
      {9, 1024, Norm::layernorm_bias, all_io, false, false},
      {9, 1025, Norm::layernorm_bias, all_io, false, false},
      {9, 1500, Norm::rmsnorm, all_io, false, false},
  };
  Worst worst;
  emu_test::for_each_schedule([&] {
    uint64_t seed = 1;
    for (int64_t rows : {int64_t(1), int64_t(7)}) {
      for (int64_t in : kWidths) {
        const Problem p = make_problem(rows, in, seed++);
        for (Norm norm : kNorms) {
          INFO(str(name_of(norm), ", rows ", rows, ", in ", in));
          forward_case(norm, p, all_io, worst);
        }
      }
    }
    for (const LargeCase& c : large) {
      INFO(str(name_of(c.norm), ", rows ", c.rows, ", in ", c.in, ", ", io_name(c.io)));
      forward_case(c.norm, make_problem(c.rows, c.in, seed++), c.io, worst);
    }
  });
  emu_test::report_worst("norm_forward_kernel", worst.abs, worst.rel);
}

TEST_CASE("the norms' input gradient matches float64, written or added into dx, x in f32 or bf16, the parameter gradients with it") {
  // Up to 1024 wide in one pass with the parameter gradients (1100 rows: 35 partials of 32 rows,
  // the last short); 1030 wide in two passes.
  const LargeCase large[] = {
      {257, 45, Norm::layernorm_bias, 0, false, true}, {257, 257, Norm::rmsnorm, 0, true, false},
      {1100, 100, Norm::layernorm, 0, false, false},   {33, 1024, Norm::layernorm_bias, 0, true, true},
      {9, 1030, Norm::layernorm_bias, 0, false, true},
  };
  Worst worst, params;
  emu_test::for_each_schedule([&] {
    uint64_t seed = 100;
    for (int64_t rows : {int64_t(1), int64_t(7)}) {
      for (int64_t in : kWidths) {
        const Problem p = make_problem(rows, in, seed++);
        for (Norm norm : kNorms) {
          for (bool bf16_x : {false, true}) {
            for (bool accumulate : {false, true}) {
              INFO(str(name_of(norm), ", rows ", rows, ", in ", in, bf16_x ? ", x bf16" : ", x f32",
                       accumulate ? ", accumulating" : ""));
              input_grad_case(norm, p, bf16_x, accumulate, worst, params);
            }
          }
        }
      }
    }
    for (const LargeCase& c : large) {
      INFO(str(name_of(c.norm), ", rows ", c.rows, ", in ", c.in, c.bf16_x ? ", x bf16" : ", x f32",
               c.accumulate ? ", accumulating" : ""));
      input_grad_case(c.norm, make_problem(c.rows, c.in, seed++), c.bf16_x, c.accumulate, worst, params);
    }
  });
  emu_test::report_worst("norm_input_grad_kernel", worst.abs, worst.rel);
}

TEST_CASE("parameter gradients of up to 256 rows are added straight into dw and db") {
  Worst worst;
  FirstRun first;
  emu_test::for_each_schedule([&] {
    first.next = 0;
    uint64_t seed = 200;
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(256)}) {
      for (int64_t in : {int64_t(1), int64_t(31), int64_t(45), int64_t(100), int64_t(257), int64_t(600)}) {
        const Problem p = make_problem(rows, in, seed++);
        for (Norm norm : kNorms) {
          for (bool bf16_x : {false, true}) {
            INFO(str(name_of(norm), ", rows ", rows, ", in ", in, bf16_x ? ", x bf16" : ", x f32"));
            const std::vector<float>& x = bf16_x ? p.x_bf16_values : p.x;
            const std::vector<float> saved = saved_from_stats(is_rms(norm), p, x);
            const std::vector<float> dw0 = prefill(std::size_t(in), 2.5f, -0.75f, 7), db0 = prefill(std::size_t(in), -3.0f, 1.25f, 5);
            const BackwardResult got = bf16_x ? run_backward(norm, p, p.x_bf16, saved, false, false, {}, dw0, db0)
                                              : run_backward(norm, p, p.x, saved, false, false, {}, dw0, db0);
            check_params(norm, p, got, reference_params(is_rms(norm), p, x, saved, dw0, db0), db0, worst);
            first.same_as_first(got.dw, "dw");
            first.same_as_first(got.db, "db");
          }
        }
      }
    }
  });
  emu_test::report_worst("norm_param_chunk_kernel", worst.abs, worst.rel);
}

TEST_CASE("parameter gradients of more rows are summed by chunks of 256, then the chunks in order") {
  // 257 rows: two chunks; 1100: five; 8500: 34, so that the 32 lanes of the second stage sum two
  // chunks each and some none.
  Worst worst;
  FirstRun first;
  emu_test::for_each_schedule([&] {
    first.next = 0;
    uint64_t seed = 300;
    for (int64_t rows : {int64_t(257), int64_t(1100), int64_t(8500)}) {
      for (int64_t in : {int64_t(1), int64_t(31), int64_t(45), int64_t(100), int64_t(257)}) {
        if (rows == 8500 && in > 45) continue;
        const Problem p = make_problem(rows, in, seed++);
        for (Norm norm : kNorms) {
          for (bool bf16_x : {false, true}) {
            INFO(str(name_of(norm), ", rows ", rows, ", in ", in, bf16_x ? ", x bf16" : ", x f32"));
            const std::vector<float>& x = bf16_x ? p.x_bf16_values : p.x;
            const std::vector<float> saved = saved_from_stats(is_rms(norm), p, x);
            const std::vector<float> dw0 = prefill(std::size_t(in), 2.5f, -0.75f, 7), db0 = prefill(std::size_t(in), -3.0f, 1.25f, 5);
            const BackwardResult got = bf16_x ? run_backward(norm, p, p.x_bf16, saved, false, false, {}, dw0, db0)
                                              : run_backward(norm, p, p.x, saved, false, false, {}, dw0, db0);
            check_params(norm, p, got, reference_params(is_rms(norm), p, x, saved, dw0, db0), db0, worst);
            first.same_as_first(got.dw, "dw");
            first.same_as_first(got.db, "db");
          }
        }
      }
    }
  });
  emu_test::report_worst("sum_chunk_partials_kernel", worst.abs, worst.rel);
}

TEST_CASE("norm backward refuses a d_x that overlaps d_y, and launches nothing") {
  // The parameter gradients read d_y after the input gradient is written, so d_x over d_y (whole
  // or in part) would feed them the input gradient: refused before any kernel runs.
  const int64_t rows = 7, in = 45;
  std::vector<float> h(std::size_t(rows * in) * 2, 0.5f), w(std::size_t(in), 1.0f), saved(std::size_t(2 * rows), 1.0f);
  cuda::DeviceBuffer<float> x = to_device(h), dy = to_device(h), d_w = to_device(w), d_saved = to_device(saved);
  cuda::DeviceBuffer<float> dw(static_cast<std::size_t>(in));
  dw.fill_zero();
  const uint64_t launches = emu::stats().launches;
  for (const int64_t shift : {int64_t(0), int64_t(1), rows * in - 1, -(rows * in - 1)}) {
    INFO("d_x = d_y + " << shift);
    float* dx = dy.data() + (shift > 0 ? shift : 0);
    const float* d_y = dy.data() + (shift < 0 ? -shift : 0);
    CHECK_THROWS_WITH(cuda_layers::launch_norm_backward(false, x.data(), d_w.data(), d_y, d_saved.data(), dx, false, dw.data(),
                                                        nullptr, rows, in, nullptr),
                      doctest::Contains("d_x overlaps d_y"));
  }
  CHECK(emu::stats().launches == launches);
  // Adjacent (touching, not overlapping) is allowed.
  cuda::DeviceBuffer<float> both(static_cast<std::size_t>(2 * rows * in));
  both.fill_zero();
  CHECK_NOTHROW(cuda_layers::launch_norm_backward(false, x.data(), d_w.data(), both.data(), d_saved.data(), both.data() + rows * in,
                                                  false, dw.data(), nullptr, rows, in, nullptr));
}
