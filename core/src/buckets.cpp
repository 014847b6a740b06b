// The gradient bucket plan (see buckets.hpp).
#include "ablate/runtime/buckets.hpp"

#include <algorithm>
#include <string>

#include "ablate/error.hpp"

namespace ablate {

std::vector<GradBucket> plan_buckets(int64_t total, std::span<const GradRange> writes, int64_t bucket_elements) {
  if (bucket_elements <= 0) throw_runtime_error("buckets", "bucket size must be positive, got " + std::to_string(bucket_elements));
  if (total < 0) throw_runtime_error("buckets", "negative buffer size");
  std::vector<GradBucket> out;
  for (int64_t end = total; end > 0; end -= bucket_elements) out.push_back({std::max<int64_t>(0, end - bucket_elements), end, 0});
  const std::size_t last = writes.empty() ? 0 : writes.size() - 1;
  for (GradBucket& b : out) {
    bool touched = false;
    for (std::size_t i = 0; i < writes.size(); ++i) {
      const GradRange& w = writes[i];
      if (w.begin < 0 || w.end > total || w.begin > w.end) {
        throw_runtime_error("buckets", "gradient write [" + std::to_string(w.begin) + ", " + std::to_string(w.end) +
                                           ") lies outside the buffer of " + std::to_string(total));
      }
      if (w.begin < b.end && b.begin < w.end) {
        b.ready_after = std::max(b.ready_after, i);
        touched = true;
      }
    }
    if (!touched) b.ready_after = last;
  }
  std::stable_sort(out.begin(), out.end(), [](const GradBucket& a, const GradBucket& b) { return a.ready_after < b.ready_after; });
  return out;
}

}  // namespace ablate
