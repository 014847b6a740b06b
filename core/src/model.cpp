// Model assembly: the layer plugins wired into a decoder-only transformer, its flat parameter and
// gradient buffers and activation arena on the model's device, the activation plan, and the
// forward/backward schedule (see model.hpp and model_schedule.hpp).
#include "ablate/runtime/model.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "ablate/runtime/run_spec.hpp"
#include "ablate/error.hpp"
#include "ablate/mix.hpp"
#include "ablate/runtime/registry.hpp"
#include "model_layers.hpp"
#include "model_plan.hpp"
#include "model_nf4.hpp"
#include "model_schedule.hpp"

namespace ablate {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// [adapter]: the targets must be projections the model has, each named once.
void read_adapter(const Choice& a, ModelOptions& o) {
  o.adapter = a.name;
  o.adapter_common = a.common;
  o.adapter_own = a.own;
  o.adapter_targets = a.common.get_string_list("targets");
  o.base_dtype = a.common.get_string("base_dtype");
  if (o.adapter_targets.empty()) throw_input_error("adapter.targets", "names no layer: give one or more of q, k, v, o");
  std::vector<std::string> seen;
  for (const std::string& t : o.adapter_targets) {
    if (std::find(std::begin(schedule::kAdapterTargets), std::end(schedule::kAdapterTargets), t) ==
        std::end(schedule::kAdapterTargets)) {
      const bool mlp = t == "up" || t == "down" || t == "gate" || t == "fc" || t == "proj" || t == "mlp";
      throw_input_error("adapter.targets",
                        "'" + t + "' is not a projection adapters attach to (q, k, v, o)" +
                            (mlp ? std::string(": the MLP is one fused layer (model.mlp), its inner products are not "
                                               "separate layers")
                                 : std::string()));
    }
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) throw_input_error("adapter.targets", "'" + t + "' is named twice");
    seen.push_back(t);
  }
}

}  // namespace

ModelOptions ModelOptions::from(const RunSpec& spec, int64_t data_vocab) {
  const Params& m = spec.model.keys;
  ModelOptions o;
  o.model_common = m;
  o.layer_own = spec.model.layer_own;
  o.d_model = m.get_int("d_model");
  o.n_layers = m.get_int("n_layers");
  o.n_heads = m.get_int("n_heads");
  o.n_kv_heads = m.get_int("n_kv_heads") == 0 ? o.n_heads : m.get_int("n_kv_heads");
  if (o.d_model % o.n_heads != 0) {
    throw_input_error("model.n_heads",
                      "d_model (" + std::to_string(o.d_model) + ") must be divisible by n_heads (" + std::to_string(o.n_heads) + ")");
  }
  if (o.n_heads % o.n_kv_heads != 0) {
    throw_input_error("model.n_kv_heads", "n_heads (" + std::to_string(o.n_heads) + ") must be divisible by n_kv_heads (" +
                                              std::to_string(o.n_kv_heads) + ")");
  }
  o.head_dim = o.d_model / o.n_heads;
  o.vocab_size = m.get_int("vocab_size") == 0 ? data_vocab : m.get_int("vocab_size");
  if (o.vocab_size <= 0) throw_input_error("model.vocab_size", "must be set: the data source does not say its vocabulary");
  if (data_vocab > o.vocab_size) {
    throw_input_error("model.vocab_size",
                      std::to_string(o.vocab_size) + " is smaller than the data's vocabulary (" + std::to_string(data_vocab) + ")");
  }
  o.vocab_padded = round_up(o.vocab_size, m.get_int("vocab_multiple"));
  o.recompute = spec.run.recompute;
  o.max_seq_len = m.get_int("max_seq_len");
  o.norm = m.get_string("norm");
  o.mlp = m.get_string("mlp");
  o.position = m.get_string("position");
  o.qk_norm = m.get_bool("qk_norm");
  o.bias = m.get_bool("bias");
  o.tie_embeddings = m.get_bool("tie_embeddings");
  o.dropout = m.get_float("dropout");
  o.norm_eps = m.get_float("norm_eps");
  o.embedding = m.get_string("embedding_layer");
  o.linear = m.get_string("projection_layer");
  o.classifier = m.get_string("classifier_layer");
  o.qk_norm_layer = m.get_string("qk_norm_layer");
  o.mlp_hidden = m.get_int("mlp_hidden");  // 0: the MLP layer's default, filled in by the model
  // Each key is bounded by its schema; their products are checked here, in floating point, before
  // any plan multiplies them in 64-bit integers: nothing near 2^50 values fits any machine (an
  // MLP of unset width counted as 4 x d_model, the default's order).
  const double width = double(o.d_model), blocks = double(o.n_layers);
  const double hidden = o.mlp_hidden > 0 ? double(o.mlp_hidden) : 4.0 * width;
  const double params = 2.0 * double(o.vocab_padded) * width + blocks * (4.0 * width * width + 3.0 * width * hidden);
  if (params > 0x1p50) {
    throw_input_error("model", "d_model " + std::to_string(o.d_model) + ", n_layers " + std::to_string(o.n_layers) + ", vocabulary " +
                                   std::to_string(o.vocab_padded) + " and mlp_hidden " + std::to_string(int64_t(hidden)) +
                                   " make about " + std::to_string(params) + " parameters: more than any device holds");
  }
  if (spec.model.adapter.present) read_adapter(spec.model.adapter, o);
  if (spec.model.has_attention) {
    o.attention = spec.model.attention.name;
    o.attention_common = spec.model.attention.common;
    o.attention_own = spec.model.attention.own;
  }
  return o;
}

