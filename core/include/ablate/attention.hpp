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

// Gradients of q, k, v are written (=), never accumulated.
class Attention : public Component {
 public:
  ~Attention() override;
  // Empty when the backend can serve `problem`, else the reason it cannot.
  virtual std::string supports(const AttentionProblem& problem) const = 0;
  // fp32 values the backend keeps from forward to backward (e.g. softmax statistics, B*H*T).
  virtual int64_t saved_elements(const AttentionProblem& problem) const { (void)problem; return 0; }
  // Device memory the backend holds for `problem` beyond its arguments and `saved` (score
  // matrices, converted copies), in bytes: the memory plan counts it.
  virtual int64_t workspace_bytes(const AttentionProblem& problem) const { (void)problem; return 0; }
  // Whether the backend serves problems with bf16_out or bf16_qkv set (those tensors in bf16
  // beside f32 gradients).
  virtual bool bf16_activations() const { return false; }
  // Whether the backend serves problems with bf16_grads set (d_out read, d_q, d_k, d_v written in
  // bf16; q, k, v and out held in bf16 too).
  virtual bool bf16_gradients() const { return false; }
  // `batch` holds the segment layout on the problem's device (segments, row_segments, segment_ids).
  virtual void forward(const AttentionProblem& problem, const BatchViews& batch, TensorView q, TensorView k,
                       TensorView v, TensorView out, TensorView saved) = 0;
  virtual void backward(const AttentionProblem& problem, const BatchViews& batch, TensorView q, TensorView k,
                        TensorView v, TensorView out, TensorView saved, TensorView d_out, TensorView d_q,
                        TensorView d_k, TensorView d_v) = 0;

  // The queue a device backend enqueues its work on: the model's Device::stream() (cuda: a
  // cudaStream_t; null on the cpu), set by the model before the first call. forward and backward
  // return without waiting for the device.
  void set_stream(Stream stream) noexcept { stream_ = stream; }
  Stream stream() const noexcept { return stream_; }

 private:
  Stream stream_;
};

// Throws (naming `where`, the tensor and what was expected) unless `t` is a (batch, seq_len, heads,
// head_dim) view of the problem's dtype (`out`: its out_dtype(); q, k, v: its qkv_dtype()) on
// `device` with data: the argument check every backend makes on q, k, v, out and their gradients.
void check_attention_tensor(const char* where, const char* name, const TensorView& t, const AttentionProblem& p,
                            int64_t heads, DeviceType device);
// That check on every tensor of a forward call (q, k, v, out), or of a backward call (and d_out,
// d_q, d_k, d_v): q-like tensors have p.heads heads, k- and v-like ones p.kv_heads.
void check_attention_forward_tensors(const char* where, const AttentionProblem& p, DeviceType device, const TensorView& q,
                                     const TensorView& k, const TensorView& v, const TensorView& out);
void check_attention_backward_tensors(const char* where, const AttentionProblem& p, DeviceType device, const TensorView& q,
                                      const TensorView& k, const TensorView& v, const TensorView& out,
                                      const TensorView& d_out, const TensorView& d_q, const TensorView& d_k,
                                      const TensorView& d_v);

}  // namespace ablate
