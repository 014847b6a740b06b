// The optimizers' CUDA step kernels, run by the kernel interpreter through their launch helpers
// under every test schedule, several steps in a row from a random state, bit for bit against the
// CPU optimizers (loaded through the registry) given the same parameters, state and gradients:
//   adamw_fused (plugins/adamw/adamw_cuda.cpp): parameters and both moments == the CPU `adamw`'s, over
//   n = 1, 7, 1100, 70001 (not multiples of a thread block's tile of 2048) cut into
//   decay and no-decay runs, with the bf16 copy on odd steps and without it on even ones;
//   adamw8bit (plugins/adamw8bit): parameters, codes, absmax and fp32 moments == the CPU
//   `adamw8bit`'s, over 8-bit and fp32 blocks (small slices and a pattern's), short last blocks,
//   the largest block the kernel serves (updated in two passes), more work blocks than the grid
//   has warps (some warps taking a second block), an all-zero block, and non-finite gradients
//   (counted in `skipped`, their values kept).
// The bf16 copy is checked against emu_support.hpp's round-to-nearest-even; elements past the
// end, and a copy not given, keep their sentinel.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/registry.hpp"
#include "adamw8bit_kernel.hpp"
#include "adamw_fused_kernel.hpp"
#include "dynamic_code.hpp"
#include "emu_support.hpp"
#include "test_support.hpp"

using namespace ablate;
namespace k8 = ablate::adamw8bit::cuda;
using ablate::adamw8bit::DynamicCode;
using ablate::emu_test::bf16_nearest;
using ablate::emu_test::to_host;

