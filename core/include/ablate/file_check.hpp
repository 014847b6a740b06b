// The one way ablate reads a file it is given or finds in a run: only a regular file (a symlink to
// one included), never a FIFO (opening one for reading waits for a writer), a device (/dev/zero
// never ends), a socket or a directory, and at most a size chosen for its kind. Anything else is
// an input error (exit 2) naming the path, what it is and what was expected, before anything is
// read; nothing already saved is touched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace ablate {

// Size caps by kind of file. The files ablate writes are far smaller; a cap only stops a damaged,
// swapped or hostile file from costing a multi-GB read.
inline constexpr std::uintmax_t kMaxExperimentBytes = std::uintmax_t(4) << 20;  // experiment, sweep file (TOML)
inline constexpr std::uintmax_t kMaxRunTomlBytes = std::uintmax_t(16) << 20;    // a run's or checkpoint's config.toml
inline constexpr std::uintmax_t kMaxJsonBytes = std::uintmax_t(16) << 20;       // state.json, run/summary/arm(s)/results.json
inline constexpr std::uintmax_t kMaxPointerBytes = std::uintmax_t(4) << 10;     // checkpoints/latest (a step name)
inline constexpr std::uintmax_t kMaxTokenizerBytes = std::uintmax_t(64) << 20;  // GPT-2's files are 1-2 MB
inline constexpr std::uintmax_t kMaxLogBytes = std::uintmax_t(1) << 30;         // metrics.jsonl/.csv, an arm's train.log
// Safetensors and token shards: only the regular-file check; they are mapped or streamed, and their
// own headers are checked against the file's size.
inline constexpr std::uintmax_t kNoSizeCap = UINTMAX_MAX;

// Checks `path` without opening it (stat(2), following symlinks): an input error unless it is a
// regular file of at most `max_bytes`. `kind` names what was expected ("experiment file",
// "checkpoint state"); the messages read "PATH: is a FIFO, not a regular file: expected an
// experiment file", "PATH: is 5242890 bytes, more than the 4 MiB an experiment file may be",
// "PATH: does not exist: expected ...". Returns the file's size.
std::uintmax_t check_regular_file(const std::filesystem::path& path, std::string_view kind, std::uintmax_t max_bytes = kNoSizeCap);

// The same check on a descriptor already open on `path` (fstat(2)): the path may name something
// else than it did when it was checked. Returns the size.
std::uintmax_t check_regular_fd(int fd, const std::filesystem::path& path, std::string_view kind,
                                std::uintmax_t max_bytes = kNoSizeCap);

// Checks `path`, opens it read-only without blocking (a FIFO swapped in after the check does not
// wait for a writer) and checks the descriptor again. The caller owns (closes) the descriptor.
int open_regular_file(const std::filesystem::path& path, std::string_view kind, std::uintmax_t max_bytes = kNoSizeCap);

// The whole of a regular file of at most `max_bytes` (open_regular_file, then read; a file that
// grows past the cap while it is read is refused too).
std::string read_regular_file(const std::filesystem::path& path, std::string_view kind, std::uintmax_t max_bytes);

// Every JSON text ablate reads (its own files, a checkpoint's state, safetensors headers, tokenizer
// and Hugging Face files, a server's answers) is checked for depth before a parser sees it: the
// files ablate reads nest a few levels, and deeper is a damaged or hostile file that could exhaust
// the stack of whatever walks it (a parser, a message that prints the value). Brackets inside
// strings do not count.
inline constexpr int kMaxJsonDepth = 32;

// The byte at which `text` first nests deeper than `max_depth`, or std::string_view::npos.
std::size_t json_too_deep_at(std::string_view text, int max_depth = kMaxJsonDepth);

// An input error naming `where`, the line and the byte when `text` nests deeper than `max_depth`:
// "WHERE: nests deeper than 32 levels (at line 1, byte 32): not a file ablate can read".
void check_json_depth(std::string_view text, const std::string& where, int max_depth = kMaxJsonDepth);

// read_regular_file, then check_json_depth naming the path: the text of a JSON file, ready to parse.
std::string read_json_text(const std::filesystem::path& path, std::string_view kind, std::uintmax_t max_bytes);

// Before ablate writes or appends to `path`: nothing there, or a regular file (a symlink to one
// included). A FIFO (opening one for writing waits for a reader), a device, a socket or a
// directory is an input error naming it and `kind`.
void check_output_file(const std::filesystem::path& path, std::string_view kind);

// Before ablate writes into `dir`: nothing there (the caller creates it) or a directory (a symlink
// to one included). An existing file or anything else is an input error: "PATH: is an existing
// file, not a directory: KIND must be a directory or a path that does not exist yet" (`kind`: "the
// run directory", "the export directory").
void check_output_directory(const std::filesystem::path& dir, std::string_view kind);

}  // namespace ablate
