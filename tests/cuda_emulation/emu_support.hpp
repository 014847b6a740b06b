// Helpers of the emu tests: run a check under every test schedule, naming the schedule in the
// failure so it can be replayed (ABLATE_EMU_SCHEDULE=<name> ctest -R <test>).
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "ablate_emu/emu.hpp"

namespace ablate::emu_test {

template <class F>
void for_each_schedule(F&& f) {
  for (const emu::Schedule& s : emu::test_schedules()) {
    emu::ScopedSchedule scoped(s);
    const std::string name = s.name();
    INFO("schedule ", name, " (replay: ABLATE_EMU_SCHEDULE=", name, ")");
    f();
  }
}

}  // namespace ablate::emu_test

namespace ablate::emu_test {

// One line per kernel on standard output: its worst error against its reference over the test's
// cases (ctest -V shows it; docs/kernel-interpreter.md collects them).
inline void report_worst(const char* kernel, double worst_abs, double worst_rel) {
  std::printf("emu-worst-error %s abs %.3g rel %.3g\n", kernel, worst_abs, worst_rel);
}

}  // namespace ablate::emu_test
