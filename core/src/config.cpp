// Experiment configuration: parse (TOML++), apply --set overrides typed by the schemas, load the
// [plugins] paths, validate every section and sub-table, fill defaults, print back as TOML. Core's
// sections are in config_sections.cpp, the checks in config_check.cpp, --set in config_override.cpp.
#include "ablate/runtime/config.hpp"

#include <cstdio>
#include <map>

#include <toml++/toml.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/version.hpp"
#include "ablate/runtime/registry.hpp"
#include "config_check.hpp"

namespace ablate {

namespace fs = std::filesystem;
using config_check::apply_override;
using config_check::check_evals;
using config_check::find_param;
using config_check::node_type_name;
using config_check::ResolvedEval;
using config_check::ResolvedSection;
using config_check::section_names;
using config_check::Validator;

uint64_t fnv1a(std::string_view s) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// ---------------------------------------------------------------------------------------------

struct Config::Impl {
  std::string source;
  std::map<std::string, ResolvedSection, std::less<>> sections;
  std::vector<ResolvedEval> evals;
};

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;
Config::~Config() = default;

Config Config::load(const fs::path& file, const std::vector<std::string>& overrides, Registry& registry) {
  // Only a regular file is read: a directory would read as empty (the all-defaults experiment), a
  // FIFO would wait forever and a device like /dev/zero would never end. Experiment files are a
  // few KB of TOML.
  const std::string text = read_regular_file(file, "experiment file", kMaxExperimentBytes);
  return parse(text, file.string(), overrides, registry, file.parent_path());
}

Config Config::parse(std::string_view text, const std::string& source_name, const std::vector<std::string>& overrides,
                     Registry& registry, const fs::path& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw_input_error(source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column),
                      "TOML syntax error: " + std::string(e.description()));
  }
  std::map<std::string, std::string> origins;
  Validator validator(source_name, registry, origins);

  // Top level: only known sections, each a table.
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "eval") continue;  // [[eval]] tables: checked with the evaluators loaded
    if (find_section_spec(k) == nullptr) {
      throw_input_error(validator.where(key.source(), k), "unknown section [" + k + "]" + did_you_mean(k, section_names()) +
                                                              " (sections: " + join(section_names()) + ")");
    }
    if (!node.is_table()) {
      throw_input_error(validator.where(key.source(), k), "'" + k + "' must be a table ([" + k + "]), got " + node_type_name(node));
    }
  }

  // [plugins] paths first: the plugins they hold may be what the rest of the file names. Overrides
  // of plugins.paths apply before loading; overrides naming plugin sub-tables apply after.
  std::vector<std::string> deferred;
  for (const std::string& o : overrides) {
    if (o.rfind("plugins.", 0) == 0) apply_override(root, o, registry, origins);
    else deferred.push_back(o);
  }
  if (const toml::table* plugins = root["plugins"].as_table()) {
    if (const toml::node* paths = plugins->get("paths")) {
      const Value v = validator.check(*paths, *find_param(find_section_spec("plugins")->keys, "paths"), "plugins.paths");
      std::vector<fs::path> dirs;
      for (const std::string& p : std::get<std::vector<std::string>>(v)) {
        fs::path dir(p);
        if (dir.is_relative() && !base_dir.empty()) dir = base_dir / dir;
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) {
          validator.fail(paths->source(), "plugins.paths", "'" + dir.string() + "' is not a directory");
        }
        dirs.push_back(dir);
      }
      registry.load_directories(dirs);
    }
  }
  for (const std::string& o : deferred) apply_override(root, o, registry, origins);
  config_check::move_keys(root, validator, origins);
  config_check::take_model_shape(root, origins);

  Config cfg;
  cfg.impl_->source = source_name;
  for (const SectionSpec& spec : section_specs()) {
    const toml::table* table = root[spec.name].as_table();
    if (table == nullptr && spec.kind && spec.default_selection.empty() && !spec.selector_is_list) {
      continue;  // a component section with no default implementation is absent until asked for
    }
    cfg.impl_->sections[spec.name] = validator.check_section(spec, table);
  }
  cfg.impl_->evals = check_evals(validator, registry, root.get("eval"));
  // Products of keys: a micro-batch's positions are indexed with 32 bits and every batch buffer
  // holds batch_size x seq_len of them, so a product past that is refused before anything is sized.
  if (auto it = cfg.impl_->sections.find("batching"); it != cfg.impl_->sections.end()) {
    const int64_t b = std::get<int64_t>(it->second.keys.at("batch_size"));
    const int64_t t = std::get<int64_t>(it->second.keys.at("seq_len"));
    if (b * t > kMaxBatchPositions) {
      const toml::node* at = root.at_path("batching.batch_size").node();
      validator.fail(at ? at->source() : toml::source_region{}, "batching.batch_size",
                     "batch_size x seq_len = " + std::to_string(b) + " x " + std::to_string(t) + " = " + std::to_string(b * t) +
                         " positions per micro-batch; expected at most " + std::to_string(kMaxBatchPositions) +
                         " (lower batching.batch_size or batching.seq_len)");
    }
  }
  return cfg;
}

