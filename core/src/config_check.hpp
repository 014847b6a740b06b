// Checking an experiment file against the schemas (config_check.cpp): each value against its spec,
// each table against its schema, each section with its selected implementations and sub-tables,
// the [[eval]] tables; and --set overrides typed by the same specs (config_override.cpp). Every
// failure is an input error naming the file, line and column (or the --set) and the key.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "ablate/runtime/config.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate::config_check {

struct ResolvedEval {
  std::string label;
  std::map<std::string, Value, std::less<>> common, own;
};

struct ResolvedSection {
  std::map<std::string, Value, std::less<>> keys;
  std::map<std::string, std::map<std::string, Value, std::less<>>, std::less<>> impls;
  std::set<std::string, std::less<>> written;                 // implementations whose sub-table the experiment gave
  std::map<std::string, std::string, std::less<>> family_of;  // implementation -> the one whose keys it shares
};

// The kind whose registrations' keys a section's sub-tables hold: the section's own kind, or for
// [model] the layers its keys name.
std::optional<Kind> sub_table_kind(const SectionSpec& spec);
// The label of an [[eval]] table as written (its `label`, else its `name`), "" when neither is a string.
std::string written_eval_label(const toml::table& entry);
const ParamSpec* find_param(const Schema& schema, std::string_view key);
std::vector<std::string> schema_names(const Schema& schema);
std::vector<std::string> section_names();
std::string node_type_name(const toml::node& n);
std::string node_text(const toml::node& n);

class Validator {
 public:
  Validator(std::string source, Registry& registry, const std::map<std::string, std::string>& origins)
      : source_(std::move(source)), registry_(registry), origins_(origins) {}

  std::string where(const toml::source_region& region, const std::string& path) const {
    auto it = origins_.find(path);
    if (it != origins_.end()) return it->second;
    if (region.begin.line == 0) return source_;
    return source_ + ":" + std::to_string(region.begin.line) + ":" + std::to_string(region.begin.column);
  }

  [[noreturn]] void fail(const toml::source_region& region, const std::string& path, const std::string& msg) const {
    throw_input_error(where(region, path), path.empty() ? msg : path + ": " + msg);
  }

  // One value against its spec: the type, the range or choices; a path made absolute.
  Value check(const toml::node& node, const ParamSpec& spec, const std::string& path) const;
  // Validates one table against a schema; unknown keys are errors with suggestions.
  std::map<std::string, Value, std::less<>> check_table(const toml::table& table, const Schema& schema, const std::string& path,
                                                        const std::string& hint_impl, const Schema* hint_schema,
                                                        bool skip_tables = false) const;
  // A section: core's keys, the selected implementation(s) against the registry, every sub-table.
  ResolvedSection check_section(const SectionSpec& spec, const toml::table* table) const;
  const Registry& registry() const noexcept { return registry_; }

 private:
  void check_sub_tables(const SectionSpec& spec, const toml::table* table, ResolvedSection& res) const;
  void resolve_families(const SectionSpec& spec, const toml::table* table, ResolvedSection& res) const;

  std::string source_;
  Registry& registry_;
  const std::map<std::string, std::string>& origins_;
};

// The [[eval]] tables: each names a registered evaluator, has a label no other has, and its other
// keys are the evaluator's (checked against its schema, defaults filled in).
std::vector<ResolvedEval> check_evals(const Validator& v, const Registry& registry, const toml::node* node);

// [model] init_from names a checkpoint: the [model] keys that fix the model's shape and the
// experiment leaves out are the checkpoint's (its config.json, or its config.toml's [model]);
// `origins` records them as coming from model.init_from.
void take_model_shape(toml::table& root, std::map<std::string, std::string>& origins);

// Keys that were a section's own and now belong to its implementations ([optimizer] weight_decay,
// beta1, beta2 and eps: the AdamW family's, in [optimizer.adamw]). moved_key: the key's type for
// --set, or null when (section, key) is not one. move_keys: each such key written in [section]
// itself (by the file or --set) moved, with a warning, into the table of the chosen implementation
// (or of its family, ComponentInfo::family) when that declares it; otherwise an input error.
const ParamSpec* moved_key(std::string_view section, std::string_view key);

// One --set section.key=value (or section.implementation.key=value, eval.<label>.key=value) into
// `root`, typed by its spec; `origins` records where the value came from for error messages.
void apply_override(toml::table& root, const std::string& assignment, const Registry& registry,
                    std::map<std::string, std::string>& origins);
void move_keys(toml::table& root, const Validator& v, std::map<std::string, std::string>& origins);

}  // namespace ablate::config_check