namespace {

constexpr double kWeightDecay = 0.1, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8;
constexpr std::size_t kGuard = 5;  // sentinel elements after each buffer's n
constexpr float kSentinel = 12345.0f;
constexpr uint16_t kBf16Sentinel = 0xFFFFu;  // a NaN no rounding of a finite parameter gives

struct SliceSpec {
  const char* name;
  std::vector<int64_t> shape;
  bool decay;
};

ParamTable make_table(const std::vector<SliceSpec>& specs) {
  ParamTable t;
  for (const SliceSpec& s : specs) t.add(s.name, s.shape, s.decay);
  return t;
}

// One step's arguments: the learning rate varies, clipping scales the gradient every other step.
StepArgs step_args(int64_t step) { return StepArgs{1e-3 * (1.0 + 0.1 * double(step)), step, step % 2 == 0 ? 0.37f : 1.0f, nullptr}; }

// The step's scalars as the header describes them: formed in double, rounded once to float.
template <class C>
C coefficients(const StepArgs& a) {
  const double bias1 = 1.0 - std::pow(kBeta1, double(a.step)), bias2 = 1.0 - std::pow(kBeta2, double(a.step));
  return C{float(a.lr / bias1), float(std::sqrt(bias2)),          float(kBeta1), float(kBeta2), float(kEps), float(1.0 - kBeta1),
           float(1.0 - kBeta2), float(1.0 - a.lr * kWeightDecay), a.grad_scale};
}

struct Setup {
  Registry registry;
  RunContext run;
  Params common{"optimizer", {{"lr", 1e-3}, {"grad_clip", 0.0}}};
  explicit Setup(const char* library) { REQUIRE(registry.load_file(test::plugin_dir() / library)); }
  // The AdamW family's keys (every member's own, from [optimizer.adamw]), then the optimizer's other keys.
  std::unique_ptr<Optimizer> make(const std::string& name, std::map<std::string, Value, std::less<>> own = {}) {
    own.insert({{"weight_decay", kWeightDecay}, {"beta1", kBeta1}, {"beta2", kBeta2}, {"eps", kEps}});
    return registry.create<Optimizer>(Kind::optimizer, name, {common, Params("optimizer." + name, std::move(own)), run});
  }
};

TensorView view(std::vector<float>& v) { return flat_view(v.data(), DType::f32, int64_t(v.size())); }

template <class T>
NamedTensor named(const std::string& name, DType dtype, const std::vector<T>& v) {
  NamedTensor t{name, dtype, {int64_t(v.size())}, {}};
  t.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

template <class T>
std::vector<T> values_of(const std::vector<NamedTensor>& state, const std::string& name) {
  for (const NamedTensor& t : state) {
    if (t.name == name) {
      std::vector<T> v(t.bytes.size() / sizeof(T));
      if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
      return v;
    }
  }
  FAIL("no tensor " << name);
  return {};
}

// Elements of `got` (n + kGuard) that differ in bits from `want` (n) or from the sentinel past n.
template <class T>
int64_t wrong_bits(const std::vector<T>& got, const std::vector<T>& want, T sentinel, int64_t* first = nullptr) {
  int64_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const T w = i < want.size() ? want[i] : sentinel;
    const bool ok = std::memcmp(&got[i], &w, sizeof(T)) == 0;
    if (!ok && first != nullptr && *first < 0) *first = int64_t(i);
    bad += ok ? 0 : 1;
  }
  return bad;
}

template <class T>
std::vector<T> guarded(std::vector<T> v, T sentinel) {
  v.resize(v.size() + kGuard, sentinel);
  return v;
}

struct Worst {
  double abs = 0, rel = 0;
  void add(const std::vector<float>& got, const std::vector<float>& want) {
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double d = std::fabs(double(got[i]) - double(want[i]));
      if (!(d == 0) && !(std::isnan(got[i]) && std::isnan(want[i]))) {
        abs = std::max(abs, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
        rel = std::max(rel, d / std::max(1e-30, std::fabs(double(want[i]))));
      }
    }
  }
};

std::vector<float> gradients(int64_t n, int64_t step, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000 + uint64_t(step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& x : g) x = 0.01f * normal(rng) * (1.0f + float(step % 3));  // of varying scale
  return g;
}

// --- adamw_fused ---------------------------------------------------------------------------------

struct FusedStep {
  std::vector<float> p, m, v;
};

void check_adamw_fused(const std::vector<SliceSpec>& specs, int steps, uint64_t seed, Worst& worst) {
  const ParamTable table = make_table(specs);
  const int64_t n = table.total;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(static_cast<std::size_t>(n)), m0(static_cast<std::size_t>(n)), v0(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < p0.size(); ++i) {
    p0[i] = 0.02f * normal(rng);
    m0[i] = 1e-3f * normal(rng);
    v0[i] = 1e-6f * normal(rng) * normal(rng);
    v0[i] = v0[i] < 0 ? -v0[i] : v0[i];
  }
  // The CPU adamw from that state, step by step.
  Setup s("libablate_adamw.so");
  auto cpu = s.make("adamw");
  cpu->init(table, DeviceType::cpu);
  cpu->load_state({named("exp_avg", DType::f32, m0), named("exp_avg_sq", DType::f32, v0)});
  std::vector<FusedStep> want;
  std::vector<std::vector<float>> grads;
  std::vector<float> p = p0;
  for (int step = 1; step <= steps; ++step) {
    grads.push_back(gradients(n, step, seed));
    cpu->step(table, view(p), view(grads.back()), step_args(step));
    const std::vector<NamedTensor> st = cpu->save_state();
    want.push_back({p, values_of<float>(st, "exp_avg"), values_of<float>(st, "exp_avg_sq")});
  }
  // One run per slice, in table order.
  std::vector<adamw_fused::DecayRun> runs;
  for (const ParamSlice& sl : table.slices) runs.push_back({sl.offset + sl.numel(), sl.decay ? 1 : 0, 0});
  cuda::DeviceBuffer<adamw_fused::DecayRun> d_runs;
  d_runs.upload(runs.data(), runs.size());

  emu_test::for_each_schedule([&] {
    cuda::DeviceBuffer<float> d_p, d_g, d_m, d_v;
    cuda::DeviceBuffer<uint16_t> d_copy;
    d_p.upload(guarded(p0, kSentinel).data(), std::size_t(n) + kGuard);
    d_m.upload(guarded(m0, kSentinel).data(), std::size_t(n) + kGuard);
    d_v.upload(guarded(v0, kSentinel).data(), std::size_t(n) + kGuard);
    std::vector<uint16_t> copy_before(std::size_t(n) + kGuard, kBf16Sentinel);
    d_copy.upload(copy_before.data(), copy_before.size());
    for (int step = 1; step <= steps; ++step) {
      CAPTURE(step);
      const std::vector<float>& g = grads[std::size_t(step - 1)];
      d_g.upload(g.data(), g.size());
      const bool with_copy = step % 2 == 1;
      const StepArgs a = step_args(step);
      // Every other clipped step reads its factor (0.37) from device memory, as the engine gives it
      // when the device formed it; the coefficient's own is then wrong on purpose, and unused.
      adamw_fused::Coefficients coef = coefficients<adamw_fused::Coefficients>(a);
      cuda::DeviceBuffer<float> d_scale;
      const bool scale_on_device = step % 4 == 2;
      if (scale_on_device) {
        d_scale.upload(&coef.grad_scale, 1);
        coef.grad_scale = 1.0f;
      }
      // Every third step reads its coefficients from device memory, as a captured step does; the
      // ones passed by value are then wrong on purpose, and unused.
      cuda::DeviceBuffer<adamw_fused::Coefficients> d_coef;
      const bool coef_on_device = step % 3 == 0;
      adamw_fused::Coefficients by_value = coef;
      if (coef_on_device) {
        d_coef.upload(&coef, 1);
        by_value.step_size = std::numeric_limits<float>::quiet_NaN();
        by_value.b1 = by_value.b2 = 0.5f;
      }
      const cudaError_t rc =
          adamw_fused::launch_step(d_p.data(), d_g.data(), d_m.data(), d_v.data(), with_copy ? d_copy.data() : nullptr, n,
                                   d_runs.data(), int32_t(runs.size()), by_value, coef_on_device ? d_coef.data() : nullptr,
                                   scale_on_device ? d_scale.data() : nullptr, nullptr);
      REQUIRE(rc == cudaSuccess);
      const FusedStep& w = want[std::size_t(step - 1)];
      const std::vector<float> got_p = to_host(d_p), got_m = to_host(d_m), got_v = to_host(d_v);
      int64_t first_p = -1, first_m = -1, first_v = -1;
      const int64_t wrong_p = wrong_bits(got_p, w.p, kSentinel, &first_p);
      const int64_t wrong_m = wrong_bits(got_m, w.m, kSentinel, &first_m);
      const int64_t wrong_v = wrong_bits(got_v, w.v, kSentinel, &first_v);
      INFO("first wrong element of p, m, v: ", first_p, ", ", first_m, ", ", first_v);
      CHECK(wrong_p == 0);
      CHECK(wrong_m == 0);
      CHECK(wrong_v == 0);
      worst.add(got_p, w.p);
      worst.add(got_m, w.m);
      worst.add(got_v, w.v);
      // The copy: every new parameter rounded when given, untouched when not.
      std::vector<uint16_t> want_copy(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < want_copy.size(); ++i) want_copy[i] = with_copy ? bf16_nearest(w.p[i]) : copy_before[i];
      const std::vector<uint16_t> got_copy = to_host(d_copy);
      CHECK(wrong_bits(got_copy, want_copy, kBf16Sentinel) == 0);
      copy_before = got_copy;
    }
  });
}

// --- adamw8bit -----------------------------------------------------------------------------------

struct Options8 {
  int64_t block_size;
  int64_t min_8bit_size;
  std::string pattern;
};

// The kernel's work blocks (block_size pieces of each slice, in table order) and where each slice
// keeps its moments: 8-bit codes, absmax blocks and fp32 values each laid out in table order.
struct Layout {
  std::vector<k8::BlockInfo> blocks;
  std::vector<uint8_t> quantized;     // per slice
  std::vector<int64_t> state_offset;  // per slice
  int64_t codes = 0, absmax = 0, fp32 = 0;
};

Layout layout_of(const ParamTable& table, int64_t block_size, const std::vector<uint8_t>& quantized) {
  Layout l;
  l.quantized = quantized;
  for (std::size_t si = 0; si < table.slices.size(); ++si) {
    const ParamSlice& s = table.slices[si];
    const int64_t n = s.numel();
    const bool q = quantized[si] != 0;
    l.state_offset.push_back(q ? l.codes : l.fp32);
    for (int64_t j0 = 0, b = 0; j0 < n; j0 += block_size, ++b) {
      k8::BlockInfo info;
      info.param_offset = s.offset + j0;
      info.state_offset = (q ? l.codes : l.fp32) + j0;
      info.absmax_index = int32_t(q ? l.absmax + b : 0);
      info.n = int32_t(std::min(block_size, n - j0));
      info.quantized = q ? 1 : 0;
      info.decay = s.decay ? 1 : 0;
      l.blocks.push_back(info);
    }
    if (q) {
      l.codes += n;
      l.absmax += (n + block_size - 1) / block_size;
    } else {
      l.fp32 += n;
    }
  }
  return l;
}

struct State8 {
  std::vector<uint8_t> mc, vc;
  std::vector<float> ma, va, mf, vf;
};

State8 state_of(const std::vector<NamedTensor>& st) {
  return {values_of<uint8_t>(st, "exp_avg.codes"), values_of<uint8_t>(st, "exp_avg_sq.codes"),
          values_of<float>(st, "exp_avg.absmax"),  values_of<float>(st, "exp_avg_sq.absmax"),
          values_of<float>(st, "exp_avg.fp32"),    values_of<float>(st, "exp_avg_sq.fp32")};
}

// A gradient the update must skip: element `index` holds `value` from step `from` on.
struct Poison {
  int64_t index;
  float value;
  int from;
};

struct Case8 {
  std::vector<SliceSpec> slices;
  Options8 options;
  std::vector<uint8_t> quantized;  // per slice: 8-bit moments (min_8bit_size and the pattern decide)
  int steps;
  std::vector<Poison> poison;
  int64_t zero_block = -1;  // an 8-bit block whose absmax starts at 0 and whose step-1 gradients are 0
  int64_t expect_grid = 0;  // thread blocks the launch must have
};

struct Step8 {
  std::vector<float> p;
  State8 s;
  int64_t skipped;
};

void check_adamw8bit(const Case8& c, uint64_t seed, Worst& worst) {
  const ParamTable table = make_table(c.slices);
  const int64_t n = table.total;
  Setup setup("libablate_adamw8bit.so");
  auto cpu = setup.make("adamw8bit", {{"block_size", c.options.block_size},
                                      {"min_8bit_size", c.options.min_8bit_size},
                                      {"fp32_state_pattern", c.options.pattern}});
  cpu->init(table, DeviceType::cpu);
  REQUIRE(values_of<uint8_t>(cpu->save_state(), "quantized_slices") == c.quantized);
  const Layout l = layout_of(table, c.options.block_size, c.quantized);
  const DynamicCode signed_map = DynamicCode::make(true), unsigned_map = DynamicCode::make(false);

  // A random state: any codes, absmax of the moments' scale (one block at 0), fp32 moments.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  State8 s0{std::vector<uint8_t>(std::size_t(l.codes)), std::vector<uint8_t>(std::size_t(l.codes)),
            std::vector<float>(std::size_t(l.absmax)),  std::vector<float>(std::size_t(l.absmax)),
            std::vector<float>(std::size_t(l.fp32)),    std::vector<float>(std::size_t(l.fp32))};
  for (std::size_t i = 0; i < s0.mc.size(); ++i) s0.mc[i] = uint8_t(byte(rng)), s0.vc[i] = uint8_t(byte(rng));
  for (std::size_t i = 0; i < s0.ma.size(); ++i) s0.ma[i] = 1e-3f * std::fabs(normal(rng)), s0.va[i] = 1e-6f * std::fabs(normal(rng));
  for (std::size_t i = 0; i < s0.mf.size(); ++i) s0.mf[i] = 1e-3f * normal(rng), s0.vf[i] = 1e-6f * std::fabs(normal(rng));
  std::vector<float> p0(static_cast<std::size_t>(n));
  for (float& x : p0) x = 0.02f * normal(rng);
  std::vector<std::vector<float>> grads;
  for (int step = 1; step <= c.steps; ++step) {
    grads.push_back(gradients(n, step, seed));
    for (const Poison& q : c.poison) {
      if (step >= q.from) grads.back()[std::size_t(q.index)] = q.value;
    }
  }
  if (c.zero_block >= 0) {
    const k8::BlockInfo& b = l.blocks[std::size_t(c.zero_block)];
    REQUIRE(b.quantized == 1);
    s0.ma[std::size_t(b.absmax_index)] = 0.0f;
    s0.va[std::size_t(b.absmax_index)] = 0.0f;
    std::fill(grads[0].begin() + b.param_offset, grads[0].begin() + b.param_offset + b.n, 0.0f);
  }

