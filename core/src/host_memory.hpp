// The memory this process can have, in bytes (0 when the system does not say): the machine's
// physical memory, or the process's address-space or data-segment limit (ulimit -v, -d) where that
// is lower. The cpu device's capacity and the default memory budget of a run (device.cpp).
#pragma once

#include <cstdint>

namespace ablate {

int64_t physical_memory_bytes();
// What physical_memory_bytes() is: "physical memory" or "the address-space limit (ulimit -v)" ...
const char* physical_memory_source();

}  // namespace ablate
