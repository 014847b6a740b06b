// The assembled model against PyTorch: logits, loss, every gradient and three AdamW steps of a tiny
// GPT-2-style and a tiny Llama/Qwen3-style model (tests/golden/*.safetensors, written by
// tools/golden_reference.py in float64). Also: accumulation over micro-batches equals one batch,
// backward twice equals twice the gradient, and the parameter count of GPT-2 small.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ablate/runtime/model.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/safetensors.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

struct Golden {
  SafetensorsFile file;
  nlohmann::json config;
  explicit Golden(const std::string& name) {
    file = read_safetensors(std::filesystem::path(ABLATE_SOURCE_DIR) / "tests" / "golden" / (name + ".safetensors"));
    config = nlohmann::json::parse(file.metadata.at("config"));
  }
  const NamedTensor& get(const std::string& n) const {
    const NamedTensor* t = file.find(n);
    REQUIRE_MESSAGE(t != nullptr, "golden tensor " << n);
    return *t;
  }
  std::vector<double> f64(const std::string& n) const {
    const NamedTensor& t = get(n);
    REQUIRE(t.dtype == DType::f64);
    std::vector<double> v(t.bytes.size() / 8);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  }
  std::vector<int32_t> i32(const std::string& n) const {
    const NamedTensor& t = get(n);
    std::vector<int32_t> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  }
  ModelOptions options() const {
    ModelOptions o;
    o.d_model = config["d_model"];
    o.n_layers = config["n_layers"];
    o.n_heads = config["n_heads"];
    o.n_kv_heads = config["n_kv_heads"];
    o.head_dim = o.d_model / o.n_heads;
    o.vocab_size = config["vocab_size"];
    o.vocab_padded = config["vocab_padded"];
    o.max_seq_len = config["max_seq_len"];
    o.mlp_hidden = config["mlp_hidden"];
    o.norm = config["norm"];
    o.mlp = config["mlp"];
    o.position = config["position"];
    o.layer_own.insert_or_assign("rope", Params("model.rope", {{"theta", Value{double(config["rope_theta"])}}}));
    o.qk_norm = config["qk_norm"];
    o.bias = config["bias"];
    o.tie_embeddings = config["tie_embeddings"];
    return o;
  }
  // Rows [r0, r1) of the golden batch, with the segment layout derived from segment_ids.
  Batch batch(int r0 = 0, int r1 = -1) const {
    const auto tok = i32("batch.tokens"), tgt = i32("batch.targets"), pos = i32("batch.positions"), seg = i32("batch.segment_ids");
    const int64_t T = get("batch.tokens").shape[1];
    if (r1 < 0) r1 = int(get("batch.tokens").shape[0]);
    Batch b;
    b.reset(r1 - r0, int32_t(T));
    for (int r = r0; r < r1; ++r) {
      for (int64_t t = 0; t < T; ++t) {
        const std::size_t src = std::size_t(r * T + t), dst = std::size_t((r - r0) * T + t);
        b.tokens[dst] = tok[src];
        b.targets[dst] = tgt[src];
        b.positions[dst] = pos[src];
        b.segment_ids[dst] = seg[src];
        if (seg[src] != 0 && (t == 0 || seg[src - 1] != seg[src])) b.segments.push_back({int32_t(t), 0});
        if (seg[src] != 0) b.segments.back().length++;
      }
      b.row_segments[std::size_t(r - r0 + 1)] = int32_t(b.segments.size());
    }
    return b;
  }
};

struct Fixture {
  Registry registry;
  RunContext run;
  Fixture() {
    registry.load_directories({test::plugin_dir()});
    run.threads = 2;
  }
};

void load_golden_params(Model& m, const Golden& g) {
  std::vector<float> values(std::size_t(m.num_params()));
  for (const ParamSlice& s : m.table().slices) {
    const NamedTensor& t = g.get("param." + s.name);
    REQUIRE_MESSAGE(t.shape == s.shape, s.name);
    std::memcpy(values.data() + s.offset, t.bytes.data(), t.bytes.size());
  }
  m.load_params_from_host(values);
}