  // The CPU adamw8bit from that state, step by step.
  cpu->load_state({named("exp_avg.codes", DType::u8, s0.mc), named("exp_avg.absmax", DType::f32, s0.ma),
                   named("exp_avg.fp32", DType::f32, s0.mf),
                   named("exp_avg.map", DType::f32, std::vector<float>(signed_map.values().begin(), signed_map.values().end())),
                   named("exp_avg_sq.codes", DType::u8, s0.vc), named("exp_avg_sq.absmax", DType::f32, s0.va),
                   named("exp_avg_sq.fp32", DType::f32, s0.vf),
                   named("exp_avg_sq.map", DType::f32, std::vector<float>(unsigned_map.values().begin(), unsigned_map.values().end())),
                   named("block_size", DType::i32, std::vector<int32_t>{int32_t(c.options.block_size)}),
                   named("quantized_slices", DType::u8, l.quantized)});
  std::vector<Step8> want;
  std::vector<float> p = p0;
  for (int step = 1; step <= c.steps; ++step) {
    cpu->step(table, view(p), view(grads[std::size_t(step - 1)]), step_args(step));
    want.push_back({p, state_of(cpu->save_state()), cpu->skipped_nonfinite()});
  }

  // The kernel's constant inputs: the work blocks and the code maps (dynamic_code.hpp's tables).
  cuda::DeviceBuffer<k8::BlockInfo> d_blocks;
  d_blocks.upload(l.blocks.data(), l.blocks.size());
  cuda::DeviceBuffer<float> d_m_values, d_v_values, d_m_thr, d_v_thr;
  d_m_values.upload(signed_map.values().data(), signed_map.values().size());
  d_v_values.upload(unsigned_map.values().data(), unsigned_map.values().size());
  d_m_thr.upload(signed_map.thresholds().data(), signed_map.thresholds().size());
  d_v_thr.upload(unsigned_map.thresholds().data(), unsigned_map.thresholds().size());
  cuda::DeviceBuffer<uint8_t> d_m_buckets, d_v_buckets;
  d_m_buckets.upload(signed_map.bucket_first().data(), signed_map.bucket_first().size());
  d_v_buckets.upload(unsigned_map.bucket_first().data(), unsigned_map.bucket_first().size());

