// Sampler tests: over each epoch the ranks' draws are disjoint and complete, document_at is
// deterministic, and shuffling permutes whole epochs or windows as configured.
#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

std::unique_ptr<Sampler> sampler_from(const std::string& name, const std::string& own = "") {
  const Config cfg = data_config("[sampler]\nname = \"" + name + "\"\n" + (own.empty() ? "" : "[sampler." + name + "]\n" + own + "\n"));
  RunContext run;
  return make_sampler(cfg, data_registry(), run);
}

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

TEST_CASE("windowed shuffled draws are disjoint and complete across ranks") {
  check_disjoint_and_complete("shuffled", "buffer = 5");
}

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
