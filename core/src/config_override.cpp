// --set overrides (config_check.hpp): a path resolved to its spec, the value parsed as TOML and
// typed by it, written into the parsed file before it is checked.
#include <sstream>

#include <spdlog/spdlog.h>

#include "ablate/error.hpp"
#include "config_check.hpp"

namespace ablate::config_check {

namespace {

// --set: find the spec a path names, or fail with a suggestion.
const ParamSpec* override_spec(const std::vector<std::string>& parts, const std::string& origin, const Registry& registry,
                               ParamSpec& selector_spec) {
  const SectionSpec* sec = find_section_spec(parts[0]);
  if (sec == nullptr) {
    throw_input_error(origin, "unknown section '" + parts[0] + "'" + did_you_mean(parts[0], section_names()) +
                                  " (sections: " + join(section_names()) + ")");
  }
  if (parts.size() == 2) {
    const ParamSpec* p = find_param(sec->keys, parts[1]);
    if (p == nullptr) p = moved_key(parts[0], parts[1]);  // written where it was; move_keys moves it
    if (p == nullptr) {
      throw_input_error(origin, "unknown key '" + parts[1] + "' in [" + parts[0] + "]" +
                                    did_you_mean(parts[1], schema_names(sec->keys)) +
                                    " (valid keys: " + join(schema_names(sec->keys)) + ")");
    }
    if (sec->kind && parts[1] == sec->selector && sec->selector_is_list) {
      selector_spec = param::string_list(parts[1], {}, "");
      return &selector_spec;
    }
    return p;
  }
  if (const std::optional<Kind> kind = sub_table_kind(*sec); parts.size() == 3 && kind) {
    const ComponentInfo* info = registry.find(*kind, parts[1]);
    if (info == nullptr) {
      const std::vector<std::string> valid = registry.names(*kind);
      throw_input_error(origin, "no " + std::string(to_string(*kind)) + " named '" + parts[1] + "'" + did_you_mean(parts[1], valid) +
                                    " (valid: " + join(valid) + ")");
    }
    const ParamSpec* p = find_param(info->schema, parts[2]);
    if (p == nullptr) {
      throw_input_error(origin, "unknown key '" + parts[2] + "' in [" + parts[0] + "." + parts[1] + "]" +
                                    did_you_mean(parts[2], schema_names(info->schema)) +
                                    " (valid keys: " + join(schema_names(info->schema)) + ")");
    }
    return p;
  }
  throw_input_error(origin, "expected section.key=value or section.implementation.key=value");
}

std::unique_ptr<toml::node> parse_override_value(const std::string& text, const ParamSpec& spec, const std::string& origin) {
  toml::table parsed;
  bool ok = true;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    ok = false;
  }
  const toml::node* v = ok ? parsed.get("v") : nullptr;
  auto bad = [&]() -> std::unique_ptr<toml::node> { throw_input_error(origin, "'" + text + "' is not " + spec.expectation()); };
  switch (spec.type) {
    case ParamType::string:
      if (v && v->is_string()) return std::make_unique<toml::value<std::string>>(v->as_string()->get());
      return std::make_unique<toml::value<std::string>>(text);  // bare words need no quotes on a command line
    case ParamType::boolean:
      if (v && v->is_boolean()) return std::make_unique<toml::value<bool>>(v->as_boolean()->get());
      return bad();
    case ParamType::integer:
      if (v && v->is_integer()) return std::make_unique<toml::value<int64_t>>(v->as_integer()->get());
      return bad();
    case ParamType::floating:
      if (v && v->is_integer()) return std::make_unique<toml::value<double>>(double(v->as_integer()->get()));
      if (v && v->is_floating_point()) return std::make_unique<toml::value<double>>(v->as_floating_point()->get());
      return bad();
    default: break;
  }
  // Lists: TOML syntax, or for strings a bare comma-separated list ("console,jsonl").
  if (v && v->is_array()) return std::make_unique<toml::array>(*v->as_array());
  if (spec.type == ParamType::string_list) {
    auto arr = std::make_unique<toml::array>();
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) arr->push_back(item);
    }
    return arr;
  }
  if (v && v->is_number()) {  // a single number for a list of numbers
    auto arr = std::make_unique<toml::array>();
    if (v->is_integer()) arr->push_back(v->as_integer()->get());
    else arr->push_back(v->as_floating_point()->get());
    return arr;
  }
  return bad();
}

