// The `cpu_layers` plugin: every layer's gradients against central finite differences in float64
// (odd sizes, random inputs, against the random linear functional sum(y * w)), "backward twice
// equals twice the gradient", residual paths, dropout, float32 against float64, and each layer
// against an independent direct computation (norm formulas, complex-number rotation for rope,
// a plain log-softmax for the classifier), and every layer on every device (kDevices: cpu here, cuda
// where a GPU is) against the float64 CPU layers. Outputs are poisoned with NaN before every call.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/registry.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

struct Plugins {
  Registry registry;
  Plugins() { registry.load_directories({test::plugin_dir()}); }
};

Plugins& plugins() {
  static Plugins p;
  return p;
}

template <class L = Layer>
std::unique_ptr<L> make_as(const std::string& name, const Params& own = {}) {
  Params common{"model", {}};
  RunContext run;
  return plugins().registry.create<L>(Kind::layer, name, {common, own, run});
}

std::unique_ptr<Layer> make(const std::string& name, const Params& own = {}) { return make_as<Layer>(name, own); }
std::unique_ptr<LossLayer> make_loss(const std::string& name) { return make_as<LossLayer>(name); }

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

template <class T>
TensorView view(std::vector<T>& v) {
  TensorView t;
  if (v.empty()) return t;
  t.data = v.data();
  t.dtype = dtype_of<T>();
  t.ndim = 1;
  t.shape[0] = int64_t(v.size());
  return t;
}

template <class T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

