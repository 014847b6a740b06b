// The cuda device (plugins/cuda_device) through the same conformance checks as the cpu device
// (tests/support/device_suite.hpp): zeroed, counted allocations, copies, fill, scale bit for bit,
// the reductions within their stated bounds, a batch's views read back. Exits 77 (CTest:
// skipped) without a CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "ablate/cuda_check.hpp"
#include "ablate/runtime/registry.hpp"
#include "device_suite.hpp"

using namespace ablate;

namespace {

std::unique_ptr<Device> cuda_device(Registry& registry) {
  static const Params empty{"run", {}};
  RunContext run;
  run.device = "cuda";
  return registry.create<Device>(Kind::device, "cuda", {empty, empty, run});
}

}  // namespace

TEST_CASE("the cuda device passes the device conformance checks") {
  Registry registry;
  registry.load_directories({ABLATE_PLUGIN_DIR});
  auto dev = cuda_device(registry);
  CHECK(dev->type() == DeviceType::cuda);
  MESSAGE("device: " << dev->describe() << ", " << dev->memory_capacity() << " bytes, bf16 peak " << dev->peak_tflops(DType::bf16)
                     << " TFLOP/s");
  test::check_device_buffers(*dev);
  test::check_device_nf4_and_copy(*dev);
  test::check_device_loss_sum(*dev);
  test::check_device_batch(*dev);
  CHECK(dev->memory_peak() >= 100003 * 4);
}

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
