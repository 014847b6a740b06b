// Pipeline tests: prefetched batches equal unthreaded ones, next_into hands batches over without a
// copy, a restored cursor continues exactly
// where an uninterrupted stream goes, errors in a worker reach the consumer, destruction in the
// middle of a stream does not hang, and the statistics count what happened.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "ablate/runtime/session.hpp"
#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

std::string experiment(const std::string& batcher, int workers, const std::string& sampler = "shuffled") {
  return "[run]\nseed = 5\n[data]\nname = \"synthetic_probes\"\nworkers = " + std::to_string(workers) +
         "\nprefetch = 3\n[data.synthetic_probes]\ndocuments = 300\nlength_median = 40\nmax_length = 200\n"
         "[sampler]\nname = \"" +
         sampler + "\"\n[batching]\nname = \"" + batcher +
         "\"\nbatch_size = 4\nseq_len = 64\n[batching.packed]\nwindow = 12\n[batching.bucketed]\nsmallest = 16\n";
}

std::unique_ptr<DataPipeline> pipeline_for(const std::string& toml) {
  const Config cfg = data_config(toml);
  RunContext run;
  run.seed = 5;
  const ablate::RunSpec spec = ablate::RunSpec::from(cfg);
  return ablate::Session(spec, data_registry(), run).pipeline();
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.rows == b.rows && a.seq_len == b.seq_len && a.tokens == b.tokens && a.targets == b.targets && a.positions == b.positions &&
         a.segment_ids == b.segment_ids && a.row_segments == b.row_segments && a.segments.size() == b.segments.size();
}

std::vector<Batch> take(DataPipeline& p, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(p.next().batch);
  return out;
}

// A source whose document `bad` fails to read.
class FailingSource final : public DataSource {
 public:
  explicit FailingSource(uint64_t bad) : bad_(bad) {}
  int32_t vocab_size() const override { return 10; }
  int32_t eot_token() const override { return 9; }
  uint64_t size(Split) const override { return 1000; }
  void read(Split, uint64_t index, Document& out) const override {
    if (index == bad_) throw_input_error("corrupt.bin:offset 77", "bad record");
    out.index = index;
    out.tokens.assign(5, 1);
  }
  std::string describe() const override { return "failing"; }

 private:
  uint64_t bad_;
};

std::unique_ptr<DataPipeline> failing_pipeline(int workers) {
  const Config cfg = data_config("[sampler]\nname = \"sequential\"\n[batching]\nname = \"padded\"\nbatch_size = 2\nseq_len = 8\n");
  RunContext run;
  PipelineOptions o;
  o.workers = workers;
  return std::make_unique<DataPipeline>(std::make_shared<FailingSource>(25),
                                        ablate::Session(ablate::RunSpec::from(cfg), data_registry(), run).sampler(),
                                        ablate::Session(ablate::RunSpec::from(cfg), data_registry(), run).batcher(), o);
}

}  // namespace

TEST_CASE("prefetching workers give the same batches as reading in the consumer's thread") {
  for (const char* batcher : {"padded", "bucketed", "packed"}) {
    auto unthreaded = pipeline_for(experiment(batcher, 0));
    auto threaded = pipeline_for(experiment(batcher, 3));
    const auto a = take(*unthreaded, 120);  // several epochs of 300 documents
    const auto b = take(*threaded, 120);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(same_batch(a[i], b[i]));
  }
}

TEST_CASE("next_into hands over the same batches as next(), swapping buffers instead of copying") {
  for (const std::string batcher : {"padded", "bucketed", "packed"}) {
    for (int workers : {0, 2}) {
      CAPTURE(batcher);
      CAPTURE(workers);
      auto copied = pipeline_for(experiment(batcher, 0));
      auto handed = pipeline_for(experiment(batcher, workers));
      const auto want = take(*copied, 60);
      // Four micro-batches held at once, as a trainer accumulating gradients holds them; each
      // round's buffers go back to the pipeline and come out again refilled.
      std::vector<Batch> micro(4);
      for (std::size_t i = 0; i < want.size(); i += micro.size()) {
        for (std::size_t k = 0; k < micro.size(); ++k) {
          const int32_t* before = micro[k].tokens.data();
          const double waited = handed->next_into(micro[k]);
          CHECK(waited >= 0.0);
          // Swapped, not copied: what micro[k] held went to the pipeline (a copy keeps the buffer).
          if (before != nullptr) CHECK(micro[k].tokens.data() != before);
          REQUIRE(same_batch(micro[k], want[i + k]));
        }
        // Every batch of the round is still intact after the later ones were handed over.
        for (std::size_t k = 0; k < micro.size(); ++k) REQUIRE(same_batch(micro[k], want[i + k]));
      }
      CHECK(handed->cursor().draw == copied->cursor().draw);
    }
  }
}

