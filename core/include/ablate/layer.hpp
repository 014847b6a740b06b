// Layer interface: the pieces a model is assembled from, each an explicit forward/backward pair.
//
// Roles (one component may serve one role):
//   embedding   y(rows, in) = table[tokens]                     params: weight (out=vocab_padded, in)
//   position    where position_site() says: on the stream (learned: y = x + table[positions];
//               x, y: (rows, in); may alias) or on q and k (rope: y = rotate(x) by positions;
//               x, y: (rows, heads, in); may alias)
//   norm        y = norm(x) over the last dim `in`; x, y: (rows, in)  (qk-norm: rows*heads rows)
//   linear      y = x W^T + b (+ residual)                       params: weight (out, in), bias (out)
//   mlp         y = proj(act(fc(x))) (+ residual); hidden width `out`
//   classifier  per-row softmax cross-entropy of x W^T against batch targets (-1 = no loss), over the
//               first `real_out` columns of `out` (padded vocabulary columns never enter the softmax)
//   adapter     added to a linear layer's output: y += f(x), where x (rows, in) and y (rows, out) are
//               the linear's (spec is the linear's; the adapter declares its own parameters, under the
//               linear's prefix, and reads its rank and scale from its keys). Forward runs after the
//               linear's forward; backward after the linear's backward, and always adds to d_x (=
//               the linear has written or added its part); call.dropout is the adapter's own dropout
//               on x. LoRA: f(x) = scale * dropout(x) A^T B^T.
//
// Frozen parameters: a backward call whose `grads` is empty computes no parameter gradient (only
// d_x); the model freezes every layer's parameters so when an adapter trains alone.
//
// Gradient contract (as llm.c): parameter gradients accumulate (+=); the input gradient d_x is
// written (=) unless the call asks for GradMode::accumulate (residual streams). A layer with a
// `residual` input passes d_y through to the residual unchanged, which the model does by sharing
// one buffer, so the layer itself never writes a residual gradient.
//
// The classifier is fused (LossLayer): one call computes the loss and, when d_x is set, the
// gradients at once (scaled by grad_scale), so the (rows, vocab) logits are never kept.
//
// Every CPU layer works on f32 (training) and f64 (gradient checks) views; all views of one call
// share the dtype. Layers are stateless kernels: one object serves every place it is used.
// Device: a layer's registration says the devices it serves (ComponentInfo::devices); the model
// asks the registry for (name, run.device), so "layernorm" names the same layer on every device.
#pragma once

#include <cstdint>
#include <string>

#include "ablate/device.hpp"
#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

enum class GradMode { overwrite, accumulate };

enum class LayerRole { embedding, position, norm, linear, mlp, classifier, adapter };
const char* to_string(LayerRole role) noexcept;

// Where the model applies a position layer (role position):
//   stream  once, on the token embeddings: y = x + f(positions), x and y (rows, in = d_model), may
//           alias; the layer's parameters (if any) are declared under "wpe" (learned);
//   qk      in every block, in place on q and on k, per head: x = y (rows, heads, in = head_dim),
//           forward, and on their gradients backward; no parameters (rope).
enum class PositionSite { stream, qk };
const char* to_string(PositionSite site) noexcept;

// What one use of a layer looks like (the model fills the fields its role needs).
struct LayerSpec {
  int64_t in = 0;             // input width (features per row; rope and qk-norm: head_dim)
  int64_t out = 0;            // linear: output width; mlp: hidden width; embedding/classifier: padded vocab
  int64_t real_out = 0;       // classifier: the real vocabulary (columns >= real_out are excluded)
  int64_t max_positions = 0;  // learned positions: rows of the table
  bool bias = true;           // linear, mlp, layernorm: with bias parameters
  double eps = 1e-5;          // norms
  double init_std = 0.02;     // weights (residual output projections: 0.02/sqrt(2*n_layers))
  bool declare = true;        // classifier: false when tied to the embedding (no own params)
};

