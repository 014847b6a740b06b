// The prefetching data pipeline (see pipeline.hpp): reader workers fill a ring of documents indexed
// by draw number (document_ring.hpp), one batching thread turns them into batches in order, a
// bounded queue hands the batches to the consumer (batch_queue.hpp). Errors travel with the draw (or
// batch) they belong to and are rethrown in the consumer; a stop flag checked at every wait makes
// destruction prompt.
#include "ablate/runtime/pipeline.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>

#include <spdlog/spdlog.h>

#include "ablate/runtime/run_spec.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/reshard.hpp"
#include "batch_queue.hpp"
#include "document_ring.hpp"
#include "pipeline_stages.hpp"

namespace ablate {

using data_pipeline::BatchQueue;
using data_pipeline::Clock;
using data_pipeline::DocumentRing;
using data_pipeline::seconds_since;
using data_pipeline::StageTotals;

// ---------------------------------------------------------------------------------------------
// Options, statistics, construction from a config.

PipelineOptions PipelineOptions::from(const RunSpec& spec, const RunContext& run, Split split) {
  spec.require(spec.data);
  PipelineOptions o;
  o.workers = spec.data_workers;
  o.prefetch = spec.data_prefetch;
  o.debug_stats = spec.data_debug_stats;
  o.debug_every = spec.data_debug_every;
  o.split = split;
  o.seed = run.seed;
  o.rank = run.rank;
  o.world = run.world;
  return o;
}

double StageStats::utilisation(double wall_s) const noexcept { return wall_s > 0 && threads > 0 ? busy_s / (wall_s * threads) : 0.0; }

double PipelineStats::data_wait_pct() const noexcept { return wall_s > 0 ? 100.0 * consumer_wait_s / wall_s : 0.0; }

std::string PipelineStats::bottleneck() const {
  // The consumer waiting less than a tenth of the time means the pipeline keeps up.
  if (data_wait_pct() < 10.0) return "consumer";
  return read.utilisation(wall_s) >= batch.utilisation(wall_s) ? "read" : "batch";
}

std::string PipelineStats::table() const {
  char line[256];
  std::string out = "data pipeline after " + std::to_string(batches) + " batches:\n";
  std::snprintf(line, sizeof line, "  %-8s %10s %10s %12s %8s %7s\n", "stage", "items", "busy s", "us/item", "threads", "util");
  out += line;
  auto row = [&](const char* name, const StageStats& s) {
    std::snprintf(line, sizeof line, "  %-8s %10llu %10.3f %12.1f %8d %6.1f%%\n", name, static_cast<unsigned long long>(s.items),
                  s.busy_s, s.items ? 1e6 * s.busy_s / double(s.items) : 0.0, s.threads, 100.0 * s.utilisation(wall_s));
    out += line;
  };
  row("read", read);
  row("batch", batch);
  row("queue", queue);
  std::snprintf(line, sizeof line, "  consumer waited %.3f s of %.3f s (data_wait_pct %.1f%%)\n", consumer_wait_s, wall_s,
                data_wait_pct());
  out += line;
  const std::string b = bottleneck();
  if (b == "consumer") out += "  bottleneck: the consumer (the pipeline keeps up)";
  else if (b == "read") out += "  bottleneck: read (more [data] workers, or faster storage)";
  else out += "  bottleneck: batch (one thread batches: a smaller packed window or first_fit is cheaper)";
  return out;
}

// ---------------------------------------------------------------------------------------------

namespace {

// The sampler as the pipeline draws from it: the plugin's own deal for the rank, or, under a
// cursor's Reshard record (a resume on another world size), the rank's leftovers of the record
// first and then the plugin's deal from the record's end on (reshard.hpp). Only the consumer's
// thread changes the record, with the stages stopped.
class DealtSampler final : public Sampler {
 public:
  explicit DealtSampler(Sampler& inner) : inner_(inner) {}

  void reset(uint64_t documents, uint64_t seed, int rank, int world) override {
    inner_.reset(documents, seed, rank, world);
    rank_ = rank;
    world_ = world;
  }
  uint64_t draws_per_epoch() const override { return inner_.draws_per_epoch(); }
  uint64_t document_at(uint64_t draw) override {
    if (!deal_) return inner_.document_at(draw);
    if (draw < deal_->leftovers()) return inner_.document_at_global(deal_->leftover_global(draw));
    return inner_.document_at(deal_->standard_draw(draw));
  }
  bool reshardable() const override { return inner_.reshardable(); }
  uint64_t global_position(uint64_t draw, int rank, int world) const override { return inner_.global_position(draw, rank, world); }
  uint64_t document_at_global(uint64_t g) override { return inner_.document_at_global(g); }

