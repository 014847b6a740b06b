// Every attention backend on every device it registers for, against the float64 reference
// (tests/support/attention_reference.hpp): a new backend gets these checks by registering. The
// contract each must keep (attention.hpp):
//   - out, d_q, d_k and d_v agree with the reference within bf16's rounding (every backend here
//     computes at least in bf16: 2^-7 of each tensor's largest value; the backends' own tests hold
//     the exact ones tighter);
//   - padding positions get zeros in out and in every gradient, whatever the outputs held before
//     (they are poisoned with NaN first);
//   - a second call gives the same bits;
//   - a q of the wrong shape is refused with an Error, not computed.
// Problems: padded rows (a full one and a shorter one), packed rows (random segments, length 1
// included), GQA 1 and 3, head_dim 64, T = 77 (no multiple of 64). Devices: the cpu, and cuda
// where it opens (a GPU, or the emulated device under ABLATE_EMULATE_CUDA=1, which CTest runs as
// emu/attention_conformance; ABLATE_EXPECT_GPU=1 makes a cuda device that does not open a failure).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "attention_device_run.hpp"
#include "attention_reference.hpp"
#include "attention_support.hpp"
#include "conformance_devices.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

struct Problem {
  std::string label;
  AttentionProblem p;
  Batch batch;
};

std::vector<Problem> problems(std::mt19937& rng) {
  std::vector<Problem> out;
  const int32_t T = 77, D = 64;
  for (int32_t ratio : {1, 3}) {
    for (bool packed : {false, true}) {
      Problem pr;
      pr.batch = packed ? test::make_batch(T, {test::random_packed_row(T, rng), {{0, 1}, {1, T - 1}}})
                        : test::make_batch(T, {{{0, T}}, {{0, T / 2 + 1}}});
      pr.p = AttentionProblem{.batch = pr.batch.rows,
                              .seq_len = T,
                              .heads = 2 * ratio,
                              .kv_heads = 2,
                              .head_dim = D,
                              .dtype = DType::f32,
                              .device = DeviceType::cpu,
                              .packed = packed};
      pr.label = std::string(packed ? "packed" : "padded") + " rows, heads/kv " + std::to_string(ratio);
      out.push_back(std::move(pr));
    }
  }
  return out;
}

// Values a bf16 backend reads exactly: N(0, 1) rounded to bf16.
std::vector<double> bf16_values(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = device_math::bf16_value(device_math::bf16_bits(float(normal(rng))));
  return v;
}

// The worst |got - want| over the reference's largest value (test::scaled_diff; infinite where got is not finite).
double scaled_error(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  return test::scaled_diff(std::vector<double>(got.begin(), got.end()), want);
}

using test::zero_at_padding;