// One call. Shapes are those of LayerSpec; `rows` is B*T (qk-norm: B*T*heads).
struct LayerCall {
  const LayerSpec* spec = nullptr;
  const BatchViews* batch = nullptr;  // tokens, targets, positions on the model's device (rows = B*T except norms)
  int64_t rows = 0;
  int64_t heads = 1;    // rope: x is (rows, heads, in)
  TensorView x, y;      // forward input and output (backward: the same tensors again)
  TensorView residual;  // linear, mlp: when set, y = residual + f(x) (may alias y)
  TensorView d_y, d_x;  // backward: gradient of the output (in), of the input (out)
  GradMode input_grad = GradMode::overwrite;
  TensorView params, grads;  // at the layer's first parameter in the flat buffers
  TensorView params_bf16;    // run.dtype = "bf16": the bf16 copy of params (same offsets), else empty
  TensorView saved;          // activation_elements(spec, rows) values, kept forward -> backward
  TensorView scratch;        // scratch_elements(spec, rows) values, free between calls
  // scaling_state_elements(spec) f32 values of this call site that persist across steps and go
  // into checkpoints (FP8 delayed scaling's amax histories and scales); zeros in a fresh run.
  TensorView scaling_state;
  Stream stream;  // the model's device queue (Device::stream(); null on the cpu)
  // x is the tensor the call just before this one on the stream (forward: the previous site's
  // forward; backward: the next site's backward) read as its x, a call of the same layer with the
  // same width, and nothing has written x since: what the layer derived from it then (a quantised
  // copy and its scale) may serve again. The model sets it; false is always correct.
  bool x_unchanged = false;
  // weight_cache_bytes(spec) bytes of this call site's device memory, as the layer left them at its
  // last call here (garbage before the first), and whether that call was made with the parameters
  // as they are now (the same step: no optimizer update, init, load or end of step since): what the
  // layer derived from its weights then (FP8 copies and their scales) may serve again. The model
  // sets both; weights_unchanged false is always correct.
  TensorView weight_cache;
  bool weights_unchanged = false;
  // Dropout on the layer's output (linear, mlp, embedding) before any residual add; the mask is a
  // pure function of (dropout_key, element index), so backward regenerates it. 0 = off.
  double dropout = 0.0;
  uint64_t dropout_key = 0;
  // Classifier only.
  TensorView losses;        // (rows): loss per row, 0 where the target is -1
  TensorView logits;        // optional (rows, out) output
  double grad_scale = 0.0;  // d(loss_sum * grad_scale)/d x is written to d_x when d_x is set
};

// What a call site's scaling state says of the step just ended (LayerBase::scaling_report): how many
// values its products' operands saturated at (FP8: beyond the format's largest value at the scale
// used), in all its tensors and in the worst one.
struct ScalingReport {
  int64_t saturated = 0, worst = 0;
};

