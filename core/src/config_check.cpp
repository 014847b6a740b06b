// Checking an experiment file against the schemas (config_check.hpp).
#include "config_check.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>

#include "ablate/error.hpp"

namespace ablate::config_check {

namespace fs = std::filesystem;

std::optional<Kind> sub_table_kind(const SectionSpec& spec) {
  if (spec.kind) return spec.kind;
  if (!spec.layer_keys.empty()) return Kind::layer;
  return std::nullopt;
}

namespace {

bool valid_eval_label(const std::string& label) {
  if (label.empty() || label.size() > 64) return false;
  return std::all_of(label.begin(), label.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

}  // namespace

std::string written_eval_label(const toml::table& entry) {
  for (const char* key : {"label", "name"}) {
    if (const toml::node* n = entry.get(key); n != nullptr && n->is_string() && !n->as_string()->get().empty()) {
      return n->as_string()->get();
    }
  }
  return "";
}

const ParamSpec* find_param(const Schema& schema, std::string_view key) {
  for (const ParamSpec& p : schema) {
    if (p.name == key) return &p;
  }
  return nullptr;
}

std::vector<std::string> schema_names(const Schema& schema) {
  std::vector<std::string> out;
  for (const ParamSpec& p : schema) out.push_back(p.name);
  return out;
}

std::string node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "a list";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an int";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a bool";
    default: return "a date/time";
  }
}

std::string node_text(const toml::node& n) {
  if (n.is_table()) return "{...}";
  std::ostringstream os;
  n.visit([&](auto&& v) { os << toml::toml_formatter{v}; });
  std::string s = os.str();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

namespace {

// A path value made absolute against the working directory (see ParamSpec::is_path).
std::string absolute_if_path(const std::string& v, const ParamSpec& spec) {
  if (!spec.is_path || v.empty() || fs::path(v).is_absolute()) return v;
  if (std::find(spec.path_words.begin(), spec.path_words.end(), v) != spec.path_words.end()) return v;
  std::error_code ec;
  const fs::path abs = fs::absolute(v, ec);
  return ec ? v : abs.lexically_normal().string();
}

}  // namespace


Value Validator::check(const toml::node& node, const ParamSpec& spec, const std::string& path) const {
  auto mismatch = [&]() {
    fail(node.source(), path, "expected " + spec.expectation() + ", got " + node_type_name(node) + " " + node_text(node));
  };
  auto range = [&](double v, const toml::node& at) {
    if ((spec.min && v < *spec.min) || (spec.max && v > *spec.max) || !std::isfinite(v)) {
      fail(at.source(), path, node_text(at) + " is out of range; expected " + spec.expectation());
    }
  };
  auto choice = [&](const std::string& v, const toml::node& at) {
    if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), v) == spec.choices.end()) {
      fail(at.source(), path,
           "\"" + v + "\" is not allowed" + did_you_mean(v, spec.choices) + " (expected " + spec.expectation() + ")");
    }
    const std::optional<Kind> kind = kind_from_string(spec.registration_kind);
    if (kind && registry_.find(*kind, v) == nullptr) {
      const std::vector<std::string> valid = registry_.names(*kind);
      fail(at.source(), path,
           "unknown " + spec.registration_kind + " '" + v + "'" + did_you_mean(v, valid) +
               " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")" + registry_.not_loaded_note(v));
    }
  };
  switch (spec.type) {
    case ParamType::boolean:
      if (!node.is_boolean()) mismatch();
      return node.as_boolean()->get();
    case ParamType::integer: {
      if (!node.is_integer()) mismatch();
      const int64_t v = node.as_integer()->get();
      range(double(v), node);
      return v;
    }
    case ParamType::floating: {
      if (!node.is_number()) mismatch();
      const double v = node.is_integer() ? double(node.as_integer()->get()) : node.as_floating_point()->get();
      range(v, node);
      return v;
    }
    case ParamType::string: {
      if (!node.is_string()) mismatch();
      const std::string v = node.as_string()->get();
      choice(v, node);
      return absolute_if_path(v, spec);
    }
    case ParamType::int_list:
    case ParamType::float_list:
    case ParamType::string_list: {
      if (!node.is_array()) mismatch();
      std::vector<int64_t> ints;
      std::vector<double> floats;
      std::vector<std::string> strings;
      for (const toml::node& el : *node.as_array()) {
        if (spec.type == ParamType::int_list) {
          if (!el.is_integer()) mismatch();
          ints.push_back(el.as_integer()->get());
          range(double(ints.back()), el);
        } else if (spec.type == ParamType::float_list) {
          if (!el.is_number()) mismatch();
          floats.push_back(el.is_integer() ? double(el.as_integer()->get()) : el.as_floating_point()->get());
          range(floats.back(), el);
        } else {
          if (!el.is_string()) mismatch();
          strings.push_back(el.as_string()->get());
          choice(strings.back(), el);
          strings.back() = absolute_if_path(strings.back(), spec);
        }
      }
      if (spec.type == ParamType::int_list) return ints;
      if (spec.type == ParamType::float_list) return floats;
      return strings;
    }
  }
  mismatch();
  return {};
}

