// ablate/file_check.hpp: only a regular file (through symlinks too) of at most its kind's size is
// read; FIFOs, devices, directories, sockets and dangling symlinks are input errors naming the path
// and what it is, decided without opening it (so a FIFO never blocks the check).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "test_support.hpp"

using namespace ablate;
namespace fs = std::filesystem;

namespace {

// The input error's message, "" when there was none.
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("only a regular file within its kind's cap is read; anything else is an input error naming it and what it is") {
  test::TempDir tmp;
  const fs::path ok = tmp.write("ok.json", "{\"a\": 1}\n");
  CHECK(read_regular_file(ok, "run summary", kMaxJsonBytes) == "{\"a\": 1}\n");
  CHECK(check_regular_file(ok, "run summary", 9) == 9);  // a file at its cap is fine
  CHECK(read_regular_file(tmp.write("empty", ""), "checkpoint pointer", kMaxPointerBytes).empty());
  fs::create_symlink(ok, tmp.path() / "link.json");
  CHECK(read_regular_file(tmp.path() / "link.json", "run summary", kMaxJsonBytes) == "{\"a\": 1}\n");

  const std::string over = refusal([&] { read_regular_file(ok, "checkpoint pointer", 8); });
  CHECK(contains(over, ok.string() + ": is 9 bytes, more than the 8 bytes a checkpoint pointer may be"));
  const fs::path big = tmp.write("big.toml", std::string((4 << 20) + 1, '#'));
  CHECK(contains(refusal([&] { check_regular_file(big, "experiment file", kMaxExperimentBytes); }),
                 big.string() + ": is 4194305 bytes, more than the 4 MiB an experiment file may be"));

  const fs::path fifo = tmp.path() / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  fs::create_directory(tmp.path() / "dir");
  fs::create_symlink("/dev/zero", tmp.path() / "zero");
  fs::create_symlink(tmp.path() / "nowhere", tmp.path() / "dangling");
  const std::pair<fs::path, const char*> bad[] = {
      {fifo, "is a FIFO, not a regular file: expected an experiment file"},
      {tmp.path() / "dir", "is a directory, not a regular file: expected an experiment file"},
      {"/dev/null", "is a character device, not a regular file: expected an experiment file"},
      {tmp.path() / "zero", "is a symlink to /dev/zero, a character device, not a regular file: expected an experiment file"},
      {tmp.path() / "dangling", "is a symlink to nothing"},
      {tmp.path() / "missing", "does not exist: expected an experiment file"},
  };
  for (const auto& [path, message] : bad) {
    CAPTURE(path);
    // Each entry point refuses it (a FIFO here would block the test forever if it were opened).
    CHECK(
        contains(refusal([&] { check_regular_file(path, "experiment file", kMaxExperimentBytes); }), path.string() + ": " + message));
    CHECK(contains(refusal([&] { read_regular_file(path, "experiment file", kMaxExperimentBytes); }), message));
    CHECK(contains(refusal([&] { ::close(open_regular_file(path, "experiment file")); }), message));
  }

  // After the open: a descriptor on something else than a regular file is refused too.
  int ends[2];
  REQUIRE(::pipe(ends) == 0);
  CHECK(contains(refusal([&] { check_regular_fd(ends[0], "state.json", "checkpoint state"); }),
                 "state.json: is a FIFO, not a regular file: expected a checkpoint state"));
  ::close(ends[0]);
  ::close(ends[1]);
}

TEST_CASE("JSON is refused past kMaxJsonDepth levels before it is parsed, brackets in strings not counted") {
  const std::string at_limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  CHECK(json_too_deep_at(at_limit) == std::string_view::npos);
  CHECK(json_too_deep_at("[" + at_limit + "]") == std::size_t(kMaxJsonDepth));  // the 33rd '[' at byte 32
  // Brackets inside strings, escaped quotes included, are text.
  CHECK(json_too_deep_at("{\"a\": \"" + std::string(100, '[') + "\\\"" + std::string(100, '{') + "\"}") == std::string_view::npos);
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  CHECK(contains(refusal([&] { check_json_depth("{\n\"x\":\n" + deep, "state.json"); }),
                 "state.json: nests deeper than 32 levels (at line 3, byte 38)"));
  CHECK(refusal([&] { check_json_depth(at_limit, "state.json"); }).empty());
}

TEST_CASE("an output directory below a regular file is refused before anything is created") {
  test::TempDir tmp;
  const fs::path file = tmp.write("summary.json", "{}");
  CHECK(
      contains(refusal([&] { check_output_directory(file / "hf" / "deeper", "the export directory"); }),
               (file / "hf" / "deeper").string() + ": cannot be created: " + file.string() + " is an existing file, not a directory"));
  CHECK(!fs::exists(file.parent_path() / "hf"));
  CHECK(refusal([&] { check_output_directory(tmp.path() / "new" / "deeper", "the export directory"); }).empty());
  CHECK(refusal([&] { check_output_directory(tmp.path(), "the export directory"); }).empty());
}
