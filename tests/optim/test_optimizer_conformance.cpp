// Every optimizer on every device it registers for keeps the optimizer contract (optimizer.hpp),
// whatever its algorithm: a new optimizer gets these checks by registering. Each is made as a run
// makes it (Session::optimizer from an experiment naming it, its own keys' defaults filled in) over
// a parameter table of odd sizes (a matrix with decay, a vector without, and a table large enough
// for an 8-bit state), and steps on the quadratic loss 1/2 |p - target|^2 (gradient p - target):
//   - it descends: 30 steps at lr 1e-2 lower the loss below 0.8 of its start;
//   - a step at lr 0 changes no parameter;
//   - the same steps from the same start give the same bits;
//   - a state saved after 3 steps and loaded into a fresh optimizer continues, 3 steps later, to
//     the bits of the uninterrupted run, state included (what resume relies on);
//   - StepArgs::grad_scale is the gradient multiplied by it in fp32: the same bits as the scaled
//     gradient given directly;
//   - an optimizer that writes_bf16() writes the bf16 rounding of every new parameter.
// Devices: the cpu, and cuda where it opens (a GPU, or the emulated device under
// ABLATE_EMULATE_CUDA=1, which CTest runs as emu/optimizer_conformance; ABLATE_EXPECT_GPU=1 makes a
// cuda device that does not open a failure).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/session.hpp"
#include "conformance_devices.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

ParamTable make_table() {
  ParamTable t;
  t.add("blocks.0.fc.weight", {37, 29}, true);  // a matrix, decayed
  t.add("blocks.0.ln.bias", {29}, false);       // a vector, not decayed
  t.add("wte.weight", {97, 61}, true);          // 5917 values: an 8-bit state where one applies
  return t;
}

// One optimizer on one device, its parameters and gradients in the device's buffers.
struct Run {
  Device& device;
  const ParamTable& table;
  std::unique_ptr<Optimizer> opt;
  Buffer params, grads, bf16;
  std::vector<float> target;

  Run(Device& dev, const ParamTable& t, std::unique_ptr<Optimizer> o, const std::vector<float>& start, std::vector<float> goal)
      : device(dev), table(t), opt(std::move(o)), target(std::move(goal)) {
    params = device.alloc(DType::f32, table.total);
    grads = device.alloc(DType::f32, table.total);
    bf16 = device.alloc(DType::bf16, table.total);
    device.upload(params.view(), start.data());
    opt->init(table, device.type());
  }
  std::vector<float> values() {
    device.synchronize();
    std::vector<float> v(std::size_t(table.total));
    device.download(v.data(), params.view());
    return v;
  }
  double loss() {
    double s = 0;
    const std::vector<float> p = values();
    for (std::size_t i = 0; i < p.size(); ++i) s += 0.5 * (double(p[i]) - target[i]) * (double(p[i]) - target[i]);
    return s;
  }
  // One step on the quadratic's gradient, multiplied on the host by `host_scale` (fp32) and in the
  // step by `grad_scale`.
  void step(double lr, int64_t n, float host_scale = 1.0f, float grad_scale = 1.0f) {
    const std::vector<float> p = values();
    std::vector<float> g(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) g[i] = (p[i] - target[i]) * host_scale;
    device.upload(grads.view(), g.data());
    StepArgs args{lr, n, grad_scale, device.stream()};
    if (opt->writes_bf16()) args.params_bf16 = bf16.view().data;
    opt->step(table, params.view(), grads.view(), args);
    device.synchronize();
  }
  std::vector<uint16_t> bf16_copy() {
    std::vector<uint16_t> v(std::size_t(table.total));
    device.download(v.data(), bf16.view());
    return v;
  }
};

std::vector<float> normal_values(std::size_t n, double sd, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = float(normal(rng));
  return v;
}

