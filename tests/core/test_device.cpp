// The Device seam on the CPU: the cpu device's conformance (tests/support/device_suite.hpp, the
// checks every device runs), that a batch is viewed in place without a copy, the packing a
// device copies in one transfer, the registry picking a registration by (name, run.device), and
// device_math::bf16_bits against the definition of rounding to the nearest bf16 (the conformance
// suite then holds every device's to_bf16 to it).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/registry.hpp"
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
  test::check_device_nf4_and_copy(*dev);
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
  CHECK(v.segments.as<int32_t>()[3] == 3);  // the second segment's length
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

TEST_CASE("a device's identity is its name, interned: the built-in two and any plugin's") {
  CHECK(DeviceType::named("cpu") == DeviceType::cpu);
  CHECK(DeviceType::named("cuda") == DeviceType::cuda);
  CHECK(DeviceType{} == DeviceType::cpu);
  const DeviceType rocm = DeviceType::named("rocm_test_device");
  CHECK(rocm != DeviceType::cpu);
  CHECK(rocm != DeviceType::cuda);
  CHECK(DeviceType::named("rocm_test_device") == rocm);
  CHECK(DeviceType::named("another_test_device") != rocm);
  CHECK(std::string(rocm.name()) == "rocm_test_device");
  CHECK(std::string(to_string(DeviceType::cuda)) == "cuda");
  TensorView v;
  v.device = rocm;
  CHECK(v.device == DeviceType::named("rocm_test_device"));
}

TEST_CASE("core registers the cpu device") {
  Registry registry;
  const ComponentInfo* cpu = registry.find(Kind::device, "cpu", "cpu");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->library == "core");
}

// --- bf16_bits: the rounding of the bf16 weight copy (Device::to_bf16) and of bf16 products' operands

namespace {

// The bf16 nearest to x by the definition, in double: the two bf16 values around |x| (7 mantissa
// bits below the leading one; spacing 2^-133 below 2^-126), the nearer one, on a tie the one with
// an even last mantissa bit; 2^128 and beyond is infinity.
float bf16_reference(float x) {
  if (x == 0.0f || std::isinf(x)) return x;
  const double a = std::fabs(double(x));
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): the leading one is 2^(e-1)
  const double ulp = std::ldexp(1.0, std::max(e - 1, -126) - 7);
  const double steps = std::floor(a / ulp);
  const double lo = steps * ulp, hi = lo + ulp;
  double r = (a - lo < hi - a) ? lo : (hi - a < a - lo) ? hi : (std::fmod(steps, 2.0) == 0.0 ? lo : hi);
  if (r >= std::ldexp(1.0, 128)) r = HUGE_VAL;
  return float(std::copysign(r, double(x)));
}

uint16_t bits_of(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

}  // namespace

TEST_CASE("bf16_bits rounds f32 to the nearest bf16, ties to even, over every exponent, and NaN stays a quiet NaN") {
  std::mt19937_64 rng(7);
  std::vector<float> xs = {1.0f,
                           -1.0f,
                           1.00390625f /* 1 + 2^-8: a tie, to even (1) */,
                           1.01171875f /* 1 + 3*2^-8: to 1 + 2^-6 */,
                           3.3895313892515355e38f /* bf16's largest */,
                           3.4028234663852886e38f /* f32's largest: to inf */,
                           1e-45f /* the smallest subnormal */,
                           1.1754942e-38f,
                           -0.0f,
                           INFINITY,
                           -INFINITY,
                           65504.0f,
                           0.1f};
  for (int i = 0; i < 200000; ++i) {
    const auto u = uint32_t(rng());
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isnan(f)) xs.push_back(f);
  }
  int64_t wrong = 0;
  for (float x : xs) {
    const uint16_t got = device_math::bf16_bits(x);
    const uint16_t want = bits_of(bf16_reference(x));
    if (got != want && ++wrong <= 5) FAIL_CHECK("x = " << x << ": bits " << got << ", the nearest bf16 has " << want);
  }
  CHECK(wrong == 0);
  CHECK(device_math::bf16_bits(1.00390625f) == 0x3F80);
  CHECK(device_math::bf16_bits(1.01171875f) == 0x3F82);
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7F80FFFFu}) {
    float f;
    std::memcpy(&f, &nan, 4);
    const uint16_t b = device_math::bf16_bits(f);
    CHECK((b & 0x7F80) == 0x7F80);  // exponent all ones
    CHECK((b & 0x007F) != 0);       // a NaN, not an infinity (0x7F800001 would round to one)
    CHECK((b >> 15) == (nan >> 31));
  }
}

TEST_CASE("bf16_value gives back every bf16 exactly, and store_value writes f32 as it is and bf16 as bf16_bits rounds") {
  // Every one of the 65536 bit patterns: the f32 whose high half it is (NaNs stay NaN, same sign).
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float v = device_math::bf16_value(uint16_t(b));
    uint32_t u = 0;
    std::memcpy(&u, &v, 4);
    REQUIRE(u == b << 16);
    if (!std::isnan(v)) REQUIRE(device_math::bf16_bits(v) == b);  // exact values round to themselves
  }
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 1000; ++i) {
    const float x = normal(rng);
    float f = 0.0f;
    uint16_t h = 0;
    device_math::store_value(&f, x);
    device_math::store_value(&h, x);
    CHECK(f == x);
    CHECK(device_math::bf16_value(h) == bf16_reference(x));
  }
}
