// The one error type of ablate's library code. Every failure carries where it happened (a config
// file:line:col, a data file and offset, a plugin file) and whether it is bad input (exit 2) or a
// runtime failure (exit 1). Only apps/ turns errors into exit codes.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ablate {

enum class ErrorKind {
  input,    // bad config, bad data, bad usage: the user can fix it; exit code 2
  runtime,  // the run failed for another reason; exit code 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string where, const std::string& message);
  ~Error() override;

  ErrorKind kind() const noexcept { return kind_; }
  const std::string& where() const noexcept { return where_; }
  int exit_code() const noexcept { return kind_ == ErrorKind::input ? 2 : 1; }

 private:
  ErrorKind kind_;
  std::string where_;
};

// A value echoed in a message: at most `max_bytes` of it (cut at a UTF-8 character boundary), then
// "... (N bytes)" when it was longer, so a 1 MB value gives a one-line message. Control bytes
// and bytes that are not UTF-8 are written as \xNN.
std::string echo_value(std::string_view value, std::size_t max_bytes = 80);

// Every message is bounded too: one longer than kMaxMessageBytes keeps its start and end with the
// middle left out, saying how much.
inline constexpr std::size_t kMaxMessageBytes = 4096;

// Shorthands: "where" is prefixed to the message as "where: message" when it is not empty.
[[noreturn]] void throw_input_error(std::string where, const std::string& message);
[[noreturn]] void throw_runtime_error(std::string where, const std::string& message);

// Suggestions for misspellings: the candidates closest to `word` by edit distance (empty when
// none is close enough to be a plausible typo).
std::vector<std::string> closest_matches(std::string_view word, const std::vector<std::string>& candidates);
// "; did you mean 'lr'?" or "" when there is no close match.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);
// "a, b, c"
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");

}  // namespace ablate
