// Tensors are views: pointer, dtype, shape, device. Parameters and gradients each live in one flat
// buffer described by a table of named slices (like llm.c), so an optimizer updates every
// parameter in one pass and a communicator all-reduces one buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ablate {

enum class DType { f32, bf16, f16, i32, u16, u8, f64 };
// Which device a buffer lives on: the name of a device registration (run.device), interned to a
// small id so that comparing two is one integer compare. The list is open: the built-in devices
// have the constants DeviceType::cpu and DeviceType::cuda, and a plugin's own device gets its
// identity from its name (DeviceType::named("rocm")), the same id for the same name wherever it is
// asked for in the process.
class DeviceType {
 public:
  static const DeviceType cpu, cuda;
  constexpr DeviceType() = default;  // the cpu
  static DeviceType named(std::string_view name);
  const char* name() const noexcept;
  constexpr bool operator==(const DeviceType&) const = default;

 private:
  constexpr explicit DeviceType(uint16_t id) : id_(id) {}
  uint16_t id_ = 0;
};
inline constexpr DeviceType DeviceType::cpu{0};
inline constexpr DeviceType DeviceType::cuda{1};

// A device's queue, as every component that launches work on the model's device receives it
// (layers through LayerCall, attention backends through AttentionCall, communicators through set_stream, optimizers
// through StepArgs): calls launched on one queue run in order. cuda: a cudaStream_t (as<cudaStream_t>());
// the cpu has none, and its queue is null.
class Stream {
 public:
  Stream() = default;
  Stream(std::nullptr_t) noexcept {}  // NOLINT: no queue
  explicit Stream(void* handle) noexcept : handle_(handle) {}
  void* handle() const noexcept { return handle_; }
  explicit operator bool() const noexcept { return handle_ != nullptr; }
  template <class T>
  T as() const noexcept {
    return static_cast<T>(handle_);
  }
  friend bool operator==(const Stream&, const Stream&) = default;

 private:
  void* handle_ = nullptr;
};

std::size_t dtype_size(DType dtype) noexcept;
const char* to_string(DType dtype) noexcept;
const char* to_string(DeviceType device) noexcept;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  DeviceType device = DeviceType::cpu;
  int ndim = 0;
  std::array<int64_t, 4> shape{};

  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data);
  }
};

// A one-dimensional view of `n` elements at `data`.
inline TensorView flat_view(void* data, DType dtype, int64_t n, DeviceType device = DeviceType::cpu) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = 1;
  t.shape[0] = n;
  return t;
}

// A named tensor that owns its bytes: optimizer state and checkpoint contents (runtime/safetensors.hpp).
struct NamedTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // the product of shape * dtype_size bytes
};

// One named parameter inside a flat buffer.
struct ParamSlice {
  std::string name;    // "blocks.3.attn.qkv.weight"
  int64_t offset = 0;  // in elements
  std::vector<int64_t> shape;
  bool decay = true;  // weight decay applies (matrices and embeddings by default)
  // Initial values: N(0, init_std) when init_std > 0, else the constant init_value (norm weights
  // 1, biases 0). GPT-2's scheme: 0.02, residual projections 0.02/sqrt(2*n_layers).
  double init_std = 0.02;
  double init_value = 0.0;
  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct ParamTable {
  std::vector<ParamSlice> slices;
  int64_t total = 0;  // elements
  const ParamSlice* find(const std::string& name) const;
  // Appends a slice at the end, returns its offset.
  int64_t add(std::string name, std::vector<int64_t> shape, bool decay, double init_std = 0.02, double init_value = 0.0);
};

}  // namespace ablate
