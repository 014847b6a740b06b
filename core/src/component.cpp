// Kind names, and the out-of-line key functions of every interface (so their type information
// lives in libablate_core and dynamic_cast works across plugin libraries).
#include "ablate/attention.hpp"
#include "ablate/communicator.hpp"
#include "ablate/component.hpp"
#include "ablate/data.hpp"
#include "ablate/evaluator.hpp"
#include "ablate/layer.hpp"
#include "ablate/logger.hpp"
#include "ablate/metrics.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/version.hpp"
#include "ablate/error.hpp"

#include <cstdlib>
#include <sstream>

namespace ablate {

std::string_view to_string(Kind kind) noexcept {
  switch (kind) {
    case Kind::data_source: return "data_source";
    case Kind::sampler: return "sampler";
    case Kind::batcher: return "batcher";
    case Kind::layer: return "layer";
    case Kind::attention: return "attention";
    case Kind::optimizer: return "optimizer";
    case Kind::schedule: return "schedule";
    case Kind::logger: return "logger";
    case Kind::communicator: return "communicator";
    case Kind::device: return "device";
    case Kind::evaluator: return "evaluator";
  }
  return "unknown";
}

std::optional<Kind> kind_from_string(std::string_view name) noexcept {
  for (Kind k : kAllKinds) {
    if (to_string(k) == name) return k;
  }
  return std::nullopt;
}

const char* core_version() noexcept { return ABLATE_VERSION_STRING; }
const char* core_build_fingerprint() noexcept { return ABLATE_BUILD_FINGERPRINT; }

const char* to_string(Split split) noexcept { return split == Split::train ? "train" : "validation"; }

Component::~Component() = default;

bool ComponentInfo::serves(std::string_view device) const {
  if (devices.empty()) return true;
  for (const std::string& d : devices) {
    if (d == device) return true;
  }
  return false;
}
Registrar::~Registrar() = default;
DataSource::~DataSource() = default;
Evaluator::~Evaluator() = default;
EvalModel::~EvalModel() = default;

std::vector<int32_t> DataSource::encode(const std::string& text) const {
  std::vector<int32_t> out;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (end == word.c_str() || *end != '\0' || v < 0 || v >= vocab_size()) {
      throw_input_error("prompt", "'" + word + "' is not a token id below " + std::to_string(vocab_size()) +
                                      " (this data source reads prompts as token ids)");
    }
    out.push_back(int32_t(v));
  }
  return out;
}

std::vector<DocumentGroup> DataSource::groups(Split split) const { return {{"all", 0, size(split)}}; }

std::string DataSource::decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  for (int32_t t : tokens) out += (out.empty() ? "" : " ") + std::to_string(t);
  return out;
}
Sampler::~Sampler() = default;
uint64_t Sampler::global_position(uint64_t, int, int) const {
  throw_runtime_error("sampler", "global_position called on a sampler that is not reshardable()");
}
uint64_t Sampler::document_at_global(uint64_t) {
  throw_runtime_error("sampler", "document_at_global called on a sampler that is not reshardable()");
}
DocumentFeed::~DocumentFeed() = default;
Batcher::~Batcher() = default;
LayerBase::~LayerBase() = default;
Layer::~Layer() = default;
LossLayer::~LossLayer() = default;

const char* to_string(LayerRole role) noexcept {
  switch (role) {
    case LayerRole::embedding: return "embedding";
    case LayerRole::position: return "position";
    case LayerRole::norm: return "norm";
    case LayerRole::linear: return "linear";
    case LayerRole::mlp: return "mlp";
    case LayerRole::classifier: return "classifier";
    case LayerRole::adapter: return "adapter";
  }
  return "unknown";
}

const char* to_string(PositionSite site) noexcept {
  switch (site) {
    case PositionSite::stream: return "stream";
    case PositionSite::qk: return "qk";
  }
  return "unknown";
}
Attention::~Attention() = default;

void check_attention_tensor(const char* where, const char* name, const TensorView& t, const AttentionProblem& p, int64_t heads,
                            DeviceType device) {
  const int64_t want[4] = {p.batch, p.seq_len, heads, p.head_dim};
  bool ok = t.ndim == 4;
  for (int i = 0; ok && i < 4; ++i) ok = t.shape[i] == want[i];
  if (!ok) {
    std::string got = "(";
    for (int i = 0; i < t.ndim; ++i) got += (i ? ", " : "") + std::to_string(t.shape[i]);
    throw_runtime_error(where, std::string(name) + " has shape " + got + "), expected (" + std::to_string(p.batch) + ", " +
                                   std::to_string(p.seq_len) + ", " + std::to_string(heads) + ", " + std::to_string(p.head_dim) + ")");
  }
  const std::string_view n(name);
  const bool is_out = n == "out", is_qkv = n == "q" || n == "k" || n == "v";
  const DType want_dtype = is_out ? p.out_dtype() : is_qkv ? p.qkv_dtype() : p.grad_dtype();
  if (t.dtype != want_dtype) {
    throw_runtime_error(where, std::string(name) + " is " + to_string(t.dtype) + " but the problem's " +
                                   (is_out   ? "out is "
                                    : is_qkv ? "q, k, v are "
                                             : "gradients are ") +
                                   to_string(want_dtype));
  }
  if (t.device != device) {
    throw_runtime_error(where, std::string(name) + " lives on " + to_string(t.device) + "; " + where + " reads " + to_string(device) +
                                   " memory only");
  }
  if (t.data == nullptr && t.numel() > 0) throw_runtime_error(where, std::string(name) + " has no data");
}
namespace {

const AttentionProblem& problem_of(const char* where, const AttentionCall& call) {
  if (call.problem == nullptr || call.batch == nullptr) throw_runtime_error(where, "the call has no problem or no batch");
  return *call.problem;
}

}  // namespace

