// The Device seam: where a model's parameters, gradients, activations and batches live, and the few
// operations the trainer itself performs on them (fill, squared norm, scale, the masked loss sum),
// so that the trainer and the model hold no device branch. Implementations: `cpu` (in core, host
// memory; a batch is viewed in place, without a copy) and `cuda` (plugins/cuda_device). Core holds
// no CUDA header: a device plugin hides its runtime behind this interface (docs/architecture.md).
//
// Ordering: calls on one device are executed in the order they are made. The calls that hand a
// value back to the host (download, squared_norm, masked_loss_sum) return only once it is there;
// everything else may still be running on return (synchronize() waits for it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ablate/batch.hpp"
#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

class Device;

// `count` elements of `dtype` in a device's memory, freed by that device with the object. Moves,
// never copies. An empty buffer has no device.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device* device, void* data, DType dtype, int64_t count) noexcept
      : device_(device), data_(data), dtype_(dtype), count_(count) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const noexcept { return data_; }
  DType dtype() const noexcept { return dtype_; }
  int64_t count() const noexcept { return count_; }
  int64_t bytes() const noexcept { return count_ * int64_t(dtype_size(dtype_)); }
  bool empty() const noexcept { return count_ == 0; }
  // The whole buffer as a flat view, or `n` elements from element `offset`.
  TensorView view() const noexcept;
  TensorView view(int64_t offset, int64_t n) const noexcept;

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  int64_t count_ = 0;
};

// A micro-batch as layers and attention backends read it: i32 views on the model's device, made
// by one Device::upload_batch call. `host` is the Batch they were made from, for host-side
// bookkeeping only (shapes, counts); kernels never read it.
struct BatchViews {
  int32_t rows = 0;          // B
  int32_t seq_len = 0;       // T
  int32_t num_segments = 0;  // S: all rows' segments
  TensorView tokens;         // (B, T)
  TensorView targets;        // (B, T), -1 = no loss
  TensorView positions;      // (B, T)
  TensorView segment_ids;    // (B, T), 1..S per row, 0 = padding
  TensorView segments;       // (S, 2): start, length of each segment, row after row
  TensorView row_segments;   // (B + 1): the segments of row r are [row_segments[r], row_segments[r+1])
  const Batch* host = nullptr;
  DeviceType device = DeviceType::cpu;
};

// What upload_batch leaves behind: the views, and the memory they point into when the device is
// not the host's. Reused from micro-batch to micro-batch (grows, never shrinks).
struct DeviceBatch {
  BatchViews views;
  Buffer storage;                // the device copy (empty on the CPU)
  std::vector<int32_t> staging;  // the host packing of one batch (pack_batch)
};

// The six arrays of `batch` one after another in `staging` (tokens, targets, positions,
// segment_ids, segments as (start, length) pairs, row_segments), so that a device copies a batch
// in one transfer; and the views of that packing at `base` (host or device memory).
void pack_batch(const Batch& batch, std::vector<int32_t>& staging);
BatchViews batch_views_at(const Batch& batch, int32_t* base, DeviceType device);
// The views of `batch` itself (host memory, no copy).
BatchViews host_batch_views(const Batch& batch);

// What a device can do, for the runtime to decide by (the memory budget, run.dtype, the
// communicator for several ranks) instead of by the device's name.
struct DeviceCapabilities {
  // Buffers are host memory: the parameters share the host's memory budget (run.memory_gb) and a
  // batch is viewed in place.
  bool host_memory = true;
  // Matrix products in run.dtype's reduced-precision modes ("tf32", "bf16"); a device without them
  // computes in fp32 and refuses those modes rather than report itself against their peaks.
  bool reduced_precision_products = false;
  // Matrix products of FP8 operands (run.dtype "fp8", "fp8_e4m3"): compute capability 8.9 or later.
  bool fp8_products = false;
  // The communicator run.communicator = "auto" picks when a launcher starts several ranks ("": the
  // device has none, and such a job must name run.communicator).
  std::string collective;
  // Work on the device's queue can be captured and replayed (begin_capture; run.cuda_graph).
  bool step_capture = false;
};

// Device work recorded between Device::begin_capture and end_capture (a CUDA graph), run again,
// in order and on the device's queue, by each replay(). What it reads and writes is the memory
// the recorded calls named: the buffers must outlive it and keep their addresses.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;
  // The calls recorded (a graph's nodes).
  virtual int64_t calls() const = 0;
};

class Device : public Component {
 public:
  ~Device() override;
  virtual DeviceType type() const noexcept = 0;
  virtual DeviceCapabilities capabilities() const = 0;
  // What the device is, as a person reads it ("cpu (16 threads)", "NVIDIA H100 80GB HBM3").
  virtual std::string describe() const = 0;

