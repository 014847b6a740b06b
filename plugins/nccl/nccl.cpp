// The `nccl` communicator: data parallelism over GPUs, one process per GPU, on device buffers.
// Rank and world come from MPI (mpirun or srun starts the processes), the GPU from the local rank
// (launch::gpu_ordinal, as the cuda device chooses), and rank 0's NCCL unique id reaches the others by MPI broadcast.
// all_reduce and reduce_scatter reduce f32, f64, bf16, f16 and i32 (sum, max); broadcast and
// all_gather move any dtype. Collectives run on the communicator's own stream. Given the model's
// stream (Communicator::set_stream, as the engine does), a collective waits on the GPU for the work
// already on that stream (an event), and the call returns once NCCL has issued it: the host runs
// on, the backward pass goes on on the model's stream, and join() waits for the collectives (on the
// host, against the deadline) and orders the model's stream after them. Without a model stream,
// each call synchronises the device first and returns complete. The communicator is non-blocking,
// so a collective that exceeds [run.nccl] timeout_s is aborted (ncclCommAbort) and throws
// ablate::Error naming the rank, the operation and the element count, and the MPI job is aborted
// at exit.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "ablate/communicator.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "mpi_runtime.hpp"

namespace {

using ablate::DType;
using ablate::ReduceOp;
using ablate::TensorView;
namespace rt = ablate::mpi_runtime;

constexpr const char* kWhere = "nccl communicator";

// ncclInProgress is how a non-blocking communicator says "started"; completion is polled for.
void check_nccl(ncclResult_t rc, const char* call, const char* file, int line) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  const char* last = ncclGetLastError(nullptr);
  ablate::throw_runtime_error(std::string(file) + ":" + std::to_string(line),
                              std::string(call) + " failed: " + ncclGetErrorString(rc) +
                                  (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : ""));
}
#define ABLATE_NCCL_CHECK(call) check_nccl((call), #call, __FILE__, __LINE__)

