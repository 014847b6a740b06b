// Every layer registration on every device that opens, made as a model makes it (its [model] or
// [adapter] keys from an experiment), against the layer contract (layer.hpp), so a new layer gets
// these checks by registering:
//   - its face: the role it declares, where a position layer applies, the parameters it declares
//     for its role's use (names, shapes, decay, initialisation), the values it keeps from forward
//     to backward, and its answers for [model] keys left at 0 (default_epsilon,
//     default_hidden) and for a use it cannot serve (unsupported). A name registered for several
//     devices has one face on all of them: checkpoints move between devices and the model plans
//     the same arena, whichever registration it was given (the scratch a call needs between its
//     own steps is the implementation's, as its workspace is, and may differ);
//   - a norm, linear or MLP forward call writes finite values, the same bits when called again,
//     and on every device the values of the name's cpu registration (fp32 on both: within 1e-4 of
//     the output's largest value).
// Devices: tests/support/conformance_devices.hpp (the cpu here; the emulated cuda device as
// emu/layer_conformance).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/session.hpp"
#include "attention_support.hpp"
#include "conformance_devices.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

constexpr int64_t kWidth = 40, kHeadDim = 10, kVocab = 50, kVocabPadded = 56, kOut = 24, kPositions = 32, kRows = 7;

// What a layer registration says about itself for its role's use: everything the model plans by.
struct Face {
  LayerRole role{};
  PositionSite site{};
  std::string params;  // name shape decay init per slice
  int64_t saved = 0, saved_bf16 = 0;
  double epsilon = 0;
  int64_t hidden = 0;
  std::string unsupported, unsupported_odd;
  bool operator==(const Face&) const = default;
};

std::string describe(const Face& f) {
  std::ostringstream s;
  s << "role " << to_string(f.role) << ", site " << to_string(f.site) << ", saved " << f.saved << " (bf16 " << f.saved_bf16
    << "), epsilon " << f.epsilon << ", hidden " << f.hidden << ", unsupported '" << f.unsupported << "' / '" << f.unsupported_odd
    << "', params " << f.params;
  return s.str();
}

// The use a model makes of a layer of `layer`'s role (the adapter: on a projection of kWidth -> kOut).
LayerSpec spec_for(const LayerBase& layer) {
  LayerSpec s;
  switch (layer.role()) {
    case LayerRole::embedding:
      s.in = kWidth;
      s.out = kVocabPadded;
      break;
    case LayerRole::position:
      s.in = layer.position_site() == PositionSite::qk ? kHeadDim : kWidth;
      s.max_positions = kPositions;
      break;
    case LayerRole::norm:
      s.in = kWidth;
      s.eps = layer.default_epsilon();
      break;
    case LayerRole::linear:
      s.in = kWidth;
      s.out = kOut;
      break;
    case LayerRole::mlp:
      s.in = kWidth;
      s.out = layer.default_hidden(kWidth);
      break;
    case LayerRole::classifier:
      s.in = kWidth;
      s.out = kVocabPadded;
      s.real_out = kVocab;
      break;
    case LayerRole::adapter:
      s.in = kWidth;
      s.out = kOut;
      break;
  }
  return s;
}

Face face_of(const LayerBase& layer) {
  Face f;
  f.role = layer.role();
  f.site = layer.position_site();
  const LayerSpec s = spec_for(layer);
  ParamTable t;
  layer.declare_params(s, "x", t);
  std::ostringstream p;
  for (const ParamSlice& sl : t.slices) {
    p << sl.name << "[";
    for (int64_t d : sl.shape) p << d << ",";
    p << "] decay " << sl.decay << " init " << sl.init_std << "/" << sl.init_value << "; ";
  }
  f.params = p.str();
  f.saved = layer.activation_elements(s, kRows);
  f.saved_bf16 = layer.activation_bf16_elements(s, kRows);
  f.epsilon = layer.default_epsilon();
  f.hidden = layer.default_hidden(kWidth);
  f.unsupported = layer.unsupported(s);
  LayerSpec odd = s;
  odd.in = s.in + 1;  // an odd width: rope cannot rotate it
  f.unsupported_odd = layer.unsupported(odd);
  return f;
}

// A layer of the experiment's as the model makes it, for `device`.
std::unique_ptr<LayerBase> make(const Registry& registry, const ModelOptions& o, const std::string& name, const std::string& device) {
  RunContext run;
  run.device = device;
  run.threads = 2;
  const ComponentInfo* info = registry.find(Kind::layer, name, device);
  REQUIRE(info != nullptr);
  // The adapter's keys are [adapter]'s and [adapter.<name>], every other layer's [model]'s and its own table.
  if (name == o.adapter) return registry.create<LayerBase>(Kind::layer, name, {o.adapter_common, o.adapter_own, run});
  const auto it = o.layer_own.find(name);
  const Params own = it != o.layer_own.end() ? it->second : Params{"model." + name, {}};
  return registry.create<LayerBase>(Kind::layer, name, {o.model_common, own, run});
}

