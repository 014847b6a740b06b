// Component kinds, the common base of every component, the registration record a plugin hands to
// core, and what a factory receives when the experiment asks for an implementation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ablate/schema.hpp"

namespace ablate {

enum class Kind { data_source, sampler, batcher, layer, attention, optimizer, schedule, logger, communicator, device, evaluator };

inline constexpr Kind kAllKinds[] = {Kind::data_source,  Kind::sampler,   Kind::batcher,  Kind::layer,
                                     Kind::attention,    Kind::optimizer, Kind::schedule, Kind::logger,
                                     Kind::communicator, Kind::device,    Kind::evaluator};

std::string_view to_string(Kind kind) noexcept;  // "data_source", "batcher", ...
std::optional<Kind> kind_from_string(std::string_view name) noexcept;

// Every interface (DataSource, Batcher, ...) derives from this. Its key function is out of line in
// core, so its type information lives in libablate_core and dynamic_cast works across plugins.
class Component {
 public:
  virtual ~Component();
};

// Facts about the run a component may need at construction.
struct RunContext {
  uint64_t seed = 0;
  int rank = 0;
  int world = 1;
  std::string device = "cpu";  // "cpu" | "cuda"
  std::string dtype = "fp32";  // [run] dtype: "fp32" | "tf32" | "bf16" | "fp8" | "fp8_e4m3" (config reference)
  // FP8 products' scales ([run] fp8_scaling, fp8_amax_history, fp8_amax_reduction): "current" (each
  // operand's own amax) or "delayed" (the max, or most recent, of an amax history of this length).
  std::string fp8_scaling = "current";
  int64_t fp8_amax_history = 16;
  std::string fp8_amax_reduction = "max";
  // [run] residual_dtype: "fp32" | "bf16" (the residual stream held in bf16; run.dtype bf16 or FP8 only).
  std::string residual_dtype = "fp32";
  int threads = 0;
};

// run.dtype's modes whose products read bf16 operands and whose model holds the activations only
// products read in bf16: "bf16", and the FP8 ones, which quantise those bf16 values (and the f32
// ones) to FP8 just before each linear or MLP product.
inline bool holds_bf16(std::string_view dtype) { return dtype == "bf16" || dtype == "fp8" || dtype == "fp8_e4m3"; }
// run.dtype's FP8 modes: "fp8" (E4M3 weights and activations, E5M2 gradients) and "fp8_e4m3".
inline bool fp8_dtype(std::string_view dtype) { return dtype == "fp8" || dtype == "fp8_e4m3"; }

// What a factory receives: the keys common to its kind (e.g. batch_size, seq_len for every
// batcher), its own sub-table (e.g. [batching.packed]), and the run facts.
struct ComponentArgs {
  const Params& common;
  const Params& own;
  const RunContext& run;
};

using Factory = std::function<std::unique_ptr<Component>(const ComponentArgs&)>;

struct ComponentInfo {
  Kind kind = Kind::data_source;
  std::string name;
  std::string version;
  std::string doc;  // one line
  Schema schema;    // the keys of its own sub-table
  Factory factory;
  std::string library;  // filled in by the registry: the plugin file it came from
  // The devices ([run] device) this registration serves; empty = every device (data pipeline,
  // loggers). One name may have one registration per device: `layernorm` for "cpu" in one plugin
  // and for "cuda" in another, and the registry picks the one for the run's device.
  std::vector<std::string> devices;
  bool serves(std::string_view device) const;
};

// Handed to a plugin's register function; the plugin adds each component it implements.
class Registrar {
 public:
  virtual ~Registrar();
  virtual void add(ComponentInfo info) = 0;
  // The component (kind, name) shares the keys of `family`, another registration of its kind: the
  // family's keys live in that one's table ([optimizer.adamw] for adamw8bit), and a member's `own`
  // holds them with its own table's (which declares only what the family has not). So a family's
  // members read one table, and an experiment moving between them keeps its values.
  virtual void share_keys(Kind kind, const std::string& name, const std::string& family) = 0;
};

}  // namespace ablate
