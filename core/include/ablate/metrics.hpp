// One logged step's metrics, with docs/architecture.md's names and definitions, and the peak table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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
  int64_t tokens = 0;       // all B*T positions of the global batch
  int64_t real_tokens = 0;  // non-padding targets
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

// docs/architecture.md's per-step metrics in their documented order, as (name, value) pairs, followed by the
// extras. Counts (step, tokens, real_tokens, bytes) are exact in a double up to 2^53.
std::vector<std::pair<std::string, double>> metric_values(const StepMetrics& metrics);
// The names of the fixed metrics, in the same order.
const std::vector<std::string>& metric_names();
// True for the metrics that are counts (written as integers by text sinks).
bool metric_is_count(std::string_view name) noexcept;

// Dense peak TFLOP/s of a known GPU for `dtype` ("bf16"/"fp16" tensor cores, "fp32" as TF32),
// matched on the device name CUDA reports ("NVIDIA H100 80GB HBM3" is an H100 SXM); 0 when the
// device is not in the table ([metrics] peak_tflops then has to say).
// (-1 for an emulated device, whose name says "emulated": Device::peak_tflops.)
double peak_tflops_for_device(std::string_view device_name, std::string_view dtype) noexcept;

// model FLOPs per token = 6*N + 6*L*d*T (llm.c's convention; causal attention counted once).
double model_flops_per_token(int64_t parameters, int64_t layers, int64_t d_model, int64_t seq_len) noexcept;

}  // namespace ablate