// Validates one table against a schema; unknown keys are errors with suggestions.
std::map<std::string, Value, std::less<>> Validator::check_table(const toml::table& table, const Schema& schema,
                                                                 const std::string& path, const std::string& hint_impl,
                                                                 const Schema* hint_schema, bool skip_tables) const {
  std::map<std::string, Value, std::less<>> out;
  for (auto&& [key, node] : table) {
    if (skip_tables && node.is_table()) continue;  // implementation sub-tables are checked apart
    const std::string k(key.str());
    const std::string kpath = path + "." + k;
    const ParamSpec* spec = find_param(schema, k);
    if (spec == nullptr) {
      std::string msg = kpath + ": unknown key '" + k + "' in [" + path + "]";
      if (hint_schema != nullptr && find_param(*hint_schema, k) != nullptr) {
        msg += "; '" + k + "' belongs in [" + path + "." + hint_impl + "]";
      } else {
        msg += did_you_mean(k, schema_names(schema));
      }
      msg += " (valid keys: " + join(schema_names(schema)) + ")";
      throw_input_error(where(key.source(), kpath), msg);
    }
    out[k] = check(node, *spec, kpath);
  }
  for (const ParamSpec& p : schema) {
    if (out.find(p.name) == out.end()) out[p.name] = p.default_value;
  }
  return out;
}

ResolvedSection Validator::check_section(const SectionSpec& spec, const toml::table* table) const {
  ResolvedSection res;
  const std::string& path = spec.name;
  // Core keys first (every non-table entry), so a misspelled key is reported even when the
  // implementation is not named yet. The hint says where an implementation's key belongs.
  const ComponentInfo* hint = nullptr;
  if (spec.kind && !spec.selector_is_list && table != nullptr) {
    if (const toml::node* sel = table->get(spec.selector); sel != nullptr && sel->is_string()) {
      hint = registry_.find(*spec.kind, sel->as_string()->get());
    }
  } else if (spec.kind && !spec.selector_is_list && !spec.default_selection.empty()) {
    hint = registry_.find(*spec.kind, spec.default_selection);
  }
  const toml::table empty;
  res.keys = check_table(table ? *table : empty, spec.keys, path, hint ? hint->name : "", hint ? &hint->schema : nullptr,
                         /*skip_tables=*/true);
  // Selected implementation(s), validated against the registry.
  std::vector<std::string> selected;
  if (spec.kind) {
    const toml::node* sel = table ? table->get(spec.selector) : nullptr;
    const std::string sel_path = path + "." + spec.selector;
    auto check_name = [&](const std::string& name, const toml::node& at) {
      if (*spec.kind == Kind::communicator && name == kAutoCommunicator) return;  // resolved by the trainer
      if (registry_.find(*spec.kind, name) == nullptr) {
        const std::vector<std::string> valid = registry_.names(*spec.kind);
        fail(at.source(), sel_path,
             "unknown " + std::string(to_string(*spec.kind)) + " '" + name + "'" + did_you_mean(name, valid) +
                 " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")" + registry_.not_loaded_note(name));
      }
    };
    if (sel != nullptr) {
      if (spec.selector_is_list) {
        if (!sel->is_array()) fail(sel->source(), sel_path, "expected a list of string, got " + node_type_name(*sel));
        for (const toml::node& el : *sel->as_array()) {
          if (!el.is_string()) fail(el.source(), sel_path, "expected a list of string, got an element " + node_text(el));
          check_name(el.as_string()->get(), el);
          selected.push_back(el.as_string()->get());
        }
      } else {
        if (!sel->is_string()) fail(sel->source(), sel_path, "expected a string, got " + node_type_name(*sel) + " " + node_text(*sel));
        check_name(sel->as_string()->get(), *sel);
        selected.push_back(sel->as_string()->get());
      }
    } else if (spec.selector_is_list) {
      // The schema's default list; the names are checked when the components are made, so a
      // config can be read where those plugins are not loaded.
      for (const ParamSpec& p : spec.keys) {
        if (p.name == spec.selector) selected = std::get<std::vector<std::string>>(p.default_value);
      }
    } else if (!spec.default_selection.empty()) {
      toml::value<std::string> def(spec.default_selection);
      check_name(spec.default_selection, def);
      selected.push_back(spec.default_selection);
    } else if (table != nullptr && !spec.selector_is_list) {
      const std::vector<std::string> valid = registry_.names(*spec.kind);
      fail(table->source(), path,
           "missing key '" + spec.selector + "': choose a " + std::string(to_string(*spec.kind)) +
               " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")");
    }
  }
  if (spec.kind) {
    if (spec.selector_is_list) {
      res.keys[spec.selector] = selected;
    } else {
      res.keys[spec.selector] = selected.empty() ? std::string() : selected.front();
    }
  }
  check_sub_tables(spec, table, res);
  if (spec.kind && selected.size() == 1 && *spec.kind == Kind::communicator && selected[0] == kAutoCommunicator) {
    selected = registry_.names(*spec.kind);  // any of them may be chosen: resolve every one's keys
  }
  for (const std::string& name : selected) {
    // A default list's names are checked when the components are made (a config may be read where
    // those plugins are not loaded): nothing to resolve for one that is not.
    const ComponentInfo* info = registry_.find(*spec.kind, name);
    if (info != nullptr && res.impls.find(name) == res.impls.end()) {
      res.impls[name] = check_table(toml::table{}, info->schema, path + "." + name, "", nullptr);
    }
  }
  if (spec.kind) resolve_families(spec, table, res);
  return res;
}

