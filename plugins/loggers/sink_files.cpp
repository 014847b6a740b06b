// Shared file handling of the logger sinks (see sink_files.hpp).
#include "sink_files.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate::loggers {

std::string key_path(const Params& own, std::string_view key) {
  return own.path().empty() ? std::string(key) : own.path() + "." + std::string(key);
}

void ensure_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_input_error(dir.string(), "cannot create the directory: " + ec.message());
  if (!fs::is_directory(dir, ec)) throw_input_error(dir.string(), "is not a directory");
}

std::vector<std::string> read_complete_lines(const fs::path& file) {
  std::vector<std::string> lines;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return lines;
  // Not a regular file, too large or unreadable: an input error, before the caller rewrites the
  // file with what it kept (which would lose the saved lines).
  const std::string s = read_regular_file(file, "metrics log", kMaxLogBytes);
  std::size_t begin = 0;
  for (std::size_t end = s.find('\n'); end != std::string::npos; end = s.find('\n', begin)) {
    lines.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

std::ofstream open_for_append(const fs::path& file, bool truncate) {
  check_output_file(file, "metrics log");  // a FIFO there would block the run on its first line
  std::ofstream out(file, std::ios::binary | (truncate ? std::ios::trunc : std::ios::app));
  if (!out) throw_input_error(file.string(), std::string("cannot open for writing: ") + std::strerror(errno));
  return out;
}

void flush_checked(std::ofstream& out, const fs::path& file) {
  out.flush();
  if (!out) throw_runtime_error(file.string(), "write failed (disk full or I/O error)");
}

std::string format_number(double value, bool count) {
  if (count && std::isfinite(value)) return std::to_string(int64_t(value));
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);  // shortest round trip
  return std::string(buf, r.ptr);
}

std::optional<double> find_extra(const StepMetrics& metrics, std::string_view name) {
  for (const auto& [k, v] : metrics.extra) {
    if (k == name) return v;
  }
  return std::nullopt;
}

}  // namespace ablate::loggers
