// The data pipeline's hand-over: one batching thread produces batches in order into a bounded
// queue of `prefetch` batches, and the consumer pops them. Batch buffers circulate: the consumer
// gives each one back (recycle) and the batching thread fills it again, so a steady stream
// allocates nothing. An error of the batching thread is handed over after the batches queued
// before it, in the consumer's thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ablate/runtime/pipeline.hpp"
#include "pipeline_stages.hpp"

namespace ablate::data_pipeline {

class BatchQueue {
 public:
  BatchQueue(int prefetch, StageTotals& totals);
  ~BatchQueue();
  BatchQueue(const BatchQueue&) = delete;
  BatchQueue& operator=(const BatchQueue&) = delete;

  // Starts the batching thread: it calls `produce` for one batch after another and queues them.
  // `produce` throwing PipelineStopped ends the thread quietly; any other error is handed over.
  void start(std::function<void(PipelineBatch&)> produce);
  // Wakes the batching thread if it waits for room in the queue; it returns at its next check.
  void request_stop();
  // Joins the batching thread (after request_stop). The queued batches become spares and a
  // stored error is dropped: the queue can be started again.
  void join();

  // The next batch (waits for it); rethrows the batching thread's error once the queue is empty.
  std::unique_ptr<PipelineBatch> pop();
  // A buffer to produce a batch into: a spare one, or a new one when none is left.
  std::unique_ptr<PipelineBatch> take_spare();
  // A batch the consumer is done with, to be filled again.
  void recycle(std::unique_ptr<PipelineBatch> batch);

 private:
  void batch_worker();
  std::unique_ptr<PipelineBatch> spare_locked();  // under mutex_: a spare, or null

  const std::size_t prefetch_;
  StageTotals& totals_;
  std::function<void(PipelineBatch&)> produce_;

  std::mutex mutex_;
  std::condition_variable queue_filled_;
  std::condition_variable queue_drained_;
  std::deque<std::unique_ptr<PipelineBatch>> queue_;
  std::exception_ptr producer_error_;  // after the batches queued before it
  std::vector<std::unique_ptr<PipelineBatch>> spare_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ablate::data_pipeline
