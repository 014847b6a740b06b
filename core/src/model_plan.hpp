// The activation plan and the bf16 policy of a model, as pure functions of shapes, the layers'
// answers and the recompute mode: no device, no allocation. The model lays its arena out with
// plan_arena; `ablate tune` and the memory report ask the same function what a shape would cost.
#pragma once

#include <cstdint>
#include <string>

#include "model_schedule.hpp"

namespace ablate::schedule {

// Which activations a run holds in bf16 (run.dtype = "bf16"). Each level needs the one before:
// the norms' outputs (ln1, ln2, lnf) when every reader of them takes bf16 product inputs; then the
// attention output when the backend writes it so; then q, k, v (q_lin, k_lin, v, q, k) when the
// layers that write or rotate them take bf16 too; then the attention's gradients when the backend
// and those layers take them in bf16.
struct Bf16Policy {
  bool norm_outputs = false;
  bool attention_out = false;
  bool qkv = false;
  bool grads = false;     // the attention's gradients (d_q, d_k, d_v, d_att and the projections' d_qlin, d_klin)
  bool residual = false;  // the residual stream (res, mid): run.residual_dtype = "bf16", on the norms' outputs in bf16

  // What the chosen layers answer (LayerBase::bf16_product_inputs, Attention::bf16_activations,
  // LayerBase::bf16_attention_inputs).
  struct Answers {
    bool products_take_bf16 = false;     // the norm, linear, MLP and classifier layers all do
    bool attention_writes_bf16 = false;  // the attention backend
    bool qkv_layers_take_bf16 = false;   // linear, and rope and qk-norm where the model has them
    bool attention_grads_bf16 = false;   // the backend (Attention::bf16_gradients)
    bool grad_layers_take_bf16 = false;  // the same layers (LayerBase::bf16_attention_grads)
    // Every layer that touches the residual stream (LayerBase::bf16_residual): "" when they all
    // take it in bf16, else the first that does not (named in the refusal).
    std::string residual_refused_by;
  };
  // `bf16_residual`: run.residual_dtype = "bf16", which Model has checked the answers allow.
  static Bf16Policy decide(bool bf16_run, const Answers& a, bool bf16_residual = false);

  // The type a slot's values are held in.
  DType slot_dtype(Slot s) const;
};

// The model's dimensions the plan depends on.
struct PlanShape {
  int64_t n_layers = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool qk_norm = false;
};

// What the layers ask for at one shape (elements of f32): the values each saves for backward and
// the largest scratch any of them needs.
struct SavedSizes {
  int64_t norm = 0;       // a block norm over N rows (ln1, ln2, lnf)
  int64_t q_norm = 0;     // qk-norm over N * n_heads rows
  int64_t k_norm = 0;     // qk-norm over N * n_kv_heads rows
  int64_t attention = 0;  // the attention backend
  int64_t mlp = 0;
  int64_t mlp_bf16 = 0;  // of `mlp`, the elements holding bf16 values (Layer::activation_bf16_elements)
  int64_t scratch = 0;
};

// Whether backward recomputes `slot` of a block under `recompute` ("none", "mlp", "block") rather
// than read it from forward: such a slot is held once, in block 0's place.
bool recomputed(Slot slot, const std::string& recompute);

// The arena for `rows` x `seq_len`: every slot 256 bytes aligned, bf16 slots at two values to an
// f32 element, slots without qk-norm aliased (q = q_lin, d_qlin = d_q, ...).
ArenaPlan plan_arena(const PlanShape& shape, const Bf16Policy& bf16, const std::string& recompute, int64_t rows, int64_t seq_len,
                     const SavedSizes& saved);

}  // namespace ablate::schedule