std::string ModelOptions::describe() const {
  std::ostringstream s;
  s << "d_model=" << d_model << " n_layers=" << n_layers << " n_heads=" << n_heads << " n_kv_heads=" << n_kv_heads
    << " vocab=" << vocab_size << "(" << vocab_padded << ") max_seq_len=" << max_seq_len << " norm=" << norm << " mlp=" << mlp << "("
    << mlp_hidden << ") position=" << position << " qk_norm=" << qk_norm << " bias=" << bias << " tie=" << tie_embeddings
    << " attention=" << attention;
  if (norm_eps > 0) s << " norm_eps=" << norm_eps;  // only when set: the text older checkpoints hold stays the same
  if (!adapter.empty()) {                           // after attention: init_from compares the text before it (the base's shape)
    s << " adapter=" << adapter << "(" << adapter_keys_text << (adapter_keys_text.empty() ? "" : ",") << "targets=";
    for (std::size_t i = 0; i < adapter_targets.size(); ++i) s << (i ? "+" : "") << adapter_targets[i];
    if (base_dtype != "fp32") s << ",base=" << base_dtype;
    s << ")";
  }
  return s.str();
}


// ---------------------------------------------------------------------------------------------

using schedule::ArenaPlan;
using schedule::in_block;
using schedule::Op;
using schedule::Ref;
using schedule::shared;
using schedule::Site;
using schedule::Slot;

namespace {

// Checked before any device sees the batch: a GPU kernel can only turn a bad id into NaN.
void check_batch(const ModelOptions& o, const Batch& b) {
  if (b.seq_len > o.max_seq_len) {
    throw_input_error("model.max_seq_len",
                      "rows of " + std::to_string(b.seq_len) + " positions exceed max_seq_len " + std::to_string(o.max_seq_len));
  }
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= o.vocab_size) {
      throw_runtime_error("model", "token " + std::to_string(t) + " outside the vocabulary of " + std::to_string(o.vocab_size));
    }
  }
  for (int32_t t : b.targets) {
    if (t != -1 && (t < 0 || t >= o.vocab_size)) {
      throw_input_error("model", "target " + std::to_string(t) + " outside the vocabulary of " + std::to_string(o.vocab_size) +
                                     " (and not -1, no loss)");
    }
  }
}

}  // namespace

// The assembled model: its device, layers and activation arena (model_layers.hpp), the schedule they were
// wired into, its parameter buffers, and the two passes over the schedule. What the schedule, the
// arena layout and the bf16 policy are lives in model_schedule.hpp and model_plan.hpp.
// The layers' scaling state (LayerBase::scaling_state_elements): every site's part of one buffer.
struct SiteScaling {
  Buffer values;            // f32, zeros at first (none: empty)
  std::vector<int64_t> at;  // per site: where its part starts (-1: none)
  void allocate(Device& device, const std::vector<Site>& sites) {
    int64_t n = 0;
    for (const Site& s : sites) {
      const int64_t k = s.op == Op::layer ? s.layer->scaling_state_elements(*s.spec) : 0;
      at.push_back(k > 0 ? n : -1);
      n += k;
    }
    if (n > 0) values = device.alloc(DType::f32, n);
  }
  TensorView of(const std::vector<Site>& sites, const Site& s) const {
    const int64_t i = at.empty() ? -1 : at[std::size_t(&s - sites.data())];
    return i < 0 ? TensorView{} : values.view(i, s.layer->scaling_state_elements(*s.spec));
  }
  // Model::end_step: each site's layer steps its part.
  void end_step(Device& device, const std::vector<Site>& sites) const {
    for (const Site& s : sites) {
      const TensorView state = of(sites, s);
      if (state.data == nullptr) continue;
      LayerCall c;
      c.spec = s.spec;
      c.scaling_state = state;
      c.stream = device.stream();
      s.layer->end_step(c);
    }
  }
  // Model::scaling_report: the state read once into host memory, each site's report added.
  ScalingReport report(Device& device, const std::vector<Site>& sites) const {
    ScalingReport out;
    if (values.count() == 0) return out;
    std::vector<float> host(std::size_t(values.count()));
    device.download(host.data(), values.view());
    for (std::size_t i = 0; i < sites.size(); ++i) {
      if (at[i] < 0) continue;
      const ScalingReport r = sites[i].layer->scaling_report(*sites[i].spec, host.data() + at[i]);
      out.saturated += r.saturated;
      out.worst = std::max(out.worst, r.worst);
    }
    return out;
  }
};

