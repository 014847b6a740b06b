// Learning-rate schedules (see schedule.hpp): the interface's home and the factory the trainer uses.
#include "ablate/schedule.hpp"

#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate {

Schedule::~Schedule() = default;

std::unique_ptr<Schedule> make_schedule(const RunSpec& spec, const Registry& registry, const RunContext& run) {
  const Choice& c = spec.require(spec.schedule);
  auto schedule = registry.create<Schedule>(Kind::schedule, c.name, {c.common, c.own, run}, "schedule.name");
  schedule->plan(spec.lr, spec.run.steps);
  return schedule;
}

}  // namespace ablate