std::vector<float> grads_of(Model& m) {
  std::vector<float> g;
  m.copy_grads_to_host(g);
  return g;
}

std::vector<float> params_of(Model& m) {
  std::vector<float> p;
  m.copy_params_to_host(p);
  return p;
}

double rel_err(double got, double want) { return std::abs(got - want) / std::max(1e-3, std::abs(want)); }

void check_case(const std::string& name) {
  Fixture f;
  Golden g(name);
  Model m(g.options(), f.registry, f.run);
  // Same parameter table as the reference, name for name.
  int64_t golden_params = 0;
  for (const NamedTensor& t : g.file.tensors) {
    if (t.name.rfind("param.", 0) == 0) ++golden_params;
  }
  CHECK(int64_t(m.table().slices.size()) == golden_params);
  load_golden_params(m, g);
  const Batch b = g.batch();

  // Logits and loss.
  std::vector<float> logits;
  const double sum = m.forward(b, nullptr, &logits);
  const double loss = sum / double(b.real_targets());
  const std::vector<double> want_logits = g.f64("logits");
  REQUIRE(logits.size() == want_logits.size());
  double max_err = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) max_err = std::max(max_err, std::abs(double(logits[i]) - want_logits[i]));
  INFO(name << " logits max abs error " << max_err);
  CHECK(max_err < 2e-5);
  CHECK(rel_err(loss, g.f64("loss")[0]) < 1e-5);

  // Gradients of the mean loss.
  m.zero_grads();
  const double sum2 = m.forward_backward(b, 1.0 / double(b.real_targets()), 0);
  CHECK(sum2 == doctest::Approx(sum).epsilon(1e-6));
  const std::vector<float> grads = grads_of(m);
  for (const ParamSlice& s : m.table().slices) {
    const std::vector<double> want = g.f64("grad." + s.name);
    double scale = 0, err = 0;
    for (int64_t i = 0; i < s.numel(); ++i) {
      scale = std::max(scale, std::abs(want[std::size_t(i)]));
      err = std::max(err, std::abs(double(grads[std::size_t(s.offset + i)]) - want[std::size_t(i)]));
    }
    INFO(name << " gradient " << s.name << ": max abs error " << err << " (max |grad| " << scale << ")");
    CHECK(err <= 1e-6 + 2e-4 * scale);
  }

  // Three AdamW steps (weight decay on matrices only, as the reference).
  const auto& oc = g.config["optimizer"];
  Params common{"optimizer", {{"lr", double(oc["lr"])}, {"grad_clip", 0.0}, {"name", std::string("adamw")}}};
  Params own{"optimizer.adamw",
             {{"weight_decay", double(oc["weight_decay"])},
              {"beta1", double(oc["beta1"])},
              {"beta2", double(oc["beta2"])},
              {"eps", double(oc["eps"])}}};
  auto opt = f.registry.create<Optimizer>(Kind::optimizer, "adamw", {common, own, f.run});
  opt->init(m.table(), DeviceType::cpu);
  const std::vector<double> want_losses = g.f64("losses");
  for (std::size_t step = 0; step < want_losses.size(); ++step) {
    m.zero_grads();
    const double l = m.forward_backward(b, 1.0 / double(b.real_targets()), 0) / double(b.real_targets());
    INFO(name << " step " << step << " loss " << l << " reference " << want_losses[step]);
    CHECK(rel_err(l, want_losses[step]) < 1e-4);
    if (step + 1 < want_losses.size()) opt->step(m.table(), m.params(), m.grads(), double(oc["lr"]), int64_t(step + 1));
  }
}

