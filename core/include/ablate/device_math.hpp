// The per-element arithmetic of the Device seam's reductions, shared by the cpu device and the
// cuda device's kernels (__host__ __device__ under nvcc), so both compute the same terms and
// differ only in the order of summation.
#pragma once

#include <cstdint>

#include "ablate/mix.hpp"  // ABLATE_HOST_DEVICE

namespace ablate::device_math {

// A term of the squared norm: the square of an fp32 gradient element, in double.
ABLATE_HOST_DEVICE inline double square_term(float g) { return double(g) * double(g); }

// A term of the masked loss sum: the position's loss when it has a target, else nothing.
ABLATE_HOST_DEVICE inline double masked_loss_term(float loss, int32_t target) { return target >= 0 ? double(loss) : 0.0; }

// Clipping: an element scaled in fp32.
ABLATE_HOST_DEVICE inline float scaled(float g, float factor) { return g * factor; }

}  // namespace ablate::device_math
