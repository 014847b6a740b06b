// `cudnn_flash` on a GPU against `naive_cuda` (exact f32 attention): padded rows and packed rows
// with random segments (length 1 and empty rows included), GQA ratios 1, 3 and 4, head_dim 64 and
// 128, T = 7, 77 and 130 (none a multiple of 64); outputs and all three gradients, outputs poisoned
// with NaN first so that a position cuDNN never writes shows; and one graph build per distinct key
// over repeated calls; rows without padding (the unmasked dense graph, for padded and packed
// problems); the measured plan against heuristics' choice. Exits 77 (CTest: skipped) without a CUDA
// device.
//
// Both backends get the same inputs, already representable in bf16, so cudnn_flash's conversion of
// its f32 inputs is exact and what remains is cuDNN's own bf16 arithmetic (see the tolerances).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/runtime/registry.hpp"
#include "attention_device_run.hpp"
#include "attention_support.hpp"

using namespace ablate;

namespace {

// The plugin's build counters (exported by libablate_cudnn_flash for tests and benchmarks).
using Counter = int64_t (*)(const Attention*);

struct Fixture {
  Registry registry;
  std::unique_ptr<Device> device;
  std::unique_ptr<Attention> flash, naive;
  Counter builds = nullptr, cached = nullptr, tuned = nullptr;
  // The correctness cases take heuristics' plan (building every plan of some 30 graphs would only
  // lengthen them); the dense rows and the measured-plan case take the default, "measured".
  explicit Fixture(const char* plan = "heuristic") {
    registry.load_directories({ABLATE_PLUGIN_DIR});
    static const Params run_params{"run", {}}, common{"attention", {}}, naive_own{"attention.naive_cuda", {}};
    const Params flash_own{"attention.cudnn_flash", {{"plan", std::string(plan)}}};
    RunContext on_gpu;
    on_gpu.device = "cuda";
    device = registry.create<Device>(Kind::device, "cuda", {run_params, run_params, on_gpu});
    flash = registry.create<Attention>(Kind::attention, "cudnn_flash", {common, flash_own, on_gpu});
    naive = registry.create<Attention>(Kind::attention, "naive_cuda", {common, naive_own, on_gpu});
    const std::string library = std::string(ABLATE_PLUGIN_DIR) + "/libablate_cudnn_flash.so";
    void* plugin = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    REQUIRE_MESSAGE(plugin != nullptr, "the registry did not load " << library);
    builds = reinterpret_cast<Counter>(dlsym(plugin, "ablate_cudnn_flash_graph_builds"));
    cached = reinterpret_cast<Counter>(dlsym(plugin, "ablate_cudnn_flash_graphs_cached"));
    tuned = reinterpret_cast<Counter>(dlsym(plugin, "ablate_cudnn_flash_graphs_tuned"));
    REQUIRE_MESSAGE((builds != nullptr && cached != nullptr && tuned != nullptr), "the plugin exports no build counters");
  }
};

// A refusal the device explains (an SM below 80; packed rows on a device that does not serve them)
// is a case skipped and counted; any other (cuDNN missing, too old or a refused version) fails: on a
// machine with a GPU these cases must run, not pass empty.
bool device_refusal(const std::string& why) {
  const bool device = why.find("needs an SM80") != std::string::npos || why.find("serves packed rows on") != std::string::npos;
  CHECK_MESSAGE(device, "cudnn_flash refuses on a machine with a GPU: " << why);
  MESSAGE("cudnn_flash refuses: " << why);
  return device;
}

// The nearest bf16 value (device_math::bf16_bits, checked against its definition on the CPU), as an f32.
float to_bf16(float x) {
  const uint32_t bits = uint32_t(device_math::bf16_bits(x)) << 16;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

using Outputs = test::AttentionOutputs;

Outputs run(Fixture& f, Attention& attention, const AttentionProblem& p, const Batch& batch, const std::vector<float>& q,
            const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& d_out) {
  return test::run_attention_on(*f.device, attention, p, batch, q, k, v, d_out);
}

// Every element within atol + rtol * |ref|, atol = rtol * max |ref|; positions the reference leaves
// at exactly 0 (padding) must be exactly 0. Returns the worst ratio of error to allowance (<= 1 passes).
double worst(const std::vector<float>& got, const std::vector<float>& ref, double rtol) {
  double scale = 0.0;
  for (float r : ref) scale = std::max(scale, double(std::abs(r)));
  const double atol = rtol * scale;
  double ratio = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    const double err = std::abs(double(got[i]) - double(ref[i]));
    ratio = std::max(ratio, err / (atol + rtol * std::abs(double(ref[i])) + 1e-30));
  }
  return ratio;
}

using test::zero_at_padding;

// (B, T, heads, D) values drawn from `n`, each exactly representable in bf16.
std::vector<float> random_bf16(const AttentionProblem& p, int64_t heads, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(std::size_t(p.batch) * p.seq_len * heads * p.head_dim);
  for (float& e : x) e = to_bf16(n(rng));
  return x;
}

// The output within out_rtol and the three gradients within grad_rtol of the reference (see worst).
void check_close(const Outputs& got, const Outputs& want, double out_rtol, double grad_rtol) {
  CHECK(worst(got.out, want.out, out_rtol) <= 1.0);
  CHECK(worst(got.d_q, want.d_q, grad_rtol) <= 1.0);
  CHECK(worst(got.d_k, want.d_k, grad_rtol) <= 1.0);
  CHECK(worst(got.d_v, want.d_v, grad_rtol) <= 1.0);
}

}  // namespace

