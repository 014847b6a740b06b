// The CUDA runtime as the kernel interpreter and the emulated CUDA device provide it to code
// compiled as C++ (a rewritten .cu file, a plugin's host code, a test): the interpreter
// (ablate_emu/emu.hpp) and the runtime calls the project makes (runtime.cpp). Device memory is a
// separate region the host reaches only through the copy functions and kernels (a host access
// outside them faults, naming the allocation); allocations carry a guard after their end, checked
// after every launch and at cudaFree (under AddressSanitizer, poisoned instead). Work runs when it
// is enqueued, so every stream is in order; an event records the time its stream's work was done.
// The device answers as an H100 SXM (SM 9.0, 132 SMs, 80 GiB).
#pragma once

#include "ablate_emu/emu.hpp"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureWrongThread = 908,
};
using cudaError = cudaError_t;
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;
struct CUgraphNode_st;
using cudaGraphNode_t = CUgraphNode_st*;

// Stream capture: what a capturing stream is given is recorded into a graph instead of run, and
// runs each time the graph is launched. Captured here: kernel launches, asynchronous copies between
// device memory and pinned host memory (read or written when the graph runs), memsets, cuBLASLt's
// and cuBLAS's products and cub's sort. What would make the graph differ from the calls (a
// synchronisation of the capturing stream, a copy from or to pageable host memory, an event on it,
// a free or a device-wide synchronisation, and in the global and thread-local modes an allocation
// or a synchronous copy) is
// refused with cudaErrorStreamCaptureUnsupported and invalidates the capture, as the runtime does
// (events, which a GPU captures as nodes, are refused here: the emulation does not capture them).
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

// The fields of cudaDeviceProp the project reads (the real struct has many more).
struct cudaDeviceProp {
  char name[256];
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int l2CacheSize;
  int maxThreadsPerMultiProcessor;
  std::size_t sharedMemPerMultiprocessor;
};

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** p, std::size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int v, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
// The graph's node count in *count (nodes must be null: the emulation hands out no node handles).
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count);

template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaMallocHost(T** p, std::size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaMallocAsync(T** p, std::size_t bytes, cudaStream_t s) {
  return cudaMallocAsync(reinterpret_cast<void**>(p), bytes, s);
}

namespace ablate::emu {
// Checks every live device allocation's guard; throws Error naming the allocation overrun.
void check_device_allocations(const char* after);
// Live device allocations (a test checks that it frees what it allocates).
std::size_t live_device_allocations();
// Bytes of device memory in use (allocations rounded up to 256 bytes, with their guards).
std::size_t device_bytes_in_use();
// True when ABLATE_EMULATE_CUDA=1: this process is the emulated CUDA device, whose invalid
// launches are refused as a GPU refuses them (the launch does not run; the next
// cudaGetLastError returns the error) instead of throwing Error, the interpreter's default.
bool emulating_device();
// The message of the last refused launch (empty when none).
std::string last_launch_error();
// True when [p, p + bytes) lies inside one live device allocation.
bool is_device_range(const void* p, std::size_t bytes);
// Device memory is out of the host's reach except while one of these lives: the emulated
// libraries' own work (a copy, a kernel, a cuBLASLt product) opens it for its duration. Nests;
// process-wide.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};
}  // namespace ablate::emu