// A GPT-2-style model's shape: heads of head_dim = d_model / heads, kv heads = heads.
ModelOptions gpt_options(int64_t d_model, int64_t layers, int64_t heads, int64_t vocab, int64_t vocab_padded, int64_t max_seq_len,
                         int64_t mlp_hidden) {
  ModelOptions o;
  o.d_model = d_model;
  o.n_layers = layers;
  o.n_heads = o.n_kv_heads = heads;
  o.head_dim = d_model / heads;
  o.vocab_size = vocab;
  o.vocab_padded = vocab_padded;
  o.max_seq_len = max_seq_len;
  o.mlp_hidden = mlp_hidden;
  return o;
}

// One row of T positions, one document: tokens 0..T-1, each target the next token.
Batch one_row(int32_t T) {
  Batch b;
  b.reset(1, T);
  for (int32_t t = 0; t < T; ++t) {
    b.tokens[std::size_t(t)] = t;
    b.targets[std::size_t(t)] = t + 1;
    b.positions[std::size_t(t)] = t;
    b.segment_ids[std::size_t(t)] = 1;
  }
  b.segments = {{0, T}};
  b.row_segments = {0, 1};
  return b;
}

}  // namespace

TEST_CASE("golden: a tiny GPT-2-style model matches PyTorch (logits, loss, gradients, AdamW steps)") { check_case("tiny_gpt2"); }

TEST_CASE("golden: a tiny Llama/Qwen3-style model (RMSNorm, SwiGLU, RoPE, GQA, QK-norm, untied) matches PyTorch") {
  check_case("tiny_llama");
}

TEST_CASE("accumulating micro-batches equals one batch, backward twice equals twice the gradient") {
  for (const char* name : {"tiny_gpt2", "tiny_llama"}) {
    Fixture f;
    Golden g(name);
    Model m(g.options(), f.registry, f.run);
    load_golden_params(m, g);
    const Batch whole = g.batch(), first = g.batch(0, 1), second = g.batch(1, 2);
    const double scale = 1.0 / double(whole.real_targets());
    m.zero_grads();
    const double sum_whole = m.forward_backward(whole, scale, 0);
    const std::vector<float> g_whole = grads_of(m);
    m.zero_grads();
    const double sum_parts = m.forward_backward(first, scale, 0) + m.forward_backward(second, scale, 0);
    CHECK(sum_parts == doctest::Approx(sum_whole).epsilon(1e-6));
    double err = 0, mx = 0;
    const std::vector<float> g_parts = grads_of(m);
    for (std::size_t i = 0; i < g_whole.size(); ++i) {
      err = std::max(err, double(std::abs(g_parts[i] - g_whole[i])));
      mx = std::max(mx, double(std::abs(g_whole[i])));
    }
    INFO(name << ": accumulated vs whole max abs diff " << err << " of " << mx);
    CHECK(err <= 1e-5 * mx);
    // Twice the same micro-batch accumulates exactly twice.
    m.zero_grads();
    m.forward_backward(first, scale, 0);
    const std::vector<float> once = grads_of(m);
    m.forward_backward(first, scale, 0);
    const std::vector<float> twice = grads_of(m);
    for (std::size_t i = 0; i < once.size(); ++i) REQUIRE(twice[i] == doctest::Approx(2.0 * once[i]).epsilon(1e-6));
  }
}

// A position scheme the model has no name for, registered by the test as a plugin would register
// it: fixed sinusoids added to the stream (Vaswani et al., 2017), no parameters. Where the model
// applies it is the layer's answer to position_site() (the default, the stream), not its name.
class Sinusoidal final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::position; }
  void declare_params(const LayerSpec&, const std::string&, ParamTable&) const override {}
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }
  static float value(int64_t position, int64_t c, int64_t in) {
    const double angle = double(position) / std::pow(10000.0, double(2 * (c / 2)) / double(in));
    return float(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
  }
  void forward(const LayerCall& call) override {
    if (call.x.dtype != DType::f32 || call.batch == nullptr) throw std::runtime_error("sinusoidal: f32 and a batch");
    const int64_t in = call.spec->in;
    const int32_t* positions = call.batch->positions.as<int32_t>();
    const float* x = call.x.as<float>();
    float* y = call.y.as<float>();
    for (int64_t r = 0; r < call.rows; ++r) {
      for (int64_t c = 0; c < in; ++c) y[r * in + c] = x[r * in + c] + value(positions[r], c, in);
    }
  }
  void backward(const LayerCall& call) override {  // d_x = d_y, in place when they share a buffer
    if (call.d_x.data == nullptr || call.d_x.data == call.d_y.data) return;
    const int64_t n = call.rows * call.spec->in;
    const float* dy = call.d_y.as<float>();
    float* dx = call.d_x.as<float>();
    for (int64_t i = 0; i < n; ++i) dx[i] = call.input_grad == GradMode::accumulate ? dx[i] + dy[i] : dy[i];
  }
};