std::vector<float> random_values(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// One forward call of a norm, linear or MLP on `device`; its output (empty for other roles).
std::vector<float> forward_output(Device& device, LayerBase& base) {
  auto* layer = dynamic_cast<Layer*>(&base);
  const LayerRole role = base.role();
  if (layer == nullptr || (role != LayerRole::norm && role != LayerRole::linear && role != LayerRole::mlp)) return {};
  const LayerSpec s = spec_for(base);
  ParamTable t;
  base.declare_params(s, "x", t);
  std::mt19937 rng(7);
  const std::vector<float> x = random_values(std::size_t(kRows * s.in), rng), params = random_values(std::size_t(t.total), rng);
  const int64_t y_cols = role == LayerRole::norm ? s.in : role == LayerRole::linear ? s.out : s.in;
  Buffer xb = device.alloc(DType::f32, kRows * s.in), pb = device.alloc(DType::f32, t.total),
         yb = device.alloc(DType::f32, kRows * y_cols), saved = device.alloc(DType::f32, base.activation_elements(s, kRows)),
         scratch = device.alloc(DType::f32, base.scratch_elements(s, kRows));
  device.upload(xb.view(), x.data());
  device.upload(pb.view(), params.data());
  LayerCall c;
  c.spec = &s;
  c.rows = kRows;
  c.x = xb.view();
  c.y = yb.view();
  c.params = pb.view();
  c.saved = saved.view();
  c.scratch = scratch.view();
  c.stream = device.stream();
  layer->forward(c);
  device.synchronize();
  std::vector<float> y(std::size_t(kRows * y_cols));
  device.download(y.data(), yb.view());
  return y;
}

}  // namespace

TEST_CASE("every layer registration keeps the layer contract, and a name has one face on every device") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  const Config config = Config::parse("[model]\nd_model = 40\nn_heads = 4\n[adapter]\nname = \"lora\"\n[adapter.lora]\nrank = 4\n",
                                      "layers.toml", {}, registry);
  const RunSpec spec = RunSpec::from(config);
  const ModelOptions o = Session(spec, registry, RunContext{}).model_options(kVocab);

  std::map<std::string, std::map<std::string, Face>> faces;                  // name -> device -> face
  std::map<std::string, std::map<std::string, std::vector<float>>> outputs;  // name -> device -> forward output
  test::for_each_conformance_device(registry, [&](Device& device, const std::string& device_name) {
    int layers = 0;
    for (const std::string& name : registry.names(Kind::layer)) {
      if (registry.find(Kind::layer, name, device_name) == nullptr) continue;  // registered for other devices
      INFO(name << " on " << device_name);
      std::unique_ptr<LayerBase> layer = make(registry, o, name, device_name);
      const Face f = face_of(*layer);
      CHECK(f.params.empty() == (f.role == LayerRole::position && f.site == PositionSite::qk));  // only rope declares none
      CHECK(f.epsilon > 0);
      CHECK(f.hidden > 0);
      CHECK(f.unsupported.empty());  // the model's ordinary use is served
      faces[name][device_name] = f;
      const std::vector<float> y = forward_output(device, *layer);
      if (!y.empty()) {
        CHECK(std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); }));
        CHECK(forward_output(device, *layer) == y);
        outputs[name][device_name] = y;
      }
      ++layers;
    }
    MESSAGE(layers << " layer registrations on " << device_name);
    if (device_name == "cpu" || device_name == "cuda") CHECK(layers >= 10);  // the built-in set, lora included
  });
  // rope alone turns down an odd head_dim; every layer of another role serves any width.
  for (const auto& [name, by_device] : faces) {
    for (const auto& [device_name, f] : by_device) {
      INFO(name << " on " << device_name);
      CHECK(f.unsupported_odd.empty() == !(f.role == LayerRole::position && f.site == PositionSite::qk));
    }
  }
  int shared = 0;
  for (const auto& [name, by_device] : faces) {
    const auto cpu = by_device.find("cpu");
    if (cpu == by_device.end()) continue;
    for (const auto& [device_name, f] : by_device) {
      if (device_name == "cpu") continue;
      INFO(name << ": cpu " << describe(cpu->second) << "\n" << device_name << " " << describe(f));
      CHECK(f == cpu->second);
      ++shared;
      const auto out = outputs.find(name);
      if (out != outputs.end() && out->second.count("cpu") && out->second.count(device_name)) {
        const std::vector<float>&got = out->second.at(device_name), &want = out->second.at("cpu");
        const double diff = test::scaled_diff({got.begin(), got.end()}, {want.begin(), want.end()});
        MESSAGE(name << " forward on " << device_name << ": " << diff << " of the cpu output's largest value from it");
        CHECK(diff <= 1e-4);
      }
    }
  }
  MESSAGE(shared << " layer names compared across devices");
}
