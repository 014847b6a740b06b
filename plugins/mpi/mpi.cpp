// The `mpi` communicator: data parallelism over processes started by mpirun or srun, on host
// buffers. all_reduce and reduce_scatter reduce f32, f64 and i32 (sum, max); broadcast and
// all_gather move any dtype. Every transfer is a non-blocking MPI call polled against a deadline
// ([run.mpi] timeout_s): a rank that waits longer throws ablate::Error naming itself, the operation
// and the element count, and the job is aborted when the process exits.
//
// reduce_scatter and all_gather go round a ring of point-to-point messages, cut into segments of
// segment_bytes: reduce_scatter in world - 1 steps (each rank sends one shard to the next rank and
// adds the one it receives from the previous into its own copy), all_gather in world - 1 more.
// all_reduce of at least ring_min_bytes is the two in turn, so every rank sends and receives
// 2 (world - 1) / world of the buffer, the least any all-reduce can; smaller buffers use
// MPI_Iallreduce, whose tree algorithms take fewer steps. (Open MPI 4.1's own non-blocking
// all-reduce took 3.6 times as long as this ring on a 124M-float buffer: bench/results/bench_comm.log.)
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "mpi_runtime.hpp"

namespace {

using ablate::DType;
using ablate::ReduceOp;
using ablate::Shard;
using ablate::TensorView;
namespace rt = ablate::mpi_runtime;

constexpr const char* kWhere = "mpi communicator";

// The MPI type that moves (and, for f32 / f64 / i32, reduces) one element of `dtype`.
MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return MPI_UINT16_T;  // moved as raw 16-bit words, never reduced
  }
  return MPI_DATATYPE_NULL;
}

bool reducible(DType dtype) { return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32; }

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

