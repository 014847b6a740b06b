// Reading what a run directory holds, for the end-to-end tests: a file's bytes, a JSON file, the
// per-step records of metrics.jsonl.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ablate::test {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline nlohmann::json read_json(const std::filesystem::path& p) { return nlohmann::json::parse(slurp(p)); }

inline std::vector<nlohmann::json> metrics(const std::filesystem::path& run_dir) {
  std::istringstream in(slurp(run_dir / "metrics.jsonl"));
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace ablate::test
