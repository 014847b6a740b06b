// `naive_cuda` on a GPU against `naive_cpu` in float64: padded rows, packed rows with random
// segments (length 1 included), GQA ratios 1, 3 and 4, head_dim 64 and 128, T = 1, 7, 77 and 130
// (none a multiple of 64); outputs and all three gradients, outputs poisoned with NaN first; and
// the same bits on a second run. Exits 77 (CTest: skipped) without a CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/device.hpp"
#include "ablate/runtime/registry.hpp"
#include "attention_device_run.hpp"
#include "attention_support.hpp"

using namespace ablate;
using ablate::test::scaled_diff;

namespace {

struct Fixture {
  Registry registry;
  std::unique_ptr<Device> device;
  std::unique_ptr<Attention> gpu, cpu;
  Fixture() {
    registry.load_directories({ABLATE_PLUGIN_DIR});
    static const Params run_params{"run", {}}, common{"attention", {}}, gpu_own{"attention.naive_cuda", {}},
        cpu_own{"attention.naive_cpu", {}};
    RunContext on_gpu, on_cpu;
    on_gpu.device = "cuda";
    on_cpu.threads = 2;
    device = registry.create<Device>(Kind::device, "cuda", {run_params, run_params, on_gpu});
    gpu = registry.create<Attention>(Kind::attention, "naive_cuda", {common, gpu_own, on_gpu});
    cpu = registry.create<Attention>(Kind::attention, "naive_cpu", {common, cpu_own, on_cpu});
  }
};

using test::shaped;

struct Outputs {
  std::vector<double> out, d_q, d_k, d_v;
};

Outputs run_cpu(Fixture& f, AttentionProblem p, const Batch& batch, std::vector<double> q, std::vector<double> k,
                std::vector<double> v, std::vector<double> d_out) {
  p.dtype = DType::f64;
  p.device = DeviceType::cpu;
  Outputs o{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(k.size()),
            std::vector<double>(k.size())};
  std::vector<double> saved(std::size_t(f.cpu->saved_elements(p)));
  const auto hv = [&](std::vector<double>& x) {
    return shaped(flat_view(x.data(), DType::f64, int64_t(x.size())), p.batch, p.seq_len, p.heads, p.head_dim);
  };
  const auto kv = [&](std::vector<double>& x) {
    return shaped(flat_view(x.data(), DType::f64, int64_t(x.size())), p.batch, p.seq_len, p.kv_heads, p.head_dim);
  };
  const BatchViews views = host_batch_views(batch);
  TensorView s = flat_view(saved.data(), DType::f64, int64_t(saved.size()));
  test::attention_forward(*f.cpu, p, views, hv(q), kv(k), kv(v), hv(o.out), s);
  test::attention_backward(*f.cpu, p, views, hv(q), kv(k), kv(v), hv(o.out), s, hv(d_out), hv(o.d_q), kv(o.d_k), kv(o.d_v));
  return o;
}

Outputs run_gpu(Fixture& f, AttentionProblem p, const Batch& batch, const std::vector<double>& q, const std::vector<double>& k,
                const std::vector<double>& v, const std::vector<double>& d_out) {
  const auto narrow = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const test::AttentionOutputs o = test::run_attention_on(*f.device, *f.gpu, p, batch, narrow(q), narrow(k), narrow(v), narrow(d_out));
  return {widen(o.out), widen(o.d_q), widen(o.d_k), widen(o.d_v)};
}

// The f32 problem's backward alone, given out (and the saved statistics of its own forward).
test::AttentionOutputs f32_backward_with_out(Fixture& f, const AttentionProblem& p, const Batch& batch, const std::vector<float>& q,
                                             const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& out,
                                             const std::vector<float>& d_out) {
  Device& dev = *f.device;
  const auto up = [&](const std::vector<float>& x) {
    Buffer b = dev.alloc(DType::f32, int64_t(x.size()));
    dev.upload(b.view(), x.data());
    return b;
  };
  const auto down = [&](const Buffer& b) {
    std::vector<float> h(std::size_t(b.count()));
    dev.download(h.data(), b.view());
    return h;
  };
  DeviceBatch db;
  dev.upload_batch(batch, db);
  Buffer bq = up(q), bk = up(k), bv = up(v), bo = up(out), bdo = up(d_out), scratch_out = up(out);
  Buffer dq = up(q), dk = up(k), dv = up(k), saved = dev.alloc(DType::f32, f.gpu->saved_elements(p));
  const auto hv = [&](Buffer& b) { return test::shaped(b.view(), p.batch, p.seq_len, p.heads, p.head_dim); };
  const auto kv = [&](Buffer& b) { return test::shaped(b.view(), p.batch, p.seq_len, p.kv_heads, p.head_dim); };
  test::attention_forward(*f.gpu, p, db.views, hv(bq), kv(bk), kv(bv), hv(scratch_out), saved.view(),
                          dev.stream());  // the statistics
  test::attention_backward(*f.gpu, p, db.views, hv(bq), kv(bk), kv(bv), hv(bo), saved.view(), hv(bdo), hv(dq), kv(dk), kv(dv),
                           dev.stream());
  dev.synchronize();
  return {out, down(dq), down(dk), down(dv)};
}

}  // namespace

