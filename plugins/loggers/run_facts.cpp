// The run facts the describing sinks share (see run_facts.hpp).
#include "run_facts.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate::loggers {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A float as TOML spells it and as the config files do: the shortest text that reads back to the
// same double, with ".0" on whole numbers so that it stays a float.
std::string float_text(double d) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string t(buf, r.ptr);
  if (std::isfinite(d) && t.find_first_of(".eE") == std::string::npos) t += ".0";
  if (std::isnan(d)) t = "nan";
  return t;
}

void flatten(const toml::table& table, const std::string& prefix, std::vector<ConfigEntry>& out) {
  for (const auto& [k, node] : table) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      flatten(*sub, key, out);
      continue;
    }
    // An array of tables ([[eval]]): each table under its label (its position where it has none),
    // so that its keys are named as --set names them: eval.<label>.<key>.
    if (const toml::array* tables = node.as_array(); tables != nullptr && !tables->empty() && tables->is_array_of_tables()) {
      for (std::size_t i = 0; i < tables->size(); ++i) {
        const toml::table& t = *tables->get(i)->as_table();
        const toml::node* label = t.get("label");
        flatten(t, key + "." + (label && label->is_string() ? label->as_string()->get() : std::to_string(i)), out);
      }
      continue;
    }
    ConfigEntry e;
    e.key = key;
    if (const auto* s = node.as_string()) {
      e.text = s->get();
    } else if (const auto* i = node.as_integer()) {
      e.type = ConfigEntry::Type::number;
      e.number = double(i->get());
      e.text = std::to_string(i->get());
    } else if (const auto* f = node.as_floating_point()) {
      e.type = ConfigEntry::Type::number;
      e.number = f->get();
      e.text = float_text(f->get());
    } else if (const auto* b = node.as_boolean()) {
      e.type = ConfigEntry::Type::boolean;
      e.boolean = b->get();
      e.text = b->get() ? "true" : "false";
    } else {  // arrays (and dates, which the resolved config does not hold): their TOML text
      e.type = ConfigEntry::Type::list;
      std::ostringstream s;
      s << toml::toml_formatter(node);
      e.text = s.str();
    }
    out.push_back(std::move(e));
  }
}

json read_json(const fs::path& file, const char* what) {
  const std::string text = read_json_text(file, what, kMaxJsonBytes);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw_input_error(file.string(), "is not a JSON object (the sweep writes it; was it changed?)");
  return j;
}

const json& field(const json& j, const fs::path& file, const char* name, json::value_t type, const char* expected) {
  const auto it = j.find(name);
  const bool ok = it != j.end() && (it->type() == type || (type == json::value_t::number_integer && it->is_number_unsigned()));
  if (!ok) throw_input_error(file.string(), std::string("field '") + name + "' is missing or not " + expected);
  return *it;
}

}  // namespace

std::vector<ConfigEntry> flatten_config(const std::string& config_toml) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(config_toml), std::string_view("the resolved config"));
  } catch (const toml::parse_error& e) {
    throw_input_error("the resolved config", std::string("is not TOML: ") + std::string(e.description()));
  }
  std::vector<ConfigEntry> out;
  flatten(root, "", out);
  return out;
}

const ConfigEntry* find_entry(const std::vector<ConfigEntry>& entries, const std::string& key) {
  const auto it = std::find_if(entries.begin(), entries.end(), [&](const ConfigEntry& e) { return e.key == key; });
  return it == entries.end() ? nullptr : &*it;
}

std::string experiment_file_name(const std::string& config_toml) {
  const std::string first = config_toml.substr(0, config_toml.find('\n'));
  const std::string marker = " from ";
  if (first.rfind("# resolved by ablate ", 0) != 0) return "";
  const std::size_t at = first.find(marker);
  if (at == std::string::npos) return "";
  return fs::path(first.substr(at + marker.size())).stem().string();
}

std::optional<SweepArm> read_sweep_arm(const fs::path& run_dir, const std::string& run_name) {
  const fs::path arm_file = run_dir / "arm.json";
  const fs::path sweep_dir = fs::absolute(run_dir).lexically_normal().parent_path();
  const fs::path arms_file = sweep_dir / "arms.json";
  std::error_code ec;
  if (!fs::exists(arm_file, ec) || !fs::exists(arms_file, ec)) return std::nullopt;
  const json arm = read_json(arm_file, "arm record");
  const json arms = read_json(arms_file, "sweep's arm list");
  const json& names = field(arms, arms_file, "arms", json::value_t::array, "a list of arm names");
  if (std::find(names.begin(), names.end(), json(run_name)) == names.end()) return std::nullopt;
  if (field(arm, arm_file, "name", json::value_t::string, "a string").get<std::string>() != run_name) return std::nullopt;
  SweepArm a;
  a.sweep = field(arms, arms_file, "name", json::value_t::string, "a string").get<std::string>();
  a.arm = run_name;
  a.group = field(arm, arm_file, "group", json::value_t::string, "a string").get<std::string>();
  a.repeat = field(arm, arm_file, "repeat", json::value_t::number_integer, "an integer").get<int64_t>();
  for (const json& axis : field(arms, arms_file, "axes", json::value_t::array, "a list of config keys")) {
    if (!axis.is_string()) throw_input_error(arms_file.string(), "field 'axes' holds a value that is not a string");
    a.factors.push_back(axis.get<std::string>());
  }
  return a;
}

double unix_seconds() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace ablate::loggers
