// The layers a model is made of and its activation arena (model_layers.hpp).
#include "model_layers.hpp"

#include <algorithm>

#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate {

namespace {

template <class L = Layer>
std::unique_ptr<L> make_layer(const Registry& registry, const ModelOptions& o, const RunContext& run, const std::string& name,
                              const char* key) {
  const auto it = o.layer_own.find(name);
  const Params own = it != o.layer_own.end() ? it->second : Params{"model." + name, {}};
  return registry.create<L>(Kind::layer, name, {o.model_common, own, run}, key);
}

}  // namespace

void ModelLayerSet::make(const Registry& registry, const ModelOptions& o, const RunContext& run) {
  emb = make_layer(registry, o, run, o.embedding, "model.embedding_layer");
  pos = make_layer(registry, o, run, o.position, "model.position");
  norm = make_layer(registry, o, run, o.norm, "model.norm");
  lin = make_layer(registry, o, run, o.linear, "model.projection_layer");
  mlp = make_layer(registry, o, run, o.mlp, "model.mlp");
  cls = make_layer<LossLayer>(registry, o, run, o.classifier, "model.classifier_layer");
  if (o.qk_norm) qkn = make_layer(registry, o, run, o.qk_norm_layer, "model.qk_norm_layer");
  attn = registry.create<Attention>(Kind::attention, o.attention, {o.attention_common, o.attention_own, run}, "attention.name");
  if (!o.adapter.empty()) {
    adapter = registry.create<Layer>(Kind::layer, o.adapter, {o.adapter_common, o.adapter_own, run}, "adapter.name");
    if (adapter->role() != LayerRole::adapter) {
      throw_input_error("adapter.name",
                        "the layer '" + o.adapter + "' has role '" + to_string(adapter->role()) + "', expected 'adapter'");
    }
  }
  const struct {
    LayerBase* layer;
    LayerRole role;
    const char* key;
  } roles[] = {{emb.get(), LayerRole::embedding, "model.embedding_layer"},
               {pos.get(), LayerRole::position, "model.position"},
               {norm.get(), LayerRole::norm, "model.norm"},
               {lin.get(), LayerRole::linear, "model.projection_layer"},
               {mlp.get(), LayerRole::mlp, "model.mlp"},
               {cls.get(), LayerRole::classifier, "model.classifier_layer"},
               {qkn.get(), LayerRole::norm, "model.qk_norm_layer"}};
  for (const auto& r : roles) {
    if (r.layer != nullptr && r.layer->role() != r.role) {
      throw_input_error(r.key, std::string("the layer found has role '") + to_string(r.layer->role()) + "', expected '" +
                                   to_string(r.role) + "'");
    }
  }
}

void ModelLayerSet::answer_defaults(ModelOptions& o) const {
  if (o.mlp_hidden == 0) o.mlp_hidden = mlp->default_hidden(o.d_model);
  o.norm_eps_default = norm->default_epsilon();
  if (qkn) o.qk_norm_eps_default = qkn->default_epsilon();
  if (adapter) o.adapter_keys_text = adapter->describe_keys();
}

void ModelLayerSet::require_supported(const ModelOptions& o, const schedule::LayerSpecs& s) const {
  const struct {
    const LayerBase* layer;
    const LayerSpec& spec;
    const char* key;
    const std::string& name;
  } uses[] = {{emb.get(), s.emb, "model.embedding_layer", o.embedding},
              {pos.get(), s.pos, "model.position", o.position},
              {norm.get(), s.norm, "model.norm", o.norm},
              {lin.get(), s.q, "model.projection_layer", o.linear},
              {lin.get(), s.kv, "model.projection_layer", o.linear},
              {lin.get(), s.o, "model.projection_layer", o.linear},
              {mlp.get(), s.mlp, "model.mlp", o.mlp},
              {cls.get(), s.cls, "model.classifier_layer", o.classifier},
              {qkn.get(), s.qkn, "model.qk_norm_layer", o.qk_norm_layer}};
  for (const auto& u : uses) {
    if (u.layer == nullptr) continue;
    if (const std::string why = u.layer->unsupported(u.spec); !why.empty()) {
      throw_input_error(u.key, "'" + u.name + "' cannot serve this model: " + why);
    }
  }
}

schedule::Schedule ModelLayerSet::declare(const Registry& registry, ModelOptions& o, const RunContext& run,
                                          schedule::LayerSpecs& specs, ParamTable& table) {
  make(registry, o, run);
  answer_defaults(o);
  specs = schedule::make_specs(o, pos->position_site());
  require_supported(o, specs);
  return schedule::build_schedule(o, view(), specs, table);
}

