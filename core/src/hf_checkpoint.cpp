// Hugging Face checkpoints read into ablate's model (see hf_checkpoint.hpp).
#include "ablate/runtime/hf_checkpoint.hpp"

#include <cmath>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/safetensors.hpp"

namespace ablate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::uintmax_t kMaxHfJsonBytes = std::uintmax_t(64) << 20;  // config.json, the shard index

json read_json(const fs::path& file, const char* what) {
  const std::string text = read_json_text(file, what, kMaxHfJsonBytes);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw_input_error(file.string(), std::string("is not a JSON object (") + what + ")");
  return j;
}

// config.json's keys, typed; each error names the file and the key.
struct ConfigReader {
  const json& j;
  std::string file;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  int64_t count(const char* key) const {
    if (!has(key)) throw_input_error(file, std::string("no '") + key + "' (a whole number) in this checkpoint's config");
    return count_value(key);
  }
  int64_t count_or(const char* key, int64_t def) const { return has(key) ? count_value(key) : def; }
  int64_t count_value(const char* key) const {
    const json& v = j.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      throw_input_error(file, std::string("'") + key + "' is " + echo_value(v.dump()) + ", expected a whole number >= 1");
    }
    return v.get<int64_t>();
  }
  double number_or(const char* key, double def) const {
    if (!has(key)) return def;
    if (!j.at(key).is_number())
      throw_input_error(file, std::string("'") + key + "' is " + echo_value(j.at(key).dump()) + ", expected a number");
    return j.at(key).get<double>();
  }
  bool flag_or(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j.at(key).is_boolean())
      throw_input_error(file, std::string("'") + key + "' is " + echo_value(j.at(key).dump()) + ", expected true or false");
    return j.at(key).get<bool>();
  }
  std::string text_or(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j.at(key).is_string())
      throw_input_error(file, std::string("'") + key + "' is " + echo_value(j.at(key).dump()) + ", expected a string");
    return j.at(key).get<std::string>();
  }
  // A key ablate's model has no equivalent for: refused unless absent or at the value it computes.
  void require(const char* key, const json& computable, const std::string& why) const {
    if (has(key) && j.at(key) != computable) {
      throw_input_error(file, std::string("'") + key + "' is " + echo_value(j.at(key).dump()) + ": " + why);
    }
  }
};

std::string toml_number(double v) {  // the shortest text that reads back as v
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string t(buf, r.ptr);
  if (t.find_first_of(".eE") == std::string::npos) t += ".0";
  return t;
}

using Keys = std::vector<std::pair<std::string, std::string>>;

Keys gpt2_keys(const ConfigReader& c) {
  const int64_t d = c.count("n_embd");
  const std::string act = c.text_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    throw_input_error(c.file, "'activation_function' is \"" + echo_value(act) +
                                  "\": ablate's gelu_mlp computes the tanh approximation (gelu_new, gelu_pytorch_tanh)");
  }
  c.require("scale_attn_weights", true, "ablate scales attention scores by 1/sqrt(head_dim)");
  c.require("scale_attn_by_inverse_layer_idx", false, "ablate does not scale attention by the layer index");
  c.require("reorder_and_upcast_attn", false, "ablate computes attention in one order");
  return {{"d_model", std::to_string(d)},
          {"n_layers", std::to_string(c.count("n_layer"))},
          {"n_heads", std::to_string(c.count("n_head"))},
          {"n_kv_heads", "0"},
          {"vocab_size", std::to_string(c.count("vocab_size"))},
          {"max_seq_len", std::to_string(c.count("n_positions"))},
          {"mlp_hidden", std::to_string(c.count_or("n_inner", 4 * d))},
          {"norm", "\"layernorm\""},
          {"mlp", "\"gelu_mlp\""},
          {"position", "\"learned\""},
          {"qk_norm", "false"},
          {"bias", "true"},
          {"tie_embeddings", c.flag_or("tie_word_embeddings", true) ? "true" : "false"},
          {"norm_eps", toml_number(c.number_or("layer_norm_epsilon", 1e-5))}};
}

