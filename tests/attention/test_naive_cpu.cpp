// The `naive_cpu` attention backend against an independent dense float64 reference (full T x T
// scores with a mask built from segment ids), finite differences, documents run alone, padding,
// f32 against f64, its refusals and FLOP count, and bitwise determinism across thread counts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "attention_reference.hpp"
#include "attention_support.hpp"
#include "test_support.hpp"

using namespace ablate;
using ablate::test::Inputs;
using ablate::test::make_batch;
using ablate::test::reference_backward;
using ablate::test::reference_forward;
using ablate::test::random_packed_row;
using ablate::test::RowLayout;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Setup {
  Registry registry;
  Params common{"attention", {}};
  Params own{"attention.naive_cpu", {}};
  RunContext run;
  Setup() { registry.load_directories({test::plugin_dir()}); }
  std::unique_ptr<Attention> make(int threads = 0) {
    run.threads = threads;
    return registry.create<Attention>(Kind::attention, "naive_cpu", {common, own, run});
  }
};

template <class T>
TensorView view(std::vector<T>& v, int64_t a, int64_t b, int64_t c, int64_t d) {
  TensorView t;
  t.data = v.data();
  t.dtype = std::is_same_v<T, double> ? DType::f64 : DType::f32;
  t.ndim = 4;
  t.shape = {a, b, c, d};
  REQUIRE(int64_t(v.size()) == a * b * c * d);
  return t;
}

template <class T>
TensorView flat(std::vector<T>& v) {
  TensorView t;
  t.data = v.data();
  t.dtype = std::is_same_v<T, double> ? DType::f64 : DType::f32;
  t.ndim = 1;
  t.shape[0] = int64_t(v.size());
  return t;
}

