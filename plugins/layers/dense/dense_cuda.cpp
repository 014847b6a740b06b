// Dense layers on a CUDA device: `linear`, `gelu_mlp`, `swiglu_mlp`, f32 (under bf16 products the
// model may hold the input x in bf16, a linear may write q, k, v in bf16, and the MLPs keep their
// hidden activation in bf16), with the CPU layers' parameters (weights (out, in) as PyTorch stores
// them), saved values, scratch and gradient contract. Matrix products through cuBLASLt (gemm.hpp)
// with their epilogues where they save a pass: the bias where the output is written whole, the
// bias gradient of every weight-gradient product, gelu_mlp's GELU (forward: the pre-activation and
// the activation from one product) and its gradient with fc's bias gradient (backward); swiglu and
// dropout and residual adds in layer_kernels.cu.
//
// Dropout with a residual needs the product apart from the stream it is added to, so these
// layers ask for (rows, out) more scratch than the CPU ones (which use a small chunk); the model's
// scratch is one region sized by the largest request, which an mlp's (rows, hidden) already sets.
#include "ablate/layer_params.hpp"
#include "common.hpp"
#include "fp8_kernels.hpp"
#include "gemm.hpp"

namespace ablate::cuda_layers {
namespace {

namespace lp = layer_params;

const float* at(const TensorView& v, int64_t offset) { return offset < 0 ? nullptr : v.as<const float>() + offset; }
float* at_mut(const TensorView& v, int64_t offset) { return offset < 0 || v.data == nullptr ? nullptr : v.as<float>() + offset; }
// A weight at `offset`: its f32 values and, when the model keeps one, its bf16 copy.
Weight weight_at(const LayerCall& call, int64_t offset) {
  Weight w{at(call.params, offset), nullptr};
  if (call.params_bf16.data != nullptr) w.bf16 = static_cast<const uint16_t*>(call.params_bf16.data) + offset;
  return w;
}

// y = [residual +] dropout(x W^T + b); `tmp` (rows, out) is needed only for dropout with a residual.
void dense_forward(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const float* b, float* y, const float* residual,
                   const DropoutArgs& drop, float* tmp, cudaStream_t s, MatmulMode mode, Fp8Slots slots = {}) {
  if (rows == 0) return;
  const int64_t n = rows * out;
  if (drop.p == 0.0) {
    // With a residual, C = residual (which may be y itself) and beta 1.
    gemm_x_wt(x, rows, in, out, W, b, residual, residual != nullptr ? 1.0f : 0.0f, y, s, mode, slots);
    return;
  }
  if (residual == nullptr) {
    gemm_x_wt(x, rows, in, out, W, b, nullptr, 0.0f, y, s, mode, slots);
    launch_dropout_residual(y, nullptr, y, n, drop, s);
    return;
  }
  gemm_x_wt(x, rows, in, out, W, b, nullptr, 0.0f, tmp, s, mode, slots);
  launch_dropout_residual(tmp, residual, y, n, drop, s);
}

// y (bf16) = residual (bf16) + dropout(x W^T + b): a projection's output added to the residual
// stream the model holds in bf16. One product writes y, the residual its C and the bias (the
// model's bf16 copy) in its epilogue, where dropout is off and cuBLASLt serves it; else the product
// goes to `tmp` (rows, out) in f32 with the f32 bias and a pass adds it, dropped out, to the
// residual. Either way the fp32 sum is rounded to bf16 once.
void dense_forward_to_bf16_stream(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, Weight b, const uint16_t* residual,
                                  uint16_t* y, const DropoutArgs& drop, float* tmp, cudaStream_t s, MatmulMode mode,
                                  Fp8Slots slots = {}) {
  if (rows == 0) return;
  const bool bias_copy = b.f32 == nullptr || b.bf16 != nullptr;
  if (drop.p == 0.0 && bias_copy && gemm_x_wt_residual_bf16(x, rows, in, out, W, b.bf16, residual, y, s, mode, slots)) return;
  gemm_x_wt(x, rows, in, out, W, b.f32, nullptr, 0.0f, tmp, s, mode, slots);
  launch_dropout_residual(tmp, residual, y, rows * out, drop, s);
}

// Backward of dense_forward for dy (rows, out): dx = dy' W (written, or added when accumulate;
// skipped when null; written in bf16 into dx_bf16 instead when that is given), dW += dy'^T x and
// db += colsum(dy') (both skipped when dW is null: frozen parameters), dy' = dy masked by the
// forward's dropout (into `tmp`, (rows, out), when dropout is on). A dy held in bf16 (the
// gradient of q, k or v the model holds so) is read as it is: it has no dropout.
void dense_backward(Operand dy, int64_t rows, int64_t in, int64_t out, Operand x, Weight W, float* dW, float* db, float* dx,
                    bool accumulate, const DropoutArgs& drop, float* tmp, cudaStream_t s, MatmulMode mode, uint16_t* dx_bf16 = nullptr,
                    Fp8Slots dx_slots = {}, Fp8Slots dw_slots = {}) {
  if (rows == 0) return;
  Operand d = dy;
  if (dy.f32 != nullptr) {
    const float* g = dy.f32;
    if (drop.p > 0.0) {
      launch_dropout_grad(g, tmp, rows * out, drop, s);
      g = tmp;
    }
    // Both products read dy: rounded to bf16 once for both under bf16 products.
    d = dx != nullptr || dx_bf16 != nullptr ? gemm_bf16_once(g, rows, out, s, mode) : Operand{g};
  }
  // Under FP8 current scaling the input gradient's product quantises dy for the weight gradient's
  // too (its transposed layout from the same read), where that one follows; under FP8 products
  // the first product to read dy takes db in its quantising pass.
  const bool dw_follows = dW != nullptr;
  const bool dx_ran = dx_bf16 != nullptr || dx != nullptr;
  float* dx_sums = fp8_mode(mode) && dx_ran && dw_follows ? db : nullptr;
  if (dx_bf16 != nullptr) {
    gemm_dy_w_bf16_out(d, rows, in, out, W, dx_bf16, s, mode, dx_slots, /*dy_read_again=*/dw_follows, dx_sums);
  } else if (dx != nullptr) {
    gemm_dy_w(d, rows, in, out, W, accumulate, dx, s, mode, dx_slots, false, /*dy_read_again=*/dw_follows, dx_sums);
  }
  // db in the product's epilogue (unless taken above); under FP8 current scaling dy quantised with
  // the scale the input gradient's product took, where that product ran just before.
  if (dW != nullptr) {
    gemm_add_dyt_x(d, rows, in, out, x, dW, dx_sums != nullptr ? nullptr : db, s, mode, dw_slots, /*dy_scale_reused=*/dx_ran);
  }
}

// Whether the call adds its output to a residual stream the model holds in bf16 (run.residual_dtype).
bool to_bf16_stream(const LayerCall& call) { return call.residual.data != nullptr && call.residual.dtype == DType::bf16; }

// A bias at `offset` (-1: none) as the products read it: its f32 values and the model's bf16 copy.
Weight bias_at(const LayerCall& call, int64_t offset) { return offset < 0 ? Weight{} : weight_at(call, offset); }

// The projection whose output y goes to the residual stream (y = residual + dropout(x W^T + b)):
// f32, or bf16 where the model holds the stream so. `tmp`: (rows, out) f32 scratch.
void project_to_stream(const char* name, const LayerCall& call, Operand x, int64_t in, int64_t out, const lp::Dense& d, float* tmp,
                       MatmulMode mode, Fp8Slots slots) {
  const cudaStream_t st = stream_of(call);
  const DropoutArgs drop = dropout_of(name, call);
  if (to_bf16_stream(call)) {
    dense_forward_to_bf16_stream(x, call.rows, in, out, weight_at(call, d.weight), bias_at(call, d.bias),
                                 call.residual.as<const uint16_t>(), call.y.as<uint16_t>(), drop, tmp, st, mode, slots);
    return;
  }
  dense_forward(x, call.rows, in, out, weight_at(call, d.weight), at(call.params, d.bias), call.y.as<float>(),
                call.residual.as<const float>(), drop, tmp, st, mode, slots);
}

// The checks of a forward call; returns x as the products read it (f32, or bf16 where the model
// holds it so). `bf16_y`: the layer may write y in bf16 (a linear under bf16 products).
Operand check_forward(const char* name, const LayerCall& call, int64_t in, int64_t out, int64_t params, int64_t saved, int64_t scratch,
                      MatmulMode mode, bool bf16_y = false) {
  const Operand x = require_product_input(name, call.x, "x", call.rows * in, mode);
  const bool stream_bf16 = to_bf16_stream(call);
  if (stream_bf16) {
    // The residual stream held in bf16: the residual and y bf16, the product's fallback in scratch.
    if (!bf16_family(mode)) throw_runtime_error(name, "a bf16 residual stream is added to by bf16 (or FP8) products only");
    require_bf16(name, call.residual, "residual", call.rows * out);
    require_bf16(name, call.y, "y", call.rows * out);
    require_f32(name, call.scratch, "scratch", scratch);
  } else if (bf16_y && bf16_family(mode) && call.y.dtype == DType::bf16) {
    // q, k or v held in bf16: rounded from the f32 product in scratch.
    require_bf16(name, call.y, "y", call.rows * out);
    require_f32(name, call.scratch, "scratch", call.rows * out);
    if (call.residual.data != nullptr || call.dropout > 0.0) {
      throw_runtime_error(name, "a bf16 output takes no residual and no dropout (q, k and v have neither)");
    }
  } else {
    require_f32(name, call.y, "y", call.rows * out);
  }
  require_f32(name, call.params, "params", params);
  require_f32(name, call.saved, "saved", saved);
  if (call.residual.data != nullptr && !stream_bf16) require_f32(name, call.residual, "residual", call.rows * out);
  if (scratch > 0 && call.dropout > 0.0) require_f32(name, call.scratch, "scratch", scratch);
  if (same(call.x, call.y)) throw_runtime_error(name, "y must not alias x");
  return x;
}

// `bf16_grads`: the layer may read d_y and write d_x in bf16 (a linear under bf16 products, where
// the model holds the attention's gradients so).
Operand check_backward(const char* name, const LayerCall& call, int64_t in, int64_t out, int64_t params, int64_t saved,
                       int64_t scratch, MatmulMode mode, bool bf16_grads = false) {
  const Operand x = require_product_input(name, call.x, "x", call.rows * in, mode);
  const bool held = bf16_grads && bf16_family(mode);
  const bool dy_bf16 = held && call.d_y.dtype == DType::bf16, dx_bf16 = held && call.d_x.dtype == DType::bf16;
  if (dy_bf16) {
    require_bf16(name, call.d_y, "d_y", call.rows * out);
    if (call.dropout > 0.0) throw_runtime_error(name, "a bf16 d_y takes no dropout (q, k and v have none)");
  } else {
    require_f32(name, call.d_y, "d_y", call.rows * out);
  }
  if (dx_bf16 && call.input_grad != GradMode::overwrite) {
    throw_runtime_error(name, "a bf16 d_x is written, never added to (the attention output's gradient has one writer)");
  }
  require_f32(name, call.params, "params", params);
  if (call.grads.data != nullptr) require_f32(name, call.grads, "grads", params);  // none: frozen parameters
  require_f32(name, call.saved, "saved", saved);
  require_f32(name, call.scratch, "scratch", scratch);
  if (call.d_x.data != nullptr) {
    if (dx_bf16) require_bf16(name, call.d_x, "d_x", call.rows * in);
    else require_f32(name, call.d_x, "d_x", call.rows * in);
    if (same(call.d_x, call.d_y) || same(call.d_x, call.x)) throw_runtime_error(name, "d_x must not alias d_y or x");
  }
  return x;
}

// The MLP's hidden activation (rows, H) held in bf16 under bf16 products (only the projection's
// products read it): it starts at this f32 element of the layer's saved values, after the f32 ones
// before it, 256-byte aligned.
int64_t bf16_after(int64_t f32_elements) { return (f32_elements + 63) / 64 * 64; }
int64_t bf16_elements(int64_t values) { return (values + 1) / 2; }  // in f32 elements

float* scratch_at(const LayerCall& call, int64_t offset) {
  return call.scratch.data != nullptr ? call.scratch.as<float>() + offset : nullptr;
}

// FP8 delayed scaling's state at a call site (LayerCall::scaling_state): two slots, A's and B's,
// for each of a layer's `products` products, numbered as the layer calls them.
struct Fp8State {
  MatmulMode mode;
  Fp8Scaling scaling;
  int products;
  bool on() const { return fp8_mode(mode) && scaling.history > 0; }
  int64_t slot() const { return fp8_slot_floats(scaling.history); }
  int64_t elements() const { return on() ? int64_t(products) * 2 * slot() : 0; }
  Fp8Slots at(const LayerCall& call, int product) const {
    if (!on() || call.scaling_state.data == nullptr) return {};
    float* base = call.scaling_state.as<float>() + int64_t(product) * 2 * slot();
    return {base, base + slot()};
  }
  // Product `product` reading the layer's input x as the call before this one read it
  // (LayerCall::x_unchanged), or as the product before it in this call did (`again`): as its A (a
  // forward product) or its B (a weight-gradient product), found packed where the stream's record
  // agrees (Fp8Slots::a_as_before, b_as_before; current scaling only).
  Fp8Slots input_a(const LayerCall& call, int product, bool again = false) const {
    Fp8Slots s = at(call, product);
    s.a_as_before = again || call.x_unchanged;
    return s;
  }
  Fp8Slots input_b(const LayerCall& call, int product, bool again = false) const {
    Fp8Slots s = at(call, product);
    s.b_as_before = again || call.x_unchanged;
    return s;
  }
  // FP8 current scaling: the layer's weights (as stored: rows, cols), each with its pack in the call
  // site's weight cache (LayerCall::weight_cache, in this order), made by the first product of the
  // step that reads the weight and read by the rest (Fp8Slots::weight_pack). The bytes they take.
  struct Extent {
    int64_t rows, cols;
  };
  int64_t cache_bytes(std::initializer_list<Extent> weights) const {
    int64_t n = 0;
    for (const Extent& w : weights) n += fp8_mode(mode) && !on() ? fp8_weight_pack_bytes(w.rows, w.cols) : 0;
    return n;
  }
  // At the start of each call (common.hpp's forget_changed_weight_packs).
  void begin(const LayerCall& call) const { forget_changed_weight_packs(call); }
  // `slots` of a product whose B is weight `w` of `weights`, its pack found in the call's cache.
  Fp8Slots weight(Fp8Slots slots, const LayerCall& call, std::initializer_list<Extent> weights, int w) const {
    int64_t at = 0;
    for (int i = 0; i < w; ++i) at += fp8_weight_pack_bytes(weights.begin()[i].rows, weights.begin()[i].cols);
    return with_weight_pack(slots, call, cache_bytes(weights), at);
  }
  // The step just ended, from the state copied to the host: each slot's saturated values ([6]).
  ScalingReport report(const float* state) const {
    ScalingReport r;
    for (int64_t i = 0; on() && i < 2 * products; ++i) {
      const auto n = int64_t(state[i * slot() + 6]);
      r.saturated += n;
      r.worst = std::max(r.worst, n);
    }
    return r;
  }
  // Once per step: every slot's amax into its history, its scale from it.
  void end_step(const char* name, const LayerCall& call) const {
    if (!on() || call.scaling_state.data == nullptr) return;
    require_f32(name, call.scaling_state, "scaling_state", elements());
    launch_fp8_update_slots(call.scaling_state.as<float>(), elements() / slot(), scaling.history, scaling.use_max, stream_of(call));
    check_launch(name);
  }
};

// --- linear -------------------------------------------------------------------------------------

class Linear final : public Layer {
 public:
  Linear(MatmulMode mode, Fp8Scaling scaling) : mode_(mode), fp8_{mode, scaling, 3} {}
  // FP8 delayed scaling: products 0 forward, 1 input gradient, 2 weight gradient.
  int64_t scaling_state_elements(const LayerSpec&) const override { return fp8_.elements(); }
  // FP8 current scaling: the weight's packs, made once a step (products 0 and 1 read them).
  int64_t weight_cache_bytes(const LayerSpec& s) const override { return fp8_.cache_bytes({{s.out, s.in}}); }
  void end_step(const LayerCall& call) override { fp8_.end_step(kName, call); }
  ScalingReport scaling_report(const LayerSpec&, const float* state) const override { return fp8_.report(state); }
  LayerRole role() const override { return LayerRole::linear; }
  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    lp::linear(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return rows * s.out; }
  int64_t workspace_bytes(const LayerSpec& s, int64_t rows) const override { return gemm_workspace_bytes(mode_, rows, s.in, s.out); }
  bool bf16_product_inputs() const override { return bf16_family(mode_); }
  // Under bf16 products: y in bf16 (q, k, v held so), the product rounded from scratch.
  bool bf16_attention_inputs() const override { return bf16_family(mode_); }
  // Under bf16 products: d_y in bf16 (read as it is) and d_x in bf16 (the product's output).
  bool bf16_attention_grads() const override { return bf16_family(mode_); }
  // Under bf16 products: a residual and y in bf16 (the stream held so), the sum rounded once.
  bool bf16_residual() const override { return bf16_family(mode_); }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    fp8_.begin(call);
    const LayerSpec& s = *call.spec;
    const lp::Dense p = lp::dense(0, s.in, s.out, s.bias);
    const Operand x = check_forward(kName, call, s.in, s.out, p.end, 0, call.rows * s.out, mode_, /*bf16_y=*/true);
    if (to_bf16_stream(call)) {  // the attention's output projection, added to a stream held in bf16
      project_to_stream(kName, call, x, s.in, s.out, p, scratch_at(call, 0), mode_, weight_slots(call, fp8_.input_a(call, 0)));
      check_launch(kName);
      return;
    }
    const cudaStream_t st = stream_of(call);
    const bool y_bf16 = call.y.dtype == DType::bf16;
    if (y_bf16 && write_bf16_y(call, x, p)) return;
    float* y = y_bf16 ? call.scratch.as<float>() : call.y.as<float>();
    dense_forward(x, call.rows, s.in, s.out, weight_at(call, p.weight), at(call.params, p.bias), y, call.residual.as<const float>(),
                  dropout_of(kName, call), scratch_at(call, 0), st, mode_, weight_slots(call, fp8_.input_a(call, 0)));
    if (y_bf16) launch_to_bf16(y, call.rows, s.out, s.out, call.y.as<uint16_t>(), st);
    check_launch(kName);
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    fp8_.begin(call);
    const LayerSpec& s = *call.spec;
    const lp::Dense p = lp::dense(0, s.in, s.out, s.bias);
    const DropoutArgs drop = dropout_of(kName, call);
    const Operand x = check_backward(kName, call, s.in, s.out, p.end, 0, drop.p > 0.0 ? call.rows * s.out : 0, mode_,
                                     /*bf16_grads=*/true);
    const bool dy_bf16 = call.d_y.dtype == DType::bf16, dx_bf16 = call.d_x.data != nullptr && call.d_x.dtype == DType::bf16;
    const Operand dy = dy_bf16 ? Operand{nullptr, call.d_y.data} : Operand{call.d_y.as<const float>()};
    dense_backward(dy, call.rows, s.in, s.out, x, weight_at(call, p.weight), at_mut(call.grads, p.weight), at_mut(call.grads, p.bias),
                   dx_bf16 ? nullptr : call.d_x.as<float>(), call.input_grad == GradMode::accumulate, drop, scratch_at(call, 0),
                   stream_of(call), mode_, dx_bf16 ? call.d_x.as<uint16_t>() : nullptr, weight_slots(call, fp8_.at(call, 1)),
                   fp8_.input_b(call, 2));
    check_launch(kName);
  }