  emu_test::for_each_schedule([&] {
    cuda::DeviceBuffer<float> d_p, d_g, d_ma, d_va, d_mf, d_vf;
    cuda::DeviceBuffer<uint8_t> d_mc, d_vc;
    cuda::DeviceBuffer<uint16_t> d_copy;
    cuda::DeviceBuffer<unsigned long long> d_skipped(1);
    d_p.upload(guarded(p0, kSentinel).data(), std::size_t(n) + kGuard);
    d_mc.upload(guarded(s0.mc, uint8_t(0xA5)).data(), s0.mc.size() + kGuard);
    d_vc.upload(guarded(s0.vc, uint8_t(0xA5)).data(), s0.vc.size() + kGuard);
    d_ma.upload(guarded(s0.ma, kSentinel).data(), s0.ma.size() + kGuard);
    d_va.upload(guarded(s0.va, kSentinel).data(), s0.va.size() + kGuard);
    d_mf.upload(guarded(s0.mf, kSentinel).data(), s0.mf.size() + kGuard);
    d_vf.upload(guarded(s0.vf, kSentinel).data(), s0.vf.size() + kGuard);
    std::vector<uint16_t> copy_before(std::size_t(n) + kGuard, kBf16Sentinel);
    d_copy.upload(copy_before.data(), copy_before.size());
    std::vector<float> p_before = p0, mf_before = s0.mf, vf_before = s0.vf;
    for (int step = 1; step <= c.steps; ++step) {
      CAPTURE(step);
      const std::vector<float>& g = grads[std::size_t(step - 1)];
      d_g.upload(g.data(), g.size());
      d_skipped.fill_zero();
      const bool with_copy = step % 2 == 1;
      k8::StepArgs a;
      a.params = d_p.data();
      a.grads = d_g.data();
      a.params_bf16 = with_copy ? d_copy.data() : nullptr;
      a.blocks = d_blocks.data();
      a.num_blocks = int64_t(l.blocks.size());
      a.m_codes = d_mc.data();
      a.v_codes = d_vc.data();
      a.m_absmax = d_ma.data();
      a.v_absmax = d_va.data();
      a.m_fp32 = d_mf.data();
      a.v_fp32 = d_vf.data();
      a.m_map = {d_m_values.data(), d_m_thr.data(), d_m_buckets.data(), signed_map.zero_code()};
      a.v_map = {d_v_values.data(), d_v_thr.data(), d_v_buckets.data(), unsigned_map.zero_code()};
      a.c = coefficients<k8::Coefficients>(step_args(step));
      cuda::DeviceBuffer<float> d_scale;  // every other clipped step: the factor from device memory
      if (step % 4 == 2) {
        d_scale.upload(&a.c.grad_scale, 1);
        a.c.grad_scale = 1.0f;
        a.grad_scale = d_scale.data();
      }
      a.skipped = d_skipped.data();
      const uint64_t blocks_before = emu::stats().blocks;
      REQUIRE(k8::launch_step(a, nullptr) == cudaSuccess);
      if (c.expect_grid > 0) CHECK(emu::stats().blocks - blocks_before == uint64_t(c.expect_grid));

      const Step8& w = want[std::size_t(step - 1)];
      const std::vector<float> got_p = to_host(d_p), got_mf = to_host(d_mf), got_vf = to_host(d_vf);
      const std::vector<float> got_ma = to_host(d_ma), got_va = to_host(d_va);
      int64_t first[7] = {-1, -1, -1, -1, -1, -1, -1};
      const int64_t wrong[7] = {wrong_bits(got_p, w.p, kSentinel, &first[0]),
                                wrong_bits(to_host(d_mc), w.s.mc, uint8_t(0xA5), &first[1]),
                                wrong_bits(to_host(d_vc), w.s.vc, uint8_t(0xA5), &first[2]),
                                wrong_bits(got_ma, w.s.ma, kSentinel, &first[3]),
                                wrong_bits(got_va, w.s.va, kSentinel, &first[4]),
                                wrong_bits(got_mf, w.s.mf, kSentinel, &first[5]),
                                wrong_bits(got_vf, w.s.vf, kSentinel, &first[6])};
      const char* const what[7] = {"parameters", "m codes", "v codes", "m absmax", "v absmax", "m fp32", "v fp32"};
      for (int i = 0; i < 7; ++i) {
        INFO(std::string(what[i]), ": ", wrong[i], " wrong, the first at ", first[i]);
        CHECK(wrong[i] == 0);
      }
      worst.add(got_p, w.p);
      worst.add(got_mf, w.s.mf);
      worst.add(got_vf, w.s.vf);
      worst.add(got_ma, w.s.ma);
      worst.add(got_va, w.s.va);
      if (c.zero_block >= 0 && step == 1) {  // nothing to scale: every code is the code of 0
        const k8::BlockInfo& b = l.blocks[std::size_t(c.zero_block)];
        CHECK(got_ma[std::size_t(b.absmax_index)] == 0.0f);
        const std::vector<uint8_t> mc = to_host(d_mc), vc = to_host(d_vc);
        for (int32_t j = 0; j < b.n; ++j) {
          CHECK(mc[std::size_t(b.state_offset + j)] == signed_map.zero_code());
          CHECK(vc[std::size_t(b.state_offset + j)] == unsigned_map.zero_code());
        }
      }

      // Non-finite gradients: counted, their parameters (and fp32 moments) kept.
      unsigned long long skipped = 0;
      d_skipped.download(&skipped);
      int64_t poisoned = 0;
      for (const Poison& q : c.poison) {
        if (step < q.from) continue;
        ++poisoned;
        CAPTURE(q.index);
        CHECK(std::bit_cast<uint32_t>(got_p[std::size_t(q.index)]) == std::bit_cast<uint32_t>(p_before[std::size_t(q.index)]));
        for (std::size_t si = 0; si < table.slices.size(); ++si) {
          const ParamSlice& sl = table.slices[si];
          if (l.quantized[si] || q.index < sl.offset || q.index >= sl.offset + sl.numel()) continue;
          const std::size_t at = std::size_t(l.state_offset[si] + q.index - sl.offset);
          CHECK(std::bit_cast<uint32_t>(got_mf[at]) == std::bit_cast<uint32_t>(mf_before[at]));
          CHECK(std::bit_cast<uint32_t>(got_vf[at]) == std::bit_cast<uint32_t>(vf_before[at]));
        }
      }
      CHECK(int64_t(skipped) == poisoned);
      CHECK(int64_t(skipped) == w.skipped);

      std::vector<uint16_t> want_copy(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < want_copy.size(); ++i) want_copy[i] = with_copy ? bf16_nearest(w.p[i]) : copy_before[i];
      const std::vector<uint16_t> got_copy = to_host(d_copy);
      CHECK(wrong_bits(got_copy, want_copy, kBf16Sentinel) == 0);
      copy_before = got_copy;
      p_before = got_p;
      mf_before = got_mf;
      vf_before = got_vf;
    }
  });
}

}  // namespace

