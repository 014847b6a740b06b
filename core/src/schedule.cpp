// Learning-rate schedules (see schedule.hpp): the interface's home and the factory the trainer uses.
#include "ablate/schedule.hpp"

#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate {

Schedule::~Schedule() = default;

}  // namespace ablate
