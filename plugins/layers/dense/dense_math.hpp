// The per-element arithmetic of the CUDA layers other than the norms, shared by their kernels
// (elementwise_kernels.cu, loss_kernels.cu) and the host check of them
// (tests/layers/test_cuda_layers_math.cpp, against cpu_layers):
//   dropout      element i kept with factor 1/(1-p) unless a uniform [0,1) draw from
//                mix64(key, i) is below p: the CPU layers' mask, bit for bit
//   gelu (tanh)  x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)   (= 0.5 x (1 + tanh u))
//   swiglu       h = silu(g) u;  dg = dh u silu'(g),  du = dh silu(g)
//   rope         (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), angle = pos theta^(-2i/D) in double
//   softmax CE   dz_c = scale * exp(z_c - lse) (minus scale at the target), lse = max + log(sum)
//   bf16         the operands of bf16 products: f32 rounded to the nearest bf16, ties to even
#pragma once

#include <cmath>
#include <cstdint>

#include "ablate/device_math.hpp"  // bf16_bits
#include "ablate/mix.hpp"          // ABLATE_HOST_DEVICE, mix64

namespace ablate::cuda_layers {

// --- bf16 -------------------------------------------------------------------------------------------

// bf16_bits (ablate/device_math.hpp): the rounding of both operands of a bf16 product.
using device_math::bf16_bits;

// --- dropout ---------------------------------------------------------------------------------------

// The factor of element `index` under inverted dropout with probability p (0 = off).
ABLATE_HOST_DEVICE inline float dropout_factor(uint64_t key, uint64_t index, double p, float scale) {
  if (!(p > 0.0)) return 1.0f;
  const double u = double(mix64(key, index) >> 11) * 0x1.0p-53;
  return u < p ? 0.0f : scale;
}

// --- gelu (tanh approximation) ----------------------------------------------------------------------

ABLATE_HOST_DEVICE inline float gelu_sigmoid(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}
ABLATE_HOST_DEVICE inline float gelu_out(float x) { return x * gelu_sigmoid(x); }
// d/dx [x s(2u)] = s + 2 x s (1 - s) u'
ABLATE_HOST_DEVICE inline float gelu_grad(float x) {
  const float s = gelu_sigmoid(x);
  return s + x * 2.0f * s * (1.0f - s) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

// --- swiglu --------------------------------------------------------------------------------------------

ABLATE_HOST_DEVICE inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
ABLATE_HOST_DEVICE inline float swiglu_out(float g, float u) { return g * sigmoid_f(g) * u; }
// Gradients of the gate and up pre-activations from the gradient dh of h = silu(g) u.
ABLATE_HOST_DEVICE inline float swiglu_dg(float g, float u, float dh) {
  const float s = sigmoid_f(g);
  return dh * u * s * (1.0f + g * (1.0f - s));
}
ABLATE_HOST_DEVICE inline float swiglu_du(float g, float dh) { return dh * g * sigmoid_f(g); }

// --- rope ------------------------------------------------------------------------------------------------

// The angle of pair i of a head of D values at position `pos` (double, as the CPU layer).
ABLATE_HOST_DEVICE inline double rope_angle(int32_t pos, int64_t i, int64_t D, double theta) {
  return double(pos) * pow(theta, -2.0 * double(i) / double(D));
}
// The rotated pair; `sign` -1 is the inverse rotation (backward). cos and sin are rounded to float
// before use, as the CPU layer rounds them to the call's dtype.
struct RopePair {
  float a, b;
};
ABLATE_HOST_DEVICE inline RopePair rope_rotate(float x1, float x2, double angle, double sign) {
  const float c = float(cos(angle)), s = float(sign * sin(angle));
  return {x1 * c - x2 * s, x2 * c + x1 * s};
}

// --- softmax cross-entropy -------------------------------------------------------------------------------

// Loss of a row from its log-sum-exp and target logit.
ABLATE_HOST_DEVICE inline float ce_loss(double lse, float z_target) { return float(lse - double(z_target)); }
// The logit gradient of column c (the target's gets `scale` subtracted by the caller).
ABLATE_HOST_DEVICE inline float ce_dz(float z, float lse, float scale) { return scale * expf(z - lse); }

}  // namespace ablate::cuda_layers
