// Model assembly: the layer plugins wired into a decoder-only transformer, its flat parameter and
// gradient buffers and activation arena on the model's device, the activation plan, and the
// forward/backward schedule (see model.hpp and model_schedule.hpp).
#include "ablate/model.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "ablate/config.hpp"
#include "ablate/error.hpp"
#include "ablate/mix.hpp"
#include "ablate/registry.hpp"
#include "model_schedule.hpp"

namespace ablate {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

ModelOptions ModelOptions::from(const Config& config, int64_t data_vocab) {
  const Params m = config.section("model");
  ModelOptions o;
  o.model_common = m;
  o.d_model = m.get_int("d_model");
  o.n_layers = m.get_int("n_layers");
  o.n_heads = m.get_int("n_heads");
  o.n_kv_heads = m.get_int("n_kv_heads") == 0 ? o.n_heads : m.get_int("n_kv_heads");
  if (o.d_model % o.n_heads != 0) {
    throw_input_error("model.n_heads", "d_model (" + std::to_string(o.d_model) + ") must be divisible by n_heads (" +
                                           std::to_string(o.n_heads) + ")");
  }
  if (o.n_heads % o.n_kv_heads != 0) {
    throw_input_error("model.n_kv_heads", "n_heads (" + std::to_string(o.n_heads) + ") must be divisible by n_kv_heads (" +
                                              std::to_string(o.n_kv_heads) + ")");
  }
  o.head_dim = o.d_model / o.n_heads;
  o.vocab_size = m.get_int("vocab_size") == 0 ? data_vocab : m.get_int("vocab_size");
  if (o.vocab_size <= 0) throw_input_error("model.vocab_size", "must be set: the data source does not say its vocabulary");
  if (data_vocab > o.vocab_size) {
    throw_input_error("model.vocab_size", std::to_string(o.vocab_size) + " is smaller than the data's vocabulary (" +
                                              std::to_string(data_vocab) + ")");
  }
  o.vocab_padded = round_up(o.vocab_size, m.get_int("vocab_multiple"));
  // tf32 and bf16 are modes of NVIDIA tensor cores: the CPU computes in fp32, and a CPU run counted
  // against a bf16 peak would misreport itself.
  const std::string dtype = config.section("run").get_string("dtype");
  if (dtype != "fp32" && config.section("run").get_string("device") != "cuda") {
    throw_input_error("run.dtype", "\"" + dtype + "\" is a mode of NVIDIA tensor cores (" +
                                       (dtype == "bf16" ? "bf16 products with fp32 master weights" : "fp32 values, TF32 products") +
                                       "): it needs run.device = \"cuda\" (the CPU computes in fp32)");
  }
  o.recompute = config.section("run").get_string("recompute");
  o.max_seq_len = m.get_int("max_seq_len");
  o.norm = m.get_string("norm");
  o.mlp = m.get_string("mlp");
  o.position = m.get_string("position");
  o.rope_theta = m.get_float("rope_theta");
  o.qk_norm = m.get_bool("qk_norm");
  o.bias = m.get_bool("bias");
  o.tie_embeddings = m.get_bool("tie_embeddings");
  o.dropout = m.get_float("dropout");
  o.norm_eps = m.get_float("norm_eps");
  o.mlp_hidden = m.get_int("mlp_hidden");
  if (o.mlp_hidden == 0) {
    o.mlp_hidden = o.mlp == "swiglu_mlp" ? round_up((8 * o.d_model + 2) / 3, 64) : 4 * o.d_model;
  }
  // Each key is bounded by its schema; their products are checked here, in floating point, before
  // any plan multiplies them in 64-bit integers: nothing near 2^50 values fits any machine.
  const double width = double(o.d_model), blocks = double(o.n_layers);
  const double params = 2.0 * double(o.vocab_padded) * width + blocks * (4.0 * width * width + 3.0 * width * double(o.mlp_hidden));
  if (params > 0x1p50) {
    throw_input_error("model", "d_model " + std::to_string(o.d_model) + ", n_layers " + std::to_string(o.n_layers) + ", vocabulary " +
                                   std::to_string(o.vocab_padded) + " and mlp_hidden " + std::to_string(o.mlp_hidden) +
                                   " make about " + std::to_string(params) + " parameters: more than any device holds");
  }
  if (o.position == "rope" && o.head_dim % 2 != 0) {
    throw_input_error("model.position", "rope needs an even head_dim; d_model/n_heads = " + std::to_string(o.head_dim));
  }
  if (config.has_section("attention")) {
    o.attention = config.selected("attention");
    o.attention_common = config.section("attention");
    o.attention_own = config.implementation("attention", o.attention);
  }
  return o;
}

std::string ModelOptions::describe() const {
  std::ostringstream s;
  s << "d_model=" << d_model << " n_layers=" << n_layers << " n_heads=" << n_heads << " n_kv_heads=" << n_kv_heads
    << " vocab=" << vocab_size << "(" << vocab_padded << ") max_seq_len=" << max_seq_len << " norm=" << norm
    << " mlp=" << mlp << "(" << mlp_hidden << ") position=" << position << " qk_norm=" << qk_norm << " bias=" << bias
    << " tie=" << tie_embeddings << " attention=" << attention;
  if (norm_eps > 0) s << " norm_eps=" << norm_eps;  // only when set: the text older checkpoints hold stays the same
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

struct Model::Impl {
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
  std::unique_ptr<Device> device;
  std::unique_ptr<Layer> emb, pos, norm, lin, mlp, qkn;
  std::unique_ptr<LossLayer> cls;
  std::unique_ptr<Attention> attn;
  LayerSpec emb_spec, pos_spec, norm_spec, q_spec, kv_spec, o_spec, mlp_spec, qkn_spec, cls_spec;
  ParamTable table;
  int64_t head = 0;         // the classifier's weight (the embedding's when tied)
  std::vector<GradRange> writes;                  // gradient_writes()
  std::function<void(std::size_t)> gradient_hook;  // called after each of them in forward_backward
  int64_t ln_f_param = 0;
  std::vector<Site> sites;  // the forward pass in order (the classifier follows the last)
  std::vector<std::pair<std::size_t, std::size_t>> block_sites;  // each block's first and last site

  Buffer params, grads, act;  // (P) f32, (P) f32, the arena
  // run.dtype = "bf16" with a norm and readers of its output that take bf16 views
  // (LayerBase::bf16_product_inputs): the norms' outputs (ln1, ln2, lnf) are held in bf16.
  bool bf16_norm_outputs = false;
  // And the attention output (read by the output projection only) when the backend writes it so
  // (Attention::bf16_activations).
  bool bf16_attention_out = false;
  // And q, k, v (q_lin, k_lin, v, q, k) when the backend reads them so and the linear, rope and
  // qk-norm layers that write or rotate them take bf16 (LayerBase::bf16_attention_inputs).
  bool bf16_qkv = false;
  Buffer params_bf16;         // (P) bf16 copy of params for bf16 products (run.dtype = "bf16"), else empty
  ArenaPlan plan;             // of the shape the arena was last laid out for
  DeviceBatch batch;          // the micro-batch on the device

  template <class L = Layer>
  std::unique_ptr<L> make_layer(const Registry& registry, const std::string& name, const char* key) {
    const Params own{"model." + name, {}};
    return registry.create<L>(Kind::layer, name, {o.model_common, own, run}, key);
  }

  int64_t declare(const LayerBase& layer, const LayerSpec& spec, const std::string& prefix) {
    const int64_t before = table.total;
    layer.declare_params(spec, prefix, table);
    return before;
  }

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
    p.bf16_out = bf16_attention_out;
    p.bf16_qkv = bf16_qkv;
    return p;
  }

  // ---- the schedule ----

  Site layer_site(Layer* layer, const LayerSpec* spec, int64_t param, int64_t x_cols, int64_t y_cols) {
    Site s;
    s.layer = layer;
    s.spec = spec;
    s.param = param;
    s.x_cols = x_cols;
    s.y_cols = y_cols;
    return s;
  }

  Site norm_site(Layer* layer, const LayerSpec* spec, int64_t param, Ref x, Ref y, Ref saved, Ref d_y, Ref d_x,
                 GradMode mode, int64_t width, int64_t row_heads = 1) {
    Site s = layer_site(layer, spec, param, width, width);
    s.x = x;
    s.y = y;
    s.saved = saved;
    s.d_y = d_y;
    s.d_x = d_x;
    s.input_grad = mode;
    s.row_heads = row_heads;
    return s;
  }

  // Declares every parameter and writes down every call of the forward pass.
  void build_schedule() {
    const int64_t C = o.d_model, D = o.head_dim, H = o.n_heads, Hk = o.n_kv_heads;
    const double resid_std = 0.02 / std::sqrt(2.0 * double(o.n_layers));
    uint64_t dropout_site = 0;
    const Ref x0 = in_block(0, Slot::res);
    const Ref d_res = shared(Slot::d_res), d_ln = shared(Slot::d_ln);

    Site e = layer_site(emb.get(), &emb_spec, declare(*emb, emb_spec, "wte"), 0, C);
    e.y = x0;
    e.d_y = d_res;
    e.dropout_site = ++dropout_site;
    sites.push_back(e);
    if (pos->position_site() == PositionSite::stream) {
      Site p = layer_site(pos.get(), &pos_spec, declare(*pos, pos_spec, "wpe"), C, C);
      p.x = p.y = x0;
      p.d_y = p.d_x = d_res;
      sites.push_back(p);
    }
    for (int64_t l = 0; l < o.n_layers; ++l) {
      const std::string pre = "blocks." + std::to_string(l);
      auto B = [l](Slot s) { return in_block(l, s); };
      block_sites.push_back({sites.size(), 0});
      sites.push_back(norm_site(norm.get(), &norm_spec, declare(*norm, norm_spec, pre + ".ln1"), B(Slot::res), B(Slot::ln1),
                                B(Slot::ln1_s), d_ln, d_res, GradMode::accumulate, C));
      // q, k, v read ln1; backward visits v first, which writes d_ln, then k and q add to it.
      const struct {
        const char* name;
        const LayerSpec* spec;
        Slot out, d_out;
        int64_t width;
      } proj[] = {{".attn.q", &q_spec, Slot::q_lin, Slot::d_qlin, H * D},
                  {".attn.k", &kv_spec, Slot::k_lin, Slot::d_klin, Hk * D},
                  {".attn.v", &kv_spec, Slot::v, Slot::d_v, Hk * D}};
      for (const auto& pr : proj) {
        Site s = layer_site(lin.get(), pr.spec, declare(*lin, *pr.spec, pre + pr.name), C, pr.width);
        s.x = B(Slot::ln1);
        s.y = B(pr.out);
        s.d_y = shared(pr.d_out);
        s.d_x = d_ln;
        s.input_grad = pr.out == Slot::v ? GradMode::overwrite : GradMode::accumulate;
        sites.push_back(s);
      }
      if (o.qk_norm) {
        sites.push_back(norm_site(qkn.get(), &qkn_spec, declare(*qkn, qkn_spec, pre + ".attn.q_norm"), B(Slot::q_lin),
                                  B(Slot::q), B(Slot::qn_s), shared(Slot::d_q), shared(Slot::d_qlin), GradMode::overwrite, D,
                                  H));
        sites.push_back(norm_site(qkn.get(), &qkn_spec, declare(*qkn, qkn_spec, pre + ".attn.k_norm"), B(Slot::k_lin),
                                  B(Slot::k), B(Slot::kn_s), shared(Slot::d_k), shared(Slot::d_klin), GradMode::overwrite, D,
                                  Hk));
      }
      if (pos->position_site() == PositionSite::qk) {  // in place, forward on q and k, backward on their gradients
        for (auto [slot, d_slot, heads] : {std::tuple{Slot::q, Slot::d_q, H}, {Slot::k, Slot::d_k, Hk}}) {
          Site r = layer_site(pos.get(), &pos_spec, -1, heads * D, heads * D);
          r.heads = heads;
          r.x = r.y = B(slot);
          r.d_y = r.d_x = shared(d_slot);
          sites.push_back(r);
        }
      }
      Site a;
      a.op = Op::attention;
      a.attn = {B(Slot::q), B(Slot::k), B(Slot::v), B(Slot::att), B(Slot::att_s),
                shared(Slot::d_att), shared(Slot::d_q), shared(Slot::d_k), shared(Slot::d_v)};
      sites.push_back(a);
      Site out = layer_site(lin.get(), &o_spec, declare(*lin, o_spec, pre + ".attn.o"), H * D, C);
      out.x = B(Slot::att);
      out.y = B(Slot::mid);
      out.residual = B(Slot::res);
      out.d_y = d_res;
      out.d_x = shared(Slot::d_att);
      out.dropout_site = ++dropout_site;
      sites.push_back(out);
      sites.push_back(norm_site(norm.get(), &norm_spec, declare(*norm, norm_spec, pre + ".ln2"), B(Slot::mid), B(Slot::ln2),
                                B(Slot::ln2_s), d_ln, d_res, GradMode::accumulate, C));
      const std::size_t first_mlp = table.slices.size();
      Site m = layer_site(mlp.get(), &mlp_spec, declare(*mlp, mlp_spec, pre + ".mlp"), C, C);
      for (std::size_t i = first_mlp; i < table.slices.size(); ++i) {  // residual output projections
        ParamSlice& s = table.slices[i];
        const auto ends = [&](const std::string& suffix) {
          return s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0;
        };
        if ((ends(".proj.weight") || ends(".down.weight")) && s.init_std > 0) s.init_std = resid_std;
      }
      m.x = B(Slot::ln2);
      m.y = in_block(l + 1, Slot::res);
      m.residual = B(Slot::mid);
      m.saved = B(Slot::mlp_s);
      m.d_y = d_res;
      m.d_x = d_ln;
      m.dropout_site = ++dropout_site;
      sites.push_back(m);
      block_sites.back().second = sites.size() - 1;  // the MLP: the block's last site
    }
    ln_f_param = declare(*norm, norm_spec, "ln_f");
    sites.push_back(norm_site(norm.get(), &norm_spec, ln_f_param, in_block(o.n_layers, Slot::res), shared(Slot::lnf),
                              shared(Slot::lnf_s), d_ln, d_res, GradMode::overwrite, C));
    head = o.tie_embeddings ? sites.front().param : declare(*cls, cls_spec, "lm_head");
    record_gradient_writes();
  }

  // The gradient writes of one backward pass in their order: the classifier's (with the loss, in
  // the forward pass), then each site with parameters in reverse. Declarations are contiguous and
  // in order, so a site's parameters run up to the next declared offset.
  void record_gradient_writes() {
    std::vector<int64_t> starts;
    for (const Site& s : sites) {
      if (s.param >= 0) starts.push_back(s.param);
    }
    starts.push_back(head);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    const auto range_of = [&](int64_t begin) {
      const auto next = std::upper_bound(starts.begin(), starts.end(), begin);
      return GradRange{begin, next == starts.end() ? table.total : *next};
    };
    writes.clear();
    writes.push_back(range_of(head));
    for (auto it = sites.rbegin(); it != sites.rend(); ++it) {
      if (it->param >= 0) writes.push_back(range_of(it->param));
    }
  }

  // ---- the activation plan ----

  // Whether backward recomputes `slot` of a block (o.recompute) rather than read it from forward.
  static bool recomputed(Slot slot, const std::string& mode) {
    if (mode == "block") return slot != Slot::res;
    if (mode == "mlp") return slot == Slot::mlp_s;
    return false;
  }

  // The type a slot's values are held in: bf16 for the activations the model holds so (the flags
  // above), else f32.
  DType slot_dtype(Slot s) const {
    const bool norm_output = s == Slot::ln1 || s == Slot::ln2 || s == Slot::lnf;
    const bool qkv = s == Slot::q_lin || s == Slot::k_lin || s == Slot::v || s == Slot::q || s == Slot::k;
    const bool bf16 = (bf16_norm_outputs && norm_output) || (bf16_attention_out && s == Slot::att) || (bf16_qkv && qkv);
    return bf16 ? DType::bf16 : DType::f32;
  }

  // The arena for a shape under the run's recompute mode, or another (to say what it would save).
  ArenaPlan make_plan(int64_t rows, int64_t T) const { return make_plan(rows, T, o.recompute); }
  ArenaPlan make_plan(int64_t rows, int64_t T, const std::string& recompute) const {
    const int64_t N = rows * T, C = o.d_model, Hd = o.n_heads * o.head_dim, Kd = o.n_kv_heads * o.head_dim;
    ArenaPlan p;
    p.rows = rows;
    p.seq_len = T;
    p.offsets.assign(std::size_t((o.n_layers + 2) * schedule::kSlots), 0);
    p.dtypes.assign(p.offsets.size(), DType::f32);
    // n values of the slot's type.
    auto take = [&](Ref r, int64_t n) {
      const bool bf16 = slot_dtype(r.slot) == DType::bf16;
      p.offsets[ArenaPlan::index(r)] = p.elements;
      p.dtypes[ArenaPlan::index(r)] = slot_dtype(r.slot);
      const int64_t values = std::max<int64_t>(n, 0);
      // 256 bytes apart: every slot as aligned as the packed copies bf16 products would otherwise
      // make of it, so reading a held slot in place plans (and rounds) exactly like the copy.
      p.elements += round_up(bf16 ? (values + 1) / 2 : values, 64);
    };
    auto alias = [&](Ref r, Ref to) {
      p.offsets[ArenaPlan::index(r)] = p.at(to);
      p.dtypes[ArenaPlan::index(r)] = p.dtype(to);
    };
    const AttentionProblem prob = problem(rows, T);
    const auto keep = take;
    // A slot backward recomputes is held once, in block 0's place, for whichever block is being
    // recomputed (forward overwrites it block after block; only `res` carries between blocks).
    const auto take_in_block = [&](Ref r, int64_t n) {
      if (r.block > 0 && recomputed(r.slot, recompute)) alias(r, in_block(0, r.slot));
      else keep(r, n);
    };
    for (int64_t l = 0; l < o.n_layers; ++l) {
      auto B = [l](Slot s) { return in_block(l, s); };
      const auto take = take_in_block;
      take(B(Slot::res), N * C);
      take(B(Slot::ln1), N * C);
      take(B(Slot::ln1_s), norm->activation_elements(norm_spec, N));
      take(B(Slot::q_lin), N * Hd);
      take(B(Slot::k_lin), N * Kd);
      take(B(Slot::v), N * Kd);
      if (o.qk_norm) {
        take(B(Slot::q), N * Hd);
        take(B(Slot::k), N * Kd);
        take(B(Slot::qn_s), qkn->activation_elements(qkn_spec, N * o.n_heads));
        take(B(Slot::kn_s), qkn->activation_elements(qkn_spec, N * o.n_kv_heads));
      } else {
        alias(B(Slot::q), B(Slot::q_lin));
        alias(B(Slot::k), B(Slot::k_lin));
      }
      take(B(Slot::att), N * Hd);
      take(B(Slot::att_s), attn->saved_elements(prob));
      take(B(Slot::mid), N * C);
      take(B(Slot::ln2), N * C);
      take(B(Slot::ln2_s), norm->activation_elements(norm_spec, N));
      take(B(Slot::mlp_s), mlp->activation_elements(mlp_spec, N));
    }
    keep(in_block(o.n_layers, Slot::res), N * C);
    take(shared(Slot::lnf), N * C);
    take(shared(Slot::lnf_s), norm->activation_elements(norm_spec, N));
    take(shared(Slot::losses), N);
    take(shared(Slot::d_res), N * C);
    take(shared(Slot::d_ln), N * C);
    take(shared(Slot::d_q), N * Hd);
    take(shared(Slot::d_k), N * Kd);
    take(shared(Slot::d_v), N * Kd);
    take(shared(Slot::d_att), N * Hd);
    if (o.qk_norm) {
      take(shared(Slot::d_qlin), N * Hd);
      take(shared(Slot::d_klin), N * Kd);
    } else {
      alias(shared(Slot::d_qlin), shared(Slot::d_q));
      alias(shared(Slot::d_klin), shared(Slot::d_k));
    }
    for (const Site& s : sites) {
      if (s.op == Op::layer) p.scratch_elements = std::max(p.scratch_elements, s.layer->scratch_elements(*s.spec, N * s.row_heads));
    }
    p.scratch_elements = std::max(p.scratch_elements, cls->scratch_elements(cls_spec, N));
    take(shared(Slot::scratch), p.scratch_elements);
    return p;
  }

  // Lays the arena out for a shape. The arena only grows: bucketed batches change T from batch to
  // batch, and it is allocated (and zeroed) once for the largest.
  void prepare(int64_t rows, int64_t T) {
    if (plan.rows == rows && plan.seq_len == T) return;
    plan = make_plan(rows, T);
    if (act.count() < plan.elements) act = device->alloc(DType::f32, plan.elements);
  }

  // ---- views ----

  TensorView arena(Ref r, int64_t rows, int64_t cols) const {
    if (!r.set()) return {};
    TensorView t = act.view(plan.at(r), rows * cols);
    t.dtype = plan.dtype(r);  // the same first byte; a bf16 slot's values are two bytes each
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    return t;
  }
  // From a slot to the end of the arena: a layer reads as many saved values as it declared.
  TensorView arena_tail(Ref r) const { return r.set() ? act.view(plan.at(r), plan.elements - plan.at(r)) : TensorView{}; }
  TensorView heads4(Ref r, int64_t heads) const {
    TensorView t = act.view(plan.at(r), plan.rows * plan.seq_len * heads * o.head_dim);
    t.dtype = plan.dtype(r);
    t.ndim = 4;
    t.shape = {plan.rows, plan.seq_len, heads, o.head_dim};
    return t;
  }
  TensorView param_tail(const Buffer& b, int64_t off) const { return b.view(off, table.total - off); }

  LayerCall call_of(const Site& s, bool backward) const {
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
    if (s.param >= 0) c.params = param_tail(params, s.param);
    if (s.param >= 0 && params_bf16.count() > 0) c.params_bf16 = param_tail(params_bf16, s.param);
    if (backward) {
      if (s.param >= 0) c.grads = param_tail(grads, s.param);
      c.d_y = arena(s.d_y, rows, s.y_cols);
      c.d_x = arena(s.d_x, rows, s.x_cols);
      c.input_grad = s.input_grad;
    }
    if (s.layer->role() == LayerRole::position && s.spec->in != s.x_cols) {  // rope: (N, heads, D)
      for (TensorView* t : {&c.x, &c.y, &c.d_y, &c.d_x}) {
        if (t->data == nullptr) continue;
        t->ndim = 3;
        t->shape = {N, s.heads, o.head_dim, 0};
      }
    }
    return c;
  }

  // ---- the passes ----

  void check_batch(const Batch& b) const {
    if (b.seq_len > o.max_seq_len) {
      throw_input_error("model.max_seq_len", "rows of " + std::to_string(b.seq_len) + " positions exceed max_seq_len " +
                                                 std::to_string(o.max_seq_len));
    }
    for (int32_t t : b.tokens) {
      if (t < 0 || t >= o.vocab_size) {
        throw_runtime_error("model", "token " + std::to_string(t) + " outside the vocabulary of " + std::to_string(o.vocab_size));
      }
    }
    // Checked here, before any device sees them: a GPU kernel can only turn a bad id into NaN.
    for (int32_t t : b.targets) {
      if (t != -1 && (t < 0 || t >= o.vocab_size)) {
        throw_input_error("model", "target " + std::to_string(t) + " outside the vocabulary of " +
                                       std::to_string(o.vocab_size) + " (and not -1, no loss)");
      }
    }
  }

  void set_dropout(LayerCall& c, const Site& s, bool train, uint64_t key) const {
    if (s.dropout_site == 0 || !train) return;
    c.dropout = o.dropout;
    c.dropout_key = mix64(key, s.dropout_site);
  }

  // One site's forward call (`pass` names it in the op profile: " fwd", or " recompute").
  void forward_site(const Site& s, const AttentionProblem& prob, bool train, uint64_t key, const char* pass) {
    if (s.op == Op::attention) {
      timed("attention", pass, [&] {
        attn->forward(prob, batch.views, heads4(s.attn.q, o.n_heads), heads4(s.attn.k, o.n_kv_heads),
                      heads4(s.attn.v, o.n_kv_heads), heads4(s.attn.out, o.n_heads),
                      act.view(plan.at(s.attn.saved), attn->saved_elements(prob)));
      });
      return;
    }
    LayerCall c = call_of(s, false);
    set_dropout(c, s, train, key);
    timed(to_string(s.layer->role()), pass, [&] { s.layer->forward(c); });
  }

  // Before block l's backward: its recomputed slots filled again by its forward sites (all of them
  // for "block", the MLP for "mlp"; the MLP also rewrites res of block l + 1, with the same bits).
  // The last block's are still there from the forward pass.
  void recompute_block(int64_t l, const AttentionProblem& prob, uint64_t key) {
    if (o.recompute == "none" || l == o.n_layers - 1) return;
    const auto [first, last] = block_sites[std::size_t(l)];
    for (std::size_t i = o.recompute == "block" ? first : last; i <= last; ++i) forward_site(sites[i], prob, true, key, " recompute");
  }

  // The whole forward pass up to (and including) the classifier. Training: dropout on, and the
  // classifier writes d(lnf) into d_ln.
  double run_forward(const Batch& b, bool train, double grad_scale, uint64_t key, TensorView logits) {
    check_batch(b);
    prepare(b.rows, b.seq_len);
    timed("batch upload", "", [&] { device->upload_batch(b, batch); });
    const AttentionProblem prob = problem(b.rows, b.seq_len);
    for (const Site& s : sites) forward_site(s, prob, train, key, " fwd");
    const int64_t N = int64_t(b.rows) * b.seq_len;
    LayerCall c;
    c.spec = &cls_spec;
    c.batch = &batch.views;
    c.rows = N;
    c.x = arena(shared(Slot::lnf), N, o.d_model);
    c.params = param_tail(params, head);
    if (params_bf16.count() > 0) c.params_bf16 = param_tail(params_bf16, head);
    c.losses = arena(shared(Slot::losses), N, 1);
    c.scratch = arena(shared(Slot::scratch), plan.scratch_elements, 1);
    c.stream = device->stream();
    c.logits = logits;
    if (train) {
      c.grads = param_tail(grads, head);
      c.d_x = arena(shared(Slot::d_ln), N, o.d_model);
      c.grad_scale = grad_scale;
    }
    timed("classifier", "", [&] { cls->loss(c); });
    if (train && gradient_hook) gradient_hook(0);
    double sum = 0;
    timed("loss sum", "", [&] { sum = device->masked_loss_sum(act.view(plan.at(shared(Slot::losses)), N), batch.views.targets); });
    return sum;
  }

  void run_backward(uint64_t key) {
    const AttentionProblem prob = problem(plan.rows, plan.seq_len);
    std::size_t write = 1;  // gradient_writes() index of the next site with parameters
    int64_t block = o.n_layers - 1;  // the next block backward enters
    for (std::size_t i = sites.size(); i-- > 0;) {
      const Site& s = sites[i];
      if (block >= 0 && i == block_sites[std::size_t(block)].second) recompute_block(block--, prob, key);
      if (s.op == Op::attention) {
        timed("attention", " bwd", [&] {
          attn->backward(prob, batch.views, heads4(s.attn.q, o.n_heads), heads4(s.attn.k, o.n_kv_heads),
                         heads4(s.attn.v, o.n_kv_heads), heads4(s.attn.out, o.n_heads),
                         act.view(plan.at(s.attn.saved), attn->saved_elements(prob)), heads4(s.attn.d_out, o.n_heads),
                         heads4(s.attn.d_q, o.n_heads), heads4(s.attn.d_k, o.n_kv_heads), heads4(s.attn.d_v, o.n_kv_heads));
        });
        continue;
      }
      LayerCall c = call_of(s, true);
      set_dropout(c, s, true, key);
      timed(to_string(s.layer->role()), " bwd", [&] { s.layer->backward(c); });
      if (s.param >= 0) {
        if (gradient_hook) gradient_hook(write);
        ++write;
      }
    }
  }
};

Model::Model(const ModelOptions& options, const Registry& registry, const RunContext& run) : impl_(new Impl) {
  Impl& m = *impl_;
  m.o = options;
  m.run = run;
  const ModelOptions& o = m.o;
  {
    static const Params empty{"run", {}};
    m.device = registry.create<Device>(Kind::device, run.device, {empty, empty, run}, "run.device");
  }
  m.emb = m.make_layer(registry, "embedding", "embedding");
  m.pos = m.make_layer(registry, o.position, "model.position");
  m.norm = m.make_layer(registry, o.norm, "model.norm");
  m.lin = m.make_layer(registry, "linear", "linear");
  m.mlp = m.make_layer(registry, o.mlp, "model.mlp");
  m.cls = m.make_layer<LossLayer>(registry, "cross_entropy", "cross_entropy");
  if (o.qk_norm) m.qkn = m.make_layer(registry, "rmsnorm", "model.qk_norm");
  m.attn = registry.create<Attention>(Kind::attention, o.attention, {o.attention_common, o.attention_own, run},
                                      "attention.name");
  m.attn->set_stream(m.device->stream());
  const struct {
    LayerBase* layer;
    LayerRole role;
    const char* key;
  } roles[] = {{m.emb.get(), LayerRole::embedding, "embedding"}, {m.pos.get(), LayerRole::position, "model.position"},
               {m.norm.get(), LayerRole::norm, "model.norm"},      {m.lin.get(), LayerRole::linear, "linear"},
               {m.mlp.get(), LayerRole::mlp, "model.mlp"},          {m.cls.get(), LayerRole::classifier, "cross_entropy"}};
  for (const auto& r : roles) {
    if (r.layer->role() != r.role) {
      throw_input_error(r.key, std::string("the layer found has role '") + to_string(r.layer->role()) + "', expected '" +
                                   to_string(r.role) + "'");
    }
  }
  const double resid_std = 0.02 / std::sqrt(2.0 * double(o.n_layers));
  const int64_t C = o.d_model, D = o.head_dim;
  m.emb_spec.in = C;
  m.emb_spec.out = o.vocab_padded;
  const PositionSite site = m.pos->position_site();
  m.pos_spec.in = site == PositionSite::qk ? D : C;
  m.pos_spec.max_positions = o.max_seq_len;
  m.pos_spec.rope_theta = o.rope_theta;
  m.norm_spec.in = C;
  m.norm_spec.bias = o.bias;
  m.norm_spec.eps = o.norm_epsilon();
  m.q_spec.in = C;
  m.q_spec.out = o.n_heads * D;
  m.q_spec.bias = o.bias;
  m.kv_spec = m.q_spec;
  m.kv_spec.out = o.n_kv_heads * D;
  m.o_spec = m.q_spec;
  m.o_spec.in = o.n_heads * D;
  m.o_spec.out = C;
  m.o_spec.init_std = resid_std;
  m.mlp_spec.in = C;
  m.mlp_spec.out = o.mlp_hidden;
  m.mlp_spec.bias = o.bias;
  m.qkn_spec.in = D;
  m.qkn_spec.bias = false;
  m.qkn_spec.eps = o.qk_norm_epsilon();
  m.cls_spec.in = C;
  m.cls_spec.out = o.vocab_padded;
  m.cls_spec.real_out = o.vocab_size;
  m.cls_spec.declare = !o.tie_embeddings;
  m.bf16_norm_outputs = run.dtype == "bf16" && m.norm->bf16_product_inputs() && m.lin->bf16_product_inputs() &&
                        m.mlp->bf16_product_inputs() && m.cls->bf16_product_inputs();
  m.bf16_attention_out = m.bf16_norm_outputs && m.attn->bf16_activations();
  m.bf16_qkv = m.bf16_attention_out && m.lin->bf16_attention_inputs() &&
               (site != PositionSite::qk || m.pos->bf16_attention_inputs()) && (!o.qk_norm || m.qkn->bf16_attention_inputs());
  m.build_schedule();
  // Refused by size before anything is allocated (the run's full plan is checked later, with the
  // optimizer and the activations): values and gradients alone must fit the device.
  const int64_t capacity = m.device->memory_capacity();
  if (capacity > 0 && double(m.table.total) * 8.0 > double(capacity)) {
    throw_input_error("model", std::to_string(m.table.total) + " parameters need " +
                                   std::to_string(int64_t(double(m.table.total) * 8.0 / double(1 << 20))) +
                                   " MiB for their values and gradients alone; " + m.device->describe() + " holds " +
                                   std::to_string(capacity / (1 << 20)) + " MiB");
  }
  m.params = m.device->alloc(DType::f32, m.table.total);
  m.grads = m.device->alloc(DType::f32, m.table.total);
  if (run.dtype == "bf16") m.params_bf16 = m.device->alloc(DType::bf16, m.table.total);
}

Model::~Model() = default;

const ModelOptions& Model::options() const noexcept { return impl_->o; }
const ParamTable& Model::table() const noexcept { return impl_->table; }
int64_t Model::num_params() const noexcept { return impl_->table.total; }
Device& Model::device() noexcept { return *impl_->device; }
TensorView Model::params() { return impl_->params.view(); }
TensorView Model::grads() { return impl_->grads.view(); }
TensorView Model::params_bf16() { return impl_->params_bf16.count() > 0 ? impl_->params_bf16.view() : TensorView{}; }
int64_t Model::state_bytes() const noexcept {
  return impl_->params.bytes() + impl_->grads.bytes() + impl_->params_bf16.bytes();
}

void Model::params_changed() {
  Impl& m = *impl_;
  if (m.params_bf16.count() > 0) m.device->to_bf16(m.params_bf16.view(), m.params.view());
}

void Model::copy_params_to_host(std::vector<float>& out) {
  out.resize(std::size_t(num_params()));
  impl_->device->download(out.data(), params());
}

void Model::copy_grads_to_host(std::vector<float>& out) {
  out.resize(std::size_t(num_params()));
  impl_->device->download(out.data(), grads());
}

void Model::load_params_from_host(const std::vector<float>& values) {
  if (int64_t(values.size()) != num_params()) {
    throw_runtime_error("model", "load_params_from_host: " + std::to_string(values.size()) + " values for " +
                                     std::to_string(num_params()) + " parameters");
  }
  impl_->device->upload(params(), values.data());
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
  const int64_t C = m.o.d_model, wte = m.sites.front().param;
  std::fill(host.begin() + wte + m.o.vocab_size * C, host.begin() + wte + m.o.vocab_padded * C, 0.0f);
  load_params_from_host(host);
}

void Model::zero_grads() { impl_->device->fill(grads(), 0.0f); }

void Model::set_op_times(OpTimes* sink) noexcept { impl_->op_times = sink; }

const std::vector<GradRange>& Model::gradient_writes() const noexcept { return impl_->writes; }

void Model::set_gradient_hook(std::function<void(std::size_t)> hook) { impl_->gradient_hook = std::move(hook); }

double Model::forward_backward(const Batch& batch, double grad_scale, uint64_t dropout_key) {
  const double sum = impl_->run_forward(batch, true, grad_scale, dropout_key, {});
  impl_->run_backward(dropout_key);
  return sum;
}

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
  return 6.0 * double(num_params()) + 6.0 * double(o.n_layers) * double(o.d_model) * double(seq_len);
}