// --set eval.<label>.<key>=value: the [[eval]] table of that label (its `label`, else its `name`),
// typed by the common [[eval]] keys or its evaluator's schema.
void apply_eval_override(toml::table& root, const std::vector<std::string>& parts, const std::string& text, const std::string& origin,
                         const Registry& registry) {
  toml::array* entries = root["eval"].as_array();
  std::vector<std::string> labels;
  toml::table* entry = nullptr;
  for (std::size_t i = 0; entries != nullptr && i < entries->size(); ++i) {
    toml::table* t = entries->get(i)->as_table();
    if (t == nullptr) continue;
    labels.push_back(written_eval_label(*t));
    if (labels.back() == parts[1]) entry = t;
  }
  if (parts.size() != 3) throw_input_error(origin, "expected eval.<label>.key=value");
  if (entry == nullptr) {
    throw_input_error(origin, "the experiment has no [[eval]] labelled '" + parts[1] + "'" + did_you_mean(parts[1], labels) +
                                  (labels.empty() ? std::string(" (it has no [[eval]] table: add one to the file)")
                                                  : " (labels: " + join(labels) + ")"));
  }
  const ParamSpec* spec = find_param(eval_entry_keys(), parts[2]);
  const toml::node* name = entry->get("name");
  const ComponentInfo* info = name && name->is_string() ? registry.find(Kind::evaluator, name->as_string()->get()) : nullptr;
  if (spec == nullptr && info != nullptr) spec = find_param(info->schema, parts[2]);
  if (spec == nullptr) {
    std::vector<std::string> keys = schema_names(eval_entry_keys());
    if (info != nullptr)
      for (const std::string& k : schema_names(info->schema)) keys.push_back(k);
    throw_input_error(origin, "unknown key '" + parts[2] + "' in [[eval]] '" + parts[1] + "'" + did_you_mean(parts[2], keys) +
                                  " (valid keys: " + join(keys) + ")");
  }
  std::unique_ptr<toml::node> value = parse_override_value(text, *spec, origin);
  if (auto* arr = dynamic_cast<toml::array*>(value.get())) {
    entry->insert_or_assign(parts[2], std::move(*arr));
  } else {
    value->visit([&](auto&& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (toml::is_value<V>) entry->insert_or_assign(parts[2], v.get());
    });
  }
}

}  // namespace

void apply_override(toml::table& root, const std::string& assignment, const Registry& registry,
                    std::map<std::string, std::string>& origins) {
  const std::string origin = "--set " + assignment;
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw_input_error(origin, "expected section.key=value");
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  if (!parts.empty() && parts[0] == "eval") {
    apply_eval_override(root, parts, text, origin, registry);
    origins[path] = origin;
    return;
  }
  if (parts.size() < 2 || parts.size() > 3)
    throw_input_error(origin, "expected section.key=value or section.implementation.key=value");
  ParamSpec selector_spec;
  const ParamSpec* spec = override_spec(parts, origin, registry, selector_spec);
  std::unique_ptr<toml::node> value = parse_override_value(text, *spec, origin);
  toml::table* t = &root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* child = t->get(parts[i]);
    if (child == nullptr) {
      t->insert(parts[i], toml::table{});
      child = t->get(parts[i]);
    }
    if (!child->is_table()) throw_input_error(origin, "'" + parts[i] + "' is not a table in the experiment file");
    t = child->as_table();
  }
  if (auto* arr = dynamic_cast<toml::array*>(value.get())) {
    t->insert_or_assign(parts.back(), std::move(*arr));
  } else {
    value->visit([&](auto&& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (toml::is_value<V>) t->insert_or_assign(parts.back(), v.get());
    });
  }
  origins[path] = origin;
}


