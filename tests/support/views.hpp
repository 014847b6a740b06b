// A TensorView over a host vector of floats, for the tests (core's flat_view makes any other).
#pragma once

#include <cstdint>
#include <vector>

#include "ablate/tensor.hpp"

namespace ablate::test {

inline TensorView view(std::vector<float>& v) { return flat_view(v.data(), DType::f32, int64_t(v.size())); }

}  // namespace ablate::test
