// The host half of the CUDA layers: the per-element arithmetic their kernels use
// (plugins/layers/norm/norm_math.hpp and dense/dense_math.hpp, __host__ __device__), applied here on the CPU row by row as
// the kernels apply it (float statistics), against the cpu_layers norms (double statistics) on
// random rows of odd widths, forward and input gradient. The kernels themselves run on a GPU
// (test_cpu_layers' device cases); this checks that what they compute per element is the norm.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/registry.hpp"
#include "dense_math.hpp"
#include "norm_math.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

struct Row {
  std::vector<float> x, w, b, dy;
};

Row random_row(int64_t in, std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  Row r;
  for (auto* v : {&r.x, &r.w, &r.b, &r.dy}) {
    v->resize(std::size_t(in));
    for (float& e : *v) e = n(rng);
  }
  for (float& e : r.x) e = 3.0f + 2.0f * e;  // an offset and a scale the norm must remove
  return r;
}

// As the kernels do it: float sums, then the shared arithmetic per element.
void kernel_arithmetic(bool rms, const Row& r, float eps, std::vector<float>& y, std::vector<float>& dx) {
  const int64_t in = int64_t(r.x.size());
  float mean = 0.0f;
  if (!rms) {
    for (float v : r.x) mean += v;
    mean /= float(in);
  }
  float s2 = 0.0f;
  for (float v : r.x) s2 += (v - mean) * (v - mean);
  const float rstd = cuda_layers::norm_rstd(s2 / float(in), eps);
  y.resize(std::size_t(in));
  for (int64_t c = 0; c < in; ++c) {
    y[c] = rms ? cuda_layers::rmsnorm_out(r.x[c], rstd, r.w[c]) : cuda_layers::layernorm_out(r.x[c], mean, rstd, r.w[c], r.b[c]);
  }
  float s_dxhat = 0.0f, s_dxhat_xhat = 0.0f;
  for (int64_t c = 0; c < in; ++c) {
    const float xhat = (r.x[c] - mean) * rstd, dxhat = r.dy[c] * r.w[c];
    s_dxhat += dxhat;
    s_dxhat_xhat += dxhat * xhat;
  }
  const float m1 = rms ? 0.0f : s_dxhat / float(in), m2 = s_dxhat_xhat / float(in);
  dx.resize(std::size_t(in));
  for (int64_t c = 0; c < in; ++c) {
    dx[c] = cuda_layers::norm_dx(r.dy[c] * r.w[c], (r.x[c] - mean) * rstd, m1, m2, rstd);
  }
}

double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 1e-30, worst = 0;
  for (float v : want) scale = std::max(scale, double(std::abs(v)));
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
  return worst / scale;
}

}  // namespace

TEST_CASE("the CUDA norms' per-element arithmetic is the cpu_layers norms (layernorm, rmsnorm, widths 1, 7, 61, 769)") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  const Params common{"model", {}};
  RunContext run;
  std::mt19937_64 rng(5);
  for (const char* name : {"layernorm", "rmsnorm"}) {
    const bool rms = std::string(name) == "rmsnorm";
    auto layer = registry.create<Layer>(Kind::layer, name, {common, Params(std::string("model.") + name, {}), run});
    for (int64_t in : {int64_t(1), int64_t(7), int64_t(61), int64_t(769)}) {
      INFO(name << " width " << in);
      const Row r = random_row(in, rng);
      LayerSpec spec;
      spec.in = in;
      spec.bias = !rms;
      spec.eps = 1e-5;
      std::vector<float> params = r.w;
      if (!rms) params.insert(params.end(), r.b.begin(), r.b.end());
      const std::size_t n = static_cast<std::size_t>(in);
      std::vector<float> x = r.x, dy = r.dy, y(n), dx(n), grads(params.size(), 0.0f);
      std::vector<float> saved(static_cast<std::size_t>(layer->activation_elements(spec, 1)));
      Batch b;
      b.reset(1, 1);
      const BatchViews views = host_batch_views(b);
      LayerCall call;
      call.spec = &spec;
      call.batch = &views;
      call.rows = 1;
      call.x = flat_view(x.data(), DType::f32, in);
      call.y = flat_view(y.data(), DType::f32, in);
      call.params = flat_view(params.data(), DType::f32, int64_t(params.size()));
      call.saved = flat_view(saved.data(), DType::f32, int64_t(saved.size()));
      layer->forward(call);
      call.d_y = flat_view(dy.data(), DType::f32, in);
      call.d_x = flat_view(dx.data(), DType::f32, in);
      call.grads = flat_view(grads.data(), DType::f32, int64_t(grads.size()));
      layer->backward(call);
      std::vector<float> ky, kdx;
      kernel_arithmetic(rms, r, 1e-5f, ky, kdx);
      // float statistics against double ones over `in` terms: within a few hundred ulps.
      CHECK(max_rel(ky, y) < 1e-5);
      CHECK(max_rel(kdx, dx) < 1e-4);
    }
  }
}

