// Registers the CPU layers, one component per layer, serving device "cpu": each layer's folder in
// plugins/layers/ holds its CPU file (here) and its CUDA file (cuda/cuda_layers.cpp registers those).
// rope, lora and cross_entropy have keys of their own (layer_params::rope_keys, lora_keys,
// classifier_keys), the others none.
#include <spdlog/spdlog.h>

#include "ablate/plugin.hpp"
#include "common.hpp"

namespace {

using ablate::Layer;

template <class L>
void add(ablate::Registrar& r, const char* name, const char* doc, std::unique_ptr<L> (*make)()) {
  r.add({ablate::Kind::layer,
         name,
         "1.0.0",
         doc,
         {},
         [make](const ablate::ComponentArgs&) -> std::unique_ptr<ablate::Component> { return make(); },
         "",
         {"cpu"}});
}

void register_components(ablate::Registrar& r) {
  using namespace ablate::cpu_layers;
  // Which kernels OpenBLAS loaded with (the core names them before the first plugin loads).
  spdlog::debug("cpu_layers: {} ({} kernels)", openblas_get_config(), openblas_get_corename());
  add(r, "embedding", "token embedding table lookup on the CPU (f32/f64), optional output dropout", make_embedding);
  add(r, "learned", "learned position table added to the stream on the CPU (f32/f64)", make_learned);
  r.add({ablate::Kind::layer,
         "rope",
         "1.0.0",
         "rotary position embedding, rotate-half convention, on the CPU (f32/f64)",
         ablate::layer_params::rope_keys(),
         [](const ablate::ComponentArgs& a) -> std::unique_ptr<ablate::Component> {
           return make_rope(ablate::layer_params::read_rope_theta(a.own));
         },
         "",
         {"cpu"}});
  add(r, "layernorm", "layer norm with weight and optional bias on the CPU (f32/f64)", make_layernorm);
  add(r, "rmsnorm", "RMS norm with weight on the CPU (f32/f64)", make_rmsnorm);
  add(r, "linear", "y = x W^T + b (+ residual), OpenBLAS, on the CPU (f32/f64)", make_linear);
  add(r, "gelu_mlp", "fc, tanh GELU, proj (+ residual) on the CPU (f32/f64)", make_gelu_mlp);
  add(r, "swiglu_mlp", "down(silu(gate x) * up x) (+ residual) on the CPU (f32/f64)", make_swiglu_mlp);
  r.add({ablate::Kind::layer,
         "cross_entropy",
         "1.2.0",
         "fused classifier: logits, softmax cross-entropy and its gradients on the CPU (f32/f64), 256 rows' logits at a "
         "time ([model.cross_entropy] chunk_rows)",
         ablate::layer_params::classifier_keys(),
         [](const ablate::ComponentArgs& a) -> std::unique_ptr<ablate::Component> {
           ablate::layer_params::read_classifier_fp8(a.own, a.run.dtype);  // no FP8 here: checked, as on every device
           return make_cross_entropy(ablate::layer_params::read_classifier_chunk_rows(a.own));
         },
         "",
         {"cpu"}});
  r.add({ablate::Kind::layer,
         "lora",
         "1.0.0",
         "LoRA adapter on a linear layer: y += (alpha/rank) dropout(x) A^T B^T, A (rank, in), B (out, rank) trainable, "
         "the base frozen ([adapter.lora] rank, alpha, dropout; [adapter] targets), on the CPU (f32/f64)",
         ablate::layer_params::lora_keys(),
         [](const ablate::ComponentArgs& a) -> std::unique_ptr<ablate::Component> { return make_lora(a.own); },
         "",
         {"cpu"}});
}

}  // namespace

ABLATE_PLUGIN("cpu_layers", "1.0.0", register_components)