Keys llama_keys(const ConfigReader& c, bool qwen3) {
  const int64_t d = c.count("hidden_size"), heads = c.count("num_attention_heads");
  if (c.has("head_dim") && c.count("head_dim") * heads != d) {
    throw_input_error(c.file, "'head_dim' is " + std::to_string(c.count("head_dim")) + " with " + std::to_string(heads) +
                                  " heads and hidden_size " + std::to_string(d) + ": ablate's heads are hidden_size / heads wide");
  }
  if (c.text_or("hidden_act", "silu") != "silu") {
    throw_input_error(c.file, "'hidden_act' is \"" + echo_value(c.text_or("hidden_act", "")) + "\": ablate's swiglu_mlp uses silu");
  }
  c.require("rope_scaling", nullptr, "ablate's RoPE has no scaling");
  c.require("use_sliding_window", false, "ablate's attention is causal over the whole sequence");
  const bool attn_bias = c.flag_or("attention_bias", false), mlp_bias = c.flag_or("mlp_bias", false);
  if (attn_bias != mlp_bias) {
    throw_input_error(c.file, "'attention_bias' is " + std::string(attn_bias ? "true" : "false") + " and 'mlp_bias' " +
                                  (mlp_bias ? "true" : "false") + ": ablate's model.bias sets both");
  }
  return {{"d_model", std::to_string(d)},
          {"n_layers", std::to_string(c.count("num_hidden_layers"))},
          {"n_heads", std::to_string(heads)},
          {"n_kv_heads", std::to_string(c.count_or("num_key_value_heads", heads))},
          {"vocab_size", std::to_string(c.count("vocab_size"))},
          {"max_seq_len", std::to_string(c.count("max_position_embeddings"))},
          {"mlp_hidden", std::to_string(c.count("intermediate_size"))},
          {"norm", "\"rmsnorm\""},
          {"mlp", "\"swiglu_mlp\""},
          {"position", "\"rope\""},
          {"rope.theta", toml_number(c.number_or("rope_theta", 10000.0))},  // [model.rope] theta
          {"qk_norm", qwen3 ? "true" : "false"},
          {"bias", attn_bias ? "true" : "false"},
          {"tie_embeddings", c.flag_or("tie_word_embeddings", false) ? "true" : "false"},
          {"norm_eps", toml_number(c.number_or("rms_norm_eps", 1e-6))}};
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(float(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(float(mant | 0x400), int(exp) - 25);
  return sign ? -v : v;
}

// A tensor's values as fp32 (F32, F16 and BF16 checkpoints; both widen exactly).
std::vector<float> as_float(const NamedTensor& t, const fs::path& file) {
  const std::size_t n = t.bytes.size() / dtype_size(t.dtype);
  std::vector<float> out(n);
  if (t.dtype == DType::f32) {
    std::memcpy(out.data(), t.bytes.data(), n * 4);
  } else if (t.dtype == DType::bf16 || t.dtype == DType::f16) {
    for (std::size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      out[i] = t.dtype == DType::bf16 ? device_math::bf16_value(h) : half_to_float(h);
    }
  } else {
    throw_input_error(file.string(), "tensor '" + t.name + "' is " + to_string(t.dtype) + "; expected F32, F16 or BF16 weights");
  }
  return out;
}

void add_file(HfCheckpoint& hf, const fs::path& file) {
  SafetensorsFile f = read_safetensors(file);
  for (NamedTensor& t : f.tensors) {
    if (hf.tensors.count(t.name) > 0)
      throw_input_error(file.string(), "tensor '" + t.name + "' is also in " + hf.files[t.name].string());
    hf.files[t.name] = file;
    const std::string name = t.name;
    hf.tensors.emplace(name, std::move(t));
  }
}

void read_weights(HfCheckpoint& hf) {
  const fs::path single = hf.dir / "model.safetensors", index = hf.dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    add_file(hf, single);
    return;
  }
  if (!fs::exists(index)) {
    const bool bin = fs::exists(hf.dir / "pytorch_model.bin");
    throw_input_error(hf.dir.string(), std::string("holds neither model.safetensors nor model.safetensors.index.json") +
                                           (bin ? " (only pytorch_model.bin: save it with safe_serialization=True)" : ""));
  }
  const json j = read_json(index, "the safetensors shard index");
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw_input_error(index.string(), "has no 'weight_map' object");
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || fs::path(file.get<std::string>()).filename() != fs::path(file.get<std::string>())) {
      throw_input_error(index.string(),
                        "weight_map['" + echo_value(name) + "'] is " + echo_value(file.dump()) + ", expected a file name beside it");
    }
    shards.insert(file.get<std::string>());
  }
  for (const std::string& s : shards) add_file(hf, hf.dir / s);
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (hf.tensors.count(name) == 0 || hf.files.at(name).filename() != file.get<std::string>()) {
      throw_input_error(index.string(),
                        "names tensor '" + echo_value(name) + "' in " + file.get<std::string>() + ", which does not hold it");
    }
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s.empty() ? "scalar" : s;
}

