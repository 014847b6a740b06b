// `cross_entropy` on a CUDA device: the fused classifier, f32 (its input x held in bf16 where the
// model holds it so, under bf16 products), with the CPU layer's contract. Rows
// are processed in chunks: z = x W^T (cuBLASLt) into the scratch, one block per row
// computes the loss and overwrites z with the logit gradient (layer_kernels.cu), then
// d_x = dz W and dW += dz^T x. Only a chunk's logits live at once, never (B*T, vocab) of f32: 1024
// rows of f32 logits (206 MB at GPT-2's vocabulary).
// Under bf16 products, when no caller asks for the logits (training), the product writes them in
// bf16, the row kernel reads them twice and writes the gradient in place in bf16, and that is the
// bf16 operand of the two products: no f32 logits, no rounding copy. Those chunks are the fewest
// equal ones whose bf16 logits fit kLogitsBudget (1 GiB; at least 1024 rows): 7 chunks of 9,472 rows
// for GPT-2's 64 x 1024 batch, where 4096-row chunks made 16. Each chunk is a pass of the weight
// gradient's product over the f32 gradient (38.6M values, 309 MB read and written at GPT-2's size)
// and a smaller input-gradient product (4096 x 768 outputs: 192 tiles of 128 x 128 for 132 SMs). The
// loss is then the one of the bf16-rounded logits, as under PyTorch's autocast. Under FP8 products
// ([model.cross_entropy] fp8 with an FP8 run.dtype; else the registration gives bf16) the same
// chunks, each product quantising its operands per tensor (current scaling, gemm.hpp): x and W
// E4M3, the bf16 logit gradient E5M2 under "fp8" (E4M3 under "fp8_e4m3"), W's FP8 copies (both
// layouts, one scale) made once a step in the call's weight cache by the first product that reads
// W and read by every later chunk, pass and micro-batch of the step (as the dense layers' are).
// [model.cross_entropy] chunk_rows, where set, is the chunk in both cases.
#include <algorithm>

#include "ablate/layer_params.hpp"
#include "common.hpp"
#include "gemm.hpp"

namespace ablate::cuda_layers {
namespace {

constexpr int64_t kChunk = 1024;
constexpr int64_t kLogitsBudget = int64_t(1) << 30;

class CrossEntropy final : public LossLayer {
 public:
  CrossEntropy(MatmulMode mode, int64_t chunk_rows) : mode_(mode), chunk_rows_(chunk_rows) {}
  LayerRole role() const override { return LayerRole::classifier; }
  void declare_params(const LayerSpec& s, const std::string& prefix, ParamTable& table) const override {
    layer_params::classifier(s, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }
  // f32 logits (f32_chunk rows), or under bf16 (or FP8) products bf16 ones (bf16_chunk rows, two to an element).
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override {
    const int64_t f32 = std::min(rows, f32_chunk()) * s.out;
    return bf16_family(mode_) ? std::max(f32, (std::min(rows, bf16_chunk(rows, s.out)) * s.out + 1) / 2) : f32;
  }
  int64_t workspace_bytes(const LayerSpec& s, int64_t rows) const override {
    return gemm_workspace_bytes(mode_, std::min(rows, bf16_family(mode_) ? bf16_chunk(rows, s.out) : f32_chunk()), s.in, s.out);
  }
  bool bf16_product_inputs() const override { return bf16_family(mode_); }
  // FP8 products: W's copies in both layouts and their scale (LayerCall::weight_cache).
  int64_t weight_cache_bytes(const LayerSpec& s) const override { return fp8_mode(mode_) ? fp8_weight_pack_bytes(s.out, s.in) : 0; }

  void loss(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    layer_params::check_classifier(s);
    const int64_t rows = call.rows, in = s.in, out = s.out;
    const bool with_grad = call.d_x.data != nullptr;
    const Operand x = require_product_input(kName, call.x, "x", rows * in, mode_);
    require_f32(kName, call.params, "params", out * in);
    require_f32(kName, call.losses, "losses", rows);
    require_f32(kName, call.scratch, "scratch", scratch_elements(s, rows));
    if (call.logits.data != nullptr) require_f32(kName, call.logits, "logits", rows * out);
    if (with_grad) {
      require_f32(kName, call.d_x, "d_x", rows * in);
      if (call.grads.data != nullptr) require_f32(kName, call.grads, "grads", out * in);  // none: a frozen head
      if (same(call.d_x, call.x)) throw_runtime_error(kName, "d_x must not alias x");
    }
    const int32_t* targets = require_ids(kName, call, &BatchViews::targets, "targets");
    const cudaStream_t st = stream_of(call);
    const Weight W{call.params.as<const float>(), call.params_bf16.data};
    const Fp8Slots w_slots = weight_slots(call);
    if (bf16_family(mode_) && call.logits.data == nullptr) {
      loss_bf16_logits(call, x, W, w_slots, targets, with_grad, st);
      check_launch(kName);
      return;
    }
    float* z = call.scratch.as<float>();
    const int64_t chunk = f32_chunk();
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      gemm_x_wt(x.at(r0 * in), n, in, out, W, nullptr, nullptr, 0.0f, z, st, mode_, w_slots);
      if (call.logits.data != nullptr) {
        ABLATE_CUDA_CHECK(cudaMemcpyAsync(call.logits.as<float>() + r0 * out, z, std::size_t(n * out) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, st));
      }
      launch_cross_entropy_rows(z, n, out, s.real_out, targets + r0, call.losses.as<float>() + r0, with_grad, float(call.grad_scale),
                                st);
      if (with_grad) {
        // d_x = dz W (written or added), dW += dz^T x; dz rounded to bf16 once for both under bf16
        const Operand dz = gemm_bf16_once(z, n, out, st, mode_);
        gemm_dy_w(dz, n, in, out, W, call.input_grad == GradMode::accumulate, call.d_x.as<float>() + r0 * in, st, mode_, w_slots);
        if (call.grads.data != nullptr) gemm_add_dyt_x(dz, n, in, out, x.at(r0 * in), call.grads.as<float>(), nullptr, st, mode_);
      }
    }
    check_launch(kName);
  }

