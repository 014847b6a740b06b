// The typed reader of a run's and a sweep's JSON files (see json_read.hpp).
#include "json_read.hpp"

#include <algorithm>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;
using K = JsonKind;

// ---- the schemas: the fields report, sweep and doctor use -----------------------------------

namespace {

constexpr JsonField kCapabilityFields[] = {
    {"host_memory", K::boolean}, {"reduced_precision_products", K::boolean}, {"fp8_products", K::boolean}, {"collective", K::string}};
constexpr JsonField kPluginFields[] = {{"kind", K::string}, {"name", K::string}, {"devices", K::strings}};
const JsonSchema kCapabilities{"device capabilities", kMaxJsonBytes, kCapabilityFields};
const JsonSchema kPluginRow{"plugin", kMaxJsonBytes, kPluginFields};

constexpr JsonField kRunFields[] = {
    {"world", K::count},
    {"memory_bytes", K::non_negative},
    {"activation_bytes", K::non_negative},
    {"memory_source", K::string},
    {"communicator", K::string},
    {"device", K::string},
    {"device_name", K::string},
    {"recompute", K::string},
    {"activation_bytes_by_recompute", K::number_map},
    {"device_capabilities", K::object, false, &kCapabilities},
    {"plugins", K::rows, false, &kPluginRow},
    {"vocab_size", K::count},
};

// summary.json's "evals": per label the evaluator's last metrics.
constexpr JsonField kEvalSummaryFields[] = {
    {"evaluator", K::string},   {"step", K::count},        {"primary", K::string},      {"higher_is_better", K::boolean},
    {"metrics", K::number_map}, {"evaluations", K::count}, {"time_s", K::non_negative},
};
const JsonSchema kEvalSummary{"evaluation summary", kMaxJsonBytes, kEvalSummaryFields};

constexpr JsonField kSummaryFields[] = {
    {"status", K::string, true},
    {"steps", K::count},
    {"parameters", K::count},
    {"first_loss", K::number},
    {"final_loss", K::number},
    {"val_loss", K::number},
    {"tokens_per_s", K::non_negative},
    {"real_tokens_per_s", K::non_negative},
    {"tflops", K::non_negative},
    {"mfu", K::non_negative},
    {"effective_mfu", K::non_negative},
    {"peak_tflops", K::non_negative},
    {"data_wait_pct", K::non_negative},
    {"comm_pct", K::non_negative},
    {"host_pct", K::non_negative},
    {"mem_peak_bytes", K::count},
    {"optimizer_state_bytes", K::count},
    {"wall_s", K::non_negative},
    {"world", K::count},
    {"resumed_from", K::count},
    {"data_bottleneck", K::string},
    {"step_time_cv", K::non_negative},
    {"machine_load", K::non_negative},
    {"cpu_steal", K::non_negative},
    {"evals", K::object_map, false, &kEvalSummary},
};

constexpr JsonField kMetricsFields[] = {
    {"step", K::count, true},
    {"loss", K::number},
    {"val_loss", K::number},
    {"step_ms", K::non_negative},
    {"tokens", K::count},
    {"real_tokens", K::count},
    {"padding_fraction", K::non_negative},
    {"tokens_per_s", K::non_negative},
    {"real_tokens_per_s", K::non_negative},
    {"mfu", K::non_negative},
    {"data_wait_pct", K::non_negative},
    {"comm_pct", K::non_negative},
    {"host_pct", K::non_negative},
    {"mem_peak_bytes", K::count},
    {"optimizer_state_bytes", K::count},
    {"elapsed_s", K::non_negative},
    {"lr", K::number},
    {"grad_norm", K::non_negative},
    {"fp8_saturated", K::count},
    {"fp8_saturated_worst", K::count},
};

constexpr JsonField kArmsFields[] = {
    {"name", K::string},
    {"base", K::string},
    {"axes", K::strings},
    {"arms", K::strings, true},
    {"peak_tflops_set", K::string},
    {"baseline", K::string},
    {"expected", K::number_map},
};

constexpr JsonField kArmFields[] = {
    {"name", K::string},         {"group", K::string},        {"repeat", K::count}, {"overrides", K::string_map}, {"sets", K::strings},
    {"status", K::string, true}, {"wall_s", K::non_negative}, {"error", K::string}, {"requeues", K::count},
};

// A results row's columns are null where the arm's summary has no value (an arm that did not finish).
constexpr JsonField kResultRowFields[] = {
    {"arm", K::string, true},
    {"group", K::string},
    {"repeat", K::count},
    {"overrides", K::string_map},
    {"status", K::string},
    {"final_loss", K::number},
    {"val_loss", K::number},
    {"tokens_per_s", K::non_negative},
    {"real_tokens_per_s", K::non_negative},
    {"mfu", K::non_negative},
    {"effective_mfu", K::non_negative},
    {"mem_peak_bytes", K::non_negative},
    {"optimizer_state_bytes", K::non_negative},
    {"data_wait_pct", K::non_negative},
    {"wall_s", K::non_negative},
    {"steps", K::non_negative},
    {"error", K::string},
    {"run_dir", K::string},
    {"best_val_loss", K::number},
    {"step_time_cv", K::non_negative},
    {"machine_load", K::non_negative},
    {"evals", K::number_map},
};

const JsonSchema kResultRow{"sweep results row", kMaxJsonBytes, kResultRowFields};

constexpr JsonField kEvalListFields[] = {{"label", K::string, true}, {"metric", K::string, true}, {"higher_is_better", K::boolean}};
const JsonSchema kEvalListRow{"sweep evaluation", kMaxJsonBytes, kEvalListFields};

constexpr JsonField kResultsFields[] = {
    {"sweep", K::string},        {"base", K::string},
    {"axes", K::strings},        {"arms", K::rows, true, &kResultRow},
    {"baseline", K::string},     {"evals", K::rows, false, &kEvalListRow},
    {"expected", K::number_map},
};

}  // namespace