// Fills model parameters from checkpoint tensors: the inverse of the export's layout rules.
struct Importer {
  const HfCheckpoint& hf;
  const Model& model;
  std::vector<float> values;
  std::set<std::string> used, filled;

  const ParamSlice& slice(const std::string& name) const {
    const ParamSlice* s = model.table().find(name);
    if (s == nullptr) throw_runtime_error("import", "the model has no parameter '" + name + "'");
    return *s;
  }
  bool has(const std::string& name) const { return model.table().find(name) != nullptr; }

  const NamedTensor& tensor(const std::string& name) {
    const auto it = hf.tensors.find(name);
    if (it == hf.tensors.end()) {
      throw_input_error(hf.dir.string(),
                        "the checkpoint has no tensor '" + name + "' (a " + hf.model_type + " checkpoint of this config needs it)");
    }
    used.insert(name);
    return it->second;
  }

  // `ours` stacked along their first dimension (only the first `rows` rows of each when given) is
  // the checkpoint's `name`, transposed when `transpose` (GPT-2's Conv1D).
  void take(const std::string& name, const std::vector<std::string>& ours, bool transpose = false, int64_t rows = -1) {
    const NamedTensor& t = tensor(name);
    const fs::path& file = hf.files.at(name);
    const bool vector = slice(ours[0]).shape.size() == 1;
    int64_t total = 0, cols = 1;
    for (const std::string& o : ours) {
      const ParamSlice& s = slice(o);
      total += rows >= 0 ? rows : s.shape[0];
      cols = s.shape.size() == 2 ? s.shape[1] : 1;
    }
    const std::vector<int64_t> want = vector      ? std::vector<int64_t>{total}
                                      : transpose ? std::vector<int64_t>{cols, total}
                                                  : std::vector<int64_t>{total, cols};
    if (t.shape != want) {
      throw_input_error(file.string(),
                        "tensor '" + name + "' is " + shape_text(t.shape) + ", the config's model needs " + shape_text(want));
    }
    const std::vector<float> v = as_float(t, file);
    int64_t row0 = 0;
    for (const std::string& o : ours) {
      const ParamSlice& s = slice(o);
      const int64_t r = rows >= 0 ? rows : s.shape[0];
      float* dst = values.data() + s.offset;
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < cols; ++j)
          dst[i * cols + j] = transpose ? v[std::size_t(j * total + row0 + i)] : v[std::size_t((row0 + i) * cols + j)];
      }
      row0 += r;
      filled.insert(o);
    }
  }
  // Every tensor of the shared name table, then the checkpoint's buffers that are no weights.
  void fill(const std::string& family, const ModelOptions& o) {
    const std::string p = family == "gpt2" && hf.tensors.count("transformer.wte.weight") == 0 ? "" : "transformer.";
    for (const HfTensor& t : hf_tensors(family, o, p)) take(t.hf, t.ours, t.transpose, t.rows);
    for (int64_t l = 0; l < o.n_layers; ++l) {
      const std::string gpt2 = p + "h." + std::to_string(l), llama = "model.layers." + std::to_string(l);
      for (const std::string& buffer : {gpt2 + ".attn.bias", gpt2 + ".attn.masked_bias", llama + ".self_attn.rotary_emb.inv_freq"}) {
        if (hf.tensors.count(buffer) > 0) used.insert(buffer);  // the causal mask and RoPE's frequencies, not weights
      }
    }
    if (o.tie_embeddings && hf.tensors.count("lm_head.weight") > 0) used.insert("lm_head.weight");  // tied: the embedding again
  }
};

}  // namespace

