// A TensorView over a host vector of floats or over a device pointer, for the tests.
#pragma once

#include <cstdint>
#include <vector>

#include "ablate/tensor.hpp"

namespace ablate::test {

inline TensorView flat_view(float* data, int64_t n, DeviceType device = DeviceType::cpu) {
  TensorView t;
  t.data = data;
  t.device = device;
  t.ndim = 1;
  t.shape[0] = n;
  return t;
}

inline TensorView view(std::vector<float>& v) { return flat_view(v.data(), int64_t(v.size())); }

}  // namespace ablate::test