const JsonSchema kRunJson{"run information (run.json)", kMaxJsonBytes, kRunFields};
const JsonSchema kSummaryJson{"run summary (summary.json)", kMaxJsonBytes, kSummaryFields};
const JsonSchema kMetricsLine{"metrics log (metrics.jsonl)", kMaxLogBytes, kMetricsFields, "eval/"};
const JsonSchema kArmsJson{"sweep arm list (arms.json)", kMaxJsonBytes, kArmsFields};
const JsonSchema kArmJson{"sweep arm record (arm.json)", kMaxJsonBytes, kArmFields};
const JsonSchema kResultsJson{"sweep results (results.json)", kMaxJsonBytes, kResultsFields};

// ---- messages -------------------------------------------------------------------------------

std::string json_text(const json& j, int indent) { return j.dump(indent, ' ', false, json::error_handler_t::replace); }

namespace {

// A value as a message shows it: its type, and for a plain value the value itself, cut short.
std::string describe(const json& v) {
  if (v.is_string()) return "string \"" + echo_value(v.get_ref<const std::string&>()) + "\"";
  if (v.is_number() || v.is_boolean()) return std::string(v.type_name()) + " " + json_text(v);
  return v.type_name();
}

std::string expectation(K kind) {
  switch (kind) {
    case K::number: return "a number";
    case K::non_negative: return "a number >= 0";
    case K::count: return "an integer >= 0";
    case K::string: return "a string";
    case K::strings: return "a list of strings";
    case K::string_map: return "an object of strings";
    case K::number_map: return "an object of numbers >= 0";
    case K::rows: return "a list of objects";
    case K::boolean: return "true or false";
    case K::object: return "an object";
    case K::object_map: return "an object of objects";
  }
  return "";
}

[[noreturn]] void refuse(const std::string& where, const std::string& field, const json& v, K kind) {
  const bool list = kind == K::strings || kind == K::rows, map = kind == K::string_map || kind == K::number_map;
  const char* is = list && !v.is_array() ? " is not a list: " : map && !v.is_object() ? " is not an object: " : " is ";
  const std::string limit = kind == K::string && v.is_string() ? " of at most " + std::to_string(kMaxJsonString) + " bytes" : "";
  throw_input_error(where, "field '" + field + "'" + is + describe(v) + "; expected " + expectation(kind) + limit);
}

json checked_object(const std::string& where, const json& in, const JsonSchema& schema, const std::string& prefix);

// One field's value, checked against its kind; returns what the reader keeps of it.
json checked(const std::string& where, const std::string& field, const json& v, const JsonField& f) {
  switch (f.kind) {
    case K::number:
      if (!v.is_number()) refuse(where, field, v, f.kind);
      return v;
    case K::non_negative:
      if (!v.is_number() || v.get<double>() < 0) refuse(where, field, v, f.kind);
      return v;
    case K::count:
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) refuse(where, field, v, f.kind);
      return v;
    case K::string:
      if (!v.is_string() || v.get_ref<const std::string&>().size() > kMaxJsonString) refuse(where, field, v, f.kind);
      return v;
    case K::boolean:
      if (!v.is_boolean()) refuse(where, field, v, f.kind);
      return v;
    case K::object: return checked_object(where, v, *f.rows, field);
    case K::object_map: {
      if (!v.is_object()) refuse(where, field, v, f.kind);
      json out = json::object();
      for (const auto& [key, value] : v.items()) out[key] = checked_object(where, value, *f.rows, field + "." + echo_value(key));
      return out;
    }
    case K::strings:
    case K::rows: {
      if (!v.is_array()) refuse(where, field, v, f.kind);
      json out = json::array();
      const JsonField element{f.name, K::string};
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::string name = field + "[" + std::to_string(i) + "]";
        out.push_back(f.kind == K::rows ? checked_object(where, v[i], *f.rows, name) : checked(where, name, v[i], element));
      }
      return out;
    }
    case K::string_map:
    case K::number_map: {
      if (!v.is_object()) refuse(where, field, v, f.kind);
      const JsonField element{f.name, f.kind == K::string_map ? K::string : K::non_negative};
      for (const auto& [key, value] : v.items()) {
        checked(where, field + "." + echo_value(key), value, element);
      }
      return v;
    }
  }
  return v;
}

