// The batch contract every batcher produces and every model and attention backend consumes.
// B rows of T positions; per position a token, a target (-1 = no loss), a position that restarts at
// 0 with every document, and a segment id (1..S within a row, 0 = padding). The segment layout
// (per row: start and length of each segment) is what attention backends mask with.
#pragma once

#include <cstdint>
#include <vector>

namespace ablate {

struct Segment {
  int32_t start = 0;   // first position in the row
  int32_t length = 0;  // number of positions
};

struct Batch {
  int32_t rows = 0;                   // B
  int32_t seq_len = 0;                // T (for bucketed batches: the bucket's bound)
  std::vector<int32_t> tokens;        // (B, T)
  std::vector<int32_t> targets;       // (B, T), -1 = no loss
  std::vector<int32_t> positions;     // (B, T), 0.. within each document, 0 on padding
  std::vector<int32_t> segment_ids;   // (B, T), 1..S per row, 0 = padding
  std::vector<Segment> segments;      // all rows' segments, row after row
  std::vector<int32_t> row_segments;  // (B + 1): segments of row r are [row_segments[r], row_segments[r+1])

  // Sets the shape and fills every position as padding (tokens 0, targets -1, ids 0), no segments.
  void reset(int32_t b, int32_t t);
  int64_t positions_total() const noexcept { return int64_t(rows) * seq_len; }
  int64_t real_targets() const noexcept;     // targets != -1
  int64_t real_tokens() const noexcept;      // segment_ids != 0
  double padding_fraction() const noexcept;  // 1 - real_tokens / (B*T)
};

}  // namespace ablate
