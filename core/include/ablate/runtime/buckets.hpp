// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// Gradient buckets: the flat gradient buffer cut into pieces that are reduced across ranks while
// the backward pass goes on, so communication hides behind the rest of the backward instead of
// following it.
//
// The parameters lie in forward order (embedding first), and the backward pass writes their
// gradients in roughly the reverse order. The buckets are cut from the end of the buffer towards
// its start, `bucket_elements` each (the first bucket, at the buffer's start, takes what is left),
// wherever that falls, mid-tensor included. A bucket is ready once the last gradient write that
// touches it is done: the plan records that write's index, and the engine reduces each bucket
// right after it (docs/distributed.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ablate {

// A range [begin, end) of the flat gradient buffer, in elements.
struct GradRange {
  int64_t begin = 0, end = 0;
};

struct GradBucket {
  int64_t begin = 0, end = 0;   // elements of the flat buffer
  std::size_t ready_after = 0;  // index of the last write (of the writes given) that touches it
};

// The buckets of a buffer of `total` elements for gradient writes made in the order of `writes`,
// in the order they become ready (ties: the bucket nearer the end first). Every element belongs to
// exactly one bucket. Elements no write touches are ready after the last write.
std::vector<GradBucket> plan_buckets(int64_t total, std::span<const GradRange> writes, int64_t bucket_elements);

}  // namespace ablate
