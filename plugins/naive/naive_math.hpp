// The per-element arithmetic of `naive_cuda`, shared by its kernels (attention_kernels.cu) and the
// host check of them (tests/attention/test_naive_cuda_math.cpp, against naive_cpu):
//   which keys a query sees   keys [segment start, i] of its own segment (causal, block-diagonal for
//                             packed rows); a padding position (no segment) sees none
//   softmax                   p_j = exp(s_j - m) / sum_k exp(s_k - m) over the keys seen, m their max;
//                             the row's log-sum-exp lse = m + log(sum) is kept for backward
//   softmax backward          dS_ij = P_ij (dP_ij - D_i),  D_i = sum_d dO_id O_id
#pragma once

#include <cmath>
#include <cstdint>

#include "ablate/mix.hpp"  // ABLATE_HOST_DEVICE

namespace ablate::naive_cuda {

// The keys query i sees: [lo, hi] inclusive, empty (lo > hi) for a padding position, whose
// segment start is -1.
struct KeyRange {
  int64_t lo, hi;
};
ABLATE_HOST_DEVICE inline KeyRange key_range(int32_t segment_start, int64_t i) {
  return segment_start < 0 ? KeyRange{0, -1} : KeyRange{int64_t(segment_start), i};
}

// The probability of a key from its score and the row's max and sum of exp(s - max).
ABLATE_HOST_DEVICE inline float softmax_p(float s, float max, float sum) { return expf(s - max) / sum; }

// The same from the row's log-sum-exp (backward recomputes P this way).
ABLATE_HOST_DEVICE inline float softmax_p_lse(float s, float lse) { return expf(s - lse); }

ABLATE_HOST_DEVICE inline float row_lse(float max, float sum) { return max + logf(sum); }

// dS of one score from P, dP and the row's D.
ABLATE_HOST_DEVICE inline float softmax_ds(float p, float dp, float d_row) { return p * (dp - d_row); }

}  // namespace ablate::naive_cuda