 private:
  // q, k or v in bf16 straight from the product (the bias, from the model's bf16 copy, in its
  // epilogue): no f32 product in scratch and no rounding pass. False when there is no bf16 copy of
  // a bias or cuBLASLt serves no such epilogue: the caller rounds from scratch instead, to the same
  // values save the bias (there in f32).
  bool write_bf16_y(const LayerCall& call, const Operand& x, const lp::Dense& p) const {
    const LayerSpec& s = *call.spec;
    const Weight W = weight_at(call, p.weight);
    auto* y = call.y.as<uint16_t>();
    if (p.bias < 0) {
      if (call.rows > 0)
        gemm_x_wt_bf16_out(x, call.rows, s.in, s.out, W, y, stream_of(call), mode_, weight_slots(call, fp8_.input_a(call, 0)));
      check_launch(kName);
      return true;
    }
    if (call.params_bf16.data == nullptr) return false;
    const Weight b = weight_at(call, p.bias);
    const bool done = gemm_x_wt_bias_bf16_out(x, call.rows, s.in, s.out, W, b.bf16, y, stream_of(call), mode_,
                                              weight_slots(call, fp8_.input_a(call, 0)));
    check_launch(kName);
    return done;
  }

  Fp8Slots weight_slots(const LayerCall& call, Fp8Slots slots) const {
    return fp8_.weight(slots, call, {{call.spec->out, call.spec->in}}, 0);
  }

