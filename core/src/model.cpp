// Model assembly: the layer plugins wired into a decoder-only transformer, its flat parameter and
// gradient buffers, the activation plan, and the forward/backward schedule (see model.hpp).
#include "ablate/model.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "ablate/config.hpp"
#include "ablate/error.hpp"
#include "ablate/registry.hpp"

namespace ablate {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

TensorView view(float* p, int64_t rows, int64_t cols) {
  TensorView t;
  t.data = p;
  t.dtype = DType::f32;
  t.device = DeviceType::cpu;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

TensorView view4(float* p, int64_t b, int64_t t, int64_t h, int64_t d) {
  TensorView v;
  v.data = p;
  v.ndim = 4;
  v.shape = {b, t, h, d};
  return v;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

ModelOptions ModelOptions::from(const Config& config, int64_t data_vocab) {
  const Params m = config.section("model");
  ModelOptions o;
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
  o.max_seq_len = m.get_int("max_seq_len");
  o.norm = m.get_string("norm");
  o.mlp = m.get_string("mlp");
  o.position = m.get_string("position");
  o.rope_theta = m.get_float("rope_theta");
  o.qk_norm = m.get_bool("qk_norm");
  o.bias = m.get_bool("bias");
  o.tie_embeddings = m.get_bool("tie_embeddings");
  o.dropout = m.get_float("dropout");
  o.mlp_hidden = m.get_int("mlp_hidden");
  if (o.mlp_hidden == 0) {
    o.mlp_hidden = o.mlp == "swiglu_mlp" ? round_up((8 * o.d_model + 2) / 3, 64) : 4 * o.d_model;
  }
  if (o.position == "rope" && o.head_dim % 2 != 0) {
    throw_input_error("model.position", "rope needs an even head_dim; d_model/n_heads = " + std::to_string(o.head_dim));
  }
  if (config.has_section("attention")) o.attention = config.selected("attention");
  return o;
}

std::string ModelOptions::describe() const {
  std::ostringstream s;
  s << "d_model=" << d_model << " n_layers=" << n_layers << " n_heads=" << n_heads << " n_kv_heads=" << n_kv_heads
    << " vocab=" << vocab_size << "(" << vocab_padded << ") max_seq_len=" << max_seq_len << " norm=" << norm
    << " mlp=" << mlp << "(" << mlp_hidden << ") position=" << position << " qk_norm=" << qk_norm << " bias=" << bias
    << " tie=" << tie_embeddings << " attention=" << attention;
  return s.str();
}

// ---------------------------------------------------------------------------------------------

struct Model::Impl {
  ModelOptions o;
  RunContext run;
  std::unique_ptr<Layer> emb, pos, norm, lin, mlp, qkn, cls;
  std::unique_ptr<Attention> attn;
  LayerSpec emb_spec, pos_spec, norm_spec, q_spec, kv_spec, o_spec, mlp_spec, qkn_spec, cls_spec;
  ParamTable table;
  std::vector<float> params, grads;

  struct BlockParams {
    int64_t ln1, q, k, v, q_norm = -1, k_norm = -1, o, ln2, mlp;
  };
  int64_t wte = 0, wpe = -1, ln_f = 0, head = 0;
  std::vector<BlockParams> blocks;

  // Activation plan for the current shape: offsets into `act`.
  int64_t planned_rows = -1, planned_T = -1;
  struct BlockActs {
    int64_t res, ln1, ln1_s, q_lin, k_lin, v, q, k, qn_s, kn_s, att, att_s, mid, ln2, ln2_s, mlp_s;
  };
  std::vector<BlockActs> acts;
  int64_t res_final = 0, lnf = 0, lnf_s = 0, losses = 0;
  int64_t d_res = 0, d_ln = 0, d_q = 0, d_k = 0, d_v = 0, d_att = 0, d_qlin = 0, d_klin = 0, scratch = 0;
  int64_t scratch_n = 0;
  int64_t planned_elements = 0;  // what the current shape uses of `act`
  std::vector<float> act;

  std::unique_ptr<Layer> make_layer(const Registry& registry, const std::string& name) {
    static const Params empty{"model", {}};
    const std::string full = run.device == "cpu" ? name : name + "_" + run.device;
    return registry.create<Layer>(Kind::layer, full, {empty, empty, run});
  }

  int64_t declare(const Layer& layer, const LayerSpec& spec, const std::string& prefix) {
    const int64_t before = table.total;
    layer.declare_params(spec, prefix, table);
    return before;
  }

  void plan(int64_t rows, int64_t T) {
    if (rows == planned_rows && T == planned_T) return;
    const int64_t N = rows * T, C = o.d_model, Hd = o.n_heads * o.head_dim, Kd = o.n_kv_heads * o.head_dim;
    int64_t at = 0;
    auto take = [&](int64_t n) {
      const int64_t off = at;
      at += round_up(std::max<int64_t>(n, 0), 16);
      return off;
    };
    AttentionProblem prob = problem(rows, T);
    acts.assign(std::size_t(o.n_layers), {});
    for (auto& a : acts) {
      a.res = take(N * C);
      a.ln1 = take(N * C);
      a.ln1_s = take(norm->activation_elements(norm_spec, N));
      a.q_lin = take(N * Hd);
      a.k_lin = take(N * Kd);
      a.v = take(N * Kd);
      if (o.qk_norm) {
        a.q = take(N * Hd);
        a.k = take(N * Kd);
        a.qn_s = take(qkn->activation_elements(qkn_spec, N * o.n_heads));
        a.kn_s = take(qkn->activation_elements(qkn_spec, N * o.n_kv_heads));
      } else {
        a.q = a.q_lin;
        a.k = a.k_lin;
        a.qn_s = a.kn_s = 0;
      }
      a.att = take(N * Hd);
      a.att_s = take(attn->saved_elements(prob));
      a.mid = take(N * C);
      a.ln2 = take(N * C);
      a.ln2_s = take(norm->activation_elements(norm_spec, N));
      a.mlp_s = take(mlp->activation_elements(mlp_spec, N));
    }
    res_final = take(N * C);
    lnf = take(N * C);
    lnf_s = take(norm->activation_elements(norm_spec, N));
    losses = take(N);
    d_res = take(N * C);
    d_ln = take(N * C);
    d_q = take(N * Hd);
    d_k = take(N * Kd);
    d_v = take(N * Kd);
    d_att = take(N * Hd);
    d_qlin = o.qk_norm ? take(N * Hd) : d_q;
    d_klin = o.qk_norm ? take(N * Kd) : d_k;
    scratch_n = 0;
    for (auto [layer, spec, r] : {std::tuple{emb.get(), &emb_spec, N}, {pos.get(), &pos_spec, N}, {norm.get(), &norm_spec, N},
                                 {lin.get(), &q_spec, N}, {lin.get(), &kv_spec, N}, {lin.get(), &o_spec, N},
                                 {mlp.get(), &mlp_spec, N}, {cls.get(), &cls_spec, N}}) {
      scratch_n = std::max(scratch_n, layer->scratch_elements(*spec, r));
    }
    if (qkn) scratch_n = std::max(scratch_n, qkn->scratch_elements(qkn_spec, N * o.n_heads));
    scratch = take(scratch_n);
    // Grow only: bucketed batches change T from batch to batch, and the plan is re-derived for
    // each shape, but the buffer is allocated (and zeroed) once for the largest.
    planned_elements = at;
    if (act.size() < std::size_t(at)) act.resize(std::size_t(at), 0.0f);
    planned_rows = rows;
    planned_T = T;
  }

  AttentionProblem problem(int64_t rows, int64_t T) const {
    AttentionProblem p;
    p.batch = int32_t(rows);
    p.seq_len = int32_t(T);
    p.heads = int32_t(o.n_heads);
    p.kv_heads = int32_t(o.n_kv_heads);
    p.head_dim = int32_t(o.head_dim);
    p.dtype = DType::f32;
    p.device = DeviceType::cpu;
    p.packed = true;
    return p;
  }

  float* A(int64_t off) { return act.data() + off; }
  // Views from a parameter (or gradient, or saved activation) to the end of its buffer: layers read
  // as many values as they declared.
  TensorView P(int64_t off, int64_t = 0) { return view(params.data() + off, table.total - off, 1); }
  TensorView G(int64_t off, int64_t = 0) { return view(grads.data() + off, table.total - off, 1); }
  TensorView S(int64_t off) { return view(A(off), planned_elements - off, 1); }

  LayerCall call(const LayerSpec& spec, const Batch& b, int64_t rows) {
    LayerCall c;
    c.spec = &spec;
    c.batch = &b;
    c.rows = rows;
    c.scratch = view(A(scratch), scratch_n, 1);
    return c;
  }

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
  }

  // The whole forward up to (and including) the classifier. Training: dropout on, and the
  // classifier writes d(lnf) into d_ln.
  double run_forward(const Batch& b, bool train, double grad_scale, uint64_t key, float* logits_out) {
    check_batch(b);
    plan(b.rows, b.seq_len);
    const int64_t B = b.rows, T = b.seq_len, N = B * T, C = o.d_model, H = o.n_heads, Hk = o.n_kv_heads,
                  D = o.head_dim;
    const double p_drop = train ? o.dropout : 0.0;
    int64_t site = 0;
    auto drop = [&](LayerCall& c) {
      c.dropout = p_drop;
      c.dropout_key = mix(key, uint64_t(++site));
    };
    const AttentionProblem prob = problem(B, T);
    float* x0 = A(acts.empty() ? res_final : acts[0].res);
    {
      LayerCall c = call(emb_spec, b, N);
      c.y = view(x0, N, C);
      c.params = P(wte, o.vocab_padded * C);
      drop(c);
      emb->forward(c);
    }
    if (o.position == "learned") {
      LayerCall c = call(pos_spec, b, N);
      c.x = c.y = view(x0, N, C);
      c.params = P(wpe, o.max_seq_len * C);
      pos->forward(c);
    }
    for (int64_t l = 0; l < o.n_layers; ++l) {
      BlockActs& a = acts[std::size_t(l)];
      const BlockParams& bp = blocks[std::size_t(l)];
      const int64_t next = l + 1 < o.n_layers ? acts[std::size_t(l + 1)].res : res_final;
      {
        LayerCall c = call(norm_spec, b, N);
        c.x = view(A(a.res), N, C);
        c.y = view(A(a.ln1), N, C);
        c.params = P(bp.ln1, 0);
        c.saved = S(a.ln1_s);
        norm->forward(c);
      }
      for (auto [spec, w, out, width] : {std::tuple{&q_spec, bp.q, a.q_lin, H * D}, {&kv_spec, bp.k, a.k_lin, Hk * D},
                                         {&kv_spec, bp.v, a.v, Hk * D}}) {
        LayerCall c = call(*spec, b, N);
        c.x = view(A(a.ln1), N, C);
        c.y = view(A(out), N, width);
        c.params = P(w, 0);
        lin->forward(c);
      }
      if (o.qk_norm) {
        for (auto [w, in, out, s, heads] : {std::tuple{bp.q_norm, a.q_lin, a.q, a.qn_s, H}, {bp.k_norm, a.k_lin, a.k, a.kn_s, Hk}}) {
          LayerCall c = call(qkn_spec, b, N * heads);
          c.x = view(A(in), N * heads, D);
          c.y = view(A(out), N * heads, D);
          c.params = P(w, 0);
          c.saved = S(s);
          qkn->forward(c);
        }
      }
      if (o.position == "rope") {
        for (auto [buf, heads] : {std::pair{a.q, H}, {a.k, Hk}}) {
          LayerCall c = call(pos_spec, b, N);
          c.heads = heads;
          c.x = c.y = view4(A(buf), B, T, heads, D);
          c.x.ndim = c.y.ndim = 3;
          c.x.shape = c.y.shape = {N, heads, D, 0};
          pos->forward(c);
        }
      }
      attn->forward(prob, b, view4(A(a.q), B, T, H, D), view4(A(a.k), B, T, Hk, D), view4(A(a.v), B, T, Hk, D),
                    view4(A(a.att), B, T, H, D), view(A(a.att_s), attn->saved_elements(prob), 1));
      {
        LayerCall c = call(o_spec, b, N);
        c.x = view(A(a.att), N, H * D);
        c.y = view(A(a.mid), N, C);
        c.residual = view(A(a.res), N, C);
        c.params = P(bp.o, 0);
        drop(c);
        lin->forward(c);
      }
      {
        LayerCall c = call(norm_spec, b, N);
        c.x = view(A(a.mid), N, C);
        c.y = view(A(a.ln2), N, C);
        c.params = P(bp.ln2, 0);
        c.saved = S(a.ln2_s);
        norm->forward(c);
      }
      {
        LayerCall c = call(mlp_spec, b, N);
        c.x = view(A(a.ln2), N, C);
        c.y = view(A(next), N, C);
        c.residual = view(A(a.mid), N, C);
        c.params = P(bp.mlp, 0);
        c.saved = S(a.mlp_s);
        drop(c);
        mlp->forward(c);
      }
    }
    {
      LayerCall c = call(norm_spec, b, N);
      c.x = view(A(res_final), N, C);
      c.y = view(A(lnf), N, C);
      c.params = P(ln_f, 0);
      c.saved = S(lnf_s);
      norm->forward(c);
    }
    LayerCall c = call(cls_spec, b, N);
    c.x = view(A(lnf), N, C);
    c.params = P(head, 0);
    c.losses = view(A(losses), N, 1);
    if (logits_out != nullptr) c.logits = view(logits_out, N, o.vocab_padded);
    if (train) {
      c.grads = G(head, 0);
      c.d_x = view(A(d_ln), N, C);
      c.grad_scale = grad_scale;
    }
    cls->forward(c);
    double sum = 0;
    const float* lp = A(losses);
    for (int64_t i = 0; i < N; ++i) {
      if (b.targets[std::size_t(i)] >= 0) sum += double(lp[i]);
    }
    return sum;
  }

  void run_backward(const Batch& b, uint64_t key) {
    const int64_t B = b.rows, T = b.seq_len, N = B * T, C = o.d_model, H = o.n_heads, Hk = o.n_kv_heads,
                  D = o.head_dim;
    const AttentionProblem prob = problem(B, T);
    // Dropout sites are numbered as in forward: 1 = embedding, then (o, mlp) per block.
    auto drop = [&](LayerCall& c, uint64_t site) {
      c.dropout = o.dropout;
      c.dropout_key = mix(key, site);
    };
    {
      LayerCall c = call(norm_spec, b, N);
      c.x = view(A(res_final), N, C);
      c.y = view(A(lnf), N, C);
      c.params = P(ln_f, 0);
      c.grads = G(ln_f, 0);
      c.saved = S(lnf_s);
      c.d_y = view(A(d_ln), N, C);
      c.d_x = view(A(d_res), N, C);
      norm->backward(c);
    }
    for (int64_t l = o.n_layers - 1; l >= 0; --l) {
      BlockActs& a = acts[std::size_t(l)];
      const BlockParams& bp = blocks[std::size_t(l)];
      const int64_t next = l + 1 < o.n_layers ? acts[std::size_t(l + 1)].res : res_final;
      {
        LayerCall c = call(mlp_spec, b, N);
        c.x = view(A(a.ln2), N, C);
        c.y = view(A(next), N, C);
        c.params = P(bp.mlp, 0);
        c.grads = G(bp.mlp, 0);
        c.saved = S(a.mlp_s);
        c.d_y = view(A(d_res), N, C);
        c.d_x = view(A(d_ln), N, C);
        drop(c, uint64_t(2 + 2 * l + 1));
        mlp->backward(c);
      }
      {
        LayerCall c = call(norm_spec, b, N);
        c.x = view(A(a.mid), N, C);
        c.y = view(A(a.ln2), N, C);
        c.params = P(bp.ln2, 0);
        c.grads = G(bp.ln2, 0);
        c.saved = S(a.ln2_s);
        c.d_y = view(A(d_ln), N, C);
        c.d_x = view(A(d_res), N, C);
        c.input_grad = GradMode::accumulate;
        norm->backward(c);
      }
      {
        LayerCall c = call(o_spec, b, N);
        c.x = view(A(a.att), N, H * D);
        c.y = view(A(a.mid), N, C);
        c.params = P(bp.o, 0);
        c.grads = G(bp.o, 0);
        c.d_y = view(A(d_res), N, C);
        c.d_x = view(A(d_att), N, H * D);
        drop(c, uint64_t(2 + 2 * l));
        lin->backward(c);
      }
      attn->backward(prob, b, view4(A(a.q), B, T, H, D), view4(A(a.k), B, T, Hk, D), view4(A(a.v), B, T, Hk, D),
                     view4(A(a.att), B, T, H, D), view(A(a.att_s), attn->saved_elements(prob), 1),
                     view4(A(d_att), B, T, H, D), view4(A(d_q), B, T, H, D), view4(A(d_k), B, T, Hk, D),
                     view4(A(d_v), B, T, Hk, D));
      if (o.position == "rope") {
        for (auto [buf, heads] : {std::pair{d_q, H}, {d_k, Hk}}) {
          LayerCall c = call(pos_spec, b, N);
          c.heads = heads;
          TensorView t = view(A(buf), 0, 0);
          t.ndim = 3;
          t.shape = {N, heads, D, 0};
          c.d_y = c.d_x = t;
          c.x = c.y = t;
          pos->backward(c);
        }
      }
      if (o.qk_norm) {
        for (auto [w, in, out, s, dy, dx, heads] : {std::tuple{bp.q_norm, a.q_lin, a.q, a.qn_s, d_q, d_qlin, H},
                                                    {bp.k_norm, a.k_lin, a.k, a.kn_s, d_k, d_klin, Hk}}) {
          LayerCall c = call(qkn_spec, b, N * heads);
          c.x = view(A(in), N * heads, D);
          c.y = view(A(out), N * heads, D);
          c.params = P(w, 0);
          c.grads = G(w, 0);
          c.saved = S(s);
          c.d_y = view(A(dy), N * heads, D);
          c.d_x = view(A(dx), N * heads, D);
          qkn->backward(c);
        }
      }
      bool first = true;
      for (auto [spec, w, out, dy, width] : {std::tuple{&q_spec, bp.q, a.q_lin, d_qlin, H * D},
                                             {&kv_spec, bp.k, a.k_lin, d_klin, Hk * D}, {&kv_spec, bp.v, a.v, d_v, Hk * D}}) {
        LayerCall c = call(*spec, b, N);
        c.x = view(A(a.ln1), N, C);
        c.y = view(A(out), N, width);
        c.params = P(w, 0);
        c.grads = G(w, 0);
        c.d_y = view(A(dy), N, width);
        c.d_x = view(A(d_ln), N, C);
        c.input_grad = first ? GradMode::overwrite : GradMode::accumulate;
        first = false;
        lin->backward(c);
      }
      {
        LayerCall c = call(norm_spec, b, N);
        c.x = view(A(a.res), N, C);
        c.y = view(A(a.ln1), N, C);
        c.params = P(bp.ln1, 0);
        c.grads = G(bp.ln1, 0);
        c.saved = S(a.ln1_s);
        c.d_y = view(A(d_ln), N, C);
        c.d_x = view(A(d_res), N, C);
        c.input_grad = GradMode::accumulate;
        norm->backward(c);
      }
    }
    float* x0 = A(acts.empty() ? res_final : acts[0].res);
    if (o.position == "learned") {
      LayerCall c = call(pos_spec, b, N);
      c.x = c.y = view(x0, N, C);
      c.params = P(wpe, 0);
      c.grads = G(wpe, 0);
      c.d_y = c.d_x = view(A(d_res), N, C);
      pos->backward(c);
    }
    {
      LayerCall c = call(emb_spec, b, N);
      c.y = view(x0, N, C);
      c.params = P(wte, 0);
      c.grads = G(wte, 0);
      c.d_y = view(A(d_res), N, C);
      drop(c, 1);
      emb->backward(c);
    }
  }
};

Model::Model(const ModelOptions& options, const Registry& registry, const RunContext& run) : impl_(new Impl) {
  Impl& m = *impl_;
  m.o = options;
  m.run = run;
  const ModelOptions& o = m.o;
  m.emb = m.make_layer(registry, "embedding");
  m.pos = m.make_layer(registry, o.position);
  m.norm = m.make_layer(registry, o.norm);
  m.lin = m.make_layer(registry, "linear");
  m.mlp = m.make_layer(registry, o.mlp);
  m.cls = m.make_layer(registry, "cross_entropy");
  if (o.qk_norm) m.qkn = m.make_layer(registry, "rmsnorm");
  {
    static const Params empty{"attention", {}};
    m.attn = registry.create<Attention>(Kind::attention, o.attention, {empty, empty, run});
  }
  const struct {
    Layer* layer;
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
  m.pos_spec.in = o.position == "rope" ? D : C;
  m.pos_spec.max_positions = o.max_seq_len;
  m.pos_spec.rope_theta = o.rope_theta;
  m.norm_spec.in = C;
  m.norm_spec.bias = o.bias;
  m.norm_spec.eps = o.norm == "rmsnorm" ? 1e-6 : 1e-5;
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
  m.qkn_spec.eps = 1e-6;
  m.cls_spec.in = C;
  m.cls_spec.out = o.vocab_padded;
  m.cls_spec.real_out = o.vocab_size;
  m.cls_spec.declare = !o.tie_embeddings;

  m.wte = m.declare(*m.emb, m.emb_spec, "wte");
  if (o.position == "learned") m.wpe = m.declare(*m.pos, m.pos_spec, "wpe");
  for (int64_t l = 0; l < o.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l);
    Impl::BlockParams bp;
    bp.ln1 = m.declare(*m.norm, m.norm_spec, p + ".ln1");
    bp.q = m.declare(*m.lin, m.q_spec, p + ".attn.q");
    bp.k = m.declare(*m.lin, m.kv_spec, p + ".attn.k");
    bp.v = m.declare(*m.lin, m.kv_spec, p + ".attn.v");
    if (o.qk_norm) {
      bp.q_norm = m.declare(*m.qkn, m.qkn_spec, p + ".attn.q_norm");
      bp.k_norm = m.declare(*m.qkn, m.qkn_spec, p + ".attn.k_norm");
    }
    bp.o = m.declare(*m.lin, m.o_spec, p + ".attn.o");
    bp.ln2 = m.declare(*m.norm, m.norm_spec, p + ".ln2");
    const std::size_t first_mlp = m.table.slices.size();
    bp.mlp = m.declare(*m.mlp, m.mlp_spec, p + ".mlp");
    for (std::size_t i = first_mlp; i < m.table.slices.size(); ++i) {
      ParamSlice& s = m.table.slices[i];
      const auto ends = [&](const std::string& suffix) {
        return s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0;
      };
      if ((ends(".proj.weight") || ends(".down.weight")) && s.init_std > 0) s.init_std = resid_std;
    }
    m.blocks.push_back(bp);
  }
  m.ln_f = m.declare(*m.norm, m.norm_spec, "ln_f");
  m.head = o.tie_embeddings ? m.wte : m.declare(*m.cls, m.cls_spec, "lm_head");
  m.params.assign(std::size_t(m.table.total), 0.0f);
  m.grads.assign(std::size_t(m.table.total), 0.0f);
}

Model::~Model() = default;

const ModelOptions& Model::options() const noexcept { return impl_->o; }
const ParamTable& Model::table() const noexcept { return impl_->table; }
int64_t Model::num_params() const noexcept { return impl_->table.total; }
TensorView Model::params() { return view(impl_->params.data(), impl_->table.total, 1); }
TensorView Model::grads() { return view(impl_->grads.data(), impl_->table.total, 1); }
std::vector<float>& Model::param_data() { return impl_->params; }
std::vector<float>& Model::grad_data() { return impl_->grads; }

void Model::init_params(uint64_t seed) {
  Impl& m = *impl_;
  // One generator per slice, seeded from (seed, slice index): a slice's values do not depend on
  // how many values the slices before it drew.
  for (std::size_t i = 0; i < m.table.slices.size(); ++i) {
    const ParamSlice& s = m.table.slices[i];
    float* p = m.params.data() + s.offset;
    if (s.init_std > 0) {
      std::mt19937_64 rng(mix(seed, i + 1));
      std::normal_distribution<double> normal(0.0, s.init_std);
      for (int64_t j = 0; j < s.numel(); ++j) p[j] = float(normal(rng));
    } else {
      std::fill(p, p + s.numel(), float(s.init_value));
    }
  }
  // Padded vocabulary rows are never used: keep them zero.
  const int64_t C = m.o.d_model;
  std::fill(m.params.begin() + m.wte + m.o.vocab_size * C, m.params.begin() + m.wte + m.o.vocab_padded * C, 0.0f);
}

void Model::zero_grads() { std::fill(impl_->grads.begin(), impl_->grads.end(), 0.0f); }

double Model::forward_backward(const Batch& batch, double grad_scale, uint64_t dropout_key) {
  const double sum = impl_->run_forward(batch, true, grad_scale, dropout_key, nullptr);
  impl_->run_backward(batch, dropout_key);
  return sum;
}

double Model::forward(const Batch& batch, std::vector<float>* losses, std::vector<float>* logits) {
  Impl& m = *impl_;
  float* lp = nullptr;
  if (logits != nullptr) {
    logits->assign(std::size_t(batch.positions_total() * m.o.vocab_padded), 0.0f);
    lp = logits->data();
  }
  const double sum = m.run_forward(batch, false, 0.0, 0, lp);
  if (losses != nullptr) losses->assign(m.A(m.losses), m.A(m.losses) + batch.positions_total());
  return sum;
}

double Model::flops_per_token(int64_t seq_len) const noexcept {
  const ModelOptions& o = impl_->o;
  return 6.0 * double(num_params()) + 6.0 * double(o.n_layers) * double(o.d_model) * double(seq_len);
}

int64_t Model::activation_bytes(int64_t rows, int64_t seq_len) const {
  impl_->plan(rows, seq_len);
  return impl_->planned_elements * int64_t(sizeof(float));
}

double Model::measure_matmul_tflops() {
  // 256 rows through a 512 -> 512 linear layer, best of five after a warm-up.
  const int64_t rows = 256, n = 512;
  LayerSpec spec;
  spec.in = spec.out = n;
  spec.bias = false;
  std::vector<float> x(std::size_t(rows * n), 0.5f), w(std::size_t(n * n), 0.01f), y(std::size_t(rows * n));
  Batch none;
  LayerCall c;
  c.spec = &spec;
  c.batch = &none;
  c.rows = rows;
  c.x = view(x.data(), rows, n);
  c.y = view(y.data(), rows, n);
  c.params = view(w.data(), n * n, 1);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    impl_->lin->forward(c);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
  }
  return 2.0 * double(rows * n * n) / best / 1e12;
}

std::string Model::attention_supports(int64_t rows, int64_t seq_len) const {
  return impl_->attn->supports(impl_->problem(rows, seq_len));
}

}  // namespace ablate