// Each resolved implementation that shares a family's keys (ComponentInfo::family): the family's
// table resolved too, its defaults where the experiment gives none.
void Validator::resolve_families(const SectionSpec& spec, const toml::table* table, ResolvedSection& res) const {
  std::vector<std::string> names;
  for (const auto& [name, keys] : res.impls) names.push_back(name);
  for (const std::string& name : names) {
    const std::string of = registry_.family(*spec.kind, name);
    if (of.empty() || of == name) continue;
    const ComponentInfo* family = registry_.find(*spec.kind, of);
    if (family == nullptr) {
      fail(table != nullptr ? table->source() : toml::source_region{}, spec.name + "." + name,
           "'" + name + "' shares the keys of '" + of + "', which is not loaded" + registry_.not_loaded_note(of));
    }
    res.family_of[name] = of;
    if (res.impls.find(of) == res.impls.end()) {
      res.impls[of] = check_table(toml::table{}, family->schema, spec.name + "." + of, "", nullptr);
    }
  }
}

// Sub-tables: one per implementation (or per layer of [model]), every one present validated; and
// the chosen layers' keys, their defaults where [model.<layer>] is not given (a name no
// registration has is refused where the model makes the layer, with the layers of that role).
void Validator::check_sub_tables(const SectionSpec& spec, const toml::table* table, ResolvedSection& res) const {
  const std::string& path = spec.name;
  const std::optional<Kind> sub_kind = sub_table_kind(spec);
  if (table != nullptr) {
    for (auto&& [key, node] : *table) {
      if (!node.is_table()) continue;
      const std::string impl(key.str());
      const std::string ipath = path + "." + impl;
      if (!sub_kind) {
        throw_input_error(where(key.source(), ipath), "[" + path + "] has no sub-tables; unexpected table [" + ipath + "]" +
                                                          did_you_mean(impl, schema_names(spec.keys)));
      }
      const ComponentInfo* info = registry_.find(*sub_kind, impl);
      if (info == nullptr) {
        const std::vector<std::string> valid = registry_.names(*sub_kind);
        throw_input_error(where(key.source(), ipath), "[" + ipath + "]: no " + std::string(to_string(*sub_kind)) + " named '" + impl +
                                                          "'" + did_you_mean(impl, valid) + " (valid: " +
                                                          (valid.empty() ? std::string("none loaded") : join(valid)) + ")");
      }
      // A key of the family this implementation shares keys with belongs in the family's table.
      if (const std::string family = registry_.family(*sub_kind, impl); !family.empty() && family != impl) {
        const ComponentInfo* head = registry_.find(*sub_kind, family);
        for (auto&& [k, v] : *node.as_table()) {
          if (head != nullptr && find_param(info->schema, k.str()) == nullptr && find_param(head->schema, k.str()) != nullptr) {
            fail(k.source(), ipath + "." + std::string(k.str()),
                 "'" + impl + "' reads '" + std::string(k.str()) + "' from [" + path + "." + family + "] (the keys it shares with " +
                     family + "): write it there");
          }
        }
      }
      res.impls[impl] = check_table(*node.as_table(), info->schema, ipath, "", nullptr);
      res.written.insert(impl);
    }
  }
  for (const std::string& key : spec.layer_keys) {
    const std::string& name = std::get<std::string>(res.keys.at(key));
    const ComponentInfo* info = registry_.find(Kind::layer, name);
    if (info != nullptr && res.impls.find(name) == res.impls.end()) {
      res.impls[name] = check_table(toml::table{}, info->schema, path + "." + name, "", nullptr);
    }
  }
}