TEST_CASE("a position scheme from a plugin is applied where the layer says: sinusoids == learned positions holding them") {
  Fixture f;
  f.registry.add({Kind::layer,
                  "sinusoidal",
                  "1.0.0",
                  "fixed sinusoids added to the stream (test)",
                  {},
                  [](const ComponentArgs&) -> std::unique_ptr<Component> { return std::make_unique<Sinusoidal>(); },
                  "",
                  {"cpu"}},
                 "test_model");
  Golden g("tiny_gpt2");
  ModelOptions with_sinusoids = g.options();
  with_sinusoids.position = "sinusoidal";
  Model learned(g.options(), f.registry, f.run);
  Model sinus(with_sinusoids, f.registry, f.run);
  REQUIRE(sinus.table().find("wpe.weight") == nullptr);
  const ParamSlice* wpe = learned.table().find("wpe.weight");
  REQUIRE(wpe != nullptr);
  CHECK(sinus.num_params() == learned.num_params() - wpe->numel());
  // The golden parameters in both, and in the learned model's table the sinusoids.
  const auto fill = [&](Model& m, bool sinusoid_table) {
    std::vector<float> values(std::size_t(m.num_params()));
    for (const ParamSlice& s : m.table().slices) {
      if (s.name == "wpe.weight" && sinusoid_table) {
        const int64_t in = s.shape[1];
        for (int64_t p = 0; p < s.shape[0]; ++p) {
          for (int64_t c = 0; c < in; ++c) values[std::size_t(s.offset + p * in + c)] = Sinusoidal::value(p, c, in);
        }
        continue;
      }
      const NamedTensor& t = g.get("param." + s.name);
      std::memcpy(values.data() + s.offset, t.bytes.data(), t.bytes.size());
    }
    m.load_params_from_host(values);
  };
  fill(learned, true);
  fill(sinus, false);
  const Batch batch = g.batch();
  const double scale = 1.0 / double(batch.real_targets());
  learned.zero_grads();
  sinus.zero_grads();
  const double loss_learned = learned.forward_backward(batch, scale, 0);
  const double loss_sinus = sinus.forward_backward(batch, scale, 0);
  CHECK(loss_sinus == loss_learned);  // the same additions in the same order: bit for bit
  const std::vector<float> g_learned = grads_of(learned), g_sinus = grads_of(sinus);
  int64_t compared = 0;
  for (const ParamSlice& s : sinus.table().slices) {
    const ParamSlice* other = learned.table().find(s.name);
    REQUIRE(other != nullptr);
    for (int64_t i = 0; i < s.numel(); ++i) {
      REQUIRE(g_sinus[std::size_t(s.offset + i)] == g_learned[std::size_t(other->offset + i)]);
      ++compared;
    }
  }
  CHECK(compared == sinus.num_params());
  // And a loss that differs from the golden model's own learned table: the sinusoids were applied.
  Model golden(g.options(), f.registry, f.run);
  load_golden_params(golden, g);
  golden.zero_grads();
  CHECK(golden.forward_backward(batch, scale, 0) != loss_sinus);
}

