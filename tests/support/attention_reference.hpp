// The float64 reference of causal attention over a batch's segments, written densely (every
// (i, j) scored, then masked: the same non-zero segment id and j <= i; padding rows zero): what the
// attention tests and the backends' conformance suite compare against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/batch.hpp"

namespace ablate::test {

// q (B, T, H, D), k and v (B, T, Hkv, D), d_out like q.
struct Inputs {
  std::vector<double> q, k, v, d_out;
};

// Dense reference: every (i, j) scored, then masked with segment ids (same non-zero id, j <= i).
inline std::vector<double> reference_forward(const AttentionProblem& p, const Batch& batch, const std::vector<double>& q,
                                             const std::vector<double>& k, const std::vector<double>& v) {
  const int64_t B = p.batch, T = p.seq_len, H = p.heads, G = p.kv_heads, D = p.head_dim;
  std::vector<double> out(std::size_t(B * T * H * D), 0.0);
  std::vector<double> scores(std::size_t(T * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += q[std::size_t(((b * T + i) * H + h) * D + d)] * k[std::size_t(((b * T + j) * G + g) * D + d)];
          scores[std::size_t(i * T + j)] = s / std::sqrt(double(D));
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        const int32_t si = batch.segment_ids[std::size_t(b * T + i)];
        if (si == 0) continue;
        double m = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (j <= i && batch.segment_ids[std::size_t(b * T + j)] == si) m = std::max(m, scores[std::size_t(i * T + j)]);
        }
        double z = 0;
        std::vector<double> acc(std::size_t(D), 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (j > i || batch.segment_ids[std::size_t(b * T + j)] != si) continue;
          const double e = std::exp(scores[std::size_t(i * T + j)] - m);
          z += e;
          for (int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += e * v[std::size_t(((b * T + j) * G + g) * D + d)];
        }
        for (int64_t d = 0; d < D; ++d) out[std::size_t(((b * T + i) * H + h) * D + d)] = acc[std::size_t(d)] / z;
      }
    }
  }
  return out;
}

// Dense float64 reference gradients (same mask as reference_forward), for loss = sum(out * d_out).
inline void reference_backward(const AttentionProblem& p, const Batch& batch, const Inputs& in, std::vector<double>& d_q,
                               std::vector<double>& d_k, std::vector<double>& d_v) {
  const int64_t T = p.seq_len, H = p.heads, G = p.kv_heads, D = p.head_dim;
  const double scale = 1.0 / std::sqrt(double(D));
  d_q.assign(in.q.size(), 0.0);
  d_k.assign(in.k.size(), 0.0);
  d_v.assign(in.v.size(), 0.0);
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return std::size_t(((b * T + t) * H + h) * D); };
  auto ki = [&](int64_t b, int64_t t, int64_t g) { return std::size_t(((b * T + t) * G + g) * D); };
  auto dot = [&](const double* a, const double* c) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += a[d] * c[d];
    return s;
  };
  std::vector<double> prob(static_cast<std::size_t>(T)), dprob(static_cast<std::size_t>(T));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < T; ++i) {
        const int32_t si = batch.segment_ids[std::size_t(b * T + i)];
        if (si == 0) continue;
        auto sees = [&](int64_t j) { return j <= i && batch.segment_ids[std::size_t(b * T + j)] == si; };
        double m = -INFINITY, z = 0, delta = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (sees(j)) m = std::max(m, scale * dot(&in.q[qi(b, i, h)], &in.k[ki(b, j, g)]));
        }
        for (int64_t j = 0; j < T; ++j) {
          prob[std::size_t(j)] = sees(j) ? std::exp(scale * dot(&in.q[qi(b, i, h)], &in.k[ki(b, j, g)]) - m) : 0.0;
          z += prob[std::size_t(j)];
        }
        for (int64_t j = 0; j < T; ++j) {
          prob[std::size_t(j)] /= z;
          dprob[std::size_t(j)] = dot(&in.d_out[qi(b, i, h)], &in.v[ki(b, j, g)]);
          delta += prob[std::size_t(j)] * dprob[std::size_t(j)];
        }
        for (int64_t j = 0; j < T; ++j) {
          if (!sees(j)) continue;
          const double pj = prob[std::size_t(j)], ds = pj * (dprob[std::size_t(j)] - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            d_q[qi(b, i, h) + std::size_t(d)] += ds * in.k[ki(b, j, g) + std::size_t(d)];
            d_k[ki(b, j, g) + std::size_t(d)] += ds * in.q[qi(b, i, h) + std::size_t(d)];
            d_v[ki(b, j, g) + std::size_t(d)] += pj * in.d_out[qi(b, i, h) + std::size_t(d)];
          }
        }
      }
    }
  }
}

}  // namespace ablate::test
