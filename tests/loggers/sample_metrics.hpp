// The metrics the logger tests log: a distinct value in every field (fractions that are not exact
// in binary, counts beyond 2^32), and a validation loss on even steps. `offset` shifts the losses,
// for a resumed run whose steps differ from the first run's.
#pragma once

#include <cstdint>

#include "ablate/metrics.hpp"

namespace ablate::test {

inline StepMetrics sample_step(int64_t step, double offset = 0) {
  StepMetrics m;
  m.step = step;
  m.loss = 4.0 - 0.37 * double(step) + offset;
  m.lr = 6e-4 * double(step) / 3.0;
  m.grad_norm = 1.0 / double(step + 2);
  m.step_ms = 123.456 + double(step);
  m.tokens = 262144;
  m.real_tokens = 200003 + step;
  m.padding_fraction = 1.0 - double(m.real_tokens) / double(m.tokens);
  m.tokens_per_s = double(m.tokens) / m.step_ms * 1000.0;
  m.real_tokens_per_s = double(m.real_tokens) / m.step_ms * 1000.0;
  m.tflops = 0.1 * double(step) + 0.7;
  m.mfu = m.tflops / 989.0;
  m.effective_mfu = m.mfu * (1.0 - m.padding_fraction);
  m.data_wait_pct = 12.5 / double(step);
  m.mem_peak_bytes = 81'000'000'123 + step;
  m.optimizer_state_bytes = 995'328'000 + step;
  if (step % 2 == 0) m.extra.push_back({"val_loss", 10.0 / 3.0 - 0.01 * double(step) + offset});
  return m;
}

}  // namespace ablate::test