template <class To, class From>
std::vector<To> convert(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

std::vector<double> randn(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// max_i |a_i - b_i| / max(1, max_i |b_i|)
template <class A, class B>
double scaled_diff(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 1.0, worst = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
  }
  return worst / scale;
}

// One use of a layer.
struct Case {
  std::string name;  // for messages
  std::string layer;
  LayerSpec spec;
  int64_t rows = 7, heads = 1;
  int64_t nx = 0, ny = 0;  // x and y elements
  Batch batch;
  mutable BatchViews views;  // of `batch`, made by make_call
  double dropout = 0.0;
  uint64_t key = 0;
  bool residual = false;       // y = residual + f(x)
  bool residual_in_y = false;  // the residual is y's own buffer
  bool alias = false;          // y is x's buffer, d_x is d_y's buffer
  bool has_dx = true;          // the layer has an input
};

template <class T>
struct State {
  std::vector<T> x, params, residual, saved, scratch;
};

LayerCall make_call(const Case& c) {
  LayerCall call;
  call.spec = &c.spec;
  c.views = host_batch_views(c.batch);
  call.batch = &c.views;
  call.rows = c.rows;
  call.heads = c.heads;
  call.dropout = c.dropout;
  call.dropout_key = c.key;
  return call;
}

// Forward pass; returns y and leaves the activations in s.saved.
template <class T>
std::vector<T> forward(Layer& layer, const Case& c, State<T>& s) {
  s.saved.assign(std::size_t(layer.activation_elements(c.spec, c.rows)), kNaN<T>);
  s.scratch.assign(std::size_t(layer.scratch_elements(c.spec, c.rows)), kNaN<T>);
  std::vector<T> x = s.x, res = s.residual;
  std::vector<T> y(std::size_t(c.ny), kNaN<T>);
  LayerCall call = make_call(c);
  if (c.alias) {
    y = x;
    call.x = view(y);
  } else {
    call.x = view(x);
  }
  call.y = view(y);
  if (c.residual) {
    if (c.residual_in_y) {
      y = res;
      call.residual = view(y);
    } else {
      call.residual = view(res);
    }
  }
  call.params = view(s.params);
  call.saved = view(s.saved);
  call.scratch = view(s.scratch);
  layer.forward(call);
  return y;
}

// Backward pass after forward(layer, c, s): dx and grads are updated in place.
template <class T>
void backward(Layer& layer, const Case& c, State<T>& s, const std::vector<T>& dy, GradMode mode, std::vector<T>& dx,
              std::vector<T>& grads) {
  std::fill(s.scratch.begin(), s.scratch.end(), kNaN<T>);
  std::vector<T> x = s.x, dyc = dy;
  LayerCall call = make_call(c);
  call.x = view(x);
  call.params = view(s.params);
  call.saved = view(s.saved);
  call.scratch = view(s.scratch);
  call.grads = view(grads);
  call.input_grad = mode;
  call.d_y = view(dyc);
  if (c.alias) {
    call.d_x = view(dyc);
  } else if (c.has_dx) {
    call.d_x = view(dx);
  }
  layer.backward(call);
  if (c.alias) dx = dyc;
}

ParamTable declare(Layer& layer, const Case& c) {
  ParamTable table;
  layer.declare_params(c.spec, "l", table);
  return table;
}

State<double> random_state(Layer& layer, const Case& c, std::mt19937_64& rng) {
  State<double> s;
  s.params = randn(std::size_t(declare(layer, c).total), rng, 0.5);
  s.x = randn(std::size_t(c.nx), rng);
  if (c.residual) s.residual = randn(std::size_t(c.ny), rng);
  return s;
}

// d_x and every parameter gradient against central differences of sum(y * w).
void check_finite_differences(const Case& c) {
  INFO("case: " << c.name);
  auto layer = make(c.layer);
  std::mt19937_64 rng(11);
  State<double> s = random_state(*layer, c, rng);
  const std::vector<double> w = randn(std::size_t(c.ny), rng);
  const std::vector<double> y = forward(*layer, c, s);
  REQUIRE(all_finite(y));
  REQUIRE(all_finite(s.saved));
  std::vector<double> dx(std::size_t(c.nx), kNaN<double>), grads(s.params.size(), 0.0);
  backward(*layer, c, s, w, GradMode::overwrite, dx, grads);
  if (c.has_dx) REQUIRE(all_finite(dx));
  REQUIRE(all_finite(grads));

  const double h = 1e-6;
  auto loss = [&](State<double> probe) { return dot(forward(*layer, c, probe), w); };
  if (c.has_dx) {
    std::vector<double> fd(dx.size());
    for (std::size_t i = 0; i < dx.size(); ++i) {
      State<double> plus = s, minus = s;
      plus.x[i] += h;
      minus.x[i] -= h;
      fd[i] = (loss(plus) - loss(minus)) / (2 * h);
    }
    CHECK(scaled_diff(dx, fd) < 1e-6);
  }
  const ParamTable table = declare(*layer, c);
  for (const ParamSlice& slice : table.slices) {
    INFO("parameter: " << slice.name);
    std::vector<double> fd(std::size_t(slice.numel())), got(fd.size());
    for (int64_t j = 0; j < slice.numel(); ++j) {
      const std::size_t k = std::size_t(slice.offset + j);
      State<double> plus = s, minus = s;
      plus.params[k] += h;
      minus.params[k] -= h;
      fd[std::size_t(j)] = (loss(plus) - loss(minus)) / (2 * h);
      got[std::size_t(j)] = grads[k];
    }
    CHECK(scaled_diff(got, fd) < 1e-6);
  }
  if (c.residual) {
    // The residual enters with gradient d_y; its contribution to y is exactly the residual.
    Case plain = c;
    plain.residual = plain.residual_in_y = false;
    State<double> p = s;
    const std::vector<double> f = forward(*layer, plain, p);
    std::vector<double> with = y;
    for (std::size_t i = 0; i < with.size(); ++i) with[i] -= s.residual[i];
    CHECK(scaled_diff(with, f) < 1e-12);
  }
}

// Parameter gradients accumulate; d_x is written, or added under GradMode::accumulate.
void check_accumulation(const Case& c) {
  INFO("case: " << c.name);
  auto layer = make(c.layer);
  std::mt19937_64 rng(12);
  State<double> s = random_state(*layer, c, rng);
  const std::vector<double> dy = randn(std::size_t(c.ny), rng);
  forward(*layer, c, s);
  std::vector<double> dx1(std::size_t(c.nx), kNaN<double>), g1(s.params.size(), 0.0);
  backward(*layer, c, s, dy, GradMode::overwrite, dx1, g1);
  std::vector<double> dx2(std::size_t(c.nx), kNaN<double>), g2(s.params.size(), 0.0);
  backward(*layer, c, s, dy, GradMode::overwrite, dx2, g2);
  backward(*layer, c, s, dy, GradMode::overwrite, dx2, g2);
  std::vector<double> twice = g1;
  for (double& v : twice) v *= 2;
  CHECK(scaled_diff(g2, twice) < 1e-12);
  if (c.has_dx) CHECK(scaled_diff(dx2, dx1) == 0.0);  // overwritten, not added
  if (c.has_dx && !c.alias) {
    std::vector<double> acc(std::size_t(c.nx), 0.0), g3(s.params.size(), 0.0);
    backward(*layer, c, s, dy, GradMode::accumulate, acc, g3);
    backward(*layer, c, s, dy, GradMode::accumulate, acc, g3);
    std::vector<double> dx_twice = dx1;
    for (double& v : dx_twice) v *= 2;
    CHECK(scaled_diff(acc, dx_twice) < 1e-12);
    std::vector<double> base = randn(std::size_t(c.nx), rng), onto = base;
    backward(*layer, c, s, dy, GradMode::accumulate, onto, g3);
    for (std::size_t i = 0; i < base.size(); ++i) base[i] += dx1[i];
    CHECK(scaled_diff(onto, base) < 1e-12);
  }
}

// The float32 path against the float64 path on the same inputs.
void check_float32(const Case& c) {
  INFO("case: " << c.name);
  auto layer = make(c.layer);
  std::mt19937_64 rng(13);
  State<double> sd = random_state(*layer, c, rng);
  const std::vector<double> dy = randn(std::size_t(c.ny), rng);
  State<float> sf{convert<float>(sd.x), convert<float>(sd.params), convert<float>(sd.residual), {}, {}};
  // Round the inputs once so both paths see the same values.
  sd.x = convert<double>(sf.x);
  sd.params = convert<double>(sf.params);
  sd.residual = convert<double>(sf.residual);
  const std::vector<double> yd = forward(*layer, c, sd);
  const std::vector<float> yf = forward(*layer, c, sf);
  CHECK(scaled_diff(yf, yd) < 2e-5);
  std::vector<double> dxd(std::size_t(c.nx), kNaN<double>), gd(sd.params.size(), 0.0);
  std::vector<float> dxf(std::size_t(c.nx), kNaN<float>), gf(sf.params.size(), 0.0f);
  backward(*layer, c, sd, dy, GradMode::overwrite, dxd, gd);
  backward(*layer, c, sf, convert<float>(dy), GradMode::overwrite, dxf, gf);
  if (c.has_dx) CHECK(scaled_diff(dxf, dxd) < 2e-5);
  CHECK(scaled_diff(gf, gd) < 2e-5);
}

void check_all(const Case& c) {
  check_finite_differences(c);
  check_accumulation(c);
  check_float32(c);
}

// A batch of one row of `rows` positions with the given positions (tokens and targets random).
Batch make_batch(int64_t rows, std::mt19937_64& rng, int32_t tokens, std::vector<int32_t> positions) {
  Batch b;
  b.reset(1, int32_t(rows));
  std::uniform_int_distribution<int32_t> tok(0, std::max(tokens - 1, 0));
  for (int64_t r = 0; r < rows; ++r) {
    b.tokens[r] = tok(rng);
    b.targets[r] = tok(rng);
    b.segment_ids[r] = 1;
  }
  if (!positions.empty()) b.positions = std::move(positions);
  return b;
}

Case embedding_case(double dropout) {
  std::mt19937_64 rng(1);
  Case c;
  c.name = dropout > 0 ? "embedding with dropout" : "embedding";
  c.layer = "embedding";
  c.spec.in = 13;
  c.spec.out = 11;
  c.nx = 0;
  c.ny = c.rows * 13;
  c.has_dx = false;
  c.batch = make_batch(c.rows, rng, 11, {});
  c.batch.tokens = {3, 5, 3, 10, 0, 5, 3};  // repeats: gradients add up per token
  c.dropout = dropout;
  c.key = 99;
  return c;
}

Case learned_case(bool alias) {
  std::mt19937_64 rng(2);
  Case c;
  c.name = alias ? "learned in place" : "learned";
  c.layer = "learned";
  c.spec.in = 13;
  c.spec.max_positions = 5;
  c.nx = c.ny = c.rows * 13;
  c.alias = alias;
  c.batch = make_batch(c.rows, rng, 1, {0, 1, 2, 0, 1, 4, 0});
  return c;
}

Case rope_case(bool alias) {
  std::mt19937_64 rng(3);
  Case c;
  c.name = alias ? "rope in place" : "rope";
  c.layer = "rope";
  c.spec.in = 6;
  c.heads = 3;
  c.nx = c.ny = c.rows * 3 * 6;
  c.alias = alias;
  c.batch = make_batch(c.rows, rng, 1, {0, 1, 2, 3, 0, 1, 117});
  return c;
}

Case norm_case(const std::string& layer, bool bias) {
  Case c;
  c.name = layer + (bias ? " with bias" : " without bias");
  c.layer = layer;
  c.spec.in = 13;
  c.spec.bias = bias;
  c.spec.eps = 1e-5;
  c.nx = c.ny = c.rows * 13;
  c.batch.reset(1, int32_t(c.rows));
  return c;
}

Case dense_case(const std::string& layer, bool bias, bool residual, bool residual_in_y, double dropout) {
  Case c;
  c.name = layer + (bias ? " bias" : " no-bias") + (residual ? (residual_in_y ? " residual-in-y" : " residual") : "") +
           (dropout > 0 ? " dropout" : "");
  c.layer = layer;
  c.spec.in = 13;
  c.spec.out = 11;
  c.spec.bias = bias;
  c.nx = c.rows * 13;
  c.ny = c.rows * (layer == "linear" ? 11 : 13);
  c.residual = residual;
  c.residual_in_y = residual_in_y;
  c.dropout = dropout;
  c.key = 12345;
  c.batch.reset(1, int32_t(c.rows));
  return c;
}

std::vector<Case> dense_cases(const std::string& layer) {
  return {dense_case(layer, true, false, false, 0.0),  dense_case(layer, false, false, false, 0.0),
          dense_case(layer, true, true, false, 0.0),   dense_case(layer, true, true, true, 0.0),
          dense_case(layer, true, false, false, 0.25), dense_case(layer, false, true, true, 0.25)};
}

}  // namespace

