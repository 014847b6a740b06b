// The host half of the CUDA norms: the per-element arithmetic their kernels use
// (plugins/cuda_layers/norm_math.hpp, __host__ __device__), applied here on the CPU row by row as
// the kernels apply it (float statistics), against the cpu_layers norms (double statistics) on
// random rows of odd widths, forward and input gradient. The kernels themselves run on a GPU
// (test_cpu_layers' device cases); this checks that what they compute per element is the norm.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/layer.hpp"
#include "ablate/registry.hpp"
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

TEST_CASE("the CUDA norms' per-element arithmetic is the cpu_layers norms (layernorm, rmsnorm; widths 1, 7, 61, 769)") {
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
