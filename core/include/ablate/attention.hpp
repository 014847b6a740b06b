// Attention backend interface: causal softmax attention over the batch's segment layout
// (block-diagonal causal for packed rows: position i of a segment sees positions start..i of the
// same segment only; padding positions (segment id 0) produce zeros and take no gradient), GQA
// (n_kv_heads divides n_heads; query head h reads kv head h / (heads / kv_heads)), scale
// 1/sqrt(head_dim). Layout of q: (B, T, H, D); k, v: (B, T, Hkv, D); out: (B, T, H, D), contiguous.
#pragma once

#include <cstdint>
#include <string>

#include "ablate/device.hpp"
#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

struct AttentionProblem {
  int32_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::f32;
  DeviceType device = DeviceType::cpu;
  bool packed = false;  // rows hold several segments
  // out (forward's output, backward's input) is bf16 while the gradients are `dtype`: the model
  // holds the attention output, which only the output projection's bf16 products read, in bf16
  // (run.dtype = "bf16", a backend whose bf16_activations() says yes).
  bool bf16_out = false;
  // q, k and v (the inputs of both passes) are bf16 while the gradients are `dtype` (likewise,
  // when the layers that write them can, LayerBase::bf16_attention_inputs).
  bool bf16_qkv = false;
  // d_out, d_q, d_k and d_v are bf16 while `dtype` is f32: the model holds the attention's
  // gradients in bf16 (run.dtype = "bf16", a backend whose bf16_gradients() says yes, projections
  // that read and write them so: LayerBase::bf16_attention_grads).
  bool bf16_grads = false;
  DType out_dtype() const noexcept { return bf16_out ? DType::bf16 : dtype; }
  DType qkv_dtype() const noexcept { return bf16_qkv ? DType::bf16 : dtype; }
  DType grad_dtype() const noexcept { return bf16_grads ? DType::bf16 : dtype; }
};

// One call of a backend, as a layer's is one LayerCall: the problem, the batch's segment layout
// on the problem's device (segments, row_segments, segment_ids), the tensors, and the queue to
// enqueue on (the model's Device::stream(): cuda a cudaStream_t, null on the cpu). forward reads q,
// k, v and writes out and saved; backward reads q, k, v, out, saved and d_out and writes d_q, d_k,
// d_v (=, never accumulated). Both return without waiting for the device.
struct AttentionCall {
  const AttentionProblem* problem = nullptr;
  const BatchViews* batch = nullptr;
  TensorView q, k, v, out, saved;
  TensorView d_out, d_q, d_k, d_v;  // backward only
  Stream stream;
};

class Attention : public Component {
 public:
  ~Attention() override;
  // Empty when the backend can serve `problem`, else the reason it cannot.
  virtual std::string supports(const AttentionProblem& problem) const = 0;
  // fp32 values the backend keeps from forward to backward (e.g. softmax statistics, B*H*T).
  virtual int64_t saved_elements(const AttentionProblem& problem) const {
    (void)problem;
    return 0;
  }
  // Device memory the backend holds for `problem` beyond its arguments and `saved` (score
  // matrices, converted copies), in bytes: the memory plan counts it.
  virtual int64_t workspace_bytes(const AttentionProblem& problem) const {
    (void)problem;
    return 0;
  }
  // Whether the backend serves problems with bf16_out or bf16_qkv set (those tensors in bf16
  // beside f32 gradients).
  virtual bool bf16_activations() const { return false; }
  // Whether the backend serves problems with bf16_grads set (d_out read, d_q, d_k, d_v written in
  // bf16; q, k, v and out held in bf16 too).
  virtual bool bf16_gradients() const { return false; }
  virtual void forward(const AttentionCall& call) = 0;
  virtual void backward(const AttentionCall& call) = 0;
};

// Throws (naming `where`, the tensor and what was expected) unless `t` is a (batch, seq_len, heads,
// head_dim) view of the problem's dtype (`out`: its out_dtype(); q, k, v: its qkv_dtype()) on
// `device` with data: the argument check every backend makes on q, k, v, out and their gradients.
void check_attention_tensor(const char* where, const char* name, const TensorView& t, const AttentionProblem& p, int64_t heads,
                            DeviceType device);
// That check on every tensor of a forward call (q, k, v, out), or of a backward call (and d_out,
// d_q, d_k, d_v): q-like tensors have p.heads heads, k- and v-like ones p.kv_heads.
// Also throws when the call has no problem or no batch.
void check_attention_forward_tensors(const char* where, const AttentionCall& call, DeviceType device);
void check_attention_backward_tensors(const char* where, const AttentionCall& call, DeviceType device);

}  // namespace ablate
