// The CUDA optimizers against their CPU references, on fresh random parameters and gradients over
// a parameter table with odd slice sizes (not multiples of the block or of 4), decay on and off,
// fp32 and 8-bit slices:
//   adamw_fused (cuda) == adamw (cpu), parameters and both moments bit for bit, every step;
//   adamw8bit (cuda) == adamw8bit (cpu), parameters, codes and absmax bit for bit, every step (the
//   fraction of identical codes is printed: the kernel's arithmetic is the reference's, so 1.0);
//   non-finite gradients are skipped and counted alike; the bf16 copy a device step writes when
//   given one is the bf16 rounding of every new parameter (and untouched when not given); a state
//   saved on the device continues on the CPU as if it had never moved. Exits 77 (CTest: skipped) without a CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/registry.hpp"
#include "views.hpp"

using namespace ablate;

namespace {

ParamTable make_table() {
  ParamTable t;
  // name, shape, decay: sizes chosen to cut blocks of 256 and runs of 4 everywhere.
  t.add("wte.weight", {97, 61}, true, 0.02, 0.0);       // 5917: 8-bit (over min_8bit_size 4096)
  t.add("blocks.0.ln1.weight", {61}, false, 0.0, 1.0);  // fp32 state, no decay
  t.add("blocks.0.fc.weight", {123, 77}, true, 0.02, 0.0);
  t.add("blocks.0.fc.bias", {123}, false, 0.0, 0.0);
  t.add("blocks.0.proj.weight", {77, 123}, true, 0.02, 0.0);
  t.add("lnf.weight", {61}, false, 0.0, 1.0);
  return t;
}

struct Setup {
  Registry registry;
  Params common{"optimizer", {{"lr", 1e-3}, {"grad_clip", 0.0}}};
  RunContext run;
  cudaStream_t stream = nullptr;  // non-blocking, as the cuda device's
  Setup() {
    registry.load_directories({ABLATE_PLUGIN_DIR});
    ABLATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Setup() { cudaStreamDestroy(stream); }
  Setup(const Setup&) = delete;
  Setup& operator=(const Setup&) = delete;
  // The registration of `name` for `device`: adamw serves "cpu", adamw_fused "cuda", adamw8bit has
  // one implementation for each.
  std::unique_ptr<Optimizer> make(const std::string& name, const std::string& device) {
    // The AdamW family's keys ([optimizer.adamw]), which every member reads with its own.
    std::map<std::string, Value, std::less<>> own{{"weight_decay", 0.1}, {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}};
    if (name == "adamw8bit") {
      own.insert({{"block_size", int64_t(256)}, {"min_8bit_size", int64_t(4096)}, {"fp32_state_pattern", std::string()}});
    }
    RunContext at = run;
    at.device = device;
    return registry.create<Optimizer>(Kind::optimizer, name, {common, Params("optimizer." + name, own), at});
  }
};

TensorView host_view(std::vector<float>& v) { return test::view(v); }

TensorView device_view(cuda::DeviceBuffer<float>& b) { return flat_view(b.data(), DType::f32, int64_t(b.size()), DeviceType::cuda); }

std::vector<float> download(const cuda::DeviceBuffer<float>& b) {
  std::vector<float> h(b.size());
  b.download(h.data());
  return h;
}

bool same_bits(const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

const NamedTensor& tensor(const std::vector<NamedTensor>& s, const std::string& name) {
  for (const NamedTensor& t : s) {
    if (t.name == name) return t;
  }
  FAIL("no tensor " << name);
  return s.front();
}

// Runs `steps` steps of `name` on the CPU and on the device from the same parameters and the same
// fresh gradients, comparing after every step; returns the fraction of identical 8-bit codes
// (1 for optimizers without codes).
double compare(Setup& s, const std::string& cpu_name, const std::string& gpu_name, int steps, bool poison_gradients) {
  const ParamTable table = make_table();
  const std::size_t n = std::size_t(table.total);
  std::mt19937 rng(20261122);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), g(n);
  for (float& x : p) x = 0.02f * normal(rng);
  auto cpu = s.make(cpu_name, "cpu");
  auto gpu = s.make(gpu_name, "cuda");
  cpu->init(table, DeviceType::cpu);
  gpu->init(table, DeviceType::cuda);
  std::vector<float> p_cpu = p;
  cuda::DeviceBuffer<float> p_dev, g_dev;
  p_dev.upload(p.data(), n);
  // The bf16 copy a device optimizer writes in its pass (writes_bf16), given on odd steps only: an
  // even step must leave it as it was.
  REQUIRE(gpu->writes_bf16());
  cuda::DeviceBuffer<uint16_t> copy_dev;
  std::vector<uint16_t> copy_before(n, 0xFFFFu);  // a NaN pattern no rounding produces from these values
  copy_dev.upload(copy_before.data(), n);
  double same_codes = 0, codes = 0;
  for (int step = 1; step <= steps; ++step) {
    CAPTURE(step);
    for (float& x : g) x = 0.01f * normal(rng) * (1.0f + float(step % 3));  // fresh, of varying scale
    if (poison_gradients) {
      g[7] = std::numeric_limits<float>::quiet_NaN();
      g[300] = std::numeric_limits<float>::infinity();
      g[n - 5] = 3e30f;  // its square overflows
    }
    g_dev.upload(g.data(), n);
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy-stream upload, before the step's own stream
    // As the engine calls it: on the model's non-blocking stream, with a clipping factor every other step.
    const StepArgs args{1e-3 * (1.0 + 0.1 * step), step, step % 2 == 0 ? 0.37f : 1.0f, ablate::Stream(s.stream)};
    StepArgs device_args = args;
    if (step % 2 == 1) device_args.params_bf16 = copy_dev.data();
    cpu->step(table, host_view(p_cpu), host_view(g), args);
    gpu->step(table, device_view(p_dev), device_view(g_dev), device_args);
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    const std::vector<float> p_gpu = download(p_dev);
    REQUIRE(same_bits(p_cpu.data(), p_gpu.data(), n * sizeof(float)));
    std::vector<uint16_t> copy(n);
    copy_dev.download(copy.data());
    int64_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += copy[i] != (step % 2 == 1 ? device_math::bf16_bits(p_cpu[i]) : copy_before[i]) ? 1 : 0;
    }
    CHECK(wrong == 0);
    copy_before = copy;
    CHECK(cpu->skipped_nonfinite() == gpu->skipped_nonfinite());
    const std::vector<NamedTensor> sc = cpu->save_state(), sg = gpu->save_state();
    REQUIRE(sc.size() == sg.size());
    for (std::size_t i = 0; i < sc.size(); ++i) {
      CAPTURE(sc[i].name);
      REQUIRE(sc[i].name == sg[i].name);
      REQUIRE(sc[i].bytes.size() == sg[i].bytes.size());
      if (sc[i].name.size() > 6 && sc[i].name.compare(sc[i].name.size() - 6, 6, ".codes") == 0) {
        for (std::size_t k = 0; k < sc[i].bytes.size(); ++k) same_codes += sc[i].bytes[k] == sg[i].bytes[k] ? 1 : 0;
        codes += double(sc[i].bytes.size());
      }
      CHECK(same_bits(sc[i].bytes.data(), sg[i].bytes.data(), sc[i].bytes.size()));
    }
  }
  if (poison_gradients) CHECK(gpu->skipped_nonfinite() == 3);
  return codes > 0 ? same_codes / codes : 1.0;
}

}  // namespace