// What every layer has: its role, its parameters and the memory it needs.
class LayerBase : public Component {
 public:
  ~LayerBase() override;
  virtual LayerRole role() const = 0;
  // Appends this layer's parameters to `table` under `prefix` ("blocks.0.ln1").
  virtual void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const = 0;
  // Values (of the call's dtype) the layer keeps from forward to backward, and scratch it needs.
  virtual int64_t activation_elements(const LayerSpec& spec, int64_t rows) const = 0;
  // Of activation_elements, how many hold bf16 values (two to an element) rather than f32: what
  // the memory report counts as bf16 (a GELU MLP's hidden activation under bf16 products).
  virtual int64_t activation_bf16_elements(const LayerSpec& spec, int64_t rows) const {
    (void)spec;
    (void)rows;
    return 0;
  }
  virtual int64_t scratch_elements(const LayerSpec& spec, int64_t rows) const {
    (void)spec;
    (void)rows;
    return 0;
  }
  // Device memory the layer's plugin holds for a call of `rows` beyond its arguments (buffers of
  // its own, grown to the largest call and kept), in bytes. The memory plan counts the largest of
  // any layer's (a plugin's buffers serve all its layers in turn).
  virtual int64_t workspace_bytes(const LayerSpec& spec, int64_t rows) const {
    (void)spec;
    (void)rows;
    return 0;
  }
  // Whether the layer takes, as bf16 views, the activations that only matrix products read: a norm
  // writes its output y in bf16, a linear, MLP or classifier reads its input x in bf16. Under
  // run.dtype = "bf16" the model holds those activations (the norms' outputs) in bf16 when the norm
  // and every layer reading them say yes: half their bytes, and no per-product copy of them.
  virtual bool bf16_product_inputs() const { return false; }
  // Whether the layer reads and writes the attention's inputs q, k and v as bf16 views: a linear
  // writes its output y in bf16 (without a residual or dropout), rope rotates bf16 values, a norm
  // (the qk-norm) reads x and writes y in bf16. Under run.dtype = "bf16" with an attention backend
  // that takes bf16 q, k, v (Attention::bf16_activations), the model holds them in bf16 when every
  // layer that touches them says yes.
  virtual bool bf16_attention_inputs() const { return false; }
  // Whether the layer takes the attention's gradients as bf16 views: a linear reads d_y in bf16
  // where its y is q, k or v, and writes d_x in bf16 (overwriting) where its x is the attention
  // output. Under run.dtype = "bf16" with q, k, v and the output held in bf16 and a backend that
  // takes bf16 gradients (Attention::bf16_gradients), the model holds d_q, d_k, d_v and the
  // attention output's gradient in bf16 when every layer that touches them says yes.
  virtual bool bf16_attention_grads() const { return false; }
  // Whether the layer reads and writes the residual stream as bf16 views: an embedding writes y in
  // bf16, a position table added to the stream reads and writes it in bf16, a norm reads x in bf16
  // (forward and backward, its y then bf16 too), a linear or MLP with a residual reads the residual
  // and writes y in bf16 (the sum rounded once). The stream's gradient stays f32. Under
  // run.residual_dtype = "bf16" the model holds the stream in bf16; every layer that touches it
  // must say yes, or the run is refused (exit 2) naming the one that does not.
  virtual bool bf16_residual() const { return false; }
  // State a call site keeps from step to step (LayerCall::scaling_state: FP8 delayed scaling's
  // amax histories and scales), in f32 values, 0 = none; and what the layer does with it once per
  // optimizer step, after the optimizer (a call with spec, scaling_state and stream set): the amax
  // of the step pushed into its history and the scales set from it. The model keeps the values
  // (zeros at first), saves them in checkpoints and, with several ranks, takes the max of each
  // value across ranks before end_step (the amax of the whole job's batch).
  virtual int64_t scaling_state_elements(const LayerSpec& spec) const {
    (void)spec;
    return 0;
  }
  // Device memory a call site (the classifier's call too) keeps from one call to the next for what
  // the layer derives from its weights (LayerCall::weight_cache, weights_unchanged: FP8 copies of
  // the weights, made once a step rather than once a micro-batch, pass and chunk), in bytes, 0 =
  // none. Not saved in checkpoints; the model's state_bytes counts it.
  virtual int64_t weight_cache_bytes(const LayerSpec& spec) const {
    (void)spec;
    return 0;
  }
  virtual void end_step(const LayerCall& call) { (void)call; }
  // After end_step: what `state` (the site's scaling state, copied to host memory) says of the step.
  virtual ScalingReport scaling_report(const LayerSpec& spec, const float* state) const {
    (void)spec;
    (void)state;
    return {};
  }
  // A position layer: where the model applies it (PositionSite above). Other roles: unused.
  virtual PositionSite position_site() const { return PositionSite::stream; }
  // What the layer answers for [model] keys left at 0, so that the model names no layer: a norm's
  // epsilon (model.norm_eps = 0; 1e-6 for rmsnorm), an MLP's hidden width for the model width
  // (model.mlp_hidden = 0; 8/3 d rounded up to 64 for swiglu_mlp). Other roles: unused.
  virtual double default_epsilon() const { return 1e-5; }
  virtual int64_t default_hidden(int64_t d_model) const { return 4 * d_model; }
  // Why the layer cannot serve `spec` ("" = it can): asked by the model for every use before any
  // parameter is declared, and refused (exit 2) naming the [model] key that chose the layer (rope:
  // an odd head_dim).
  virtual std::string unsupported(const LayerSpec& spec) const {
    (void)spec;
    return "";
  }
  // An adapter: the dropout the model applies to its input while training (LayerCall::dropout),
  // from the adapter's own keys (0 = none); and what the model's description says of it, the
  // values its weights depend on ("rank=8,alpha=16"), which a checkpoint compares on resume.
  virtual double input_dropout() const { return 0.0; }
  virtual std::string describe_keys() const { return ""; }
};

// A layer of the residual stream: an explicit forward/backward pair.
class Layer : public LayerBase {
 public:
  ~Layer() override;
  virtual void forward(const LayerCall& call) = 0;
  virtual void backward(const LayerCall& call) = 0;
};

// The classifier (role classifier): the loss of every row into call.losses and, when call.d_x is
// set, the gradients in the same pass (d_x written, the weight gradient accumulated, both of
// grad_scale * sum(losses)), so the (rows, vocab) logits never have to be kept for a backward.
class LossLayer : public LayerBase {
 public:
  ~LossLayer() override;
  virtual void loss(const LayerCall& call) = 0;
};

}  // namespace ablate
