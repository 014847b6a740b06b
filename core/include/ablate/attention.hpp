// Attention backend interface: causal softmax attention over the batch's segment layout
// (block-diagonal causal for packed rows), GQA (n_kv_heads divides n_heads), forward and backward.
// Layout of q: (B, T, H, D); k, v: (B, T, Hkv, D); out: (B, T, H, D).
#pragma once

#include <cstdint>
#include <string>

#include "ablate/batch.hpp"
#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

struct AttentionProblem {
  int32_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::f32;
  DeviceType device = DeviceType::cpu;
  bool packed = false;  // rows hold several segments
};

// Gradients of q, k, v are written (=), never accumulated.
class Attention : public Component {
 public:
  ~Attention() override;
  // Empty when the backend can serve `problem`, else the reason it cannot.
  virtual std::string supports(const AttentionProblem& problem) const = 0;
  virtual void forward(const AttentionProblem& problem, const Batch& batch, TensorView q, TensorView k,
                       TensorView v, TensorView out) = 0;
  virtual void backward(const AttentionProblem& problem, const Batch& batch, TensorView q, TensorView k,
                        TensorView v, TensorView out, TensorView d_out, TensorView d_q, TensorView d_k,
                        TensorView d_v) = 0;
  // FLOPs of forward for `problem` on `batch`, causal counted once (what it actually computes).
  virtual double forward_flops(const AttentionProblem& problem, const Batch& batch) const = 0;
};

}  // namespace ablate
