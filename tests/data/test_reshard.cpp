// Resuming on another world size, the data side (ablate/runtime/reshard.hpp): the samplers' global
// sequences against their own document_at; merge_cursors and RankDeal against a brute-force
// enumeration of which rank owns which global position, for every pair of world sizes 1..4 and
// chains of three jobs; and whole pipelines (the three batchers, the three samplers) run by N ranks,
// then M, then K, whose documents are each placed exactly once, none skipped, pending pieces included.
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "ablate/runtime/session.hpp"
#include "ablate/error.hpp"
#include "ablate/mix.hpp"
#include "ablate/runtime/reshard.hpp"
#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

const std::vector<DocumentGroup> kTwoGroups = {{"a", 0, 150}, {"b", 150, 250}};

// The samplers of the tests, each reset for `rank` of `world` over `documents` documents.
std::unique_ptr<Sampler> sampler_kind(const std::string& kind, uint64_t documents, int rank, int world, uint64_t seed = 11) {
  std::unique_ptr<Sampler> s;
  if (kind == "mixture") {
    s = sampler_from("mixture", "weights = [0.6, 0.4]");
    s->set_groups({{"a", 0, documents / 2}, {"b", documents / 2, documents - documents / 2}});
  } else if (kind == "shuffled_window") {
    s = sampler_from("shuffled", "buffer = 5");
  } else {
    s = sampler_from(kind);
  }
  s->reset(documents, seed, rank, world);
  return s;
}

// Which rank of `world` owns global position g in the standard deal, written from the docs rather
// than from the samplers' arithmetic: the epoch samplers deal position g % documents of each epoch
// to rank position % world; mixture deals position g to rank g % world.
int owner(const std::string& kind, uint64_t documents, uint64_t g, int world) {
  if (kind == "mixture") return int(g % uint64_t(world));
  return int((g % documents) % uint64_t(world));
}

// A job's deal by enumeration: the record's leftovers [first, end) \ drawn, the j-th to rank
// j % world, then every g >= end (or >= 0 without a record) owned by the rank, in order, up to `limit`.
std::vector<std::vector<uint64_t>> brute_deal(const std::string& kind, uint64_t documents, int world,
                                              const std::optional<Reshard>& record, uint64_t limit) {
  std::vector<std::vector<uint64_t>> seq(static_cast<std::size_t>(world));
  uint64_t from = 0;
  if (record) {
    const std::set<uint64_t> drawn(record->drawn.begin(), record->drawn.end());
    uint64_t j = 0;
    for (uint64_t g = record->first; g < record->end; ++g) {
      if (drawn.count(g) == 0) seq[std::size_t(j++ % uint64_t(world))].push_back(g);
    }
    from = record->end;
  }
  for (uint64_t g = from; g < limit; ++g) seq[std::size_t(owner(kind, documents, g, world))].push_back(g);
  return seq;
}

GlobalPosition standard_of(const Sampler& s) {
  return [&s](uint64_t draw, int rank, int world) { return s.global_position(draw, rank, world); };
}

}  // namespace

