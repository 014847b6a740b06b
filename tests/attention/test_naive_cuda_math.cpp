// The host half of `naive_cuda`: its algorithm as its kernels and products run it (segment starts
// per position, full T x T scores, the masked softmax of naive_math.hpp with the lse kept, P V;
// backward from the lse: dP, D, dS, the three gradients, GQA head sums in head order), emulated
// here in float on the CPU, against naive_cpu in float64 on padded rows, packed rows with segments
// of length 1, and GQA ratios 1, 2 and 3. The kernels and cuBLAS calls themselves run on a GPU
// (tests/gpu/test_naive_cuda.cpp); this checks what they compute. Also: the plugin loads without a
// GPU and its supports() answers.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/runtime/registry.hpp"
#include "attention_device_run.hpp"
#include "attention_support.hpp"
#include "naive_math.hpp"
#include "test_support.hpp"

using namespace ablate;
using ablate::test::scaled_diff;
namespace nc = ablate::naive_cuda;

namespace {

struct Problem {
  int64_t B, T, H, Hkv, D;
  std::vector<float> q, k, v, d_out;  // (B,T,H,D), (B,T,Hkv,D) x2, (B,T,H,D)
};

struct Result {
  std::vector<double> out, d_q, d_k, d_v;
};

// The kernel's segment starts: -1 everywhere, then each segment's positions its start.
std::vector<int32_t> segment_starts(const Batch& b) {
  std::vector<int32_t> s(std::size_t(b.rows) * b.seq_len, -1);
  for (int32_t r = 0; r < b.rows; ++r) {
    for (int32_t g = b.row_segments[std::size_t(r)]; g < b.row_segments[std::size_t(r) + 1]; ++g) {
      const Segment seg = b.segments[std::size_t(g)];
      for (int32_t t = 0; t < seg.length; ++t) s[std::size_t(r) * b.seq_len + seg.start + t] = seg.start;
    }
  }
  return s;
}

// naive_cuda's algorithm in float, step by step as its kernels and products compute it.
Result emulate(const Problem& p, const Batch& batch) {
  const int64_t B = p.B, T = p.T, H = p.H, Hkv = p.Hkv, D = p.D, group = H / Hkv;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const std::vector<int32_t> starts = segment_starts(batch);
  const auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * H + h) * D; };
  const auto ki = [&](int64_t b, int64_t t, int64_t g) { return ((b * T + t) * Hkv + g) * D; };
  std::vector<float> out(p.q.size(), 0.0f), d_q(p.q.size(), 0.0f), dk_heads(p.q.size(), 0.0f), dv_heads(p.q.size(), 0.0f);
  const std::size_t block = static_cast<std::size_t>(T * T);
  std::vector<float> S(block), P(block), dS(block);
  std::vector<float> lse(static_cast<std::size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          float s = 0.0f;
          for (int64_t d = 0; d < D; ++d) s += p.q[std::size_t(qi(b, i, h) + d)] * p.k[std::size_t(ki(b, j, g) + d)];
          S[std::size_t(i * T + j)] = scale * s;
        }
        // Forward softmax row (the kernel's softmax_rows).
        const nc::KeyRange r = nc::key_range(starts[std::size_t(b * T + i)], i);
        float mx = -3.4e38f, sum = 0.0f;
        for (int64_t j = r.lo; j <= r.hi; ++j) mx = std::max(mx, S[std::size_t(i * T + j)]);
        for (int64_t j = r.lo; j <= r.hi; ++j) sum += std::exp(S[std::size_t(i * T + j)] - mx);
        lse[std::size_t(i)] = r.lo <= r.hi ? nc::row_lse(mx, sum) : 0.0f;
        for (int64_t j = 0; j < T; ++j) {
          P[std::size_t(i * T + j)] = (j >= r.lo && j <= r.hi) ? nc::softmax_p(S[std::size_t(i * T + j)], mx, sum) : 0.0f;
        }
        for (int64_t d = 0; d < D; ++d) {
          float o = 0.0f;
          for (int64_t j = 0; j < T; ++j) o += P[std::size_t(i * T + j)] * p.v[std::size_t(ki(b, j, g) + d)];
          out[std::size_t(qi(b, i, h) + d)] = o;
        }
      }
      // Backward: P again from the lse (recompute_p), dP, D, dS.
      for (int64_t i = 0; i < T; ++i) {
        const nc::KeyRange r = nc::key_range(starts[std::size_t(b * T + i)], i);
        float drow = 0.0f;
        for (int64_t d = 0; d < D; ++d) drow += p.d_out[std::size_t(qi(b, i, h) + d)] * out[std::size_t(qi(b, i, h) + d)];
        for (int64_t j = 0; j < T; ++j) {
          const float pr = (j >= r.lo && j <= r.hi) ? nc::softmax_p_lse(S[std::size_t(i * T + j)], lse[std::size_t(i)]) : 0.0f;
          P[std::size_t(i * T + j)] = pr;
          float dp = 0.0f;
          for (int64_t d = 0; d < D; ++d) dp += p.d_out[std::size_t(qi(b, i, h) + d)] * p.v[std::size_t(ki(b, j, g) + d)];
          dS[std::size_t(i * T + j)] = nc::softmax_ds(pr, dp, drow);
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          float dq = 0.0f, dk = 0.0f, dv = 0.0f;
          for (int64_t j = 0; j < T; ++j) {
            dq += dS[std::size_t(i * T + j)] * p.k[std::size_t(ki(b, j, g) + d)];
            dk += dS[std::size_t(j * T + i)] * p.q[std::size_t(qi(b, j, h) + d)];  // key i, over queries j
            dv += P[std::size_t(j * T + i)] * p.d_out[std::size_t(qi(b, j, h) + d)];
          }
          d_q[std::size_t(qi(b, i, h) + d)] = scale * dq;
          dk_heads[std::size_t(qi(b, i, h) + d)] = scale * dk;
          dv_heads[std::size_t(qi(b, i, h) + d)] = dv;
        }
      }
    }
  }
  // The group sums, in head order (launch_group_sum).
  std::vector<float> d_k(p.k.size(), 0.0f), d_v(p.k.size(), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t g = 0; g < Hkv; ++g) {
        for (int64_t d = 0; d < D; ++d) {
          float sk = 0.0f, sv = 0.0f;
          for (int64_t m = 0; m < group; ++m) {
            sk += dk_heads[std::size_t(qi(b, t, g * group + m) + d)];
            sv += dv_heads[std::size_t(qi(b, t, g * group + m) + d)];
          }
          d_k[std::size_t(ki(b, t, g) + d)] = sk;
          d_v[std::size_t(ki(b, t, g) + d)] = sv;
        }
      }
    }
  }
  const auto f64 = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  return {f64(out), f64(d_q), f64(d_k), f64(d_v)};
}

