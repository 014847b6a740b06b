// The metric definitions of docs/architecture.md: names and order, FLOPs per token, the peak table.
#include <doctest/doctest.h>

#include "ablate/metrics.hpp"

using namespace ablate;

TEST_CASE("metric_values lists docs/architecture.md's metrics in order, then the extras") {
  StepMetrics m;
  m.step = 7;
  m.loss = 2.5;
  m.tokens = 4096;
  m.real_tokens = 3000;
  m.optimizer_state_bytes = 123456789012;
  m.extra.push_back({"val_loss", 2.75});
  const auto v = metric_values(m);
  const std::vector<std::string> design = {"step",
                                           "loss",
                                           "lr",
                                           "grad_norm",
                                           "step_ms",
                                           "tokens",
                                           "real_tokens",
                                           "padding_fraction",
                                           "tokens_per_s",
                                           "real_tokens_per_s",
                                           "tflops",
                                           "mfu",
                                           "effective_mfu",
                                           "data_wait_pct",
                                           "mem_peak_bytes",
                                           "optimizer_state_bytes"};
  REQUIRE(v.size() == design.size() + 1);
  for (std::size_t i = 0; i < design.size(); ++i) CHECK(v[i].first == design[i]);
  CHECK(metric_names() == design);
  CHECK(v[0].second == 7);
  CHECK(v[1].second == 2.5);
  CHECK(v[6].second == 3000);
  CHECK(v[15].second == 123456789012.0);
  CHECK(v[16] == std::pair<std::string, double>{"val_loss", 2.75});
  CHECK(metric_is_count("real_tokens"));
  CHECK_FALSE(metric_is_count("loss"));
}

TEST_CASE("model FLOPs per token: 6N + 6 L d T") {
  // GPT-2 124M at T = 1024: 6 * 124,475,904 + 6 * 12 * 768 * 1024.
  CHECK(model_flops_per_token(124475904, 12, 768, 1024) == doctest::Approx(6.0 * 124475904 + 6.0 * 12 * 768 * 1024));
}

TEST_CASE("peak TFLOP/s by the device name CUDA reports") {
  CHECK(peak_tflops_for_device("NVIDIA H100 80GB HBM3", "bf16") == doctest::Approx(989.4));
  CHECK(peak_tflops_for_device("NVIDIA H100 PCIe", "bf16") == doctest::Approx(756.5));
  CHECK(peak_tflops_for_device("NVIDIA H200", "bf16") == doctest::Approx(989.4));
  // The emulated device answers with an H100's name and says it is emulated: no peak (negative).
  CHECK(peak_tflops_for_device("NVIDIA H100 80GB HBM3 (emulated on the CPU)", "bf16") < 0.0);
  CHECK(peak_tflops_for_device("NVIDIA H100 80GB HBM3 (emulated on the CPU)", "fp32") < 0.0);
  CHECK(peak_tflops_for_device("NVIDIA A100-SXM4-80GB", "bf16") == doctest::Approx(312));
  CHECK(peak_tflops_for_device("NVIDIA A100-SXM4-80GB", "fp32") == doctest::Approx(156));
  CHECK(peak_tflops_for_device("NVIDIA A10", "bf16") == doctest::Approx(125));
  CHECK(peak_tflops_for_device("NVIDIA L4", "bf16") == doctest::Approx(121));
  CHECK(peak_tflops_for_device("NVIDIA L40S", "bf16") == doctest::Approx(362));
  CHECK(peak_tflops_for_device("Some Future Accelerator", "bf16") == 0.0);
}