TEST_CASE("every sampler's global sequence: document_at(d) is the document at global_position(d), and the ranks partition it") {
  for (const std::string kind : {"sequential", "shuffled", "shuffled_window", "mixture"}) {
    for (uint64_t documents : {4ull, 7ull, 13ull, 40ull}) {
      for (int world = 1; world <= 4; ++world) {
        CAPTURE(kind);
        CAPTURE(documents);
        CAPTURE(world);
        std::map<uint64_t, int> seen;
        const uint64_t draws = 3 * documents + 5;
        uint64_t reach = UINT64_MAX;  // the first position the slowest rank has not reached
        for (int rank = 0; rank < world; ++rank) {
          auto s = sampler_kind(kind, documents, rank, world);
          REQUIRE(s->reshardable());
          uint64_t last = 0;
          for (uint64_t d = 0; d < draws; ++d) {
            const uint64_t g = s->global_position(d, rank, world);
            if (d > 0) REQUIRE(g > last);  // increasing in the draw number
            last = g;
            REQUIRE(owner(kind, documents, g, world) == rank);
            REQUIRE(s->document_at(d) == s->document_at_global(g));
            ++seen[g];
          }
          reach = std::min(reach, s->global_position(draws, rank, world));
        }
        // Every position below it is some rank's, once.
        REQUIRE(reach > 2 * documents);
        for (uint64_t g = 0; g < reach; ++g) REQUIRE(seen[g] == 1);
        // The document at g does not depend on the world: a world of one draws g as draw g.
        auto one = sampler_kind(kind, documents, 0, 1);
        auto last_rank = sampler_kind(kind, documents, world - 1, world);
        for (uint64_t g = 0; g < reach; ++g) REQUIRE(one->document_at(g) == last_rank->document_at_global(g));
      }
    }
  }
}

TEST_CASE("nth_leftover and standard_draws_before against enumeration") {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    Reshard r;
    r.first = rng() % 50;
    r.end = r.first + rng() % 40;
    for (uint64_t g = r.first; g < r.end; ++g) {
      if (rng() % 3 == 0) r.drawn.push_back(g);
    }
    std::vector<uint64_t> left;
    for (uint64_t g = r.first; g < r.end; ++g) {
      if (!std::binary_search(r.drawn.begin(), r.drawn.end(), g)) left.push_back(g);
    }
    REQUIRE(leftover_count(r) == left.size());
    for (uint64_t j = 0; j < left.size(); ++j) REQUIRE(nth_leftover(r, j) == left[j]);
  }
  auto s = sampler_kind("sequential", 7, 0, 1);
  for (int world = 1; world <= 4; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      for (uint64_t g = 0; g < 60; ++g) {
        uint64_t before = 0;
        for (uint64_t x = 0; x < g; ++x) before += owner("sequential", 7, x, world) == rank ? 1 : 0;
        REQUIRE(standard_draws_before(standard_of(*s), rank, world, g) == before);
      }
    }
  }
}

