// The activation plan and the bf16 policy (model_plan.hpp).
#include "model_plan.hpp"

#include <algorithm>

namespace ablate::schedule {

Bf16Policy Bf16Policy::decide(bool bf16_run, const Answers& a, bool bf16_residual) {
  Bf16Policy p;
  p.norm_outputs = bf16_run && a.products_take_bf16;
  p.attention_out = p.norm_outputs && a.attention_writes_bf16;
  p.qkv = p.attention_out && a.qkv_layers_take_bf16;
  p.grads = p.qkv && a.attention_grads_bf16 && a.grad_layers_take_bf16;
  p.residual = bf16_residual && p.norm_outputs && a.residual_refused_by.empty();
  return p;
}

DType Bf16Policy::slot_dtype(Slot s) const {
  const bool norm_output = s == Slot::ln1 || s == Slot::ln2 || s == Slot::lnf;
  const bool qkv_slot = s == Slot::q_lin || s == Slot::k_lin || s == Slot::v || s == Slot::q || s == Slot::k;
  const bool grad_slot =
      s == Slot::d_q || s == Slot::d_k || s == Slot::d_v || s == Slot::d_att || s == Slot::d_qlin || s == Slot::d_klin;
  const bool stream = s == Slot::res || s == Slot::mid;
  const bool bf16 = (norm_outputs && norm_output) || (attention_out && s == Slot::att) || (qkv && qkv_slot) || (grads && grad_slot) ||
                    (residual && stream);
  return bf16 ? DType::bf16 : DType::f32;
}

bool recomputed(Slot slot, const std::string& recompute) {
  if (recompute == "block") return slot != Slot::res;
  if (recompute == "mlp") return slot == Slot::mlp_s;
  return false;
}

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Slots taken one after another; a slot backward recomputes is held once, in block 0's place, for
// whichever block is being recomputed (forward overwrites it block after block; only `res`
// carries between blocks).
struct Layout {
  ArenaPlan& p;
  const Bf16Policy& bf16;
  const std::string& recompute;

  // `bf16_held`: of a slot typed f32, the elements a layer keeps bf16 values in (its saved values).
  void keep(Ref r, int64_t n, int64_t bf16_held = 0) {
    const DType t = bf16.slot_dtype(r.slot);
    p.offsets[ArenaPlan::index(r)] = p.elements;
    p.dtypes[ArenaPlan::index(r)] = t;
    const int64_t values = std::max<int64_t>(n, 0);
    // 256 bytes apart: every slot as aligned as the packed copies bf16 products would otherwise
    // make of it, so reading a held slot in place plans (and rounds) exactly like the copy.
    const int64_t size = round_up(t == DType::bf16 ? (values + 1) / 2 : values, 64);
    p.elements += size;
    p.bf16_elements += t == DType::bf16 ? size : std::min(size, std::max<int64_t>(bf16_held, 0));
  }
  void alias(Ref r, Ref to) {
    p.offsets[ArenaPlan::index(r)] = p.at(to);
    p.dtypes[ArenaPlan::index(r)] = p.dtype(to);
  }
  void take(Ref r, int64_t n, int64_t bf16_held = 0) {
    if (r.block > 0 && recomputed(r.slot, recompute)) alias(r, in_block(0, r.slot));
    else keep(r, n, bf16_held);
  }
};

}  // namespace

ArenaPlan plan_arena(const PlanShape& shape, const Bf16Policy& bf16, const std::string& recompute, int64_t rows, int64_t seq_len,
                     const SavedSizes& saved) {
  const int64_t N = rows * seq_len, C = shape.d_model, Hd = shape.n_heads * shape.head_dim, Kd = shape.n_kv_heads * shape.head_dim;
  ArenaPlan p;
  p.rows = rows;
  p.seq_len = seq_len;
  p.offsets.assign(std::size_t((shape.n_layers + 2) * kSlots), 0);
  p.dtypes.assign(p.offsets.size(), DType::f32);
  Layout a{p, bf16, recompute};
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    auto B = [l](Slot s) { return in_block(l, s); };
    a.take(B(Slot::res), N * C);
    a.take(B(Slot::ln1), N * C);
    a.take(B(Slot::ln1_s), saved.norm);
    a.take(B(Slot::q_lin), N * Hd);
    a.take(B(Slot::k_lin), N * Kd);
    a.take(B(Slot::v), N * Kd);
    if (shape.qk_norm) {
      a.take(B(Slot::q), N * Hd);
      a.take(B(Slot::k), N * Kd);
      a.take(B(Slot::qn_s), saved.q_norm);
      a.take(B(Slot::kn_s), saved.k_norm);
    } else {
      a.alias(B(Slot::q), B(Slot::q_lin));
      a.alias(B(Slot::k), B(Slot::k_lin));
    }
    a.take(B(Slot::att), N * Hd);
    a.take(B(Slot::att_s), saved.attention);
    a.take(B(Slot::mid), N * C);
    a.take(B(Slot::ln2), N * C);
    a.take(B(Slot::ln2_s), saved.norm);
    a.take(B(Slot::mlp_s), saved.mlp, saved.mlp_bf16);
  }
  a.keep(in_block(shape.n_layers, Slot::res), N * C);
  a.keep(shared(Slot::lnf), N * C);
  a.keep(shared(Slot::lnf_s), saved.norm);
  a.keep(shared(Slot::losses), N);
  a.keep(shared(Slot::d_res), N * C);
  a.keep(shared(Slot::d_ln), N * C);
  a.keep(shared(Slot::d_q), N * Hd);
  a.keep(shared(Slot::d_k), N * Kd);
  a.keep(shared(Slot::d_v), N * Kd);
  a.keep(shared(Slot::d_att), N * Hd);
  if (shape.qk_norm) {
    a.keep(shared(Slot::d_qlin), N * Hd);
    a.keep(shared(Slot::d_klin), N * Kd);
  } else {
    a.alias(shared(Slot::d_qlin), shared(Slot::d_q));
    a.alias(shared(Slot::d_klin), shared(Slot::d_k));
  }
  p.scratch_elements = saved.scratch;
  a.keep(shared(Slot::scratch), p.scratch_elements);
  return p;
}

}  // namespace ablate::schedule