  static constexpr const char* kName = "linear";
  MatmulMode mode_;
  Fp8State fp8_;
};

// --- gelu_mlp -------------------------------------------------------------------------------------

// saved: the pre-activation and the activation (rows, H) each: f32, or under bf16 products both in
// bf16, pre then post (the projection's products read the activation as it is; the GELU gradient
// reads the pre-activation). scratch, f32 and bf16 products alike: (rows, H) f32 for a product
// before its GELU or its gradient, then (bf16 products) (rows, H) bf16 for the gradient below the
// GELU, then (FP8 products) the partial sums of fc's bias gradient, then (rows, C) for the
// output's dropout (forward and backward).
//
// Under bf16 products fc's product writes pre and post in bf16 itself, the GELU and the bias (from
// the model's bf16 copy) in cuBLASLt's epilogue, and backward's product writes the bf16 gradient
// below the GELU with fc's bias gradient in its epilogue, which fc's two products read as it is.
// Where cuBLASLt serves no such epilogue (or there is no bf16 copy of the bias), the product goes
// to scratch in f32 and a kernel writes the same bf16 values (the bias then added in f32). FP8
// products fuse the forward epilogues but not the GELU's gradient: backward's FP8 product writes
// the gradient above the GELU in bf16, and one kernel (launch_gelu_backward_bf16_sums) writes the
// gradient below it and takes fc's bias gradient from the same read.
class GeluMLP final : public Layer {
 public:
  GeluMLP(MatmulMode mode, Fp8Scaling scaling) : mode_(mode), fp8_{mode, scaling, 6} {}
  // FP8 delayed scaling: products 0 fc forward, 1 proj forward, 2 proj weight gradient, 3 proj
  // input gradient (below the GELU), 4 fc input gradient, 5 fc weight gradient.
  int64_t scaling_state_elements(const LayerSpec&) const override { return fp8_.elements(); }
  // FP8 current scaling: fc's and proj's packs, made once a step (products 0, 4 and 1, 3 read them).
  int64_t weight_cache_bytes(const LayerSpec& s) const override { return fp8_.cache_bytes({{s.out, s.in}, {s.in, s.out}}); }
  void end_step(const LayerCall& call) override { fp8_.end_step(kName, call); }
  ScalingReport scaling_report(const LayerSpec&, const float* state) const override { return fp8_.report(state); }
  LayerRole role() const override { return LayerRole::mlp; }
  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    lp::gelu_mlp(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec& s, int64_t rows) const override {
    const int64_t n = rows * s.out;
    return bf16_hidden() ? bf16_elements(2 * n) : 2 * n;
  }
  int64_t activation_bf16_elements(const LayerSpec& s, int64_t rows) const override {
    return bf16_hidden() ? activation_elements(s, rows) : 0;
  }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return dropout_at(s, rows) + rows * s.in; }
  int64_t workspace_bytes(const LayerSpec& s, int64_t rows) const override { return gemm_workspace_bytes(mode_, rows, s.in, s.out); }
  bool bf16_product_inputs() const override { return bf16_family(mode_); }
  // Under bf16 products: the residual and y in bf16 (the stream held so), the sum rounded once.
  bool bf16_residual() const override { return bf16_family(mode_); }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    fp8_.begin(call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const auto [fc, proj] = lp::gelu_mlp_offsets(s);
    const Operand x = check_forward(kName, call, C, C, proj.end, activation_elements(s, rows), scratch_elements(s, rows), mode_);
    if (bf16_hidden()) require_f32(kName, call.scratch, "scratch", scratch_elements(s, rows));  // the fallback's product
    const cudaStream_t st = stream_of(call);
    const Operand post = post_of(call, rows * H);
    if (bf16_hidden()) {
      hidden_bf16(call, x, fc);
    } else if (rows > 0) {
      // post = gelu(pre), pre = x W^T + b: one product, the GELU in its epilogue.
      float* pre = call.saved.as<float>();
      gemm_x_wt_gelu(x, rows, C, H, weight_at(call, fc.weight), at(call.params, fc.bias), pre, const_cast<float*>(post.f32), st, mode_,
                     weight_slots(call, fp8_.input_a(call, 0), 0));
    }
    project_to_stream(kName, call, post, H, C, proj, scratch_at(call, dropout_at(s, rows)), mode_,
                      weight_slots(call, fp8_.at(call, 1), 1));
    check_launch(kName);
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    fp8_.begin(call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const auto [fc, proj] = lp::gelu_mlp_offsets(s);
    const Operand x = check_backward(kName, call, C, C, proj.end, activation_elements(s, rows), scratch_elements(s, rows), mode_);
    const cudaStream_t st = stream_of(call);
    const Operand post = post_of(call, rows * H);
    Operand d_pre{call.scratch.as<float>()};
    if (rows > 0) {
      // The projection's gradients; then the gradient below the GELU and fc's bias gradient.
      const float* dy = call.d_y.as<const float>();
      const DropoutArgs drop = dropout_of(kName, call);
      if (drop.p > 0.0) {
        float* masked = scratch_at(call, dropout_at(s, rows));
        launch_dropout_grad(dy, masked, rows * C, drop, st);
        dy = masked;
      }
      const Operand d = gemm_bf16_once(dy, rows, C, st, mode_);  // read by both products below
      if (call.grads.data != nullptr)
        gemm_add_dyt_x(d, rows, H, C, post, at_mut(call.grads, proj.weight), at_mut(call.grads, proj.bias), st, mode_,
                       fp8_.at(call, 2), false, /*dy_read_again=*/true);  // the input gradient's product below reads d too
      if (bf16_hidden()) {
        d_pre = d_pre_bf16(call, d, proj, fc);
      } else {
        gemm_dy_w_dgelu(d, rows, H, C, weight_at(call, proj.weight), call.saved.as<const float>(), call.scratch.as<float>(),
                        at_mut(call.grads, fc.bias), st, mode_, weight_slots(call, fp8_.at(call, 3), 1));
      }
    }
    // fc's gradients from d_pre (read as it is: bf16 under bf16 products); its bias gradient came above.
    if (rows > 0 && call.d_x.data != nullptr) {
      gemm_dy_w(d_pre, rows, C, H, weight_at(call, fc.weight), call.input_grad == GradMode::accumulate, call.d_x.as<float>(), st,
                mode_, weight_slots(call, fp8_.at(call, 4), 0), false, /*dy_read_again=*/call.grads.data != nullptr);
    }
    if (rows > 0 && call.grads.data != nullptr)
      gemm_add_dyt_x(d_pre, rows, C, H, x, at_mut(call.grads, fc.weight), nullptr, st, mode_, fp8_.input_b(call, 5),
                     /*dy_scale_reused=*/call.d_x.data != nullptr);
    check_launch(kName);
  }

 private:
  bool bf16_hidden() const { return bf16_family(mode_); }
  // Where the output's dropout scratch starts: after the f32 (rows, H) and, under bf16 products, the
  // bf16 (rows, H) gradient below the GELU, and under FP8 products the partial sums of fc's bias
  // gradient (partials_at).
  int64_t dropout_at(const LayerSpec& s, int64_t rows) const {
    const int64_t n = rows * s.out;
    if (!bf16_hidden()) return n;
    return partials_at(s, rows) + (fp8_mode(mode_) ? bf16_after(fp8_column_partials(rows, s.out)) : 0);
  }
  int64_t partials_at(const LayerSpec& s, int64_t rows) const {
    const int64_t n = rows * s.out;
    return bf16_after(bf16_after(n) + bf16_elements(n));
  }
  // The activation (n values) in the saved values, after the pre-activation: f32, or bf16 after the
  // bf16 pre-activation.
  Operand post_of(const LayerCall& call, int64_t n) const {
    if (!bf16_hidden()) return {call.saved.as<const float>() + n, nullptr};
    return {nullptr, static_cast<const uint16_t*>(call.saved.data) + n};
  }
  uint16_t* pre_bf16(const LayerCall& call) const { return static_cast<uint16_t*>(call.saved.data); }

  // Under bf16 products: pre and post in bf16 from fc's product (see the class comment).
  void hidden_bf16(const LayerCall& call, const Operand& x, const lp::Dense& fc) const {
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const cudaStream_t st = stream_of(call);
    uint16_t* pre = pre_bf16(call);
    auto* post = static_cast<uint16_t*>(const_cast<void*>(post_of(call, rows * H).bf16));
    const Weight W = weight_at(call, fc.weight);
    const void* bias = fc.bias < 0 ? nullptr : weight_at(call, fc.bias).bf16;
    if ((fc.bias < 0 || bias != nullptr) &&
        gemm_x_wt_gelu_bf16(x, rows, C, H, W, bias, pre, post, st, mode_, weight_slots(call, fp8_.input_a(call, 0), 0)))
      return;
    float* t = call.scratch.as<float>();
    if (rows > 0)
      gemm_x_wt(x, rows, C, H, W, at(call.params, fc.bias), nullptr, 0.0f, t, st, mode_, weight_slots(call, fp8_.input_a(call, 0), 0));
    launch_gelu_forward_bf16(t, pre, post, rows * H, st);
  }

  // Under bf16 products: the gradient below the GELU in bf16 (in scratch, after the f32 region) and
  // fc's bias gradient, from the projection's input-gradient product.
  Operand d_pre_bf16(const LayerCall& call, const Operand& d, const lp::Dense& proj, const lp::Dense& fc) const {
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows, n = rows * H;
    const cudaStream_t st = stream_of(call);
    auto* out = reinterpret_cast<uint16_t*>(call.scratch.as<float>() + bf16_after(n));
    const Weight W = weight_at(call, proj.weight);
    float* db = at_mut(call.grads, fc.bias);
    if (fp8_mode(mode_)) {
      // FP8: the product writes the gradient above the GELU in bf16 (into the f32 region), and one
      // kernel reads it with pre, writes the gradient below and takes fc's bias gradient.
      auto* dh = reinterpret_cast<uint16_t*>(call.scratch.as<float>());
      gemm_dy_w_bf16_out(d, rows, H, C, W, dh, st, mode_, weight_slots(call, fp8_.at(call, 3), 1), false, nullptr,
                         /*dy_scale_reused=*/call.grads.data != nullptr);
      launch_gelu_backward_bf16_sums(pre_bf16(call), dh, out, rows, H, call.scratch.as<float>() + partials_at(s, rows), db, st);
      return {nullptr, out};
    }
    if (!gemm_dy_w_dgelu_bf16(d, rows, H, C, W, pre_bf16(call), out, db, st, mode_, weight_slots(call, fp8_.at(call, 3), 1))) {
      float* dh = call.scratch.as<float>();
      gemm_dy_w(d, rows, H, C, W, false, dh, st, mode_, weight_slots(call, fp8_.at(call, 3), 1),
                /*dy_scale_reused=*/call.grads.data != nullptr);
      launch_gelu_backward_bf16(pre_bf16(call), dh, out, n, st);
      if (db != nullptr) add_column_sums(dh, db, rows, H, st);
    }
    return {nullptr, out};
  }

  Fp8Slots weight_slots(const LayerCall& call, Fp8Slots slots, int w) const {
    return fp8_.weight(slots, call, {{call.spec->out, call.spec->in}, {call.spec->in, call.spec->out}}, w);
  }

  static constexpr const char* kName = "gelu_mlp";
  MatmulMode mode_;
  Fp8State fp8_;
};

// --- swiglu_mlp -----------------------------------------------------------------------------------

// saved: gate g, up u and h = silu(g) u, (rows, H) each: f32, or under bf16 products all three in
// bf16, g then u then h (the gate's and up's products write g and u rounded from their fp32 sums,
// as a bf16 peer's do; the down projection's products read h as it is). scratch: two (rows, H) f32
// gradients (under bf16 products three bf16 ones: dh from the down projection's input-gradient
// product, then dg and du, which the gate's and up's products read as they are), then (rows, C)
// for the output's dropout; forward, the first (rows, H) f32 for a bf16 output's fallback product.
class SwiGLUMLP final : public Layer {
 public:
  SwiGLUMLP(MatmulMode mode, Fp8Scaling scaling) : mode_(mode), fp8_{mode, scaling, 9} {}
  // FP8 delayed scaling: products 0-2 the gate, up and down forwards; 3, 4 down's input and
  // weight gradients, 5, 6 gate's, 7, 8 up's.
  int64_t scaling_state_elements(const LayerSpec&) const override { return fp8_.elements(); }
  // FP8 current scaling: gate's, up's and down's packs, made once a step (products 0, 5; 1, 7; 2, 3).
  int64_t weight_cache_bytes(const LayerSpec& s) const override {
    return fp8_.cache_bytes({{s.out, s.in}, {s.out, s.in}, {s.in, s.out}});
  }
  void end_step(const LayerCall& call) override { fp8_.end_step(kName, call); }
  ScalingReport scaling_report(const LayerSpec&, const float* state) const override { return fp8_.report(state); }
  LayerRole role() const override { return LayerRole::mlp; }
  int64_t default_hidden(int64_t d_model) const override { return lp::swiglu_hidden(d_model); }
  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    lp::swiglu_mlp(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec& s, int64_t rows) const override {
    const int64_t n = rows * s.out;
    return bf16_h() ? bf16_elements(3 * n) : 3 * n;
  }
  int64_t activation_bf16_elements(const LayerSpec& s, int64_t rows) const override {
    return bf16_h() ? activation_elements(s, rows) : 0;  // g, u and h
  }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return 2 * rows * s.out + rows * s.in; }
  int64_t workspace_bytes(const LayerSpec& s, int64_t rows) const override { return gemm_workspace_bytes(mode_, rows, s.in, s.out); }
  bool bf16_product_inputs() const override { return bf16_family(mode_); }
  // Under bf16 products: the residual and y in bf16 (the stream held so), the sum rounded once.
  bool bf16_residual() const override { return bf16_family(mode_); }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    fp8_.begin(call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const auto [gate, up, down] = lp::swiglu_mlp_offsets(s);
    const Operand x = check_forward(kName, call, C, C, down.end, activation_elements(s, rows), scratch_elements(s, rows), mode_);
    if (bf16_h() && s.bias) require_f32(kName, call.scratch, "scratch", scratch_elements(s, rows));  // the fallback's product
    const cudaStream_t st = stream_of(call);
    const int64_t n = rows * H;
    const Operand h = h_of(call, n);
    // up's product reads x as gate's just did (under FP8 current scaling, its quantised copy)
    const Fp8Slots gate_slots = weight_slots(call, fp8_.input_a(call, 0), 0);
    const Fp8Slots up_slots = weight_slots(call, fp8_.input_a(call, 1, /*again=*/true), 1);
    if (bf16_h()) {
      uint16_t* g = halves(call);
      project_bf16(call, x, gate, g, gate_slots);
      project_bf16(call, x, up, g + n, up_slots);
      launch_swiglu_forward_bf16(g, g + n, g + 2 * n, n, st);
    } else {
      float* g = call.saved.as<float>();
      float* u = g + n;
      dense_forward(x, rows, C, H, weight_at(call, gate.weight), at(call.params, gate.bias), g, nullptr, DropoutArgs{}, nullptr, st,
                    mode_, gate_slots);
      dense_forward(x, rows, C, H, weight_at(call, up.weight), at(call.params, up.bias), u, nullptr, DropoutArgs{}, nullptr, st, mode_,
                    up_slots);
      launch_swiglu_forward(g, u, const_cast<float*>(h.f32), n, st);
    }
    project_to_stream(kName, call, h, H, C, down, scratch_at(call, 2 * rows * H), mode_, weight_slots(call, fp8_.at(call, 2), 2));
    check_launch(kName);
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    fp8_.begin(call);
    const LayerSpec& s = *call.spec;
    const int64_t C = s.in, H = s.out, rows = call.rows;
    const auto [gate, up, down] = lp::swiglu_mlp_offsets(s);
    const Operand x = check_backward(kName, call, C, C, down.end, activation_elements(s, rows), scratch_elements(s, rows), mode_);
    const cudaStream_t st = stream_of(call);
    const int64_t n = rows * H;
    const Operand h = h_of(call, n);
    Operand d_g, d_u;
    if (bf16_h()) {
      // dh, dg and du in bf16 (scratch), the down projection's product writing dh.
      const uint16_t* g = halves(call);
      auto* dh = static_cast<uint16_t*>(call.scratch.data);
      dense_backward(call.d_y.as<const float>(), rows, H, C, h, weight_at(call, down.weight), at_mut(call.grads, down.weight),
                     at_mut(call.grads, down.bias), nullptr, false, dropout_of(kName, call), scratch_at(call, 2 * rows * H), st, mode_,
                     dh, weight_slots(call, fp8_.at(call, 3), 2), fp8_.at(call, 4));
      launch_swiglu_backward_bf16(g, g + n, dh, dh + n, dh + 2 * n, n, st);
      d_g = Operand{nullptr, dh + n};
      d_u = Operand{nullptr, dh + 2 * n};
    } else {
      const float* g = call.saved.as<const float>();
      float* du = call.scratch.as<float>();  // holds dh first
      dense_backward(call.d_y.as<const float>(), rows, H, C, h, weight_at(call, down.weight), at_mut(call.grads, down.weight),
                     at_mut(call.grads, down.bias), du, false, dropout_of(kName, call), scratch_at(call, 2 * rows * H), st, mode_,
                     nullptr, weight_slots(call, fp8_.at(call, 3), 2), fp8_.at(call, 4));
      launch_swiglu_backward(g, g + n, du, du + n, n, st);
      d_g = Operand{du + n};
      d_u = Operand{du};
    }
    float* d_x = call.d_x.as<float>();
    dense_backward(d_g, rows, C, H, x, weight_at(call, gate.weight), at_mut(call.grads, gate.weight), at_mut(call.grads, gate.bias),
                   d_x, call.input_grad == GradMode::accumulate, DropoutArgs{}, nullptr, st, mode_, nullptr,
                   weight_slots(call, fp8_.at(call, 5), 0), fp8_.input_b(call, 6));
    // up's weight gradient reads x as gate's just did (under FP8 current scaling, its transposed copy)
    dense_backward(d_u, rows, C, H, x, weight_at(call, up.weight), at_mut(call.grads, up.weight), at_mut(call.grads, up.bias), d_x,
                   true, DropoutArgs{}, nullptr, st, mode_, nullptr, weight_slots(call, fp8_.at(call, 7), 1),
                   fp8_.input_b(call, 8, /*again=*/true));
    check_launch(kName);
  }

