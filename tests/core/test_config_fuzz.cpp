// A bounded, seeded mutation fuzz of the config loader: the shipped experiment files, damaged in
// thousands of ways (bytes deleted, duplicated, replaced, lines swapped or repeated, values
// replaced by extreme numbers, strings, arrays, tables and non-UTF-8 bytes), go through
// Config::parse and ModelOptions::from with every plugin loaded. Each must either load or throw
// ablate::Error of kind input (the exit-2 path) whose message names the file; nothing else may
// escape (a std::exception from a library, a crash). Every file that loads must resolve to TOML
// that parses back to the same config (same hash). Seeded: a failure names the seed and case;
// ABLATE_FUZZ_SEED=N runs another seed.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/registry.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// Values that have broken loaders: extremes of every type TOML has, and things that are not TOML.
const char* const kValues[] = {"0",
                               "-1",
                               "1e-320",
                               "1e308",
                               "inf",
                               "-inf",
                               "nan",
                               "9223372036854775807",
                               "-9223372036854775808",
                               "18446744073709551616",
                               "2147483648",
                               "0.5",
                               "1.0e",
                               "\"\"",
                               "\"x\"",
                               "\"../../etc\"",
                               "\"\\u0000\"",
                               "[]",
                               "[1, \"a\"]",
                               "[[1], [2]]",
                               "{}",
                               "{ a = 1 }",
                               "true",
                               "1979-05-27T07:32:00Z",
                               "'''\nx'''",
                               "\xff\xfe",
                               "[",
                               "\"unterminated",
                               "0x7fffffff",
                               "0o777",
                               "1_000"};

std::string mutate(std::string text, std::mt19937_64& rng) {
  const auto pick = [&](std::size_t n) { return std::size_t(rng() % std::max<std::size_t>(n, 1)); };
  switch (rng() % 7) {
    case 0: {  // delete a run of bytes
      const std::size_t at = pick(text.size()), n = 1 + pick(12);
      text.erase(at, n);
      break;
    }
    case 1: {  // duplicate a run of bytes
      const std::size_t at = pick(text.size()), n = 1 + pick(40);
      text.insert(at, text.substr(at, n));
      break;
    }
    case 2: {  // replace a byte with any byte
      if (!text.empty()) text[pick(text.size())] = char(rng() & 0xFF);
      break;
    }
    case 3: {  // swap two lines
      auto lines = split_lines(text);
      if (lines.size() > 1) std::swap(lines[pick(lines.size())], lines[pick(lines.size())]);
      text = join_lines(lines);
      break;
    }
    case 4: {  // repeat a line (a duplicate key or section)
      auto lines = split_lines(text);
      if (!lines.empty()) {
        const std::size_t i = pick(lines.size());
        lines.insert(lines.begin() + std::ptrdiff_t(pick(lines.size())), lines[i]);
      }
      text = join_lines(lines);
      break;
    }
    default: {  // a key's value replaced
      auto lines = split_lines(text);
      std::vector<std::size_t> keyed;
      for (std::size_t i = 0; i < lines.size(); ++i) {
        if (lines[i].find(" = ") != std::string::npos && lines[i][0] != '#') keyed.push_back(i);
      }
      if (!keyed.empty()) {
        std::string& line = lines[keyed[pick(keyed.size())]];
        line = line.substr(0, line.find(" = ") + 3) + kValues[pick(std::size(kValues))];
      }
      text = join_lines(lines);
      break;
    }
  }
  return text;
}

}  // namespace

TEST_CASE(
    "mutated experiment files either load, resolving to TOML that loads back the same, or fail as input errors naming the file") {
  Registry registry;
  registry.load_directories({test::plugin_dir()});
  const std::filesystem::path configs = std::filesystem::path(ABLATE_SOURCE_DIR) / "configs";
  // ABLATE_FUZZ_SEED explores other mutations (CI keeps the fixed one).
  const char* env_seed = std::getenv("ABLATE_FUZZ_SEED");
  const uint64_t seed = env_seed != nullptr ? std::strtoull(env_seed, nullptr, 10) : 20261123;
  std::mt19937_64 rng(seed);
  int64_t loaded = 0, refused = 0;
  for (const char* name : {"quickstart.toml", "gpt2-124m.toml", "llama-style.toml", "shakespeare-gpt2.toml"}) {
    const std::string original = read_file(configs / name);
    REQUIRE(!original.empty());
    for (int i = 0; i < 2500; ++i) {
      std::string text = original;
      const int rounds = 1 + int(rng() % 3);
      for (int r = 0; r < rounds; ++r) text = mutate(text, rng);
      const std::string source = std::string("fuzz-") + name;
      INFO("seed " << seed << ", " << name << " case " << i << ":\n" << text);
      try {
        const Config cfg = Config::parse(text, source, {}, registry, configs);
        (void)ModelOptions::from(ablate::RunSpec::from(cfg), 0);
        const Config again = Config::parse(cfg.to_toml(), "resolved.toml", {}, registry, configs);
        CHECK(again.hash() == cfg.hash());
        ++loaded;
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::input);
        const std::string what = e.what();
        if (what.find(source) == std::string::npos && what.find("model") == std::string::npos &&
            what.find("run.") == std::string::npos) {
          FAIL_CHECK("the message names neither the file nor a key: " << what);
        }
        ++refused;
      } catch (const std::exception& e) {
        FAIL_CHECK("a non-input exception escaped: " << e.what());
      }
    }
  }
  MESSAGE(loaded << " mutated files loaded, " << refused << " refused as input errors");
  CHECK(loaded > 100);   // the fuzz reaches past the parser
  CHECK(refused > 100);  // and its mutations do break things
}
