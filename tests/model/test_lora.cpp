// LoRA through the model: an adapted model against the plain model whose weights are the merged
// W + s B A (s = alpha / rank). Both compute the same function, so
//   * their losses agree, and
//   * the adapters' gradients follow from the merged model's weight gradients by the chain rule:
//     dL/dB = s (dL/dW) A^T and dL/dA = s B^T (dL/dW),
// which checks the adapter layer and the model's wiring of it (each adapter adds its part of d_x
// after its projection's backward) against an independent computation. Also: the base is frozen
// (no gradient buffer for it, the optimizer sees only the adapters, the base's values do not
// move), the adapters' parameters follow the base's, and bad [adapter] keys are refused.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/engine.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/communicator.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

struct Fixture {
  Registry registry;
  RunContext run;
  Fixture() {
    registry.load_directories({test::plugin_dir()});
    run.threads = 2;
  }
};

ModelOptions options(bool llama, const std::vector<std::string>& targets, int64_t rank, double alpha,
                     const std::string& base_dtype = "fp32") {
  ModelOptions o;
  o.d_model = 16;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = llama ? 2 : 4;
  o.head_dim = 4;
  o.vocab_size = o.vocab_padded = 23;
  o.max_seq_len = 16;
  o.mlp_hidden = 32;
  if (llama) {
    o.norm = "rmsnorm";
    o.mlp = "swiglu_mlp";
    o.position = "rope";
    o.bias = false;
    o.tie_embeddings = false;
  }
  if (!targets.empty()) {
    o.adapter = "lora";
    o.adapter_targets = targets;
    o.adapter_own = Params("adapter.lora", {{"rank", Value{rank}}, {"alpha", Value{alpha}}});
    o.base_dtype = base_dtype;
  }
  return o;
}

Batch batch(std::mt19937_64& rng) {
  Batch b;
  b.reset(2, 12);
  std::uniform_int_distribution<int32_t> tok(0, 22);
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 12; ++t) {
      b.tokens[r * 12 + t] = tok(rng);
      b.targets[r * 12 + t] = tok(rng);
      b.positions[r * 12 + t] = t;
      b.segment_ids[r * 12 + t] = 1;
    }
    b.segments.push_back({0, 12});  // one document per row
    b.row_segments[std::size_t(r + 1)] = int32_t(b.segments.size());
  }
  return b;
}

// An adapted projection: its lora_A and lora_B in the adapted model, its weight in the plain one.
struct Adapted {
  const ParamSlice *A, *B, *W;
};
std::vector<Adapted> adapted_projections(const Model& adapted, const Model& plain) {
  std::vector<Adapted> out;
  for (const ParamSlice& a : adapted.trainable_table().slices) {
    if (a.name.find("lora_A") == std::string::npos) continue;
    const std::string prefix = a.name.substr(0, a.name.size() - 7);
    out.push_back({adapted.table().find(a.name), adapted.table().find(prefix + ".lora_B"), plain.table().find(prefix + ".weight")});
    REQUIRE((out.back().A && out.back().B && out.back().W));
  }
  return out;
}

std::vector<float> random_values(int64_t n, std::mt19937_64& rng, double std) {
  std::normal_distribution<double> d(0.0, std);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = float(d(rng));
  return v;
}

}  // namespace

