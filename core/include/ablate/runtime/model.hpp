// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The decoder-only transformer, assembled from `[model]` with its layers found through the registry:
//
//   x = embedding(tokens) (+ learned positions)
//   per block:  h = x + o(attention(rope(qk_norm(q(norm1(x)))), rope(qk_norm(k(norm1(x)))), v(norm1(x))))
//               x = h + mlp(norm2(h))
//   loss = cross_entropy(norm_f(x) W_head^T, targets)      (W_head = embedding weight when tied)
//
// Parameters and gradients each live in one flat fp32 buffer described by a ParamTable; names
// follow `wte.weight`, `wpe.weight`, `blocks.L.ln1.weight`, `blocks.L.attn.q.weight`, ...,
// `ln_f.weight`, `lm_head.weight`. Initialisation as GPT-2: N(0, 0.02), residual output projections
// (attn.o, mlp.proj, mlp.down) N(0, 0.02/sqrt(2*n_layers)), biases 0, norm weights 1.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/batch.hpp"
#include "ablate/runtime/buckets.hpp"
#include "ablate/component.hpp"
#include "ablate/device.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/defaults.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

struct RunSpec;
class Registry;

// `[model]` resolved: zeros replaced by what they stand for.
struct ModelOptions {
  int64_t d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t vocab_size = 0;    // real vocabulary (targets and sampling never exceed it)
  int64_t vocab_padded = 0;  // rows of the embedding (vocab_size rounded up to vocab_multiple)
  int64_t max_seq_len = 0, mlp_hidden = 0;
  // The layers by registration name (model.norm, model.mlp, model.position, model.embedding_layer,
  // model.projection_layer, model.classifier_layer, model.qk_norm_layer) and the attention backend.
  std::string norm = defaults::norm, mlp = defaults::mlp, position = defaults::position, attention = defaults::attention;
  std::string embedding = defaults::embedding, linear = defaults::linear, classifier = defaults::classifier;
  std::string qk_norm_layer = defaults::qk_norm_layer;
  double dropout = 0.0;
  // 0: each norm layer's own default (LayerBase::default_epsilon), which the model fills in below.
  double norm_eps = 0.0;
  double norm_eps_default = 1e-5, qk_norm_eps_default = 1e-6;
  bool qk_norm = false, bias = true, tie_embeddings = true;
  // [run] recompute: which activations backward recomputes instead of keeping them from forward
  // ("none"; "mlp": the MLP's saved values; "block": everything inside a block but its input).
  // Changes memory and time only: the values, hence losses and gradients, are the same bits.
  std::string recompute = "none";
  // The keys components receive: layers [model] (their kind's common table) and their own
  // [model.<layer name>] (layer_own, by name; a layer absent there gets an empty table), the
  // attention backend [attention] and its sub-table [attention.<name>].
  Params model_common{"model", {}};
  std::map<std::string, Params, std::less<>> layer_own;
  Params attention_common{"attention", {}}, attention_own{"attention", {}};
  // [adapter]: "" = none (every parameter trains); else the adapter layer (role adapter) on the
  // projections adapter_targets names ("q", "k", "v", "o"), the base model frozen. Its keys are
  // [adapter]'s (adapter_common) and [adapter.<name>] (adapter_own: lora's rank, alpha, dropout).
  // adapter_keys_text is the adapter's answer (LayerBase::describe_keys), filled in by the model.
  std::string adapter;
  std::vector<std::string> adapter_targets;
  std::string adapter_keys_text;
  std::string base_dtype = "fp32";  // "nf4": the frozen base's linear and MLP weights held in 4 bits
  Params adapter_common{"adapter", {}}, adapter_own{"adapter", {}};

  // From the config's [model] and [attention]; `data_vocab` is the data source's vocabulary, used
  // when [model] vocab_size is 0. Inconsistent shapes are input errors naming the key.
  static ModelOptions from(const RunSpec& spec, int64_t data_vocab);
  // The [model] table as TOML-ish key = value lines (for checkpoints and exports).
  std::string describe() const;
  // The epsilon of the block and final norms, and of qk_norm.
  double norm_epsilon() const { return norm_eps > 0 ? norm_eps : norm_eps_default; }
  double qk_norm_epsilon() const { return norm_eps > 0 ? norm_eps : qk_norm_eps_default; }
};