TEST_CASE("cudnn_flash matches naive_cuda: padded and packed rows, GQA 1/3/4, head_dim 64 and 128, odd T") {
  Fixture f;
  std::mt19937 rng(43);
  // Tolerances for bf16 (8 significant bits, unit roundoff u = 2^-9), relative to each tensor's
  // largest reference value plus the element's own: the inputs are exact in bf16, so the errors are
  // cuDNN's: the probabilities rounded to bf16 before they meet V (about u relative per term), O
  // rounded once, and in backward the bf16 dO and O whose row dot is subtracted from dP (a
  // cancellation) and the gradients rounded once, over sums of up to 130 keys. Forward errors stay
  // near a few u, gradients near ten u; 2^-6 (8 u) and 2^-5 (16 u) hold them with margin, while any
  // masking or layout mistake gives errors of the order of the values themselves.
  const double out_rtol = 1.0 / 64, grad_rtol = 1.0 / 32;
  // Each T with each head_dim and each GQA ratio with each head_dim (every shape is a graph of its
  // own, built in seconds where cuDNN compiles its kernels at run time: six shapes, not eighteen).
  const std::tuple<int32_t, int32_t, int32_t> shapes[] = {{7, 64, 1},  {77, 64, 3},  {130, 64, 4},
                                                          {7, 128, 4}, {77, 128, 1}, {130, 128, 3}};
  int ran = 0, refused = 0;
  for (const auto& [T, D, ratio] : shapes) {
    for (bool packed : {false, true}) {
      INFO("T " << T << " D " << D << " heads/kv " << ratio << (packed ? " packed" : " padded"));
      const Batch batch =
          packed ? test::make_batch(T, {test::random_packed_row(T, rng), test::random_packed_row(T, rng), {{0, 1}, {1, T - 1}}, {}})
                 : test::make_batch(T, {{{0, T}}, {{0, T / 2 + 1}}, {{0, 1}}});
      const AttentionProblem p{.batch = batch.rows,
                               .seq_len = T,
                               .heads = 2 * ratio,
                               .kv_heads = 2,
                               .head_dim = D,
                               .dtype = DType::f32,
                               .device = DeviceType::cuda,
                               .packed = packed};
      if (const std::string why = f.flash->supports(p); !why.empty()) {
        REQUIRE(device_refusal(why));
        ++refused;
        continue;
      }
      ++ran;
      REQUIRE(f.naive->supports(p).empty());
      const auto make = [&](int64_t heads) { return random_bf16(p, heads, rng); };
      const std::vector<float> q = make(p.heads), k = make(p.kv_heads), v = make(p.kv_heads), d_out = make(p.heads);
      const Outputs want = run(f, *f.naive, p, batch, q, k, v, d_out);
      const int64_t builds_before = f.builds(f.flash.get());
      const Outputs got = run(f, *f.flash, p, batch, q, k, v, d_out);
      check_close(got, want, out_rtol, grad_rtol);
      CHECK(zero_at_padding(got.out, batch, int64_t(p.heads) * D));
      CHECK(zero_at_padding(got.d_q, batch, int64_t(p.heads) * D));
      CHECK(zero_at_padding(got.d_k, batch, int64_t(p.kv_heads) * D));
      CHECK(zero_at_padding(got.d_v, batch, int64_t(p.kv_heads) * D));
      // A forward and a backward graph for a new key, none for a key met before.
      const int64_t built = f.builds(f.flash.get()) - builds_before;
      CHECK(built <= 2);
      const Outputs again = run(f, *f.flash, p, batch, q, k, v, d_out);
      CHECK(f.builds(f.flash.get()) == builds_before + built);
      CHECK(again.out == got.out);  // forward is deterministic; backward may order its sums differently
    }
  }
  // One build per distinct key over everything above.
  CHECK(f.builds(f.flash.get()) == f.cached(f.flash.get()));
  MESSAGE("cudnn_flash ran " << ran << " of " << ran + refused << " cases and built " << f.builds(f.flash.get()) << " graphs");
  std::printf("cudnn_flash cases run: %d of %d\n", ran, ran + refused);
  CHECK(ran > 0);  // padded rows run on every device cudnn_flash serves
}

