// Learning-rate schedules (see schedule.hpp).
#include "ablate/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ablate/error.hpp"
#include "ablate/schema.hpp"

namespace ablate {

LrSchedule LrSchedule::from(const Params& schedule, double lr, int64_t total_steps) {
  LrSchedule s;
  const std::string& name = schedule.get_string("name");
  if (name == "constant") s.shape = Shape::constant;
  else if (name == "cosine") s.shape = Shape::cosine;
  else if (name == "linear") s.shape = Shape::linear;
  else throw_input_error("schedule.name", "unknown schedule '" + name + "'");
  s.peak = lr;
  s.warmup_steps = schedule.get_int("warmup_steps");
  s.total_steps = total_steps;
  s.min_lr_ratio = schedule.get_float("min_lr_ratio");
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps) return peak * double(step) / double(warmup_steps);
  if (shape == Shape::constant) return peak;
  const double floor = peak * min_lr_ratio;
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return peak;
  const double progress = std::clamp(double(step - warmup_steps) / double(decay_steps), 0.0, 1.0);
  if (shape == Shape::linear) return floor + (peak - floor) * (1.0 - progress);
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace ablate
