// Helpers for the tests that drive the `ablate` program end to end: the quickstart experiment and
// a tiny variant of it that trains in a second, `ablate` under a time limit, "DIR" placeholders in
// command lines, and a snapshot of a directory's files to show that a refused command wrote nothing.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "run_files.hpp"
#include "test_support.hpp"

namespace ablate::test {

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline std::string quickstart_config() { return std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml"; }

// `--set` flags that shrink the quickstart to a model and data trained in about a second.
inline const std::string kTinyRunFlags =
    " --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.max_seq_len=64"
    " --set batching.batch_size=4 --set batching.seq_len=64 --set run.threads=2 --set run.eval_batches=2"
    " --set data.synthetic_probes.documents=400 --set data.synthetic_probes.validation_documents=20";

// `ablate ARGS` under `timeout`: a hang becomes exit 124, which fails a check rather than the suite.
inline CommandResult run_ablate_within(int seconds, const std::string& args, const std::string& env = "") {
  return run_command(env + (env.empty() ? "" : " ") + "timeout " + std::to_string(seconds) + " " + std::string(ABLATE_BINARY) + " " +
                     args);
}

// `text` with every `token` replaced by `value` (a case's directory for "DIR" in a command line).
inline std::string substitute(std::string text, const std::string& token, const std::string& value) {
  for (std::size_t at = 0; (at = text.find(token, at)) != std::string::npos; at += value.size()) text.replace(at, token.size(), value);
  return text;
}

// Every regular file below `dir` with its bytes, but the `.lock` files ablate keeps (they hold the
// last holder's pid).
inline std::map<std::filesystem::path, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::filesystem::path, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != ".lock") out[e.path()] = slurp(e.path());
  }
  return out;
}

}  // namespace ablate::test
