// What the sinks that describe a run to a tracking tool (mlflow, tensorboard's hparams) read about
// it besides its metrics: the resolved config flattened to "section.key" entries, the name of the
// experiment file it was resolved from, and, for an arm of `ablate sweep`, the sweep's name, the
// arm's name and the sweep's factors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ablate/logger.hpp"

namespace ablate::loggers {

// One value of the resolved config. `text` is how the value reads: a string as it is, numbers and
// booleans as TOML writes them (3, 0.003, 10000.0, true), a list as a TOML array (["a", "b"]).
struct ConfigEntry {
  enum class Type { string, number, boolean, list };
  std::string key;  // "model.d_model", "data.synthetic_probes.seed"
  std::string text;
  Type type = Type::string;
  double number = 0;     // for numbers
  bool boolean = false;  // for booleans
};

// Every value of `config_toml` (LogContext::config_toml), tables flattened into dotted keys, in key
// order; an array of tables ([[eval]]) by each table's label: eval.<label>.<key>. An input error
// when the text is not TOML (core wrote it, so that is a damaged context).
std::vector<ConfigEntry> flatten_config(const std::string& config_toml);

// The entry for `key`, or null.
const ConfigEntry* find_entry(const std::vector<ConfigEntry>& entries, const std::string& key);

// The experiment file's name without its extension ("quickstart" for configs/quickstart.toml),
// from the "# resolved by ablate ... from <file>" line core writes at the top of the resolved
// config; empty when the text has no such line.
std::string experiment_file_name(const std::string& config_toml);

// An arm of `ablate sweep`: the run directory holds the arm.json the sweep wrote before starting
// it, and its parent the sweep's arms.json listing the arm.
struct SweepArm {
  std::string sweep;                 // arms.json "name"
  std::string arm;                   // the arm's name (its directory name)
  std::string group;                 // the arm without its repeat suffix
  int64_t repeat = 0;                // 0-based
  std::vector<std::string> factors;  // the sweep's axes: the config keys its arms vary
};

// The arm the run directory is, or nullopt for a run outside a sweep. arm.json or arms.json that is
// there but does not read as the sweep writes it is an input error naming the file and field.
std::optional<SweepArm> read_sweep_arm(const std::filesystem::path& run_dir, const std::string& run_name);

// Seconds since the Unix epoch, now.
double unix_seconds();

}  // namespace ablate::loggers