  // Draws from now on follow `record` (none: the plugin's deal).
  void set_record(const std::optional<Reshard>& record, const std::string& where) {
    if (!record) {
      deal_.reset();
      return;
    }
    if (!inner_.reshardable()) {
      throw_input_error(where, "the data cursor was merged from a job of " + std::to_string(record->from_world) +
                                   " rank(s) (it holds a 'reshard' record), but this sampler deals no global sequence "
                                   "(Sampler::reshardable): resume with the sampler that wrote it");
    }
    const Sampler& inner = inner_;
    deal_.emplace([&inner](uint64_t draw, int rank, int world) { return inner.global_position(draw, rank, world); }, rank_, world_,
                  record);
  }
  const std::optional<Reshard>& record() const {
    static const std::optional<Reshard> none;
    return deal_ ? deal_->record() : none;
  }

 private:
  Sampler& inner_;
  int rank_ = 0, world_ = 1;
  std::optional<RankDeal> deal_;
};

}  // namespace

// Wires the stages: the ring (read), the batcher behind this feed (batch) and the queue (hand-over).
// Impl is the batcher's DocumentFeed; next() runs on the batching thread, or on the consumer's when
// workers = 0, and everything else on the consumer's.
struct DataPipeline::Impl final : DocumentFeed {
  std::shared_ptr<const DataSource> source;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Batcher> batcher;
  PipelineOptions options;
  DealtSampler dealt;  // what the ring and the feed draw from: the sampler, under the cursor's record
  StageTotals totals;
  DocumentRing ring;  // used when workers > 0
  BatchQueue queue;   // the hand-over, and the spare batches also when workers = 0
  bool running = false;

  // --- the feed (used by the batching thread, or the consumer's when workers = 0)
  uint64_t draws_taken = 0;  // draws the batcher has taken
  Document current;          // the document next() last returned
  Document fetched;          // the document fetch() last returned (restore)
  bool fetched_valid = false;
  uint64_t empty_run = 0;         // consecutive empty documents
  double feed_wait_in_batch = 0;  // of the batch being produced

  // --- consumer side
  std::unique_ptr<PipelineBatch> handed;  // the batch the consumer holds
  DataCursor consumed_cursor;
  uint64_t sequence = 0;
  std::exception_ptr failure;  // once a stage failed, every later next() rethrows it
  bool clock_started = false;
  Clock::time_point first_next;

  Impl(std::shared_ptr<const DataSource> src, std::unique_ptr<Sampler> smp, std::unique_ptr<Batcher> bat, PipelineOptions opt)
      : source(std::move(src)),
        sampler(std::move(smp)),
        batcher(std::move(bat)),
        options(sanitised(opt)),
        dealt(*sampler),
        totals(std::max(1, options.workers)),
        ring(*source, options.split, dealt, ring_slots(*batcher), totals),
        queue(options.prefetch, totals) {
    const uint64_t documents = source->size(options.split);
    if (documents == 0) {
      throw_input_error(source->describe(), std::string("the ") + to_string(options.split) + " split has no documents");
    }
    sampler->set_groups(source->groups(options.split));
    dealt.reset(documents, options.seed, options.rank, options.world);
  }

  ~Impl() override { stop_stages(); }

  static PipelineOptions sanitised(PipelineOptions o) {
    o.workers = std::max(0, o.workers);
    o.prefetch = std::max(1, o.prefetch);
    return o;
  }

  // Enough documents in flight for several batches of short documents.
  static std::size_t ring_slots(const Batcher& batcher) {
    return std::size_t(std::clamp(8 * int64_t(batcher.max_rows()), int64_t(256), int64_t(16384)));
  }

  int32_t eot_token() const override { return source->eot_token(); }

  // Restoring a cursor fetches a document once per pending piece; a long document cut into many
  // pieces is read once.
  const Document& fetch(uint64_t document) override {
    if (!fetched_valid || fetched.index != document) {
      fetched_valid = false;
      source->read(options.split, document, fetched);
      fetched_valid = true;
    }
    return fetched;
  }