TEST_CASE("naive_cuda matches naive_cpu in float64: padded and packed rows, GQA 1/3/4, head_dim 64 and 128, odd T") {
  Fixture f;
  std::mt19937 rng(41);
  std::normal_distribution<double> n(0.0, 1.0);
  for (int32_t T : {1, 7, 77, 130}) {
    for (int32_t D : {64, 128}) {
      for (int32_t ratio : {1, 3, 4}) {
        INFO("T " << T << " D " << D << " heads/kv " << ratio);
        const Batch batch = T == 1 ? test::make_batch(T, {{{0, 1}}, {}})
                                   : test::make_batch(T, {{{0, T / 2 + 1}}, test::random_packed_row(T, rng), {{0, 1}, {1, T - 1}}});
        const AttentionProblem p{.batch = batch.rows,
                                 .seq_len = T,
                                 .heads = 2 * ratio,
                                 .kv_heads = 2,
                                 .head_dim = D,
                                 .dtype = DType::f32,
                                 .device = DeviceType::cuda,
                                 .packed = true};
        REQUIRE(f.gpu->supports(p).empty());
        const auto make = [&](int64_t heads) {
          std::vector<double> x(std::size_t(p.batch) * T * heads * D);
          for (double& e : x) e = double(float(n(rng)));  // both sides see the same float values
          return x;
        };
        const std::vector<double> q = make(p.heads), k = make(p.kv_heads), v = make(p.kv_heads), d_out = make(p.heads);
        const Outputs want = run_cpu(f, p, batch, q, k, v, d_out);
        const Outputs got = run_gpu(f, p, batch, q, k, v, d_out);
        // fp32 products of D = 64/128 terms and softmaxes over up to 130 keys (FMA contraction and
        // cuBLAS's blocking reorder the sums): errors of a few hundred 2^-24 units relative to the
        // largest value; 1e-4 bounds them with margin.
        CHECK(scaled_diff(got.out, want.out) < 1e-4);
        if (T == 1) {
          // One key per row: dS = P (dP - rowdot) = dO.v - dO.o with o = v, a difference of two
          // equal sums, so d_q = scale dS k and d_k = scale dS^T q are zero in exact arithmetic (the
          // float64 reference's ~0 is no scale to measure against) and fp32 leaves the sums'
          // rounding: measured against the terms that cancel, D |dO| |v| times scale |k| (|q|).
          const auto max_abs = [](const std::vector<double>& x) {
            double m = 0.0;
            for (double e : x) m = std::max(m, std::abs(e));
            return m;
          };
          const double terms = double(D) * max_abs(d_out) * max_abs(v) / std::sqrt(double(D));
          CHECK(max_abs(got.d_q) <= 1e-4 * terms * max_abs(k));
          CHECK(max_abs(got.d_k) <= 1e-4 * terms * max_abs(q));
        } else {
          CHECK(scaled_diff(got.d_q, want.d_q) < 1e-4);
          CHECK(scaled_diff(got.d_k, want.d_k) < 1e-4);
        }
        CHECK(scaled_diff(got.d_v, want.d_v) < 1e-4);
        // Deterministic: a second run gives the same bits.
        const Outputs again = run_gpu(f, p, batch, q, k, v, d_out);
        CHECK(again.d_k == got.d_k);
        CHECK(again.out == got.out);
      }
    }
  }
}