TEST_CASE("GPT-2 small has 124,475,904 parameters with the vocabulary padded to 50304") {
  Fixture f;
  Model m(gpt_options(768, 12, 12, 50257, 50304, 1024, 3072), f.registry, f.run);
  CHECK(m.num_params() == 124475904);
  // Initialisation: residual projections are scaled by 1/sqrt(2L), norms are one, biases zero.
  m.init_params(1);
  const std::vector<float> p = params_of(m);
  const ParamSlice* proj = m.table().find("blocks.0.attn.o.weight");
  const ParamSlice* fc = m.table().find("blocks.0.mlp.fc.weight");
  const ParamSlice* ln = m.table().find("blocks.0.ln1.weight");
  const ParamSlice* bias = m.table().find("blocks.0.mlp.fc.bias");
  REQUIRE((proj && fc && ln && bias));
  auto stddev = [&](const ParamSlice* s) {
    double sq = 0;
    for (int64_t i = 0; i < s->numel(); ++i) sq += double(p[std::size_t(s->offset + i)]) * p[std::size_t(s->offset + i)];
    return std::sqrt(sq / double(s->numel()));
  };
  CHECK(stddev(fc) == doctest::Approx(0.02).epsilon(0.01));
  CHECK(stddev(proj) == doctest::Approx(0.02 / std::sqrt(24.0)).epsilon(0.01));
  CHECK(p[std::size_t(ln->offset)] == 1.0f);
  CHECK(p[std::size_t(bias->offset)] == 0.0f);
  CHECK_FALSE(ln->decay);
  CHECK(fc->decay);
}