// --- registration, parameters, counts -------------------------------------------------------------

TEST_CASE("cpu_layers registers every layer with its role") {
  const std::pair<const char*, LayerRole> expected[] = {
      {"embedding", LayerRole::embedding}, {"learned", LayerRole::position}, {"rope", LayerRole::position},
      {"layernorm", LayerRole::norm},      {"rmsnorm", LayerRole::norm},     {"linear", LayerRole::linear},
      {"gelu_mlp", LayerRole::mlp},        {"swiglu_mlp", LayerRole::mlp},   {"cross_entropy", LayerRole::classifier}};
  for (const auto& [name, role] : expected) {
    INFO(name);
    CHECK(make_as<LayerBase>(name)->role() == role);
  }
}

TEST_CASE("parameters are named under the prefix with their shapes, decay and initialisation") {
  LayerSpec s;
  s.in = 13;
  s.out = 11;
  s.max_positions = 5;
  s.init_std = 0.03;
  auto names = [&](const char* layer, const LayerSpec& spec) {
    ParamTable t;
    make_as<LayerBase>(layer)->declare_params(spec, "blocks.0.x", t);
    std::vector<std::string> n;
    for (const ParamSlice& sl : t.slices) n.push_back(sl.name);
    return std::make_pair(n, t);
  };
  {
    auto [n, t] = names("linear", s);
    CHECK(n == std::vector<std::string>{"blocks.0.x.weight", "blocks.0.x.bias"});
    CHECK(t.slices[0].shape == std::vector<int64_t>{11, 13});
    CHECK(t.slices[0].decay);
    CHECK(t.slices[0].init_std == 0.03);
    CHECK(t.slices[1].shape == std::vector<int64_t>{11});
    CHECK(!t.slices[1].decay);
    CHECK(t.slices[1].init_std == 0.0);
    CHECK(t.slices[1].init_value == 0.0);
  }
  {
    auto [n, t] = names("layernorm", s);
    CHECK(n == std::vector<std::string>{"blocks.0.x.weight", "blocks.0.x.bias"});
    CHECK(t.slices[0].init_std == 0.0);
    CHECK(t.slices[0].init_value == 1.0);
    CHECK(!t.slices[0].decay);
  }
  {
    auto [n, t] = names("rmsnorm", s);
    CHECK(n == std::vector<std::string>{"blocks.0.x.weight"});
    CHECK(t.slices[0].init_value == 1.0);
  }
  {
    auto [n, t] = names("gelu_mlp", s);
    CHECK(n ==
          std::vector<std::string>{"blocks.0.x.fc.weight", "blocks.0.x.fc.bias", "blocks.0.x.proj.weight", "blocks.0.x.proj.bias"});
    CHECK(t.slices[0].shape == std::vector<int64_t>{11, 13});
    CHECK(t.slices[2].shape == std::vector<int64_t>{13, 11});
    CHECK(t.total == 2 * 11 * 13 + 11 + 13);
  }
  {
    auto [n, t] = names("swiglu_mlp", s);
    CHECK(n == std::vector<std::string>{"blocks.0.x.gate.weight", "blocks.0.x.gate.bias", "blocks.0.x.up.weight", "blocks.0.x.up.bias",
                                        "blocks.0.x.down.weight", "blocks.0.x.down.bias"});
  }
  LayerSpec nb = s;
  nb.bias = false;
  CHECK(names("linear", nb).first == std::vector<std::string>{"blocks.0.x.weight"});
  CHECK(names("layernorm", nb).first == std::vector<std::string>{"blocks.0.x.weight"});
  CHECK(names("swiglu_mlp", nb).first ==
        std::vector<std::string>{"blocks.0.x.gate.weight", "blocks.0.x.up.weight", "blocks.0.x.down.weight"});
  {
    auto [n, t] = names("embedding", s);
    CHECK(n == std::vector<std::string>{"blocks.0.x.weight"});
    CHECK(t.slices[0].shape == std::vector<int64_t>{11, 13});
    CHECK(t.slices[0].decay);
  }
  CHECK(names("learned", s).second.slices[0].shape == std::vector<int64_t>{5, 13});
  LayerSpec head = s;
  head.in = 6;
  CHECK(names("rope", head).first.empty());
  CHECK_THROWS_AS(names("rope", s), Error);  // an odd head_dim has no rotate-half pairs
  CHECK(names("cross_entropy", s).first == std::vector<std::string>{"blocks.0.x.weight"});
  LayerSpec tied = s;
  tied.declare = false;
  CHECK(names("cross_entropy", tied).first.empty());
}

TEST_CASE("activation and scratch counts") {
  LayerSpec s;
  s.in = 13;
  s.out = 11;
  CHECK(make("layernorm")->activation_elements(s, 7) == 14);
  CHECK(make("rmsnorm")->activation_elements(s, 7) == 7);
  CHECK(make("linear")->activation_elements(s, 7) == 0);
  CHECK(make("gelu_mlp")->activation_elements(s, 7) == 2 * 7 * 11);
  CHECK(make("gelu_mlp")->scratch_elements(s, 7) == 7 * 11);
  CHECK(make("swiglu_mlp")->activation_elements(s, 7) == 3 * 7 * 11);
  CHECK(make_loss("cross_entropy")->scratch_elements(s, 7) == 7 * 11);
  CHECK(make_loss("cross_entropy")->scratch_elements(s, 100000) <= 1024 * 11);  // chunked, never all rows
  CHECK(make("embedding")->activation_elements(s, 7) == 0);
  CHECK(make("rope")->activation_elements(s, 7) == 0);
}

// --- gradients ------------------------------------------------------------------------------------

TEST_CASE("embedding: gradients, accumulation, float32") {
  check_all(embedding_case(0.0));
  check_all(embedding_case(0.3));
}

TEST_CASE("learned: gradients, accumulation, float32, in place") {
  check_all(learned_case(false));
  check_all(learned_case(true));
}