TEST_CASE(
    "naive_cuda with q, k, v, out and the gradients held in bf16: the f32 run on the bf16 values, outputs rounded once, bit for bit") {
  // Widening bf16 to f32 is exact, so the bf16 problem must compute exactly what the f32 problem
  // computes on inputs already rounded to bf16: out the bf16 rounding of the f32 out
  // (device_math::bf16_bits), and the gradients the same bits as the f32 backward given the out
  // the problem holds, whichever of q/k/v and out is held in bf16.
  Fixture f;
  std::mt19937 rng(7);
  std::normal_distribution<double> n(0.0, 1.0);
  CHECK(f.gpu->bf16_activations());
  const int32_t T = 77, D = 64;
  const Batch batch = test::make_batch(T, {{{0, 40}}, test::random_packed_row(T, rng)});
  const AttentionProblem base{.batch = batch.rows,
                              .seq_len = T,
                              .heads = 6,
                              .kv_heads = 2,
                              .head_dim = D,
                              .dtype = DType::f32,
                              .device = DeviceType::cuda,
                              .packed = true};
  const auto make = [&](int64_t heads, bool round) {
    std::vector<float> x(std::size_t(base.batch) * T * heads * D);
    for (float& e : x) e = float(n(rng));
    if (round)
      for (float& e : x) e = device_math::bf16_value(device_math::bf16_bits(e));
    return x;
  };
  const std::vector<float> q = make(6, true), k = make(2, true), v = make(2, true), d_out = make(6, true);
  const test::AttentionOutputs want = test::run_attention_on(*f.device, *f.gpu, base, batch, q, k, v, d_out);
  std::vector<float> rounded_out = want.out;
  for (float& e : rounded_out) e = device_math::bf16_value(device_math::bf16_bits(e));
  // With out held in bf16, backward reads the rounded out (its row dots dO . O): the f32 problem's
  // backward given the rounded out is the reference for the gradients there.
  const test::AttentionOutputs want_rounded = f32_backward_with_out(f, base, batch, q, k, v, rounded_out, d_out);
  CHECK(want_rounded.d_v == want.d_v);  // dV = P^T dO reads no out
  // With the gradients held in bf16 too (d_out's values are bf16 ones already), d_q, d_k and d_v
  // are the reference's rounded once.
  const auto rounded = [](std::vector<float> x) {
    for (float& e : x) e = device_math::bf16_value(device_math::bf16_bits(e));
    return x;
  };
  CHECK(f.gpu->bf16_gradients());
  const struct {
    bool qkv, out, grads;
  } held[] = {{true, false, false}, {false, true, false}, {true, true, false}, {true, true, true}};
  for (const auto& h : held) {
    INFO("q, k, v in bf16 " << h.qkv << ", out in bf16 " << h.out << ", gradients in bf16 " << h.grads);
    AttentionProblem p = base;
    p.bf16_qkv = h.qkv;
    p.bf16_out = h.out;
    p.bf16_grads = h.grads;
    REQUIRE(f.gpu->supports(p).empty());
    const test::AttentionOutputs got = test::run_attention_on(*f.device, *f.gpu, p, batch, q, k, v, d_out);
    const test::AttentionOutputs& ref = h.out ? want_rounded : want;
    CHECK(got.d_q == (h.grads ? rounded(ref.d_q) : ref.d_q));
    CHECK(got.d_k == (h.grads ? rounded(ref.d_k) : ref.d_k));
    CHECK(got.d_v == (h.grads ? rounded(ref.d_v) : ref.d_v));
    CHECK(got.out == (h.out ? rounded_out : want.out));
  }
  AttentionProblem bf16 = base;
  bf16.dtype = DType::bf16;  // bf16 gradients are cudnn_flash's
  CHECK(f.gpu->supports(bf16).find("f32") != std::string::npos);
}

