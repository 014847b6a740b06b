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
constexpr const char* kShapeKeys[] = {"d_model",    "n_layers", "n_heads",  "n_kv_heads", "vocab_size", "vocab_multiple",
                                      "max_seq_len", "norm",     "mlp",      "mlp_hidden", "position",   "rope_theta",
                                      "qk_norm",    "bias",     "tie_embeddings", "norm_eps", "embedding_layer",
                                      "projection_layer", "classifier_layer", "qk_norm_layer"};

using Keys = std::vector<std::pair<std::string, std::string>>;  // key, its value as TOML text

Keys ablate_checkpoint_shape(const fs::path& from) {
  const fs::path cfg = resolve_checkpoint(from) / "config.toml";
  const std::string text = read_regular_file(cfg, "checkpoint config", kMaxExperimentBytes);
  toml::table t;
  try {
    t = toml::parse(text, cfg.string());
  } catch (const toml::parse_error& e) {
    throw_input_error(cfg.string() + ":" + std::to_string(e.source().begin.line), "TOML syntax error: " + std::string(e.description()));
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
  return out;
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
    if (model->contains(key)) continue;  // the experiment's (or --set's) value
    toml::table parsed = toml::parse("v = " + text);
    model->insert(key, *parsed.get("v"));
    origins["model." + key] = "model.init_from (" + from + ")";
  }
}

}  // namespace ablate::config_check
