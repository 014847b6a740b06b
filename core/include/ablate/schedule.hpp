// Learning-rate schedules: a plugin kind, chosen by [schedule] name. A schedule gives the learning
// rate of every step (counted from 1, as the optimizer's) of a run of run.steps steps that peaks
// at optimizer.lr. The shipped ones (plugins/schedules) share the common keys of [schedule]: a
// linear warmup from 0 over warmup_steps, then
//   constant   the peak
//   cosine     a cosine from the peak to the floor (min_lr_ratio x peak) at the last step
//   linear     a straight line from the peak to the floor at the last step
//   wsd        warmup-stable-decay: the peak until the last decay_fraction of the steps after
//              warmup, then linear, cosine or 1-sqrt down to the floor at the last step
#pragma once

#include <cstdint>
#include <memory>

#include "ablate/component.hpp"

namespace ablate {


class Schedule : public Component {
 public:
  ~Schedule() override;
  // Fixes the run the schedule serves: its peak learning rate and its number of steps. Called once,
  // before at().
  virtual void plan(double peak, int64_t total_steps) = 0;
  // The learning rate of step `step` (1, 2, ...; steps past total_steps keep the last step's rate).
  virtual double at(int64_t step) const = 0;
};

}  // namespace ablate
