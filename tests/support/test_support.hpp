// Helpers shared by the tests: run the `ablate` program and capture its exit code and output,
// write temporary files, and find the plugins the build made.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <sys/wait.h>

namespace ablate::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing stdout+stderr.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs `ablate ARGS` from the build tree.
inline CommandResult run_ablate(const std::string& args, const std::string& env = "") {
  return run_command(env + (env.empty() ? "" : " ") + std::string(ABLATE_BINARY) + " " + args);
}

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("ablate-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const auto p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::filesystem::path path_;
};

inline std::filesystem::path plugin_dir() { return std::filesystem::path(ABLATE_BUILD_DIR) / "bin" / "plugins"; }
inline std::filesystem::path test_plugin_dir() { return ABLATE_TEST_PLUGIN_DIR; }

// GPT-2's byte-level spelling of `bytes`, UTF-8 encoded, as encoder.json and vocab.bpe write tokens:
// the bytes that print are their own code points, the 68 others U+0100 onwards in byte order.
inline std::string gpt2_spelling(const std::string& bytes) {
  const auto prints = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
  std::string out;
  for (const char c : bytes) {
    const int b = uint8_t(c);
    int cp = b;
    if (!prints(b)) {
      cp = 256;
      for (int x = 0; x < b; ++x) cp += prints(x) ? 0 : 1;
    }
    if (cp < 0x80) {
      out += char(cp);
    } else {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

}  // namespace ablate::test