// The NCCL type that reduces `dtype`, if NCCL can (u8 and u16 are moved, never reduced).
bool reducible_type(DType dtype, ncclDataType_t& out) {
  switch (dtype) {
    case DType::f32: out = ncclFloat32; return true;
    case DType::f64: out = ncclFloat64; return true;
    case DType::bf16: out = ncclBfloat16; return true;
    case DType::f16: out = ncclFloat16; return true;
    case DType::i32: out = ncclInt32; return true;
    case DType::u8:
    case DType::u16: return false;
  }
  return false;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

class NcclCommunicator final : public rt::LaunchedCommunicator {
 public:
  explicit NcclCommunicator(double timeout_s) : LaunchedCommunicator(kWhere), timeout_s_(timeout_s) {
    int devices = 0;
    ABLATE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices == 0) ablate::throw_runtime_error(prefix(), "no CUDA device is visible to this process");
    // The cuda device's choice (launch::gpu_ordinal from the launcher's local rank), so the model's
    // buffers and the collectives are on one GPU. Two ranks on one GPU are NCCL's to refuse.
    device_ = ablate::launch::gpu_ordinal(ablate::launch::read_launch_env(), devices);
    ABLATE_CUDA_CHECK(cudaSetDevice(device_));

    // Rank 0 makes the unique id; MPI carries it to the others, against the same deadline as a collective.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (where_.rank == 0) ABLATE_NCCL_CHECK(ncclGetUniqueId(&id));
    const rt::Deadline deadline = rt::Deadline::after(timeout_s_);
    MPI_Comm bootstrap = MPI_COMM_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
    ABLATE_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &bootstrap, &request));
    if (!rt::wait_until(request, deadline)) fail("creating the MPI communicator", -1, DType::u8, timed_out());
    ABLATE_MPI_CHECK(MPI_Comm_set_errhandler(bootstrap, MPI_ERRORS_RETURN));
    ABLATE_MPI_CHECK(MPI_Ibcast(&id, int(sizeof id), MPI_BYTE, 0, bootstrap, &request));
    if (!rt::wait_until(request, deadline)) fail("the broadcast of NCCL's unique id", -1, DType::u8, timed_out());
    ABLATE_MPI_CHECK(MPI_Comm_free(&bootstrap));

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return at once; completion and errors are polled, so a hang can time out
    ABLATE_NCCL_CHECK(ncclCommInitRankConfig(&comm_, where_.world, id, where_.rank, &config));
    wait_ready("ncclCommInitRankConfig", -1, DType::u8, deadline);
    ABLATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ABLATE_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    ABLATE_CUDA_CHECK(cudaEventCreateWithFlags(&outputs_ready_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr && failed_.empty()) {
      ncclCommFinalize(comm_);  // flushes outstanding work; polled like any call on a non-blocking comm
      const rt::Deadline deadline = rt::Deadline::after(timeout_s_ > 0 ? timeout_s_ : 60.0);
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress && !deadline.passed(rt::Clock::now())) {
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (barrier_word_ != nullptr) cudaFree(barrier_word_);
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (outputs_ready_ != nullptr) cudaEventDestroy(outputs_ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }


  void all_reduce(TensorView buffer, ReduceOp op) override {
    const std::string what = std::string("all_reduce (") + ablate::to_string(op) + ")";
    run(what, buffer, true, [&](ncclDataType_t type, std::size_t) {
      ABLATE_NCCL_CHECK(ncclAllReduce(buffer.data, buffer.data, std::size_t(buffer.numel()), type, nccl_op(op), comm_, stream_));
    });
  }

  void reduce(TensorView buffer, ReduceOp op, int root) override {
    const std::string what = std::string("reduce (") + ablate::to_string(op) + ") to rank " + std::to_string(root);
    if (root < 0 || root >= where_.world) ablate::throw_input_error("nccl", what + ": the root is not a rank of this world");
    run(what, buffer, true, [&](ncclDataType_t type, std::size_t) {
      ABLATE_NCCL_CHECK(ncclReduce(buffer.data, buffer.data, std::size_t(buffer.numel()), type, nccl_op(op), root, comm_, stream_));
    });
  }

  // An even split is NCCL's in-place ncclReduceScatter (shard r at r * numel / world); an uneven one
  // is one ncclReduce per shard, rooted at its owner, in one group.
  void reduce_scatter(TensorView buffer, ReduceOp op) override {
    const std::string what = std::string("reduce_scatter (") + ablate::to_string(op) + ")";
    run(what, buffer, true, [&](ncclDataType_t type, std::size_t esize) {
      auto* base = static_cast<char*>(buffer.data);
      const int64_t n = buffer.numel();
      if (n % where_.world == 0) {
        const std::size_t count = std::size_t(n / where_.world);
        char* mine = base + where_.rank * count * esize;
        ABLATE_NCCL_CHECK(ncclReduceScatter(base, mine, count, type, nccl_op(op), comm_, stream_));
        return;
      }
      ABLATE_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < where_.world; ++r) {
        const ablate::Shard s = ablate::shard_of(n, where_.world, r);
        if (s.count == 0) continue;
        char* p = base + s.offset * esize;
        ABLATE_NCCL_CHECK(ncclReduce(p, p, std::size_t(s.count), type, nccl_op(op), r, comm_, stream_));
      }
      ABLATE_NCCL_CHECK(ncclGroupEnd());
    });
  }

  // The inverse: NCCL's in-place ncclAllGather for an even split, one ncclBroadcast per shard
  // from its owner for an uneven one. Moved as bytes, so any dtype works.
  void all_gather(TensorView buffer) override {
    run("all_gather", buffer, false, [&](ncclDataType_t, std::size_t esize) {
      auto* base = static_cast<char*>(buffer.data);
      const int64_t n = buffer.numel();
      if (n % where_.world == 0) {
        const std::size_t bytes = std::size_t(n / where_.world) * esize;
        ABLATE_NCCL_CHECK(ncclAllGather(base + where_.rank * bytes, base, bytes, ncclUint8, comm_, stream_));
        return;
      }
      ABLATE_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < where_.world; ++r) {
        const ablate::Shard s = ablate::shard_of(n, where_.world, r);
        if (s.count == 0) continue;
        char* p = base + s.offset * esize;
        ABLATE_NCCL_CHECK(ncclBroadcast(p, p, std::size_t(s.count) * esize, ncclUint8, r, comm_, stream_));
      }
      ABLATE_NCCL_CHECK(ncclGroupEnd());
    });
  }

  void broadcast(TensorView buffer, int root) override {
    const std::string what = "broadcast from rank " + std::to_string(root);
    if (root < 0 || root >= where_.world) {
      ablate::throw_input_error(prefix(), what + ": the root is not a rank of this world of " + std::to_string(where_.world));
    }
    run(what, buffer, false, [&](ncclDataType_t, std::size_t esize) {
      ABLATE_NCCL_CHECK(ncclBroadcast(buffer.data, buffer.data, std::size_t(buffer.numel()) * esize, ncclUint8, root, comm_, stream_));
    });
  }

  // Host values go through a device copy: NCCL reads and writes device memory only.
  void all_reduce_host(TensorView host, ReduceOp op) override {
    through_device(host, [&](TensorView dev) { all_reduce(dev, op); });
  }
  void all_gather_host(TensorView host) override {
    through_device(host, [&](TensorView dev) { all_gather(dev); });
  }

  void join() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return;
    const std::string what = pending_;
    pending_.clear();
    check_usable(what);
    ABLATE_CUDA_CHECK(cudaSetDevice(device_));
    wait_stream(what, -1, DType::u8, pending_deadline_);
    if (stream()) {
      ABLATE_CUDA_CHECK(cudaEventRecord(outputs_ready_, stream_));
      ABLATE_CUDA_CHECK(cudaStreamWaitEvent(stream().as<cudaStream_t>(), outputs_ready_, 0));
    }
  }

  // An all-reduce of one int on the device: NCCL has no barrier of its own.
  void barrier() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("barrier");
    ABLATE_CUDA_CHECK(cudaSetDevice(device_));
    if (barrier_word_ == nullptr) ABLATE_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(int)));
    const rt::Deadline deadline = rt::Deadline::after(timeout_s_);
    ABLATE_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_));
    wait_ready("barrier", -1, DType::u8, deadline);
    wait_stream("barrier", -1, DType::u8, deadline);
  }

 private:
  template <class Collective>
  void through_device(TensorView host, Collective&& collective) {
    const std::size_t bytes = std::size_t(host.numel()) * ablate::dtype_size(host.dtype);
    ABLATE_CUDA_CHECK(cudaSetDevice(device_));
    if (staging_.size() < bytes) staging_.resize(bytes);
    // On our stream: ordered with the collective whether or not it returns before completing. Host
    // values depend on nothing the model's stream holds, so the collective does not wait for it
    // (a scalar all-reduce is not held up behind the backward pass, nor timed with it).
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(staging_.data(), host.data, bytes, cudaMemcpyHostToDevice, stream_));
    host_inputs_ = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{host_inputs_};
    collective(ablate::flat_view(staging_.data(), host.dtype, host.numel(), ablate::DeviceType::cuda));
    join();
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(host.data, staging_.data(), bytes, cudaMemcpyDeviceToHost, stream_));
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::string prefix() const {
    return std::string(kWhere) + ": rank " + std::to_string(where_.rank) + " of " + std::to_string(where_.world);
  }

  void check_usable(const std::string& what) const {
    if (!failed_.empty()) {
      ablate::throw_runtime_error(prefix(), what + " after an earlier collective failed (" + failed_ + ")");
    }
  }

  // Validates the buffer, waits for the work already queued on this device (the buffer's producers
  // may be on any stream), enqueues the collective on our stream and waits for it against the deadline.
  template <class Enqueue>
  void run(const std::string& what, const TensorView& buffer, bool reduces, Enqueue&& enqueue) {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(what);
    ncclDataType_t type = ncclUint8;
    if (reduces && !reducible_type(buffer.dtype, type)) {
      ablate::throw_input_error(prefix(), what + " of " + ablate::to_string(buffer.dtype) +
                                              " elements: nccl reduces f32, f64, bf16, f16 and i32");
    }
    if (buffer.numel() == 0) return;
    check_device_buffer(what, buffer);
    ABLATE_CUDA_CHECK(cudaSetDevice(device_));
    const rt::Deadline deadline = rt::Deadline::after(timeout_s_);
    if (stream()) {
      // Stream order: the collective waits on the GPU for what the model's stream holds now
      // (unless its inputs are host values staged on our own stream).
      if (!host_inputs_) {
        ABLATE_CUDA_CHECK(cudaEventRecord(inputs_ready_, stream().as<cudaStream_t>()));
        ABLATE_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
      }
      enqueue(type, ablate::dtype_size(buffer.dtype));
      wait_ready(what, buffer.numel(), buffer.dtype, deadline);
      if (pending_.empty()) pending_deadline_ = deadline;  // the oldest unjoined collective's
      pending_ = what;
      return;
    }
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
    enqueue(type, ablate::dtype_size(buffer.dtype));
    wait_ready(what, buffer.numel(), buffer.dtype, deadline);
    wait_stream(what, buffer.numel(), buffer.dtype, deadline);
  }

  void check_device_buffer(const std::string& what, const TensorView& buffer) const {
    if (buffer.device != ablate::DeviceType::cuda) {
      ablate::throw_input_error(prefix(), what + " of a " + std::string(ablate::to_string(buffer.device)) +
                                              " buffer: nccl serves GPU buffers (mpi serves host buffers)");
    }
    if (buffer.data == nullptr || buffer.numel() < 0) {
      ablate::throw_input_error(prefix(), what + ": the buffer has no data");
    }
    cudaPointerAttributes attributes{};
    ABLATE_CUDA_CHECK(cudaPointerGetAttributes(&attributes, buffer.data));
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      ablate::throw_input_error(prefix(), what + ": the buffer is not GPU memory");
    }
    if (attributes.device != device_) {
      ablate::throw_input_error(prefix(), what + ": the buffer is on GPU " + std::to_string(attributes.device) +
                                              ", this rank uses GPU " + std::to_string(device_));
    }
  }

  // A non-blocking communicator's calls return before they are issued; this waits until NCCL has
  // issued them (or failed, or the deadline passed).
  void wait_ready(const std::string& what, int64_t numel, DType dtype, const rt::Deadline& deadline) {
    const rt::Clock::time_point start = rt::Clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ABLATE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, numel, dtype, std::string("failed: ") + ncclGetErrorString(state));
      const rt::Clock::time_point now = rt::Clock::now();
      if (deadline.passed(now)) fail(what, numel, dtype, timed_out());
      if (now - start > std::chrono::milliseconds(50)) sched_yield();
    }
  }

  // Waits for our stream to drain, watching for NCCL errors (a peer that died) and the deadline.
  void wait_stream(const std::string& what, int64_t numel, DType dtype, const rt::Deadline& deadline) {
    const rt::Clock::time_point start = rt::Clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ablate::cuda::check(q, "cudaStreamQuery(stream_)", __FILE__, __LINE__);
      ncclResult_t state = ncclSuccess;
      ABLATE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(what, numel, dtype, std::string("failed: ") + ncclGetErrorString(state));
      }
      const rt::Clock::time_point now = rt::Clock::now();
      if (deadline.passed(now)) fail(what, numel, dtype, timed_out());
      if (now - start > std::chrono::milliseconds(50)) sched_yield();
    }
  }

  std::string timed_out() const {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout_s_);
    return std::string("did not complete within ") + seconds + " s (timeout_s): another rank died, hangs or skipped this collective";
  }

  // The collective failed or did not complete in time: the NCCL communicator is aborted (its kernels
  // stop waiting for the missing peer), this communicator is unusable from now on, the MPI job ends
  // when the process exits, and the caller learns why.
  [[noreturn]] void fail(const std::string& what, int64_t numel, DType dtype, const std::string& why) {
    std::string message = prefix() + ": " + what;
    if (numel >= 0) message += " of " + std::to_string(numel) + " " + ablate::to_string(dtype) + " elements";
    message += " " + why;
    failed_ = what;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    rt::abort_job_at_exit(message);
    ablate::throw_runtime_error("", message);
  }

  double timeout_s_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr, outputs_ready_ = nullptr;  // model stream -> ours, ours -> model stream
  std::string pending_;                                           // the last collective issued and not yet joined ("" = none)
  rt::Deadline pending_deadline_{};                               // the oldest of those collectives' deadline
  ncclComm_t comm_ = nullptr;
  int* barrier_word_ = nullptr;                        // (1) on device_, the barrier's all-reduce operand
  ablate::cuda::DeviceBuffer<unsigned char> staging_;  // host values on their way through NCCL
  bool host_inputs_ = false;                           // the collective under way reduces host values staged on stream_ (set
                                                       // by through_device; a communicator is called from one thread, the trainer's)
  std::string failed_;
  std::mutex mu_;
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::communicator,
         "nccl",
         "1.0.0",
         "one process per GPU started by mpirun or srun, GPU buffers (NCCL); collectives time out",
         {ablate::param::floating("timeout_s", 300.0,
                                  "seconds a rank waits for the others in one collective before the job is "
                                  "aborted (0 = wait forever)")
              .within(0, 1e9)},
         [](const ablate::ComponentArgs& a) { return std::make_unique<NcclCommunicator>(a.own.get_float("timeout_s")); },
         "",
         {"cuda"}});
}

}  // namespace

ABLATE_PLUGIN("nccl", "1.0.0", register_components)
