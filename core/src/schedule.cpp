// Learning-rate schedules (see schedule.hpp): the interface's home and the factory the trainer uses.
#include "ablate/schedule.hpp"

#include "ablate/runtime/config.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate {

Schedule::~Schedule() = default;

std::unique_ptr<Schedule> make_schedule(const Config& config, const Registry& registry, const RunContext& run) {
  const std::string name = config.selected("schedule");
  auto schedule = registry.create<Schedule>(Kind::schedule, name, {config.section("schedule"), config.implementation("schedule", name), run},
                                            "schedule.name");
  schedule->plan(config.section("optimizer").get_float("lr"), config.section("run").get_int("steps"));
  return schedule;
}

}  // namespace ablate