TEST_CASE("rope: gradients, accumulation, float32, in place") {
  check_all(rope_case(false));
  check_all(rope_case(true));
}

TEST_CASE("layernorm: gradients, accumulation, float32") {
  check_all(norm_case("layernorm", true));
  check_all(norm_case("layernorm", false));
}

TEST_CASE("rmsnorm: gradients, accumulation, float32") { check_all(norm_case("rmsnorm", false)); }

TEST_CASE("linear: gradients, accumulation, float32, residual, dropout") {
  for (const Case& c : dense_cases("linear")) check_all(c);
}

TEST_CASE("gelu_mlp: gradients, accumulation, float32, residual, dropout") {
  for (const Case& c : dense_cases("gelu_mlp")) check_all(c);
}

TEST_CASE("swiglu_mlp: gradients, accumulation, float32, residual, dropout") {
  for (const Case& c : dense_cases("swiglu_mlp")) check_all(c);
}

// Rows [r0, r0 + n) of a case as a case of its own (its batch sliced the same way).
Case slice_case(const Case& c, int64_t r0, int64_t n) {
  Case s = c;
  s.rows = n;
  s.nx = c.nx / c.rows * n;
  s.ny = c.ny / c.rows * n;
  s.batch.reset(1, int32_t(n));
  auto cut = [&](const std::vector<int32_t>& v) { return std::vector<int32_t>(v.begin() + r0, v.begin() + r0 + n); };
  s.batch.tokens = cut(c.batch.tokens);
  s.batch.targets = cut(c.batch.targets);
  s.batch.positions = cut(c.batch.positions);
  return s;
}

std::vector<double> cut(const std::vector<double>& v, int64_t per_row, int64_t r0, int64_t n) {
  if (v.empty()) return {};
  return std::vector<double>(v.begin() + r0 * per_row, v.begin() + (r0 + n) * per_row);
}

// A call large enough for the threaded loops against the same rows in calls small enough to run on
// one thread: outputs and d_x agree, parameter gradients agree up to summation order.
void check_threaded(Case c) {
  INFO("case: " << c.name);
  auto layer = make(c.layer);
  std::mt19937_64 rng(14);
  State<double> s = random_state(*layer, c, rng);
  const std::vector<double> dy = randn(std::size_t(c.ny), rng);
  const std::vector<double> y = forward(*layer, c, s);
  std::vector<double> dx(std::size_t(c.nx), kNaN<double>), grads(s.params.size(), 0.0);
  backward(*layer, c, s, dy, GradMode::overwrite, dx, grads);
  const int64_t xr = c.nx / c.rows, yr = c.ny / c.rows, step = 100;
  std::vector<double> y2, dx2, grads2(s.params.size(), 0.0);
  for (int64_t r0 = 0; r0 < c.rows; r0 += step) {
    const int64_t n = std::min(step, c.rows - r0);
    const Case sc = slice_case(c, r0, n);
    State<double> ss{cut(s.x, xr, r0, n), s.params, cut(s.residual, yr, r0, n), {}, {}};
    const std::vector<double> ys = forward(*layer, sc, ss);
    y2.insert(y2.end(), ys.begin(), ys.end());
    std::vector<double> dxs(std::size_t(sc.nx), kNaN<double>);
    backward(*layer, sc, ss, cut(dy, yr, r0, n), GradMode::overwrite, dxs, grads2);
    dx2.insert(dx2.end(), dxs.begin(), dxs.end());
  }
  CHECK(scaled_diff(y, y2) < 1e-13);
  if (c.has_dx) CHECK(scaled_diff(dx, dx2) < 1e-13);
  CHECK(scaled_diff(grads, grads2) < 1e-12);
}

TEST_CASE("large calls (threaded loops) equal the same rows in small calls") {
  std::mt19937_64 rng(15);
  const int64_t rows = 1500;
  std::vector<int32_t> positions(static_cast<std::size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) positions[std::size_t(r)] = int32_t(r % 5);
  auto grow = [&](Case c) {
    c.nx = c.nx / c.rows * rows;
    c.ny = c.ny / c.rows * rows;
    c.rows = rows;
    c.batch = make_batch(rows, rng, int32_t(std::max<int64_t>(c.spec.out, 1)), positions);
    return c;
  };
  check_threaded(grow(embedding_case(0.0)));
  check_threaded(grow(learned_case(false)));
  check_threaded(grow(rope_case(true)));
  check_threaded(grow(norm_case("layernorm", true)));
  check_threaded(grow(norm_case("rmsnorm", false)));
  check_threaded(grow(dense_case("linear", true, true, true, 0.0)));
  check_threaded(grow(dense_case("gelu_mlp", true, true, false, 0.0)));
  check_threaded(grow(dense_case("swiglu_mlp", true, false, false, 0.0)));
}

// --- direct formulas ------------------------------------------------------------------------------

TEST_CASE("embedding and learned forward are the table rows") {
  Case c = embedding_case(0.0);
  auto emb = make("embedding");
  std::mt19937_64 rng(4);
  State<double> s = random_state(*emb, c, rng);
  const std::vector<double> y = forward(*emb, c, s);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < 13; ++j) CHECK(y[r * 13 + j] == s.params[c.batch.tokens[r] * 13 + j]);
  }
  Case l = learned_case(false);
  auto learned = make("learned");
  State<double> t = random_state(*learned, l, rng);
  const std::vector<double> z = forward(*learned, l, t);
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t j = 0; j < 13; ++j) {
      CHECK(z[r * 13 + j] == doctest::Approx(t.x[r * 13 + j] + t.params[l.batch.positions[r] * 13 + j]).epsilon(1e-15));
    }
  }
}

TEST_CASE("layernorm and rmsnorm match the direct formulas") {
  std::mt19937_64 rng(5);
  for (const char* name : {"layernorm", "rmsnorm"}) {
    INFO(name);
    const bool ln = std::string(name) == "layernorm";
    Case c = norm_case(name, ln);
    auto layer = make(name);
    State<double> s = random_state(*layer, c, rng);
    for (double& v : s.x) v = 3.0 + 2.0 * v;  // off-centre rows
    const std::vector<double> y = forward(*layer, c, s);
    std::vector<double> ref(y.size());
    for (int64_t r = 0; r < c.rows; ++r) {
      const double* x = s.x.data() + r * 13;
      double mean = 0.0, ms = 0.0;
      for (int j = 0; j < 13; ++j) mean += x[j] / 13.0;
      for (int j = 0; j < 13; ++j) ms += (ln ? (x[j] - mean) * (x[j] - mean) : x[j] * x[j]) / 13.0;
      for (int j = 0; j < 13; ++j) {
        const double xhat = ((ln ? x[j] - mean : x[j])) / std::sqrt(ms + c.spec.eps);
        ref[r * 13 + j] = xhat * s.params[j] + (ln ? s.params[13 + j] : 0.0);
      }
      if (ln) {
        CHECK(s.saved[r] == doctest::Approx(mean).epsilon(1e-14));
        CHECK(s.saved[c.rows + r] == doctest::Approx(1.0 / std::sqrt(ms + c.spec.eps)).epsilon(1e-14));
      } else {
        CHECK(s.saved[r] == doctest::Approx(1.0 / std::sqrt(ms + c.spec.eps)).epsilon(1e-14));
      }
    }
    CHECK(scaled_diff(y, ref) < 1e-13);
  }
}

