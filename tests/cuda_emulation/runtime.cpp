// The CUDA runtime calls of the interpreter and of the emulated CUDA device (cuda_runtime.h):
// device memory as one reserved region of the address space that the host reaches only through
// the copy functions, memsets, kernels and the emulated libraries (DeviceAccess opens it; a host
// access at any other time is a fault this file names), streams and events as checked handles,
// the device's properties (an H100 SXM), and errors as the runtime reports them.
#include <cuda_runtime.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "runtime_internal.hpp"

#ifdef ABLATE_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

struct CUstream_st {
  unsigned flags;
};
struct CUevent_st {
  unsigned flags;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
};

namespace ablate::emu {
namespace {

using runtime::guard_intact;
using runtime::kGuard;
using runtime::kPoison;

constexpr std::size_t kCapacity = std::size_t(80) << 30;  // an H100 SXM's 80 GiB
constexpr std::size_t kAlign = 256;                       // cudaMalloc's alignment
constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
std::size_t footprint(std::size_t bytes) { return round_up(bytes + kGuard, kAlign); }

// The device's memory: [base, base + kCapacity) reserved without access; [base, base + top) is
// what allocations have used. Where the CPU has memory protection keys, that part is mapped
// readable and writable under its own key, and a thread opens it for itself by setting its key
// rights (a register write, no system call); elsewhere it is opened for every thread by mprotect
// while `open` > 0.
struct Heap {
  std::mutex mu;
  char* base = nullptr;
  std::size_t top = 0;
  std::size_t in_use = 0;
  int open = 0;
  int pkey = -1;  // -1: no protection keys, mprotect
  std::map<std::size_t, std::size_t> free;  // offset -> bytes, coalesced
  std::map<uintptr_t, std::size_t> allocs;  // address -> requested bytes
};

struct sigaction g_previous_segv;
char* g_base_for_signal = nullptr;  // read by the fault handler

void on_segv(int sig, siginfo_t* info, void* ctx) {
  const auto a = reinterpret_cast<uintptr_t>(info->si_addr);
  const auto b = reinterpret_cast<uintptr_t>(g_base_for_signal);
  if (b != 0 && a >= b && a < b + kCapacity) {
    char msg[320];
    const int n = std::snprintf(msg, sizeof msg,
                                "emulated CUDA device: host code touched device memory at %p (device offset %zu). Device "
                                "memory is reachable from the host only through cudaMemcpy*, cudaMemset* and kernels, "
                                "as on a GPU. The host stack:\n",
                                info->si_addr, std::size_t(a - b));
    if (n > 0) (void)!write(2, msg, std::size_t(n));
    void* frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  // Not device memory: whoever handled it before (a sanitizer, the default action).
  if ((g_previous_segv.sa_flags & SA_SIGINFO) != 0 && g_previous_segv.sa_sigaction != nullptr) {
    g_previous_segv.sa_sigaction(sig, info, ctx);
    return;
  }
  if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN && g_previous_segv.sa_handler != nullptr) {
    g_previous_segv.sa_handler(sig);
    return;
  }
  signal(SIGSEGV, SIG_DFL);  // the faulting instruction runs again and ends the process
}

Heap& heap() {
  static Heap* h = [] {
    auto* x = new Heap;
    void* m = mmap(nullptr, kCapacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "emulated CUDA device: cannot reserve %zu bytes of address space for device memory\n", kCapacity);
      std::abort();
    }
    x->base = static_cast<char*>(m);
    // ABLATE_EMU_PROTECTION=mprotect takes the path of CPUs without protection keys.
    const char* how = std::getenv("ABLATE_EMU_PROTECTION");
    if (how == nullptr || std::strcmp(how, "mprotect") != 0) x->pkey = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    g_base_for_signal = x->base;
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
    return x;
  }();
  return *h;
}

thread_local int t_access_depth = 0;  // DeviceAccess nesting on this thread (protection keys)

// Maps [from, to) of the region for use: under its key, or with the access of the moment.
void map_extent(Heap& h, std::size_t from, std::size_t to) {
  if (to <= from) return;
  const int rc = h.pkey >= 0 ? pkey_mprotect(h.base + from, to - from, PROT_READ | PROT_WRITE, h.pkey)
                             : (h.open > 0 ? mprotect(h.base + from, to - from, PROT_READ | PROT_WRITE) : 0);
  if (rc != 0) {
    std::perror("emulated CUDA device: mprotect");
    std::abort();
  }
}

// Sets the access of the used part of the region (the caller holds h.mu; no protection keys).
void protect(Heap& h, int prot) {
  const std::size_t extent = round_up(h.top, kPage);
  if (extent > 0 && mprotect(h.base, extent, prot) != 0) {
    std::perror("emulated CUDA device: mprotect");
    std::abort();
  }
}

thread_local cudaError_t t_last_error = cudaSuccess;
std::mutex g_handles_mu;
std::set<const void*> g_streams, g_events, g_pinned;
std::string g_last_launch_error;

cudaError_t note(cudaError_t rc) {
  if (rc != cudaSuccess) t_last_error = rc;
  return rc;
}

bool on_device_locked(Heap& h, const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = h.allocs.upper_bound(a);
  if (it == h.allocs.begin()) return false;
  --it;
  return a + bytes <= it->first + it->second;
}
bool in_region(const void* p) {
  Heap& h = heap();
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(h.base);
  return a >= b && a < b + kCapacity;
}

// Offset of a free run of `need` bytes (first fit, else the top), or kCapacity when full.
std::size_t take(Heap& h, std::size_t need) {
  for (auto it = h.free.begin(); it != h.free.end(); ++it) {
    if (it->second < need) continue;
    const std::size_t off = it->first, left = it->second - need;
    h.free.erase(it);
    if (left > 0) h.free[off + need] = left;
    return off;
  }
  if (need > kCapacity - h.top) return kCapacity;
  const std::size_t off = h.top;
  const std::size_t old_extent = round_up(h.top, kPage);
  h.top += need;
  map_extent(h, old_extent, round_up(h.top, kPage));
  return off;
}

// Returns [off, off + need) to the free runs, merging neighbours; a run reaching the top lowers it.
void give_back(Heap& h, std::size_t off, std::size_t need) {
  auto next = h.free.lower_bound(off);
  if (next != h.free.end() && next->first == off + need) {
    need += next->second;
    next = h.free.erase(next);
  }
  if (next != h.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      need += prev->second;
      h.free.erase(prev);
    }
  }
  // Large runs give their pages back to the system (they read as zeros until written again).
  const std::size_t lo = round_up(off, kPage), hi = (off + need) / kPage * kPage;
  if (hi > lo && hi - lo >= (std::size_t(1) << 20)) madvise(h.base + lo, hi - lo, MADV_DONTNEED);
  if (off + need == h.top) {
    const std::size_t old_extent = round_up(h.top, kPage);
    h.top = off;
    const std::size_t extent = round_up(h.top, kPage);
    if (old_extent > extent) mprotect(h.base + extent, old_extent - extent, PROT_NONE);
  } else {
    h.free[off] = need;
  }
}

