// Kind names, and the out-of-line key functions of every interface (so their type information
// lives in libablate_core and dynamic_cast works across plugin libraries).
#include "ablate/attention.hpp"
#include "ablate/communicator.hpp"
#include "ablate/component.hpp"
#include "ablate/data.hpp"
#include "ablate/layer.hpp"
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
    case Kind::logger: return "logger";
    case Kind::communicator: return "communicator";
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
Registrar::~Registrar() = default;
DataSource::~DataSource() = default;

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

std::string DataSource::decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  for (int32_t t : tokens) out += (out.empty() ? "" : " ") + std::to_string(t);
  return out;
}
Sampler::~Sampler() = default;
DocumentFeed::~DocumentFeed() = default;
Batcher::~Batcher() = default;
Layer::~Layer() = default;

const char* to_string(LayerRole role) noexcept {
  switch (role) {
    case LayerRole::embedding: return "embedding";
    case LayerRole::position: return "position";
    case LayerRole::norm: return "norm";
    case LayerRole::linear: return "linear";
    case LayerRole::mlp: return "mlp";
    case LayerRole::classifier: return "classifier";
  }
  return "unknown";
}
Attention::~Attention() = default;
Optimizer::~Optimizer() = default;
Logger::~Logger() = default;
Communicator::~Communicator() = default;

double model_flops_per_token(int64_t parameters, int64_t layers, int64_t d_model, int64_t seq_len) noexcept {
  return 6.0 * double(parameters) + 6.0 * double(layers) * double(d_model) * double(seq_len);
}

}  // namespace ablate
