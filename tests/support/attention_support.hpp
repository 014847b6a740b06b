// Batches for the attention tests: rows of (start, length) segments made into a Batch (ids,
// positions, tokens and targets filled as the batchers fill them), and random packed rows with
// segments of length 1 and padding tails.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/batch.hpp"

namespace ablate::test {

// One row's segments as (start, length) pairs; positions outside them are padding.
using RowLayout = std::vector<std::pair<int32_t, int32_t>>;

inline Batch make_batch(int32_t seq_len, const std::vector<RowLayout>& rows) {
  Batch batch;
  batch.reset(int32_t(rows.size()), seq_len);
  batch.segments.clear();
  batch.row_segments.assign(1, 0);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    int32_t id = 0;
    for (auto [start, length] : rows[r]) {
      ++id;
      batch.segments.push_back({start, length});
      for (int32_t t = start; t < start + length; ++t) {
        const std::size_t at = r * std::size_t(seq_len) + std::size_t(t);
        batch.segment_ids[at] = id;
        batch.positions[at] = t - start;
        batch.tokens[at] = 1 + t;
        batch.targets[at] = 1;
      }
    }
    batch.row_segments.push_back(int32_t(batch.segments.size()));
  }
  return batch;
}

// Rows' segments as the kernels read them: (start, length) int32 pairs, row after row, taken as
// given (segments no batcher makes included, which make_batch would not take); never empty, so a
// device copy of it exists.
inline std::vector<int32_t> flat_segments(const std::vector<RowLayout>& rows) {
  std::vector<int32_t> s;
  for (const RowLayout& row : rows) {
    for (auto [start, length] : row) {
      s.push_back(start);
      s.push_back(length);
    }
  }
  if (s.empty()) s.push_back(0);
  return s;
}

// (rows + 1): the segments of row r are [offsets[r], offsets[r + 1]) of flat_segments' pairs.
inline std::vector<int32_t> row_offsets(const std::vector<RowLayout>& rows) {
  std::vector<int32_t> o{0};
  for (const RowLayout& row : rows) o.push_back(o.back() + int32_t(row.size()));
  return o;
}

// Packs random segment lengths (some of length 1) back to back, leaving a random tail as padding.
inline RowLayout random_packed_row(int32_t seq_len, std::mt19937& rng) {
  RowLayout row;
  int32_t at = 0;
  std::uniform_int_distribution<int32_t> len(1, std::max(1, seq_len / 3));
  std::bernoulli_distribution one(0.25);
  while (at < seq_len) {
    int32_t n = one(rng) ? 1 : len(rng);
    n = std::min(n, seq_len - at);
    if (at > 0 && std::bernoulli_distribution(0.15)(rng)) break;  // padding tail
    row.push_back({at, n});
    at += n;
  }
  return row;
}

// max |a - b| over max |b|: an error relative to the reference's largest value (an infinite result
// when `a` holds anything not finite, e.g. a poisoned output never written).
inline double scaled_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

// Whether every value at the batch's padding positions (segment id 0) is exactly zero, for a
// (B, T, ...) tensor of `per_position` values a position: the attention contract's padding rule.
inline bool zero_at_padding(const std::vector<float>& x, const Batch& batch, int64_t per_position) {
  for (std::size_t at = 0; at < batch.segment_ids.size(); ++at) {
    if (batch.segment_ids[at] != 0) continue;
    for (int64_t j = 0; j < per_position; ++j) {
      if (x[at * std::size_t(per_position) + std::size_t(j)] != 0.0f) return false;
    }
  }
  return true;
}

// One forward or backward of `a` as the model calls it (an AttentionCall), from the tensors in the
// order the tests name them; `stream`: the device's queue (null on the cpu).
inline AttentionCall attention_call(const AttentionProblem& p, const BatchViews& batch, TensorView q, TensorView k, TensorView v,
                                    TensorView out, TensorView saved, Stream stream) {
  return AttentionCall{&p, &batch, q, k, v, out, saved, {}, {}, {}, {}, stream};
}
inline void attention_forward(Attention& a, const AttentionProblem& p, const BatchViews& batch, TensorView q, TensorView k,
                              TensorView v, TensorView out, TensorView saved, Stream stream = nullptr) {
  a.forward(attention_call(p, batch, q, k, v, out, saved, stream));
}
inline void attention_backward(Attention& a, const AttentionProblem& p, const BatchViews& batch, TensorView q, TensorView k,
                               TensorView v, TensorView out, TensorView saved, TensorView d_out, TensorView d_q, TensorView d_k,
                               TensorView d_v, Stream stream = nullptr) {
  AttentionCall c = attention_call(p, batch, q, k, v, out, saved, stream);
  c.d_out = d_out;
  c.d_q = d_q;
  c.d_k = d_k;
  c.d_v = d_v;
  a.backward(c);
}

}  // namespace ablate::test