  const Document& next() override {
    const uint64_t draw = draws_taken;
    if (options.workers == 0) {
      const uint64_t index = dealt.document_at(draw);
      const auto start = Clock::now();
      source->read(options.split, index, current);
      const double took = seconds_since(start);
      totals.add_read(took, 1);
      feed_wait_in_batch += took;
    } else {
      const auto start = Clock::now();
      ring.take(draw, current);
      feed_wait_in_batch += seconds_since(start);
    }
    draws_taken = draw + 1;
    // A batcher skips empty documents; a whole epoch of them would make it wait forever.
    empty_run = current.tokens.empty() ? empty_run + 1 : 0;
    if (empty_run > sampler->draws_per_epoch()) {
      throw_input_error(source->describe(), std::string("every document of the ") + to_string(options.split) + " split is empty");
    }
    return current;
  }

  // Produces one batch into `out` (on the batching thread, or the consumer's when workers = 0).
  void produce(PipelineBatch& out) {
    const auto start = Clock::now();
    feed_wait_in_batch = 0;
    batcher->next(*this, out.batch);
    out.cursor.draw = draws_taken;
    out.cursor.pending = batcher->pending();
    out.cursor.reshard = dealt.record();
    totals.add_batch(seconds_since(start) - feed_wait_in_batch);  // less reading (workers = 0) or waiting for it
  }

  void start_stages() {
    if (running || options.workers == 0) return;
    running = true;
    ring.start(draws_taken, options.workers);
    queue.start([this](PipelineBatch& out) { produce(out); });
  }

  void stop_stages() {
    if (!running) return;
    // Both stages hear it before anything is joined: the batching thread may wait on either.
    ring.request_stop();
    queue.request_stop();
    queue.join();  // the ring's only taker goes first, so nothing waits on the ring when it is joined
    ring.join();
    running = false;
  }

  const PipelineBatch& consume() {
    if (failure) std::rethrow_exception(failure);
    try {
      return consume_next();
    } catch (...) {
      failure = std::current_exception();
      stop_stages();
      throw;
    }
  }

  const PipelineBatch& consume_next() {
    const auto start = Clock::now();
    if (!clock_started) {
      clock_started = true;
      first_next = start;
    }
    if (handed) queue.recycle(std::move(handed));
    if (options.workers == 0) {
      std::unique_ptr<PipelineBatch> pb = queue.take_spare();
      produce(*pb);
      handed = std::move(pb);
    } else {
      start_stages();
      handed = queue.pop();
    }
    const double waited = seconds_since(start);
    handed->sequence = sequence++;
    handed->wait_ms = 1e3 * waited;
    consumed_cursor = handed->cursor;
    const uint64_t batches = totals.add_handed(waited, first_next);
    if (options.debug_stats && batches % uint64_t(std::max(1, options.debug_every)) == 0) {
      spdlog::info("{}", totals.snapshot().table());
    }
    return *handed;
  }

  void restore(const DataCursor& cursor) {
    stop_stages();
    failure = nullptr;
    handed.reset();
    dealt.set_record(cursor.reshard, source->describe());
    draws_taken = cursor.draw;
    batcher->restore(cursor.pending, *this);
    fetched = Document();  // a long document is not kept beyond the restore
    fetched_valid = false;
    consumed_cursor = cursor;
  }
};

DataPipeline::DataPipeline(std::shared_ptr<const DataSource> source, std::unique_ptr<Sampler> sampler,
                           std::unique_ptr<Batcher> batcher, PipelineOptions options)
    : impl_(std::make_unique<Impl>(std::move(source), std::move(sampler), std::move(batcher), options)) {}

DataPipeline::~DataPipeline() = default;

const PipelineBatch& DataPipeline::next() { return impl_->consume(); }
double DataPipeline::next_into(Batch& out) {
  impl_->consume();
  std::swap(out, impl_->handed->batch);  // the handed slot goes back to the spares on the next call
  return impl_->handed->wait_ms;
}
DataCursor DataPipeline::cursor() const { return impl_->consumed_cursor; }
void DataPipeline::restore(const DataCursor& cursor) { impl_->restore(cursor); }
PipelineStats DataPipeline::stats() const { return impl_->totals.snapshot(); }
const DataSource& DataPipeline::source() const { return *impl_->source; }
const Batcher& DataPipeline::batcher() const { return *impl_->batcher; }
const PipelineOptions& DataPipeline::options() const { return impl_->options; }
uint64_t DataPipeline::draws_per_epoch() const { return impl_->sampler->draws_per_epoch(); }
const Sampler& DataPipeline::sampler() const { return *impl_->sampler; }

}  // namespace ablate
