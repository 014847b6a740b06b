// Layer interface: a norm, an MLP or a position encoding, as an explicit forward/backward pair.
// Gradient contract (as llm.c): parameter gradients accumulate (+=), the input gradient is written
// (=) unless the caller asks for GradMode::accumulate (residual streams).
#pragma once

#include <cstdint>
#include <string>

#include "ablate/batch.hpp"
#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

enum class GradMode { overwrite, accumulate };

struct ModelDims {
  int64_t d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t mlp_hidden = 0, vocab_size = 0, max_seq_len = 0;
  bool bias = true;
};

// One call: x is (B, T, C_in) and y is (B, T, C_out) for this layer; params/grads point at the
// layer's own first parameter in the flat buffers.
struct LayerCall {
  const ModelDims* dims = nullptr;
  const Batch* batch = nullptr;
  int64_t rows = 0;     // B*T
  TensorView x, y;      // forward input and output
  TensorView d_y, d_x;  // backward: gradient of the output (in), of the input (out)
  TensorView params, grads;
  TensorView saved;     // activation memory the layer asked for (activation_elements)
  GradMode input_grad = GradMode::overwrite;
};

class Layer : public Component {
 public:
  ~Layer() override;
  // "norm", "mlp" or "position".
  virtual std::string role() const = 0;
  // Appends this layer's parameters to `table` under `prefix` ("blocks.0.ln1").
  virtual void declare_params(const ModelDims& dims, const std::string& prefix, ParamTable& table) const = 0;
  virtual int64_t activation_elements(const ModelDims& dims, int64_t rows) const = 0;
  virtual double forward_flops_per_token(const ModelDims& dims) const = 0;
  virtual void forward(const LayerCall& call) = 0;
  virtual void backward(const LayerCall& call) = 0;
};

}  // namespace ablate