TEST_CASE("a restored cursor continues exactly like the uninterrupted stream") {
  for (const char* batcher : {"padded", "bucketed", "packed"}) {
    for (int workers : {0, 2}) {
      auto stream = pipeline_for(experiment(batcher, workers));
      const auto all = take(*stream, 60);
      auto first = pipeline_for(experiment(batcher, workers));
      take(*first, 37);
      const DataCursor saved = first->cursor();
      first.reset();  // destroyed with batches still prefetched
      auto resumed = pipeline_for(experiment(batcher, workers));
      resumed->restore(saved);
      for (std::size_t i = 37; i < all.size(); ++i) REQUIRE(same_batch(resumed->next().batch, all[i]));
    }
  }
}

TEST_CASE("each batch carries the cursor after it") {
  auto p = pipeline_for(experiment("packed", 2));
  const auto& b0 = p.get()->next();
  const DataCursor after_first = b0.cursor;
  CHECK(after_first.draw > 0);
  CHECK(p->cursor().draw == after_first.draw);
  const auto& b1 = p->next();
  CHECK(b1.sequence == 1);
  CHECK(b1.cursor.draw >= after_first.draw);
}

TEST_CASE("a read error in a worker reaches the consumer") {
  for (int workers : {0, 1, 3}) {
    auto p = failing_pipeline(workers);
    bool thrown = false;
    try {
      for (int i = 0; i < 100; ++i) p->next();
    } catch (const Error& e) {
      thrown = true;
      CHECK(std::string(e.what()).find("corrupt.bin:offset 77") != std::string::npos);
      CHECK(e.kind() == ErrorKind::input);
    }
    CHECK(thrown);
    CHECK_THROWS_AS(p->next(), Error);  // stays failed
  }
}

TEST_CASE("destroying a pipeline in the middle of a stream returns promptly") {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    auto p = pipeline_for(experiment("packed", 3));
    p->next();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the queue fill up
  }
  {
    auto never_read = pipeline_for(experiment("padded", 2));  // constructed, never started
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("statistics count documents, batches and the consumer's wait") {
  auto p = pipeline_for(experiment("packed", 2));
  take(*p, 20);
  const PipelineStats s = p->stats();
  CHECK(s.batches == 20);
  CHECK(s.batch.items >= 20);
  CHECK(s.read.items > 20);
  CHECK(s.read.threads == 2);
  CHECK(s.wall_s > 0);
  CHECK(s.data_wait_pct() >= 0);
  CHECK(s.data_wait_pct() <= 100);
  CHECK(s.table().find("bottleneck") != std::string::npos);
}

TEST_CASE("the bottleneck is the busiest stage when the consumer waits, else the consumer") {
  PipelineStats s;
  s.wall_s = 10;
  s.read = {1000, 18, 2};  // 90% of two workers
  s.batch = {100, 3, 1};
  s.consumer_wait_s = 5;
  CHECK(s.data_wait_pct() == doctest::Approx(50));
  CHECK(s.bottleneck() == "read");
  s.batch.busy_s = 9.5;
  CHECK(s.bottleneck() == "batch");
  s.consumer_wait_s = 0.5;
  CHECK(s.bottleneck() == "consumer");
  CHECK(s.table().find("bottleneck: the consumer") != std::string::npos);
}

TEST_CASE("a split whose documents are all empty is an input error, not a hang") {
  class EmptySource final : public DataSource {
   public:
    int32_t vocab_size() const override { return 2; }
    int32_t eot_token() const override { return 1; }
    uint64_t size(Split) const override { return 3; }
    void read(Split, uint64_t index, Document& out) const override {
      out.index = index;
      out.tokens.clear();
    }
    std::string describe() const override { return "empty"; }
  };
  const Config cfg = data_config("[sampler]\nname = \"sequential\"\n[batching]\nname = \"packed\"\nbatch_size = 2\nseq_len = 8\n");
  RunContext run;
  PipelineOptions o;
  o.workers = 1;
  DataPipeline p(std::make_shared<EmptySource>(), ablate::Session(ablate::RunSpec::from(cfg), data_registry(), run).sampler(),
                 ablate::Session(ablate::RunSpec::from(cfg), data_registry(), run).batcher(), o);
  CHECK_THROWS_AS(p.next(), Error);
}