 private:
  bool bf16_h() const { return bf16_family(mode_); }
  // Under bf16 products the saved values as bf16: g, then u, then h.
  static uint16_t* halves(const LayerCall& call) { return static_cast<uint16_t*>(call.saved.data); }
  // h (n values) in the saved values, after g and u: f32 or bf16.
  Operand h_of(const LayerCall& call, int64_t n) const {
    if (!bf16_h()) return {call.saved.as<const float>() + 2 * n, nullptr};
    return {nullptr, halves(call) + 2 * n};
  }
  // y (rows, H) = x W^T + b in bf16 from the product (the bias, from the model's bf16 copy, in its
  // epilogue); where there is no copy of a bias or cuBLASLt serves no such epilogue, the product
  // into f32 scratch with the bias, then rounded: the same values save the bias's rounding.
  void project_bf16(const LayerCall& call, const Operand& x, const lp::Dense& p, uint16_t* y, Fp8Slots slots) const {
    const LayerSpec& s = *call.spec;
    const int64_t rows = call.rows;
    const cudaStream_t st = stream_of(call);
    const Weight W = weight_at(call, p.weight);
    if (rows == 0) return;
    if (p.bias < 0) {
      gemm_x_wt_bf16_out(x, rows, s.in, s.out, W, y, st, mode_, slots);
      return;
    }
    if (call.params_bf16.data != nullptr &&
        gemm_x_wt_bias_bf16_out(x, rows, s.in, s.out, W, weight_at(call, p.bias).bf16, y, st, mode_, slots))
      return;
    float* tmp = call.scratch.as<float>();
    gemm_x_wt(x, rows, s.in, s.out, W, at(call.params, p.bias), nullptr, 0.0f, tmp, st, mode_, slots);
    launch_to_bf16(tmp, rows, s.out, s.out, y, st);
  }
  Fp8Slots weight_slots(const LayerCall& call, Fp8Slots slots, int w) const {
    const LayerSpec& s = *call.spec;
    return fp8_.weight(slots, call, {{s.out, s.in}, {s.out, s.in}, {s.in, s.out}}, w);
  }

  static constexpr const char* kName = "swiglu_mlp";
  MatmulMode mode_;
  Fp8State fp8_;
};

}  // namespace

std::unique_ptr<Layer> make_linear(MatmulMode mode, Fp8Scaling scaling) { return std::make_unique<Linear>(mode, scaling); }
std::unique_ptr<Layer> make_gelu_mlp(MatmulMode mode, Fp8Scaling scaling) { return std::make_unique<GeluMLP>(mode, scaling); }
std::unique_ptr<Layer> make_swiglu_mlp(MatmulMode mode, Fp8Scaling scaling) { return std::make_unique<SwiGLUMLP>(mode, scaling); }

}  // namespace ablate::cuda_layers
