// The `cuda` device: buffers in GPU memory (cudaMalloc, counted for memory_in_use), one
// non-blocking stream for every call, batches copied up in one transfer (core's pack_batch), and
// the trainer's reductions as kernels (cuda_device_kernels.cu) whose per-block partial sums the
// host adds in block order. The GPU is the launcher's local rank (one process per GPU), else 0.
// Without a visible CUDA device, asking for it is an input error naming run.device.
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "ablate/cuda_check.hpp"
#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/launch_env.hpp"
#include "ablate/metrics.hpp"
#include "ablate/plugin.hpp"
#include "cuda_device_kernels.hpp"

namespace ablate::cuda_device {
namespace {

// A captured step: its graph instantiated once, launched on the device's stream by each replay.
class Graph final : public CapturedWork {
 public:
  Graph(cudaGraph_t graph, cudaStream_t stream) : graph_(graph), stream_(stream) {
    const cudaError_t rc = cudaGraphInstantiate(&exec_, graph_, 0);
    if (rc != cudaSuccess) {
      cudaGraphDestroy(graph_);
      (void)cudaGetLastError();
      throw_runtime_error("run.cuda_graph", std::string("the captured step could not be instantiated: ") + cudaGetErrorString(rc));
    }
    std::size_t nodes = 0;
    if (cudaGraphGetNodes(graph_, nullptr, &nodes) == cudaSuccess) nodes_ = int64_t(nodes);
    (void)cudaGetLastError();
  }
  ~Graph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void replay() override { ABLATE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }
  int64_t calls() const override { return nodes_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int64_t nodes_ = 0;
};

int64_t view_bytes(const TensorView& t) { return t.numel() * int64_t(dtype_size(t.dtype)); }

void require_f32(const TensorView& t, const char* what) {
  if (t.dtype != DType::f32 || t.device != DeviceType::cuda) {
    throw_runtime_error("cuda device", std::string(what) + " needs an f32 view of device memory");
  }
}

// One value of `dtype` in device memory: the scalars of the *_to reductions.
void require_scalar(const TensorView& t, DType dtype, const char* what) {
  if (t.dtype != dtype || t.device != DeviceType::cuda || t.numel() != 1) {
    throw_runtime_error("cuda device", std::string(what) + " needs one " + to_string(dtype) + " value in device memory");
  }
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    ABLATE_CUDA_CHECK(cudaSetDevice(ordinal_));
    cudaDeviceProp prop{};
    ABLATE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
    name_ = prop.name;
    fp8_ = prop.major * 10 + prop.minor >= 89;  // Ada and Hopper on: FP8 tensor cores
    size_t free_b = 0, total_b = 0;
    ABLATE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    capacity_ = int64_t(total_b);
    ABLATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ABLATE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partials_), kReduceBlocks * sizeof(double)));
    ABLATE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_partials_), kReduceBlocks * sizeof(double)));
    baseline_used_ = gpu_bytes_used();
  }

  ~CudaDevice() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (partials_ != nullptr) cudaFree(partials_);
    if (host_partials_ != nullptr) cudaFreeHost(host_partials_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  DeviceType type() const noexcept override { return DeviceType::cuda; }
  DeviceCapabilities capabilities() const override {
    DeviceCapabilities c;
    c.host_memory = false;
    c.reduced_precision_products = true;
    c.fp8_products = fp8_;
    c.collective = "nccl";
    c.step_capture = true;
    return c;
  }
  std::string describe() const override { return name_ + " (cuda:" + std::to_string(ordinal_) + ")"; }

  Buffer alloc(DType dtype, int64_t count) override {
    if (count <= 0) return {};
    const std::size_t bytes = std::size_t(count) * dtype_size(dtype);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw_input_error("run.device", "cannot allocate " + std::to_string(bytes) + " bytes on " + describe() + ": " +
                                          std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes free (" +
                                          cudaGetErrorString(rc) + ")");
    }
    ABLATE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = int64_t(bytes);
    in_use_ += int64_t(bytes);
    peak_ = std::max(peak_, in_use_);
    sample_outside_locked();
    return Buffer(this, p, dtype, count);
  }

  void release(void* data) noexcept override {
    cudaStreamSynchronize(stream_);  // no kernel still reads it
    {
      // Out of the accounting before the memory goes back: once freed, another thread's alloc may
      // be given the same address, and its entry must not be the one erased here.
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(data);
      if (it != sizes_.end()) {
        in_use_ -= it->second;
        sizes_.erase(it);
      }
    }
    cudaFree(data);
  }

  int64_t memory_in_use() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  // The most this process has held on the GPU at once: this device's buffers at their peak plus the
  // largest amount held beside them (sample_outside_locked).
  int64_t memory_peak() const override {
    std::lock_guard<std::mutex> lock(mu_);
    sample_outside_locked();
    return peak_ + outside_peak_;
  }
  int64_t memory_capacity() const override { return capacity_; }

  void upload(TensorView dst, const void* host) override {
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, std::size_t(view_bytes(dst)), cudaMemcpyHostToDevice, stream_));
  }
  void download(void* host, TensorView src) override {
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(host, src.data, std::size_t(view_bytes(src)), cudaMemcpyDeviceToHost, stream_));
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void upload_batch(const Batch& batch, DeviceBatch& out) override {
    pack_batch(batch, out.staging);
    const int64_t n = int64_t(out.staging.size());
    if (out.storage.count() < n) out.storage = alloc(DType::i32, n);
    ABLATE_CUDA_CHECK(
        cudaMemcpyAsync(out.storage.data(), out.staging.data(), std::size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    out.views = batch_views_at(batch, static_cast<int32_t*>(out.storage.data()), DeviceType::cuda);
  }

  void fill(TensorView x, float value) override {
    require_f32(x, "fill");
    launch_fill(x.as<float>(), x.numel(), value, stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  double squared_norm(TensorView x) override {
    require_f32(x, "squared_norm");
    launch_squared_norm(x.as<const float>(), x.numel(), partials_, stream_);
    return sum_partials();
  }

  void to_bf16(TensorView dst, TensorView src) override {
    check_to_bf16(dst, src, DeviceType::cuda);
    launch_to_bf16(src.as<const float>(), static_cast<uint16_t*>(dst.data), src.numel(), stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  void dequantize_nf4(TensorView dst, TensorView codes, TensorView absmax) override {
    check_dequantize_nf4(dst, codes, absmax, DeviceType::cuda);
    launch_dequantize_nf4(static_cast<const uint8_t*>(codes.data), absmax.as<const float>(), dst.as<float>(), dst.numel(), stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  void copy(TensorView dst, TensorView src) override {
    check_copy(dst, src, DeviceType::cuda);
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, std::size_t(view_bytes(src)), cudaMemcpyDeviceToDevice, stream_));
  }

  void scale(TensorView x, float factor) override {
    require_f32(x, "scale");
    launch_scale(x.as<float>(), x.numel(), factor, stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  double masked_loss_sum(TensorView losses, TensorView targets) override {
    require_f32(losses, "masked_loss_sum");
    if (targets.dtype != DType::i32 || targets.numel() != losses.numel()) {
      throw_runtime_error("cuda device", "masked_loss_sum needs i32 targets, one per loss");
    }
    launch_masked_loss_sum(losses.as<const float>(), targets.as<const int32_t>(), losses.numel(), partials_, stream_);
    return sum_partials();
  }

  // The reductions left on the stream: the partials summed by one thread there, in the order
  // sum_partials() adds them on the host.
  void masked_loss_sum_to(TensorView losses, TensorView targets, TensorView out, bool add) override {
    require_f32(losses, "masked_loss_sum_to");
    require_scalar(out, DType::f64, "masked_loss_sum_to");
    if (targets.dtype != DType::i32 || targets.numel() != losses.numel()) {
      throw_runtime_error("cuda device", "masked_loss_sum_to needs i32 targets, one per loss");
    }
    launch_masked_loss_sum(losses.as<const float>(), targets.as<const int32_t>(), losses.numel(), partials_, stream_);
    launch_sum_partials(partials_, out.as<double>(), add, stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  void squared_norm_to(TensorView x, TensorView out) override {
    require_f32(x, "squared_norm_to");
    require_scalar(out, DType::f64, "squared_norm_to");
    launch_squared_norm(x.as<const float>(), x.numel(), partials_, stream_);
    launch_sum_partials(partials_, out.as<double>(), false, stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  void clip_factor_to(TensorView squared_norm, double clip, TensorView factor) override {
    require_scalar(squared_norm, DType::f64, "clip_factor_to");
    require_scalar(factor, DType::f32, "clip_factor_to");
    launch_clip_factor(squared_norm.as<const double>(), clip, factor.as<float>(), stream_);
    ABLATE_CUDA_CHECK(cudaGetLastError());
  }

  void synchronize() override { ABLATE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  Stream stream() const noexcept override { return Stream(stream_); }

  // A CUDA graph of the stream's work: captured in the global mode, so that an allocation, a free
  // or a wait anywhere in the process while it records fails (the graph would not be the calls).
  void begin_capture() override { ABLATE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)); }
  std::unique_ptr<CapturedWork> end_capture() override {
    cudaGraph_t graph = nullptr;
    const cudaError_t rc = cudaStreamEndCapture(stream_, &graph);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw_runtime_error("run.cuda_graph", std::string("the step could not be captured on ") + describe() + ": " +
                                                cudaGetErrorString(rc) +
                                                " (a call inside it waited for the device, allocated or freed memory; "
                                                "set run.cuda_graph = false)");
    }
    return std::make_unique<Graph>(graph, stream_);
  }
  void abort_capture() noexcept override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &status) != cudaSuccess || status == cudaStreamCaptureStatusNone) return;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }

  double peak_tflops(DType dtype) const override {
    return peak_tflops_for_device(name_, dtype == DType::bf16 || dtype == DType::f16 ? "bf16" : "fp32");
  }

 private:
  // GPU memory in use now, by every process (the card's total less its free bytes).
  static int64_t gpu_bytes_used() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return int64_t(total_b) - int64_t(free_b);
  }

  // What the process holds on the GPU beside this device's buffers: the optimizer's state and the
  // workspaces of cuBLAS, cuDNN and NCCL, which their plugins allocate themselves. It is the memory
  // in use now, less what was in use when the device was made (the CUDA context, other processes)
  // and less this device's buffers; sampled at each allocation and each memory_peak() (the trainer
  // asks after every step), and its largest value kept. Without it a run's peak would leave out
  // the optimizer's state on this device, where the cpu device's (the process's resident memory)
  // includes it.
  void sample_outside_locked() const {
    const int64_t used = gpu_bytes_used();
    if (used < 0 || baseline_used_ < 0) return;
    outside_peak_ = std::max(outside_peak_, used - baseline_used_ - in_use_);
  }

  double sum_partials() {
    ABLATE_CUDA_CHECK(cudaGetLastError());
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(host_partials_, partials_, kReduceBlocks * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    double sum = 0;
    for (int b = 0; b < kReduceBlocks; ++b) sum += host_partials_[b];
    return sum;
  }

  int ordinal_;
  std::string name_;
  bool fp8_ = false;  // compute capability 8.9 or later
  int64_t capacity_ = 0;
  cudaStream_t stream_ = nullptr;
  double* partials_ = nullptr;       // (kReduceBlocks) on the device
  double* host_partials_ = nullptr;  // (kReduceBlocks) pinned
  mutable std::mutex mu_;
  std::unordered_map<void*, int64_t> sizes_;
  int64_t in_use_ = 0, peak_ = 0;
  int64_t baseline_used_ = -1;        // GPU memory in use when the device was made
  mutable int64_t outside_peak_ = 0;  // the most held beside this device's buffers (under mu_)
};

std::unique_ptr<Component> make_cuda_device(const ComponentArgs&) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw_input_error("run.device", std::string("\"cuda\": no CUDA device is visible to this process (") +
                                        (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") +
                                        "); train with run.device = \"cpu\"");
  }
  int ordinal = 0;
  try {
    ordinal = launch::gpu_ordinal(launch::read_launch_env(), count);
  } catch (const std::invalid_argument& e) {
    throw_input_error("launcher environment", e.what());
  }
  return std::make_unique<CudaDevice>(ordinal);
}

void register_components(Registrar& r) {
  ComponentInfo info;
  info.kind = Kind::device;
  info.name = "cuda";
  info.version = "1.0.0";
  info.doc = "an NVIDIA GPU through the CUDA runtime: GPU memory, one stream, reductions as kernels";
  info.devices = {"cuda"};
  info.factory = make_cuda_device;
  r.add(std::move(info));
}

}  // namespace
}  // namespace ablate::cuda_device

ABLATE_PLUGIN("cuda_device", "1.0.0", ablate::cuda_device::register_components)