  // Memory: a buffer of `count` zeros of `dtype` (a failure to allocate names the bytes asked
  // for and the bytes free), and the memory it holds.
  virtual Buffer alloc(DType dtype, int64_t count) = 0;
  virtual void release(void* data) noexcept = 0;  // Buffer's destructor
  virtual int64_t memory_in_use() const = 0;      // bytes allocated through this device now
  virtual int64_t memory_peak() const = 0;        // the most ever in use at once
  // Bytes the device has in all (0 = unknown: the host's memory budget applies).
  virtual int64_t memory_capacity() const = 0;

  // Copies between host memory and device views (bytes = the view's elements).
  virtual void upload(TensorView dst, const void* host) = 0;
  virtual void download(void* host, TensorView src) = 0;
  // The views of one micro-batch on this device (the CPU views it in place).
  virtual void upload_batch(const Batch& batch, DeviceBatch& out) = 0;

  // The trainer's reductions, on f32 views: every element set to `value`; sum of squares
  // accumulated in double; every element multiplied by `factor`; the sum in double of
  // losses[i] over the positions whose targets[i] (i32) is not -1.
  virtual void fill(TensorView x, float value) = 0;
  virtual double squared_norm(TensorView x) = 0;
  virtual void scale(TensorView x, float factor) = 0;
  virtual double masked_loss_sum(TensorView losses, TensorView targets) = 0;
  // The same reductions left on the device, so that a step waits for nothing until it ends. `out`,
  // `squared_norm` and `factor` are one-element views on this device (f64, f64, f32): out = the
  // masked loss sum, added to what out holds when `add`; out = the squared norm of x; factor =
  // device_math::clip_factor(sqrt(squared_norm), clip). Each is the value the host versions above
  // give (and the host's sum of them), bit for bit. The defaults go through the host versions and
  // download / upload, and so wait; a device with a queue overrides them to stay on it.
  virtual void masked_loss_sum_to(TensorView losses, TensorView targets, TensorView out, bool add);
  virtual void squared_norm_to(TensorView x, TensorView out);
  virtual void clip_factor_to(TensorView squared_norm, double clip, TensorView factor);
  // dst (bf16) = the nearest bf16 of each element of src (f32), ties to even (device_math::bf16_bits):
  // the bf16 copy of the weights that bf16 products read.
  virtual void to_bf16(TensorView dst, TensorView src) = 0;
  // dst (f32, n values) = the NF4 tensor of `codes` (u8, ceil(n/2)) and `absmax` (f32, ceil(n/64))
  // in nf4.hpp's layout (nf4::value per element): a frozen base's 4-bit weights, dequantized for
  // the product that reads them.
  virtual void dequantize_nf4(TensorView dst, TensorView codes, TensorView absmax) = 0;
  // dst = src: as many elements of one dtype, both on this device.
  virtual void copy(TensorView dst, TensorView src) = 0;

  virtual void synchronize() = 0;
  // Capture (capabilities().step_capture): from begin_capture on, the calls made on this device and
  // on its stream() by the plugins are recorded instead of run, until end_capture hands the record
  // back. A call that waits for the device (download, synchronize, the host reductions), allocates
  // or frees while capturing cannot be recorded: end_capture then throws, naming it.
  // abort_capture ends a capture without a record (after an exception inside it). The defaults
  // throw: a device without a queue has nothing to capture.
  virtual void begin_capture();
  virtual std::unique_ptr<CapturedWork> end_capture();
  virtual void abort_capture() noexcept {}
  // The queue the device executes its calls in, for plugins of the same device to launch their
  // work in order with it (cuda: a cudaStream_t); null where there is none (the cpu).
  virtual Stream stream() const noexcept { return nullptr; }
  // The device's peak dense matrix rate for `dtype` in TFLOP/s from the table of known devices
  // (metrics.hpp), or 0 when it has none (a CPU: the trainer measures it), or a negative value for
  // an emulated device, whose speed is no hardware's: the trainer then reports no peak and no MFU.
  virtual double peak_tflops(DType dtype) const = 0;
};

// Throws unless dst (f32), codes (u8) and absmax (f32) are views of an NF4 tensor of dst's elements
// (nf4.hpp), all on `device`.
void check_dequantize_nf4(const TensorView& dst, const TensorView& codes, const TensorView& absmax, DeviceType device);
// Throws unless dst and src are views of as many elements of one dtype, both on `device`.
void check_copy(const TensorView& dst, const TensorView& src, DeviceType device);

// Throws unless dst is a bf16 view and src an f32 view of as many elements, both on `device`: the
// arguments of Device::to_bf16.
void check_to_bf16(const TensorView& dst, const TensorView& src, DeviceType device);

// The `cpu` device of core: host memory (64-byte aligned), OpenMP loops.
ComponentInfo cpu_device_info();

}  // namespace ablate
