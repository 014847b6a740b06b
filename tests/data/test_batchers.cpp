// Batcher tests: the batch contract under random document lengths (every token placed exactly once,
// or dropped exactly as truncation says; rows within T; segment ids, positions and targets right),
// and hand-checked first_fit / best_fit placements.
#include <random>

#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

constexpr int32_t kEot = 7;

std::string batching_toml(const std::string& name, int32_t b, int32_t t, bool append_eot, const std::string& policy,
                          const std::string& own = "") {
  return "[batching]\nname = \"" + name + "\"\nbatch_size = " + std::to_string(b) + "\nseq_len = " + std::to_string(t) +
         "\nappend_eot = " + (append_eot ? "true" : "false") + "\nlong_documents = \"" + policy + "\"\n" +
         (own.empty() ? "" : "[batching." + name + "]\n" + own + "\n");
}

std::vector<int32_t> random_lengths(uint32_t seed, int count, int32_t max_length) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> length(1, max_length);
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) out.push_back(length(rng));
  return out;
}

// Runs `batches` batches and checks the contract and that every token of every drawn document is
// placed once or held pending, except what truncation drops.
void check_conservation(const std::string& name, bool append_eot, const std::string& policy, const std::string& own = "") {
  constexpr int32_t kRows = 6, kT = 48;
  auto batcher = batcher_from(batching_toml(name, kRows, kT, append_eot, policy, own));
  EncodedFeed feed(random_lengths(17, 97, 2 * kT + 20), kEot);
  std::set<std::pair<uint64_t, int32_t>> placed;
  Batch batch;
  for (int i = 0; i < 25; ++i) {
    batcher->next(feed, batch);
    check_batch(batch, kT, append_eot ? kEot : -1, feed, placed);
  }
  for (const PendingPiece& p : batcher->pending()) {
    for (int32_t o = p.begin; o < p.end; ++o) REQUIRE(placed.insert({p.document, o}).second);
  }
  for (uint64_t d = 0; d < feed.draws(); ++d) {
    const int32_t kept = policy == "split" ? feed.length(d) : std::min(feed.length(d), kT);
    for (int32_t o = 0; o < kept; ++o) REQUIRE(placed.count({d, o}) == 1);
  }
  std::size_t expected = 0;
  for (uint64_t d = 0; d < feed.draws(); ++d)
    expected += std::size_t(policy == "split" ? feed.length(d) : std::min(feed.length(d), kT));
  CHECK(placed.size() == expected);
}

std::vector<std::vector<uint64_t>> row_documents(const Batch& b) {
  std::vector<std::vector<uint64_t>> rows(std::size_t(b.rows));
  for (int32_t r = 0; r < b.rows; ++r) {
    for (int32_t s = b.row_segments[r]; s < b.row_segments[r + 1]; ++s) {
      rows[std::size_t(r)].push_back(
          token_document(b.tokens[std::size_t(r) * std::size_t(b.seq_len) + std::size_t(b.segments[std::size_t(s)].start)]));
    }
  }
  return rows;
}

}  // namespace

TEST_CASE("padded places every token once when splitting long documents") { check_conservation("padded", true, "split"); }

TEST_CASE("padded drops exactly the tokens past seq_len when truncating") { check_conservation("padded", false, "truncate"); }

TEST_CASE("padded puts one document piece per row") {
  auto batcher = batcher_from(batching_toml("padded", 4, 32, true, "split"));
  EncodedFeed feed(random_lengths(3, 31, 80), kEot);
  Batch batch;
  for (int i = 0; i < 10; ++i) {
    batcher->next(feed, batch);
    CHECK(batch.rows == 4);
    CHECK(batch.seq_len == 32);
    for (int32_t r = 0; r < batch.rows; ++r) CHECK(batch.row_segments[r + 1] - batch.row_segments[r] == 1);
  }
}

TEST_CASE("bucketed places every token once with geometric buckets") { check_conservation("bucketed", true, "split", "smallest = 8"); }

TEST_CASE("bucketed drops exactly the truncated tokens with explicit boundaries and a token budget") {
  check_conservation("bucketed", false, "truncate", "boundaries = [10, 20]\ntoken_budget = 200");
}