template <class T, class Acc = T>
void reduce_into(T* dst, const T* src, int64_t n, ReduceOp op) {
  if (op == ReduceOp::sum) {
    // i32 sums wrap around (as MPI_SUM does) through unsigned arithmetic, never undefined overflow.
    for (int64_t i = 0; i < n; ++i) dst[i] = T(Acc(dst[i]) + Acc(src[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] > dst[i] ? src[i] : dst[i];
  }
}

// dst[i] = dst[i] (op) src[i] for n elements of a reducible dtype.
void reduce_into(DType dtype, std::byte* dst, const std::byte* src, int64_t n, ReduceOp op) {
  switch (dtype) {
    case DType::f32: reduce_into(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src), n, op); break;
    case DType::f64: reduce_into(reinterpret_cast<double*>(dst), reinterpret_cast<const double*>(src), n, op); break;
    case DType::i32:
      reduce_into<int32_t, uint32_t>(reinterpret_cast<int32_t*>(dst), reinterpret_cast<const int32_t*>(src), n, op);
      break;
    default: break;
  }
}

class MpiCommunicator final : public rt::LaunchedCommunicator {
 public:
  MpiCommunicator(double timeout_s, int64_t ring_min_bytes, int64_t segment_bytes)
      : LaunchedCommunicator(kWhere), timeout_s_(timeout_s), ring_min_bytes_(ring_min_bytes), segment_bytes_(segment_bytes) {
    // A communicator of our own: our traffic never matches another library's on MPI_COMM_WORLD,
    // and errors come back as codes instead of ending the process.
    MPI_Request request = MPI_REQUEST_NULL;
    ABLATE_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request));
    if (!rt::wait_until(request, rt::Deadline::after(timeout_s_))) fail("creating the communicator", -1, DType::u8);
    ABLATE_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }

  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_NULL && failed_.empty() && !rt::finalized()) MPI_Comm_free(&comm_);
  }


  void all_reduce(TensorView buffer, ReduceOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Call call = begin(std::string("all_reduce (") + ablate::to_string(op) + ")", buffer, true);
    if (where_.world == 1 || buffer.numel() == 0) return;
    const int64_t bytes = buffer.numel() * int64_t(ablate::dtype_size(buffer.dtype));
    if (bytes < ring_min_bytes_) {  // small: one MPI_Iallreduce (bytes < ring_min_bytes fits an int count)
      MPI_Request request = MPI_REQUEST_NULL;
      ABLATE_MPI_CHECK(
          MPI_Iallreduce(MPI_IN_PLACE, buffer.data, int(buffer.numel()), element_type(buffer.dtype), mpi_op(op), comm_, &request));
      if (!rt::wait_until(request, call.deadline)) fail(call);
      return;
    }
    ring_reduce_scatter(call, buffer, op);
    ring_all_gather(call, buffer);
  }

  void reduce_scatter(TensorView buffer, ReduceOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Call call = begin(std::string("reduce_scatter (") + ablate::to_string(op) + ")", buffer, true);
    if (where_.world == 1 || buffer.numel() == 0) return;
    ring_reduce_scatter(call, buffer, op);
  }

  void all_gather(TensorView buffer) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Call call = begin("all_gather", buffer, false);
    if (where_.world == 1 || buffer.numel() == 0) return;
    ring_all_gather(call, buffer);
  }

  void broadcast(TensorView buffer, int root) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Call call = begin("broadcast from rank " + std::to_string(root), buffer, false);
    if (root < 0 || root >= where_.world) {
      ablate::throw_input_error(prefix(), call.what + ": the root is not a rank of this world of " + std::to_string(where_.world));
    }
    if (where_.world == 1) return;
    const int64_t seg = segment_elements(buffer.dtype);
    auto* base = static_cast<std::byte*>(buffer.data);
    const std::size_t esize = ablate::dtype_size(buffer.dtype);
    for (int64_t at = 0; at < buffer.numel(); at += seg) {
      MPI_Request request = MPI_REQUEST_NULL;
      ABLATE_MPI_CHECK(
          MPI_Ibcast(base + at * esize, int(std::min(seg, buffer.numel() - at)), element_type(buffer.dtype), root, comm_, &request));
      if (!rt::wait_until(request, call.deadline)) fail(call);
    }
  }

  // Segment by segment (an int count each), MPI_IN_PLACE at the root.
  void reduce(TensorView buffer, ReduceOp op, int root) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Call call = begin(std::string("reduce (") + ablate::to_string(op) + ") to rank " + std::to_string(root), buffer, true);
    if (root < 0 || root >= where_.world) {
      ablate::throw_input_error(prefix(), call.what + ": the root is not a rank of this world of " + std::to_string(where_.world));
    }
    if (where_.world == 1 || buffer.numel() == 0) return;
    const int64_t seg = segment_elements(buffer.dtype);
    auto* base = static_cast<std::byte*>(buffer.data);
    const std::size_t esize = ablate::dtype_size(buffer.dtype);
    for (int64_t at = 0; at < buffer.numel(); at += seg) {
      MPI_Request request = MPI_REQUEST_NULL;
      void* p = base + at * esize;
      ABLATE_MPI_CHECK(MPI_Ireduce(where_.rank == root ? MPI_IN_PLACE : p, p, int(std::min(seg, buffer.numel() - at)),
                                   element_type(buffer.dtype), mpi_op(op), root, comm_, &request));
      if (!rt::wait_until(request, call.deadline)) fail(call);
    }
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("barrier");
    const Call call{"barrier", -1, DType::u8, rt::Deadline::after(timeout_s_)};
    MPI_Request request = MPI_REQUEST_NULL;
    ABLATE_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    if (!rt::wait_until(request, call.deadline)) fail(call);
  }

 private:
  // One collective in progress: what to call it in errors, and when it must be done.
  struct Call {
    std::string what;
    int64_t numel;
    DType dtype;
    rt::Deadline deadline;
  };

  std::string prefix() const {
    return std::string(kWhere) + ": rank " + std::to_string(where_.rank) + " of " + std::to_string(where_.world);
  }

  void check_usable(const std::string& what) const {
    if (!failed_.empty()) {
      ablate::throw_runtime_error(prefix(), what + " after an earlier collective failed (" + failed_ + ")");
    }
  }

  // Refuses a wrong call before anything is sent, so every rank refuses it alike and stays in step.
  Call begin(const std::string& what, const TensorView& buffer, bool reduces) const {
    check_usable(what);
    if (buffer.device != ablate::DeviceType::cpu) {
      ablate::throw_input_error(prefix(), what + " of a " + std::string(ablate::to_string(buffer.device)) +
                                              " buffer: mpi serves host buffers (nccl serves GPU buffers)");
    }
    if (reduces && !reducible(buffer.dtype)) {
      ablate::throw_input_error(prefix(), what + " of " + ablate::to_string(buffer.dtype) + " elements: mpi reduces f32, f64 and i32");
    }
    if (buffer.numel() < 0 || (buffer.numel() > 0 && buffer.data == nullptr)) {
      ablate::throw_input_error(prefix(), what + ": the buffer has no data");
    }
    return {what, buffer.numel(), buffer.dtype, rt::Deadline::after(timeout_s_)};
  }

  int64_t segment_elements(DType dtype) const { return std::max<int64_t>(1, segment_bytes_ / int64_t(ablate::dtype_size(dtype))); }
  int peer(int offset) const { return ((where_.rank + offset) % where_.world + where_.world) % where_.world; }

  // Posts one message per segment of `shard` (Isend or Irecv), appending the requests.
  template <class Post>
  void post_segments(const Shard& shard, int64_t seg, std::vector<MPI_Request>& requests, Post&& post) {
    for (int64_t at = 0; at < shard.count; at += seg) {
      requests.push_back(MPI_REQUEST_NULL);
      post(shard.offset + at, int(std::min(seg, shard.count - at)), requests.back());
    }
  }

  // After world - 1 steps rank r holds the reduction of shard r. In step k it sends shard
  // r - k - 1 (which it has just reduced, or its own input at k = 0) to rank r + 1 and adds shard
  // r - k - 2, received from rank r - 1, into its copy. Received segments land in two scratch
  // segments in turn: one is reduced while the next arrives.
  void ring_reduce_scatter(const Call& call, const TensorView& buffer, ReduceOp op) {
    const int64_t n = buffer.numel();
    const int64_t seg = segment_elements(buffer.dtype);
    const std::size_t esize = ablate::dtype_size(buffer.dtype);
    const MPI_Datatype type = element_type(buffer.dtype);
    auto* base = static_cast<std::byte*>(buffer.data);
    const std::size_t seg_bytes = std::size_t(seg) * esize;
    if (scratch_bytes_ < 2 * seg_bytes) {
      scratch_ = std::make_unique_for_overwrite<std::byte[]>(2 * seg_bytes);
      scratch_bytes_ = 2 * seg_bytes;
    }
    std::vector<MPI_Request> sends;
    for (int k = 0; k + 1 < where_.world; ++k) {
      const Shard out = ablate::shard_of(n, where_.world, peer(-k - 1));
      const Shard in = ablate::shard_of(n, where_.world, peer(-k - 2));
      sends.clear();
      post_segments(out, seg, sends, [&](int64_t at, int count, MPI_Request& r) {
        ABLATE_MPI_CHECK(MPI_Isend(base + at * esize, count, type, peer(1), 0, comm_, &r));
      });
      const int64_t segments = (in.count + seg - 1) / seg;
      MPI_Request recv[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      const auto post_recv = [&](int64_t j) {
        const int count = int(std::min(seg, in.count - j * seg));
        std::byte* into = scratch_.get() + (j % 2) * seg_bytes;
        ABLATE_MPI_CHECK(MPI_Irecv(into, count, type, peer(-1), 0, comm_, &recv[j % 2]));
      };
      if (segments > 0) post_recv(0);
      for (int64_t j = 0; j < segments; ++j) {
        if (j + 1 < segments) post_recv(j + 1);
        if (!rt::wait_until(recv[j % 2], call.deadline)) fail(call);
        reduce_into(buffer.dtype, base + (in.offset + j * seg) * esize, scratch_.get() + (j % 2) * seg_bytes,
                    std::min(seg, in.count - j * seg), op);
      }
      if (!rt::wait_all_until(int(sends.size()), sends.data(), call.deadline)) fail(call);
    }
  }

  // After world - 1 steps every rank holds every shard. In step k rank r sends shard r - k (its own
  // at k = 0, then the one it received last) to rank r + 1 and receives shard r - k - 1 in place.
  void ring_all_gather(const Call& call, const TensorView& buffer) {
    const int64_t n = buffer.numel();
    const int64_t seg = segment_elements(buffer.dtype);
    const std::size_t esize = ablate::dtype_size(buffer.dtype);
    const MPI_Datatype type = element_type(buffer.dtype);
    auto* base = static_cast<std::byte*>(buffer.data);
    std::vector<MPI_Request> requests;
    for (int k = 0; k + 1 < where_.world; ++k) {
      requests.clear();
      const Shard in = ablate::shard_of(n, where_.world, peer(-k - 1));
      const Shard out = ablate::shard_of(n, where_.world, peer(-k));
      post_segments(in, seg, requests, [&](int64_t at, int count, MPI_Request& r) {
        ABLATE_MPI_CHECK(MPI_Irecv(base + at * esize, count, type, peer(-1), 0, comm_, &r));
      });
      post_segments(out, seg, requests, [&](int64_t at, int count, MPI_Request& r) {
        ABLATE_MPI_CHECK(MPI_Isend(base + at * esize, count, type, peer(1), 0, comm_, &r));
      });
      if (!rt::wait_all_until(int(requests.size()), requests.data(), call.deadline)) fail(call);
    }
  }

  // The collective did not complete in time: this communicator is unusable from now on (requests
  // are still pending), the job ends when the process exits, and the caller learns why.
  [[noreturn]] void fail(const Call& call) { fail(call.what, call.numel, call.dtype); }
  [[noreturn]] void fail(const std::string& what, int64_t numel, DType dtype) {
    std::string message = prefix() + ": " + what;
    if (numel >= 0) message += " of " + std::to_string(numel) + " " + ablate::to_string(dtype) + " elements";
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout_s_);
    message +=
        std::string(" did not complete within ") + seconds + " s (timeout_s): another rank died, hangs or skipped this collective";
    failed_ = what;
    rt::abort_job_at_exit(message);
    ablate::throw_runtime_error("", message);
  }

  double timeout_s_;
  int64_t ring_min_bytes_;
  int64_t segment_bytes_;  // ring messages are cut into segments of this many bytes
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<std::byte[]> scratch_;  // (2, segment_bytes): received ring segments
  std::size_t scratch_bytes_ = 0;
  std::string failed_;  // the operation that timed out, once one has
  std::mutex mu_;
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::communicator,
         "mpi",
         "1.0.0",
         "processes started by mpirun or srun, host buffers (Open MPI); collectives time out",
         {ablate::param::floating("timeout_s", 300.0,
                                  "seconds a rank waits for the others in one collective before the job is "
                                  "aborted (0 = wait forever)")
              .within(0, 1e9),
          ablate::param::integer("ring_min_bytes", int64_t(1) << 20,
                                 "all_reduce buffers of at least this many bytes go round the ring; smaller "
                                 "ones use MPI_Iallreduce")
              .within(0, double(int64_t(1) << 30)),
          ablate::param::integer("segment_bytes", int64_t(8) << 20,
                                 "ring messages are cut into segments of this many bytes; a rank reduces one "
                                 "while the next arrives (scratch memory: two segments)")
              .within(64, double(int64_t(1) << 30))},
         [](const ablate::ComponentArgs& a) {
           return std::make_unique<MpiCommunicator>(a.own.get_float("timeout_s"), a.own.get_int("ring_min_bytes"),
                                                    a.own.get_int("segment_bytes"));
         },
         "",
         {"cpu"}});
}

}  // namespace

ABLATE_PLUGIN("mpi", "1.0.0", register_components)
