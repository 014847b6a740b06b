// The shard layout of reduce_scatter and all_gather (ablate::shard_of): ceil then floor, in rank
// order, without gaps, covering the buffer; equal shards when the size divides by the world.
#include <doctest/doctest.h>

#include <cstdint>

#include "ablate/communicator.hpp"

using ablate::Shard;
using ablate::shard_of;

TEST_CASE("shards cover the buffer in rank order without gaps, ceil sizes first") {
  for (int world = 1; world <= 9; ++world) {
    for (int64_t numel : {0, 1, 2, 3, 7, 8, 9, 10, 1000, 1001, 124475904}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const Shard s = shard_of(numel, world, r);
        CHECK(s.offset == next);
        const int64_t floor = numel / world;
        CHECK(s.count == floor + (r < numel % world ? 1 : 0));
        next += s.count;
      }
      CHECK(next == numel);
    }
  }
}

TEST_CASE("ten elements over four ranks split 3, 3, 2, 2") {
  CHECK(shard_of(10, 4, 0).offset == 0);
  CHECK(shard_of(10, 4, 1).offset == 3);
  CHECK(shard_of(10, 4, 2).offset == 6);
  CHECK(shard_of(10, 4, 3).offset == 8);
  CHECK(shard_of(10, 4, 3).count == 2);
}

TEST_CASE("fewer elements than ranks leave the last shards empty") {
  CHECK(shard_of(3, 4, 2).count == 1);
  CHECK(shard_of(3, 4, 3).count == 0);
  CHECK(shard_of(3, 4, 3).offset == 3);
}

TEST_CASE("an even split puts shard r at r * numel / world (NCCL's in-place layout)") {
  for (int r = 0; r < 8; ++r) {
    CHECK(shard_of(124475904, 8, r).offset == r * (124475904 / 8));
    CHECK(shard_of(124475904, 8, r).count == 124475904 / 8);
  }
}
