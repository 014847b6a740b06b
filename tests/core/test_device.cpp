// The Device seam on the CPU: the cpu device's conformance (tests/support/device_suite.hpp, the
// checks every device runs), that a batch is viewed in place without a copy, the packing a
// device copies in one transfer, and the registry picking a registration by (name, run.device).
#include <doctest/doctest.h>

#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/registry.hpp"
#include "device_suite.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

std::unique_ptr<Device> cpu_device(Registry& registry) {
  static const Params empty{"run", {}};
  RunContext run;
  run.threads = 2;
  return registry.create<Device>(Kind::device, "cpu", {empty, empty, run});
}

}  // namespace

TEST_CASE("the cpu device allocates zeroed, counted buffers and copies, fills, scales and reduces like the references") {
  Registry registry;
  auto dev = cpu_device(registry);
  CHECK(dev->type() == DeviceType::cpu);
  test::check_device_buffers(*dev);
  test::check_device_loss_sum(*dev);
  test::check_device_batch(*dev);
}

TEST_CASE("on the cpu device a batch is viewed in place, without a copy") {
  Registry registry;
  auto dev = cpu_device(registry);
  const Batch b = test::sample_batch();
  DeviceBatch db;
  dev->upload_batch(b, db);
  CHECK(db.views.tokens.data == b.tokens.data());
  CHECK(db.views.targets.data == b.targets.data());
  CHECK(db.views.segments.data == static_cast<const void*>(b.segments.data()));
  CHECK(db.storage.empty());
}

TEST_CASE("a packed batch holds its six arrays one after another, and its views point into the packing") {
  const Batch b = test::sample_batch();
  std::vector<int32_t> staging;
  pack_batch(b, staging);
  REQUIRE(staging.size() == 4 * 10 + 2 * 3 + 3);
  const BatchViews v = batch_views_at(b, staging.data(), DeviceType::cpu);
  CHECK(v.tokens.as<int32_t>() == staging.data());
  CHECK(v.targets.as<int32_t>()[1] == -1);
  CHECK(v.positions.as<int32_t>()[4] == 2);
  CHECK(v.segment_ids.as<int32_t>()[9] == 0);
  CHECK(v.segments.as<int32_t>()[3] == 3);      // the second segment's length
  CHECK(v.row_segments.as<int32_t>()[2] == 3);
  CHECK(v.segments.shape[0] == 3);
  CHECK(v.segments.shape[1] == 2);
}

TEST_CASE("the registry picks a registration by (name, device) and names the devices a name serves") {
  Registry registry;
  const auto make = [](const char* device) {
    ComponentInfo info;
    info.kind = Kind::layer;
    info.name = "layernorm";
    info.version = "1.0.0";
    info.doc = std::string("layernorm on ") + device;
    info.devices = {device};
    info.factory = [](const ComponentArgs&) -> std::unique_ptr<Component> { return nullptr; };
    return info;
  };
  registry.add(make("cpu"), "cpu-layers");
  registry.add(make("cuda"), "cuda-layers");
  REQUIRE(registry.find(Kind::layer, "layernorm", "cpu") != nullptr);
  CHECK(registry.find(Kind::layer, "layernorm", "cpu")->library == "cpu-layers");
  CHECK(registry.find(Kind::layer, "layernorm", "cuda")->library == "cuda-layers");
  CHECK(registry.names(Kind::layer) == std::vector<std::string>{"layernorm"});
  // A second registration for a device already served is refused, naming the first.
  CHECK_THROWS_WITH_AS(registry.add(make("cuda"), "other"), doctest::Contains("cuda-layers"), Error);
  // A device no registration serves is an input error naming what the name serves.
  try {
    registry.get(Kind::layer, "layernorm", "rocm", "model.norm");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.what()).find("model.norm") != std::string::npos);
    CHECK(std::string(e.what()).find("cpu (cpu-layers)") != std::string::npos);
    CHECK(std::string(e.what()).find("'rocm'") != std::string::npos);
  }
  // A registration that names no device serves every device.
  ComponentInfo any = make("cpu");
  any.name = "everywhere";
  any.devices.clear();
  registry.add(any, "core");
  CHECK(registry.find(Kind::layer, "everywhere", "cuda") != nullptr);
}

TEST_CASE("core registers the cpu device") {
  Registry registry;
  const ComponentInfo* cpu = registry.find(Kind::device, "cpu", "cpu");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->library == "core");
}