// A chain of three jobs (worlds w0 -> w1 -> w2), each drawing an uneven number of documents per
// rank, merged at each switch: checked against the enumeration at every step.
TEST_CASE("merged cursors against brute force: every global position drawn exactly once across world-size switches, 1..4 ranks") {
  std::mt19937_64 rng(17);
  const uint64_t limit = 4000;
  int chains = 0;
  for (const std::string kind : {"sequential", "mixture"}) {
    for (uint64_t documents : {5ull, 12ull}) {
      auto sampler = sampler_kind(kind, documents, 0, 1);
      const GlobalPosition standard = standard_of(*sampler);
      for (int w0 = 1; w0 <= 4; ++w0) {
        for (int w1 = 1; w1 <= 4; ++w1) {
          for (int trial = 0; trial < 6; ++trial) {
            const int w2 = 1 + int(rng() % 4);
            CAPTURE(kind);
            CAPTURE(documents);
            CAPTURE(w0);
            CAPTURE(w1);
            CAPTURE(w2);
            CAPTURE(trial);
            ++chains;
            std::vector<int> drawn(limit, 0);  // times each global position was drawn
            std::optional<Reshard> record;
            uint64_t next_piece = 0;
            std::vector<DataCursor> cursors;
            std::multiset<uint64_t> pieces_held;  // pending pieces (by document) of the cursors
            for (int world : {w0, w1, w2}) {
              if (!cursors.empty()) {
                // The switch: merge, compare with the enumeration.
                const MergedCursors merged = merge_cursors(cursors, world, standard, "state.json");
                uint64_t first = 0;
                while (drawn[first] != 0) ++first;
                std::vector<uint64_t> above;
                for (uint64_t g = first; g < limit; ++g) {
                  if (drawn[g] != 0) above.push_back(g);
                }
                REQUIRE(merged.record.first == first);
                REQUIRE(merged.record.drawn == above);
                REQUIRE(merged.record.end == (above.empty() ? first : above.back() + 1));
                REQUIRE(merged.record.from_world == int(cursors.size()));
                // Pending pieces: rank 0's, then rank 1's, ..., the j-th to new rank j % world.
                std::vector<PendingPiece> all;
                for (const DataCursor& c : cursors) all.insert(all.end(), c.pending.begin(), c.pending.end());
                REQUIRE(merged.pending.size() == std::size_t(world));
                std::vector<std::size_t> taken(std::size_t(world), 0);
                for (std::size_t j = 0; j < all.size(); ++j) {
                  const auto& mine = merged.pending[j % std::size_t(world)];
                  REQUIRE(taken[j % std::size_t(world)] < mine.size());
                  REQUIRE(mine[taken[j % std::size_t(world)]++].document == all[j].document);
                }
                for (int r = 0; r < world; ++r) REQUIRE(taken[std::size_t(r)] == merged.pending[std::size_t(r)].size());
                record = merged.record;
                cursors.clear();
                for (int r = 0; r < world; ++r) cursors.push_back(merged.cursor(r));
              } else {
                cursors.assign(std::size_t(world), DataCursor{});
              }
              // This job draws: an uneven count per rank (packing draws more where documents are short).
              const auto seq = brute_deal(kind, documents, world, record, limit);
              const uint64_t base = rng() % 30;
              for (int r = 0; r < world; ++r) {
                const RankDeal deal(standard, r, world, record);
                const uint64_t extra = rng() % 9;
                DataCursor& c = cursors[std::size_t(r)];
                for (uint64_t d = 0; d < base + extra; ++d) {
                  const uint64_t g = deal.global_of(c.draw);
                  REQUIRE(c.draw < seq[std::size_t(r)].size());
                  REQUIRE(g == seq[std::size_t(r)][c.draw]);  // the deal is the enumeration's
                  REQUIRE(drawn[g] == 0);                     // nothing drawn twice
                  drawn[g] = 1;
                  ++c.draw;
                }
                // Some of what it drew is still pending in its batcher.
                c.pending.clear();
                for (uint64_t k = rng() % 4; k > 0; --k) c.pending.push_back({next_piece++, 0, 1});
              }
            }
          }
        }
      }
    }
  }
  CHECK(chains == 2 * 2 * 16 * 6);
}

TEST_CASE("merging refuses cursors of different records, and a record must hold increasing positions from first to below end") {
  auto s = sampler_kind("sequential", 10, 0, 1);
  std::vector<DataCursor> cursors(2);
  cursors[1].reshard = Reshard{1, 0, 0, {}};
  try {
    merge_cursors(cursors, 3, standard_of(*s), "ckpt/state.json");
    FAIL("merged");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK(std::string(e.what()).find("ckpt/state.json") != std::string::npos);
    CHECK(std::string(e.what()).find("data_cursors[1].reshard differs") != std::string::npos);
  }
  for (const Reshard& bad : {Reshard{2, 5, 4, {}}, Reshard{2, 5, 9, {4}}, Reshard{2, 5, 9, {9}}, Reshard{2, 5, 9, {6, 6}}}) {
    CHECK_THROWS_AS(check_reshard(bad, "data_cursors[0].reshard", "state.json"), Error);
  }
  check_reshard(Reshard{2, 5, 9, {5, 8}}, "data_cursors[0].reshard", "state.json");
}

