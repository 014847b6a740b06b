// Table lookups and positions on a CUDA device: `embedding`, `learned`, `rope`, f32 (the residual
// stream the first two write in bf16 where the model holds it so), with the CPU layers' parameters
// and contract. Indices come from the batch on the device; an index out of
// range gives a row of NaN (the CPU layers refuse it on the host; here checking would cost a
// synchronisation per call), so a bad batch ends the run at the non-finite loss check. The
// tables' gradients are scatter-adds in a fixed order (layer_kernels.cu), the same every run.
#include <cmath>

#include "ablate/layer_params.hpp"
#include "common.hpp"

namespace ablate::cuda_layers {
namespace {

// --- embedding ------------------------------------------------------------------------------------

class Embedding final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::embedding; }
  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::embedding(spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }
  // y, the residual stream's start, in bf16 where the model holds the stream so.
  bool bf16_residual() const override { return true; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t n = call.rows * s.in;
    require_f32(kName, call.params, "params", s.out * s.in);
    const int32_t* tokens = require_ids(kName, call, &BatchViews::tokens, "tokens");
    const DropoutArgs drop = dropout_of(kName, call);
    if (call.y.dtype == DType::bf16) {
      require_bf16(kName, call.y, "y", n);
      launch_gather_rows(tokens, call.params.as<const float>(), call.y.as<uint16_t>(), call.rows, s.in, s.out, drop, stream_of(call));
    } else {
      require_f32(kName, call.y, "y", n);
      launch_gather_rows(tokens, call.params.as<const float>(), call.y.as<float>(), call.rows, s.in, s.out, drop, stream_of(call));
    }
    check_launch(kName);
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    require_f32(kName, call.d_y, "d_y", call.rows * s.in);
    if (call.grads.data == nullptr) return;  // a frozen table: its gradient is all this backward computes
    require_f32(kName, call.grads, "grads", s.out * s.in);
    const int32_t* tokens = require_ids(kName, call, &BatchViews::tokens, "tokens");
    scatter_add_rows(tokens, call.d_y.as<const float>(), call.grads.as<float>(), call.rows, s.in, s.out, dropout_of(kName, call),
                     stream_of(call));
    check_launch(kName);
  }

 private:
  static constexpr const char* kName = "embedding";
};

// --- learned positions ------------------------------------------------------------------------------

class Learned final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::position; }
  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::learned(spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }
  // x and y (the stream) in bf16 where the model holds the stream so; the gradients stay f32.
  bool bf16_residual() const override { return true; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t n = call.rows * s.in;
    require_f32(kName, call.params, "params", s.max_positions * s.in);
    const int32_t* positions = require_ids(kName, call, &BatchViews::positions, "positions");
    if (call.x.dtype == DType::bf16) {  // then y too
      require_bf16(kName, call.x, "x", n);
      require_bf16(kName, call.y, "y", n);
      launch_add_rows(positions, call.params.as<const float>(), call.x.as<const uint16_t>(), call.y.as<uint16_t>(), call.rows, s.in,
                      s.max_positions, stream_of(call));
    } else {
      require_f32(kName, call.x, "x", n);
      require_f32(kName, call.y, "y", n);
      launch_add_rows(positions, call.params.as<const float>(), call.x.as<const float>(), call.y.as<float>(), call.rows, s.in,
                      s.max_positions, stream_of(call));
    }
    check_launch(kName);
  }

  // d_x = d_y (written or added); when d_x is d_y's buffer the pass-through is already in place.
  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const int64_t n = call.rows * s.in;
    require_f32(kName, call.d_y, "d_y", n);
    const cudaStream_t st = stream_of(call);
    if (call.grads.data != nullptr) {  // null: a frozen table
      require_f32(kName, call.grads, "grads", s.max_positions * s.in);
      const int32_t* positions = require_ids(kName, call, &BatchViews::positions, "positions");
      scatter_add_rows(positions, call.d_y.as<const float>(), call.grads.as<float>(), call.rows, s.in, s.max_positions, DropoutArgs{},
                       st);
    }
    if (call.d_x.data != nullptr && !same(call.d_x, call.d_y)) {
      require_f32(kName, call.d_x, "d_x", n);
      launch_copy_or_add(call.d_y.as<const float>(), call.d_x.as<float>(), n, call.input_grad == GradMode::accumulate, st);
    }
    check_launch(kName);
  }

 private:
  static constexpr const char* kName = "learned";
};

// --- rope ---------------------------------------------------------------------------------------------

class Rope final : public layer_params::RopeFace {
 public:
  using RopeFace::RopeFace;
  void forward(const LayerCall& call) override { run(call, false); }
  void backward(const LayerCall& call) override { run(call, true); }
  // q and k held in bf16: the forward rotates bf16 values (the backward's gradients stay f32).
  bool bf16_attention_inputs() const override { return true; }

 private:
  static constexpr const char* kName = "rope";


  void run(const LayerCall& call, bool inverse) {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    layer_params::rope(s);
    if (call.heads <= 0) throw_runtime_error(kName, "heads must be positive");
    const TensorView& src = inverse ? call.d_y : call.x;
    const TensorView& dst = inverse ? call.d_x : call.y;
    const int64_t n = call.rows * call.heads * s.in;
    const int32_t* positions = require_ids(kName, call, &BatchViews::positions, "positions");
    if (!inverse && src.dtype == DType::bf16) {  // then y too
      require_bf16(kName, src, "x", n);
      require_bf16(kName, dst, "y", n);
      launch_rope(positions, src.as<const uint16_t>(), dst.as<uint16_t>(), call.rows, call.heads, s.in, theta_, stream_of(call));
      check_launch(kName);
      return;
    }
    require_f32(kName, src, inverse ? "d_y" : "x", n);
    require_f32(kName, dst, inverse ? "d_x" : "y", n);
    const bool accumulate = inverse && call.input_grad == GradMode::accumulate;
    if (accumulate && same(src, dst)) throw_runtime_error(kName, "d_x cannot both alias d_y and accumulate");
    launch_rope(positions, src.as<const float>(), dst.as<float>(), call.rows, call.heads, s.in, theta_, inverse, accumulate,
                stream_of(call));
    check_launch(kName);
  }
};

}  // namespace

std::unique_ptr<Layer> make_embedding() { return std::make_unique<Embedding>(); }
std::unique_ptr<Layer> make_learned() { return std::make_unique<Learned>(); }
std::unique_ptr<Layer> make_rope(double theta) { return std::make_unique<Rope>(theta); }

}  // namespace ablate::cuda_layers
