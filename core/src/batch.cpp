// The batch contract's helpers (see batch.hpp).
#include "ablate/batch.hpp"

#include <algorithm>

namespace ablate {

void Batch::reset(int32_t b, int32_t t) {
  rows = b;
  seq_len = t;
  const std::size_t n = std::size_t(b) * std::size_t(t);
  tokens.assign(n, 0);
  targets.assign(n, -1);
  positions.assign(n, 0);
  segment_ids.assign(n, 0);
  segments.clear();
  row_segments.assign(std::size_t(b) + 1, 0);
}

int64_t Batch::real_targets() const noexcept {
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != -1; });
}

int64_t Batch::real_tokens() const noexcept {
  return std::count_if(segment_ids.begin(), segment_ids.end(), [](int32_t s) { return s != 0; });
}

double Batch::padding_fraction() const noexcept {
  const int64_t total = positions_total();
  return total == 0 ? 0.0 : 1.0 - double(real_tokens()) / double(total);
}

}  // namespace ablate