schedule::Bf16Policy::Answers ModelLayerSet::bf16_answers(const ModelOptions& o, PositionSite site) const {
  schedule::Bf16Policy::Answers a;
  a.products_take_bf16 =
      norm->bf16_product_inputs() && lin->bf16_product_inputs() && mlp->bf16_product_inputs() && cls->bf16_product_inputs();
  a.attention_writes_bf16 = attn->bf16_activations();
  a.qkv_layers_take_bf16 = lin->bf16_attention_inputs() && (site != PositionSite::qk || pos->bf16_attention_inputs()) &&
                           (!o.qk_norm || qkn->bf16_attention_inputs());
  a.attention_grads_bf16 = attn->bf16_gradients();
  a.grad_layers_take_bf16 = lin->bf16_attention_grads() && (site != PositionSite::qk || pos->bf16_attention_grads()) &&
                            (!o.qk_norm || qkn->bf16_attention_grads());
  if (adapter) {  // an adapter reads the projections' x and adds to their y: both stay f32 unless it takes bf16
    a.products_take_bf16 = a.products_take_bf16 && adapter->bf16_product_inputs();
    a.qkv_layers_take_bf16 = a.qkv_layers_take_bf16 && adapter->bf16_attention_inputs();
    a.grad_layers_take_bf16 = a.grad_layers_take_bf16 && adapter->bf16_attention_grads();
  }
  // The residual stream's writers and readers: the embedding, a position table added to the
  // stream, the norms (ln1, ln2, lnf), the attention's output projection and the MLP (each adds its
  // output to the stream), and an adapter on the output projection (it adds to that projection's y).
  const bool adapter_on_o = adapter && std::find(o.adapter_targets.begin(), o.adapter_targets.end(), "o") != o.adapter_targets.end();
  const struct {
    const LayerBase* layer;
    bool touches;
    const std::string& name;
  } stream[] = {{emb.get(), true, o.embedding}, {pos.get(), site == PositionSite::stream, o.position},
                {norm.get(), true, o.norm},     {lin.get(), true, o.linear},
                {mlp.get(), true, o.mlp},       {adapter.get(), adapter_on_o, o.adapter}};
  for (const auto& u : stream) {
    if (u.touches && !u.layer->bf16_residual()) {
      a.residual_refused_by = u.name;
      break;
    }
  }
  return a;
}

schedule::Bf16Policy ModelLayerSet::bf16_policy(const ModelOptions& o, const RunContext& run) const {
  const schedule::Bf16Policy::Answers answers = bf16_answers(o, pos->position_site());
  const bool residual = run.residual_dtype == "bf16";
  if (residual && !holds_bf16(run.dtype)) {
    throw_input_error("run.residual_dtype", "\"bf16\" holds the residual stream in bf16, which needs bf16 products: run.dtype "
                                            "must be \"bf16\", \"fp8\" or \"fp8_e4m3\", not \"" +
                                                run.dtype + "\"");
  }
  const schedule::Bf16Policy p = schedule::Bf16Policy::decide(holds_bf16(run.dtype), answers, residual);
  if (residual && !answers.residual_refused_by.empty()) {
    throw_input_error("run.residual_dtype", "\"bf16\": layer '" + answers.residual_refused_by + "' on " + run.device +
                                                " does not read and write the residual stream in bf16; use \"fp32\"");
  }
  if (residual && !p.residual) {
    throw_input_error("run.residual_dtype", "\"bf16\": the norms' outputs are not held in bf16 here (a layer reading them "
                                            "takes f32 only), and a norm reading a bf16 stream writes bf16; use \"fp32\"");
  }
  return p;
}

TensorView ActivationArena::arena(schedule::Ref r, int64_t rows, int64_t cols) const {
  if (!r.set()) return {};
  TensorView t = act.view(plan.at(r), rows * cols);
  t.dtype = plan.dtype(r);  // the same first byte; a bf16 slot's values are two bytes each
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

TensorView ActivationArena::arena_tail(schedule::Ref r) const {
  return r.set() ? act.view(plan.at(r), plan.elements - plan.at(r)) : TensorView{};
}

TensorView ActivationArena::heads4(schedule::Ref r, int64_t heads) const {
  TensorView t = act.view(plan.at(r), plan.rows * plan.seq_len * heads * head_dim);
  t.dtype = plan.dtype(r);
  t.ndim = 4;
  t.shape = {plan.rows, plan.seq_len, heads, head_dim};
  return t;
}

void ActivationArena::lay_out(Device& device, schedule::ArenaPlan next, std::vector<int64_t> adapters) {
  plan = std::move(next);
  if (act.count() < plan.elements) act = device.alloc(DType::f32, plan.elements);
  adapter_at = std::move(adapters);
  if (!adapter_at.empty() && adapter_act.count() < adapter_at.back()) adapter_act = device.alloc(DType::f32, adapter_at.back());
}

}  // namespace ablate
