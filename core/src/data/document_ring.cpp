// The document ring (see document_ring.hpp).
#include "document_ring.hpp"

#include <algorithm>
#include <utility>

namespace ablate::data_pipeline {

DocumentRing::DocumentRing(const DataSource& source, Split split, Sampler& sampler, std::size_t slots, StageTotals& totals)
    : source_(source), split_(split), sampler_(sampler), totals_(totals), slots_(slots) {}

// The pipeline stops the ring before it goes; this only keeps a forgotten thread from terminating.
DocumentRing::~DocumentRing() {
  request_stop();
  join();
}

void DocumentRing::start(uint64_t first_draw, int workers) {
  stopping_ = false;
  next_claim_ = first_draw;
  consumed_ = first_draw;
  for (Slot& s : slots_) {
    s.ready = false;
    s.error = nullptr;
  }
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { read_worker(); });
}

void DocumentRing::request_stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  slot_ready_.notify_all();
  ring_space_.notify_all();
}

void DocumentRing::join() {
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void DocumentRing::take(uint64_t draw, Document& into) {
  std::unique_lock<std::mutex> lock(mutex_);
  Slot& slot = slots_[draw % slots_.size()];
  taker_waiting_ = true;
  slot_ready_.wait(lock, [&] { return stopping_ || (slot.ready && slot.draw == draw); });
  taker_waiting_ = false;
  if (stopping_) throw PipelineStopped{};
  slot.ready = false;
  if (slot.error) std::rethrow_exception(std::exchange(slot.error, nullptr));
  std::swap(into, slot.doc);
  consumed_ = draw + 1;
  const bool wake = workers_waiting_ > 0 && chunk_free();
  lock.unlock();
  if (wake) ring_space_.notify_one();
}

std::size_t DocumentRing::claim_chunk() const { return std::max<std::size_t>(1, std::min<std::size_t>(32, slots_.size() / 8)); }

bool DocumentRing::chunk_free() const { return next_claim_ + claim_chunk() <= consumed_ + slots_.size(); }

void DocumentRing::read_worker() {
  const std::size_t chunk = claim_chunk();
  std::vector<Document> docs(chunk);
  std::vector<uint64_t> indices(chunk);
  std::vector<std::exception_ptr> errors(chunk);
  for (;;) {
    uint64_t first = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++workers_waiting_;
      ring_space_.wait(lock, [&] { return stopping_ || chunk_free(); });
      --workers_waiting_;
      if (stopping_) return;
      first = next_claim_;
      next_claim_ += chunk;
      for (std::size_t i = 0; i < chunk; ++i) {
        errors[i] = nullptr;
        try {
          indices[i] = sampler_.document_at(first + i);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    }
    // The reads, the slow part, run outside the lock: this is where the workers overlap.
    const auto start = Clock::now();
    for (std::size_t i = 0; i < chunk; ++i) {
      if (errors[i]) continue;
      try {
        source_.read(split_, indices[i], docs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
    totals_.add_read(seconds_since(start), chunk);
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (std::size_t i = 0; i < chunk; ++i) {
        Slot& slot = slots_[(first + i) % slots_.size()];
        slot.draw = first + i;
        slot.ready = true;
        slot.error = errors[i];
        std::swap(slot.doc, docs[i]);
      }
      wake = taker_waiting_;
    }
    if (wake) slot_ready_.notify_one();
  }
}

}  // namespace ablate::data_pipeline