TEST_CASE("rope matches a complex-number rotation, restarts with positions, and inverts") {
  Case c = rope_case(false);
  auto layer = make("rope", Params("model.rope", {{"theta", Value{500.0}}}));  // [model.rope] theta
  std::mt19937_64 rng(6);
  State<double> s = random_state(*layer, c, rng);
  // Rows 0 and 4 both sit at position 0 (a new document starts at row 4): identical inputs there.
  for (int j = 0; j < 18; ++j) s.x[4 * 18 + j] = s.x[j];
  const std::vector<double> y = forward(*layer, c, s);
  const int64_t D = 6, half = 3;
  std::vector<double> ref(y.size());
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t h = 0; h < 3; ++h) {
      const double* x = s.x.data() + (r * 3 + h) * D;
      double* o = ref.data() + (r * 3 + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = c.batch.positions[r] / std::pow(500.0, double(2 * i) / double(D));
        const std::complex<double> z = std::complex<double>(x[i], x[i + half]) * std::polar(1.0, angle);
        o[i] = z.real();
        o[i + half] = z.imag();
      }
    }
  }
  CHECK(scaled_diff(y, ref) < 1e-13);
  for (int j = 0; j < 18; ++j) {
    CHECK(y[j] == s.x[j]);  // position 0 is the identity
    CHECK(y[4 * 18 + j] == y[j]);
  }
  // Backward is the inverse rotation: applying it to y gives x back.
  std::vector<double> dx(y.size(), kNaN<double>), grads;
  backward(*layer, c, s, y, GradMode::overwrite, dx, grads);
  CHECK(scaled_diff(dx, s.x) < 1e-13);

  Case odd = c;
  odd.spec.in = 5;
  odd.nx = odd.ny = odd.rows * 3 * 5;
  State<double> so;
  so.x.assign(std::size_t(odd.nx), 1.0);
  CHECK_THROWS_AS(forward(*layer, odd, so), Error);
}

// --- dropout --------------------------------------------------------------------------------------

TEST_CASE("dropout: the mask depends only on the key, drops about p, and scales the rest") {
  Case c = dense_case("linear", false, false, false, 0.0);
  c.rows = 64;
  c.spec.out = 257;
  c.nx = c.rows * 13;
  c.ny = c.rows * 257;
  auto layer = make("linear");
  std::mt19937_64 rng(7);
  State<double> s = random_state(*layer, c, rng);
  const std::vector<double> plain = forward(*layer, c, s);
  for (double p : {0.1, 0.5}) {
    INFO("p = " << p);
    Case d = c;
    d.dropout = p;
    d.key = 42;
    const std::vector<double> a = forward(*layer, d, s), b = forward(*layer, d, s);
    CHECK(a == b);
    int64_t dropped = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] == 0.0) {
        ++dropped;
      } else {
        worst = std::max(worst, std::abs(a[i] - plain[i] / (1.0 - p)));
      }
    }
    CHECK(worst < 1e-12);
    CHECK(std::abs(double(dropped) / double(a.size()) - p) < 0.02);  // 16448 draws: about 5 sigma
    d.key = 43;
    CHECK(forward(*layer, d, s) != a);
  }
  // The embedding masks its rows the same way.
  Case e = embedding_case(0.5);
  auto emb = make("embedding");
  State<double> se = random_state(*emb, e, rng);
  const std::vector<double> ya = forward(*emb, e, se);
  CHECK(ya == forward(*emb, e, se));
  const auto zeros = std::count(ya.begin(), ya.end(), 0.0);
  CHECK(zeros > 0);
  CHECK(zeros < int64_t(ya.size()));
}

TEST_CASE("embedding gradients are the same every run") {
  Case c = embedding_case(0.0);
  c.rows = 4000;
  c.spec.in = 130;
  c.ny = c.rows * 130;
  std::mt19937_64 rng(8);
  c.batch = make_batch(c.rows, rng, 3, {});  // three tokens: heavy collisions
  auto layer = make("embedding");
  State<float> s{{}, convert<float>(randn(std::size_t(11 * 130), rng)), {}, {}, {}};
  const std::vector<float> dy = convert<float>(randn(std::size_t(c.ny), rng));
  forward(*layer, c, s);
  std::vector<float> dx, g1(s.params.size(), 0.0f), g2(s.params.size(), 0.0f);
  backward(*layer, c, s, dy, GradMode::overwrite, dx, g1);
  backward(*layer, c, s, dy, GradMode::overwrite, dx, g2);
  CHECK(g1 == g2);
}

// --- classifier -----------------------------------------------------------------------------------

namespace {

struct ClassifierRun {
  std::vector<double> losses, logits, dx, grads;
};

// A plain float64 cross-entropy: logits, log-softmax over the first real_out columns, gradients.
ClassifierRun reference_classifier(const std::vector<double>& x, const std::vector<double>& W, const std::vector<int32_t>& targets,
                                   int64_t rows, int64_t in, int64_t out, int64_t real_out, double scale) {
  ClassifierRun r;
  r.losses.assign(std::size_t(rows), 0.0);
  r.logits.assign(std::size_t(rows * out), 0.0);
  r.dx.assign(std::size_t(rows * in), 0.0);
  r.grads.assign(std::size_t(out * in), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> z(static_cast<std::size_t>(out), 0.0);
    for (int64_t c = 0; c < out; ++c) {
      for (int64_t k = 0; k < in; ++k) z[c] += x[i * in + k] * W[c * in + k];
      r.logits[i * out + c] = z[c];
    }
    const int32_t t = targets[std::size_t(i)];
    if (t < 0) continue;
    double denom = 0.0;
    for (int64_t c = 0; c < real_out; ++c) denom += std::exp(z[c]);
    r.losses[i] = -(z[t] - std::log(denom));
    for (int64_t c = 0; c < real_out; ++c) {
      const double dz = scale * (std::exp(z[c]) / denom - (c == t ? 1.0 : 0.0));
      for (int64_t k = 0; k < in; ++k) {
        r.dx[i * in + k] += dz * W[c * in + k];
        r.grads[c * in + k] += dz * x[i * in + k];
      }
    }
  }
  return r;
}

template <class T>
struct ClassifierCall {
  LayerSpec spec;
  Batch batch;
  int64_t rows = 0;
  std::vector<T> x, W;
  double scale = 1.0;