// The layers' weight caches (LayerBase::weight_cache_bytes): every site's part of one buffer, the
// classifier's last, and which of them were called since the parameters last changed
// (LayerCall::weights_unchanged).
struct SiteWeightCache {
  Buffer bytes;                 // f32 elements holding each part (none: empty)
  std::vector<int64_t> at;      // per site, then the classifier: where its part starts, in f32 elements (-1: none)
  std::vector<uint64_t> calls;  // likewise: the parameters' version at its last call (0: never)
  uint64_t version = 1;         // the parameters' version: every change makes a new one
  void allocate(Device& device, const std::vector<Site>& sites, const LayerBase& classifier, const LayerSpec& classifier_spec) {
    int64_t n = 0;
    const auto part = [&](int64_t bytes) {
      const int64_t k = (bytes + 255) / 256 * 64;  // 256-byte parts
      at.push_back(k > 0 ? n : -1);
      n += k;
    };
    for (const Site& s : sites) part(s.op == Op::layer ? s.layer->weight_cache_bytes(*s.spec) : 0);
    part(classifier.weight_cache_bytes(classifier_spec));
    calls.assign(at.size(), 0);
    if (n > 0) bytes = device.alloc(DType::f32, n);
  }
  // Site s's part and whether its last call saw these parameters; from now on it has.
  void set(LayerCall& c, const std::vector<Site>& sites, const Site& s) {
    set_part(c, std::size_t(&s - sites.data()), *s.layer, *s.spec);
  }
  void set_classifier(LayerCall& c, const LayerBase& classifier, const LayerSpec& spec) {
    if (!at.empty()) set_part(c, at.size() - 1, classifier, spec);
  }

 private:
  void set_part(LayerCall& c, std::size_t i, const LayerBase& layer, const LayerSpec& spec) {
    if (at.empty() || at[i] < 0) return;
    c.weight_cache = bytes.view(at[i], (layer.weight_cache_bytes(spec) + 3) / 4);
    c.weights_unchanged = calls[i] == version;
    calls[i] = version;
  }
};

namespace {

bool overlap(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr) return false;
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.numel() * int64_t(dtype_size(b.dtype)) && b0 < a0 + a.numel() * int64_t(dtype_size(a.dtype));
}

// LayerCall::x_unchanged for site s of `sites`, whose x is `x` (N positions): the call just before
// it on the stream (forward: the previous site's, backward: the next site's) was the same layer at
// the same width reading the same x, with no adapter after it, and writing no part of x (its y,
// and backward its d_x).
bool x_unchanged(const std::vector<Site>& sites, const Site& s, bool backward, const TensorView& x, const ActivationArena& arena,
                 int64_t N) {
  const std::size_t i = std::size_t(&s - sites.data());
  if (x.data == nullptr || (backward ? i + 1 >= sites.size() : i == 0)) return false;
  const Site& p = sites[backward ? i + 1 : i - 1];
  if (p.op != Op::layer || p.layer != s.layer || p.adapter_param >= 0 || p.x_cols != s.x_cols || p.row_heads != s.row_heads) {
    return false;
  }
  const int64_t rows = N * p.row_heads;
  const TensorView px = arena.arena(p.x, rows, p.x_cols);
  if (px.data != x.data || px.dtype != x.dtype) return false;
  return !overlap(arena.arena(p.y, rows, p.y_cols), x) && !(backward && overlap(arena.arena(p.d_x, rows, p.x_cols), x));
}

// A call's x, y and their gradients as (N, heads, head_dim) views (rope works on each head of q, k).
void as_heads(LayerCall& c, int64_t N, int64_t heads, int64_t head_dim) {
  for (TensorView* t : {&c.x, &c.y, &c.d_y, &c.d_x}) {
    if (t->data == nullptr) continue;
    t->ndim = 3;
    t->shape = {N, heads, head_dim, 0};
  }
}

// A micro-batch onto the model's device (Model::Impl `m`'s arena sized for it first): before each
// forward pass, or before a captured step (Model::upload_batch).
template <class Impl>
void put_batch(Impl& m, const Batch& b) {
  check_batch(m.o, b);
  m.prepare(b.rows, b.seq_len);
  m.timed("batch upload", "", [&] { m.device->upload_batch(b, m.batch); });
}

}  // namespace