TEST_CASE("adamw_fused on the device gives the CPU adamw's parameters and moments bit for bit") {
  Setup s;
  CHECK(compare(s, "adamw", "adamw_fused", 12, false) == 1.0);
}

TEST_CASE("adamw_fused refuses the CPU and a table it was not given") {
  Setup s;
  auto opt = s.make("adamw_fused", "cuda");
  try {
    opt->init(make_table(), DeviceType::cpu);
    FAIL("expected an input error");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
  }
}

TEST_CASE("adamw8bit on the device gives the CPU's codes, absmax and parameters bit for bit") {
  Setup s;
  const double same = compare(s, "adamw8bit", "adamw8bit", 20, false);
  std::printf("adamw8bit: fraction of identical codes, device vs CPU, over 20 steps: %.6f\n", same);
  CHECK(same == 1.0);
}

TEST_CASE("adamw8bit on the device skips and counts non-finite gradients as the CPU does") {
  Setup s;
  CHECK(compare(s, "adamw8bit", "adamw8bit", 4, true) == 1.0);
}

TEST_CASE("an adamw8bit state saved on the device continues on the CPU as if it had stayed") {
  Setup s;
  const ParamTable table = make_table();
  const std::size_t n = std::size_t(table.total);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<float> p(n), g(n);
  for (float& x : p) x = normal(rng);
  auto gpu = s.make("adamw8bit", "cuda");
  gpu->init(table, DeviceType::cuda);
  cuda::DeviceBuffer<float> p_dev, g_dev;
  p_dev.upload(p.data(), n);
  for (int step = 1; step <= 3; ++step) {
    for (float& x : g) x = normal(rng);
    g_dev.upload(g.data(), n);
    gpu->step(table, device_view(p_dev), device_view(g_dev), 1e-3, step);
  }
  auto cpu = s.make("adamw8bit", "cpu");
  cpu->init(table, DeviceType::cpu);
  cpu->load_state(gpu->save_state());
  std::vector<float> p_cpu = download(p_dev);
  for (float& x : g) x = normal(rng);
  g_dev.upload(g.data(), n);
  gpu->step(table, device_view(p_dev), device_view(g_dev), 1e-3, 4);
  cpu->step(table, host_view(p_cpu), host_view(g), 1e-3, 4);
  const std::vector<float> p_gpu = download(p_dev);
  CHECK(same_bits(p_cpu.data(), p_gpu.data(), n * sizeof(float)));
  CHECK(same_bits(tensor(cpu->save_state(), "exp_avg.codes").bytes.data(), tensor(gpu->save_state(), "exp_avg.codes").bytes.data(),
                  tensor(cpu->save_state(), "exp_avg.codes").bytes.size()));
}

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
