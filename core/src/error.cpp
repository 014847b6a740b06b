// ablate::Error and its shorthands.
#include "ablate/error.hpp"

#include <cstdint>

namespace ablate {

namespace {

// The length of the UTF-8 character starting at s[i] when it is well formed, else 0.
std::size_t utf8_char_length(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  uint32_t cp = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
    cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    cp = b & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

std::string compose(const std::string& where, const std::string& message) {
  std::string text = where.empty() ? message : where + ": " + message;
  if (text.size() <= kMaxMessageBytes) return text;
  const std::size_t keep = kMaxMessageBytes / 2;
  const std::size_t omitted = text.size() - 2 * keep;
  return echo_value(std::string_view(text).substr(0, keep), keep) + " ... (" + std::to_string(omitted) + " bytes left out) ... " +
         echo_value(std::string_view(text).substr(text.size() - keep), keep);
}

}  // namespace

std::string echo_value(std::string_view value, std::size_t max_bytes) {
  std::string out;
  std::size_t i = 0;
  while (i < value.size() && out.size() < max_bytes) {
    const auto b = static_cast<unsigned char>(value[i]);
    if (b >= 0x20 && b < 0x7F) {
      out += char(b);
      ++i;
    } else if (const std::size_t n = b >= 0x80 ? utf8_char_length(value, i) : 0; n > 0) {
      out.append(value.substr(i, n));
      i += n;
    } else if (b == '\t') {
      out += "\\t";
      ++i;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 15];
      ++i;
    }
  }
  if (i < value.size()) out += "... (" + std::to_string(value.size()) + " bytes)";
  return out;
}

Error::Error(ErrorKind kind, std::string where, const std::string& message)
    : std::runtime_error(compose(where, message)), kind_(kind), where_(std::move(where)) {}

Error::~Error() = default;

void throw_input_error(std::string where, const std::string& message) { throw Error(ErrorKind::input, std::move(where), message); }

void throw_runtime_error(std::string where, const std::string& message) { throw Error(ErrorKind::runtime, std::move(where), message); }

}  // namespace ablate
