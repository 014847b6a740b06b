// Parameter specs, value formatting, and Params' typed lookups.
#include "ablate/schema.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <sstream>

#include "ablate/error.hpp"

namespace ablate {

std::string_view to_string(ParamType type) noexcept {
  switch (type) {
    case ParamType::boolean: return "bool";
    case ParamType::integer: return "int";
    case ParamType::floating: return "float";
    case ParamType::string: return "string";
    case ParamType::int_list: return "list of int";
    case ParamType::float_list: return "list of float";
    case ParamType::string_list: return "list of string";
  }
  return "unknown";
}

namespace {

std::string format_double(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  // The shortest text that reads back as the same double (std::to_chars), written as a TOML float.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string r(buf, res.ptr);
  if (r.find_first_of(".eEn") == std::string::npos) r += ".0";
  return r;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

template <class T, class F>
std::string format_list(const std::vector<T>& items, F fmt) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += fmt(items[i]);
  }
  return out + "]";
}

std::string format_number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
  return format_double(v);
}

}  // namespace

std::string format_value(const Value& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_double(d); }
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(const std::vector<int64_t>& v) const {
      return format_list(v, [](int64_t i) { return std::to_string(i); });
    }
    std::string operator()(const std::vector<double>& v) const { return format_list(v, format_double); }
    std::string operator()(const std::vector<std::string>& v) const { return format_list(v, quote); }
  };
  return std::visit(Visitor{}, value);
}

std::string ParamSpec::expectation() const {
  std::string what;
  switch (type) {
    case ParamType::boolean: what = "a bool (true or false)"; break;
    case ParamType::integer: what = "an int"; break;
    case ParamType::floating: what = "a float"; break;
    case ParamType::string: what = "a string"; break;
    case ParamType::int_list: what = "a list of int"; break;
    case ParamType::float_list: what = "a list of float"; break;
    case ParamType::string_list: what = "a list of string"; break;
  }
  if (!choices.empty()) {
    std::string list;
    for (std::size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + quote(choices[i]);
    what = type == ParamType::string ? "one of " + list : what + " with elements from " + list;
  }
  if (!registration_kind.empty()) what += " naming a loaded " + registration_kind + " (`ablate plugins list`)";
  if (min && max) {
    what += " in [" + format_number(*min) + ", " + format_number(*max) + "]";
  } else if (min) {
    what += " >= " + format_number(*min);
  } else if (max) {
    what += " <= " + format_number(*max);
  }
  return what;
}

namespace param {
ParamSpec boolean(std::string name, bool def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::boolean, def, std::move(doc), {}, {}, {}, false, {}, {}};
}
ParamSpec integer(std::string name, int64_t def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::integer, def, std::move(doc), {}, {}, {}, false, {}, {}};
}
ParamSpec floating(std::string name, double def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::floating, def, std::move(doc), {}, {}, {}, false, {}, {}};
}
ParamSpec string(std::string name, std::string def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::string, std::move(def), std::move(doc), {}, {}, {}, false, {}, {}};
}
ParamSpec int_list(std::string name, std::vector<int64_t> def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::int_list, std::move(def), std::move(doc), {}, {}, {}, false, {}, {}};
}
ParamSpec float_list(std::string name, std::vector<double> def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::float_list, std::move(def), std::move(doc), {}, {}, {}, false, {}, {}};
}
ParamSpec string_list(std::string name, std::vector<std::string> def, std::string doc) {
  return ParamSpec{std::move(name), ParamType::string_list, std::move(def), std::move(doc), {}, {}, {}, false, {}, {}};
}
}  // namespace param

Params::Params(std::string path, std::map<std::string, Value, std::less<>> values)
    : path_(std::move(path)), values_(std::move(values)) {}

bool Params::has(std::string_view key) const { return values_.find(key) != values_.end(); }

const Value& Params::lookup(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw_runtime_error(path_, "no key '" + std::string(key) + "' in this table's schema");
  }
  return it->second;
}

namespace {
template <class T>
const T& typed(const Value& v, const std::string& path, std::string_view key, const char* type) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw_runtime_error(path, "key '" + std::string(key) + "' is not " + type);
}
}  // namespace

bool Params::get_bool(std::string_view key) const { return typed<bool>(lookup(key), path_, key, "a bool"); }
int64_t Params::get_int(std::string_view key) const { return typed<int64_t>(lookup(key), path_, key, "an int"); }
double Params::get_float(std::string_view key) const { return typed<double>(lookup(key), path_, key, "a float"); }
const std::string& Params::get_string(std::string_view key) const { return typed<std::string>(lookup(key), path_, key, "a string"); }
const std::vector<int64_t>& Params::get_int_list(std::string_view key) const {
  return typed<std::vector<int64_t>>(lookup(key), path_, key, "a list of int");
}
const std::vector<double>& Params::get_float_list(std::string_view key) const {
  return typed<std::vector<double>>(lookup(key), path_, key, "a list of float");
}
const std::vector<std::string>& Params::get_string_list(std::string_view key) const {
  return typed<std::vector<std::string>>(lookup(key), path_, key, "a list of string");
}

}  // namespace ablate
