// The gradient bucket plan (core/include/ablate/runtime/buckets.hpp) on hand-made write orders: buckets
// tile the buffer from its end, none larger than asked, each ready after the last write touching
// it, in the order they become ready.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "ablate/runtime/buckets.hpp"
#include "ablate/error.hpp"

using namespace ablate;

namespace {

// An independent check of a plan against its definition.
void check_plan(int64_t total, const std::vector<GradRange>& writes, int64_t size) {
  const std::vector<GradBucket> plan = plan_buckets(total, writes, size);
  std::vector<int> covered(static_cast<std::size_t>(total), 0);
  std::size_t prev_ready = 0;
  for (const GradBucket& b : plan) {
    REQUIRE(b.begin < b.end);
    CHECK(b.end - b.begin <= size);
    // Cut from the end: every bucket but the one at offset 0 is full, and ends on a multiple of size from the end.
    CHECK((total - b.end) % size == 0);
    if (b.begin > 0) CHECK(b.end - b.begin == size);
    for (int64_t i = b.begin; i < b.end; ++i) ++covered[std::size_t(i)];
    std::size_t want = 0;
    bool touched = false;
    for (std::size_t k = 0; k < writes.size(); ++k) {
      if (writes[k].begin < b.end && b.begin < writes[k].end) {
        want = k;
        touched = true;
      }
    }
    CHECK(b.ready_after == (touched ? want : writes.size() - 1));
    CHECK(b.ready_after >= prev_ready);
    prev_ready = b.ready_after;
  }
  for (int c : covered) CHECK(c == 1);
}

}  // namespace

TEST_CASE("buckets tile the buffer from its end and are ready after the last write touching them") {
  // A model-like order: the head first, then layers from the last to the first, embedding last.
  const std::vector<GradRange> writes = {{0, 10}, {90, 100}, {60, 90}, {30, 60}, {10, 30}, {0, 10}};
  check_plan(100, writes, 25);
  const std::vector<GradBucket> plan = plan_buckets(100, writes, 25);
  REQUIRE(plan.size() == 4);
  CHECK(plan[0].begin == 75);  // [75, 100) touched by writes 1 and 2: ready after 2
  CHECK(plan[0].ready_after == 2);
  CHECK(plan[3].begin == 0);  // [0, 25): the embedding, written by the classifier and last
  CHECK(plan[3].ready_after == 5);
  // One bucket for everything, and buckets of one element.
  check_plan(100, writes, 1000);
  check_plan(100, writes, 1);
  CHECK(plan_buckets(100, writes, 1000).size() == 1);
  CHECK(plan_buckets(0, {}, 5).empty());
}

TEST_CASE("bucket plans of random write orders match the definition") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t total = std::uniform_int_distribution<int64_t>(1, 500)(rng);
    std::vector<GradRange> writes;
    for (int k = 0; k < 12; ++k) {
      const int64_t a = std::uniform_int_distribution<int64_t>(0, total - 1)(rng);
      const int64_t b = std::uniform_int_distribution<int64_t>(a + 1, total)(rng);
      writes.push_back({a, b});
    }
    check_plan(total, writes, std::uniform_int_distribution<int64_t>(1, 120)(rng));
  }
}

TEST_CASE("a bad bucket size or a write outside the buffer is an error") {
  const std::vector<GradRange> writes = {{0, 10}};
  CHECK_THROWS_AS(plan_buckets(10, writes, 0), Error);
  const std::vector<GradRange> outside = {{5, 11}};
  CHECK_THROWS_AS(plan_buckets(10, outside, 4), Error);
}