TEST_CASE("bucketed pads each batch only to its bucket's bound") {
  auto batcher = batcher_from(batching_toml("bucketed", 4, 64, true, "split", "boundaries = [16, 32]\ntoken_budget = 128"));
  EncodedFeed feed(random_lengths(5, 53, 64), kEot);
  Batch batch;
  std::set<int32_t> bounds_seen;
  for (int i = 0; i < 30; ++i) {
    batcher->next(feed, batch);
    bounds_seen.insert(batch.seq_len);
    const int32_t lower = batch.seq_len == 16 ? 0 : batch.seq_len / 2;
    CHECK(batch.rows == 128 / batch.seq_len);
    for (const Segment& s : batch.segments) {
      CHECK(s.length <= batch.seq_len);
      CHECK(s.length > lower);
    }
  }
  CHECK(bounds_seen == std::set<int32_t>{16, 32, 64});
}

TEST_CASE("packed first_fit places every token once") {
  check_conservation("packed", true, "split", "strategy = \"first_fit\"\nwindow = 8");
}

TEST_CASE("packed best_fit places every token once") {
  check_conservation("packed", false, "split", "strategy = \"best_fit\"\nwindow = 16\nmax_segments_per_row = 3");
}

TEST_CASE("packed drops exactly the truncated tokens") {
  check_conservation("packed", true, "truncate", "strategy = \"best_fit\"\nwindow = 5");
}

TEST_CASE("packed first_fit places pieces in arrival order into the first row that fits") {
  // Lengths 5, 4, 6, 5 (repeating), two rows of 10, a window of 4. Pass 1: 5 -> row 0, 4 -> row 0
  // (1 left), 6 -> row 1 (4 left), 5 (doc 3) fits nowhere. The window is refilled with docs 4, 5, 6
  // (5, 4, 6). Pass 2: doc 5 (4) -> row 1 (full). Pass 3 (doc 7 added) places nothing: docs 3, 4,
  // 6, 7 wait for the next batch, in arrival order.
  auto batcher = batcher_from(batching_toml("packed", 2, 10, true, "split", "strategy = \"first_fit\"\nwindow = 4"));
  EncodedFeed feed({5, 4, 6, 5}, kEot);
  Batch batch;
  batcher->next(feed, batch);
  CHECK(row_documents(batch) == std::vector<std::vector<uint64_t>>{{0, 1}, {2, 5}});
  CHECK(batch.real_tokens() == 19);
  std::vector<uint64_t> waiting;
  for (const PendingPiece& p : batcher->pending()) waiting.push_back(p.document);
  CHECK(waiting == std::vector<uint64_t>{3, 4, 6, 7});
}

TEST_CASE("packed best_fit places the longest piece first into the tightest row") {
  // The same window, longest first: 6 -> row 0, 5 (doc 0) -> row 1, 5 (doc 3) -> row 1 (the only
  // row it fits), 4 -> row 0: both rows full.
  auto batcher = batcher_from(batching_toml("packed", 2, 10, true, "split", "strategy = \"best_fit\"\nwindow = 4"));
  EncodedFeed feed({5, 4, 6, 5}, kEot);
  Batch batch;
  batcher->next(feed, batch);
  CHECK(row_documents(batch) == std::vector<std::vector<uint64_t>>{{2, 1}, {0, 3}});
  CHECK(batch.real_tokens() == 20);
  CHECK(batch.padding_fraction() == 0.0);
}

TEST_CASE("packed respects max_segments_per_row") {
  auto batcher = batcher_from(batching_toml("packed", 2, 100, true, "split", "max_segments_per_row = 3\nwindow = 10"));
  EncodedFeed feed({10}, kEot);
  Batch batch;
  batcher->next(feed, batch);
  CHECK(batch.row_segments == std::vector<int32_t>{0, 3, 6});
}

TEST_CASE("the last token of a document targets eot only when append_eot is set") {
  for (bool append : {true, false}) {
    auto batcher = batcher_from(batching_toml("packed", 1, 10, append, "split", "strategy = \"first_fit\"\nwindow = 2"));
    EncodedFeed feed({3, 4}, kEot);
    Batch batch;
    batcher->next(feed, batch);
    CHECK(batch.targets[2] == (append ? kEot : -1));
    CHECK(batch.targets[6] == (append ? kEot : -1));
    CHECK(batch.positions[3] == 0);
  }
}

TEST_CASE("a split piece's last token targets the document's next token") {
  auto batcher = batcher_from(batching_toml("padded", 2, 4, true, "split"));
  EncodedFeed feed({6}, kEot);
  Batch batch;
  batcher->next(feed, batch);
  CHECK(batch.targets[3] == encode_token(0, 4));  // row 0 holds offsets 0..3; offset 4 continues in row 1
  CHECK(batch.tokens[4] == encode_token(0, 4));
  CHECK(batch.targets[5] == kEot);
}