TEST_CASE("the activation plan of a micro-batch that does not fit is known without allocating it") {
  Fixture f;
  Model m(gpt_options(256, 4, 4, 50257, 50304, 1024, 1024), f.registry, f.run);
  const int64_t state = m.device().memory_in_use();
  CHECK(state >= m.state_bytes());
  const auto rss_kib = [] {
    long pages = 0, resident = 0;
    if (FILE* file = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(file, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(file);
    }
    return int64_t(resident) * int64_t(sysconf(_SC_PAGE_SIZE)) / 1024;
  };
  const int64_t rss_before = rss_kib();
  // 64 rows of 1024 positions: the residual stream alone is 64*1024*256 floats per block.
  const ActivationPlan big = m.activation_plan(64, 1024);
  CHECK(big.bytes() > int64_t(4) << 30);
  CHECK(m.device().memory_in_use() == state);  // nothing allocated through the device
  CHECK(rss_kib() - rss_before < 64 * 1024);   // nor anywhere else in the process
  // What a shape's plan says is what training that shape allocates.
  const ActivationPlan small = m.activation_plan(1, 16);
  const Batch b = one_row(16);
  m.init_params(3);
  m.forward_backward(b, 1.0 / 16, 0);
  const int64_t grown = m.device().memory_in_use() - state;
  CHECK(grown >= small.bytes());
  CHECK(grown < small.bytes() + 128);  // the cpu device rounds each buffer up to 64 bytes plus a header
}

TEST_CASE("activations are held in bf16 only where every layer touching them takes bf16: none with the CPU layers") {
  // run.dtype = "bf16" reaches the model (the config refuses it on the cpu before; the Model itself
  // only asks its layers): the CPU layers take no bf16 views, so every slot stays f32, the plan is
  // fp32's and the losses and gradients are the same bits.
  Fixture f;
  const ModelOptions o = gpt_options(16, 2, 2, 50, 64, 8, 32);
  RunContext bf16_run = f.run;
  bf16_run.dtype = "bf16";
  Model a(o, f.registry, f.run), b(o, f.registry, bf16_run);
  CHECK(a.activation_plan(2, 8).elements == b.activation_plan(2, 8).elements);
  CHECK(b.params_bf16().numel() == b.num_params());  // the weight copy is made all the same
  a.init_params(5);
  b.init_params(5);
  const Batch batch = one_row(8);
  CHECK(a.forward_backward(batch, 0.125, 0) == b.forward_backward(batch, 0.125, 0));
  std::vector<float> ga, gb;
  a.copy_grads_to_host(ga);
  b.copy_grads_to_host(gb);
  CHECK(ga == gb);
}

TEST_CASE("a batch with a token or target outside the vocabulary is refused before any device sees it") {
  Fixture f;
  Model m(gpt_options(16, 1, 2, 50, 64, 8, 32), f.registry, f.run);
  m.init_params(1);
  const auto batch = [](int32_t token, int32_t target) {
    Batch b = one_row(4);
    b.tokens[2] = token;
    b.targets[3] = target;
    return b;
  };
  CHECK(std::isfinite(m.forward(batch(7, -1))));  // -1: no loss at that position
  CHECK_THROWS_WITH_AS(m.forward(batch(50, 1)), doctest::Contains("token 50 outside the vocabulary of 50"), Error);
  CHECK_THROWS_WITH_AS(m.forward_backward(batch(7, 50), 1.0, 0), doctest::Contains("target 50 outside the vocabulary of 50"), Error);
  CHECK_THROWS_WITH_AS(m.forward(batch(7, -2)), doctest::Contains("target -2"), Error);
}

TEST_CASE("gradient_writes: every parameter written, and each range final when the hook reports it (tied and untied)") {
  // tiny_gpt2 ties its embedding to the classifier; tiny_llama does not.
  for (const char* name : {"tiny_gpt2", "tiny_llama"}) {
    INFO(name);
    Fixture f;
    Golden g(name);
    Model m(g.options(), f.registry, f.run);
    load_golden_params(m, g);
    const std::vector<GradRange>& writes = m.gradient_writes();
    REQUIRE(writes.size() >= 3);
    // Coverage: each element is written once, except a tied embedding's, written twice.
    std::vector<int> times(std::size_t(m.num_params()), 0);
    for (const GradRange& w : writes) {
      REQUIRE(0 <= w.begin);
      REQUIRE(w.begin < w.end);
      REQUIRE(w.end <= m.num_params());
      for (int64_t i = w.begin; i < w.end; ++i) ++times[std::size_t(i)];
    }
    const bool tied = std::string(name) == "tiny_gpt2";
    for (int64_t i = 0; i < m.num_params(); ++i) {
      const bool in_head = i >= writes[0].begin && i < writes[0].end;
      CHECK(times[std::size_t(i)] == (tied && in_head ? 2 : 1));
    }
    // The hook runs once per write, in order; a range that no later write touches is final then.
    const Batch b = g.batch();
    std::vector<std::vector<float>> at_hook;
    std::vector<std::size_t> order;
    m.zero_grads();
    m.set_gradient_hook([&](std::size_t k) {
      order.push_back(k);
      at_hook.push_back(grads_of(m));
    });
    m.forward_backward(b, 1.0 / double(b.real_targets()), 0);
    m.set_gradient_hook({});
    const std::vector<float> final_grads = grads_of(m);
    REQUIRE(order.size() == writes.size());
    for (std::size_t k = 0; k < order.size(); ++k) CHECK(order[k] == k);
    for (std::size_t k = 0; k < writes.size(); ++k) {
      bool later = false;
      for (std::size_t j = k + 1; j < writes.size(); ++j) later |= writes[j].begin < writes[k].end && writes[k].begin < writes[j].end;
      if (later) continue;
      int64_t differing = 0;
      for (int64_t i = writes[k].begin; i < writes[k].end; ++i) differing += at_hook[k][std::size_t(i)] != final_grads[std::size_t(i)];
      CHECK_MESSAGE(differing == 0, "write " << k << " changed after its hook");
    }
    // And the hook is not called outside training.
    std::size_t calls = 0;
    m.set_gradient_hook([&](std::size_t) { ++calls; });
    m.forward(b);
    m.set_gradient_hook({});
    CHECK(calls == 0);
  }
}