TEST_CASE("adamw_fused's step is the CPU adamw's, bit for bit, at n = 1, 7, 1100 and 70001") {
  Worst worst;
  check_adamw_fused({{"w", {1}, true}}, 3, 1, worst);
  check_adamw_fused({{"w", {3}, true}, {"b", {4}, false}}, 4, 2, worst);
  check_adamw_fused({{"w", {13, 29}, true}, {"b", {29}, false}, {"ln", {1}, false}, {"v", {7, 99}, true}}, 4, 3, worst);
  check_adamw_fused({{"emb", {97, 61}, true}, {"ln", {61}, false}, {"fc", {123, 517}, true}, {"bias", {432}, false}}, 3, 4, worst);
  emu_test::report_worst("adamw_fused step_kernel", worst.abs, worst.rel);
}

TEST_CASE("adamw8bit's step is the CPU adamw8bit's, bit for bit: 8-bit and fp32 blocks, short blocks, skipped gradients") {
  Worst worst;
  // Blocks of 256: wte and fc 8-bit with short last blocks, ln and fc.bias fp32 (small), wpe fp32
  // (the pattern). Non-finite gradients in 8-bit blocks (NaN, a square that overflows), in a small
  // fp32 slice (inf) and in the pattern's (-inf).
  const Case8 blocks256{{{"wte.weight", {97, 61}, true},
                         {"ln.weight", {61}, false},
                         {"fc.weight", {41, 123}, true},
                         {"fc.bias", {123}, false},
                         {"wpe.weight", {64, 80}, true}},
                        {256, 4096, "^wpe\\."},
                        {1, 0, 1, 0, 0},
                        4,
                        {{7, std::numeric_limits<float>::quiet_NaN(), 2},
                         {5917 + 30, std::numeric_limits<float>::infinity(), 2},
                         {5917 + 61 + 5043 - 3, 3e30f, 3},
                         {5917 + 61 + 5043 + 123 + 4000, -std::numeric_limits<float>::infinity(), 2}},
                        26,
                        9};  // 66 work blocks, a warp each: 9 thread blocks of 8 warps
  check_adamw8bit(blocks256, 5, worst);
  // The kernel's largest block (4096: 16 chunks of 256, updated twice: once for the absmax, once to
  // store) and a short one after it (1000: 4 chunks, the last short); an fp32 slice of 3000
  // elements, one block walked 256 at a time.
  const Case8 largest{{{"w", {5096}, true}, {"ln", {3000}, false}},
                      {k8::kMaxBlockSize, 4096, ""},
                      {1, 0},
                      3,
                      {{4096 + 999, std::numeric_limits<float>::quiet_NaN(), 1}},
                      -1,
                      1};
  check_adamw8bit(largest, 6, worst);
  emu_test::report_worst("adamw8bit step_kernel", worst.abs, worst.rel);
}

