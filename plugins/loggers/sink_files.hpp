// What the file-writing sinks share: creating the run directory, keeping only the complete lines
// of a file a crash may have cut short, rewriting a file atomically (temp file + rename) when a
// resumed run drops what came after its checkpoint, and appending with errors that name the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ablate/atomic_file.hpp"
#include "ablate/logger.hpp"
#include "ablate/metrics.hpp"
#include "ablate/schema.hpp"

namespace ablate::loggers {

namespace fs = std::filesystem;

// The full key path of one of a sink's own keys, e.g. "logging.csv.extra_columns".
std::string key_path(const Params& own, std::string_view key);

// Creates `dir` and its parents when missing. An input error naming the directory when it cannot
// be created or is not a directory.
void ensure_directory(const fs::path& dir);

// The lines of `file` that end in '\n' (without it); a last line without one was cut short by a
// crash and is left out. A missing file has no lines; one that is not a regular file of at most
// kMaxLogBytes (ablate/file_check.hpp) is an input error.
std::vector<std::string> read_complete_lines(const fs::path& file);

// Rewriting a file: core's write_file_atomic (ablate/atomic_file.hpp).

// Opens `file` to append to it (or emptied first when `truncate`); an input error naming the file
// when it cannot be opened for writing.
std::ofstream open_for_append(const fs::path& file, bool truncate);

// Flushes and throws a runtime error naming the file when a write failed (disk full, I/O error).
void flush_checked(std::ofstream& out, const fs::path& file);

// A number as text sinks write it: counts as integers, other values in the shortest form that
// reads back to the same double ("0.1", "3.0000000000000004", "1e-05"); "nan", "inf", "-inf".
std::string format_number(double value, bool count);

// The value of an extra metric ("val_loss") when the step carries one.
std::optional<double> find_extra(const StepMetrics& metrics, std::string_view name);

}  // namespace ablate::loggers
