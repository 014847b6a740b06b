// Learning-rate schedules: linear warmup from 0, then constant, cosine or linear decay to a floor
// (min_lr_ratio * lr) at the last step. Steps count from 1, as the optimizer's do.
#pragma once

#include <cstdint>
#include <string>

namespace ablate {

class Params;

struct LrSchedule {
  enum class Shape { constant, cosine, linear };
  Shape shape = Shape::cosine;
  double peak = 0;          // optimizer.lr
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // run.steps
  double min_lr_ratio = 0.1;

  // From the resolved [schedule] section, the optimizer's lr and the run's steps.
  static LrSchedule from(const Params& schedule, double lr, int64_t total_steps);
  double at(int64_t step) const;
};

}  // namespace ablate
