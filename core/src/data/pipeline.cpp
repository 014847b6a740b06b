// The prefetching data pipeline (see pipeline.hpp): reader workers fill a ring of documents indexed
// by draw number (claiming chunks of draws), one batching thread turns them into batches in order, a bounded queue hands
// the batches to the consumer. Errors travel with the draw (or batch) they belong to and are
// rethrown in the consumer; a stop flag checked at every wait makes destruction prompt.
#include "ablate/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "ablate/config.hpp"
#include "ablate/error.hpp"
#include "ablate/registry.hpp"

namespace ablate {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Thrown inside the pipeline's threads when it is being stopped; never leaves the pipeline.
struct PipelineStopped {};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Options, statistics, construction from a config.

PipelineOptions PipelineOptions::from(const Config& config, const RunContext& run, Split split) {
  const Params data = config.section("data");
  PipelineOptions o;
  o.workers = int(data.get_int("workers"));
  o.prefetch = int(data.get_int("prefetch"));
  o.debug_stats = data.get_bool("debug_stats");
  o.debug_every = int(data.get_int("debug_every"));
  o.split = split;
  o.seed = run.seed;
  o.rank = run.rank;
  o.world = run.world;
  return o;
}

double StageStats::utilisation(double wall_s) const noexcept {
  return wall_s > 0 && threads > 0 ? busy_s / (wall_s * threads) : 0.0;
}

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

std::shared_ptr<DataSource> make_data_source(const Config& config, const Registry& registry, const RunContext& run) {
  const Params common = config.section("data");
  const std::string name = config.selected("data");
  const Params own = config.implementation("data", name);
  return registry.create<DataSource>(Kind::data_source, name, {common, own, run});
}

std::unique_ptr<Sampler> make_sampler(const Config& config, const Registry& registry, const RunContext& run) {
  const Params common = config.section("sampler");
  const std::string name = config.selected("sampler");
  const Params own = config.implementation("sampler", name);
  return registry.create<Sampler>(Kind::sampler, name, {common, own, run});
}

std::unique_ptr<Batcher> make_batcher(const Config& config, const Registry& registry, const RunContext& run) {
  const Params common = config.section("batching");
  const std::string name = config.selected("batching");
  const Params own = config.implementation("batching", name);
  return registry.create<Batcher>(Kind::batcher, name, {common, own, run});
}

// ---------------------------------------------------------------------------------------------

struct DataPipeline::Impl final : DocumentFeed {
  std::shared_ptr<const DataSource> source;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Batcher> batcher;
  PipelineOptions options;

  // --- the feed (used by the batching thread, or the consumer's when workers = 0)
  uint64_t draws_taken = 0;  // draws the batcher has taken
  Document current;          // the document next() last returned
  uint64_t empty_run = 0;    // consecutive empty documents

  // --- the document ring (workers > 0): slot draw % ring_size holds draw `draw` once ready
  struct Slot {
    uint64_t draw = 0;
    bool ready = false;
    Document doc;
    std::exception_ptr error;
  };
  std::mutex ring_mutex;
  std::condition_variable slot_ready;  // a slot became ready (the batcher waits)
  std::condition_variable ring_space;  // a slot became free (workers wait)
  std::vector<Slot> ring;
  uint64_t next_claim = 0;     // next draw a worker reads
  uint64_t ring_consumed = 0;  // draws the batcher has taken out of the ring
  bool batcher_waiting = false;
  int workers_waiting = 0;

  // --- the batch queue
  std::mutex queue_mutex;
  std::condition_variable queue_filled;
  std::condition_variable queue_drained;
  std::deque<std::unique_ptr<PipelineBatch>> queue;
  std::exception_ptr producer_error;  // after the batches queued before it
  std::vector<std::unique_ptr<PipelineBatch>> spare;
  std::exception_ptr failure;  // once a stage failed, every later next() rethrows it

  bool stopping = false;  // guarded by both mutexes (set under each)
  std::vector<std::thread> threads;
  bool running = false;

  // --- consumer side
  std::unique_ptr<PipelineBatch> handed;  // the batch the consumer holds
  DataCursor consumed_cursor;
  uint64_t sequence = 0;

  // --- statistics (read and batch totals guarded by stats_mutex)
  mutable std::mutex stats_mutex;
  PipelineStats totals;
  bool clock_started = false;
  Clock::time_point first_next;
  double feed_wait_in_batch = 0;  // batching thread only

  Impl(std::shared_ptr<const DataSource> src, std::unique_ptr<Sampler> smp, std::unique_ptr<Batcher> bat, PipelineOptions opt)
      : source(std::move(src)), sampler(std::move(smp)), batcher(std::move(bat)), options(opt) {
    const uint64_t documents = source->size(options.split);
    if (documents == 0) {
      throw_input_error(source->describe(), std::string("the ") + to_string(options.split) + " split has no documents");
    }
    sampler->set_groups(source->groups(options.split));
    sampler->reset(documents, options.seed, options.rank, options.world);
    options.workers = std::max(0, options.workers);
    options.prefetch = std::max(1, options.prefetch);
    totals.read.threads = std::max(1, options.workers);
    // Enough documents in flight for several batches of short documents.
    ring.resize(std::size_t(std::clamp(8 * int64_t(batcher->max_rows()), int64_t(256), int64_t(16384))));
  }