TEST_CASE("LoRA: the adapted model is the merged model, and its adapter gradients follow by the chain rule") {
  for (const bool llama : {false, true}) {
    for (const std::vector<std::string>& targets : {std::vector<std::string>{"q", "k", "v", "o"}, {"v"}, {"q", "o"}}) {
      INFO(std::string(llama ? "llama" : "gpt2") << ", targets " << targets.size() << " first " << targets[0]);
      Fixture f;
      const int64_t r = 3;
      const double alpha = 6.0, s = alpha / double(r);
      Model adapted(options(llama, targets, r, alpha), f.registry, f.run);
      Model merged(options(llama, {}, 0, 0), f.registry, f.run);
      REQUIRE(adapted.frozen_params() == merged.num_params());
      // The base's layout is the plain model's; the adapters follow it.
      for (std::size_t i = 0; i < merged.table().slices.size(); ++i) {
        REQUIRE(adapted.table().slices[i].name == merged.table().slices[i].name);
        REQUIRE(adapted.table().slices[i].offset == merged.table().slices[i].offset);
      }
      const int64_t per_layer = int64_t(targets.size());
      CHECK(adapted.trainable_table().slices.size() == std::size_t(2 * 2 * per_layer));
      std::mt19937_64 rng(7);
      std::vector<float> values = random_values(adapted.num_params(), rng, 0.2);  // B nonzero too
      adapted.load_params_from_host(values);
      // W' = W + s B A for every adapted projection.
      std::vector<float> w(values.begin(), values.begin() + merged.num_params());
      for (const auto& [A, B, W] : adapted_projections(adapted, merged)) {
        const int64_t out = W->shape[0], in = W->shape[1];
        for (int64_t i = 0; i < out; ++i)
          for (int64_t j = 0; j < in; ++j) {
            double d = 0;
            for (int64_t k = 0; k < r; ++k) d += double(values[B->offset + i * r + k]) * double(values[A->offset + k * in + j]);
            w[W->offset + i * in + j] += float(s * d);
          }
      }
      merged.load_params_from_host(w);
      const Batch b = batch(rng);
      const double scale = 1.0 / double(b.real_targets());
      adapted.zero_grads();
      merged.zero_grads();
      const double la = adapted.forward_backward(b, scale, 0), lm = merged.forward_backward(b, scale, 0);
      CHECK(la == doctest::Approx(lm).epsilon(1e-5));
      std::vector<float> ga, gm;
      adapted.copy_grads_to_host(ga);
      merged.copy_grads_to_host(gm);
      REQUIRE(int64_t(ga.size()) == adapted.num_trainable());
      double worst = 0, largest = 0;
      for (const auto& [A, B, W] : adapted_projections(adapted, merged)) {
        const int64_t out = W->shape[0], in = W->shape[1], f0 = adapted.frozen_params();
        const float* dW = gm.data() + W->offset;
        for (int64_t i = 0; i < out; ++i)  // dB(i, k) = s sum_j dW(i, j) A(k, j)
          for (int64_t k = 0; k < r; ++k) {
            double want = 0;
            for (int64_t j = 0; j < in; ++j) want += s * double(dW[i * in + j]) * double(values[A->offset + k * in + j]);
            const double got = ga[B->offset - f0 + i * r + k];
            worst = std::max(worst, std::abs(got - want));
            largest = std::max(largest, std::abs(want));
          }
        for (int64_t k = 0; k < r; ++k)  // dA(k, j) = s sum_i B(i, k) dW(i, j)
          for (int64_t j = 0; j < in; ++j) {
            double want = 0;
            for (int64_t i = 0; i < out; ++i) want += s * double(values[B->offset + i * r + k]) * double(dW[i * in + j]);
            const double got = ga[A->offset - f0 + k * in + j];
            worst = std::max(worst, std::abs(got - want));
            largest = std::max(largest, std::abs(want));
          }
      }
      INFO("worst " << worst << " of " << largest);
      // fp32 sums of a few hundred products of unit-size terms: relative error ~1e-6 of the largest.
      CHECK(largest > 1e-3);
      CHECK(worst <= 2e-5 * largest);
    }
  }
}

