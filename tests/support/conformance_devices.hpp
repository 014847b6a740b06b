// The devices a conformance suite runs on: every device registration loaded (the cpu, cuda, any
// plugin's), each made as a run makes it. One that does not open here (no GPU) is skipped with a
// message, unless it must: the cpu always, and cuda under ABLATE_EXPECT_GPU=1 (a GPU, or the
// emulated device under ABLATE_EMULATE_CUDA=1, which CTest runs as the suites' emu/ entries).
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate::test {

inline bool expect_gpu() {
  const char* e = std::getenv("ABLATE_EXPECT_GPU");
  return e != nullptr && std::string(e) == "1";
}

// Calls f(device, its registration name) for each device that opens; returns how many did.
template <class F>
int for_each_conformance_device(const Registry& registry, F&& f) {
  static const Params empty{"run", {}};
  int opened = 0;
  for (const std::string& device_name : registry.names(Kind::device)) {
    RunContext run;
    run.device = device_name;
    std::unique_ptr<Device> device;
    std::string why;
    try {
      device = registry.create<Device>(Kind::device, device_name, {empty, empty, run});
    } catch (const Error& e) {
      why = e.what();
    }
    if (device == nullptr) {
      MESSAGE("device " << device_name << " not run here: " << why);
      const bool must_run = device_name == "cpu" || (device_name == "cuda" && expect_gpu());
      CHECK_MESSAGE(!must_run, "device " << device_name << " does not open: " << why);
      continue;
    }
    ++opened;
    f(*device, device_name);
  }
  return opened;
}

}  // namespace ablate::test