namespace {

// A key that was core's and is now an implementation's own: [section] key moves to
// [section.<chosen>] (renamed to `to` where given), the chosen implementation being the one the
// section's selector names, or for [model] the layer the key `selector` names. A key that only
// some choices ever read (`inert` elsewhere: rope_theta beside learned positions, which older
// resolved configs wrote for every model) is dropped with a warning where the choice has none.
struct MovedKey {
  const char* section;
  ParamSpec spec;  // the type --set reads it as; the implementation's schema checks it
  const char* selector = nullptr;
  const char* to = nullptr;
  bool inert = false;
};
const std::vector<MovedKey>& moved_keys() {
  static const std::vector<MovedKey> keys = {{"optimizer", param::floating("weight_decay", 0, "")},
                                             {"optimizer", param::floating("beta1", 0, "")},
                                             {"optimizer", param::floating("beta2", 0, "")},
                                             {"optimizer", param::floating("eps", 0, "")},
                                             {"adapter", param::integer("rank", 0, "")},
                                             {"adapter", param::floating("alpha", 0, "")},
                                             {"adapter", param::floating("dropout", 0, "")},
                                             {"model", param::floating("rope_theta", 0, ""), "position", "theta", true}};
  return keys;
}

}  // namespace

const ParamSpec* moved_key(std::string_view section, std::string_view key) {
  for (const MovedKey& m : moved_keys()) {
    if (m.section == section && m.spec.name == key) return &m.spec;
  }
  return nullptr;
}

void move_keys(toml::table& root, const Validator& v, std::map<std::string, std::string>& origins) {
  for (const MovedKey& m : moved_keys()) {
    toml::table* section = root[m.section].as_table();
    const toml::node* value = section != nullptr ? section->get(m.spec.name) : nullptr;
    if (value == nullptr) continue;
    const SectionSpec* spec = find_section_spec(m.section);
    const std::string selector_key = m.selector != nullptr ? m.selector : spec->selector;
    const Kind kind = m.selector != nullptr ? Kind::layer : *spec->kind;
    const ParamSpec* selector_spec = find_param(spec->keys, selector_key);
    const toml::node* selector = section->get(selector_key);
    const std::string chosen = selector != nullptr && selector->is_string() ? selector->as_string()->get()
                               : m.selector != nullptr && selector_spec != nullptr
                                   ? std::get<std::string>(selector_spec->default_value)
                                   : spec->default_selection;
    const ComponentInfo* info = v.registry().find(kind, chosen);
    if (info == nullptr) continue;  // an unknown implementation: the section's check names it
    const std::string family = v.registry().family(kind, chosen);
    const std::string owner = family.empty() ? chosen : family;
    const ComponentInfo* owner_info = v.registry().find(kind, owner);
    const std::string new_name = m.to != nullptr ? m.to : m.spec.name;
    const std::string from = std::string(m.section) + "." + m.spec.name, to = std::string(m.section) + "." + owner + "." + new_name;
    if (m.inert && owner_info != nullptr && find_param(owner_info->schema, new_name) == nullptr) {
      spdlog::warn("{}: {} is read by no part of this model ({} '{}' has no key '{}'): ignored, as it always was",
                   v.where(value->source(), from), from, selector_key, chosen, new_name);
      section->erase(m.spec.name);
      origins.erase(from);
      continue;
    }
    if (owner_info == nullptr || find_param(owner_info->schema, new_name) == nullptr) {
      v.fail(value->source(), from,
             "'" + chosen + "' has no key '" + new_name + "': " + from + " is now [" + m.section + ".<name>] " + new_name +
                 ", an own key of the " + std::string(to_string(kind)) + "s that declare it");
    }
    const std::string where = v.where(value->source(), from);
    toml::node* own = section->get(owner);
    if (own == nullptr) {
      section->insert(owner, toml::table{});
      own = section->get(owner);
    }
    if (!own->is_table()) continue;  // the section's check names the malformed table
    toml::table& own_table = *own->as_table();
    if (own_table.contains(new_name)) v.fail(value->source(), from, "is given twice: here and as " + to + "; keep " + to);
    value->visit([&](auto&& x) {
      using V = std::decay_t<decltype(x)>;
      if constexpr (toml::is_value<V>) own_table.insert(new_name, x.get());
      else own_table.insert(new_name, x);
    });
    section->erase(m.spec.name);
    if (const auto origin = origins.find(from); origin != origins.end()) {
      origins[to] = origin->second;
      origins.erase(origin);
    }
    spdlog::warn("{}: {} is now {} ({}'s own key): read there", where, from, to, owner);
  }
}

}  // namespace ablate::config_check
