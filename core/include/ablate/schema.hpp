// Parameter schemas: every component declares its keys (type, default, range or choices, one line
// of documentation). The config validator checks experiment files against them, `--set` is typed
// by them, `ablate plugins describe` prints them, and Params hands the validated values to the
// component that asked for them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ablate {

enum class ParamType { boolean, integer, floating, string, int_list, float_list, string_list };

std::string_view to_string(ParamType type) noexcept;  // "bool", "int", "float", "string", "list of int", ...

using Value = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>, std::vector<std::string>>;

std::string format_value(const Value& value);  // TOML spelling: 3, 0.5, true, "x", [1, 2]

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::integer;
  Value default_value;
  std::string doc;
  std::optional<double> min;         // inclusive; for lists it applies to every element
  std::optional<double> max;         // inclusive
  std::vector<std::string> choices;  // for strings and string lists: the allowed values
  // Strings and string lists naming files or directories (globs included): made absolute against
  // the working directory when the config is read, so the run's resolved config.toml works from
  // any directory. `path_words` are values that are not paths ("auto", "none") and stay as they are.
  bool is_path = false;
  std::vector<std::string> path_words;
  // Strings naming a component: the value must be the name of a loaded registration of this kind
  // ("device": run.device), checked against the registry as the config is read, so the list stays
  // open to plugins rather than fixed in the schema.
  std::string registration_kind;

  ParamSpec& at_least(double v) {
    min = v;
    return *this;
  }
  ParamSpec& at_most(double v) {
    max = v;
    return *this;
  }
  ParamSpec& within(double lo, double hi) {
    min = lo;
    max = hi;
    return *this;
  }
  ParamSpec& one_of(std::vector<std::string> values) {
    choices = std::move(values);
    return *this;
  }
  ParamSpec& path(std::vector<std::string> words = {}) {
    is_path = true;
    path_words = std::move(words);
    return *this;
  }
  ParamSpec& registration_of(std::string kind) {
    registration_kind = std::move(kind);
    return *this;
  }

  // "an int >= 1", "one of "first_fit", "best_fit"", "a list of float in [0, 1]"
  std::string expectation() const;
};

using Schema = std::vector<ParamSpec>;

namespace param {
ParamSpec boolean(std::string name, bool def, std::string doc);
ParamSpec integer(std::string name, int64_t def, std::string doc);
ParamSpec floating(std::string name, double def, std::string doc);
ParamSpec string(std::string name, std::string def, std::string doc);
ParamSpec int_list(std::string name, std::vector<int64_t> def, std::string doc);
ParamSpec float_list(std::string name, std::vector<double> def, std::string doc);
ParamSpec string_list(std::string name, std::vector<std::string> def, std::string doc);
}  // namespace param

// The validated values of one config table (every key of its schema present, defaults filled in).
// Lookups of a key the schema does not declare, or with the wrong type, are programming errors
// and throw ablate::Error naming the table path.
class Params {
 public:
  Params() = default;
  Params(std::string path, std::map<std::string, Value, std::less<>> values);

  const std::string& path() const noexcept { return path_; }  // e.g. "batching.packed"
  bool has(std::string_view key) const;

  bool get_bool(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const std::vector<int64_t>& get_int_list(std::string_view key) const;
  const std::vector<double>& get_float_list(std::string_view key) const;
  const std::vector<std::string>& get_string_list(std::string_view key) const;

  const std::map<std::string, Value, std::less<>>& values() const noexcept { return values_; }

 private:
  const Value& lookup(std::string_view key) const;
  std::string path_;
  std::map<std::string, Value, std::less<>> values_;
};

}  // namespace ablate
