// `cuda_layers`: the layers on a CUDA device, registered for device "cuda" under the names of their
// CPU twins, so an experiment's [model] means the same on both devices. f32 values (products in f32,
// TF32 or bf16 by run.dtype), with the CPU
// layers' parameters, saved values and gradient contract; on a GPU, tests/layers (fp32) and
// tests/gpu/test_cuda_layers.cpp (fp32, tf32, bf16) run each against the CPU layers in float64,
// and tests/layers/test_cuda_layers_math.cpp checks the arithmetic of their kernels (the
// __host__ __device__ headers) here on the CPU.
#include "ablate/layer_params.hpp"
#include "ablate/plugin.hpp"
#include "common.hpp"

namespace ablate::cuda_layers {
namespace {

// A layer registration for device "cuda" (its factory set by the caller).
ComponentInfo layer_info(const char* name, const char* version, const char* doc) {
  ComponentInfo info;
  info.kind = Kind::layer;
  info.name = name;
  info.version = version;
  info.doc = doc;
  info.devices = {"cuda"};
  return info;
}

// A layer with its own keys (`schema`, read from [model.<name>] or [adapter.<name>]): `make`
// receives them.
void add_keyed(Registrar& r, const char* name, const char* version, const char* doc, Schema schema,
               std::function<std::unique_ptr<Layer>(const Params& own)> make) {
  ComponentInfo info = layer_info(name, version, doc);
  info.schema = std::move(schema);
  info.factory = [make](const ComponentArgs& a) -> std::unique_ptr<Component> { return make(a.own); };
  r.add(std::move(info));
}

// `make` receives how the run computes its products (run.dtype: fp32, tf32, bf16, fp8 or fp8_e4m3;
// gemm.hpp).
template <class L>
void add(Registrar& r, const char* name, const char* doc, std::function<std::unique_ptr<L>(MatmulMode)> make) {
  ComponentInfo info = layer_info(name, "1.1.0", doc);
  info.factory = [make](const ComponentArgs& a) -> std::unique_ptr<Component> { return make(matmul_mode(a.run.dtype)); };
  r.add(std::move(info));
}

// A dense layer: `make` also receives how FP8 products are scaled (run.fp8_scaling and its keys).
void add_dense(Registrar& r, const char* name, const char* doc, std::function<std::unique_ptr<Layer>(MatmulMode, Fp8Scaling)> make) {
  ComponentInfo info = layer_info(name, "1.1.0", doc);
  info.factory = [make](const ComponentArgs& a) -> std::unique_ptr<Component> {
    Fp8Scaling s;
    if (fp8_dtype(a.run.dtype) && a.run.fp8_scaling == "delayed") {
      s.history = a.run.fp8_amax_history;
      s.use_max = a.run.fp8_amax_reduction != "most_recent";
    }
    return make(matmul_mode(a.run.dtype), s);
  };
  r.add(std::move(info));
}

void register_components(Registrar& r) {
  add<Layer>(r, "embedding", "token embedding lookup on a CUDA device (f32), optional output dropout; sorted scatter-add backward",
             [](MatmulMode) { return make_embedding(); });
  add<Layer>(r, "learned", "learned position table added to the stream on a CUDA device (f32)",
             [](MatmulMode) { return make_learned(); });
  add_keyed(r, "rope", "1.1.0", "rotary position embedding, rotate-half convention, on a CUDA device (f32)", layer_params::rope_keys(),
            [](const Params& own) { return make_rope(layer_params::read_rope_theta(own)); });
  add<Layer>(r, "layernorm", "layer norm with weight and optional bias on a CUDA device (f32; warp per row)",
             [](MatmulMode) { return make_norm(false, "layernorm"); });
  add<Layer>(r, "rmsnorm", "RMS norm with weight on a CUDA device (f32; warp per row)",
             [](MatmulMode) { return make_norm(true, "rmsnorm"); });
  add_dense(r, "linear",
            "y = x W^T + b (+ residual), cuBLASLt with a bias epilogue, on a CUDA device (f32; TF32, bf16 or FP8 products)",
            make_linear);
  add_dense(r, "gelu_mlp", "fc, tanh GELU, proj (+ residual), cuBLASLt, on a CUDA device (f32; TF32, bf16 or FP8 products)",
            make_gelu_mlp);
  add_dense(r, "swiglu_mlp", "down(silu(gate x) * up x) (+ residual), cuBLASLt, on a CUDA device (f32; TF32, bf16 or FP8 products)",
            make_swiglu_mlp);
  {
    ComponentInfo info = layer_info("cross_entropy", "1.3.0",
                                    "fused classifier on a CUDA device (f32): logits in chunks of 1024 rows (bf16 logits in "
                                    "chunks of up to 1 GiB under bf16 products; [model.cross_entropy] chunk_rows; under FP8 "
                                    "ones bf16 products, or FP8 with [model.cross_entropy] fp8), softmax cross-entropy and "
                                    "its gradients");
    info.schema = layer_params::classifier_keys();
    info.factory = [](const ComponentArgs& a) -> std::unique_ptr<Component> {
      const MatmulMode mode = matmul_mode(a.run.dtype);
      const bool fp8 = layer_params::read_classifier_fp8(a.own, a.run.dtype);
      return make_cross_entropy(fp8_mode(mode) && !fp8 ? MatmulMode::bf16 : mode, layer_params::read_classifier_chunk_rows(a.own));
    };
    r.add(std::move(info));
  }
  add_keyed(r, "lora", "1.0.0",
            "LoRA adapter on a linear layer on a CUDA device: y += (alpha/rank) dropout(x) A^T B^T, fp32 cuBLASLt products",
            layer_params::lora_keys(), make_lora);
}

}  // namespace
}  // namespace ablate::cuda_layers

ABLATE_PLUGIN("cuda_layers", "1.1.0", ablate::cuda_layers::register_components)

// FP8 products that quantised their A with the scale of the product before them (an output
// gradient read by two products, under current scaling), for tests: resolved with dlsym from the
// plugin library.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_scales_reused() {
  return ablate::cuda_layers::gemm_fp8_scales_reused();
}

// FP8 products run with their epilogue fused (the bias, the GELU on a bf16 output), likewise.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_epilogues_fused() {
  return ablate::cuda_layers::gemm_fp8_epilogues_fused();
}

// FP8 products that read an output gradient as the product before them packed it for them, likewise.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_packs_shared() {
  return ablate::cuda_layers::gemm_fp8_packs_shared();
}

// FP8 products that read a layer input as an earlier product quantised it (LayerCall::x_unchanged,
// a SwiGLU's up after its gate), likewise.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_inputs_reused() {
  return ablate::cuda_layers::gemm_fp8_inputs_reused();
}

// FP8 products that read a weight as an earlier product of the step quantised it (the call site's
// weight pack, LayerCall::weights_unchanged), likewise.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_weight_packs_reused() {
  return ablate::cuda_layers::gemm_fp8_weight_packs_reused();
}

// FP8 products whose output gradient's column sums (a bias gradient) were taken in the pass that
// quantised it, and those that took them by a pass of their own, likewise.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_sums_in_pack() {
  return ablate::cuda_layers::gemm_fp8_sums_in_pack();
}
extern "C" __attribute__((visibility("default"))) int64_t ablate_cuda_layers_fp8_sums_by_pass() {
  return ablate::cuda_layers::gemm_fp8_sums_by_pass();
}
