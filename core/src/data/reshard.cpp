// Resuming on another world size, the data side (see ablate/runtime/reshard.hpp).
#include "ablate/runtime/reshard.hpp"

#include <algorithm>
#include <limits>

#include "ablate/error.hpp"

namespace ablate {

uint64_t leftover_count(const Reshard& record) noexcept {
  return record.end - record.first - std::min<uint64_t>(record.drawn.size(), record.end - record.first);
}

uint64_t nth_leftover(const Reshard& record, uint64_t j) {
  if (j >= leftover_count(record)) {
    throw_runtime_error("reshard", "leftover " + std::to_string(j) + " of " + std::to_string(leftover_count(record)));
  }
  // The smallest x with j + 1 leftovers in [first, x]: (x - first + 1) - (drawn positions <= x).
  const auto leftovers_through = [&](uint64_t x) {
    const auto drawn = uint64_t(std::upper_bound(record.drawn.begin(), record.drawn.end(), x) - record.drawn.begin());
    return x - record.first + 1 - drawn;
  };
  uint64_t lo = record.first + j, hi = record.end - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (leftovers_through(mid) >= j + 1) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

uint64_t standard_draws_before(const GlobalPosition& standard, int rank, int world, uint64_t g) {
  // Draw d's position is at least d (positions increase from 0), so the answer lies in [0, g].
  uint64_t lo = 0, hi = g;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (standard(mid, rank, world) >= g) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

RankDeal::RankDeal(GlobalPosition standard, int rank, int world, std::optional<Reshard> record)
    : standard_(std::move(standard)), rank_(rank), world_(world), record_(std::move(record)) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw_runtime_error("reshard", "rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world));
  }
  if (!record_) return;
  const uint64_t total = leftover_count(*record_);
  leftovers_ = total > uint64_t(rank) ? (total - uint64_t(rank) - 1) / uint64_t(world) + 1 : 0;
  before_end_ = standard_draws_before(standard_, rank, world, record_->end);
}

uint64_t RankDeal::leftover_global(uint64_t draw) const { return nth_leftover(*record_, uint64_t(rank_) + draw * uint64_t(world_)); }

uint64_t RankDeal::global_of(uint64_t draw) const {
  if (draw < leftovers_) return leftover_global(draw);
  return standard_(record_ ? standard_draw(draw) : draw, rank_, world_);
}

DataCursor MergedCursors::cursor(int rank) const {
  DataCursor c;
  c.draw = 0;
  c.pending = pending.at(std::size_t(rank));
  c.reshard = record;
  return c;
}

namespace {

bool same_record(const std::optional<Reshard>& a, const std::optional<Reshard>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  return a->from_world == b->from_world && a->first == b->first && a->end == b->end && a->drawn == b->drawn;
}

}  // namespace

MergedCursors merge_cursors(const std::vector<DataCursor>& cursors, int world, const GlobalPosition& standard,
                            const std::string& where) {
  if (cursors.empty() || world < 1) {
    throw_runtime_error("reshard", "merging " + std::to_string(cursors.size()) + " cursors for a world of " + std::to_string(world));
  }
  const int old_world = int(cursors.size());
  for (int r = 1; r < old_world; ++r) {
    if (!same_record(cursors[std::size_t(r)].reshard, cursors[0].reshard)) {
      throw_input_error(where, "data_cursors[" + std::to_string(r) +
                                   "].reshard differs from data_cursors[0].reshard: every "
                                   "rank of a job holds the same record (the checkpoint is damaged)");
    }
  }
  std::vector<RankDeal> deals;
  uint64_t first = std::numeric_limits<uint64_t>::max();
  for (int r = 0; r < old_world; ++r) {
    deals.emplace_back(standard, r, old_world, cursors[std::size_t(r)].reshard);
    first = std::min(first, deals.back().global_of(cursors[std::size_t(r)].draw));
  }
  // What was drawn at or above F: each rank's last draws (its positions increase with the draw
  // number, so they are found walking back), and what the record says was drawn before.
  std::vector<uint64_t> drawn;
  const auto refuse_size = [&] {
    throw_input_error(where, "the data cursors have drawn more than " + std::to_string(kMaxReshardDrawn) +
                                 " positions ahead of the first one not drawn (" + std::to_string(first) +
                                 "): the checkpoint is damaged");
  };
  for (int r = 0; r < old_world; ++r) {
    for (uint64_t d = cursors[std::size_t(r)].draw; d-- > 0;) {
      const uint64_t g = deals[std::size_t(r)].global_of(d);
      if (g < first) break;
      drawn.push_back(g);
      if (drawn.size() > kMaxReshardDrawn) refuse_size();
    }
  }
  if (cursors[0].reshard) {
    for (uint64_t g : cursors[0].reshard->drawn) {
      if (g >= first) drawn.push_back(g);
    }
    if (drawn.size() > kMaxReshardDrawn) refuse_size();
  }
  std::sort(drawn.begin(), drawn.end());
  if (const auto twice = std::adjacent_find(drawn.begin(), drawn.end()); twice != drawn.end()) {
    throw_input_error(where, "the data cursors hold global position " + std::to_string(*twice) +
                                 " as drawn twice: the checkpoint is damaged");
  }
  MergedCursors out;
  out.record.from_world = old_world;
  out.record.first = first;
  out.record.end = drawn.empty() ? first : drawn.back() + 1;
  out.record.drawn = std::move(drawn);
  out.pending.resize(std::size_t(world));
  std::size_t j = 0;
  for (const DataCursor& c : cursors) {
    for (const PendingPiece& p : c.pending) out.pending[j++ % std::size_t(world)].push_back(p);
  }
  return out;
}

void check_reshard(const Reshard& record, const std::string& name, const std::string& where) {
  if (record.end < record.first) {
    throw_input_error(where, "not a valid checkpoint state: '" + name + ".end' is " + std::to_string(record.end) + ", below '" + name +
                                 ".first' (" + std::to_string(record.first) + ")");
  }
  for (std::size_t i = 0; i < record.drawn.size(); ++i) {
    const uint64_t g = record.drawn[i];
    if (g < record.first || g >= record.end || (i > 0 && g <= record.drawn[i - 1])) {
      throw_input_error(where, "not a valid checkpoint state: '" + name + ".drawn[" + std::to_string(i) + "]' is " +
                                   std::to_string(g) + ", expected increasing positions from " + std::to_string(record.first) +
                                   " to below " + std::to_string(record.end));
    }
  }
}

}  // namespace ablate