namespace {

// FP8 attention's rounding as naive_cuda defines it: x to the FP8 value fp8(x s) / s in float (E4M3
// or E5M2, nearest even, saturating: cuda_fp8.h's conversion), s = fp8_max / amax for a tensor
// scaled by its own amax.
float fp8_round(float x, float s, bool e5m2) {
  const float inv = 1.0f / s;
  return e5m2 ? float(__nv_fp8_e5m2(x * s)) * inv : float(__nv_fp8_e4m3(x * s)) * inv;
}
float own_scale(const std::vector<float>& x, bool e5m2) {
  float amax = 0.0f;
  for (float e : x) amax = std::max(amax, std::fabs(e));
  return amax > 0.0f ? (e5m2 ? 57344.0f : 448.0f) / amax : 1.0f;
}
std::vector<float> fp8_rounded(const std::vector<float>& x, bool e5m2) {
  const float s = own_scale(x, e5m2);
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = fp8_round(x[i], s, e5m2);
  return r;
}
float bf16_of(double x) { return device_math::bf16_value(device_math::bf16_bits(float(x))); }

// FP8 attention's forward and backward in float64 between its rounding points (naive_cuda.cpp's
// header), for rows whose one segment starts at 0 (`lengths[b]` positions, then padding): q, k, v
// E4M3 by their own amax; P E4M3 by 448 before it meets V (forward and dV), unrounded in the
// softmax's backward; dO E5M2 by its own amax; D from the rounded dO and the out the backend
// wrote (`out_held`); dS E5M2 by its own amax. Outputs rounded to bf16.
test::AttentionOutputs fp8_reference(const AttentionProblem& p, const std::vector<int32_t>& lengths, const std::vector<float>& q,
                                     const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& d_out,
                                     const std::vector<float>& out_held) {
  const int64_t B = p.batch, T = p.seq_len, H = p.heads, Hkv = p.kv_heads, D = p.head_dim, group = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  const std::vector<float> qf = fp8_rounded(q, false), kf = fp8_rounded(k, false), vf = fp8_rounded(v, false);
  const std::vector<float> dof = fp8_rounded(d_out, true);
  const auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return std::size_t(((b * T + t) * H + h) * D + d); };
  const auto ki = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return std::size_t(((b * T + t) * Hkv + h) * D + d); };
  const std::size_t blocks = std::size_t(B * H * T * T);
  std::vector<double> P(blocks, 0.0), dS(blocks, 0.0);
  const auto at = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return std::size_t(((b * H + h) * T + i) * T + j); };
  std::vector<double> out(q.size(), 0.0), dq(q.size(), 0.0), dk(k.size(), 0.0), dv(k.size(), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < lengths[std::size_t(b)]; ++i) {
        std::vector<double> srow(std::size_t(i + 1));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          double t = 0;
          for (int64_t d = 0; d < D; ++d) t += double(qf[qi(b, i, h, d)]) * double(kf[ki(b, j, g, d)]);
          srow[std::size_t(j)] = scale * t;
          m = std::max(m, srow[std::size_t(j)]);
        }
        double z = 0;
        for (double& e : srow) z += std::exp(e - m);
        for (int64_t j = 0; j <= i; ++j) P[at(b, h, i, j)] = std::exp(srow[std::size_t(j)] - m) / z;
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            o += double(fp8_round(float(P[at(b, h, i, j)]), 448.0f, false)) * double(vf[ki(b, j, g, d)]);
          out[qi(b, i, h, d)] = o;
        }
        double row_d = 0;
        for (int64_t d = 0; d < D; ++d) row_d += double(dof[qi(b, i, h, d)]) * double(out_held[qi(b, i, h, d)]);
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += double(dof[qi(b, i, h, d)]) * double(vf[ki(b, j, g, d)]);
          dS[at(b, h, i, j)] = P[at(b, h, i, j)] * (dp - row_d);
        }
      }
    }
  }
  std::vector<float> ds32(dS.begin(), dS.end());
  const float ds_scale = own_scale(ds32, true);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < lengths[std::size_t(b)]; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = double(fp8_round(ds32[at(b, h, i, j)], ds_scale, true));
          const double pq = double(fp8_round(float(P[at(b, h, i, j)]), 448.0f, false));
          for (int64_t d = 0; d < D; ++d) {
            dq[qi(b, i, h, d)] += scale * ds * double(kf[ki(b, j, g, d)]);
            dk[ki(b, j, g, d)] += scale * ds * double(qf[qi(b, i, h, d)]);
            dv[ki(b, j, g, d)] += pq * double(dof[qi(b, i, h, d)]);
          }
        }
      }
    }
  }
  const auto rounded = [](const std::vector<double>& x) {
    std::vector<float> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = bf16_of(x[i]);
    return r;
  };
  return {rounded(out), rounded(dq), rounded(dk), rounded(dv)};
}

