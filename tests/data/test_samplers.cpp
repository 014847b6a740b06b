// Sampler tests: over each epoch the ranks' draws are disjoint and complete, document_at is
// deterministic, and shuffling permutes whole epochs or windows as configured.
#include <algorithm>
#include <cmath>

#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

// Every document of every epoch drawn exactly once across the ranks.
void check_disjoint_and_complete(const std::string& name, const std::string& own) {
  for (uint64_t documents : {1ull, 7ull, 64ull, 101ull}) {
    for (int world = 1; world <= 4; ++world) {
      if (documents < uint64_t(world)) continue;
      for (uint64_t epoch = 0; epoch < 3; ++epoch) {
        std::vector<int> seen(documents, 0);
        for (int rank = 0; rank < world; ++rank) {
          auto s = sampler_from(name, own);
          s->reset(documents, 42, rank, world);
          const uint64_t per_epoch = s->draws_per_epoch();
          for (uint64_t k = 0; k < per_epoch; ++k) {
            const uint64_t doc = s->document_at(epoch * per_epoch + k);
            REQUIRE(doc < documents);
            ++seen[doc];
          }
        }
        for (uint64_t d = 0; d < documents; ++d) REQUIRE(seen[d] == 1);
      }
    }
  }
}

std::vector<uint64_t> epoch_order(Sampler& s, uint64_t epoch) {
  std::vector<uint64_t> out;
  for (uint64_t k = 0; k < s.draws_per_epoch(); ++k) out.push_back(s.document_at(epoch * s.draws_per_epoch() + k));
  return out;
}

}  // namespace

TEST_CASE("sequential draws are disjoint and complete across ranks") { check_disjoint_and_complete("sequential", ""); }

TEST_CASE("shuffled draws are disjoint and complete across ranks") { check_disjoint_and_complete("shuffled", ""); }

TEST_CASE("windowed shuffled draws are disjoint and complete across ranks") { check_disjoint_and_complete("shuffled", "buffer = 5"); }

TEST_CASE("sequential draws documents in index order") {
  auto s = sampler_from("sequential");
  s->reset(5, 1, 0, 1);
  CHECK(epoch_order(*s, 0) == std::vector<uint64_t>{0, 1, 2, 3, 4});
  CHECK(epoch_order(*s, 1) == std::vector<uint64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("shuffled order is deterministic in the seed and changes with the epoch") {
  auto a = sampler_from("shuffled");
  auto b = sampler_from("shuffled");
  auto c = sampler_from("shuffled");
  a->reset(1000, 7, 0, 1);
  b->reset(1000, 7, 0, 1);
  c->reset(1000, 8, 0, 1);
  CHECK(epoch_order(*a, 0) == epoch_order(*b, 0));
  CHECK(a->document_at(12345) == b->document_at(12345));
  CHECK(epoch_order(*a, 0) != epoch_order(*c, 0));
  CHECK(epoch_order(*a, 0) != epoch_order(*a, 1));
  std::vector<uint64_t> identity(1000);
  for (uint64_t i = 0; i < 1000; ++i) identity[i] = i;
  CHECK(epoch_order(*a, 0) != identity);
}

TEST_CASE("windowed shuffling permutes within consecutive windows") {
  auto s = sampler_from("shuffled", "buffer = 10");
  s->reset(35, 3, 0, 1);
  const auto order = epoch_order(*s, 0);
  for (std::size_t k = 0; k < order.size(); ++k) CHECK(order[k] / 10 == k / 10);
}

TEST_CASE("a split with fewer documents than ranks is an input error") {
  auto s = sampler_from("sequential");
  CHECK_THROWS_AS(s->reset(2, 1, 0, 4), Error);
}

// --- mixture -------------------------------------------------------------------------------------

namespace {

// Groups of 300, 20 and 80 documents (consecutive), as a data source reports them.
const std::vector<DocumentGroup> kGroups = {{"web", 0, 300}, {"code", 300, 20}, {"books", 320, 80}};

std::size_t group_of(uint64_t doc) { return doc < 300 ? 0 : doc < 320 ? 1 : 2; }

std::unique_ptr<Sampler> mixture(const std::string& weights, int rank = 0, int world = 1) {
  auto s = sampler_from("mixture", "weights = " + weights);
  s->set_groups(kGroups);
  s->reset(400, 7, rank, world);
  return s;
}

}  // namespace

TEST_CASE("mixture draws each group within one draw of its weighted share over every prefix, across ranks") {
  const std::vector<double> share = {0.5, 0.3, 0.2};
  for (int world : {1, 3}) {
    INFO("world " << world);
    // The global sequence: position p is rank p % world's draw p / world.
    std::vector<std::unique_ptr<Sampler>> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(mixture("[5.0, 3.0, 2.0]", r, world));
    std::vector<uint64_t> taken(3, 0);
    std::vector<std::vector<int>> seen(3);
    for (uint64_t p = 0; p < 6000; ++p) {
      const uint64_t doc = ranks[p % uint64_t(world)]->document_at(p / uint64_t(world));
      REQUIRE(doc < 400);
      ++taken[group_of(doc)];
      for (std::size_t g = 0; g < 3; ++g) {
        const double want = double(p + 1) * share[g];
        if (std::abs(double(taken[g]) - want) >= 1.0) {
          FAIL("after " << p + 1 << " draws group " << g << " has " << taken[g] << ", its share is " << want);
        }
      }
    }
  }
}

TEST_CASE("mixture visits every document of a group once per group epoch, in a seeded order, and resumes anywhere") {
  auto a = mixture("[0.5, 0.3, 0.2]");
  std::vector<uint64_t> draws;
  for (uint64_t d = 0; d < 3000; ++d) draws.push_back(a->document_at(d));
  // Group "code" (20 documents, 30% of draws): its first 20 draws are a permutation of its
  // documents, the next 20 another one.
  std::vector<uint64_t> code;
  for (uint64_t doc : draws) {
    if (group_of(doc) == 1) code.push_back(doc);
  }
  REQUIRE(code.size() >= 40);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<uint64_t> e(code.begin() + epoch * 20, code.begin() + epoch * 20 + 20);
    std::sort(e.begin(), e.end());
    for (uint64_t i = 0; i < 20; ++i) CHECK(e[i] == 300 + i);
  }
  CHECK(std::vector<uint64_t>(code.begin(), code.begin() + 20) != std::vector<uint64_t>(code.begin() + 20, code.begin() + 40));
  // A fresh sampler asked at random points (a resumed cursor, backwards too) gives the same draws.
  auto b = mixture("[0.5, 0.3, 0.2]");
  for (uint64_t d : {2999ull, 17ull, 4096ull - 1, 4096ull, 0ull, 1234ull, 2500ull}) {
    if (d < draws.size()) CHECK(b->document_at(d) == draws[d]);
  }
  CHECK(b->document_at(9000) == a->document_at(9000));
}

TEST_CASE("mixture refuses weights that do not match the data's groups, naming the key and the groups") {
  for (const char* weights : {"[1.0, 1.0]", "[0.0, 0.0, 0.0]"}) {
    INFO(weights);
    try {
      mixture(weights);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      CHECK(std::string(e.what()).find("sampler.mixture.weights") != std::string::npos);
      CHECK(std::string(e.what()).find("code (20)") != std::string::npos);
    }
  }
  // A group with weight but no document in the split.
  auto s = sampler_from("mixture", "weights = [1.0, 1.0]");
  s->set_groups({{"train", 0, 10}, {"empty", 10, 0}});
  CHECK_THROWS_AS(s->reset(10, 1, 0, 1), Error);
}
