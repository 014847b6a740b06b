// The batching thread and its hand-over queue (see batch_queue.hpp).
#include "batch_queue.hpp"

#include <utility>

namespace ablate::data_pipeline {

BatchQueue::BatchQueue(int prefetch, StageTotals& totals) : prefetch_(std::size_t(prefetch)), totals_(totals) {}

// The pipeline stops the queue before it goes; this only keeps a forgotten thread from terminating.
BatchQueue::~BatchQueue() {
  request_stop();
  join();
}

void BatchQueue::start(std::function<void(PipelineBatch&)> produce) {
  stopping_ = false;
  produce_ = std::move(produce);
  thread_ = std::thread([this] { batch_worker(); });
}

void BatchQueue::request_stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_filled_.notify_all();
  queue_drained_.notify_all();
}

void BatchQueue::join() {
  if (thread_.joinable()) thread_.join();
  for (auto& pb : queue_) spare_.push_back(std::move(pb));
  queue_.clear();
  producer_error_ = nullptr;
}

std::unique_ptr<PipelineBatch> BatchQueue::pop() {
  std::unique_lock<std::mutex> lock(mutex_);
  queue_filled_.wait(lock, [&] { return !queue_.empty() || producer_error_; });
  if (queue_.empty()) std::rethrow_exception(producer_error_);
  std::unique_ptr<PipelineBatch> pb = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  queue_drained_.notify_one();
  return pb;
}

std::unique_ptr<PipelineBatch> BatchQueue::take_spare() {
  std::unique_ptr<PipelineBatch> pb;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pb = spare_locked();
  }
  if (!pb) pb = std::make_unique<PipelineBatch>();
  return pb;
}

void BatchQueue::recycle(std::unique_ptr<PipelineBatch> batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  spare_.push_back(std::move(batch));
}

std::unique_ptr<PipelineBatch> BatchQueue::spare_locked() {
  if (spare_.empty()) return nullptr;
  std::unique_ptr<PipelineBatch> pb = std::move(spare_.back());
  spare_.pop_back();
  return pb;
}

void BatchQueue::batch_worker() {
  try {
    for (;;) {
      std::unique_ptr<PipelineBatch> pb;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
        pb = spare_locked();
      }
      if (!pb) pb = std::make_unique<PipelineBatch>();
      produce_(*pb);
      // Blocked here, the batching thread is ahead of the consumer: the queue stage's time.
      const auto start = Clock::now();
      std::unique_lock<std::mutex> lock(mutex_);
      queue_drained_.wait(lock, [&] { return stopping_ || queue_.size() < prefetch_; });
      if (stopping_) return;
      queue_.push_back(std::move(pb));
      totals_.add_queue(seconds_since(start));
      lock.unlock();
      queue_filled_.notify_one();
    }
  } catch (const PipelineStopped&) {
    return;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    producer_error_ = std::current_exception();
    queue_filled_.notify_all();
  }
}

}  // namespace ablate::data_pipeline
