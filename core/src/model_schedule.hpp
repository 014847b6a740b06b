// The model's schedule as data: every call the forward pass makes (a "site": which layer, its
// spec, its parameters, which activation slots it reads and writes, how its input gradient is
// written, its dropout site), built once when the model is assembled. Forward walks the sites in
// order; backward walks the same list in reverse with each site's gradient slots, so the wiring
// and the dropout numbering are written once and cannot drift between the two passes.
//
// Slots name regions of the activation arena; their offsets depend on the micro-batch shape and
// come from a pure plan (ArenaPlan), so a shape's bytes are known without allocating them.
// N = B*T rows, C = d_model, H/Hk query/kv heads, D = head_dim.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/runtime/buckets.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/model.hpp"

namespace ablate::schedule {

enum class Slot : uint8_t {
  none,
  // Per block l (block n_layers has only `res`, the stream after the last block).
  res,    // (N, C)    the residual stream entering block l (block 0: the embeddings)
  ln1,    // (N, C)    norm1(res); ln1, ln2 and lnf are bf16 when the model holds product inputs so
  ln1_s,  //           norm1's saved values
  q_lin,  // (N, H*D)  q projection (q_lin..k bf16 when the model holds q, k, v so)
  k_lin,  // (N, Hk*D) k projection
  v,      // (N, Hk*D) v projection
  q,      // (N, H*D)  q after qk-norm (= q_lin without it), rotated in place by rope
  k,      // (N, Hk*D) k likewise
  qn_s,   //           q-norm's saved values
  kn_s,   //           k-norm's saved values
  att,    // (N, H*D)  attention output (bf16 when the backend writes it so, under bf16 held inputs)
  att_s,  //           the attention backend's saved values (e.g. softmax statistics)
  mid,    // (N, C)    res + o(att)
  ln2,    // (N, C)    norm2(mid)
  ln2_s,  //           norm2's saved values
  mlp_s,  //           the MLP's saved values
  // Shared by every block (block -1).
  lnf,      // (N, C)    final norm of the stream
  lnf_s,    //           its saved values
  losses,   // (N)       per-position loss
  d_res,    // (N, C)    gradient of the residual stream
  d_ln,     // (N, C)    gradient of a norm's output
  d_q,      // (N, H*D)  gradient of q (after qk-norm and rope)
  d_k,      // (N, Hk*D)
  d_v,      // (N, Hk*D)
  d_att,    // (N, H*D)  gradient of the attention output
  d_qlin,   // (N, H*D)  gradient of q_lin (= d_q without qk-norm)
  d_klin,   // (N, Hk*D)
  scratch,  //           the largest scratch any layer asks for
  count
};

inline constexpr int kSlots = int(Slot::count);

struct Ref {
  int32_t block = -1;  // -1: a shared slot
  Slot slot = Slot::none;
  bool set() const noexcept { return slot != Slot::none; }
};

inline Ref shared(Slot s) { return {-1, s}; }
inline Ref in_block(int64_t l, Slot s) { return {int32_t(l), s}; }

// The arena's offsets (f32 elements) for one micro-batch shape, and what each slot holds: f32, or
// bf16 (two values to an f32 element) for an activation only bf16 products read.
struct ArenaPlan {
  int64_t rows = 0, seq_len = 0;
  int64_t elements = 0;
  int64_t bf16_elements = 0;  // of `elements`, those holding bf16 values (two to an element)
  int64_t scratch_elements = 0;
  std::vector<int64_t> offsets;  // (n_layers + 2) * kSlots; index (block + 1) * kSlots + slot
  std::vector<DType> dtypes;     // likewise
  static std::size_t index(Ref r) { return std::size_t((r.block + 1) * kSlots + int(r.slot)); }
  int64_t at(Ref r) const { return offsets[index(r)]; }
  DType dtype(Ref r) const { return dtypes[index(r)]; }
};

enum class Op : uint8_t { layer, attention };

struct Site {
  Op op = Op::layer;
  Layer* layer = nullptr;
  const LayerSpec* spec = nullptr;
  int64_t param = -1;     // offset of the layer's first parameter in the flat buffers (-1: none)
  int64_t row_heads = 1;  // the call's rows are N * row_heads (qk-norm normalises each head)
  int64_t heads = 1;      // rope: x is (N, heads, D)
  int64_t x_cols = 0, y_cols = 0;
  // Forward: input, output, residual added to the output, values kept for backward.
  Ref x, y, residual, saved;
  // Backward: gradient of the output (read) and of the input (written as input_grad says).
  Ref d_y, d_x;
  GradMode input_grad = GradMode::overwrite;
  uint64_t dropout_site = 0;  // 0: no dropout on the output
  // The attention's projections: which one ("q", "k", "v", "o"; null elsewhere) in which block, and
  // where an adapter sits on it: its parameters' offset (-1: none) and its index among the adapters.
  const char* target = nullptr;
  int32_t block = -1;
  int64_t adapter_param = -1;
  int32_t adapter_index = -1;
  // Attention sites: q, k, v -> out (= x... y unused), and their gradients.
  struct {
    Ref q, k, v, out, saved, d_out, d_q, d_k, d_v;
  } attn;
};

// The specs of every layer call the model makes, from its options (the position layer's width
// depends on where it applies: the stream, or each head of q and k).
struct LayerSpecs {
  LayerSpec emb, pos, norm, q, kv, o, mlp, qkn, cls;
};
LayerSpecs make_specs(const ModelOptions& o, PositionSite position);

// The layers a block is assembled from (qkn: null without qk-norm).
struct ModelLayers {
  Layer *emb = nullptr, *pos = nullptr, *norm = nullptr, *lin = nullptr, *mlp = nullptr, *qkn = nullptr;
  LossLayer* cls = nullptr;
  Layer* adapter = nullptr;  // [adapter]: on the targeted projections, declared after every base parameter
};

// The forward pass as sites, and what backward needs to walk it.
struct Schedule {
  std::vector<Site> sites;                                       // in forward order (the classifier follows the last)
  std::vector<std::pair<std::size_t, std::size_t>> block_sites;  // each block's first and last site
  int64_t head = 0;                                              // the classifier's weight (the embedding's when tied)
  int64_t ln_f_param = 0;                                        // the final norm's parameters
  std::vector<GradRange> writes;                                 // the gradient writes of one backward pass, in order
  // With an adapter: where its parameters begin (every parameter before is the frozen base; the
  // gradient buffer and `writes` then cover only [adapter_begin, total), offsets relative to it),
  // and how many projections carry one. Without: 0 and 0 (everything trains).
  int64_t adapter_begin = 0;
  int32_t adapter_sites = 0;
};

// Declares every parameter into `table` (in the order of the forward pass, the adapters' last) and
// writes down every call of the forward pass. `specs` must outlive the schedule: sites point into it.
Schedule build_schedule(const ModelOptions& o, const ModelLayers& layers, const LayerSpecs& specs, ParamTable& table);

// The adapter's targets a model accepts (ModelOptions::adapter_targets).
inline constexpr const char* kAdapterTargets[] = {"q", "k", "v", "o"};

}  // namespace ablate::schedule