std::string Config::to_toml() const {
  std::string out = "# resolved by ablate " + std::string(core_version()) + " from " + impl_->source + "\n";
  for (const SectionSpec& spec : section_specs()) {
    auto it = impl_->sections.find(spec.name);
    if (it == impl_->sections.end()) continue;
    const ResolvedSection& sec = it->second;
    out += "\n[" + spec.name + "]\n";
    if (spec.kind) out += spec.selector + " = " + format_value(sec.keys.at(spec.selector)) + "\n";
    for (const ParamSpec& p : spec.keys) {
      if (spec.kind && p.name == spec.selector) continue;
      out += p.name + " = " + format_value(sec.keys.at(p.name)) + "\n";
    }
    // The chosen implementations' sub-tables, and any the experiment gave itself. The keys of an
    // implementation resolved only because "auto" might pick it stay out: a run written by a build
    // with nccl must read where nccl is not built.
    const auto chosen = [&](const std::string& impl) {
      if (sec.written.count(impl) > 0 || !spec.kind) return true;
      const Value& sel = sec.keys.at(spec.selector);
      if (const auto* one = std::get_if<std::string>(&sel)) return *one == impl;
      if (const auto* many = std::get_if<std::vector<std::string>>(&sel))
        return std::find(many->begin(), many->end(), impl) != many->end();
      return false;
    };
    for (const auto& [impl, values] : sec.impls) {
      if (!chosen(impl)) continue;
      // A layer without keys of its own writes no [model.<layer>]: the text (and hash) of a config
      // that names only built-in layers stays what it was.
      if (!spec.kind && values.empty() && sec.written.count(impl) == 0) continue;
      out += "\n[" + spec.name + "." + impl + "]\n";
      for (const auto& [k, v] : values) out += k + " = " + format_value(v) + "\n";
    }
  }
  for (const ResolvedEval& e : impl_->evals) {
    out += "\n[[eval]]\n";
    for (const ParamSpec& p : eval_entry_keys()) out += p.name + " = " + format_value(e.common.at(p.name)) + "\n";
    for (const auto& [k, v] : e.own) out += k + " = " + format_value(v) + "\n";
  }
  return out;
}

std::vector<Config::EvalEntry> Config::evals() const {
  std::vector<EvalEntry> out;
  for (const ResolvedEval& e : impl_->evals) {
    out.push_back({Params("eval." + e.label, e.common), Params("eval." + e.label, e.own)});
  }
  return out;
}

std::string Config::hash() const {
  // The header line names the source file; the hash covers only the resolved values.
  std::string text = to_toml();
  text = text.substr(text.find('\n') + 1);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return buf;
}

const std::string& Config::source() const noexcept { return impl_->source; }

bool Config::has_section(std::string_view section) const { return impl_->sections.find(section) != impl_->sections.end(); }

Params Config::section(std::string_view section) const {
  auto it = impl_->sections.find(section);
  if (it == impl_->sections.end()) {
    throw_input_error(impl_->source, "the experiment has no [" + std::string(section) + "] section and it has no default");
  }
  return Params(std::string(section), it->second.keys);
}

std::string Config::selected(std::string_view section) const {
  const SectionSpec* spec = find_section_spec(section);
  if (spec == nullptr || !spec->kind) throw_runtime_error(std::string(section), "not a component section");
  if (spec->selector_is_list) {
    const auto list = selected_list(section);
    return list.empty() ? std::string() : list.front();
  }
  return this->section(section).get_string(spec->selector);
}

std::vector<std::string> Config::selected_list(std::string_view section) const {
  const SectionSpec* spec = find_section_spec(section);
  if (spec == nullptr || !spec->kind) throw_runtime_error(std::string(section), "not a component section");
  if (!spec->selector_is_list) return {selected(section)};
  return this->section(section).get_string_list(spec->selector);
}

std::vector<std::string> Config::implementations(std::string_view section) const {
  std::vector<std::string> names;
  if (auto it = impl_->sections.find(section); it != impl_->sections.end()) {
    for (const auto& [name, keys] : it->second.impls) names.push_back(name);
  }
  return names;
}

bool Config::has_implementation(std::string_view section, std::string_view impl) const {
  auto it = impl_->sections.find(section);
  return it != impl_->sections.end() && it->second.impls.find(impl) != it->second.impls.end();
}

Params Config::implementation(std::string_view section, std::string_view impl) const {
  auto it = impl_->sections.find(section);
  if (it == impl_->sections.end()) {
    throw_input_error(impl_->source, "the experiment has no [" + std::string(section) + "] section");
  }
  auto jt = it->second.impls.find(impl);
  if (jt == it->second.impls.end()) {
    throw_runtime_error(impl_->source, "no resolved [" + std::string(section) + "." + std::string(impl) + "]");
  }
  std::map<std::string, Value, std::less<>> keys = jt->second;
  if (auto f = it->second.family_of.find(impl); f != it->second.family_of.end()) {  // the family's keys, shared
    const auto& family = it->second.impls.at(f->second);
    keys.insert(family.begin(), family.end());
  }
  return Params(std::string(section) + "." + std::string(impl), std::move(keys));
}

}  // namespace ablate
