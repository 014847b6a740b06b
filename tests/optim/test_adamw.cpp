// The `adamw` plugin against hand-computed steps and against an independent float64 AdamW
// (PyTorch's definition), and its state surviving a save/load bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/registry.hpp"
#include "test_support.hpp"
#include "views.hpp"

using namespace ablate;

namespace {

struct Setup {
  Registry registry;
  Params common{"optimizer", {{"lr", 0.1}, {"grad_clip", 0.0}, {"name", std::string("adamw")}}};
  Params own{"optimizer.adamw", {{"weight_decay", 0.01}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}}};
  RunContext run;
  Setup() { registry.load_directories({test::plugin_dir()}); }
  std::unique_ptr<Optimizer> make() { return registry.create<Optimizer>(Kind::optimizer, "adamw", {common, own, run}); }
};

using ablate::test::view;

}  // namespace

TEST_CASE("adamw matches two hand-computed steps, with and without weight decay") {
  Setup s;
  auto opt = s.make();
  ParamTable table;
  table.add("w", {1}, /*decay=*/true);
  table.add("b", {1}, /*decay=*/false);
  opt->init(table, DeviceType::cpu);
  std::vector<float> p = {1.0f, 1.0f};
  std::vector<float> g = {0.5f, 0.5f};
  opt->step(table, view(p), view(g), 0.1, 1);
  // p*(1 - lr*wd) - lr/(1-b1) * m / (sqrt(v)/sqrt(1-b2) + eps), m = 0.05, v = 0.00025
  CHECK(p[0] == doctest::Approx(0.899000002).epsilon(1e-7));
  CHECK(p[1] == doctest::Approx(0.900000002).epsilon(1e-7));
  g = {-0.5f, -0.5f};
  opt->step(table, view(p), view(g), 0.1, 2);
  // m = -0.005, v = 0.00049975, bias corrections 0.19 and 0.001999: update = -0.1/0.19 * 0.01
  CHECK(p[0] == doctest::Approx(0.899000002 * 0.999 + 0.1 / 0.19 * 0.01).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(0.900000002 + 0.1 / 0.19 * 0.01).epsilon(1e-6));
  CHECK(opt->state_bytes() == 2 * 2 * 4);
}

TEST_CASE("adamw follows a float64 AdamW over many steps on odd-sized random tensors") {
  Setup s;
  auto opt = s.make();
  ParamTable table;
  table.add("emb", {37, 5}, true);
  table.add("ln.bias", {5}, false);
  table.add("w", {3, 7, 11}, true);
  opt->init(table, DeviceType::cpu);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(std::size_t(table.total)), g(p.size());
  for (float& x : p) x = normal(rng);
  std::vector<double> rp(p.begin(), p.end()), rm(p.size(), 0.0), rv(p.size(), 0.0);
  const double lr = 3e-3, wd = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (int t = 1; t <= 30; ++t) {
    for (float& x : g) x = normal(rng) * 0.1f;
    opt->step(table, view(p), view(g), lr, t);
    for (const ParamSlice& sl : table.slices) {
      for (int64_t i = sl.offset; i < sl.offset + sl.numel(); ++i) {
        if (sl.decay) rp[i] *= 1.0 - lr * wd;
        rm[i] = b1 * rm[i] + (1 - b1) * g[i];
        rv[i] = b2 * rv[i] + (1 - b2) * double(g[i]) * g[i];
        const double mhat = rm[i] / (1 - std::pow(b1, t));
        const double vhat = rv[i] / (1 - std::pow(b2, t));
        rp[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
    }
  }
  double worst = 0;
  for (std::size_t i = 0; i < p.size(); ++i) worst = std::max(worst, std::fabs(p[i] - rp[i]) / (1e-3 + std::fabs(rp[i])));
  CHECK(worst < 1e-5);
}

TEST_CASE("adamw state saved and loaded continues bit for bit") {
  Setup s;
  ParamTable table;
  table.add("w", {13, 3}, true);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::vector<float>> grads(6, std::vector<float>(39));
  for (auto& gv : grads)
    for (float& x : gv) x = u(rng);
  std::vector<float> p0(39);
  for (float& x : p0) x = u(rng);

  auto straight = s.make();
  straight->init(table, DeviceType::cpu);
  std::vector<float> a = p0;
  for (int t = 1; t <= 6; ++t) straight->step(table, view(a), view(grads[t - 1]), 1e-2, t);

  auto first = s.make();
  first->init(table, DeviceType::cpu);
  std::vector<float> b = p0;
  for (int t = 1; t <= 3; ++t) first->step(table, view(b), view(grads[t - 1]), 1e-2, t);
  auto second = s.make();
  second->init(table, DeviceType::cpu);
  second->load_state(first->save_state());
  for (int t = 4; t <= 6; ++t) second->step(table, view(b), view(grads[t - 1]), 1e-2, t);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("adamw refuses state of the wrong size") {
  Setup s;
  auto opt = s.make();
  ParamTable table;
  table.add("w", {4}, true);
  opt->init(table, DeviceType::cpu);
  NamedTensor bad{"exp_avg", DType::f32, {3}, std::vector<uint8_t>(12)};
  CHECK_THROWS_AS(opt->load_state({bad}), Error);
}

TEST_CASE("adamw refuses a state missing a moment or naming one twice, and changes nothing then") {
  Setup s;
  auto opt = s.make();
  ParamTable table;
  table.add("w", {4}, true);
  opt->init(table, DeviceType::cpu);
  std::vector<float> p = {1, 2, 3, 4}, g = {0.5f, -0.5f, 0.25f, 1};
  opt->step(table, flat_view(p.data(), DType::f32, 4), flat_view(g.data(), DType::f32, 4), 0.1, 1);
  const std::vector<NamedTensor> saved = opt->save_state();
  REQUIRE(saved.size() == 2);
  for (const NamedTensor& only : saved) {  // each moment alone: the other would resume as zeros
    INFO(only.name);
    try {
      opt->load_state({only});
      FAIL("a state with one moment was accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      CHECK(std::string(e.what()).find("is missing") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(opt->load_state({saved[0], saved[0], saved[1]}), Error);
  // Nothing changed: the state saved again is the same bytes.
  const std::vector<NamedTensor> again = opt->save_state();
  for (std::size_t i = 0; i < saved.size(); ++i) CHECK(again[i].bytes == saved[i].bytes);
}