// Bytes of activations and scratch one micro-batch shape needs: a pure plan (offsets into one
// arena), so that whether a shape fits is known without allocating it.
struct ActivationPlan {
  int64_t rows = 0, seq_len = 0;
  int64_t elements = 0;         // f32 elements of the arena (a slot held in bf16 takes one per two values)
  int64_t bf16_elements = 0;    // of those, the elements holding bf16 values
  int64_t workspace_bytes = 0;  // the plugins' own buffers: the attention backend's and the largest layer's
  int64_t bytes() const noexcept { return elements * int64_t(sizeof(float)) + workspace_bytes; }
  int64_t bf16_bytes() const noexcept { return bf16_elements * int64_t(sizeof(float)); }
  int64_t f32_bytes() const noexcept { return (elements - bf16_elements) * int64_t(sizeof(float)); }
};

// Where a step's time goes, op by op (run.profile_steps): each op is bracketed by synchronisations
// of the device, so every op's time is its own (on a GPU, launch latency included), and a profiled
// step is slower than an unprofiled one by those waits. Keys: "<role> fwd" / "<role> bwd" for the
// layers (embedding, position, norm, linear, mlp), "attention fwd/bwd", "classifier" (loss and
// gradients in one pass), "batch upload", "loss sum"; the engine adds "gradient norm", "optimizer"
// and "collectives".
struct OpTimes {
  std::map<std::string, double> seconds;
  std::map<std::string, int64_t> calls;
  void add(const std::string& op, double s) {
    seconds[op] += s;
    calls[op] += 1;
  }
};

class Model {
 public:
  // Tests: the model on the device run.device names (the registry's `device` component of that
  // name), its layers and attention backend the registrations that serve that device. Everything
  // else builds a model through Session::model.
  Model(const ModelOptions& options, const Registry& registry, const RunContext& run);
  // The same on a device made already (Session::device): the model owns it from here on.
  Model(const ModelOptions& options, const Registry& registry, const RunContext& run, std::unique_ptr<Device> device);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  // The parameters a model of `options` declares, counted by its layers without a device or any
  // allocation: what the memory checks weigh before a model is made.
  static int64_t count_params(const ModelOptions& options, const Registry& registry, const RunContext& run);

  const ModelOptions& options() const noexcept;
  const ParamTable& table() const noexcept;
  int64_t num_params() const noexcept;
  Device& device() noexcept;
  // The flat fp32 parameters on the model's device (num_params() elements; with an NF4 base the
  // num_params() - nf4_params() values not held in NF4). copy_params_to_host gives every value.
  TensorView params();
  // What trains: every parameter, or with an adapter only the adapters' (the table's last
  // num_trainable() elements, from frozen_params() on; the base before them is frozen and has no
  // gradient). The trainable table's offsets are relative to trainable_params(). grads() holds
  // num_trainable() fp32 gradients; gradient_writes() and the optimizer work on these.
  int64_t num_trainable() const noexcept;
  int64_t frozen_params() const noexcept;
  const ParamTable& trainable_table() const noexcept;
  TensorView trainable_params();
  // An NF4 base (ModelOptions::base_dtype): how many values are held in 4 bits, and their bytes
  // (codes and scales); params() then holds every other value, in table order. 0 and 0 otherwise.
  int64_t nf4_params() const noexcept;
  int64_t nf4_bytes() const noexcept;
  TensorView grads();
  // The bf16 copy of params() that bf16 products read (run.dtype = "bf16"); an empty view otherwise.
  TensorView params_bf16();
  // Every call site's scaling state (LayerBase::scaling_state_elements: FP8 delayed scaling's), f32,
  // zeros at first, empty when no layer keeps any; checkpointed; end_step() steps it (LayerBase::end_step).
  TensorView scaling_state();
  void end_step();
  ScalingReport scaling_report();  // after end_step: the sites' reports added (a read into host memory)
  // Checkpoints, export and tests: the parameters (or gradients) through host memory.
  void copy_params_to_host(std::vector<float>& out);
  void copy_grads_to_host(std::vector<float>& out);              // num_trainable() values
  void load_params_from_host(const std::vector<float>& values);  // num_params() values

