// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// Reading a Hugging Face transformers checkpoint directory (config.json and model.safetensors, or
// model-*.safetensors with model.safetensors.index.json) of the architectures `ablate export`
// writes: GPT-2 (GPT2LMHeadModel), Llama (LlamaForCausalLM) and Qwen3 (Qwen3ForCausalLM). Used by
// `ablate import hf` and by `[model] init_from` with such a directory.
//
// config.json becomes [model] keys (d_model, n_layers, ..., norm_eps); the weights are mapped onto
// the model's parameter names, the inverse of the export: GPT-2's Conv1D matrices (in x out) are
// transposed and c_attn split into q, k, v; the vocabulary rows fill the first vocab_size rows of
// a padded embedding. Anything ablate cannot compute the same way (another activation, RoPE
// scaling, a head_dim other than hidden/heads, biases on attention but not the MLP) is an input
// error naming config.json and the key; a missing tensor or a tensor of the wrong shape one naming
// the tensor and its file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ablate/runtime/model.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

struct HfCheckpoint {
  std::filesystem::path dir;
  std::string model_type;                                        // "gpt2" | "llama" | "qwen3"
  std::string architecture;                                      // config.json's architectures[0], e.g. "LlamaForCausalLM"
  std::vector<std::pair<std::string, std::string>> model_keys;   // [model] key -> TOML value text
  std::unordered_map<std::string, NamedTensor> tensors;          // by Hugging Face name
  std::unordered_map<std::string, std::filesystem::path> files;  // tensor name -> the file it came from
};

// Whether `dir` is a directory holding a config.json (what tells a Hugging Face checkpoint from an
// ablate run or checkpoint directory).
bool is_hf_checkpoint_dir(const std::filesystem::path& dir);

// Reads config.json and every weight file. Throws ablate::Error (input) naming the file and key or
// tensor for anything missing, malformed or not computable by ablate's model.
HfCheckpoint read_hf_checkpoint(const std::filesystem::path& dir);
// The same without the weights: model_type, architecture and model_keys from config.json alone.
HfCheckpoint read_hf_config(const std::filesystem::path& dir);

// The [model] table for the checkpoint: "[model]\nd_model = 64\n...".
std::string hf_model_toml(const HfCheckpoint& hf);

// One tensor of a Hugging Face checkpoint and the model's parameters it holds: `ours` stacked
// along their first dimension (the first `rows` rows of each where rows >= 0: the vocabulary
// without its padding), transposed where `transpose` (GPT-2's Conv1D matrices). `zeros` > 0: a
// GPT-2 bias, which an export writes as that many zeros where the model has none (bias = false).
struct HfTensor {
  std::string hf;
  std::vector<std::string> ours;
  bool transpose = false;
  int64_t rows = -1;
  int64_t zeros = 0;
};

// The one name table of import and export: the tensors of a "gpt2" (GPT2LMHeadModel, under
// `gpt2_prefix`: "transformer." as transformers saves it, or "" as some checkpoints do) or "llama"
// (LlamaForCausalLM, and Qwen3ForCausalLM with the qk-norm) checkpoint for a model of `o`, in
// the order an export writes them.
std::vector<HfTensor> hf_tensors(const std::string& family, const ModelOptions& o, const std::string& gpt2_prefix = "transformer.");

// Checks that `model` (built from an experiment's [model]) is the checkpoint's: each of the
// checkpoint's [model] keys against the experiment's resolved value; an input error naming the
// key, both values and `init_from` otherwise.
void require_hf_model_matches(const HfCheckpoint& hf, const ModelOptions& options);

// The checkpoint's weights as the model's flat fp32 parameters (ParamTable order; padded
// vocabulary rows zero). Tensors the model does not use beyond the known buffers are warned about.
std::vector<float> hf_parameters(const HfCheckpoint& hf, const Model& model);

}  // namespace ablate
