// Learning-rate schedules at hand-computed points: warmup, cosine and linear decay to the floor.
#include <doctest/doctest.h>

#include "ablate/schedule.hpp"
#include "ablate/schema.hpp"

using ablate::LrSchedule;

namespace {
LrSchedule make(const char* shape, int64_t warmup, double ratio, int64_t total) {
  ablate::Params p("schedule", {{"name", std::string(shape)}, {"warmup_steps", warmup}, {"min_lr_ratio", ratio}});
  return LrSchedule::from(p, 1e-3, total);
}
}  // namespace

TEST_CASE("warmup rises linearly from lr/warmup at step 1 to lr at the last warmup step") {
  const LrSchedule s = make("cosine", 10, 0.1, 110);
  CHECK(s.at(1) == doctest::Approx(1e-4));
  CHECK(s.at(5) == doctest::Approx(5e-4));
  CHECK(s.at(10) == doctest::Approx(1e-3));
}

TEST_CASE("cosine decays to the floor: half way it is the mean of peak and floor") {
  const LrSchedule s = make("cosine", 10, 0.1, 110);
  CHECK(s.at(60) == doctest::Approx((1e-3 + 1e-4) / 2));
  CHECK(s.at(110) == doctest::Approx(1e-4));
  CHECK(s.at(500) == doctest::Approx(1e-4));
}

TEST_CASE("linear decays in a straight line, constant stays at the peak") {
  const LrSchedule lin = make("linear", 0, 0.0, 100);
  CHECK(lin.at(25) == doctest::Approx(7.5e-4));
  CHECK(lin.at(100) == doctest::Approx(0.0));
  const LrSchedule c = make("constant", 5, 0.1, 100);
  CHECK(c.at(3) == doctest::Approx(6e-4));
  CHECK(c.at(80) == doctest::Approx(1e-3));
}
