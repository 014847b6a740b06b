// How far a run's timings can be trusted, on planted inputs: the step-time coefficient of
// variation (over the counted steps, the first left out) and the machine load read from
// /proc/stat and /proc/self/stat texts written here, with the expected values worked by hand.
#include <doctest/doctest.h>

#include "run_metrics.hpp"

using namespace ablate;

TEST_CASE("coefficient_of_variation is the population standard deviation over the mean, none for fewer than two values") {
  // Mean 5, squared deviations 9+1+1+1+0+0+4+16 = 32, over 8: variance 4, deviation 2.
  CHECK(*coefficient_of_variation({2, 4, 4, 4, 5, 5, 7, 9}) == doctest::Approx(0.4));
  CHECK(*coefficient_of_variation({3, 3, 3}) == 0.0);
  CHECK_FALSE(coefficient_of_variation({}).has_value());
  CHECK_FALSE(coefficient_of_variation({1.5}).has_value());
  CHECK_FALSE(coefficient_of_variation({0, 0}).has_value());  // no positive mean to divide by
}

TEST_CASE("summary.json's step_time_cv covers the counted steps: the first step's warm-up is left out") {
  const PeakFlops peak{1.0, 1.0, "configured"};
  StepOutcome o;
  o.loss = 2.0;
  o.positions = 64;
  o.real_targets = 64;
  const std::vector<double> times = {100, 2, 4, 4, 4, 5, 5, 7, 9};  // seconds; the first is far off
  RunMetrics m(0, int64_t(times.size()), peak, false);
  for (std::size_t i = 0; i < times.size(); ++i) m.record(int64_t(i) + 1, 1e-3, o, times[i], 0.0, 1.0, 0, 0);
  CHECK(m.summary()["step_time_cv"].get<double>() == doctest::Approx(0.4));

  // One counted step: no spread to measure.
  RunMetrics two(0, 2, peak, false);
  two.record(1, 1e-3, o, 3.0, 0.0, 1.0, 0, 0);
  two.record(2, 1e-3, o, 1.0, 0.0, 1.0, 0, 0);
  CHECK(two.summary()["step_time_cv"].is_null());
}

TEST_CASE("parse_cpu_times reads the machine's states and this process's utime and stime") {
  // user nice system idle iowait irq softirq steal guest guest_nice: guest is inside user already.
  const std::string stat = "cpu  100 20 30 400 50 6 7 8 9 10\ncpu0 50 10 15 200 25 3 3 4 4 5\nintr 1 2 3\n";
  // A command holding spaces and parentheses; fields 14 and 15 (utime 250, stime 40) after a
  // negative tpgid.
  const std::string self = "1234 (my (odd) name) S 1 2 3 0 -1 4194304 10 0 0 0 250 40 0 0 20 0 1 0 999 0 0\n";
  const auto t = parse_cpu_times(stat, self);
  REQUIRE(t.has_value());
  CHECK(t->busy == 100 + 20 + 30 + 6 + 7);
  CHECK(t->steal == 8);
  CHECK(t->total == 163 + 400 + 50 + 8);
  CHECK(t->self == 290);

  // A kernel that writes only user, nice, system and idle.
  const auto old = parse_cpu_times("cpu 10 0 5 85\n", self);
  REQUIRE(old.has_value());
  CHECK(old->busy == 15);
  CHECK(old->total == 100);
  CHECK(old->steal == 0);

  CHECK_FALSE(parse_cpu_times("intr 1 2\n", self).has_value());
  CHECK_FALSE(parse_cpu_times("cpu 1 2\n", self).has_value());
  CHECK_FALSE(parse_cpu_times(stat, "1234 (name) S 1 2 3").has_value());
  CHECK_FALSE(parse_cpu_times(stat, "no command here").has_value());
}

TEST_CASE("machine_load is other processes' busy time plus steal over all CPU time") {
  const CpuTimes before{1000, 300, 10, 100}, after{2000, 1100, 60, 500};
  // 800 ticks busy, 400 of them the job's own: 400 others + 50 steal over 1000.
  const auto l = machine_load(before, after, after.self - before.self);
  REQUIRE(l.has_value());
  CHECK(l->load == doctest::Approx(0.45));
  CHECK(l->steal == doctest::Approx(0.05));
  // Two ranks of the job on this machine: their time is the run's, not other processes'.
  CHECK(machine_load(before, after, 800)->load == doctest::Approx(0.05));
  // Tick accounting can put the process above the machine's busy time: never a negative load.
  CHECK(machine_load(before, after, 5000)->load == doctest::Approx(0.05));
  CHECK_FALSE(machine_load(before, before, 0).has_value());  // no time passed

  // This machine's own counters, where it has them: they only grow.
  if (const auto a = read_cpu_times()) {
    volatile double sink = 0;
    for (int i = 0; i < 2000000; ++i) sink = sink + 1e-9 * i;
    const auto b = read_cpu_times();
    REQUIRE(b.has_value());
    CHECK(b->total >= a->total);
    CHECK(b->self >= a->self);
    CHECK(a->busy <= a->total);
  }
}