  // Forward (with gradients when `grads` is true); logits requested when `logits` is true.
  ClassifierRun run(LossLayer& layer, bool grads, bool logits, GradMode mode = GradMode::overwrite) {
    std::vector<T> xs = x, Ws = W, losses(std::size_t(rows), kNaN<T>), lg, dx, g(W.size(), T(0));
    std::vector<T> scratch(std::size_t(layer.scratch_elements(spec, rows)), kNaN<T>);
    LayerCall call;
    const BatchViews views = host_batch_views(batch);
    call.spec = &spec;
    call.batch = &views;
    call.rows = rows;
    call.x = view(xs);
    call.params = view(Ws);
    call.scratch = view(scratch);
    call.losses = view(losses);
    call.grad_scale = scale;
    call.input_grad = mode;
    if (logits) {
      lg.assign(std::size_t(rows * spec.out), kNaN<T>);
      call.logits = view(lg);
    }
    if (grads) {
      dx.assign(x.size(), mode == GradMode::overwrite ? kNaN<T> : T(0));
      call.d_x = view(dx);
      call.grads = view(g);
    }
    layer.loss(call);
    return {convert<double>(losses), convert<double>(lg), convert<double>(dx), convert<double>(g)};
  }
};

ClassifierCall<double> classifier_problem(int64_t rows, int64_t in, int64_t out, int64_t real_out, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ClassifierCall<double> p;
  p.spec.in = in;
  p.spec.out = out;
  p.spec.real_out = real_out;
  p.rows = rows;
  p.batch = make_batch(rows, rng, int32_t(real_out), {});
  for (int64_t i = 0; i < rows; i += 3) p.batch.targets[std::size_t(i)] = -1;  // some rows carry no loss
  p.x = randn(std::size_t(rows * in), rng);
  p.W = randn(std::size_t(out * in), rng, 0.7);
  p.scale = 0.37;
  return p;
}

}  // namespace

TEST_CASE("cross_entropy: loss, logits and gradients against a plain log-softmax, padded columns excluded") {
  auto layer = make_loss("cross_entropy");
  ClassifierCall<double> p = classifier_problem(7, 13, 11, 9, 21);
  const ClassifierRun ref = reference_classifier(p.x, p.W, p.batch.targets, 7, 13, 11, 9, p.scale);
  const ClassifierRun got = p.run(*layer, true, true);
  CHECK(scaled_diff(got.losses, ref.losses) < 1e-13);
  CHECK(scaled_diff(got.logits, ref.logits) < 1e-13);  // every column, padded ones too
  CHECK(scaled_diff(got.dx, ref.dx) < 1e-13);
  CHECK(scaled_diff(got.grads, ref.grads) < 1e-13);
  for (int64_t i = 0; i < 7; i += 3) {
    CHECK(got.losses[i] == 0.0);
    for (int64_t k = 0; k < 13; ++k) CHECK(got.dx[i * 13 + k] == 0.0);
  }
  for (int64_t k = 9 * 13; k < 11 * 13; ++k) CHECK(got.grads[k] == 0.0);  // padded rows of W
  // Forward without gradients gives the same losses and leaves no logits requirement.
  const ClassifierRun plain = p.run(*layer, false, false);
  CHECK(plain.losses == got.losses);
  // The classifier has no separate backward: it is not a stream Layer at all.
  CHECK_THROWS_AS(make("cross_entropy"), Error);
}

TEST_CASE("cross_entropy: finite differences of grad_scale * sum(losses)") {
  auto layer = make_loss("cross_entropy");
  ClassifierCall<double> p = classifier_problem(7, 13, 11, 9, 22);
  const ClassifierRun got = p.run(*layer, true, false);
  const double h = 1e-6;
  auto loss = [&](ClassifierCall<double> q) {
    const ClassifierRun r = q.run(*layer, false, false);
    double s = 0.0;
    for (double v : r.losses) s += v;
    return q.scale * s;
  };
  std::vector<double> fdx(p.x.size()), fdw(p.W.size());
  for (std::size_t i = 0; i < p.x.size(); ++i) {
    ClassifierCall<double> a = p, b = p;
    a.x[i] += h;
    b.x[i] -= h;
    fdx[i] = (loss(a) - loss(b)) / (2 * h);
  }
  for (std::size_t i = 0; i < p.W.size(); ++i) {
    ClassifierCall<double> a = p, b = p;
    a.W[i] += h;
    b.W[i] -= h;
    fdw[i] = (loss(a) - loss(b)) / (2 * h);
  }
  CHECK(scaled_diff(got.dx, fdx) < 1e-6);
  CHECK(scaled_diff(got.grads, fdw) < 1e-6);
}

TEST_CASE("cross_entropy: many chunks of rows give the row-by-row result, and float32 agrees") {
  auto layer = make_loss("cross_entropy");
  // 256-row chunks of 70 columns: enough values for the threaded loop.
  ClassifierCall<double> p = classifier_problem(601, 5, 70, 65, 23);
  const ClassifierRun ref = reference_classifier(p.x, p.W, p.batch.targets, 601, 5, 70, 65, p.scale);
  const ClassifierRun got = p.run(*layer, true, true);
  CHECK(scaled_diff(got.losses, ref.losses) < 1e-12);
  CHECK(scaled_diff(got.logits, ref.logits) < 1e-12);
  CHECK(scaled_diff(got.dx, ref.dx) < 1e-12);
  CHECK(scaled_diff(got.grads, ref.grads) < 1e-12);
  // d_x accumulates when asked (the loss is unchanged).
  const ClassifierRun acc = p.run(*layer, true, false, GradMode::accumulate);
  CHECK(scaled_diff(acc.dx, ref.dx) < 1e-12);

  ClassifierCall<float> f;
  f.spec = p.spec;
  f.batch = p.batch;
  f.rows = p.rows;
  f.x = convert<float>(p.x);
  f.W = convert<float>(p.W);
  f.scale = p.scale;
  const ClassifierRun ref32 =
      reference_classifier(convert<double>(f.x), convert<double>(f.W), f.batch.targets, 601, 5, 70, 65, f.scale);
  const ClassifierRun got32 = f.run(*layer, true, true);
  CHECK(scaled_diff(got32.losses, ref32.losses) < 2e-5);
  CHECK(scaled_diff(got32.logits, ref32.logits) < 2e-5);
  CHECK(scaled_diff(got32.dx, ref32.dx) < 2e-5);
  CHECK(scaled_diff(got32.grads, ref32.grads) < 2e-5);
}

// --- misuse ---------------------------------------------------------------------------------------