bool null_is_absent(K kind) { return kind == K::number || kind == K::non_negative; }

// The fields of `schema` in the object `in`; `prefix` names it within the file ("" for the file's
// own object, "arms[3]" for a row).
json checked_object(const std::string& where, const json& in, const JsonSchema& schema, const std::string& prefix) {
  if (!in.is_object()) {
    throw_input_error(where, (prefix.empty() ? std::string("holds ") : "field '" + prefix + "' is ") + describe(in) +
                                 "; expected a JSON object");
  }
  json out = json::object();
  for (const JsonField& f : schema.fields) {
    const std::string key(f.name);
    const std::string field = prefix.empty() ? key : prefix + "." + key;
    const auto it = in.find(key);
    if (it == in.end() || (it->is_null() && null_is_absent(f.kind))) {
      if (f.required) throw_input_error(where, "field '" + field + "' is missing; expected " + expectation(f.kind));
      continue;
    }
    out[key] = checked(where, field, *it, f);
  }
  if (!schema.number_prefix.empty()) {
    for (const auto& [key, value] : in.items()) {
      if (key.rfind(schema.number_prefix, 0) == 0 && value.is_number()) out[key] = value;
    }
  }
  return out;
}

// nlohmann's message without its "[json.exception...] " tag, the token it echoes cut short.
std::string parse_detail(const json::exception& e, bool one_line) {
  std::string m = e.what();
  if (const std::size_t tag = m.find("] "); m.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) m.erase(0, tag + 2);
  if (one_line) {  // a JSONL line: the column is enough
    if (const std::size_t at = m.find("at line 1, column "); at != std::string::npos) m.replace(at, 18, "at column ");
  }
  for (const char* quote : {"last read: '", "parsing '"}) {
    const std::size_t at = m.find(quote);
    if (at == std::string::npos) continue;
    const std::size_t from = at + std::string_view(quote).size();
    const std::size_t end = m.size() > from && m.back() == '\'' ? m.size() - 1 : m.size();
    m = m.substr(0, from) + echo_value(std::string_view(m).substr(from, end - from)) + "'";
    break;
  }
  return echo_value(m, 400);
}

// `text` parsed and checked; `where` names the file (and line) in messages.
json parse_checked(const std::string& where, std::string_view text, const JsonSchema& schema, bool one_line) {
  if (const std::size_t at = json_too_deep_at(text); at != std::string_view::npos) {
    const std::string place = one_line
                                  ? "column " + std::to_string(at + 1)
                                  : "line " + std::to_string(1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n')) +
                                        ", byte " + std::to_string(at);
    throw_input_error(where,
                      "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels (at " + place + "): not a file ablate wrote");
  }
  json parsed;
  try {
    parsed = json::parse(text);
  } catch (const json::exception& e) {
    throw_input_error(where, "not valid JSON: " + parse_detail(e, one_line));
  }
  return checked_object(where, parsed, schema, "");
}

}  // namespace

// ---- reading --------------------------------------------------------------------------------

json read_json_file(const fs::path& path, const JsonSchema& schema) {
  const std::string text = read_regular_file(path, schema.what, schema.max_bytes);
  return parse_checked(path.string(), text, schema, false);
}

namespace {

// Nothing at all is at `path`; a dangling symlink or an entry that cannot be looked at is there (and
// refused by the read).
bool absent(const fs::path& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() == fs::file_type::not_found;
}

}  // namespace

std::optional<json> read_json_file_if_present(const fs::path& path, const JsonSchema& schema) {
  if (absent(path)) return std::nullopt;
  return read_json_file(path, schema);
}

std::vector<json> read_jsonl_file(const fs::path& path, const JsonSchema& line) {
  const std::string text = read_regular_file(path, line.what, line.max_bytes);
  std::vector<json> out;
  std::size_t begin = 0;
  for (int64_t n = 1; begin < text.size(); ++n) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view l = std::string_view(text).substr(begin, end - begin);
    begin = end + 1;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    out.push_back(parse_checked(path.string() + ":" + std::to_string(n), l, line, true));
  }
  return out;
}

std::optional<std::vector<json>> read_jsonl_file_if_present(const fs::path& path, const JsonSchema& line) {
  if (absent(path)) return std::nullopt;
  return read_jsonl_file(path, line);
}

}  // namespace ablate::cli
