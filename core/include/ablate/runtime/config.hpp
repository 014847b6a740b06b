// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// Experiment configuration: a TOML file (TOML++) plus `--set section.key=value` overrides,
// validated against the schemas of core's sections and of the selected plugins, with every default
// filled in. Errors name the file, line and column (or the --set that caused them), the full key
// path, what was expected, and a did-you-mean suggestion; they are ablate::Error of kind input.
//
// A component section selects its implementation with a selector key (`name`, or `sinks` for
// [logging], `communicator` for [run]) and keeps each implementation's own keys in a sub-table
// named after it. Every sub-table present is validated; only the selected one is used.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/schema.hpp"

namespace ablate {

class Registry;

struct SectionSpec {
  std::string name;  // "batching"
  std::string doc;
  Schema keys;                    // keys owned by core (for component sections: common to the kind)
  std::optional<Kind> kind;       // component kind whose implementations have sub-tables here
  std::string selector;           // key naming the implementation(s): "name", "sinks", "communicator"
  bool selector_is_list = false;  // sinks = ["console", "jsonl"]
  std::string default_selection;  // "" = no default: the section must name one when present
  // [model]: the keys naming layer components (norm, mlp, position); each chosen layer's own keys
  // live in [model.<layer name>], checked against that layer's schema.
  std::vector<std::string> layer_keys = {};
};

// 64-bit FNV-1a of `text`: what Config::hash() prints in hex.
uint64_t fnv1a(std::string_view text) noexcept;

// [run] communicator = "auto": the trainer picks mpi or nccl when a launcher started several ranks,
// else single (see trainer.hpp, resolve_communicator).
inline constexpr const char* kAutoCommunicator = "auto";

// The positions of one micro-batch (batch_size x seq_len, or eval's rows x window) are indexed with
// 32 bits: a product past this is refused before anything is sized.
inline constexpr int64_t kMaxBatchPositions = 2147483647;

// Core's sections, in the order they are documented and printed.
const std::vector<SectionSpec>& section_specs();
const SectionSpec* find_section_spec(std::string_view name);
// The keys every [[eval]] table has (name, label, every, enabled); the rest are its evaluator's.
const Schema& eval_entry_keys();

class Config {
 public:
  // Parses `file`, applies `overrides` ("section.key=value" or "section.impl.key=value"), loads the
  // plugin directories of [plugins] paths (relative to the file) into `registry`, validates, and
  // fills defaults. Throws ablate::Error (input) on any problem.
  static Config load(const std::filesystem::path& file, const std::vector<std::string>& overrides, Registry& registry);
  // The same from text; `source_name` is what error messages call it.
  static Config parse(std::string_view text, const std::string& source_name, const std::vector<std::string>& overrides,
                      Registry& registry, const std::filesystem::path& base_dir = {});

  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;
  ~Config();

  // The resolved configuration as TOML (every section, every default), parseable back to the same.
  std::string to_toml() const;
  // FNV-1a of to_toml(), hex: checkpoints record it.
  std::string hash() const;
  const std::string& source() const noexcept;

  bool has_section(std::string_view section) const;
  // A section's core keys, selector included.
  Params section(std::string_view section) const;
  // The selected implementation (or the first of a list selector) and the sub-tables.
  std::string selected(std::string_view section) const;
  std::vector<std::string> selected_list(std::string_view section) const;
  Params implementation(std::string_view section, std::string_view impl) const;
  // The implementations with a resolved sub-table in `section`, by name.
  std::vector<std::string> implementations(std::string_view section) const;
  // Whether `impl` has a resolved sub-table in `section` (chosen, or given by the experiment).
  bool has_implementation(std::string_view section, std::string_view impl) const;
  // The [[eval]] tables in order: their common keys (eval_entry_keys(), label resolved) and their
  // evaluator's own keys, each with the path "eval.<label>".
  struct EvalEntry {
    Params common;
    Params own;
  };
  std::vector<EvalEntry> evals() const;

 private:
  Config();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ablate
