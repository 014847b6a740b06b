// The parts a model is assembled from, each in its own place: the layer plugins it calls (made,
// checked for their roles and asked what they take in bf16, model_layers.cpp), and the activation
// arena with its views (one f32 buffer laid out by the plan, model_plan.hpp). Model::Impl
// (model.cpp) holds one of each and runs the passes over them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/batch.hpp"
#include "ablate/device.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/model.hpp"
#include "model_plan.hpp"
#include "model_schedule.hpp"

namespace ablate {

class Registry;

// The model's device. Model::Impl names it as its first base, so that it is made before and
// destroyed after every layer and buffer that uses it.
struct ModelDevice {
  std::unique_ptr<Device> device;
  const Batch* uploaded = nullptr;  // the batch Model::upload_batch put on it, until a forward pass uses it
};

// The layers and the attention backend [model], [attention] and [adapter] name, on run.device.
struct ModelLayerSet {
  std::unique_ptr<Layer> emb, pos, norm, lin, mlp, qkn;
  std::unique_ptr<LossLayer> cls;
  std::unique_ptr<Attention> attn;
  std::unique_ptr<Layer> adapter;  // [adapter], else null

  // Every layer the model calls, each checked to be of the role it is asked for (exit 2 naming the
  // key otherwise), and the attention backend.
  void make(const Registry& registry, const ModelOptions& o, const RunContext& run);
  schedule::ModelLayers view() const {
    return {emb.get(), pos.get(), norm.get(), lin.get(), mlp.get(), qkn.get(), cls.get(), adapter.get()};
  }
  // The keys [model] leaves at 0 filled in with the layers' answers: the MLP's hidden width, the
  // norms' epsilons.
  void answer_defaults(ModelOptions& o) const;
  // Each layer asked whether it can serve its use (LayerBase::unsupported): exit 2 naming the key
  // that chose it otherwise (rope and an odd head_dim), before any parameter is declared.
  void require_supported(const ModelOptions& o, const schedule::LayerSpecs& s) const;
  // make, answer_defaults, the layers' specs and require_supported in that order, then every
  // parameter declared into `table` (the block schedule): what a model of `o` is, before any device
  // memory. The model's constructor and Model::count_params share it.
  schedule::Schedule declare(const Registry& registry, ModelOptions& o, const RunContext& run, schedule::LayerSpecs& specs,
                             ParamTable& table);
  // What they answer for the bf16 policy (Bf16Policy::Answers), the position layer applied at `site`.
  schedule::Bf16Policy::Answers bf16_answers(const ModelOptions& o, PositionSite site) const;
  // Which activations are held in bf16: what run.dtype and the answers allow, and the residual
  // stream where run.residual_dtype asks for it (exit 2 where the dtype or a layer cannot).
  schedule::Bf16Policy bf16_policy(const ModelOptions& o, const RunContext& run) const;
};

// The activation arena: one f32 buffer laid out by an ArenaPlan, and the adapters' region beside
// it; views of a slot typed as the plan holds it.
struct ActivationArena {
  schedule::ArenaPlan plan;         // of the shape the arena was last laid out for
  Buffer act;                       // the arena
  Buffer adapter_act;               // the adapters' saved values (one region per adapter) and their scratch
  std::vector<int64_t> adapter_at;  // offsets into adapter_act: adapter i's saved values, then the scratch
  int64_t head_dim = 0;

  // Slot r as (rows, cols), empty where the site has no such slot.
  TensorView arena(schedule::Ref r, int64_t rows, int64_t cols) const;
  // From a slot to the end of the arena: a layer reads as many saved values as it declared.
  TensorView arena_tail(schedule::Ref r) const;
  // Slot r as the attention's (B, T, heads, head_dim).
  TensorView heads4(schedule::Ref r, int64_t heads) const;
  // Adapter i's saved values, and the scratch the adapters share.
  TensorView adapter_saved(std::size_t i) const { return adapter_act.view(adapter_at[i], adapter_at[i + 1] - adapter_at[i]); }
  TensorView adapter_scratch() const {
    const int64_t at = adapter_at[adapter_at.size() - 2];
    return adapter_act.view(at, adapter_at.back() - at);
  }
  // The buffers grown (never shrunk: bucketed batches change T from batch to batch, and the arena is
  // allocated, and zeroed, once for the largest) to `next` and the adapters' layout `adapters`.
  void lay_out(Device& device, schedule::ArenaPlan next, std::vector<int64_t> adapters);
};

}  // namespace ablate