TEST_CASE("adamw8bit's warps each take several work blocks when there are more than the grid's warps") {
  Worst worst;
  // Blocks of 16: w (10 8-bit blocks), emb (4200 fp32 blocks: the pattern's), v (60 8-bit blocks,
  // the last of 9) and b (3 fp32 blocks, small): 4273 work blocks, a warp each, over the
  // interpreter's 132 SMs x 4 = 528 thread blocks of 8 warps (4224), so warps 0-48 take a second
  // one: v's blocks 14-59 and b's. In the second round: a NaN gradient (v's block 20), and v's last
  // block all zero.
  const Case8 many{{{"w", {9, 17}, true}, {"emb.weight", {4200, 16}, true}, {"v", {953}, true}, {"b", {37}, false}},
                   {16, 64, "^emb\\."},
                   {1, 0, 1, 0},
                   2,
                   {{153 + 67200 + 20 * 16 + 3, std::numeric_limits<float>::quiet_NaN(), 1}},
                   4269,
                   528};
  const Layout l = layout_of(make_table(many.slices), 16, many.quantized);
  REQUIRE(l.blocks.size() == 4273);
  REQUIRE((l.blocks[4230].quantized == 1 && l.blocks[4230].param_offset == 153 + 67200 + 20 * 16));
  REQUIRE((l.blocks[4269].quantized == 1 && l.blocks[4269].n == 9));
  check_adamw8bit(many, 7, worst);
  emu_test::report_worst("adamw8bit step_kernel (several work blocks a warp)", worst.abs, worst.rel);
}
