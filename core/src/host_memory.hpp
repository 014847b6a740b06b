// The machine's physical memory in bytes (0 when the system does not say): the cpu device's
// capacity and the default memory budget of a run (device.cpp).
#pragma once

#include <cstdint>

namespace ablate {

int64_t physical_memory_bytes();

}  // namespace ablate