  ~Impl() override { stop(); }

  int32_t eot_token() const override { return source->eot_token(); }

  Document fetch(uint64_t document) override {
    Document doc;
    source->read(options.split, document, doc);
    return doc;
  }

  const Document& next() override {
    const uint64_t draw = draws_taken;
    if (options.workers == 0) {
      const uint64_t index = sampler->document_at(draw);
      const auto start = Clock::now();
      source->read(options.split, index, current);
      const double took = seconds_since(start);
      std::lock_guard<std::mutex> lock(stats_mutex);
      totals.read.busy_s += took;
      ++totals.read.items;
      feed_wait_in_batch += took;
    } else {
      const auto start = Clock::now();
      std::unique_lock<std::mutex> lock(ring_mutex);
      Slot& slot = ring[draw % ring.size()];
      batcher_waiting = true;
      slot_ready.wait(lock, [&] { return stopping || (slot.ready && slot.draw == draw); });
      batcher_waiting = false;
      if (stopping) throw PipelineStopped{};
      slot.ready = false;
      if (slot.error) std::rethrow_exception(std::exchange(slot.error, nullptr));
      std::swap(current, slot.doc);
      ring_consumed = draw + 1;
      const bool wake = workers_waiting > 0 && chunk_free();
      lock.unlock();
      if (wake) ring_space.notify_one();
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

  // Workers claim draws in chunks and publish a chunk at once: one lock round and at most one
  // wake-up of the batching thread per chunk, not per document.
  std::size_t claim_chunk() const { return std::max<std::size_t>(1, std::min<std::size_t>(32, ring.size() / 8)); }

  bool chunk_free() const { return next_claim + claim_chunk() <= ring_consumed + ring.size(); }

  void read_worker() {
    const std::size_t chunk = claim_chunk();
    std::vector<Document> docs(chunk);
    std::vector<uint64_t> indices(chunk);
    std::vector<std::exception_ptr> errors(chunk);
    for (;;) {
      uint64_t first = 0;
      {
        std::unique_lock<std::mutex> lock(ring_mutex);
        ++workers_waiting;
        ring_space.wait(lock, [&] { return stopping || chunk_free(); });
        --workers_waiting;
        if (stopping) return;
        first = next_claim;
        next_claim += chunk;
        for (std::size_t i = 0; i < chunk; ++i) {
          errors[i] = nullptr;
          try {
            indices[i] = sampler->document_at(first + i);
          } catch (...) {
            errors[i] = std::current_exception();
          }
        }
      }
      const auto start = Clock::now();
      for (std::size_t i = 0; i < chunk; ++i) {
        if (errors[i]) continue;
        try {
          source->read(options.split, indices[i], docs[i]);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
      const double took = seconds_since(start);
      {
        std::lock_guard<std::mutex> lock(stats_mutex);
        totals.read.busy_s += took;
        totals.read.items += chunk;
      }
      bool wake = false;
      {
        std::lock_guard<std::mutex> lock(ring_mutex);
        for (std::size_t i = 0; i < chunk; ++i) {
          Slot& slot = ring[(first + i) % ring.size()];
          slot.draw = first + i;
          slot.ready = true;
          slot.error = errors[i];
          std::swap(slot.doc, docs[i]);
        }
        wake = batcher_waiting;
      }
      if (wake) slot_ready.notify_one();
    }
  }

  // Produces one batch into `out` (on the batching thread, or the consumer's when workers = 0).
  void produce(PipelineBatch& out) {
    const auto start = Clock::now();
    feed_wait_in_batch = 0;
    batcher->next(*this, out.batch);
    out.cursor.draw = draws_taken;
    out.cursor.pending = batcher->pending();
    const double busy = seconds_since(start) - feed_wait_in_batch;  // reading (workers = 0) or waiting for it
    std::lock_guard<std::mutex> lock(stats_mutex);
    totals.batch.busy_s += std::max(0.0, busy);
    ++totals.batch.items;
  }

  void batch_worker() {
    try {
      for (;;) {
        std::unique_ptr<PipelineBatch> pb;
        {
          std::lock_guard<std::mutex> lock(queue_mutex);
          if (stopping) return;
          if (!spare.empty()) {
            pb = std::move(spare.back());
            spare.pop_back();
          }
        }
        if (!pb) pb = std::make_unique<PipelineBatch>();
        produce(*pb);
        const auto start = Clock::now();
        std::unique_lock<std::mutex> lock(queue_mutex);
        queue_drained.wait(lock, [&] { return stopping || queue.size() < std::size_t(options.prefetch); });
        if (stopping) return;
        queue.push_back(std::move(pb));
        {
          std::lock_guard<std::mutex> stats_lock(stats_mutex);
          totals.queue.busy_s += seconds_since(start);
          ++totals.queue.items;
        }
        lock.unlock();
        queue_filled.notify_one();
      }
    } catch (const PipelineStopped&) {
      return;
    } catch (...) {
      std::lock_guard<std::mutex> lock(queue_mutex);
      producer_error = std::current_exception();
      queue_filled.notify_all();
    }
  }

  void start() {
    if (running || options.workers == 0) return;
    stopping = false;
    next_claim = draws_taken;
    ring_consumed = draws_taken;
    for (Slot& s : ring) {
      s.ready = false;
      s.error = nullptr;
    }
    running = true;
    for (int i = 0; i < options.workers; ++i) threads.emplace_back([this] { read_worker(); });
    threads.emplace_back([this] { batch_worker(); });
  }

  void stop() {
    if (!running) return;
    {
      std::lock_guard<std::mutex> lock(ring_mutex);
      stopping = true;
    }
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      stopping = true;
    }
    slot_ready.notify_all();
    ring_space.notify_all();
    queue_filled.notify_all();
    queue_drained.notify_all();
    for (std::thread& t : threads) t.join();
    threads.clear();
    running = false;
    stopping = false;
    for (auto& pb : queue) spare.push_back(std::move(pb));
    queue.clear();
    producer_error = nullptr;
  }

  const PipelineBatch& consume() {
    if (failure) std::rethrow_exception(failure);
    try {
      return consume_next();
    } catch (...) {
      failure = std::current_exception();
      stop();
      throw;
    }
  }

  const PipelineBatch& consume_next() {
    const auto start = Clock::now();
    if (!clock_started) {
      clock_started = true;
      first_next = start;
    }
    if (handed) {
      std::lock_guard<std::mutex> lock(queue_mutex);
      spare.push_back(std::move(handed));
    }
    if (options.workers == 0) {
      std::unique_ptr<PipelineBatch> pb;
      if (!spare.empty()) {
        pb = std::move(spare.back());
        spare.pop_back();
      } else {
        pb = std::make_unique<PipelineBatch>();
      }
      produce(*pb);
      handed = std::move(pb);
    } else {
      start_threads_if_needed();
      std::unique_lock<std::mutex> lock(queue_mutex);
      queue_filled.wait(lock, [&] { return !queue.empty() || producer_error; });
      if (queue.empty()) {
        std::rethrow_exception(producer_error);
      }
      handed = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      queue_drained.notify_one();
    }
    const double waited = seconds_since(start);
    handed->sequence = sequence++;
    handed->wait_ms = 1e3 * waited;
    consumed_cursor = handed->cursor;
    uint64_t batches = 0;
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      totals.consumer_wait_s += waited;
      batches = ++totals.batches;
      totals.wall_s = seconds_since(first_next);
    }
    if (options.debug_stats && batches % uint64_t(std::max(1, options.debug_every)) == 0) {
      spdlog::info("{}", snapshot().table());
    }
    return *handed;
  }

  void start_threads_if_needed() {
    if (!running) start();
  }

  void restore(const DataCursor& cursor) {
    stop();
    failure = nullptr;
    handed.reset();
    draws_taken = cursor.draw;
    batcher->restore(cursor.pending, *this);
    consumed_cursor = cursor;
  }

  PipelineStats snapshot() const {
    std::lock_guard<std::mutex> lock(stats_mutex);
    return totals;
  }
};

DataPipeline::DataPipeline(std::shared_ptr<const DataSource> source, std::unique_ptr<Sampler> sampler,
                           std::unique_ptr<Batcher> batcher, PipelineOptions options)
    : impl_(std::make_unique<Impl>(std::move(source), std::move(sampler), std::move(batcher), options)) {}

std::unique_ptr<DataPipeline> DataPipeline::from_config(const Config& config, const Registry& registry, const RunContext& run,
                                                        Split split, std::shared_ptr<const DataSource> source) {
  if (!source) source = make_data_source(config, registry, run);
  return std::make_unique<DataPipeline>(std::move(source), make_sampler(config, registry, run),
                                        make_batcher(config, registry, run), PipelineOptions::from(config, run, split));
}

DataPipeline::~DataPipeline() = default;

const PipelineBatch& DataPipeline::next() { return impl_->consume(); }
double DataPipeline::next_into(Batch& out) {
  impl_->consume();
  std::swap(out, impl_->handed->batch);  // the handed slot goes back to the spares on the next call
  return impl_->handed->wait_ms;
}
DataCursor DataPipeline::cursor() const { return impl_->consumed_cursor; }
void DataPipeline::restore(const DataCursor& cursor) { impl_->restore(cursor); }
PipelineStats DataPipeline::stats() const { return impl_->snapshot(); }
const DataSource& DataPipeline::source() const { return *impl_->source; }
const Batcher& DataPipeline::batcher() const { return *impl_->batcher; }
const PipelineOptions& DataPipeline::options() const { return impl_->options; }

}  // namespace ablate