// The state as bytes, tensor by tensor, to compare two optimizers' states exactly.
std::vector<std::vector<uint8_t>> state_bytes_of(const Optimizer& opt) {
  std::vector<std::vector<uint8_t>> out;
  for (const NamedTensor& t : opt.save_state()) out.push_back(t.bytes);
  return out;
}

void check_optimizer(Registry& registry, Device& device, const std::string& device_name, const std::string& name) {
  const Config config = Config::parse("[optimizer]\nname = \"" + name + "\"\nweight_decay = 0.1\n", "conformance.toml", {}, registry);
  const RunSpec spec = RunSpec::from(config);
  RunContext run;
  run.device = device_name;
  run.threads = 2;
  const Session session(spec, registry, run);
  const ParamTable table = make_table();
  std::mt19937 rng(41);
  const std::vector<float> start = normal_values(std::size_t(table.total), 0.5, rng);
  const std::vector<float> target = normal_values(std::size_t(table.total), 0.5, rng);
  const auto fresh = [&] { return Run(device, table, session.optimizer(), start, target); };

  {  // it descends on a quadratic
    Run r = fresh();
    const double before = r.loss();
    for (int64_t n = 1; n <= 30; ++n) r.step(1e-2, n);
    const double after = r.loss();
    MESSAGE(name << " on " << device_name << ": loss " << before << " -> " << after << " in 30 steps");
    CHECK(after < 0.8 * before);
  }
  {  // a step at lr 0 changes no parameter
    Run r = fresh();
    r.step(0.0, 1);
    CHECK(r.values() == start);
  }
  {  // the same steps give the same bits, and a saved state continues them bit for bit
    Run whole = fresh(), again = fresh(), first = fresh();
    for (int64_t n = 1; n <= 6; ++n) {
      whole.step(1e-2, n);
      again.step(1e-2, n);
    }
    CHECK(again.values() == whole.values());
    for (int64_t n = 1; n <= 3; ++n) first.step(1e-2, n);
    Run second(device, table, session.optimizer(), first.values(), target);
    second.opt->load_state(first.opt->save_state());
    for (int64_t n = 4; n <= 6; ++n) second.step(1e-2, n);
    CHECK(second.values() == whole.values());
    CHECK(state_bytes_of(*second.opt) == state_bytes_of(*whole.opt));
  }
  {  // grad_scale multiplies the gradient in fp32
    Run scaled_in_step = fresh(), scaled_before = fresh();
    for (int64_t n = 1; n <= 3; ++n) {
      scaled_in_step.step(1e-2, n, 1.0f, 0.375f);
      scaled_before.step(1e-2, n, 0.375f, 1.0f);
    }
    CHECK(scaled_in_step.values() == scaled_before.values());
  }
  {  // a bf16 copy, when the optimizer writes one, is the rounding of every new parameter
    Run r = fresh();
    r.step(1e-2, 1);
    const std::vector<float> p = r.values();
    const std::vector<uint16_t> copy = r.bf16_copy();
    int64_t wrong = 0;
    for (std::size_t i = 0; i < p.size(); ++i) wrong += copy[i] != device_math::bf16_bits(p[i]) ? 1 : 0;
    if (r.opt->writes_bf16()) CHECK(wrong == 0);
  }
}

}  // namespace

TEST_CASE("every optimizer on every device it registers for keeps the optimizer contract") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  test::for_each_conformance_device(registry, [&](Device& device, const std::string& device_name) {
    int optimizers = 0;
    for (const std::string& name : registry.names(Kind::optimizer)) {
      if (registry.find(Kind::optimizer, name, device_name) == nullptr) continue;  // registered for other devices
      INFO(name << " on " << device_name);
      check_optimizer(registry, device, device_name, name);
      ++optimizers;
    }
    MESSAGE(optimizers << " optimizer registrations on " << device_name);
    // adamw and adamw8bit on both built-in devices (adamw_fused too on cuda)
    if (device_name == "cpu" || device_name == "cuda") CHECK(optimizers >= 2);
  });
}