// --- the other layers' arithmetic (dense_math.hpp) ---------------------------------------------------

namespace {

struct CpuLayers {
  Registry registry;
  CpuLayers() { registry.load_directories({test::plugin_dir()}); }
  template <class L>
  std::unique_ptr<L> make(const char* name) {
    const Params common{"model", {}};
    return registry.create<L>(Kind::layer, name, {common, Params(std::string("model.") + name, {}), RunContext{}});
  }
};

std::vector<float> randn(std::size_t n, std::mt19937_64& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& e : v) e = d(rng);
  return v;
}

}  // namespace

TEST_CASE("dropout_factor draws the cpu_layers embedding's dropout mask bit for bit") {
  CpuLayers cpu;
  auto emb = cpu.make<Layer>("embedding");
  std::mt19937_64 rng(11);
  const int64_t rows = 37, in = 13, vocab = 5;
  LayerSpec spec;
  spec.in = in;
  spec.out = vocab;
  std::vector<float> table = randn(std::size_t(vocab * in), rng);
  std::vector<float> y(static_cast<std::size_t>(rows * in));
  Batch b;
  b.reset(1, int32_t(rows));
  for (int64_t r = 0; r < rows; ++r) b.tokens[std::size_t(r)] = int32_t(r % vocab);
  const BatchViews views = host_batch_views(b);
  for (double p : {0.1, 0.5, 0.9}) {
    LayerCall call;
    call.spec = &spec;
    call.batch = &views;
    call.rows = rows;
    call.y = flat_view(y.data(), DType::f32, rows * in);
    call.params = flat_view(table.data(), DType::f32, vocab * in);
    call.dropout = p;
    call.dropout_key = 0xC0FFEEull + uint64_t(p * 100);
    emb->forward(call);
    const float scale = float(1.0 / (1.0 - p));
    int dropped = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < in; ++c) {
        const int64_t i = r * in + c;
        const float f = cuda_layers::dropout_factor(call.dropout_key, uint64_t(i), p, scale);
        CHECK(y[std::size_t(i)] == table[std::size_t((r % vocab) * in + c)] * f);
        dropped += f == 0.0f ? 1 : 0;
      }
    }
    // The mask is not degenerate: the share dropped is near p (481 draws; 5 sigma is below 0.12).
    CHECK(std::abs(double(dropped) / double(rows * in) - p) < 0.12);
  }
  CHECK(cuda_layers::dropout_factor(1, 2, 0.0, 1.0f) == 1.0f);
}

TEST_CASE("gelu and swiglu terms: values against the closed forms, gradients against central differences") {
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    INFO("x = " << x);
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    const double gelu_ref = 0.5 * x * (1.0 + std::tanh(u));
    CHECK(std::abs(double(cuda_layers::gelu_out(float(x))) - gelu_ref) <= 1e-6 * (1.0 + std::abs(gelu_ref)));
    // Central difference of the double closed form, step 1e-4: truncation error ~1e-8 * |f'''|.
    const auto gelu_d = [](double v) {
      const double w = 0.7978845608028654 * (v + 0.044715 * v * v * v);
      return 0.5 * v * (1.0 + std::tanh(w));
    };
    const double h = 1e-4, fd = (gelu_d(x + h) - gelu_d(x - h)) / (2 * h);
    CHECK(std::abs(double(cuda_layers::gelu_grad(float(x))) - fd) <= 1e-5);
    const double g = x, up = 0.5 - 0.3 * x;
    const auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
    CHECK(std::abs(double(cuda_layers::swiglu_out(float(g), float(up))) - silu(g) * up) <= 1e-6 * (1.0 + std::abs(silu(g) * up)));
    const double dh = 1.3;
    const double dg_fd = dh * up * (silu(g + h) - silu(g - h)) / (2 * h);
    CHECK(std::abs(double(cuda_layers::swiglu_dg(float(g), float(up), float(dh))) - dg_fd) <= 1e-5 * (1.0 + std::abs(dg_fd)));
    CHECK(std::abs(double(cuda_layers::swiglu_du(float(g), float(dh))) - dh * silu(g)) <= 1e-5 * (1.0 + std::abs(dh * silu(g))));
  }
}