 private:
  // The bf16 chunks: logits written in bf16, the gradient in place, read by both products as it is.
  void loss_bf16_logits(const LayerCall& call, const Operand& x, const Weight& W, const Fp8Slots& w_slots, const int32_t* targets,
                        bool with_grad, cudaStream_t st) const {
    const LayerSpec& s = *call.spec;
    const int64_t rows = call.rows, in = s.in, out = s.out;
    uint16_t* z = reinterpret_cast<uint16_t*>(call.scratch.as<float>());
    const int64_t chunk = bf16_chunk(rows, out);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      gemm_x_wt_bf16_out(x.at(r0 * in), n, in, out, W, z, st, mode_, w_slots);
      launch_cross_entropy_rows_bf16(z, n, out, s.real_out, targets + r0, call.losses.as<float>() + r0, with_grad,
                                     float(call.grad_scale), st);
      if (!with_grad) continue;
      const Operand dz{nullptr, z};
      gemm_dy_w(dz, n, in, out, W, call.input_grad == GradMode::accumulate, call.d_x.as<float>() + r0 * in, st, mode_, w_slots);
      if (call.grads.data != nullptr) gemm_add_dyt_x(dz, n, in, out, x.at(r0 * in), call.grads.as<float>(), nullptr, st, mode_);
    }
  }

  // The products reading W under FP8: its pack in the call's weight cache, forgotten first where
  // the weights changed since the last call (common.hpp).
  Fp8Slots weight_slots(const LayerCall& call) const {
    forget_changed_weight_packs(call);
    return with_weight_pack({}, call, weight_cache_bytes(*call.spec), 0);
  }

  int64_t f32_chunk() const { return chunk_rows_ > 0 ? chunk_rows_ : kChunk; }
  // The rows of one chunk of bf16 logits: chunk_rows where set, else the fewest equal chunks of
  // `rows` whose logits fit kLogitsBudget, rounded up to a multiple of 128 rows, at least 1024.
  int64_t bf16_chunk(int64_t rows, int64_t out) const {
    if (chunk_rows_ > 0) return chunk_rows_;
    const int64_t bytes = std::max<int64_t>(1, rows) * std::max<int64_t>(1, out) * 2;
    const int64_t chunks = (bytes + kLogitsBudget - 1) / kLogitsBudget;
    const int64_t even = (rows + chunks - 1) / chunks;
    return std::max<int64_t>(kChunk, (even + 127) / 128 * 128);
  }

  static constexpr const char* kName = "cross_entropy";
  MatmulMode mode_;
  int64_t chunk_rows_;  // 0: the layer's own choice
};

}  // namespace

std::unique_ptr<LossLayer> make_cross_entropy(MatmulMode mode, int64_t chunk_rows) {
  return std::make_unique<CrossEntropy>(mode, chunk_rows);
}

}  // namespace ablate::cuda_layers