std::vector<HfTensor> hf_tensors(const std::string& family, const ModelOptions& o, const std::string& gpt2_prefix) {
  std::vector<HfTensor> t;
  const int64_t V = o.vocab_size, C = o.d_model;
  const auto add = [&](std::string hf, std::vector<std::string> ours, bool transpose = false, int64_t rows = -1, int64_t zeros = 0) {
    t.push_back({std::move(hf), std::move(ours), transpose, rows, zeros});
  };
  if (family == "gpt2") {
    const std::string& p = gpt2_prefix;
    add(p + "wte.weight", {"wte.weight"}, false, V);
    add(p + "wpe.weight", {"wpe.weight"});
    for (int64_t l = 0; l < o.n_layers; ++l) {
      const std::string b = "blocks." + std::to_string(l), h = p + "h." + std::to_string(l);
      add(h + ".ln_1.weight", {b + ".ln1.weight"});
      add(h + ".ln_1.bias", {b + ".ln1.bias"}, false, -1, C);
      add(h + ".attn.c_attn.weight", {b + ".attn.q.weight", b + ".attn.k.weight", b + ".attn.v.weight"}, true);
      add(h + ".attn.c_attn.bias", {b + ".attn.q.bias", b + ".attn.k.bias", b + ".attn.v.bias"}, false, -1, 3 * C);
      add(h + ".attn.c_proj.weight", {b + ".attn.o.weight"}, true);
      add(h + ".attn.c_proj.bias", {b + ".attn.o.bias"}, false, -1, C);
      add(h + ".ln_2.weight", {b + ".ln2.weight"});
      add(h + ".ln_2.bias", {b + ".ln2.bias"}, false, -1, C);
      add(h + ".mlp.c_fc.weight", {b + ".mlp.fc.weight"}, true);
      add(h + ".mlp.c_fc.bias", {b + ".mlp.fc.bias"}, false, -1, o.mlp_hidden);
      add(h + ".mlp.c_proj.weight", {b + ".mlp.proj.weight"}, true);
      add(h + ".mlp.c_proj.bias", {b + ".mlp.proj.bias"}, false, -1, C);
    }
    add(p + "ln_f.weight", {"ln_f.weight"});
    add(p + "ln_f.bias", {"ln_f.bias"}, false, -1, C);
  } else {
    add("model.embed_tokens.weight", {"wte.weight"}, false, V);
    for (int64_t l = 0; l < o.n_layers; ++l) {
      const std::string b = "blocks." + std::to_string(l), h = "model.layers." + std::to_string(l);
      add(h + ".input_layernorm.weight", {b + ".ln1.weight"});
      for (const std::string n : {"q", "k", "v", "o"}) {
        add(h + ".self_attn." + n + "_proj.weight", {b + ".attn." + n + ".weight"});
        if (o.bias) add(h + ".self_attn." + n + "_proj.bias", {b + ".attn." + n + ".bias"});
      }
      if (o.qk_norm) {
        add(h + ".self_attn.q_norm.weight", {b + ".attn.q_norm.weight"});
        add(h + ".self_attn.k_norm.weight", {b + ".attn.k_norm.weight"});
      }
      add(h + ".post_attention_layernorm.weight", {b + ".ln2.weight"});
      for (const std::string n : {"gate", "up", "down"}) {
        add(h + ".mlp." + n + "_proj.weight", {b + ".mlp." + n + ".weight"});
        if (o.bias) add(h + ".mlp." + n + "_proj.bias", {b + ".mlp." + n + ".bias"});
      }
    }
    add("model.norm.weight", {"ln_f.weight"});
  }
  if (!o.tie_embeddings) add("lm_head.weight", {"lm_head.weight"}, false, V);
  return t;
}

bool is_hf_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / "config.json", ec);
}

HfCheckpoint read_hf_checkpoint(const fs::path& dir) {
  HfCheckpoint hf = read_hf_config(dir);
  read_weights(hf);
  return hf;
}