TEST_CASE("cudnn_flash with out, and q, k, v, held in bf16: the f32 run's out exactly, and its gradients") {
  // cuDNN writes O in bf16 either way: the f32 out is its exact widening, so the bf16 out must be
  // the same values; backward reads O in bf16 either way, so the gradients are the same up to the
  // order of backward's sums (a bf16 unit or two, since cuDNN writes dQ, dK, dV in bf16). q, k, v
  // here are exact in bf16, so holding them in bf16 changes nothing cuDNN reads.
  Fixture f;
  std::mt19937 rng(17);
  for (bool packed : {false, true}) {
    INFO((packed ? "packed" : "padded"));
    const int32_t T = 77, D = 64;
    const Batch batch = packed ? test::make_batch(T, {test::random_packed_row(T, rng), {{0, 1}, {1, T - 1}}})
                               : test::make_batch(T, {{{0, T}}, {{0, T / 2 + 1}}});
    AttentionProblem p{.batch = batch.rows,
                       .seq_len = T,
                       .heads = 6,
                       .kv_heads = 2,
                       .head_dim = D,
                       .dtype = DType::f32,
                       .device = DeviceType::cuda,
                       .packed = packed};
    if (const std::string why = f.flash->supports(p); !why.empty()) {
      REQUIRE(device_refusal(why));
      continue;
    }
    const auto make = [&](int64_t heads) { return random_bf16(p, heads, rng); };
    const std::vector<float> q = make(p.heads), k = make(p.kv_heads), v = make(p.kv_heads), d_out = make(p.heads);
    const Outputs f32_out = run(f, *f.flash, p, batch, q, k, v, d_out);
    for (int level : {0, 1, 2}) {
      const bool qkv = level >= 1, grads = level == 2;
      INFO((grads ? "q, k, v, out and the gradients in bf16" : qkv ? "q, k, v and out in bf16" : "out in bf16"));
      AttentionProblem held = p;
      held.bf16_out = true;
      held.bf16_qkv = qkv;
      held.bf16_grads = grads;  // d_out's values are bf16 ones: cuDNN reads the same either way
      REQUIRE(f.flash->supports(held).empty());
      const Outputs bf16_out = run(f, *f.flash, held, batch, q, k, v, d_out);
      CHECK(bf16_out.out == f32_out.out);
      CHECK(zero_at_padding(bf16_out.out, batch, int64_t(p.heads) * D));
      CHECK(worst(bf16_out.d_q, f32_out.d_q, 1.0 / 64) <= 1.0);
      CHECK(worst(bf16_out.d_k, f32_out.d_k, 1.0 / 64) <= 1.0);
      CHECK(worst(bf16_out.d_v, f32_out.d_v, 1.0 / 64) <= 1.0);
    }
  }
}

TEST_CASE("cudnn_flash: packed batches with different segment counts share a graph within a bound") {
  Fixture f;
  const int32_t T = 96;
  const AttentionProblem p{.batch = 2,
                           .seq_len = T,
                           .heads = 4,
                           .kv_heads = 2,
                           .head_dim = 64,
                           .dtype = DType::f32,
                           .device = DeviceType::cuda,
                           .packed = true};
  if (const std::string why = f.flash->supports(p); !why.empty()) {
    REQUIRE(device_refusal(why));
    return;
  }
  std::mt19937 rng(5);
  const auto make = [&](int64_t heads) { return random_bf16(p, heads, rng); };
  const std::vector<float> q = make(p.heads), k = make(p.kv_heads), v = make(p.kv_heads), d_out = make(p.heads);
  // 9 and 10 segments in 2 rows share the bound 10, and their longest (96, 95) the length bound 96:
  // one forward and one backward graph.
  const Batch nine = test::make_batch(T, {{{0, 12}, {12, 12}, {24, 12}, {36, 12}, {48, 12}, {60, 12}, {72, 12}, {84, 12}}, {{0, 96}}});
  const Batch ten =
      test::make_batch(T, {{{0, 10}, {10, 10}, {20, 10}, {30, 10}, {40, 10}, {50, 10}, {60, 10}, {70, 10}, {80, 1}}, {{0, 95}}});
  const Outputs a = run(f, *f.flash, p, nine, q, k, v, d_out);
  CHECK(f.builds(f.flash.get()) == 2);
  const Outputs b = run(f, *f.flash, p, ten, q, k, v, d_out);
  CHECK(f.builds(f.flash.get()) == 2);
  const Outputs want = run(f, *f.naive, p, ten, q, k, v, d_out);
  check_close(b, want, 1.0 / 64, 1.0 / 32);
  // Short documents only (longest 20): a graph whose sequence dimension is 64, not T = 96.
  const Batch short_docs = test::make_batch(T, {{{0, 20}, {20, 20}, {40, 20}, {60, 20}, {80, 16}}, {{0, 7}}});
  const Outputs c = run(f, *f.flash, p, short_docs, q, k, v, d_out);
  CHECK(f.builds(f.flash.get()) == 4);
  const Outputs want_c = run(f, *f.naive, p, short_docs, q, k, v, d_out);
  check_close(c, want_c, 1.0 / 64, 1.0 / 32);
  CHECK(zero_at_padding(c.out, short_docs, int64_t(p.heads) * p.head_dim));
  CHECK(zero_at_padding(c.d_k, short_docs, int64_t(p.kv_heads) * p.head_dim));
  (void)a;
}