std::vector<double> random_vector(std::size_t n, std::mt19937& rng, double stddev = 1.0) {
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

template <class To>
std::vector<To> cast(const std::vector<double>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Everything one forward + backward call needs, in element type T.
template <class T>
struct Run {
  AttentionProblem problem;
  std::vector<T> q, k, v, out, d_out, d_q, d_k, d_v;
  std::vector<float> saved32;
  std::vector<double> saved64;
  bool saved_f64 = false;

  Run(const AttentionProblem& p, const std::vector<double>& q0, const std::vector<double>& k0, const std::vector<double>& v0,
      const std::vector<double>& d_out0)
      : problem(p), q(cast<T>(q0)), k(cast<T>(k0)), v(cast<T>(v0)), d_out(cast<T>(d_out0)) {
    problem.dtype = std::is_same_v<T, double> ? DType::f64 : DType::f32;
    out.assign(q.size(), T(kNaN));
    d_q.assign(q.size(), T(kNaN));
    d_k.assign(k.size(), T(kNaN));
    d_v.assign(v.size(), T(kNaN));
  }
  TensorView qv() { return view(q, problem.batch, problem.seq_len, problem.heads, problem.head_dim); }
  TensorView kv(std::vector<T>& x) { return view(x, problem.batch, problem.seq_len, problem.kv_heads, problem.head_dim); }
  TensorView hv(std::vector<T>& x) { return view(x, problem.batch, problem.seq_len, problem.heads, problem.head_dim); }
  TensorView saved(Attention& a) {
    const std::size_t n = std::size_t(a.saved_elements(problem));
    if (saved_f64) {
      saved64.assign(n, kNaN);
      return flat(saved64);
    }
    saved32.assign(n, std::numeric_limits<float>::quiet_NaN());
    return flat(saved32);
  }
  void forward(Attention& a, const Batch& batch) {
    test::attention_forward(a, problem, host_batch_views(batch), qv(), kv(k), kv(v), hv(out), saved(a));
  }
  void backward(Attention& a, const Batch& batch) {
    TensorView s = saved_f64 ? flat(saved64) : flat(saved32);
    test::attention_backward(a, problem, host_batch_views(batch), qv(), kv(k), kv(v), hv(out), s, hv(d_out), hv(d_q), kv(d_k),
                             kv(d_v));
  }
};

template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

template <class A>
double max_abs(const std::vector<A>& a) {
  double m = 0;
  for (A x : a) m = std::max(m, std::abs(double(x)));
  return m;
}

AttentionProblem problem_for(const Batch& batch, int32_t heads, int32_t kv_heads, int32_t head_dim) {
  AttentionProblem p;
  p.batch = batch.rows;
  p.seq_len = batch.seq_len;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.dtype = DType::f64;
  p.device = DeviceType::cpu;
  p.packed = batch.segments.size() > std::size_t(batch.rows);
  return p;
}


Inputs random_inputs(const AttentionProblem& p, std::mt19937& rng) {
  const std::size_t nq = std::size_t(p.batch) * p.seq_len * p.heads * p.head_dim;
  const std::size_t nk = std::size_t(p.batch) * p.seq_len * p.kv_heads * p.head_dim;
  return {random_vector(nq, rng), random_vector(nk, rng), random_vector(nk, rng), random_vector(nq, rng)};
}

// A mixed batch: a padded row, a packed row with random segments (some of length 1), a full row.
Batch mixed_batch(int32_t seq_len, std::mt19937& rng) {
  return make_batch(seq_len, {{{0, seq_len / 2 + 1}}, random_packed_row(seq_len, rng), {{0, 1}, {1, seq_len - 1}}});
}

}  // namespace

TEST_CASE("naive_cpu forward matches a dense float64 reference over padded and packed rows, GQA and odd sizes") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(11);
  struct Shape {
    int32_t seq_len, heads, kv_heads, head_dim;
  };
  const Shape shapes[] = {{13, 2, 2, 5}, {13, 3, 1, 7}, {16, 4, 1, 8}, {9, 6, 2, 3}, {13, 8, 2, 7}, {1, 2, 2, 4}};
  for (const Shape& sh : shapes) {
    for (int layout = 0; layout < 3; ++layout) {
      Batch batch = layout == 0   ? make_batch(sh.seq_len, {{{0, std::max(1, sh.seq_len - 4)}}, {{0, sh.seq_len}}})
                    : layout == 1 ? make_batch(sh.seq_len, {random_packed_row(sh.seq_len, rng), random_packed_row(sh.seq_len, rng)})
                                  : mixed_batch(sh.seq_len, rng);
      const AttentionProblem p = problem_for(batch, sh.heads, sh.kv_heads, sh.head_dim);
      CAPTURE(sh.seq_len);
      CAPTURE(sh.heads);
      CAPTURE(sh.kv_heads);
      CAPTURE(sh.head_dim);
      CAPTURE(layout);
      REQUIRE(attn->supports(p).empty());
      const Inputs in = random_inputs(p, rng);
      Run<double> r(p, in.q, in.k, in.v, in.d_out);
      r.forward(*attn, batch);
      const std::vector<double> want = reference_forward(p, batch, in.q, in.k, in.v);
      CHECK(max_abs_diff(r.out, want) < 1e-12);
    }
  }
}

TEST_CASE("naive_cpu gradients match central finite differences in float64 with segments and GQA") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(5);
  const Batch batch = make_batch(9, {{{0, 4}, {4, 1}, {5, 3}}, {{0, 6}}});
  const AttentionProblem p = problem_for(batch, 4, 2, 3);
  const Inputs in = random_inputs(p, rng);  // d_out plays W in loss = sum(out * W)
  for (bool saved_f64 : {true, false}) {
    CAPTURE(saved_f64);
    Run<double> r(p, in.q, in.k, in.v, in.d_out);
    r.saved_f64 = saved_f64;
    r.forward(*attn, batch);
    r.backward(*attn, batch);
    auto loss = [&](const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
      const std::vector<double> out = reference_forward(p, batch, q, k, v);
      double l = 0;
      for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * in.d_out[i];
      return l;
    };
    const double eps = 1e-6;
    // Saved statistics in f32 leave about 1e-7 relative error in the probabilities; f64 keeps it exact.
    const double tol = saved_f64 ? 1e-8 : 2e-6;
    auto check = [&](int which, const std::vector<double>& grad) {
      std::vector<double> x[3] = {in.q, in.k, in.v};
      for (std::size_t e = 0; e < grad.size(); ++e) {
        const double keep = x[which][e];
        x[which][e] = keep + eps;
        const double up = loss(x[0], x[1], x[2]);
        x[which][e] = keep - eps;
        const double down = loss(x[0], x[1], x[2]);
        x[which][e] = keep;
        const double fd = (up - down) / (2 * eps);
        CAPTURE(which);
        CAPTURE(e);
        REQUIRE(std::abs(grad[e] - fd) <= tol * (1.0 + std::abs(fd)));
      }
    };
    check(0, r.d_q);
    check(1, r.d_k);
    check(2, r.d_v);
  }
}

