// The one reader of the JSON and JSONL files a run or a sweep keeps (run.json, summary.json,
// metrics.jsonl, arms.json, arm.json, results.json), for `ablate report`, `ablate sweep` and
// `ablate doctor`. Each file has a schema: the fields the commands use, each with its type and
// whether it must be there; other fields are ignored. A file that is no regular file, is larger
// than its cap, nests deeper than kMaxJsonDepth, does not parse, or holds a field of the wrong
// type or range is an input error (exit 2) naming the file (and for JSONL the line), the field,
// what it holds and what was expected. A value echoed in a message is cut to about 80 bytes
// (ablate::echo_value).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/file_check.hpp"

namespace ablate::cli {

// The files ablate writes nest a few levels; deeper is a damaged or hostile file, refused before it
// is parsed (ablate::kMaxJsonDepth, ablate/file_check.hpp).
using ablate::kMaxJsonDepth;
// No string ablate writes into these files comes near this (paths, statuses, an arm's last error line).
inline constexpr std::size_t kMaxJsonString = std::size_t(64) << 10;

// What a field holds. A null in a number field is a NaN or infinity the trainer wrote (JSON has no
// spelling for them): the field counts as absent.
enum class JsonKind {
  number,        // a number (or null)
  non_negative,  // a number >= 0 (or null)
  count,         // an integer >= 0
  string,        // a string of at most kMaxJsonString bytes
  strings,       // a list of such strings
  string_map,    // an object whose values are such strings
  number_map,    // an object whose values are numbers >= 0
  rows,          // a list of objects, each of the schema JsonField::rows names
  boolean,       // true or false
  object,        // an object of the schema JsonField::rows names
  object_map,    // an object whose values are objects of the schema JsonField::rows names
};

struct JsonSchema;

struct JsonField {
  std::string_view name;
  JsonKind kind;
  bool required = false;
  const JsonSchema* rows = nullptr;  // JsonKind::rows: the schema of each element; JsonKind::object: its schema
};

struct JsonSchema {
  std::string_view what;     // what the file is, for messages ("run summary")
  std::uintmax_t max_bytes;  // the file's size cap (file_check.hpp)
  std::span<const JsonField> fields;
  // Besides `fields`, the numbers whose names begin with this (metrics.jsonl's "eval/"), kept as they are.
  std::string_view number_prefix = {};
};

extern const JsonSchema kRunJson;      // a run's run.json
extern const JsonSchema kSummaryJson;  // a run's summary.json
extern const JsonSchema kMetricsLine;  // one line of a run's metrics.jsonl
extern const JsonSchema kArmsJson;     // a sweep's arms.json
extern const JsonSchema kArmJson;      // a sweep arm's arm.json
extern const JsonSchema kResultsJson;  // a sweep's results.json

// The file's object, checked against `schema`, with only the schema's fields that are present and
// not null: every field there has its declared type, so `value(name, fallback)` is safe. A missing
// file is an input error too.
nlohmann::json read_json_file(const std::filesystem::path& path, const JsonSchema& schema);

// The same, or nullopt when nothing is at `path` (an arm that never finished has no summary.json):
// a file that is there but damaged is an input error, never taken for a missing one.
std::optional<nlohmann::json> read_json_file_if_present(const std::filesystem::path& path, const JsonSchema& schema);

// Every non-empty line of a JSONL file, each an object checked against `line` as above; messages
// name "PATH:LINE". The _if_present form gives nullopt when nothing is at `path`.
std::vector<nlohmann::json> read_jsonl_file(const std::filesystem::path& path, const JsonSchema& line);
std::optional<std::vector<nlohmann::json>> read_jsonl_file_if_present(const std::filesystem::path& path, const JsonSchema& line);

// `j` as JSON text for a file or the terminal; bytes that are not UTF-8 (a path's, say) become
// U+FFFD instead of failing.
std::string json_text(const nlohmann::json& j, int indent = -1);

}  // namespace ablate::cli
