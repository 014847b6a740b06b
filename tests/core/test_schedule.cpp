// The learning-rate schedules of plugins/schedules, made as the trainer makes them (Session::schedule
// from an experiment's [schedule], [optimizer] lr and [run] steps): the shapes at hand-computed
// points; constant, cosine and linear give bit for bit what ablate computed before schedules were
// plugins (the formulas of that version, kept here as the reference); wsd's stable phase, decay
// start, shapes and ends; bad keys are input errors naming them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "ablate/runtime/session.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/schedule.hpp"
#include "test_support.hpp"

namespace {

using ablate::Config;
using ablate::Registry;
using ablate::Schedule;

Registry& registry() {
  static Registry r;
  static const bool loaded = (r.load_directories({ablate::test::plugin_dir()}), true);
  (void)loaded;
  return r;
}

std::unique_ptr<Schedule> make(const std::string& schedule_toml, int64_t steps, double lr = 1e-3) {
  const std::string text =
      "[run]\nsteps = " + std::to_string(steps) + "\n[optimizer]\nlr = " + std::to_string(lr) + "\n[schedule]\n" + schedule_toml;
  const Config c = Config::parse(text, "test.toml", {}, registry());
  const ablate::RunSpec spec = ablate::RunSpec::from(c);
  return ablate::Session(spec, registry(), ablate::RunContext{}).schedule();
}

// The schedule as ablate computed it before it became a plugin kind (LrSchedule::at).
double previous(const std::string& shape, double peak, int64_t warmup, int64_t total, double min_lr_ratio, int64_t step) {
  if (warmup > 0 && step <= warmup) return peak * double(step) / double(warmup);
  if (shape == "constant") return peak;
  const double floor = peak * min_lr_ratio;
  const int64_t decay_steps = total - warmup;
  if (decay_steps <= 0) return peak;
  const double progress = std::clamp(double(step - warmup) / double(decay_steps), 0.0, 1.0);
  if (shape == "linear") return floor + (peak - floor) * (1.0 - progress);
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace

TEST_CASE("warmup rises linearly from lr/warmup at step 1 to lr at the last warmup step") {
  const auto s = make("name = \"cosine\"\nwarmup_steps = 10\nmin_lr_ratio = 0.1\n", 110);
  CHECK(s->at(1) == doctest::Approx(1e-4));
  CHECK(s->at(5) == doctest::Approx(5e-4));
  CHECK(s->at(10) == doctest::Approx(1e-3));
}

TEST_CASE("cosine decays to the floor: half way it is the mean of peak and floor") {
  const auto s = make("name = \"cosine\"\nwarmup_steps = 10\nmin_lr_ratio = 0.1\n", 110);
  CHECK(s->at(60) == doctest::Approx((1e-3 + 1e-4) / 2));
  CHECK(s->at(110) == doctest::Approx(1e-4));
  CHECK(s->at(500) == doctest::Approx(1e-4));
}

TEST_CASE("linear decays in a straight line, constant stays at the peak") {
  const auto lin = make("name = \"linear\"\nmin_lr_ratio = 0.0\n", 100);
  CHECK(lin->at(25) == doctest::Approx(7.5e-4));
  CHECK(lin->at(100) == doctest::Approx(0.0));
  const auto c = make("name = \"constant\"\nwarmup_steps = 5\n", 100);
  CHECK(c->at(3) == doctest::Approx(6e-4));
  CHECK(c->at(80) == doctest::Approx(1e-3));
}

TEST_CASE("constant, cosine and linear give the previous version's learning rates bit for bit") {
  int64_t compared = 0;
  for (const std::string shape : {"constant", "cosine", "linear"}) {
    for (const int64_t total : {1, 2, 7, 100, 150, 500}) {
      for (const int64_t warmup : {int64_t(0), int64_t(1), int64_t(10), total, total + 3}) {
        for (const double ratio : {0.0, 0.1, 0.37, 1.0}) {
          const auto s = make("name = \"" + shape + "\"\nwarmup_steps = " + std::to_string(warmup) +
                                  "\nmin_lr_ratio = " + std::to_string(ratio) + "\n",
                              total, 3e-3);
          for (int64_t step = 1; step <= total + 2; ++step) {
            INFO(shape << " total " << total << " warmup " << warmup << " ratio " << ratio << " step " << step);
            REQUIRE(s->at(step) == previous(shape, 3e-3, warmup, total, ratio, step));
            ++compared;
          }
        }
      }
    }
  }
  CHECK(compared > 10000);
}

TEST_CASE("wsd holds the peak, then decays over its last decay_fraction of the steps after warmup") {
  // 10 warmup steps, 100 after them, the last 20 of those decaying: steps 91..110.
  const auto s = make("name = \"wsd\"\nwarmup_steps = 10\nmin_lr_ratio = 0.1\n[schedule.wsd]\ndecay_fraction = 0.2\n", 110);
  CHECK(s->at(5) == doctest::Approx(5e-4));
  for (int64_t step = 10; step <= 90; ++step) CHECK(s->at(step) == 1e-3);
  CHECK(s->at(91) < 1e-3);
  CHECK(s->at(100) == doctest::Approx(1e-4 + (1e-3 - 1e-4) * 0.5));  // linear: half way at step 100
  CHECK(s->at(110) == doctest::Approx(1e-4));
  CHECK(s->at(200) == doctest::Approx(1e-4));
  const auto cosine =
      make("name = \"wsd\"\nmin_lr_ratio = 0.0\n[schedule.wsd]\ndecay_fraction = 0.5\ndecay_shape = \"cosine\"\n", 100);
  CHECK(cosine->at(50) == 1e-3);
  CHECK(cosine->at(75) == doctest::Approx(0.5e-3));
  const auto root = make("name = \"wsd\"\nmin_lr_ratio = 0.0\n[schedule.wsd]\ndecay_fraction = 0.5\ndecay_shape = \"sqrt\"\n", 100);
  CHECK(root->at(75) == doctest::Approx(1e-3 * (1.0 - std::sqrt(0.5))));
  CHECK(root->at(100) == doctest::Approx(0.0));
}

TEST_CASE("wsd decaying over every step after warmup is the linear schedule, bit for bit") {
  const auto wsd = make("name = \"wsd\"\nwarmup_steps = 7\nmin_lr_ratio = 0.05\n[schedule.wsd]\ndecay_fraction = 1.0\n", 93);
  const auto lin = make("name = \"linear\"\nwarmup_steps = 7\nmin_lr_ratio = 0.05\n", 93);
  for (int64_t step = 1; step <= 95; ++step) REQUIRE(wsd->at(step) == lin->at(step));
}

TEST_CASE("a schedule's bad keys are input errors naming them") {
  const auto refused = [](const std::string& toml, const std::string& message) {
    try {
      make(toml, 100);
      FAIL("accepted: " << toml);
    } catch (const ablate::Error& e) {
      CHECK(e.kind() == ablate::ErrorKind::input);
      CHECK_MESSAGE(std::string(e.what()).find(message) != std::string::npos, e.what());
    }
  };
  refused("name = \"cosin\"\n", "cosine");
  refused("name = \"wsd\"\n[schedule.wsd]\ndecay_fraction = 1.5\n", "decay_fraction");
  refused("name = \"wsd\"\n[schedule.wsd]\ndecay_shape = \"step\"\n", "decay_shape");
}