std::vector<double> to_f64(const std::vector<float>& x) { return {x.begin(), x.end()}; }

TensorView view4(std::vector<double>& v, int64_t a, int64_t b, int64_t c, int64_t d) {
  return test::shaped(flat_view(v.data(), DType::f64, int64_t(v.size())), a, b, c, d);
}

// naive_cpu in float64 on the same (float-rounded) inputs.
Result reference(Registry& registry, const Problem& p, const Batch& batch) {
  const Params common{"attention", {}}, own{"attention.naive_cpu", {}};
  RunContext run;
  run.threads = 1;
  auto a = registry.create<Attention>(Kind::attention, "naive_cpu", {common, own, run});
  AttentionProblem ap;
  ap.batch = int32_t(p.B);
  ap.seq_len = int32_t(p.T);
  ap.heads = int32_t(p.H);
  ap.kv_heads = int32_t(p.Hkv);
  ap.head_dim = int32_t(p.D);
  ap.dtype = DType::f64;
  ap.device = DeviceType::cpu;
  ap.packed = true;
  std::vector<double> q = to_f64(p.q), k = to_f64(p.k), v = to_f64(p.v), d_out = to_f64(p.d_out);
  Result r{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(k.size())};
  std::vector<double> saved(std::size_t(a->saved_elements(ap)));
  const BatchViews views = host_batch_views(batch);
  const auto hv = [&](std::vector<double>& x) { return view4(x, p.B, p.T, p.H, p.D); };
  const auto kv = [&](std::vector<double>& x) { return view4(x, p.B, p.T, p.Hkv, p.D); };
  TensorView sv = flat_view(saved.data(), DType::f64, int64_t(saved.size()));
  test::attention_forward(*a, ap, views, hv(q), kv(k), kv(v), hv(r.out), sv);
  test::attention_backward(*a, ap, views, hv(q), kv(k), kv(v), hv(r.out), sv, hv(d_out), hv(r.d_q), kv(r.d_k), kv(r.d_v));
  return r;
}


}  // namespace

