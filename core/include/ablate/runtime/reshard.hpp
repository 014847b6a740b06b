// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// Resuming a data-parallel checkpoint on another world size, the data side (implemented in
// core/src/data/reshard.cpp; docs/distributed.md, "Resuming on another world size"):
//   merge_cursors  the old ranks' cursors -> one Reshard record (what was drawn) and each new rank's
//                  share of the pending pieces;
//   RankDeal       a rank's draws under a record: its leftovers, then its world's standard deal.
// A sampler's draws are read as global positions (Sampler::global_position): every rank's draws are
// an increasing subsequence of one global sequence, so what a job has drawn is "every position
// below F, and a few above it" whatever the world size that drew it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ablate/data.hpp"

namespace ablate {

// A sampler's standard deal: the global position of draw `draw` of rank `rank` of `world` ranks.
using GlobalPosition = std::function<uint64_t(uint64_t draw, int rank, int world)>;

// The leftovers of a record: the positions of [first, end) not in `drawn`, in increasing order.
uint64_t leftover_count(const Reshard& record) noexcept;
// The j-th leftover (j < leftover_count).
uint64_t nth_leftover(const Reshard& record, uint64_t j);

// How many draws `rank` of `world` makes in the standard deal before global position `g` (the
// number of its first draw at or after g).
uint64_t standard_draws_before(const GlobalPosition& standard, int rank, int world, uint64_t g);

// The draws of rank `rank` of `world`: without a record the standard deal; with one, the leftovers
// j = rank, rank + world, rank + 2 world, ... first, then the standard deal from record.end on.
// Either way the global positions increase with the draw number.
class RankDeal {
 public:
  RankDeal(GlobalPosition standard, int rank, int world, std::optional<Reshard> record);
  const std::optional<Reshard>& record() const noexcept { return record_; }
  // This rank's leftover draws (0 without a record).
  uint64_t leftovers() const noexcept { return leftovers_; }
  // The global position of draw `draw`.
  uint64_t global_of(uint64_t draw) const;
  // For draw < leftovers(): its global position (a leftover of the record).
  uint64_t leftover_global(uint64_t draw) const;
  // For draw >= leftovers(): its draw number in the standard deal.
  uint64_t standard_draw(uint64_t draw) const noexcept { return before_end_ + (draw - leftovers_); }

 private:
  GlobalPosition standard_;
  int rank_ = 0, world_ = 1;
  std::optional<Reshard> record_;
  uint64_t leftovers_ = 0;   // this rank's share of the record's leftovers
  uint64_t before_end_ = 0;  // the standard deal's draws of this rank before record.end
};

struct MergedCursors {
  Reshard record;
  std::vector<std::vector<PendingPiece>> pending;  // per new rank, in the order dealt
  // Rank `rank`'s cursor: draw 0 under the record, its pending pieces.
  DataCursor cursor(int rank) const;
};

// Merges the cursors of a job of cursors.size() ranks (each the same record or none) for a job of
// `world` ranks. F is the smallest global position some old rank had not drawn yet, `drawn` the
// positions at or above F that were drawn, end = the position after the last of them (F when none).
// The old ranks' pending pieces, rank 0's first in its order, then rank 1's, ..., are dealt round-
// robin: the j-th to new rank j % world. Input errors (cursors of different records, more drawn
// positions above F than any job leaves) name `where`.
MergedCursors merge_cursors(const std::vector<DataCursor>& cursors, int world, const GlobalPosition& standard,
                            const std::string& where);

// A record as read from a checkpoint: `drawn` increasing inside [first, end), first <= end; an input
// error naming `name` in `where` otherwise.
void check_reshard(const Reshard& record, const std::string& name, const std::string& where);

// The most positions a record's `drawn` may hold (a damaged checkpoint would otherwise claim memory).
inline constexpr std::size_t kMaxReshardDrawn = std::size_t(1) << 24;

}  // namespace ablate
