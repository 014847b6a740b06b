// One logged step's metrics, with DESIGN.md's names and definitions, and the logger interface.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ablate/component.hpp"

namespace ablate {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  int64_t tokens = 0;        // all B*T positions of the global batch
  int64_t real_tokens = 0;   // non-padding targets
  double padding_fraction = 0;
  double tokens_per_s = 0;
  double real_tokens_per_s = 0;
  double tflops = 0;         // achieved, over all positions
  double mfu = 0;            // tflops / peak
  double effective_mfu = 0;  // over real tokens only
  double data_wait_pct = 0;  // share of step time spent waiting on the data pipeline
  int64_t mem_peak_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  // Extra named values a component wants logged (e.g. "val_loss").
  std::vector<std::pair<std::string, double>> extra;
};

// model FLOPs per token = 6*N + 6*L*d*T (llm.c's convention; causal attention counted once).
double model_flops_per_token(int64_t parameters, int64_t layers, int64_t d_model, int64_t seq_len) noexcept;

class Logger : public Component {
 public:
  ~Logger() override;
  // Called once before the first step with the run directory and the resolved config text.
  virtual void open(const std::string& run_dir, const std::string& resolved_config) = 0;
  virtual void log(const StepMetrics& metrics) = 0;
  virtual void close() = 0;
};

}  // namespace ablate
