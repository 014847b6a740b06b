// What the data pipeline's stages (document_ring.hpp, batch_queue.hpp, pipeline.cpp) share: the
// clock they time themselves with, the signal that unwinds a stage being stopped, and the totals
// every stage adds to from its own thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "ablate/runtime/pipeline.hpp"

namespace ablate::data_pipeline {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Thrown inside the pipeline's threads when it is being stopped; never leaves the pipeline.
struct PipelineStopped {};

// PipelineStats behind a mutex: readers, the batching thread and the consumer add to it at once.
class StageTotals {
 public:
  explicit StageTotals(int read_threads) { totals_.read.threads = read_threads; }

  void add_read(double busy_s, uint64_t documents) {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.read.busy_s += busy_s;
    totals_.read.items += documents;
  }
  void add_batch(double busy_s) {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.batch.busy_s += std::max(0.0, busy_s);
    ++totals_.batch.items;
  }
  void add_queue(double blocked_s) {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.queue.busy_s += blocked_s;
    ++totals_.queue.items;
  }
  // One batch handed to the consumer after `waited_s`; returns the batches handed so far.
  uint64_t add_handed(double waited_s, Clock::time_point first_next) {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.consumer_wait_s += waited_s;
    totals_.wall_s = seconds_since(first_next);
    return ++totals_.batches;
  }
  PipelineStats snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return totals_;
  }

 private:
  mutable std::mutex mutex_;
  PipelineStats totals_;
};

}  // namespace ablate::data_pipeline