bool stream_ok(cudaStream_t s) { return runtime::stream_live(s); }

}  // namespace

// --- device memory's public side -----------------------------------------------------------------

DeviceAccess::DeviceAccess() {
  Heap& h = heap();
  if (h.pkey >= 0) {
    if (t_access_depth++ == 0) pkey_set(h.pkey, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.open++ == 0) protect(h, PROT_READ | PROT_WRITE);
}
DeviceAccess::~DeviceAccess() {
  Heap& h = heap();
  if (h.pkey >= 0) {
    if (--t_access_depth == 0) pkey_set(h.pkey, PKEY_DISABLE_ACCESS);
    return;
  }
  std::lock_guard<std::mutex> lock(h.mu);
  if (--h.open == 0) protect(h, PROT_NONE);
}

bool is_device_range(const void* p, std::size_t bytes) {
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.mu);
  return on_device_locked(h, p, bytes);
}

void check_device_allocations(const char* after) {
  const DeviceAccess access;
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.mu);
  for (const auto& [base, bytes] : h.allocs) {
    if (!guard_intact(reinterpret_cast<const char*>(base), bytes)) {
      const std::string msg = std::string(after) + ": a write past the end of a device allocation of " + std::to_string(bytes) + " bytes";
      std::memset(reinterpret_cast<char*>(base) + bytes, kPoison, kGuard);  // reported once
      throw Error(msg);
    }
  }
}

std::size_t live_device_allocations() {
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.allocs.size();
}
std::size_t device_bytes_in_use() {
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.in_use;
}

bool emulating_device() {
  static const bool on = [] {
    const char* v = std::getenv("ABLATE_EMULATE_CUDA");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}
std::string last_launch_error() {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_last_launch_error;
}

namespace runtime {
void launch_refused(cudaError_t rc, const std::string& message) {
  if (!emulating_device()) throw Error(message);
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    g_last_launch_error = message;
  }
  std::fprintf(stderr, "emulated CUDA device: %s\n", message.c_str());
  note(rc);
}
bool stream_live(const void* stream) {
  if (stream == nullptr) return true;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_streams.count(stream) != 0;
}
}  // namespace runtime

}  // namespace ablate::emu

// --- the runtime calls -------------------------------------------------------------------------