TEST_CASE("misuse is refused: mixed dtypes, tokens out of range, bad targets") {
  Case c = dense_case("linear", true, false, false, 0.0);
  auto layer = make("linear");
  std::mt19937_64 rng(9);
  State<double> s = random_state(*layer, c, rng);
  std::vector<float> y(std::size_t(c.ny));
  LayerCall call = make_call(c);
  call.x = view(s.x);
  call.params = view(s.params);
  call.y = view(y);
  CHECK_THROWS_AS(layer->forward(call), Error);
  std::vector<int32_t> bad_tokens(std::size_t(c.rows), 0);
  bad_tokens[2] = 11;
  Case e = embedding_case(0.0);
  e.batch.tokens = bad_tokens;
  auto emb = make("embedding");
  State<double> se = random_state(*emb, e, rng);
  CHECK_THROWS_AS(forward(*emb, e, se), Error);

  auto ce = make_loss("cross_entropy");
  ClassifierCall<double> p = classifier_problem(7, 13, 11, 9, 24);
  p.batch.targets[1] = 9;  // a padded column is never a target
  CHECK_THROWS_AS(p.run(*ce, false, false), Error);
}

// --- every layer on every device against the CPU layers in float64 ------------------------------
//
// In the manner of ggml's test-backend-ops: each layer case runs on each device of kDevices in
// float32, its inputs uploaded through that device's buffers and its batch through
// Device::upload_batch, its outputs poisoned with NaN first, and forward, d_x and every parameter
// gradient are compared with the cpu_layers plugin in float64 on the same (float32-rounded)
// inputs, at rows 1, 7 and 257 and widths that are not multiples of 8. A device that cannot run
// here (no hardware) or has no registration of a layer is reported, not failed. Tolerance per
// dtype, relative to the largest reference magnitude: float32 2e-5 (reductions of up to ~300
// terms at 2^-24 each, with margin).

namespace {

constexpr const char* kDevices[] = {"cpu", "cuda"};
constexpr double kTolerance_f32 = 2e-5;

// `c` with `rows` rows and a batch to match (random tokens, targets and positions in range).
Case with_rows(Case c, int64_t rows, std::mt19937_64& rng) {
  const int64_t per_x = c.rows > 0 ? c.nx / c.rows : 0, per_y = c.ny / c.rows;
  c.rows = rows;
  c.nx = per_x * rows;
  c.ny = per_y * rows;
  const int32_t vocab = int32_t(std::max<int64_t>(c.spec.out, 1));
  const int32_t max_pos = c.layer == "learned" ? int32_t(c.spec.max_positions) : 200;
  std::uniform_int_distribution<int32_t> pos(0, max_pos - 1);
  std::vector<int32_t> positions(static_cast<std::size_t>(rows));
  for (int32_t& p : positions) p = pos(rng);
  c.batch = make_batch(rows, rng, vocab, positions);
  c.name += " x" + std::to_string(rows);
  return c;
}

struct DeviceUnderTest {
  std::string name;
  std::unique_ptr<Device> device;
  std::string why_not;  // non-empty: the device cannot run here
};

DeviceUnderTest open_device(const std::string& name) {
  DeviceUnderTest d{name, nullptr, ""};
  static const Params empty{"run", {}};
  RunContext run;
  run.device = name;
  try {
    d.device = plugins().registry.create<Device>(Kind::device, name, {empty, empty, run});
  } catch (const Error& e) {
    d.why_not = e.what();
  }
  return d;
}

Buffer upload_f32(Device& dev, const std::vector<double>& values) {
  const std::vector<float> f = convert<float>(values);
  Buffer b = dev.alloc(DType::f32, int64_t(f.size()));
  if (!f.empty()) dev.upload(b.view(), f.data());
  return b;
}

Buffer poisoned_f32(Device& dev, int64_t n) {
  Buffer b = dev.alloc(DType::f32, n);
  if (n > 0) dev.fill(b.view(), std::numeric_limits<float>::quiet_NaN());
  return b;
}

std::vector<double> download_f64(Device& dev, const Buffer& b) {
  std::vector<float> f(std::size_t(b.count()));
  if (!f.empty()) dev.download(f.data(), b.view());
  return convert<double>(f);
}

// One case on one device against the float64 CPU reference; false when the device has no
// registration of the layer (reported).
bool check_on_device(const Case& c, DeviceUnderTest& dut) {
  INFO("case: " << c.name << " on " << dut.name);
  Device& dev = *dut.device;
  RunContext run;
  run.device = dut.name;
  static const Params common{"model", {}};
  const Params own{"model." + c.layer, {}};
  std::unique_ptr<Layer> layer;
  try {
    layer = plugins().registry.create<Layer>(Kind::layer, c.layer, {common, own, run});
  } catch (const Error& e) {
    MESSAGE("not run: " << e.what());
    return false;
  }
  auto reference = make(c.layer);
  std::mt19937_64 rng(17);
  State<double> s = random_state(*reference, c, rng);
  s.x = convert<double>(convert<float>(s.x));  // both sides see the same float32 values
  s.params = convert<double>(convert<float>(s.params));
  s.residual = convert<double>(convert<float>(s.residual));
  const std::vector<double> dy = convert<double>(convert<float>(randn(std::size_t(c.ny), rng)));
  const std::vector<double> y_ref = forward(*reference, c, s);
  std::vector<double> dx_ref(std::size_t(c.nx), kNaN<double>), g_ref(s.params.size(), 0.0);
  backward(*reference, c, s, dy, GradMode::overwrite, dx_ref, g_ref);

  DeviceBatch batch;
  dev.upload_batch(c.batch, batch);
  Buffer x = upload_f32(dev, s.x), params = upload_f32(dev, s.params),
         grads = upload_f32(dev, std::vector<double>(s.params.size(), 0.0));
  Buffer y = c.alias ? upload_f32(dev, s.x) : (c.residual_in_y ? upload_f32(dev, s.residual) : poisoned_f32(dev, c.ny));
  Buffer residual = c.residual && !c.residual_in_y ? upload_f32(dev, s.residual) : Buffer{};
  Buffer saved = poisoned_f32(dev, layer->activation_elements(c.spec, c.rows));
  Buffer scratch = poisoned_f32(dev, layer->scratch_elements(c.spec, c.rows));
  LayerCall call;
  call.spec = &c.spec;
  call.batch = &batch.views;
  call.stream = dev.stream();
  call.rows = c.rows;
  call.heads = c.heads;
  call.dropout = c.dropout;
  call.dropout_key = c.key;
  call.x = c.alias ? y.view() : x.view();
  call.y = y.view();
  if (c.residual) call.residual = c.residual_in_y ? y.view() : residual.view();
  call.params = params.view();
  call.saved = saved.view();
  call.scratch = scratch.view();
  layer->forward(call);
  CHECK(scaled_diff(download_f64(dev, y), y_ref) < kTolerance_f32);

  Buffer d_y = upload_f32(dev, dy), d_x = poisoned_f32(dev, c.nx);
  if (scratch.count() > 0) dev.fill(scratch.view(), std::numeric_limits<float>::quiet_NaN());
  LayerCall back = call;
  back.residual = {};
  back.x = x.view();
  back.grads = grads.view();
  back.d_y = d_y.view();
  back.d_x = c.alias ? d_y.view() : (c.has_dx ? d_x.view() : TensorView{});
  back.input_grad = GradMode::overwrite;
  layer->backward(back);
  if (c.has_dx) CHECK(scaled_diff(download_f64(dev, c.alias ? d_y : d_x), dx_ref) < kTolerance_f32);
  CHECK(scaled_diff(download_f64(dev, grads), g_ref) < kTolerance_f32);
  return true;
}

// The classifier on a device against the float64 reference: losses, d_x and the weight gradient,
// with ignored rows (-1) and padded vocabulary columns; 1100 rows span two of a GPU's row chunks.
bool check_classifier_on_device(int64_t rows, DeviceUnderTest& dut) {
  INFO("cross_entropy x" << rows << " on " << dut.name);
  Device& dev = *dut.device;
  RunContext run;
  run.device = dut.name;
  static const Params common{"model", {}};
  std::unique_ptr<LossLayer> layer;
  try {
    layer = plugins().registry.create<LossLayer>(Kind::layer, "cross_entropy", {common, Params{"model.cross_entropy", {}}, run});
  } catch (const Error& e) {
    MESSAGE("not run: " << e.what());
    return false;
  }
  ClassifierCall<double> p = classifier_problem(rows, 37, 131, 127, 41 + uint64_t(rows));
  p.x = convert<double>(convert<float>(p.x));
  p.W = convert<double>(convert<float>(p.W));
  const ClassifierRun ref = reference_classifier(p.x, p.W, p.batch.targets, rows, 37, 131, 127, p.scale);
  DeviceBatch batch;
  dev.upload_batch(p.batch, batch);
  Buffer x = upload_f32(dev, p.x), W = upload_f32(dev, p.W), grads = upload_f32(dev, std::vector<double>(p.W.size(), 0.0));
  Buffer losses = poisoned_f32(dev, rows), d_x = poisoned_f32(dev, int64_t(p.x.size()));
  Buffer scratch = poisoned_f32(dev, layer->scratch_elements(p.spec, rows));
  LayerCall call;
  call.spec = &p.spec;
  call.batch = &batch.views;
  call.stream = dev.stream();
  call.rows = rows;
  call.x = x.view();
  call.params = W.view();
  call.scratch = scratch.view();
  call.losses = losses.view();
  call.grad_scale = p.scale;
  call.d_x = d_x.view();
  call.grads = grads.view();
  layer->loss(call);
  // Sums of up to 131 products and a softmax over 127 columns in float32.
  CHECK(scaled_diff(download_f64(dev, losses), ref.losses) < kTolerance_f32);
  CHECK(scaled_diff(download_f64(dev, d_x), ref.dx) < kTolerance_f32);
  CHECK(scaled_diff(download_f64(dev, grads), ref.grads) < 1e-4);  // sums over up to 1100 rows
  return true;
}

// A dense case at widths a GPU's fused epilogues accept (in 16, hidden/out 64: every bias and
// weight 16-byte aligned in the parameter buffer, GELU matrices with leading dimension 64), so
// the device runs its cuBLASLt bias and bias-gradient epilogues rather than their fallbacks.
Case epilogue_widths(Case c) {
  c.name += " at epilogue widths";
  c.spec.in = 16;
  c.spec.out = 64;
  c.nx = c.rows * 16;
  c.ny = c.rows * (c.layer == "linear" ? 64 : 16);
  return c;
}

std::vector<Case> device_cases() {
  std::vector<Case> base = {embedding_case(0.0), learned_case(false), learned_case(true), rope_case(false), rope_case(true),
                            norm_case("layernorm", true), norm_case("layernorm", false), norm_case("rmsnorm", false),
                            dense_case("linear", true, false, false, 0.0), dense_case("linear", false, true, false, 0.0),
                            dense_case("linear", true, true, true, 0.0), dense_case("gelu_mlp", true, true, false, 0.0),
                            dense_case("swiglu_mlp", false, true, true, 0.0),
                            // Dropout: the device must draw the CPU's mask (a pure function of key and index).
                            embedding_case(0.1), dense_case("linear", true, true, true, 0.1),
                            dense_case("gelu_mlp", true, true, false, 0.1), dense_case("swiglu_mlp", true, false, false, 0.1),
                            epilogue_widths(dense_case("linear", true, true, false, 0.0)),
                            epilogue_widths(dense_case("gelu_mlp", true, true, false, 0.0)),
                            epilogue_widths(dense_case("gelu_mlp", false, false, false, 0.1)),
                            epilogue_widths(dense_case("swiglu_mlp", true, false, false, 0.0))};
  std::mt19937_64 rng(29);
  std::vector<Case> out;
  for (const Case& c : base) {
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(257)}) out.push_back(with_rows(c, rows, rng));
  }
  return out;
}