HfCheckpoint read_hf_config(const fs::path& dir) {
  HfCheckpoint hf;
  hf.dir = dir;
  const fs::path cfg = dir / "config.json";
  if (!is_hf_checkpoint_dir(dir)) throw_input_error(dir.string(), "is not a Hugging Face checkpoint directory (no config.json in it)");
  const json j = read_json(cfg, "a Hugging Face model config");
  const ConfigReader c{j, cfg.string()};
  hf.model_type = c.text_or("model_type", "");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    hf.architecture = j["architectures"][0].get<std::string>();
  }
  if (hf.model_type == "gpt2") hf.model_keys = gpt2_keys(c);
  else if (hf.model_type == "llama" || hf.model_type == "qwen3") hf.model_keys = llama_keys(c, hf.model_type == "qwen3");
  else {
    throw_input_error(cfg.string(), "'model_type' is \"" + echo_value(hf.model_type) +
                                        "\"; ablate reads gpt2, llama and qwen3 checkpoints (the architectures it exports)");
  }
  return hf;
}

std::string hf_model_toml(const HfCheckpoint& hf) {
  std::string t = "[model]\n";
  for (const auto& [k, v] : hf.model_keys) t += k + " = " + v + "\n";
  return t;
}

void require_hf_model_matches(const HfCheckpoint& hf, const ModelOptions& o) {
  const auto text = [&](const std::string& key) -> std::string {
    if (key == "d_model") return std::to_string(o.d_model);
    if (key == "n_layers") return std::to_string(o.n_layers);
    if (key == "n_heads") return std::to_string(o.n_heads);
    if (key == "n_kv_heads") return std::to_string(o.n_kv_heads);
    if (key == "vocab_size") return std::to_string(o.vocab_size);
    if (key == "max_seq_len") return std::to_string(o.max_seq_len);
    if (key == "mlp_hidden") return std::to_string(o.mlp_hidden);
    if (key == "norm") return "\"" + o.norm + "\"";
    if (key == "mlp") return "\"" + o.mlp + "\"";
    if (key == "position") return "\"" + o.position + "\"";
    if (key == "qk_norm") return o.qk_norm ? "true" : "false";
    if (key == "bias") return o.bias ? "true" : "false";
    if (key == "tie_embeddings") return o.tie_embeddings ? "true" : "false";
    if (key == "norm_eps") return toml_number(o.norm_epsilon());
    // "layer.key": a chosen layer's own key ([model.<layer>]).
    if (const std::size_t dot = key.find('.'); dot != std::string::npos) {
      const auto own = o.layer_own.find(key.substr(0, dot));
      if (own == o.layer_own.end() || !own->second.has(key.substr(dot + 1))) return "(not set)";
      const Value& v = own->second.values().find(key.substr(dot + 1))->second;
      return std::holds_alternative<double>(v) ? toml_number(std::get<double>(v)) : format_value(v);
    }
    return "?";
  };
  for (const auto& [key, want] : hf.model_keys) {
    std::string have = text(key);
    std::string expect = want;
    if (key == "n_kv_heads" && want == "0") expect = std::to_string(o.n_heads);
    if (have != expect) {
      throw_input_error("model." + key, "is " + have + " in this experiment, but model.init_from names a " + hf.model_type +
                                            " checkpoint (" + hf.dir.string() + ") with " + key + " = " + expect +
                                            ": set it so, or leave it out of [model] to take the checkpoint's");
    }
  }
}

std::vector<float> hf_parameters(const HfCheckpoint& hf, const Model& model) {
  Importer im{hf, model, std::vector<float>(std::size_t(model.num_params()), 0.0f), {}, {}};
  im.fill(hf.model_type == "gpt2" ? "gpt2" : "llama", model.options());
  const int64_t base_end = model.frozen_params() > 0 ? model.frozen_params() : model.num_params();
  for (const ParamSlice& s : model.table().slices) {
    if (s.offset >= base_end) continue;  // an adapter's: not in a base checkpoint
    if (im.filled.count(s.name) == 0) {
      throw_input_error(hf.dir.string(), "nothing in the checkpoint fills the model's parameter '" + s.name +
                                             "': the experiment's [model] is not the checkpoint's");
    }
  }
  std::vector<std::string> unused;
  for (const auto& [name, t] : hf.tensors) {
    if (im.used.count(name) == 0) unused.push_back(name);
  }
  if (!unused.empty()) {
    std::sort(unused.begin(), unused.end());
    spdlog::warn("{}: {} tensor(s) of the checkpoint are not used by the model: {}", hf.dir.string(), unused.size(),
                 echo_value(join(unused), 400));
  }
  return std::move(im.values);
}

}  // namespace ablate