using namespace ablate::emu;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unrecognized error code";
}
cudaError_t cudaGetLastError() { return std::exchange(t_last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return t_last_error; }
cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return note(cudaErrorInvalidValue);
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (d == nullptr) return note(cudaErrorInvalidValue);
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return note(d == 0 ? cudaSuccess : cudaErrorInvalidDevice); }

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int device) {
  if (v == nullptr) return note(cudaErrorInvalidValue);
  if (device != 0) return note(cudaErrorInvalidDevice);
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 49152; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    default: return note(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (p == nullptr) return note(cudaErrorInvalidValue);
  if (device != 0) return note(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  // "emulated" in the name: figures measured on it are never taken for an H100's (peak FLOP/s and
  // MFU are not reported for it).
  std::snprintf(p->name, sizeof p->name, "%s", "NVIDIA H100 80GB HBM3 (emulated on the CPU)");
  p->totalGlobalMem = kCapacity;
  p->sharedMemPerBlock = 49152;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = 2048;
  p->sharedMemPerMultiprocessor = 233472;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return note(cudaErrorInvalidValue);
  *total_bytes = kCapacity;
  *free_bytes = kCapacity - device_bytes_in_use();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (p == nullptr) return note(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > kCapacity) return note(cudaErrorMemoryAllocation);
  Heap& h = heap();
  const std::size_t need = footprint(bytes);
  char* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    const std::size_t off = take(h, need);
    if (off == kCapacity) return note(cudaErrorMemoryAllocation);
    m = h.base + off;
    h.allocs[reinterpret_cast<uintptr_t>(m)] = bytes;
    h.in_use += need;
  }
  {
    const DeviceAccess access;
    std::memset(m, kPoison, bytes + kGuard);
  }
#ifdef ABLATE_EMU_ASAN
  ASAN_POISON_MEMORY_REGION(m + bytes, kGuard);
#endif
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  Heap& h = heap();
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == h.allocs.end()) return note(cudaErrorInvalidDevicePointer);
    bytes = it->second;
  }
  bool intact = false;
  {
    const DeviceAccess access;
    intact = guard_intact(static_cast<char*>(p), bytes);
  }
#ifdef ABLATE_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(p) + bytes, kGuard);
#endif
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.allocs.erase(reinterpret_cast<uintptr_t>(p));
    h.in_use -= footprint(bytes);
    give_back(h, std::size_t(static_cast<char*>(p) - h.base), footprint(bytes));
  }
  if (!intact) throw Error("cudaFree: a write past the end of a device allocation of " + std::to_string(bytes) + " bytes");
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  return cudaFree(p);
}
cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  if (p == nullptr) return note(cudaErrorInvalidValue);
  *p = std::aligned_alloc(kPage, round_up(bytes == 0 ? 1 : bytes, kPage));
  if (*p == nullptr) return note(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_pinned.insert(*p);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (g_pinned.erase(p) == 0) return note(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k) {
  if (bytes == 0) return cudaSuccess;
  if (k == cudaMemcpyDefault) {
    k = in_region(dst) ? (in_region(src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                       : (in_region(src) ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  if (k != cudaMemcpyHostToHost && k != cudaMemcpyHostToDevice && k != cudaMemcpyDeviceToHost && k != cudaMemcpyDeviceToDevice) {
    return note(cudaErrorInvalidMemcpyDirection);
  }
  const bool dst_dev = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
  const bool src_dev = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
  // Each side must be what the kind says: a device range inside one allocation, or host memory.
  if (dst_dev ? !is_device_range(dst, bytes) : in_region(dst)) return note(cudaErrorInvalidValue);
  if (src_dev ? !is_device_range(src, bytes) : in_region(src)) return note(cudaErrorInvalidValue);
  if (dst == nullptr || src == nullptr) return note(cudaErrorInvalidValue);
  const DeviceAccess access;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k, cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  return cudaMemcpy(dst, src, bytes, k);
}
cudaError_t cudaMemset(void* p, int v, std::size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!is_device_range(p, bytes)) return note(cudaErrorInvalidValue);
  const DeviceAccess access;
  std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  return cudaMemset(p, v, bytes);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr || (flags & ~unsigned(cudaStreamNonBlocking)) != 0) return note(cudaErrorInvalidValue);
  *s = new CUstream_st{flags};
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (s == nullptr || g_streams.erase(s) == 0) return note(cudaErrorInvalidResourceHandle);
  }
  delete s;
  return cudaSuccess;
}
// Work runs when it is enqueued: a live stream has always finished.
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return stream_ok(s) ? cudaSuccess : note(cudaErrorInvalidResourceHandle); }
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

namespace {
bool event_live(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return e != nullptr && g_events.count(e) != 0;
}
}  // namespace

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr || (flags & ~unsigned(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) return note(cudaErrorInvalidValue);
  *e = new CUevent_st{flags, false, {}};
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_events.insert(*e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (e == nullptr || g_events.erase(e) == 0) return note(cudaErrorInvalidResourceHandle);
  }
  delete e;
  return cudaSuccess;
}
// The stream's earlier work has run (it ran when enqueued): the event's time is now.
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!event_live(e) || !stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  e->recorded = true;
  e->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return event_live(e) ? cudaSuccess : note(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return note(cudaErrorInvalidValue);
  if (!event_live(start) || !event_live(end)) return note(cudaErrorInvalidResourceHandle);
  // As the runtime: an event without timing, or one never recorded, has no time.
  if (((start->flags | end->flags) & cudaEventDisableTiming) != 0 || !start->recorded || !end->recorded) {
    return note(cudaErrorInvalidResourceHandle);
  }
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (flags != 0) return note(cudaErrorInvalidValue);
  if (!stream_ok(s) || !event_live(e)) return note(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