TEST_CASE("naive_cuda's algorithm, emulated in float, is naive_cpu's attention (padded, packed with length-1 segments, GQA 1/2/3)") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  std::mt19937 rng(23);
  const int64_t T = 23, H = 6, D = 5;
  const Batch batch = test::make_batch(int32_t(T), {{{0, 15}}, test::random_packed_row(int32_t(T), rng), {{0, 1}, {1, 1}, {2, 21}}});
  for (int64_t Hkv : {int64_t(6), int64_t(3), int64_t(2)}) {
    INFO("kv heads " << Hkv);
    Problem p{batch.rows, T, H, Hkv, D, {}, {}, {}, {}};
    std::normal_distribution<float> n(0.0f, 1.0f);
    const auto fill = [&](std::vector<float>& x, int64_t heads) {
      x.resize(std::size_t(p.B * T * heads * D));
      for (float& e : x) e = n(rng);
    };
    fill(p.q, H);
    fill(p.k, Hkv);
    fill(p.v, Hkv);
    fill(p.d_out, H);
    const Result got = emulate(p, batch), want = reference(registry, p, batch);
    // Float sums of up to 23 products and softmaxes over up to 23 keys against float64: a few
    // hundred units of 2^-24 relative to the largest value, far under 1e-5.
    CHECK(scaled_diff(got.out, want.out) < 1e-5);
    CHECK(scaled_diff(got.d_q, want.d_q) < 1e-5);
    CHECK(scaled_diff(got.d_k, want.d_k) < 1e-5);
    CHECK(scaled_diff(got.d_v, want.d_v) < 1e-5);
  }
}

TEST_CASE("key_range: causal within a segment, empty for padding") {
  const nc::KeyRange pad = nc::key_range(-1, 7);
  CHECK(pad.lo > pad.hi);
  const nc::KeyRange r = nc::key_range(4, 9);
  CHECK(r.lo == 4);
  CHECK(r.hi == 9);
  const nc::KeyRange first = nc::key_range(9, 9);  // a segment's first position sees itself alone
  CHECK(first.lo == first.hi);
}

TEST_CASE("naive_cuda loads without a GPU and answers supports() with reasons") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  RunContext run;
  run.device = "cuda";
  const Params common{"attention", {}}, own{"attention.naive_cuda", {}};
  auto a = registry.create<Attention>(Kind::attention, "naive_cuda", {common, own, run});
  AttentionProblem p;
  p.batch = 8;
  p.seq_len = 1024;
  p.heads = 12;
  p.kv_heads = 12;
  p.head_dim = 64;
  p.dtype = DType::f32;
  p.device = DeviceType::cuda;
  CHECK(a->supports(p).empty());
  CHECK(a->saved_elements(p) == 8 * 12 * 1024);
  // The memory plan counts the score matrices it materialises: two (B, H, T, T) f32 blocks.
  const int64_t scores = 2 * int64_t(8) * 12 * 1024 * 1024 * 4;
  CHECK(a->workspace_bytes(p) >= scores);
  CHECK(a->workspace_bytes(p) < scores + scores / 16);
  AttentionProblem longer = p;
  longer.seq_len = 2048;
  CHECK(double(a->workspace_bytes(longer)) / double(a->workspace_bytes(p)) > 3.9);  // quadratic in T
  AttentionProblem cpu = p;
  cpu.device = DeviceType::cpu;
  CHECK(a->supports(cpu).find("CUDA device") != std::string::npos);
  AttentionProblem bf = p;
  bf.dtype = DType::bf16;
  CHECK(a->supports(bf).find("f32") != std::string::npos);
  AttentionProblem gqa = p;
  gqa.kv_heads = 5;
  CHECK(a->supports(gqa).find("multiple of kv_heads") != std::string::npos);
  AttentionProblem huge = p;
  huge.batch = 64;
  huge.seq_len = 8192;  // two blocks of 64*12*8192^2 floats: 384 GiB
  CHECK(a->supports(huge).find("score blocks") != std::string::npos);
}