std::vector<float> narrow(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// A forward call whose q has the kv heads' count instead of the query heads' (its buffer that
// size): the backend must refuse it before reading anything.
void forward_with_narrow_q(Device& dev, Attention& attention, const AttentionProblem& p, const Batch& batch) {
  const int64_t nk = int64_t(p.batch) * p.seq_len * p.kv_heads * p.head_dim, nq = nk / p.kv_heads * p.heads;
  DeviceBatch db;
  dev.upload_batch(batch, db);
  Buffer q = dev.alloc(DType::f32, nk), k = dev.alloc(DType::f32, nk), v = dev.alloc(DType::f32, nk), out = dev.alloc(DType::f32, nq),
         saved = dev.alloc(DType::f32, attention.saved_elements(p));
  for (Buffer* b : {&q, &k, &v, &out}) dev.fill(b->view(), 0.0f);
  const auto kv = [&](Buffer& b) { return test::shaped(b.view(), p.batch, p.seq_len, p.kv_heads, p.head_dim); };
  test::attention_forward(attention, p, db.views, kv(q), kv(k), kv(v),
                          test::shaped(out.view(), p.batch, p.seq_len, p.heads, p.head_dim), saved.view(), dev.stream());
  dev.synchronize();
}

// One backend on one device over every problem; returns how many it served.
int check_backend(Registry& registry, Device& device, const std::string& device_name, const std::string& name) {
  const Params common{"attention", {}}, own{"attention." + name, {}};
  RunContext run;
  run.device = device_name;
  run.threads = 2;
  std::unique_ptr<Attention> attention = registry.create<Attention>(Kind::attention, name, {common, own, run});
  std::mt19937 rng(97);
  int served = 0;
  for (Problem& pr : problems(rng)) {
    INFO(name << " on " << device_name << ": " << pr.label);
    pr.p.device = device.type();
    if (const std::string why = attention->supports(pr.p); !why.empty()) {
      MESSAGE(name << " on " << device_name << " does not serve " << pr.label << ": " << why);
      continue;
    }
    ++served;
    const AttentionProblem& p = pr.p;
    const std::size_t nq = std::size_t(p.batch) * p.seq_len * p.heads * p.head_dim,
                      nk = std::size_t(p.batch) * p.seq_len * p.kv_heads * p.head_dim;
    const test::Inputs in{bf16_values(nq, rng), bf16_values(nk, rng), bf16_values(nk, rng), bf16_values(nq, rng)};
    const std::vector<double> want_out = test::reference_forward(p, pr.batch, in.q, in.k, in.v);
    std::vector<double> want_dq, want_dk, want_dv;
    test::reference_backward(p, pr.batch, in, want_dq, want_dk, want_dv);
    const test::AttentionOutputs got =
        test::run_attention_on(device, *attention, p, pr.batch, narrow(in.q), narrow(in.k), narrow(in.v), narrow(in.d_out));
    constexpr double kTol = 0x1p-7;
    CHECK(scaled_error(got.out, want_out) <= kTol);
    CHECK(scaled_error(got.d_q, want_dq) <= kTol);
    CHECK(scaled_error(got.d_k, want_dk) <= kTol);
    CHECK(scaled_error(got.d_v, want_dv) <= kTol);
    CHECK(zero_at_padding(got.out, pr.batch, int64_t(p.heads) * p.head_dim));
    CHECK(zero_at_padding(got.d_q, pr.batch, int64_t(p.heads) * p.head_dim));
    CHECK(zero_at_padding(got.d_k, pr.batch, int64_t(p.kv_heads) * p.head_dim));
    CHECK(zero_at_padding(got.d_v, pr.batch, int64_t(p.kv_heads) * p.head_dim));
    const test::AttentionOutputs again =
        test::run_attention_on(device, *attention, p, pr.batch, narrow(in.q), narrow(in.k), narrow(in.v), narrow(in.d_out));
    CHECK(again.out == got.out);
    CHECK(again.d_q == got.d_q);
    CHECK(again.d_k == got.d_k);
    CHECK(again.d_v == got.d_v);
    if (p.heads != p.kv_heads) CHECK_THROWS_AS(forward_with_narrow_q(device, *attention, p, pr.batch), Error);
  }
  return served;
}

}  // namespace

TEST_CASE("every attention backend on every device it registers for keeps the attention contract") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  test::for_each_conformance_device(registry, [&](Device& device, const std::string& device_name) {
    int backends = 0;
    for (const std::string& name : registry.names(Kind::attention)) {
      const ComponentInfo* info = registry.find(Kind::attention, name, device_name);
      if (info == nullptr) continue;  // registered for other devices
      const int served = check_backend(registry, device, device_name, name);
      MESSAGE(name << " on " << device_name << ": " << served << " of 4 problems served");
      CHECK_MESSAGE(served > 0, name << " registers for " << device_name << " but serves none of the problems");
      ++backends;
    }
    MESSAGE(backends << " attention registrations on " << device_name);
    // The built-in devices' exact backend under its own name and as `naive`; a plugin's device
    // needs none of these (its backends register with it).
    if (device_name == "cpu" || device_name == "cuda") CHECK(backends >= 2);
  });
}
