// The shipped learning-rate schedules (see ablate/schedule.hpp): constant, cosine, linear and
// warmup-stable-decay. Each warms up linearly from 0 to the peak over [schedule] warmup_steps and
// decays to the floor min_lr_ratio x peak at the run's last step; wsd holds the peak until its
// decay begins. Steps count from 1.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>

#include "ablate/plugin.hpp"
#include "ablate/schedule.hpp"
#include "ablate/schema.hpp"

namespace {

// The warmup every schedule shares, and the run it was planned for.
class WarmupSchedule : public ablate::Schedule {
 public:
  explicit WarmupSchedule(const ablate::Params& common)
      : warmup_(common.get_int("warmup_steps")), min_lr_ratio_(common.get_float("min_lr_ratio")) {}
  void plan(double peak, int64_t total_steps) override {
    peak_ = peak;
    total_ = total_steps;
  }
  double at(int64_t step) const override {
    if (warmup_ > 0 && step <= warmup_) return peak_ * double(step) / double(warmup_);
    return after_warmup(step);
  }

 protected:
  virtual double after_warmup(int64_t step) const = 0;
  double floor() const { return peak_ * min_lr_ratio_; }
  // Where `step` is in the decay that runs from `start` (the peak) to total_ (the floor): 0..1.
  double progress(int64_t step, int64_t start) const { return std::clamp(double(step - start) / double(total_ - start), 0.0, 1.0); }
  int64_t warmup_ = 0, total_ = 0;
  double peak_ = 0, min_lr_ratio_ = 0;
};

class Constant final : public WarmupSchedule {
 public:
  using WarmupSchedule::WarmupSchedule;

 private:
  double after_warmup(int64_t) const override { return peak_; }
};

// Cosine (or, with `linear`, a straight line) from the peak after warmup to the floor at the last step.
class Decay final : public WarmupSchedule {
 public:
  Decay(const ablate::Params& common, bool linear) : WarmupSchedule(common), linear_(linear) {}

 private:
  double after_warmup(int64_t step) const override {
    if (total_ - warmup_ <= 0) return peak_;
    const double p = progress(step, warmup_), low = floor();
    if (linear_) return low + (peak_ - low) * (1.0 - p);
    return low + 0.5 * (peak_ - low) * (1.0 + std::cos(std::numbers::pi * p));
  }
  bool linear_;
};

// Warmup-stable-decay: the peak until the last decay_fraction of the steps after warmup, then down
// to the floor at the last step along decay_shape.
class WarmupStableDecay final : public WarmupSchedule {
 public:
  WarmupStableDecay(const ablate::Params& common, const ablate::Params& own)
      : WarmupSchedule(common), fraction_(own.get_float("decay_fraction")), shape_(own.get_string("decay_shape")) {}

 private:
  double after_warmup(int64_t step) const override {
    const int64_t after = total_ - warmup_;
    const int64_t decay_steps = std::max<int64_t>(1, int64_t(std::llround(fraction_ * double(std::max<int64_t>(0, after)))));
    const int64_t start = total_ - decay_steps;
    if (after <= 0 || step <= start) return peak_;
    const double p = progress(step, start), low = floor();
    if (shape_ == "cosine") return low + 0.5 * (peak_ - low) * (1.0 + std::cos(std::numbers::pi * p));
    if (shape_ == "sqrt") return low + (peak_ - low) * (1.0 - std::sqrt(p));
    return low + (peak_ - low) * (1.0 - p);
  }
  double fraction_;
  std::string shape_;
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  using ablate::ComponentArgs;
  using ablate::Kind;
  r.add({Kind::schedule,
         "constant",
         "1.0.0",
         "warmup, then the peak learning rate",
         {},
         [](const ComponentArgs& a) { return std::make_unique<Constant>(a.common); },
         "",
         {}});
  r.add({Kind::schedule,
         "cosine",
         "1.0.0",
         "warmup, then a cosine from the peak to min_lr_ratio x peak at the last step",
         {},
         [](const ComponentArgs& a) { return std::make_unique<Decay>(a.common, false); },
         "",
         {}});
  r.add({Kind::schedule,
         "linear",
         "1.0.0",
         "warmup, then a straight line from the peak to min_lr_ratio x peak at the last step",
         {},
         [](const ComponentArgs& a) { return std::make_unique<Decay>(a.common, true); },
         "",
         {}});
  r.add({Kind::schedule,
         "wsd",
         "1.0.0",
         "warmup-stable-decay: the peak, then a decay over the last decay_fraction of the steps",
         {
             floating("decay_fraction", 0.2, "share of the steps after warmup spent decaying (at least one step)").within(0.0, 1.0),
             string("decay_shape", "linear", "the decay from the peak to min_lr_ratio x peak").one_of({"linear", "cosine", "sqrt"}),
         },
         [](const ComponentArgs& a) { return std::make_unique<WarmupStableDecay>(a.common, a.own); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("schedules", "1.0.0", register_components)