struct Model::Impl : ModelDevice, ModelLayerSet, ActivationArena {
  OpTimes* op_times = nullptr;  // per-op timing (run.profile_steps), else null
  // Runs f, timed as `op` with the device synchronised on both sides when profiling.
  template <class F>
  void timed(const char* op, const char* pass, F&& f) {
    if (op_times == nullptr) {
      f();
      return;
    }
    device->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    device->synchronize();
    op_times->add(std::string(op) + pass, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  ModelOptions o;
  RunContext run;
  schedule::LayerSpecs specs;
  ParamTable table;
  ParamTable trainable;  // the adapters' slices, offsets from sched.adapter_begin (no adapter: unused)
  int64_t frozen = 0;    // the frozen base's parameters (sched.adapter_begin), 0 when everything trains
  schedule::Schedule sched;
  std::function<void(std::size_t)> gradient_hook;  // called after each gradient write in forward_backward
  schedule::Bf16Policy bf16;                       // which activations are held in bf16

  Buffer params, grads;             // (P, less the NF4 tensors) f32, (P - frozen) f32
  Buffer params_bf16;               // (P) bf16 copy of params for bf16 products (run.dtype = "bf16"), else empty
  SiteScaling scaling;              // every site's LayerCall::scaling_state
  mutable SiteWeightCache weights;  // every site's LayerCall::weight_cache (call_of records the call)
  schedule::Nf4Base nf4;            // [adapter] base_dtype = "nf4": the base's linear and MLP weights (model_nf4.hpp)
  DeviceBatch batch;                // the micro-batch on the device

  // The adapters' region for N rows: offsets of each adapter's saved values, then of the scratch
  // they share, then the end (elements of the call's dtype, f32).
  std::vector<int64_t> adapter_layout(int64_t N) const;

  AttentionProblem problem(int64_t rows, int64_t T) const {
    AttentionProblem p;
    p.batch = int32_t(rows);
    p.seq_len = int32_t(T);
    p.heads = int32_t(o.n_heads);
    p.kv_heads = int32_t(o.n_kv_heads);
    p.head_dim = int32_t(o.head_dim);
    p.dtype = DType::f32;
    p.device = device->type();
    p.packed = true;
    p.bf16_out = bf16.attention_out;
    p.bf16_qkv = bf16.qkv;
    p.bf16_grads = bf16.grads;
    return p;
  }

  // ---- the activation plan ----

  // What the layers ask for at a shape, for schedule::plan_arena.
  schedule::SavedSizes saved_sizes(int64_t rows, int64_t T) const {
    const int64_t N = rows * T;
    schedule::SavedSizes s;
    s.norm = norm->activation_elements(specs.norm, N);
    if (o.qk_norm) {
      s.q_norm = qkn->activation_elements(specs.qkn, N * o.n_heads);
      s.k_norm = qkn->activation_elements(specs.qkn, N * o.n_kv_heads);
    }
    s.attention = attn->saved_elements(problem(rows, T));
    s.mlp = mlp->activation_elements(specs.mlp, N);
    s.mlp_bf16 = mlp->activation_bf16_elements(specs.mlp, N);
    for (const Site& site : sched.sites) {
      if (site.op == Op::layer) s.scratch = std::max(s.scratch, site.layer->scratch_elements(*site.spec, N * site.row_heads));
    }
    s.scratch = std::max(s.scratch, cls->scratch_elements(specs.cls, N));
    return s;
  }

  // The arena for a shape under a recompute mode (the run's, or another to say what it would save).
  ArenaPlan make_plan(int64_t rows, int64_t T, const std::string& recompute) const {
    const schedule::PlanShape shape{o.n_layers, o.d_model, o.n_heads, o.n_kv_heads, o.head_dim, o.qk_norm};
    return schedule::plan_arena(shape, bf16, recompute, rows, T, saved_sizes(rows, T));
  }

  // Lays the arena out for a shape (ActivationArena::lay_out: it only grows).
  void prepare(int64_t rows, int64_t T) {
    if (plan.rows == rows && plan.seq_len == T) return;
    lay_out(*device, make_plan(rows, T, o.recompute), adapter ? adapter_layout(rows * T) : std::vector<int64_t>{});
  }

  // ---- views ----

  TensorView param_tail(const Buffer& b, int64_t off) const { return b.view(off, table.total - off); }

  // The parameters from table offset `off` on, as a layer reads them (past an NF4 base's tensors).
  TensorView param_view(int64_t off) const { return params.view(nf4.stored(off), params.count() - nf4.stored(off)); }

  LayerCall call_of(const Site& s, bool backward) const;

  // The classifier's call over the final norm's output (with d(lnf) into d_ln when training).
  LayerCall classifier_call(int64_t N, bool train, double grad_scale, TensorView logits) const;

  // The adapter's call on site s (a projection it sits on): the projection's x and y (forward) or
  // d_y and d_x (backward, d_x added to), its own parameters, saved values and dropout.
  LayerCall adapter_call(const Site& s, bool backward, bool train, uint64_t key) const;
  // Adapter dropout keys are numbered from here, past any layer's dropout site.
  static constexpr uint64_t kAdapterDropoutSites = uint64_t(1) << 40;

  // ---- the passes ----

  void set_dropout(LayerCall& c, const Site& s, bool train, uint64_t key) const {
    if (s.dropout_site == 0 || !train) return;
    c.dropout = o.dropout;
    c.dropout_key = mix64(key, s.dropout_site);
  }

  void attention_site(const Site& s, const AttentionProblem& prob, bool backward, const char* pass) {
    AttentionCall c;
    c.problem = &prob;
    c.batch = &batch.views;
    c.q = heads4(s.attn.q, o.n_heads);
    c.k = heads4(s.attn.k, o.n_kv_heads);
    c.v = heads4(s.attn.v, o.n_kv_heads);
    c.out = heads4(s.attn.out, o.n_heads);
    c.saved = act.view(plan.at(s.attn.saved), attn->saved_elements(prob));
    c.stream = device->stream();
    if (backward) {
      c.d_out = heads4(s.attn.d_out, o.n_heads);
      c.d_q = heads4(s.attn.d_q, o.n_heads);
      c.d_k = heads4(s.attn.d_k, o.n_kv_heads);
      c.d_v = heads4(s.attn.d_v, o.n_kv_heads);
    }
    timed("attention", pass, [&] { backward ? attn->backward(c) : attn->forward(c); });
  }

  // One site's forward call (`pass` names it in the op profile: " fwd", or " recompute").
  void forward_site(const Site& s, const AttentionProblem& prob, bool train, uint64_t key, const char* pass) {
    if (s.op == Op::attention) return attention_site(s, prob, false, pass);
    LayerCall c = call_of(s, false);
    set_dropout(c, s, train, key);
    timed(to_string(s.layer->role()), pass, [&] { s.layer->forward(c); });
    if (s.adapter_param >= 0) timed("adapter", pass, [&] { adapter->forward(adapter_call(s, false, train, key)); });
  }

  // Before block l's backward: its recomputed slots filled again by its forward sites (all of them
  // for "block", the MLP for "mlp"; the MLP also rewrites res of block l + 1, with the same bits).
  // The last block's are still there from the forward pass.
  void recompute_block(int64_t l, const AttentionProblem& prob, uint64_t key) {
    if (o.recompute == "none" || l == o.n_layers - 1) return;
    const auto [first, last] = sched.block_sites[std::size_t(l)];
    for (std::size_t i = o.recompute == "block" ? first : last; i <= last; ++i) {
      forward_site(sched.sites[i], prob, true, key, " recompute");
    }
  }

  // The whole forward pass up to (and including) the classifier. Training: dropout on, and the
  // classifier writes d(lnf) into d_ln. The loss sum is returned, or with `loss_sum` given left in
  // it on the device (added to it when `add`) and 0 returned.
  double run_forward(const Batch& b, bool train, double grad_scale, uint64_t key, TensorView logits, TensorView loss_sum = {},
                     bool add = false) {
    if (std::exchange(uploaded, nullptr) != &b) put_batch(*this, b);
    const AttentionProblem prob = problem(b.rows, b.seq_len);
    for (const Site& s : sched.sites) forward_site(s, prob, train, key, " fwd");
    const int64_t N = int64_t(b.rows) * b.seq_len;
    LayerCall c = classifier_call(N, train, grad_scale, logits);
    timed("classifier", "", [&] { cls->loss(c); });
    if (train && gradient_hook && frozen == 0) gradient_hook(0);  // a frozen head writes no gradient
    double sum = 0;
    const TensorView losses = act.view(plan.at(shared(Slot::losses)), N);
    timed("loss sum", "", [&] {
      if (loss_sum.data != nullptr) device->masked_loss_sum_to(losses, batch.views.targets, loss_sum, add);
      else sum = device->masked_loss_sum(losses, batch.views.targets);
    });
    return sum;
  }

  void run_backward(uint64_t key);

  void allocate();
};

std::vector<int64_t> Model::Impl::adapter_layout(int64_t N) const {
  std::vector<int64_t> at{0};
  int64_t scratch = 0;
  for (const Site& s : sched.sites) {
    if (s.adapter_param < 0) continue;
    at.push_back(at.back() + adapter->activation_elements(*s.spec, N));
    scratch = std::max(scratch, adapter->scratch_elements(*s.spec, N));
  }
  at.push_back(at.back() + scratch);
  return at;
}

LayerCall Model::Impl::call_of(const Site& s, bool backward) const {
  const int64_t N = plan.rows * plan.seq_len, rows = N * s.row_heads;
  LayerCall c;
  c.spec = s.spec;
  c.batch = &batch.views;
  c.rows = rows;
  c.heads = s.heads;
  c.x = arena(s.x, rows, s.x_cols);
  c.y = arena(s.y, rows, s.y_cols);
  if (!backward) c.residual = arena(s.residual, rows, s.y_cols);
  c.saved = arena_tail(s.saved);
  c.scratch = arena(shared(Slot::scratch), plan.scratch_elements, 1);
  c.stream = device->stream();
  if (s.param >= 0) c.params = nf4.site_params(s, params, table, *device);
  if (s.param >= 0 && params_bf16.count() > 0) c.params_bf16 = param_tail(params_bf16, s.param);
  c.scaling_state = scaling.of(sched.sites, s);
  c.x_unchanged = x_unchanged(sched.sites, s, backward, c.x, *this, N);
  weights.set(c, sched.sites, s);
  if (backward) {
    if (s.param >= 0 && frozen == 0) c.grads = param_tail(grads, s.param);
    c.d_y = arena(s.d_y, rows, s.y_cols);
    c.d_x = arena(s.d_x, rows, s.x_cols);
    c.input_grad = s.input_grad;
  }
  if (s.layer->role() == LayerRole::position && s.spec->in != s.x_cols) as_heads(c, N, s.heads, o.head_dim);  // rope
  return c;
}

LayerCall Model::Impl::classifier_call(int64_t N, bool train, double grad_scale, TensorView logits) const {
  LayerCall c;
  c.spec = &specs.cls;
  c.batch = &batch.views;
  c.rows = N;
  c.x = arena(shared(Slot::lnf), N, o.d_model);
  c.params = param_view(sched.head);
  if (params_bf16.count() > 0) c.params_bf16 = param_tail(params_bf16, sched.head);
  c.losses = arena(shared(Slot::losses), N, 1);
  c.scratch = arena(shared(Slot::scratch), plan.scratch_elements, 1);
  c.stream = device->stream();
  c.logits = logits;
  weights.set_classifier(c, *cls, specs.cls);
  if (train) {
    if (frozen == 0) c.grads = param_tail(grads, sched.head);
    c.d_x = arena(shared(Slot::d_ln), N, o.d_model);
    c.grad_scale = grad_scale;
  }
  return c;
}

LayerCall Model::Impl::adapter_call(const Site& s, bool backward, bool train, uint64_t key) const {
  const int64_t N = plan.rows * plan.seq_len;
  const std::size_t i = std::size_t(s.adapter_index);
  LayerCall c;
  c.spec = s.spec;
  c.batch = &batch.views;
  c.rows = N;
  c.x = arena(s.x, N, s.x_cols);
  c.y = arena(s.y, N, s.y_cols);
  c.params = param_view(s.adapter_param);
  c.saved = adapter_saved(i);
  c.scratch = adapter_scratch();
  c.stream = device->stream();
  if (train && adapter->input_dropout() > 0) {
    c.dropout = adapter->input_dropout();
    c.dropout_key = mix64(key, kAdapterDropoutSites + i);
  }
  if (backward) {
    c.grads = grads.view(s.adapter_param - frozen, table.total - s.adapter_param);
    c.d_y = arena(s.d_y, N, s.y_cols);
    c.d_x = arena(s.d_x, N, s.x_cols);
    c.input_grad = GradMode::accumulate;
  }
  return c;
}

void Model::Impl::run_backward(uint64_t key) {
  const AttentionProblem prob = problem(plan.rows, plan.seq_len);
  std::size_t write = frozen == 0 ? 1 : 0;  // gradient_writes() index of the next site that writes gradients
  int64_t block = o.n_layers - 1;           // the next block backward enters
  for (std::size_t i = sched.sites.size(); i-- > 0;) {
    const Site& s = sched.sites[i];
    if (block >= 0 && i == sched.block_sites[std::size_t(block)].second) recompute_block(block--, prob, key);
    if (s.op == Op::attention) {
      attention_site(s, prob, true, " bwd");
      continue;
    }
    LayerCall c = call_of(s, true);
    set_dropout(c, s, true, key);
    timed(to_string(s.layer->role()), " bwd", [&] { s.layer->backward(c); });
    if (s.param >= 0 && frozen == 0) {
      if (gradient_hook) gradient_hook(write);
      ++write;
    }
    if (s.adapter_param >= 0) {  // after the projection's backward, which wrote its part of d_x
      timed("adapter", " bwd", [&] { adapter->backward(adapter_call(s, true, true, key)); });
      if (gradient_hook) gradient_hook(write);
      ++write;
    }
  }
}

// The flat buffers, refused by size before anything is allocated (the run's full plan is checked
// later, with the optimizer and the activations): values and gradients alone must fit the device.
void Model::Impl::allocate() {
  const int64_t capacity = device->memory_capacity();
  if (capacity > 0 && double(table.total) * 8.0 > double(capacity)) {
    throw_input_error("model", std::to_string(table.total) + " parameters need " +
                                   std::to_string(int64_t(double(table.total) * 8.0 / double(1 << 20))) +
                                   " MiB for their values and gradients alone; " + device->describe() + " holds " +
                                   std::to_string(capacity / (1 << 20)) + " MiB");
  }
  params = device->alloc(DType::f32, table.total - nf4.values());
  grads = device->alloc(DType::f32, table.total - frozen);
  nf4.allocate(*device);
  if (holds_bf16(run.dtype)) params_bf16 = device->alloc(DType::bf16, table.total);
  scaling.allocate(*device, sched.sites);
  weights.allocate(*device, sched.sites, *cls, specs.cls);
}

// Tests: the device run.device names, without Session::device's run.dtype check (a model's own
// bf16 handling is tested on the cpu).
Model::Model(const ModelOptions& options, const Registry& registry, const RunContext& run)
    : Model(options, registry, run, [&] {
        static const Params empty{"run", {}};
        return registry.create<Device>(Kind::device, run.device, {empty, empty, run}, "run.device");
      }()) {}

Model::Model(const ModelOptions& options, const Registry& registry, const RunContext& run, std::unique_ptr<Device> device)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.o = options;
  m.run = run;
  m.device = std::move(device);
  m.head_dim = m.o.head_dim;
  m.sched = m.declare(registry, m.o, run, m.specs, m.table);
  m.bf16 = m.bf16_policy(m.o, run);
  if (m.adapter) {
    m.frozen = m.sched.adapter_begin;
    for (const ParamSlice& s : m.table.slices) {
      if (s.offset < m.frozen) continue;
      ParamSlice t = s;
      t.offset -= m.frozen;
      m.trainable.slices.push_back(std::move(t));
    }
    m.trainable.total = m.table.total - m.frozen;
  }
  if (m.o.base_dtype == "nf4" && run.dtype != "fp32") {
    throw_input_error("adapter.base_dtype",
                      "nf4 weights are dequantized for fp32 products: run.dtype must be \"fp32\", not \"" + run.dtype + "\"");
  }
  m.nf4.plan(m.o.base_dtype == "nf4", m.table, m.sched, m.lin.get(), m.mlp.get());
  m.allocate();
}

Model::~Model() = default;

int64_t Model::count_params(const ModelOptions& options, const Registry& registry, const RunContext& run) {
  ModelLayerSet layers;
  ModelOptions o = options;
  schedule::LayerSpecs specs;
  ParamTable table;
  layers.declare(registry, o, run, specs, table);
  return table.total;
}

const ModelOptions& Model::options() const noexcept { return impl_->o; }
const ParamTable& Model::table() const noexcept { return impl_->table; }
int64_t Model::num_params() const noexcept { return impl_->table.total; }
int64_t Model::num_trainable() const noexcept { return impl_->table.total - impl_->frozen; }
int64_t Model::frozen_params() const noexcept { return impl_->frozen; }
const ParamTable& Model::trainable_table() const noexcept { return impl_->frozen > 0 ? impl_->trainable : impl_->table; }
TensorView Model::trainable_params() { return impl_->params.view(impl_->nf4.stored(impl_->frozen), num_trainable()); }
int64_t Model::nf4_params() const noexcept { return impl_->nf4.values(); }
int64_t Model::nf4_bytes() const noexcept { return impl_->nf4.nf4_bytes(); }
Device& Model::device() noexcept { return *impl_->device; }
TensorView Model::params() { return impl_->params.view(); }
TensorView Model::grads() { return impl_->grads.view(); }
TensorView Model::params_bf16() { return impl_->params_bf16.count() > 0 ? impl_->params_bf16.view() : TensorView{}; }
int64_t Model::state_bytes() const noexcept {
  const Impl& m = *impl_;
  return m.params.bytes() + m.grads.bytes() + m.params_bf16.bytes() + m.nf4.bytes() + m.scaling.values.bytes() +
         m.weights.bytes.bytes();
}

TensorView Model::scaling_state() { return impl_->scaling.values.count() > 0 ? impl_->scaling.values.view() : TensorView{}; }

ScalingReport Model::scaling_report() { return impl_->scaling.report(*impl_->device, impl_->sched.sites); }
void Model::end_step() { impl_->scaling.end_step(*impl_->device, impl_->sched.sites); }

void Model::params_changed(bool bf16_copy_written) {
  Impl& m = *impl_;
  ++m.weights.version;
  if (m.params_bf16.count() > 0 && !bf16_copy_written) m.device->to_bf16(m.params_bf16.view(), m.params.view());
}

void Model::copy_params_to_host(std::vector<float>& out) {
  Impl& m = *impl_;
  out.resize(std::size_t(num_params()));
  if (m.nf4.empty()) {
    m.device->download(out.data(), params());
    return;
  }
  m.nf4.download(*m.device, m.params, m.table, out);  // the NF4 tensors dequantized: what the products compute with
}

void Model::copy_grads_to_host(std::vector<float>& out) {
  out.resize(std::size_t(num_trainable()));
  impl_->device->download(out.data(), grads());
}

void Model::load_params_from_host(const std::vector<float>& values) {
  if (int64_t(values.size()) != num_params()) {
    throw_runtime_error("model", "load_params_from_host: " + std::to_string(values.size()) + " values for " +
                                     std::to_string(num_params()) + " parameters");
  }
  Impl& m = *impl_;
  if (m.nf4.empty()) {
    m.device->upload(params(), values.data());
    params_changed();
    return;
  }
  m.nf4.upload(*m.device, m.params, m.table, values);
  params_changed();
}

void Model::init_params(uint64_t seed) {
  Impl& m = *impl_;
  std::vector<float> host(std::size_t(m.table.total), 0.0f);
  // One generator per slice, seeded from (seed, slice index): a slice's values do not depend on
  // how many values the slices before it drew.
  for (std::size_t i = 0; i < m.table.slices.size(); ++i) {
    const ParamSlice& s = m.table.slices[i];
    float* p = host.data() + s.offset;
    if (s.init_std > 0) {
      std::mt19937_64 rng(mix64(seed, i + 1));
      std::normal_distribution<double> normal(0.0, s.init_std);
      for (int64_t j = 0; j < s.numel(); ++j) p[j] = float(normal(rng));
    } else {
      std::fill(p, p + s.numel(), float(s.init_value));
    }
  }
  // Padded vocabulary rows are never used: keep them zero.
  const int64_t C = m.o.d_model, wte = m.sched.sites.front().param;
  std::fill(host.begin() + wte + m.o.vocab_size * C, host.begin() + wte + m.o.vocab_padded * C, 0.0f);
  load_params_from_host(host);
}

void Model::zero_grads() { impl_->device->fill(grads(), 0.0f); }

void Model::set_op_times(OpTimes* sink) noexcept { impl_->op_times = sink; }

const std::vector<GradRange>& Model::gradient_writes() const noexcept { return impl_->sched.writes; }

void Model::set_gradient_hook(std::function<void(std::size_t)> hook) { impl_->gradient_hook = std::move(hook); }

double Model::forward_backward(const Batch& batch, double grad_scale, uint64_t dropout_key) {
  const double sum = impl_->run_forward(batch, true, grad_scale, dropout_key, {});
  impl_->run_backward(dropout_key);
  return sum;
}

void Model::forward_backward(const Batch& batch, double grad_scale, uint64_t dropout_key, TensorView loss_sum, bool add) {
  impl_->run_forward(batch, true, grad_scale, dropout_key, {}, loss_sum, add);
  impl_->run_backward(dropout_key);
}

void Model::upload_batch(const Batch& batch, bool for_forward) {
  put_batch(*impl_, batch);
  impl_->uploaded = for_forward ? &batch : nullptr;
}

bool Model::draws_random() const noexcept { return impl_->o.dropout > 0 || (impl_->adapter && impl_->adapter->input_dropout() > 0); }

double Model::forward(const Batch& batch, std::vector<float>* losses, std::vector<float>* logits) {
  Impl& m = *impl_;
  const int64_t N = batch.positions_total();
  Buffer logit_buffer;
  TensorView lv;
  if (logits != nullptr) {
    logit_buffer = m.device->alloc(DType::f32, N * m.o.vocab_padded);
    lv = logit_buffer.view();
    lv.ndim = 2;
    lv.shape = {N, m.o.vocab_padded, 0, 0};
  }
  const double sum = m.run_forward(batch, false, 0.0, 0, lv);
  if (losses != nullptr) {
    losses->resize(std::size_t(N));
    m.device->download(losses->data(), m.act.view(m.plan.at(shared(Slot::losses)), N));
  }
  if (logits != nullptr) {
    logits->resize(std::size_t(N * m.o.vocab_padded));
    m.device->download(logits->data(), lv);
  }
  return sum;
}

double Model::flops_per_token(int64_t seq_len) const noexcept {
  const ModelOptions& o = impl_->o;
  return 4.0 * double(frozen_params()) + 6.0 * double(num_trainable()) +
         6.0 * double(o.n_layers) * double(o.d_model) * double(seq_len);
}

ActivationPlan Model::activation_plan(int64_t rows, int64_t seq_len) const {
  return activation_plan(rows, seq_len, impl_->o.recompute);
}

ActivationPlan Model::activation_plan(int64_t rows, int64_t seq_len, const std::string& recompute) const {
  const Impl& m = *impl_;
  const ArenaPlan p = m.make_plan(rows, seq_len, recompute);
  const int64_t N = rows * seq_len;
  const int64_t adapters = m.adapter ? m.adapter_layout(N).back() : 0;
  int64_t layers = m.cls->workspace_bytes(m.specs.cls, N);
  for (const Site& s : m.sched.sites) {
    if (s.op == Op::layer) layers = std::max(layers, s.layer->workspace_bytes(*s.spec, N * s.row_heads));
  }
  return {rows, seq_len, p.elements + adapters, p.bf16_elements, layers + m.attn->workspace_bytes(m.problem(rows, seq_len))};
}

namespace {
// The rate of `lin`'s forward pass on `dev` (TFLOP/s): Model::measure_matmul_tflops.
double linear_tflops(Device& dev, Layer& lin) {
  // 512 rows through a 1024 -> 1024 linear layer (1.07 GFLOP, the size of a small model's products
  // and large enough to reach the BLAS's steady rate) on the model's device: the best of at least
  // five timed runs after a warm-up, going on for at least 0.2 s so that a machine busy for a moment
  // is not taken as its peak.
  const int64_t rows = 512, n = 1024;
  LayerSpec spec;
  spec.in = spec.out = n;
  spec.bias = false;
  Buffer x = dev.alloc(DType::f32, rows * n), w = dev.alloc(DType::f32, n * n), y = dev.alloc(DType::f32, rows * n);
  dev.fill(x.view(), 0.5f);
  dev.fill(w.view(), 0.01f);
  LayerCall c;
  c.spec = &spec;
  c.rows = rows;
  c.x = x.view();
  c.y = y.view();
  c.params = w.view();
  c.stream = dev.stream();  // the queue synchronize() waits for
  double best = 1e30, spent = 0;
  for (int i = 0; i < 6 || (spent < 0.2 && i < 50); ++i) {
    dev.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    lin.forward(c);
    dev.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
    spent += s;
  }
  return 2.0 * double(rows * n * n) / best / 1e12;
}
}  // namespace

double Model::measure_matmul_tflops() { return linear_tflops(*impl_->device, *impl_->lin); }

std::string Model::attention_supports(int64_t rows, int64_t seq_len) const {
  return impl_->attn->supports(impl_->problem(rows, seq_len));
}

}  // namespace ablate
