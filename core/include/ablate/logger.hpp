// The logger interface: a sink of the trainer's per-step metrics (plugins/loggers: console, jsonl,
// csv, tensorboard), opened once with where the run starts, told every logged step, closed once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/metrics.hpp"

namespace ablate {

// What a logger is told when a run starts. A resumed run starts at `start_step` > 0: a sink that
// appends to files of the run directory drops what it holds after that step, so the continued
// run's record is the uninterrupted one's.
struct LogContext {
  std::string run_dir;
  std::string config_toml;  // the resolved experiment
  std::string run_name;     // the run directory's last component
  int64_t start_step = 0;   // 0 for a new run
  int64_t total_steps = 0;
  int64_t log_every = 1;
  // The extras the run will log besides val_loss and elapsed_s: its evaluations' metrics,
  // eval/<label>/<metric> (a sink with fixed columns gives each one).
  std::vector<std::string> extra_metrics;
};

class Logger : public Component {
 public:
  ~Logger() override;
  // Called once before the first step.
  virtual void open(const LogContext& context) = 0;
  // Called for each logged step, in step order.
  virtual void log(const StepMetrics& metrics) = 0;
  // Called once at the end of the run (also when it stops early or fails): flush and release.
  virtual void close() = 0;
};

}  // namespace ablate
