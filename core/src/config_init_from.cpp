// [model] init_from: the model's shape from the checkpoint where the experiment gives none
// (config_check.hpp). A Hugging Face directory's come from its config.json (the keys `ablate
// import hf` prints), an ablate run's or checkpoint's from the [model] table of the checkpoint's
// config.toml. Keys the experiment sets stay as set: where they differ from the checkpoint, the
// model's load names them (exit 2).
#include <algorithm>
#include <filesystem>
#include <sstream>
#include <utility>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/hf_checkpoint.hpp"
#include "config_check.hpp"

namespace ablate::config_check {

namespace fs = std::filesystem;

namespace {

// The [model] keys that fix what a checkpoint's weights are: their shapes and the function they
// compute (not dropout, init_from itself or recomputation).
constexpr const char* kShapeKeys[] = {
    "d_model",      "n_layers",       "n_heads",  "n_kv_heads",      "vocab_size",       "vocab_multiple",
    "max_seq_len",  "norm",           "mlp",      "mlp_hidden",      "position",         "qk_norm",
    "bias",         "tie_embeddings", "norm_eps", "embedding_layer", "projection_layer", "classifier_layer",
    "qk_norm_layer"};

using Keys = std::vector<std::pair<std::string, std::string>>;  // key, its value as TOML text

Keys ablate_checkpoint_shape(const fs::path& from) {
  const fs::path cfg = resolve_checkpoint(from) / "config.toml";
  const std::string text = read_regular_file(cfg, "checkpoint config", kMaxExperimentBytes);
  toml::table t;
  try {
    t = toml::parse(text, cfg.string());
  } catch (const toml::parse_error& e) {
    throw_input_error(cfg.string() + ":" + std::to_string(e.source().begin.line),
                      "TOML syntax error: " + std::string(e.description()));
  }
  Keys out;
  const toml::table* m = t["model"].as_table();
  if (m == nullptr) throw_input_error(cfg.string(), "has no [model] table: not a checkpoint's resolved config");
  for (const char* key : kShapeKeys) {
    if (const toml::node* n = m->get(key)) {
      std::ostringstream os;
      n->visit([&](auto&& v) { os << toml::toml_formatter{v}; });
      out.emplace_back(key, os.str());
    }
  }
  // An older checkpoint's [model] rope_theta is its position layer's theta now (as config_override
  // moves it in an experiment). Resolved configs wrote it for every model: at its default (the
  // layer's default too) it says nothing.
  const toml::node* old_theta = m->get("rope_theta");
  const toml::node* position = m->get("position");
  if (old_theta != nullptr && old_theta->value<double>().value_or(10000.0) != 10000.0 && position != nullptr &&
      position->is_string()) {
    std::ostringstream os;
    old_theta->visit([&](auto&& v) { os << toml::toml_formatter{v}; });
    out.emplace_back(position->as_string()->get() + ".theta", os.str());
  }
  // The chosen layers' own keys ([model.<layer>]: rope's theta) as "layer.key".
  for (auto&& [layer, node] : *m) {
    if (!node.is_table()) continue;
    for (auto&& [key, value] : *node.as_table()) {
      std::ostringstream os;
      value.visit([&](auto&& v) { os << toml::toml_formatter{v}; });
      out.emplace_back(std::string(layer.str()) + "." + std::string(key.str()), os.str());
    }
  }
  return out;
}

// The [model] table's node at a key of the checkpoint's ("theta" of [model.rope] for "rope.theta"),
// and the table it goes in, made where missing.
toml::table& table_for(toml::table& model, const std::string& key, std::string& leaf) {
  const std::size_t dot = key.find('.');
  if (dot == std::string::npos) {
    leaf = key;
    return model;
  }
  leaf = key.substr(dot + 1);
  const std::string sub = key.substr(0, dot);
  if (!model.contains(sub)) model.insert(sub, toml::table{});
  toml::table* t = model.get(sub)->as_table();
  return t != nullptr ? *t : model;  // a non-table there: the section's check names it
}

}  // namespace

void take_model_shape(toml::table& root, std::map<std::string, std::string>& origins) {
  toml::table* model = root["model"].as_table();
  const toml::node* from_node = model != nullptr ? model->get("init_from") : nullptr;
  if (from_node == nullptr || !from_node->is_string()) return;  // none, or the checks name what is wrong
  const std::string from = from_node->as_string()->get();
  std::error_code ec;
  if (from.empty() || !fs::exists(from, ec)) return;  // the weights' load names a missing directory
  const bool complete = std::all_of(std::begin(kShapeKeys), std::end(kShapeKeys), [&](const char* k) { return model->contains(k); });
  if (complete) return;  // a resolved config (a checkpoint's own): nothing to read
  const Keys keys = is_hf_checkpoint_dir(from) ? read_hf_config(from).model_keys : ablate_checkpoint_shape(from);
  for (const auto& [key, text] : keys) {
    std::string leaf;
    toml::table& into = table_for(*model, key, leaf);
    if (into.contains(leaf)) continue;  // the experiment's (or --set's) value
    toml::table parsed = toml::parse("v = " + text);
    into.insert(leaf, *parsed.get("v"));
    origins["model." + key] = "model.init_from (" + from + ")";
  }
}

}  // namespace ablate::config_check