namespace {

// Documents whose tokens say where they come from (data_test_support's encode_token), of lengths
// 1..40 by a hash, in two groups (mixture weighs them).
class EncodedSource final : public DataSource {
 public:
  explicit EncodedSource(uint64_t documents) : documents_(documents) {}
  int32_t vocab_size() const override { return INT32_MAX; }
  int32_t eot_token() const override { return 0; }
  uint64_t size(Split split) const override { return split == Split::train ? documents_ : 0; }
  void read(Split, uint64_t index, Document& out) const override {
    out.index = index;
    out.tokens.clear();
    for (int32_t i = 0; i < length(index); ++i) out.tokens.push_back(encode_token(index, i));
  }
  std::string describe() const override { return "encoded"; }
  std::vector<DocumentGroup> groups(Split) const override {
    return {{"a", 0, documents_ / 2}, {"b", documents_ / 2, documents_ - documents_ / 2}};
  }
  static int32_t length(uint64_t index) { return 1 + int32_t(mix64(99, index) % 40); }

 private:
  uint64_t documents_;
};

std::unique_ptr<DataPipeline> rank_pipeline(const std::shared_ptr<const DataSource>& source, const std::string& sampler,
                                            const std::string& batcher, int rank, int world, int workers) {
  std::string toml = "[sampler]\nname = \"" + sampler + "\"\n";
  if (sampler == "mixture") toml += "[sampler.mixture]\nweights = [0.6, 0.4]\n";
  toml += "[batching]\nname = \"" + batcher +
          "\"\nbatch_size = 3\nseq_len = 16\n[batching.packed]\nwindow = 5\n"
          "[batching.bucketed]\nsmallest = 4\n";
  const Config cfg = data_config(toml);
  RunContext run;
  run.seed = 5;
  run.rank = rank;
  run.world = world;
  PipelineOptions o;
  o.workers = workers;
  o.prefetch = 2;
  o.seed = 5;
  o.rank = rank;
  o.world = world;
  const RunSpec spec = ablate::RunSpec::from(cfg);
  return std::make_unique<DataPipeline>(source, ablate::Session(spec, data_registry(), run).sampler(),
                                        ablate::Session(spec, data_registry(), run).batcher(), o);
}

// Every token the batch places, as (document, offset); fails on one placed twice.
void collect(const Batch& b, std::set<std::pair<uint64_t, int32_t>>& placed) {
  for (int32_t r = 0; r < b.rows; ++r) {
    for (int32_t s = b.row_segments[std::size_t(r)]; s < b.row_segments[std::size_t(r) + 1]; ++s) {
      const Segment seg = b.segments[std::size_t(s)];
      for (int32_t i = 0; i < seg.length; ++i) {
        const int32_t t = b.tokens[std::size_t(r) * std::size_t(b.seq_len) + std::size_t(seg.start + i)];
        REQUIRE(placed.insert({token_document(t), token_offset(t)}).second);
      }
    }
  }
}

}  // namespace