TEST_CASE("rope_angle and rope_rotate reproduce the cpu_layers rope exactly (forward and inverse)") {
  CpuLayers cpu;
  auto rope = cpu.make<Layer>("rope");
  std::mt19937_64 rng(13);
  const int64_t rows = 9, heads = 3, D = 14;
  LayerSpec spec;
  spec.in = D;
  Batch b;
  b.reset(1, int32_t(rows));
  for (int64_t r = 0; r < rows; ++r) b.positions[std::size_t(r)] = int32_t(r * 37 % 101);
  const BatchViews views = host_batch_views(b);
  const std::size_t n = std::size_t(rows * heads * D);
  std::vector<float> x = randn(n, rng);
  std::vector<float> y(n), back(n);
  LayerCall call;
  call.spec = &spec;
  call.batch = &views;
  call.rows = rows;
  call.heads = heads;
  call.x = flat_view(x.data(), DType::f32, int64_t(n));
  call.y = flat_view(y.data(), DType::f32, int64_t(n));
  rope->forward(call);
  call.d_y = call.x;
  call.d_x = flat_view(back.data(), DType::f32, int64_t(n));
  rope->backward(call);
  const int64_t half = D / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const std::size_t base = std::size_t((r * heads + h) * D);
        const double angle = cuda_layers::rope_angle(b.positions[std::size_t(r)], i, D, 10000.0);  // rope's default theta
        const cuda_layers::RopePair f = cuda_layers::rope_rotate(x[base + i], x[base + i + half], angle, 1.0);
        const cuda_layers::RopePair g = cuda_layers::rope_rotate(x[base + i], x[base + i + half], angle, -1.0);
        CHECK(f.a == y[base + i]);
        CHECK(f.b == y[base + i + half]);
        CHECK(g.a == back[base + i]);
        CHECK(g.b == back[base + i + half]);
      }
    }
  }
}

TEST_CASE("the classifier rows' terms give the cpu_layers cross_entropy losses and logit gradients") {
  // With W the identity (in = out), the layer's logits are x and its d_x is the logit gradient dz.
  CpuLayers cpu;
  auto ce = cpu.make<LossLayer>("cross_entropy");
  std::mt19937_64 rng(17);
  const int64_t rows = 6, out = 11, real_out = 9;
  LayerSpec spec;
  spec.in = out;
  spec.out = out;
  spec.real_out = real_out;
  std::vector<float> W(std::size_t(out * out), 0.0f);
  for (int64_t c = 0; c < out; ++c) W[std::size_t(c * out + c)] = 1.0f;
  std::vector<float> z = randn(std::size_t(rows * out), rng, 3.0f);
  std::vector<float> losses(static_cast<std::size_t>(rows)), dz(z.size()), grads(W.size(), 0.0f);
  std::vector<float> scratch(static_cast<std::size_t>(ce->scratch_elements(spec, rows)));
  Batch b;
  b.reset(1, int32_t(rows));
  const int32_t targets[] = {0, 8, -1, 3, 3, 5};
  for (int64_t r = 0; r < rows; ++r) b.targets[std::size_t(r)] = targets[r];
  const BatchViews views = host_batch_views(b);
  const float scale = 0.25f;
  LayerCall call;
  call.spec = &spec;
  call.batch = &views;
  call.rows = rows;
  call.x = flat_view(z.data(), DType::f32, int64_t(z.size()));
  call.params = flat_view(W.data(), DType::f32, int64_t(W.size()));
  call.grads = flat_view(grads.data(), DType::f32, int64_t(grads.size()));
  call.losses = flat_view(losses.data(), DType::f32, rows);
  call.scratch = flat_view(scratch.data(), DType::f32, int64_t(scratch.size()));
  call.d_x = flat_view(dz.data(), DType::f32, int64_t(dz.size()));
  call.grad_scale = scale;
  ce->loss(call);
  for (int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    const float* zr = z.data() + r * out;
    if (targets[r] < 0) {
      CHECK(losses[std::size_t(r)] == 0.0f);
      continue;
    }
    // As the kernel: float max, double sum of float exps, lse in double.
    float mx = zr[0];
    for (int64_t c = 1; c < real_out; ++c) mx = std::max(mx, zr[c]);
    double sum = 0.0;
    for (int64_t c = 0; c < real_out; ++c) sum += double(std::exp(zr[c] - mx));
    const double lse = double(mx) + std::log(sum);
    // Summation orders differ (the kernel's tree, the layer's loop): a few ulps of a sum of 9 terms.
    CHECK(std::abs(cuda_layers::ce_loss(lse, zr[targets[r]]) - losses[std::size_t(r)]) <= 1e-6f * (1.0f + losses[std::size_t(r)]));
    for (int64_t c = 0; c < out; ++c) {
      float g = c < real_out ? cuda_layers::ce_dz(zr[c], float(lse), scale) : 0.0f;
      if (c == targets[r]) g -= scale;
      CHECK(std::abs(g - dz[std::size_t(r * out + c)]) <= 1e-6f);
    }
  }
}