  // GPT-2 initialisation from `seed` (a pure function of seed and the parameter table).
  void init_params(uint64_t seed);
  void zero_grads();

  // Forward, loss and backward of one micro-batch: returns the sum of per-position losses over real
  // targets and accumulates into the gradients d(loss_sum * grad_scale). `dropout_key` varies the
  // dropout masks (ignored when dropout is 0).
  double forward_backward(const Batch& batch, double grad_scale, uint64_t dropout_key);
  // The same with the loss sum left on the device: `loss_sum` (one f64 on the model's device)
  // becomes the sum, or (add) has it added; nothing is read back, so nothing waits for the device.
  void forward_backward(const Batch& batch, double grad_scale, uint64_t dropout_key, TensorView loss_sum, bool add);
  // A captured step (Engine, run.cuda_graph): `batch` put on the device before the graph, which
  // holds no copy from the host; with `for_forward` the next forward_backward of it uses that copy.
  void upload_batch(const Batch& batch, bool for_forward);
  bool draws_random() const noexcept;  // dropout (or an adapter's) above 0: one step's masks replayed
  // Forward only (no dropout): the sum of losses over real targets; per-position losses into
  // `losses` and (rows*T, vocab_padded) logits into `logits` when given.
  double forward(const Batch& batch, std::vector<float>* losses = nullptr, std::vector<float>* logits = nullptr);

  // model FLOPs per token (6N + 6*L*d*T, docs/architecture.md) at row length `seq_len`; with a
  // frozen base 4 per frozen parameter (no weight gradients) and 6 per trainable one.
  double flops_per_token(int64_t seq_len) const noexcept;
  // The activation arena a micro-batch of `rows` x `seq_len` needs (allocates nothing).
  ActivationPlan activation_plan(int64_t rows, int64_t seq_len) const;
  // The same under another `recompute` mode ("none", "mlp", "block"): what switching would save.
  ActivationPlan activation_plan(int64_t rows, int64_t seq_len, const std::string& recompute) const;
  int64_t activation_bytes(int64_t rows, int64_t seq_len) const { return activation_plan(rows, seq_len).bytes(); }
  // Bytes of parameters and gradients on the device (and the bf16 weight copy, when there is one).
  int64_t state_bytes() const noexcept;
  // Every change of params() must be followed by this (the model's own init and load do it; the
  // engine calls it after each optimizer step): the bf16 copy of the parameters that the layers'
  // products read (run.dtype = "bf16") is made again from the fp32 master weights, unless the
  // optimizer wrote it in its own pass (bf16_copy_written, Optimizer::writes_bf16), and what the
  // layers derived from the weights before (LayerCall::weights_unchanged) no longer serves.
  void params_changed(bool bf16_copy_written = false);
  // fp32 matrix-product rate of the linear layer on the model's device (TFLOP/s): the peak for MFU
  // where the device has no table entry (a CPU).
  double measure_matmul_tflops();
  // The attention backend's answer for a micro-batch shape ("" = served).
  std::string attention_supports(int64_t rows, int64_t seq_len) const;
  // Per-op timing into `sink` (null: off, the default).
  void set_op_times(OpTimes* sink) noexcept;
  // The ranges of the flat gradient buffer that forward_backward writes, in the order it finishes
  // them: the classifier's first (it comes with the loss), then the layers' in reverse. A tied
  // embedding's range appears twice (the classifier's write and the embedding's).
  const std::vector<GradRange>& gradient_writes() const noexcept;
  // Called with the index (into gradient_writes()) of each write as forward_backward finishes it
  // (enqueues it, on a device with a queue); empty: none. Gradient buckets hang on this.
  void set_gradient_hook(std::function<void(std::size_t)> hook);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ablate