TEST_CASE("pipelines of N ranks, then M, then K: every document's tokens placed or pending exactly once, none skipped") {
  const uint64_t documents = 400;  // one epoch: every draw below is a document not drawn before
  auto source = std::make_shared<const EncodedSource>(documents);
  std::mt19937_64 rng(29);
  for (const std::string sampler : {"sequential", "shuffled", "mixture"}) {
    for (const std::string batcher : {"padded", "packed", "bucketed"}) {
      for (const std::vector<int>& worlds : {std::vector<int>{2, 1, 3}, {3, 2, 4}, {1, 4, 2}, {4, 3, 1}}) {
        CAPTURE(sampler);
        CAPTURE(batcher);
        CAPTURE(worlds[0]);
        CAPTURE(worlds[1]);
        CAPTURE(worlds[2]);
        std::set<std::pair<uint64_t, int32_t>> placed;
        std::vector<DataCursor> cursors;
        for (int world : worlds) {
          std::vector<DataCursor> mine(static_cast<std::size_t>(world));
          if (!cursors.empty()) {
            auto probe = rank_pipeline(source, sampler, batcher, 0, world, 0);
            const MergedCursors merged = merge_cursors(cursors, world, standard_of(probe->sampler()), "state.json");
            for (int r = 0; r < world; ++r) mine[std::size_t(r)] = merged.cursor(r);
          }
          for (int r = 0; r < world; ++r) {
            auto p = rank_pipeline(source, sampler, batcher, r, world, r % 2 == 0 ? 0 : 2);
            p->restore(mine[std::size_t(r)]);
            const int batches = 2 + int(rng() % 5);  // the ranks stop at uneven places in their streams
            for (int b = 0; b < batches; ++b) collect(p->next().batch, placed);
            mine[std::size_t(r)] = p->cursor();
            REQUIRE(mine[std::size_t(r)].reshard.has_value() == !cursors.empty());
          }
          cursors = mine;
        }
        // What the last job holds: its pending pieces, each placed nowhere else.
        std::set<std::pair<uint64_t, int32_t>> held;
        for (const DataCursor& c : cursors) {
          for (const PendingPiece& p : c.pending) {
            for (int32_t i = p.begin; i < p.end; ++i) {
              REQUIRE(placed.count({p.document, i}) == 0);
              REQUIRE(held.insert({p.document, i}).second);
            }
          }
        }
        // Every document touched is whole: each token placed or held, once.
        std::set<uint64_t> touched;
        for (const auto& [doc, offset] : placed) touched.insert(doc);
        for (const auto& [doc, offset] : held) touched.insert(doc);
        for (uint64_t doc : touched) {
          for (int32_t i = 0; i < EncodedSource::length(doc); ++i) {
            REQUIRE(placed.count({doc, i}) + held.count({doc, i}) == 1);
          }
        }
        // None skipped: the documents touched are those of the global positions the cursors say
        // were drawn (every one below `first`, and `drawn`), read through a world of one.
        auto one = rank_pipeline(source, sampler, batcher, 0, 1, 0);
        const MergedCursors final_state = merge_cursors(cursors, 1, standard_of(one->sampler()), "state.json");
        std::set<uint64_t> expected;
        auto reader = sampler_kind(sampler, documents, 0, 1, 5);  // mixture: EncodedSource's groups
        for (uint64_t g = 0; g < final_state.record.first; ++g) expected.insert(reader->document_at_global(g));
        for (uint64_t g : final_state.record.drawn) expected.insert(reader->document_at_global(g));
        REQUIRE(expected.size() == final_state.record.first + final_state.record.drawn.size());  // no document twice in the epoch
        CHECK(touched == expected);
        CHECK(final_state.record.first > 20);
      }
    }
  }
}

namespace {

// A sampler that deals no global sequence (the Sampler defaults): every rank draws document 0.
class PlainSampler final : public Sampler {
 public:
  void reset(uint64_t, uint64_t, int, int) override {}
  uint64_t draws_per_epoch() const override { return 1; }
  uint64_t document_at(uint64_t) override { return 0; }
};

}  // namespace

TEST_CASE("a cursor merged from another world size, restored with a sampler that deals no global sequence, is an input error") {
  const Config cfg = data_config("[batching]\nname = \"padded\"\nbatch_size = 2\nseq_len = 8\n");
  RunContext run;
  PipelineOptions o;
  o.workers = 0;
  DataPipeline p(std::make_shared<const EncodedSource>(10), std::make_unique<PlainSampler>(),
                 ablate::Session(ablate::RunSpec::from(cfg), data_registry(), run).batcher(), o);
  CHECK_FALSE(p.sampler().reshardable());
  CHECK_THROWS_AS(p.sampler().global_position(0, 0, 1), Error);
  DataCursor c;
  c.reshard = Reshard{2, 4, 4, {}};
  try {
    p.restore(c);
    FAIL("restored");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK(std::string(e.what()).find("merged from a job of 2 rank(s)") != std::string::npos);
    CHECK(std::string(e.what()).find("Sampler::reshardable") != std::string::npos);
  }
  p.restore(DataCursor{});  // its own deal still works
  CHECK(p.next().batch.rows == 2);
}