// True on a machine with an NVIDIA GPU (the driver lists one under /proc), or where
// ABLATE_EXPECT_GPU=1 says so: there the cuda cases must run, not be skipped.
bool machine_has_gpu() {
  if (const char* e = std::getenv("ABLATE_EXPECT_GPU"); e != nullptr && *e != '\0') return std::string(e) == "1";
  std::error_code ec;
  const std::filesystem::path gpus = "/proc/driver/nvidia/gpus";
  return std::filesystem::is_directory(gpus, ec) && !std::filesystem::is_empty(gpus, ec);
}

}  // namespace

TEST_CASE("every layer on every device matches the CPU layers in float64 (rows 1, 7, 257)") {
  const std::vector<Case> cases = device_cases();
  const std::size_t total = cases.size() + 3;  // and the classifier at three row counts
  for (const char* name : kDevices) {
    DeviceUnderTest dut = open_device(name);
    // The cpu always runs every case; cuda does wherever there is a GPU (the bundle's memcheck
    // stage relies on these cases: a device or layer plugin that fails to load must not pass empty).
    const bool must_run = std::string(name) == "cpu" || machine_has_gpu();
    if (dut.device == nullptr) {
      MESSAGE("device " << std::string(name) << " not run here: " << dut.why_not);
      CHECK_MESSAGE(!must_run, "device " << std::string(name) << " does not open on a machine with a GPU: " << dut.why_not);
      continue;
    }
    int run = 0;
    for (const Case& c : cases) run += check_on_device(c, dut) ? 1 : 0;
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(1100)}) run += check_classifier_on_device(rows, dut) ? 1 : 0;
    MESSAGE("device " << std::string(name) << ": " << run << " of " << total << " layer cases run");
    std::printf("device %s: %d of %d layer cases run\n", name, run, int(total));
    if (must_run) CHECK(run == int(total));
  }
}
