// Optimizer interface: one update over the flat parameter buffer from the flat gradient buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

// What one step needs besides the buffers.
struct StepArgs {
  double lr = 0.0;                           // this step's learning rate
  int64_t step = 0;                          // counts from 1
  float grad_scale = 1.0f;                   // the gradient used is grads * grad_scale, one fp32 multiply per element
                                             // (norm clipping, applied in the update's pass rather than a pass of its own)
  Stream stream;                             // the model's device queue (Device::stream()), null on the CPU
  void* params_bf16 = nullptr;               // given only to an optimizer that writes_bf16(): the bf16 copy of the
                                             // parameters (same offsets as params, on the same device), which the
                                             // step writes from each new value (device_math::bf16_bits) in its pass
  const float* grad_scale_device = nullptr;  // given only to an optimizer that reads_device_scale(): the
                                             // factor as one float on the device, which the step reads
                                             // there (the clip factor the device formed without the
                                             // host waiting for the norm); grad_scale is then unused
};

class Optimizer : public Component {
 public:
  ~Optimizer() override;
  // Allocates state for the parameters described by `table` on `device`.
  virtual void init(const ParamTable& table, DeviceType device) = 0;
  // One step: params -= update(grads * grad_scale). On a device it is enqueued on args.stream and
  // returns without waiting for it.
  virtual void step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) = 0;
  // Whether step() writes StepArgs::params_bf16 (a model whose bf16 products read a copy of the
  // parameters then skips its own conversion pass after the step).
  virtual bool writes_bf16() const { return false; }
  // Whether step() reads StepArgs::grad_scale_device (the step then needs no host value that
  // depends on the gradients, and the engine does not wait for the backward pass to form it).
  virtual bool reads_device_scale() const { return false; }
  // A captured step (run.cuda_graph, Device::begin_capture) replays the device work step()
  // enqueued without calling step() again. An optimizer that can be captured passes its kernels
  // nothing by value that changes from step to step: under capture (its stream capturing) step()
  // has them read what the step's values (the learning rate, the step count's bias corrections)
  // give from device memory, copied there from pinned host memory by a captured copy, and
  // restage(args) rewrites that host memory for the step about to be replayed (the engine calls it
  // in place of step(); the previous replay has finished by then).
  virtual bool capturable() const { return false; }
  virtual void restage(const StepArgs& args) { (void)args; }
  // The same with grad_scale 1 on the default queue.
  void step(const ParamTable& table, TensorView params, TensorView grads, double lr, int64_t step_number) {
    step(table, params, grads, StepArgs{lr, step_number, 1.0f, nullptr});
  }
  virtual int64_t state_bytes() const = 0;
  // The state as named tensors, for checkpoints; load_state takes back what save_state gave.
  virtual std::vector<NamedTensor> save_state() const = 0;
  virtual void load_state(const std::vector<NamedTensor>& state) = 0;
  // Elements skipped in the last step because their gradient was not finite (0 when the optimizer
  // never skips). On a device this waits for the step.
  virtual int64_t skipped_nonfinite() const { return 0; }
};

}  // namespace ablate