// The [[eval]] tables: each names a registered evaluator, has a label no other has, and its other
// keys are the evaluator's (checked against its schema, defaults filled in).
std::vector<ResolvedEval> check_evals(const Validator& v, const Registry& registry, const toml::node* node) {
  std::vector<ResolvedEval> out;
  if (node == nullptr) return out;
  const toml::array* entries = node->as_array();
  if (entries == nullptr)
    v.fail(node->source(), "eval", "expected [[eval]] tables (an array of tables), got " + node_type_name(*node));
  for (std::size_t i = 0; i < entries->size(); ++i) {
    const toml::node& el = *entries->get(i);
    const std::string at = "eval[" + std::to_string(i) + "]";
    if (!el.is_table()) v.fail(el.source(), at, "expected a table ([[eval]]), got " + node_type_name(el) + " " + node_text(el));
    const toml::table& entry = *el.as_table();
    const toml::node* name = entry.get("name");
    const std::vector<std::string> valid = registry.names(Kind::evaluator);
    const std::string valid_text = " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")";
    if (name == nullptr) v.fail(entry.source(), at, "missing key 'name': choose an evaluator" + valid_text);
    if (!name->is_string())
      v.fail(name->source(), at + ".name", "expected a string, got " + node_type_name(*name) + " " + node_text(*name));
    const std::string plugin = name->as_string()->get();
    const ComponentInfo* info = registry.find(Kind::evaluator, plugin);
    if (info == nullptr) {
      v.fail(name->source(), at + ".name",
             "unknown evaluator '" + plugin + "'" + did_you_mean(plugin, valid) + valid_text + registry.not_loaded_note(plugin));
    }
    std::string label = written_eval_label(entry);
    const std::string path = "eval." + (valid_eval_label(label) ? label : at);
    Schema schema = eval_entry_keys();
    schema.insert(schema.end(), info->schema.begin(), info->schema.end());
    std::map<std::string, Value, std::less<>> keys = v.check_table(entry, schema, path, "", nullptr);
    if (std::get<std::string>(keys["label"]).empty()) keys["label"] = plugin;
    label = std::get<std::string>(keys["label"]);
    const toml::node* label_node = entry.get("label");
    const toml::source_region region = label_node ? label_node->source() : entry.source();
    if (!valid_eval_label(label)) {
      v.fail(region, at + ".label",
             "\"" + label +
                 "\" is not a label: expected 1 to 64 lower-case letters, digits or '_' "
                 "(it names the metrics eval/<label>/<metric>)");
    }
    for (const ResolvedEval& e : out) {
      if (e.label == label) {
        v.fail(region, at + ".label", "\"" + label + "\" is the label of another [[eval]] too; give each its own `label`");
      }
    }
    ResolvedEval r;
    r.label = label;
    for (auto& [k, v] : keys) (find_param(eval_entry_keys(), k) ? r.common : r.own)[k] = v;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const SectionSpec& s : section_specs()) out.push_back(s.name);
  return out;
}

}  // namespace ablate::config_check