void check_attention_forward_tensors(const char* where, const AttentionCall& call, DeviceType device) {
  const AttentionProblem& p = problem_of(where, call);
  check_attention_tensor(where, "q", call.q, p, p.heads, device);
  check_attention_tensor(where, "k", call.k, p, p.kv_heads, device);
  check_attention_tensor(where, "v", call.v, p, p.kv_heads, device);
  check_attention_tensor(where, "out", call.out, p, p.heads, device);
}

void check_attention_backward_tensors(const char* where, const AttentionCall& call, DeviceType device) {
  check_attention_forward_tensors(where, call, device);
  const AttentionProblem& p = *call.problem;
  check_attention_tensor(where, "d_out", call.d_out, p, p.heads, device);
  check_attention_tensor(where, "d_q", call.d_q, p, p.heads, device);
  check_attention_tensor(where, "d_k", call.d_k, p, p.kv_heads, device);
  check_attention_tensor(where, "d_v", call.d_v, p, p.kv_heads, device);
}

Optimizer::~Optimizer() = default;
Logger::~Logger() = default;
Communicator::~Communicator() = default;

const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> names = {"step",
                                                 "loss",
                                                 "lr",
                                                 "grad_norm",
                                                 "step_ms",
                                                 "tokens",
                                                 "real_tokens",
                                                 "padding_fraction",
                                                 "tokens_per_s",
                                                 "real_tokens_per_s",
                                                 "tflops",
                                                 "mfu",
                                                 "effective_mfu",
                                                 "data_wait_pct",
                                                 "mem_peak_bytes",
                                                 "optimizer_state_bytes"};
  return names;
}

bool metric_is_count(std::string_view name) noexcept {
  return name == "step" || name == "tokens" || name == "real_tokens" || name == "mem_peak_bytes" || name == "optimizer_state_bytes";
}

std::vector<std::pair<std::string, double>> metric_values(const StepMetrics& m) {
  const double fixed[] = {double(m.step),
                          m.loss,
                          m.lr,
                          m.grad_norm,
                          m.step_ms,
                          double(m.tokens),
                          double(m.real_tokens),
                          m.padding_fraction,
                          m.tokens_per_s,
                          m.real_tokens_per_s,
                          m.tflops,
                          m.mfu,
                          m.effective_mfu,
                          m.data_wait_pct,
                          double(m.mem_peak_bytes),
                          double(m.optimizer_state_bytes)};
  const std::vector<std::string>& names = metric_names();
  std::vector<std::pair<std::string, double>> out;
  out.reserve(names.size() + m.extra.size());
  for (std::size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], fixed[i]);
  for (const auto& e : m.extra) out.push_back(e);
  return out;
}

double peak_tflops_for_device(std::string_view name, std::string_view dtype) noexcept {
  // Dense (no sparsity) figures from the vendors' data sheets: bf16/fp16 and tf32.
  struct Row {
    const char* needle;  // all of these words must appear, in order of specificity
    const char* also;
    double bf16, tf32;
  };
  static const Row rows[] = {
      {"H200", "", 989.4, 494.7},   {"H100", "PCIe", 756.5, 378.0}, {"H100", "NVL", 835.0, 417.5}, {"H100", "", 989.4, 494.7},
      {"GH200", "", 989.4, 494.7},  {"H800", "PCIe", 756.5, 378.0}, {"H800", "", 989.4, 494.7},    {"B200", "", 2250.0, 1100.0},
      {"A100", "", 312.0, 156.0},   {"A800", "", 312.0, 156.0},     {"A10G", "", 70.0, 35.0},      {"A10", "", 125.0, 62.5},
      {"L40S", "", 362.0, 183.0},   {"L40", "", 181.0, 90.5},       {"L4", "", 121.0, 60.0},       {"RTX 4090", "", 165.2, 82.6},
      {"RTX 3090", "", 71.0, 35.6}, {"V100", "", 125.0, 15.7},      {"T4", "", 65.0, 8.1},
  };
  auto has = [&](const char* w) { return *w == 0 || name.find(w) != std::string_view::npos; };
  // An emulated device ("... (emulated on the CPU)"): its figures are never a GPU's (Device::peak_tflops).
  if (has("emulated")) return -1.0;
  const bool half = dtype == "bf16" || dtype == "fp16";
  for (const Row& r : rows) {
    if (has(r.needle) && has(r.also)) return half ? r.bf16 : r.tf32;
  }
  return 0.0;
}

double model_flops_per_token(int64_t parameters, int64_t layers, int64_t d_model, int64_t seq_len) noexcept {
  return 6.0 * double(parameters) + 6.0 * double(layers) * double(d_model) * double(seq_len);
}

}  // namespace ablate
