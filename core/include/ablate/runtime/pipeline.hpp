// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The data pipeline: DataSource -> Sampler -> Batcher, prefetched. `workers` threads read documents
// by index in parallel (in the sampler's order, ahead of need), one thread batches them in order, and
// a bounded queue of `prefetch` batches sits between it and the trainer. Every batch carries the
// DataCursor after it, so a checkpoint of the last consumed batch's cursor restores the exact
// stream. Per-stage statistics (read, batch, queue) and the consumer's wait share tell which stage
// limits the pipeline; `[data] debug_stats` logs them as a table every debug_every batches.
// With workers = 0 everything runs in the consumer's thread (no threads, same batches).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ablate/batch.hpp"
#include "ablate/component.hpp"
#include "ablate/data.hpp"

namespace ablate {

struct RunSpec;
class Registry;

struct PipelineOptions {
  int workers = 1;   // reader threads (0 = read and batch in the consumer's thread)
  int prefetch = 4;  // batches queued ahead of the consumer
  bool debug_stats = false;
  int debug_every = 100;  // batches between two stats tables
  Split split = Split::train;
  uint64_t seed = 0;  // the sampler's seed (run.seed)
  int rank = 0;
  int world = 1;
  // From [data] and the run facts.
  static PipelineOptions from(const RunSpec& spec, const RunContext& run, Split split);
};

// One stage's totals since the pipeline started (or was restored).
struct StageStats {
  uint64_t items = 0;  // read: documents; batch and queue: batches
  double busy_s = 0;   // time spent in the stage, summed over its threads
  int threads = 1;
  // Share of the stage's capacity used over `wall_s` (busy / (wall * threads)).
  double utilisation(double wall_s) const noexcept;
};

struct PipelineStats {
  StageStats read;                        // DataSource::read (or generate), on the worker threads
  StageStats batch;                       // Batcher::next, not counting waits for documents
  StageStats queue;                       // the batching thread blocked on a full queue (the consumer is slower)
  double consumer_wait_s = 0;             // the consumer blocked in next()
  double wall_s = 0;                      // from the first next() to the last return
  uint64_t batches = 0;                   // handed to the consumer
  double data_wait_pct() const noexcept;  // 100 * consumer_wait_s / wall_s
  // "read", "batch" or "consumer" (the pipeline keeps up: the trainer is the slower side).
  std::string bottleneck() const;
  // A per-stage table for logs, ending with the bottleneck and a hint.
  std::string table() const;
};

struct PipelineBatch {
  Batch batch;
  DataCursor cursor;      // where the stream stands after this batch (restore continues after it)
  uint64_t sequence = 0;  // batches handed out before this one since construction or restore
  double wait_ms = 0;     // how long the consumer waited for it
};

class DataPipeline {
 public:
  DataPipeline(std::shared_ptr<const DataSource> source, std::unique_ptr<Sampler> sampler, std::unique_ptr<Batcher> batcher,
               PipelineOptions options);
  // The experiment's pipelines are made by Session::pipeline.
  // Stops and joins its threads, also in the middle of a stream.
  ~DataPipeline();
  DataPipeline(const DataPipeline&) = delete;
  DataPipeline& operator=(const DataPipeline&) = delete;

  // The next batch; valid until the next call to next() or restore(). Rethrows an error of any
  // stage (e.g. a bad document) in the consumer's thread.
  const PipelineBatch& next();
  // next(), handed over: the batch is swapped into `out`, no token copied (`out`'s previous buffers
  // go back to the pipeline, whose batcher overwrites them). Returns how long the consumer waited
  // for it, in milliseconds. For a consumer that keeps several batches at once (micro-batches).
  double next_into(Batch& out);
  // The cursor after the last batch next() returned ({0, {}} at the start, or what was restored).
  DataCursor cursor() const;
  // Continues the stream from `cursor` (drops whatever was prefetched). A cursor with a Reshard
  // record draws its rank's leftovers first (reshard.hpp), and so do the cursors after it.
  void restore(const DataCursor& cursor);

  PipelineStats stats() const;
  const DataSource& source() const;
  const Batcher& batcher() const;
  const PipelineOptions& options() const;
  // The sampler's draws in one epoch of this rank's order.
  uint64_t draws_per_epoch() const;
  // The sampler (reset for this rank and world): its global sequence merges the cursors of a job
  // of another world size (reshard.hpp).
  const Sampler& sampler() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ablate