TEST_CASE("naive_cpu on a packed row equals each document run alone, outputs and gradients") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(23);
  const int32_t T = 17;
  const Batch batch = make_batch(T, {{{0, 5}, {5, 1}, {6, 8}, {14, 2}}, random_packed_row(T, rng)});
  const AttentionProblem p = problem_for(batch, 6, 2, 5);
  const int64_t H = p.heads, G = p.kv_heads, D = p.head_dim;
  const Inputs in = random_inputs(p, rng);
  Run<double> packed(p, in.q, in.k, in.v, in.d_out);
  packed.forward(*attn, batch);
  packed.backward(*attn, batch);
  int documents = 0;
  for (int32_t b = 0; b < batch.rows; ++b) {
    for (int32_t si = batch.row_segments[std::size_t(b)]; si < batch.row_segments[std::size_t(b) + 1]; ++si) {
      const Segment seg = batch.segments[std::size_t(si)];
      const Batch alone = make_batch(seg.length, {{{0, seg.length}}});
      AttentionProblem pa = problem_for(alone, p.heads, p.kv_heads, p.head_dim);
      auto slice = [&](const std::vector<double>& x, int64_t heads) {
        const auto from = x.begin() + (int64_t(b) * T + seg.start) * heads * D;
        return std::vector<double>(from, from + int64_t(seg.length) * heads * D);
      };
      Run<double> one(pa, slice(in.q, H), slice(in.k, G), slice(in.v, G), slice(in.d_out, H));
      one.forward(*attn, alone);
      one.backward(*attn, alone);
      CAPTURE(b);
      CAPTURE(si);
      CHECK(max_abs_diff(one.out, slice(packed.out, H)) < 1e-13);
      CHECK(max_abs_diff(one.d_q, slice(packed.d_q, H)) < 1e-13);
      CHECK(max_abs_diff(one.d_k, slice(packed.d_k, G)) < 1e-13);
      CHECK(max_abs_diff(one.d_v, slice(packed.d_v, G)) < 1e-13);
      ++documents;
    }
  }
  CHECK(documents >= 5);
}

TEST_CASE("naive_cpu padding positions get zero output and zero gradient and do not leak into real ones") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(3);
  const int32_t T = 11;
  const Batch batch = make_batch(T, {{{0, 6}}, {{0, 3}, {3, 4}}, {}, {{2, 4}, {7, 3}}});
  const AttentionProblem p = problem_for(batch, 4, 2, 3);
  Inputs in = random_inputs(p, rng);
  const std::vector<double> want = reference_forward(p, batch, in.q, in.k, in.v);
  Run<double> clean(p, in.q, in.k, in.v, in.d_out);
  clean.forward(*attn, batch);
  clean.backward(*attn, batch);
  // Poison every input at padding positions: nothing read from there may reach a real position.
  const int64_t H = p.heads, G = p.kv_heads, D = p.head_dim;
  for (int64_t bt = 0; bt < int64_t(batch.rows) * T; ++bt) {
    if (batch.segment_ids[std::size_t(bt)] != 0) continue;
    for (int64_t e = 0; e < H * D; ++e) in.q[std::size_t(bt * H * D + e)] = in.d_out[std::size_t(bt * H * D + e)] = kNaN;
    for (int64_t e = 0; e < G * D; ++e) in.k[std::size_t(bt * G * D + e)] = in.v[std::size_t(bt * G * D + e)] = kNaN;
  }
  Run<double> r(p, in.q, in.k, in.v, in.d_out);
  r.forward(*attn, batch);
  r.backward(*attn, batch);
  CHECK(max_abs_diff(r.out, want) < 1e-12);
  CHECK(max_abs_diff(r.out, clean.out) == 0.0);
  CHECK(max_abs_diff(r.d_q, clean.d_q) == 0.0);
  CHECK(max_abs_diff(r.d_k, clean.d_k) == 0.0);
  CHECK(max_abs_diff(r.d_v, clean.d_v) == 0.0);
  int64_t padding = 0;
  for (int64_t bt = 0; bt < int64_t(batch.rows) * T; ++bt) {
    if (batch.segment_ids[std::size_t(bt)] != 0) continue;
    ++padding;
    for (int64_t e = 0; e < H * D; ++e) {
      REQUIRE(r.out[std::size_t(bt * H * D + e)] == 0.0);
      REQUIRE(r.d_q[std::size_t(bt * H * D + e)] == 0.0);
    }
    for (int64_t e = 0; e < G * D; ++e) {
      REQUIRE(r.d_k[std::size_t(bt * G * D + e)] == 0.0);
      REQUIRE(r.d_v[std::size_t(bt * G * D + e)] == 0.0);
    }
  }
  CHECK(padding == 5 + 4 + 11 + 4);
}