TEST_CASE("LoRA: the base is frozen, only the adapters train, and B = 0 starts as the base model") {
  Fixture f;
  Model m(options(true, {"q", "v"}, 4, 8.0), f.registry, f.run);
  Model plain(options(true, {}, 0, 0), f.registry, f.run);
  m.init_params(3);
  plain.init_params(3);
  std::vector<float> before;
  m.copy_params_to_host(before);
  // The base's initialisation is the plain model's, every lora_B is zero and every lora_A is not.
  std::vector<float> plain_values;
  plain.copy_params_to_host(plain_values);
  CHECK(std::equal(plain_values.begin(), plain_values.end(), before.begin()));
  for (const ParamSlice& s : m.trainable_table().slices) {
    const float* p = before.data() + m.frozen_params() + s.offset;
    const bool any = std::any_of(p, p + s.numel(), [](float v) { return v != 0.0f; });
    CHECK_MESSAGE(any == (s.name.find("lora_A") != std::string::npos), s.name);
  }
  std::mt19937_64 rng(5);
  const Batch b = batch(rng);
  CHECK(m.forward(b) == plain.forward(b));  // B = 0: the same bits as the base
  // Engine steps: the optimizer sees the adapters only; the base does not move, the adapters do.
  auto opt = f.registry.create<Optimizer>(
      Kind::optimizer, "adamw",
      {Params("optimizer", {{"lr", Value{1e-2}}}),
       Params("optimizer.adamw", {{"weight_decay", Value{0.0}}, {"beta1", Value{0.9}}, {"beta2", Value{0.95}}, {"eps", Value{1e-8}}}),
       f.run},
      "optimizer.name");
  auto comm = f.registry.create<Communicator>(Kind::communicator, "single", {Params("run", {}), Params("run.single", {}), f.run},
                                              "run.communicator");
  Engine engine(m, *opt, *comm, RunSpec{});
  CHECK(engine.optimizer_table().total == m.num_trainable());
  CHECK(opt->state_bytes() == 2 * 4 * m.num_trainable());
  const double first = engine.step(std::span<const Batch>(&b, 1), 1, 1e-2).loss;
  double last = first;
  for (int step = 2; step <= 20; ++step) last = engine.step(std::span<const Batch>(&b, 1), step, 1e-2).loss;
  CHECK(last < first);
  std::vector<float> after;
  m.copy_params_to_host(after);
  CHECK(std::equal(before.begin(), before.begin() + m.frozen_params(), after.begin()));
  CHECK(!std::equal(before.begin() + m.frozen_params(), before.end(), after.begin() + m.frozen_params()));
  // FLOPs: 4 per frozen parameter (forward and input gradients), 6 per trainable one.
  CHECK(m.flops_per_token(12) ==
        doctest::Approx(4.0 * double(m.frozen_params()) + 6.0 * double(m.num_trainable()) + 6.0 * 2 * 16 * 12));
}

TEST_CASE("NF4 base: the linear and MLP weights are held in 4 bits and the model computes with their dequantized values") {
  for (const bool llama : {false, true}) {
    INFO(std::string(llama ? "llama" : "gpt2"));
    Fixture f;
    Model q(options(llama, {"q", "k", "v", "o"}, 4, 8.0, "nf4"), f.registry, f.run);
    Model full(options(llama, {"q", "k", "v", "o"}, 4, 8.0), f.registry, f.run);
    std::mt19937_64 rng(9);
    const std::vector<float> values = random_values(q.num_params(), rng, 0.1);
    q.load_params_from_host(values);
    // What q holds: every 2-D weight of a linear or MLP layer rounded to NF4, the rest as given.
    std::vector<float> held;
    q.copy_params_to_host(held);
    int64_t quantized = 0, changed = 0, mlp = 0;
    for (const ParamSlice& s : q.table().slices) {
      const bool dense = s.shape.size() == 2 && s.offset < q.frozen_params() && s.name.rfind("blocks.", 0) == 0;
      quantized += dense ? s.numel() : 0;
      if (s.name.rfind("blocks.0.mlp.", 0) == 0) mlp += s.numel();
      float largest = 0;
      for (int64_t i = 0; i < s.numel(); ++i) largest = std::max(largest, std::abs(values[std::size_t(s.offset + i)]));
      for (int64_t i = 0; i < s.numel(); ++i) {
        const float v = values[std::size_t(s.offset + i)], h = held[std::size_t(s.offset + i)];
        if (!dense) {
          REQUIRE(h == v);
        } else {
          changed += h != v;
          REQUIRE(std::abs(h - v) <= 0.5f * 0.304f * largest);  // half the book's widest gap times absmax
        }
      }
    }
    CHECK(q.nf4_params() == quantized);
    CHECK(changed > quantized / 2);
    CHECK(q.nf4_bytes() == quantized / 2 + 4 * (quantized / 64));  // every weight here is a whole number of blocks
    // Held: the fp32 values less the quantized ones, their codes and scales, and one staging buffer
    // of the largest site's parameters (a block's MLP) to dequantize into.
    CHECK(q.state_bytes() == full.state_bytes() - 4 * quantized + q.nf4_bytes() + 4 * mlp);
    // The fp32 model holding those values: the same loss and adapter gradients, bit for bit.
    full.load_params_from_host(held);
    const Batch b = batch(rng);
    q.zero_grads();
    full.zero_grads();
    CHECK(q.forward_backward(b, 0.01, 0) == full.forward_backward(b, 0.01, 0));
    std::vector<float> gq, gf;
    q.copy_grads_to_host(gq);
    full.copy_grads_to_host(gf);
    CHECK(gq == gf);
    // Held values quantize to themselves: loading them again changes nothing.
    q.load_params_from_host(held);
    std::vector<float> again;
    q.copy_params_to_host(again);
    CHECK(again == held);
  }
}
