// CUDA helpers for plugins, tests and benchmarks built with the CUDA toolkit (core's own sources
// build without it and never include this): every runtime call checked, an error naming the file,
// line, call and CUDA's message; an owning device buffer; whether a device is there at all.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "ablate/error.hpp"

namespace ablate::cuda {

inline void check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw_runtime_error(std::string(file) + ":" + std::to_string(line),
                      std::string(call) + " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
}

#define ABLATE_CUDA_CHECK(call) ::ablate::cuda::check((call), #call, __FILE__, __LINE__)

// True when the process can use at least one CUDA device (a machine without one, or without a
// driver, answers false rather than failing).
inline bool device_available() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();  // clear the sticky "no device" error
  return ok;
}

// `count` elements of T in device memory, freed with the object. Moves, never copies.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { resize(count); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // Reallocates (contents are lost) unless the size is already `count`.
  void resize(std::size_t count) {
    if (count == count_) return;
    release();
    if (count > 0) ABLATE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    count_ = count;
  }
  void upload(const T* host, std::size_t count) {
    resize(count);
    if (count > 0) ABLATE_CUDA_CHECK(cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host) const {
    if (count_ > 0) ABLATE_CUDA_CHECK(cudaMemcpy(host, data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
  }
  void fill_zero() {
    if (count_ > 0) ABLATE_CUDA_CHECK(cudaMemset(data_, 0, count_ * sizeof(T)));
  }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// Scratch device memory for a plugin's kernels, grown on a stream when a larger problem comes and
// kept: after the first step of a shape nothing is allocated. Stream-ordered (cudaMallocAsync /
// cudaFreeAsync), so growing never waits for the device and never frees memory queued work still
// reads.
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  // At least `bytes` bytes (contents unspecified after growth).
  void* get(std::size_t bytes, cudaStream_t stream) {
    if (size_ < bytes) {
      // Emptied first: if the allocation throws, a later smaller request grows again rather than
      // getting a null pointer.
      if (ptr_ != nullptr) ABLATE_CUDA_CHECK(cudaFreeAsync(ptr_, stream));
      ptr_ = nullptr;
      size_ = 0;
      ABLATE_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
      size_ = bytes;
      grown_ = true;
    }
    return ptr_;
  }
  // True once after each growth (a caller that fills the memory once, e.g. with ones, refills).
  bool take_grown() noexcept { return std::exchange(grown_, false); }

 private:
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  bool grown_ = false;
};

}  // namespace ablate::cuda