ActivationPlan Model::activation_plan(int64_t rows, int64_t seq_len) const {
  return activation_plan(rows, seq_len, impl_->o.recompute);
}

ActivationPlan Model::activation_plan(int64_t rows, int64_t seq_len, const std::string& recompute) const {
  const Impl& m = *impl_;
  const ArenaPlan p = m.make_plan(rows, seq_len, recompute);
  const int64_t N = rows * seq_len;
  int64_t layers = m.cls->workspace_bytes(m.cls_spec, N);
  for (const Site& s : m.sites) {
    if (s.op == Op::layer) layers = std::max(layers, s.layer->workspace_bytes(*s.spec, N * s.row_heads));
  }
  return {rows, seq_len, p.elements, layers + m.attn->workspace_bytes(m.problem(rows, seq_len))};
}

double Model::measure_matmul_tflops() {
  // 512 rows through a 1024 -> 1024 linear layer (1.07 GFLOP, the size of a small model's products
  // and large enough to reach the BLAS's steady rate) on the model's device: the best of at least
  // five timed runs after a warm-up, going on for at least 0.2 s so that a machine busy for a moment
  // is not taken as its peak.
  const int64_t rows = 512, n = 1024;
  Device& dev = *impl_->device;
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
    impl_->lin->forward(c);
    dev.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
    spent += s;
  }
  return 2.0 * double(rows * n * n) / best / 1e12;
}

std::string Model::attention_supports(int64_t rows, int64_t seq_len) const {
  return impl_->attn->supports(impl_->problem(rows, seq_len));
}

}  // namespace ablate