// Elements of got beyond a bf16 unit of want, beside a bf16 unit of the tensor's largest (a value
// from a sum that cancels, dS of a query's first key, rounds to FP8 from noise).
int64_t beyond(const std::vector<float>& got, const std::vector<float>& want) {
  double top = 0;
  for (float w : want) top = std::max(top, std::fabs(double(w)));
  int64_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double tol = 0x1p-8 * std::fabs(double(want[i])) + 0x1p-8 * top;
    if (!(std::fabs(double(got[i]) - double(want[i])) <= tol)) ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("naive_cuda's FP8 attention ([attention.naive_cuda] fp8): every output and gradient at its rounding points, in float64") {
  // Against fp8_reference: the arithmetic between the rounding points is f32 on the device and
  // float64 here, so an FP8 code can land on the other side of a rounding boundary now and then
  // (one in many thousands of values; each moves its output by at most a sixteenth of its term):
  // at most 1% of each tensor's elements may lie beyond a bf16 unit. Against the same backend in
  // bf16 (fp8 off), most elements differ by more than that: FP8 did round.
  Fixture f;
  const Params fp8_on{"attention.naive_cuda", {{"fp8", Value{true}}}}, common{"attention", {}}, run_params{"run", {}};
  RunContext ctx;
  ctx.device = "cuda";
  ctx.dtype = "fp8";
  const std::unique_ptr<Attention> fp8 = f.registry.create<Attention>(Kind::attention, "naive_cuda", {common, fp8_on, ctx});
  ctx.dtype = "bf16";
  const Params off{"attention.naive_cuda", {}};
  const std::unique_ptr<Attention> bf16 = f.registry.create<Attention>(Kind::attention, "naive_cuda", {common, off, ctx});
  std::mt19937 rng(11);
  std::normal_distribution<double> n(0.0, 1.0);
  const int32_t T = 29, D = 16;
  const std::vector<int32_t> lengths = {20, T};
  const Batch batch = test::make_batch(T, {{{0, lengths[0]}}, {{0, lengths[1]}}});
  AttentionProblem p{.batch = batch.rows,
                     .seq_len = T,
                     .heads = 4,
                     .kv_heads = 2,
                     .head_dim = D,
                     .dtype = DType::f32,
                     .device = DeviceType::cuda,
                     .packed = false};
  const auto make = [&](int64_t heads, double sigma) {
    std::vector<float> x(std::size_t(p.batch) * T * heads * D);
    for (float& e : x) e = bf16_of(sigma * n(rng));
    return x;
  };
  const std::vector<float> q = make(4, 2.0), k = make(2, 2.0), v = make(2, 1.0), d_out = make(4, 0.1);
  CHECK_FALSE(fp8->supports(p).empty());  // f32 tensors: the model's FP8 plan holds them in bf16
  p.bf16_qkv = p.bf16_out = p.bf16_grads = true;
  REQUIRE(fp8->supports(p).empty());
  const test::AttentionOutputs got = test::run_attention_on(*f.device, *fp8, p, batch, q, k, v, d_out);
  const test::AttentionOutputs want = fp8_reference(p, lengths, q, k, v, d_out, got.out);
  const test::AttentionOutputs plain = test::run_attention_on(*f.device, *bf16, p, batch, q, k, v, d_out);
  const struct {
    const char* name;
    const std::vector<float>&got, &want, &plain;
  } tensors[] = {{"out", got.out, want.out, plain.out},
                 {"d_q", got.d_q, want.d_q, plain.d_q},
                 {"d_k", got.d_k, want.d_k, plain.d_k},
                 {"d_v", got.d_v, want.d_v, plain.d_v}};
  for (const auto& t : tensors) {
    INFO(t.name);
    const int64_t n_all = int64_t(t.want.size());
    CHECK(beyond(t.got, t.want) <= n_all / 100);
    CHECK(beyond(t.got, t.plain) > n_all / 4);
  }
  // Padding positions (row 0 from 20 on) see no key: zeros, as without FP8.
  for (int64_t i = int64_t(lengths[0]) * 4 * D; i < int64_t(T) * 4 * D; ++i) CHECK(got.out[std::size_t(i)] == 0.0f);
  // The same bits again.
  const test::AttentionOutputs again = test::run_attention_on(*f.device, *fp8, p, batch, q, k, v, d_out);
  CHECK(again.out == got.out);
  CHECK(again.d_k == got.d_k);
  // fp8 = true outside an FP8 run.dtype: refused, naming the key (exit 2).
  try {
    (void)f.registry.create<Attention>(Kind::attention, "naive_cuda", {common, fp8_on, ctx});
    FAIL("fp8 = true under run.dtype bf16 was accepted");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.what()).find("attention.naive_cuda.fp8") != std::string::npos);
  }
}

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