TEST_CASE("naive_cpu in f32 agrees with f64") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(17);
  const Batch batch = mixed_batch(24, rng);
  const AttentionProblem p = problem_for(batch, 6, 2, 16);
  const Inputs in = random_inputs(p, rng);
  Run<double> r64(p, in.q, in.k, in.v, in.d_out);
  r64.saved_f64 = true;
  Run<float> r32(p, in.q, in.k, in.v, in.d_out);
  r64.forward(*attn, batch);
  r64.backward(*attn, batch);
  r32.forward(*attn, batch);
  r32.backward(*attn, batch);
  const double rel = 1e-5;
  CHECK(max_abs_diff(r32.out, r64.out) <= rel * max_abs(r64.out));
  CHECK(max_abs_diff(r32.d_q, r64.d_q) <= rel * max_abs(r64.d_q));
  CHECK(max_abs_diff(r32.d_k, r64.d_k) <= rel * max_abs(r64.d_k));
  CHECK(max_abs_diff(r32.d_v, r64.d_v) <= rel * max_abs(r64.d_v));
  CHECK(max_abs(r64.d_k) > 0.0);
}

TEST_CASE("naive_cpu refuses other devices and dtypes with a reason, counts FLOPs, and checks shapes") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(1);
  const Batch batch = make_batch(10, {{{0, 3}, {3, 1}, {4, 6}}, {{0, 7}}});
  AttentionProblem p = problem_for(batch, 4, 2, 8);
  CHECK(attn->supports(p) == "");
  p.dtype = DType::f32;
  CHECK(attn->supports(p) == "");
  AttentionProblem gpu = p;
  gpu.device = DeviceType::cuda;
  gpu.dtype = DType::bf16;
  const std::string why = attn->supports(gpu);
  CHECK(why.find("naive_cpu") != std::string::npos);
  CHECK(why.find("cuda") != std::string::npos);
  CHECK(why.find("bf16") != std::string::npos);
  AttentionProblem bad_gqa = p;
  bad_gqa.kv_heads = 3;
  CHECK_FALSE(attn->supports(bad_gqa).empty());
  AttentionProblem held = p;  // out in bf16 is a CUDA backend's offer; naive_cpu writes the problem's dtype
  held.bf16_out = true;
  CHECK_FALSE(attn->bf16_activations());
  CHECK(attn->supports(held).find("out in bf16") != std::string::npos);
  held.bf16_out = false;
  held.bf16_qkv = true;
  CHECK(attn->supports(held).find("q, k, v in bf16") != std::string::npos);
  CHECK(attn->saved_elements(p) == int64_t(2) * 4 * 10);

  p.dtype = DType::f64;
  const Inputs in = random_inputs(p, rng);
  Run<double> r(p, in.q, in.k, in.v, in.d_out);
  // k with the query head count instead of the kv head count.
  std::vector<double> wrong(r.q.size(), 0.0);
  std::vector<float> saved(std::size_t(attn->saved_elements(p)));
  CHECK_THROWS_AS(test::attention_forward(*attn, p, host_batch_views(batch), r.qv(), r.hv(wrong), r.kv(r.v), r.hv(r.out), flat(saved)),
                  Error);
  // A saved buffer of the wrong size.
  std::vector<float> short_saved(saved.size() - 1);
  CHECK_THROWS_AS(
      test::attention_forward(*attn, p, host_batch_views(batch), r.qv(), r.kv(r.k), r.kv(r.v), r.hv(r.out), flat(short_saved)), Error);
  // A batch of another shape than the problem.
  const Batch other = make_batch(9, {{{0, 9}}, {{0, 9}}});
  CHECK_THROWS_AS(test::attention_forward(*attn, p, host_batch_views(other), r.qv(), r.kv(r.k), r.kv(r.v), r.hv(r.out), flat(saved)),
                  Error);
  // f32 tensors for an f64 problem.
  std::vector<float> q32(r.q.begin(), r.q.end());
  CHECK_THROWS_AS(test::attention_forward(*attn, p, host_batch_views(batch), view(q32, 2, 10, 4, 8), r.kv(r.k), r.kv(r.v), r.hv(r.out),
                                          flat(saved)),
                  Error);
  CHECK_NOTHROW(test::attention_forward(*attn, p, host_batch_views(batch), r.qv(), r.kv(r.k), r.kv(r.v), r.hv(r.out), flat(saved)));
}

