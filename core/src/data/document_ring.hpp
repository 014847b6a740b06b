// The data pipeline's read stage: `workers` threads read documents ahead of need into a ring indexed
// by draw number (slot draw % slots holds draw `draw` once ready), and the batching thread takes
// them out strictly in draw order. The order comes from the draw numbers, not from which worker is
// faster, so the documents are the same for any number of workers. A read's error is stored in its
// slot and rethrown when that draw is taken, not before.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "ablate/data.hpp"
#include "pipeline_stages.hpp"

namespace ablate::data_pipeline {

class DocumentRing {
 public:
  // `sampler` is only called under the ring's lock (samplers need not be thread-safe); `source`
  // is read from every worker at once (DataSource::read must allow that).
  DocumentRing(const DataSource& source, Split split, Sampler& sampler, std::size_t slots, StageTotals& totals);
  ~DocumentRing();
  DocumentRing(const DocumentRing&) = delete;
  DocumentRing& operator=(const DocumentRing&) = delete;

  // Empties the ring and starts `workers` threads reading from draw `first_draw` on.
  void start(uint64_t first_draw, int workers);
  // Wakes every wait on the ring: the workers return, a take() in progress throws PipelineStopped.
  void request_stop();
  // Joins the workers (after request_stop). Nothing may be in take() any more: the ring can be
  // started again afterwards.
  void join();

  // Waits for draw `draw` (the one after the last taken) and swaps its document into `into`;
  // rethrows the error of its read or of its sampler call.
  void take(uint64_t draw, Document& into);

 private:
  struct Slot {
    uint64_t draw = 0;
    bool ready = false;
    Document doc;
    std::exception_ptr error;
  };

  void read_worker();
  // Workers claim draws in chunks and publish a chunk at once: one lock round and at most one
  // wake-up of the batching thread per chunk, not per document.
  std::size_t claim_chunk() const;
  bool chunk_free() const;  // under mutex_: the next chunk's slots are all taken out

  const DataSource& source_;
  const Split split_;
  Sampler& sampler_;
  StageTotals& totals_;

  std::mutex mutex_;
  std::condition_variable slot_ready_;  // a slot became ready (the batching thread waits)
  std::condition_variable ring_space_;  // a slot became free (workers wait)
  std::vector<Slot> slots_;
  uint64_t next_claim_ = 0;  // next draw a worker reads
  uint64_t consumed_ = 0;    // draws taken out of the ring
  bool taker_waiting_ = false;
  int workers_waiting_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ablate::data_pipeline
