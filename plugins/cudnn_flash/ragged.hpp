// The sequence metadata cuDNN's SDPA reads, computed from the batch's segment layout: one thread per
// entry on the device (ragged_kernels.cu), and the same functions on the host for the tests
// (ABLATE_HOST_DEVICE), so the kernel's arithmetic is what the CPU-side test checks.
//
// Packed rows use the ragged (THD) layout: cuDNN batch entry i is segment i of the batch (segments
// are numbered row after row), its queries, keys and values start at token r * T + start of the
// contiguous (B, T, heads, D) tensors and run for `length` tokens. A ragged offset is the element
// index of an entry's first value in a tensor, so the three tensor families get their own:
//   q, out, d_out, d_q:   token * H * D
//   k, v, d_k, d_v:       token * Hkv * D
//   softmax statistics:   token * H   (stored token-major, (B, T, H), in `saved`)
// Entries from num_segments up to the graph's bound are empty: length 0, every offset at the end of
// the data. Offset arrays hold bound + 1 values (the last one is that end). Positions outside every
// segment belong to no entry, so cuDNN never writes them; the plugin zeroes them itself.
//
// Padded rows use cuDNN's padding mask: entry r is row r, its length the length of the row's single
// segment (which starts at 0), or 0 for a row with none.
//
// Offsets are int32: supports() refuses a problem whose B * T * H * D reaches 2^31.
#pragma once

#include <cstdint>

#include "ablate/mix.hpp"

namespace ablate::cudnn_flash {

struct RaggedShape {
  int32_t rows = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

struct RaggedEntry {
  int32_t length = 0;
  int32_t q_offset = 0, kv_offset = 0, stat_offset = 0;
};

// The row holding segment s: the last r in [0, rows) with row_segments[r] <= s (rows without a
// segment have row_segments[r] == row_segments[r + 1] and are passed over).
ABLATE_HOST_DEVICE inline int32_t row_of_segment(const int32_t* row_segments, int32_t rows, int32_t s) {
  int32_t lo = 0, hi = rows;  // row_segments[lo] <= s; hi == rows or row_segments[hi] > s
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (row_segments[mid] <= s) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

ABLATE_HOST_DEVICE inline RaggedEntry entry_at_token(int64_t token, int32_t length, const RaggedShape& shape) {
  RaggedEntry e;
  e.length = length;
  e.q_offset = int32_t(token * shape.heads * shape.head_dim);
  e.kv_offset = int32_t(token * shape.kv_heads * shape.head_dim);
  e.stat_offset = int32_t(token * shape.heads);
  return e;
}

// Entry i (0 <= i <= bound) of the packed layout. `segments` is the (S, 2) array of (start, length)
// pairs, `row_segments` the (B + 1) ranges of each row's segments.
ABLATE_HOST_DEVICE inline RaggedEntry ragged_entry(int32_t i, int32_t num_segments, const int32_t* segments,
                                                   const int32_t* row_segments, const RaggedShape& shape) {
  if (i >= num_segments) return entry_at_token(int64_t(shape.rows) * shape.seq_len, 0, shape);
  const int32_t row = row_of_segment(row_segments, shape.rows, i);
  const int32_t start = segments[2 * i], length = segments[2 * i + 1];
  return entry_at_token(int64_t(row) * shape.seq_len + start, length, shape);
}

// The sequence length of row r under the padding mask.
ABLATE_HOST_DEVICE inline int32_t padded_length(int32_t row, const int32_t* segments, const int32_t* row_segments) {
  const int32_t first = row_segments[row];
  return row_segments[row + 1] > first ? segments[2 * first + 1] : 0;
}

// Host twins of the kernels: fill the arrays the device fills, entry by entry with the functions
// above. Packed: lengths[bound], offsets[bound + 1] each. Padded: lengths[rows].
inline void fill_ragged_host(int32_t num_segments, int32_t bound, const int32_t* segments, const int32_t* row_segments,
                             const RaggedShape& shape, int32_t* lengths, int32_t* q_offsets, int32_t* kv_offsets,
                             int32_t* stat_offsets) {
  for (int32_t i = 0; i <= bound; ++i) {
    const RaggedEntry e = ragged_entry(i, num_segments, segments, row_segments, shape);
    if (i < bound) lengths[i] = e.length;
    q_offsets[i] = e.q_offset;
    kv_offsets[i] = e.kv_offset;
    stat_offsets[i] = e.stat_offset;
  }
}

inline void fill_padded_host(const int32_t* segments, const int32_t* row_segments, int32_t rows, int32_t* lengths) {
  for (int32_t r = 0; r < rows; ++r) lengths[r] = padded_length(r, segments, row_segments);
}

}  // namespace ablate::cudnn_flash
