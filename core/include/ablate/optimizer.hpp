// Optimizer interface: one update over the flat parameter buffer from the flat gradient buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

class Optimizer : public Component {
 public:
  ~Optimizer() override;
  // Allocates state for the parameters described by `table` on `device`.
  virtual void init(const ParamTable& table, DeviceType device) = 0;
  // One step: params -= update(grads); `lr` is this step's learning rate, `step` counts from 1.
  virtual void step(const ParamTable& table, TensorView params, TensorView grads, double lr, int64_t step) = 0;
  virtual int64_t state_bytes() const = 0;
  // The state as named tensors, for checkpoints; load_state takes back what save_state gave.
  virtual std::vector<NamedTensor> save_state() const = 0;
  virtual void load_state(const std::vector<NamedTensor>& state) = 0;
  // Elements skipped because their gradient was not finite (0 when the optimizer never skips).
  virtual int64_t skipped_nonfinite() const { return 0; }
};

}  // namespace ablate
