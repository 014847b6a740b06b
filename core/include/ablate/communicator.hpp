// Communicator interface: collectives over the ranks of a data-parallel job. Buffers live on the
// device the communicator serves (host for `single` and `mpi`, GPU for `nccl`). Implementations:
// `single` (one rank, every collective the identity), `mpi` (host buffers), `nccl` (device buffers).
//
// Every collective is in place on one flat buffer. On host buffers (single, mpi) it is complete when
// the call returns. A device communicator given the model's stream (set_stream) orders each
// collective after the work already on that stream and may return before it completes: join()
// waits for every collective issued so far and orders the model's stream after them (what lets
// gradient buckets overlap the rest of the backward pass). Without a stream, calls complete on
// return. Host-scalar collectives always complete on return. Every rank must make the same calls
// in the same order with the same element count and dtype. A rank that
// waits longer than its communicator's timeout for the others throws ablate::Error (runtime) naming
// the rank, the operation and the element count, and the job is ended (see docs/distributed.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

enum class ReduceOp { sum, max };

inline const char* to_string(ReduceOp op) noexcept { return op == ReduceOp::sum ? "sum" : "max"; }

// One rank's contiguous part of a flat buffer of `numel` elements split over `world` ranks, as
// reduce_scatter leaves it and all_gather reads it. The layout is "ceil then floor": with
// q = numel / world and r = numel % world, ranks 0..r-1 own q + 1 elements and ranks r..world-1
// own q, in rank order, with no gaps. 10 elements over 4 ranks: [0,3) [3,6) [6,8) [8,10). A rank
// may own nothing (3 elements over 4 ranks: the last rank's shard is empty). When numel is a
// multiple of world every shard is numel / world long, which is NCCL's in-place layout.
struct Shard {
  int64_t offset = 0;  // in elements
  int64_t count = 0;
};

inline Shard shard_of(int64_t numel, int world, int rank) noexcept {
  const int64_t q = numel / world;
  const int64_t r = numel % world;
  return {rank * q + std::min<int64_t>(rank, r), q + (rank < r ? 1 : 0)};
}

class Communicator : public Component {
 public:
  ~Communicator() override;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // This rank's index among the ranks on its machine (the GPU it uses).
  virtual int local_rank() const = 0;
  // How many ranks share this rank's machine (the trainer divides the CPU cores among them).
  virtual int local_world() const = 0;

  // Every element becomes the reduction over all ranks of that element.
  virtual void all_reduce(TensorView buffer, ReduceOp op) = 0;
  // Every rank passes the whole buffer; on return this rank's shard (shard_of(numel, world, rank))
  // holds the reduction over all ranks of that shard. The rest of the buffer is left unspecified.
  virtual void reduce_scatter(TensorView buffer, ReduceOp op) = 0;
  // The inverse: every rank contributes its shard, in place; on return the whole buffer holds
  // every rank's shard. What lies outside this rank's shard on entry is ignored.
  virtual void all_gather(TensorView buffer) = 0;
  // The root's buffer is copied into every rank's.
  virtual void broadcast(TensorView buffer, int root) = 0;
  // On return the root's buffer holds the reduction over all ranks; the others' are left as they
  // were or unspecified. (Gradient buckets under ZeRO-1 reduce each bucket's part of a shard to the
  // shard's owner.) The default is an all_reduce: correct, with twice the traffic.
  virtual void reduce(TensorView buffer, ReduceOp op, int root) {
    (void)root;
    all_reduce(buffer, op);
  }
  // all_reduce and all_gather of a few values in host memory (the trainer's counts, loss sums,
  // norms and fingerprints), whatever memory the communicator's buffers live in. The default
  // runs the buffer collective on the host view (single, mpi); a communicator of device buffers
  // stages the values through its device (nccl).
  virtual void all_reduce_host(TensorView host, ReduceOp op) { all_reduce(host, op); }
  virtual void all_gather_host(TensorView host) { all_gather(host); }
  virtual void barrier() = 0;
  // The model's device queue (Device::stream(); cuda: a cudaStream_t), set by the engine. Host
  // communicators ignore it.
  void set_stream(Stream stream) noexcept { stream_ = stream; }
  Stream stream() const noexcept { return stream_; }
  // Whether collectives do work even in a world of one rank (false only for `single`, whose
  // collectives are the identity): the engine then runs its gradient buckets at any world size,
  // so a one-rank nccl run measures the machinery's cost against single.
  virtual bool moves_data() const { return true; }
  // Every collective issued so far is complete and the model's stream is ordered after them; a
  // collective that fails or times out throws here. No-op where collectives complete on return.
  virtual void join() {}
  // This rank is leaving with an error while the others may be waiting in a collective: at exit,
  // end the whole job with `exit_code` (MPI_Abort) rather than wait for ranks that will not come.
  // `single` has nobody to tell.
  virtual void abort_job_at_exit(int exit_code, const std::string& reason) = 0;

 private:
  Stream stream_;
};

}  // namespace ablate