TEST_CASE("naive_cpu gives bitwise identical results on repeated runs and across thread counts") {
  Setup s;
  auto attn = s.make();
  auto serial = s.make(1);
  std::mt19937 rng(29);
  const Batch batch = mixed_batch(32, rng);
  const AttentionProblem p = problem_for(batch, 8, 2, 12);
  const Inputs in = random_inputs(p, rng);
  auto run_once = [&](Attention& a) {
    Run<float> r(p, in.q, in.k, in.v, in.d_out);
    r.forward(a, batch);
    r.backward(a, batch);
    return r;
  };
  const Run<float> a = run_once(*attn), b = run_once(*attn), c = run_once(*serial);
  for (const Run<float>* other : {&b, &c}) {
    CHECK(std::memcmp(a.out.data(), other->out.data(), a.out.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.saved32.data(), other->saved32.data(), a.saved32.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.d_q.data(), other->d_q.data(), a.d_q.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.d_k.data(), other->d_k.data(), a.d_k.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.d_v.data(), other->d_v.data(), a.d_v.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("naive_cpu matches the dense reference on segments longer than its query blocks") {
  Setup s;
  auto attn = s.make();
  std::mt19937 rng(41);
  const int32_t T = 203;
  const Batch batch = make_batch(T, {{{0, 150}, {150, 1}, {151, 50}}, {{0, T}}, {{3, 129}}});
  const AttentionProblem p = problem_for(batch, 4, 2, 6);
  const Inputs in = random_inputs(p, rng);
  Run<double> r(p, in.q, in.k, in.v, in.d_out);
  r.saved_f64 = true;
  r.forward(*attn, batch);
  r.backward(*attn, batch);
  CHECK(max_abs_diff(r.out, reference_forward(p, batch, in.q, in.k, in.v)) < 1e-12);
  std::vector<double> d_q, d_k, d_v;
  reference_backward(p, batch, in, d_q, d_k, d_v);
  CHECK(max_abs_diff(r.d_q, d_q) < 1e-11 * (1.0 + max_abs(d_q)));
  CHECK(max_abs_diff(r.d_k, d_k) < 1e-11 * (1.0 + max_abs(d_k)));
  CHECK(max_abs_diff(r.d_v, d_v) < 1e-11 * (1.0 + max_abs(d_v)));
  CHECK(max_abs(d_k) > 0.0);

  // f32 on the same layout: bitwise the same for 1 and 3 threads.
  auto serial = s.make(1), three = s.make(3);
  Run<float> a(p, in.q, in.k, in.v, in.d_out), c(p, in.q, in.k, in.v, in.d_out);
  a.forward(*serial, batch);
  a.backward(*serial, batch);
  c.forward(*three, batch);
  c.backward(*three, batch);
  CHECK(std::memcmp(a.out.data(), c.out.data(), a.out.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.saved32.data(), c.saved32.data(), a.saved32.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.d_q.data(), c.d_q.data(), a.d_q.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.d_k.data(), c.d_k.data(), a.d_k.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.d_v.data(), c.d_v.data(), a.d_v.size() * sizeof(float)) == 0);
}