TEST_CASE("cudnn_flash on rows without padding: the unmasked graph for padded and packed problems, held in bf16 or not") {
  Fixture f("measured");
  std::mt19937 rng(29);
  for (auto [T, D, ratio] : {std::tuple{77, 64, 3}, std::tuple{128, 128, 1}}) {
    const Batch batch = test::make_batch(T, {{{0, T}}, {{0, T}}, {{0, T}}});
    for (bool packed : {false, true}) {
      for (bool held : {false, true}) {
        INFO("T " << T << " D " << D << (packed ? " packed" : " padded") << (held ? ", q k v out in bf16" : ""));
        AttentionProblem p{.batch = batch.rows,
                           .seq_len = T,
                           .heads = 2 * ratio,
                           .kv_heads = 2,
                           .head_dim = D,
                           .dtype = DType::f32,
                           .device = DeviceType::cuda,
                           .packed = packed};
        if (const std::string why = f.flash->supports(p); !why.empty()) {
          REQUIRE(device_refusal(why));
          continue;
        }
        const auto make = [&](int64_t heads) { return random_bf16(p, heads, rng); };
        const std::vector<float> q = make(p.heads), k = make(p.kv_heads), v = make(p.kv_heads), d_out = make(p.heads);
        const Outputs want = run(f, *f.naive, p, batch, q, k, v, d_out);
        p.bf16_out = p.bf16_qkv = held;
        const Outputs got = run(f, *f.flash, p, batch, q, k, v, d_out);
        check_close(got, want, 1.0 / 64, 1.0 / 32);
      }
    }
  }
  // Padded and packed problems on the same rows share the dense graphs: one forward and one backward
  // per shape.
  CHECK(f.builds(f.flash.get()) == f.cached(f.flash.get()));
  CHECK(f.cached(f.flash.get()) <= 2 * 2);
}

TEST_CASE("cudnn_flash's measured plan computes what heuristics' choice computes") {
  Fixture measured("measured"), heuristic("heuristic");
  std::mt19937 rng(31);
  const int32_t T = 256, D = 64;
  const Batch batch = test::make_batch(T, {{{0, T}}, {{0, 100}, {100, 156}}, {{0, 30}}});
  const AttentionProblem p{.batch = batch.rows,
                           .seq_len = T,
                           .heads = 4,
                           .kv_heads = 2,
                           .head_dim = D,
                           .dtype = DType::f32,
                           .device = DeviceType::cuda,
                           .packed = true};
  if (const std::string why = measured.flash->supports(p); !why.empty()) {
    REQUIRE(device_refusal(why));
    return;
  }
  const auto make = [&](int64_t heads) { return random_bf16(p, heads, rng); };
  const std::vector<float> q = make(p.heads), k = make(p.kv_heads), v = make(p.kv_heads), d_out = make(p.heads);
  const Outputs want = run(measured, *measured.naive, p, batch, q, k, v, d_out);
  const Outputs timed = run(measured, *measured.flash, p, batch, q, k, v, d_out);
  const Outputs chosen = run(heuristic, *heuristic.flash, p, batch, q, k, v, d_out);
  for (const Outputs* got : {&timed, &chosen}) {
    check_close(*got, want, 1.0 / 64, 1.0 / 32);
    CHECK(zero_at_padding(got->out, batch, int64_t(p.heads) * D));
  }
  CHECK(heuristic.tuned(heuristic.flash.get()) == 0);
  CHECK(measured.tuned(measured.flash.get()) <= measured.builds(measured.flash.get()));
  MESSAGE("measured: " << measured.tuned(measured.flash.get()) << " of " << measured.builds(measured.flash.get())
                       << " graphs had more than one plan to time");
  // Timed once: a second call builds and times nothing more.
  const int64_t tuned = measured.tuned(measured.flash.get()), built = measured.builds(measured.flash.get());
  (void)run(measured, *measured.flash, p, batch, q, k, v, d_out);
  CHECK(measured.tuned(measured.flash.get()) == tuned);
  CHECK(measured.builds(measured.flash.get()) == built);
}

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
