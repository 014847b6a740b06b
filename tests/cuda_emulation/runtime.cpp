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

#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "runtime_internal.hpp"

#ifdef ABLATE_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace ablate::emu {
// Work on a stream that has not run yet (runtime::StreamWork), after the nodes in `after`; a node
// without work joins streams (cudaStreamWaitEvent).
struct WorkNode {
  std::shared_ptr<runtime::StreamWork> work;
  std::vector<std::shared_ptr<WorkNode>> after;
  bool done = false;
};
}  // namespace ablate::emu

struct CUstream_st {
  unsigned flags;
};
struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
};
struct CUevent_st {
  unsigned flags;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
  std::shared_ptr<ablate::emu::WorkNode> pending;  // the recording stream's work not yet done then
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
  int pkey = -1;                            // -1: no protection keys, mprotect
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
      const std::string msg =
          std::string(after) + ": a write past the end of a device allocation of " + std::to_string(bytes) + " bytes";
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

// --- work that waits on a stream (runtime::StreamWork) ------------------------------------------

namespace {

std::recursive_mutex g_work_mu;
std::map<const void*, std::shared_ptr<WorkNode>> g_tails;  // stream (null: the default) -> its last node

// Runs what `n` waits for, then its work; true once all of it is done. Holds g_work_mu.
bool advance(WorkNode& n) {
  if (n.done) return true;
  for (const auto& a : n.after) {
    if (!advance(*a)) return false;
  }
  n.after.clear();
  if (n.work && !n.work->progress()) return false;
  n.work.reset();
  n.done = true;
  return true;
}

// The streams whose work the legacy default stream waits for: itself and every blocking stream.
std::vector<const void*> default_stream_group() {
  std::vector<const void*> group{nullptr};
  std::lock_guard<std::mutex> lock(g_handles_mu);
  for (const void* s : g_streams) {
    if ((static_cast<const CUstream_st*>(s)->flags & cudaStreamNonBlocking) == 0) group.push_back(s);
  }
  return group;
}

// The node that stands for everything `s` holds now (null when nothing). Holds g_work_mu.
std::shared_ptr<WorkNode> tail_of(const void* s) {
  if (s != nullptr) {
    auto it = g_tails.find(s);
    return it == g_tails.end() ? nullptr : it->second;
  }
  auto join = std::make_shared<WorkNode>();
  for (const void* m : default_stream_group()) {
    auto it = g_tails.find(m);
    if (it != g_tails.end()) join->after.push_back(it->second);
  }
  return join->after.empty() ? nullptr : join;
}

// Tries what `s` holds once; true (and the stream's queue emptied) when it is done.
bool try_stream(const void* s) {
  std::lock_guard<std::recursive_mutex> lock(g_work_mu);
  auto it = g_tails.find(s);
  if (it == g_tails.end()) return true;
  const std::shared_ptr<WorkNode> tail = it->second;
  if (!advance(*tail)) return false;
  it = g_tails.find(s);
  if (it != g_tails.end() && it->second == tail) g_tails.erase(it);
  return true;
}

// Waits, trying again and again, until `done()`: a peer's arrival is another process's doing.
template <class Done>
void wait_until(Done&& done) {
  auto pause = std::chrono::microseconds(20);
  while (!done()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

bool any_work() {
  std::lock_guard<std::recursive_mutex> lock(g_work_mu);
  return !g_tails.empty();
}

}  // namespace

namespace runtime {
void enqueue_stream_work(const void* s, std::shared_ptr<StreamWork> work) {
  if (capturing(s)) {  // a collective: refused, as the emulation does not capture it
    invalidate_capture(s, "a library's stream work (a collective)");
    return;
  }
  std::lock_guard<std::recursive_mutex> lock(g_work_mu);
  auto node = std::make_shared<WorkNode>();
  node->work = std::move(work);
  if (auto before = tail_of(s)) node->after.push_back(std::move(before));
  g_tails[s] = node;
  advance(*node);
}
void finish_stream_work(const void* s) {
  if (!any_work()) return;
  if (s != nullptr) {
    wait_until([&] { return try_stream(s); });
    return;
  }
  for (const void* m : default_stream_group()) wait_until([&] { return try_stream(m); });
}
bool poll_stream_work(const void* s) {
  if (s != nullptr) return try_stream(s);
  bool done = true;
  for (const void* m : default_stream_group()) done = try_stream(m) && done;
  return done;
}
void poll_all_stream_work() {
  std::vector<const void*> streams;
  {
    std::lock_guard<std::recursive_mutex> lock(g_work_mu);
    for (const auto& [s, tail] : g_tails) streams.push_back(s);
  }
  for (const void* s : streams) try_stream(s);
}
}  // namespace runtime

// --- stream capture ------------------------------------------------------------------------------

namespace {

// A capture in progress: its mode, the thread that began it, the nodes recorded so far, and why it
// can no longer be what the calls meant (empty while it can).
struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  std::vector<std::function<void()>> nodes;
  std::string invalid;
};
std::mutex g_capture_mu;
std::map<const void*, Capture> g_captures;  // stream -> its capture

}  // namespace

namespace runtime {
bool capturing(const void* stream) {
  if (stream == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  return g_captures.count(stream) != 0;
}
void capture_node(const void* stream, std::function<void()> node) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures.find(stream);
  if (it != g_captures.end() && it->second.invalid.empty()) it->second.nodes.push_back(std::move(node));
}
cudaError_t invalidate_capture(const void* stream, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    auto it = g_captures.find(stream);
    if (it != g_captures.end() && it->second.invalid.empty()) it->second.invalid = why;
  }
  std::fprintf(stderr, "emulated CUDA device: %s during stream capture: not permitted (cudaErrorStreamCaptureUnsupported)\n",
               why.c_str());
  return note(cudaErrorStreamCaptureUnsupported);
}
cudaError_t unsafe_during_capture(const char* call) {
  std::vector<const void*> broken;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    for (const auto& [stream, c] : g_captures) {
      const bool forbids = c.mode == cudaStreamCaptureModeGlobal ||
                           (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id());
      if (forbids) broken.push_back(stream);
    }
  }
  cudaError_t rc = cudaSuccess;
  for (const void* s : broken) rc = invalidate_capture(s, call);
  return rc;
}
}  // namespace runtime

}  // namespace ablate::emu

// --- the runtime calls -------------------------------------------------------------------------

namespace {
// A call that waits for every stream (a device-wide synchronisation, a free): no capture, in any
// mode, may be in progress, as the capturing stream cannot be waited for.
cudaError_t capture_blocks_synchronization(const char* call) {
  std::vector<const void*> streams;
  {
    std::lock_guard<std::mutex> lock(ablate::emu::g_capture_mu);
    for (const auto& [stream, c] : ablate::emu::g_captures) streams.push_back(stream);
  }
  cudaError_t rc = cudaSuccess;
  for (const void* s : streams) rc = ablate::emu::runtime::invalidate_capture(s, call);
  return rc;
}
}  // namespace

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
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
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
    case cudaErrorIllegalState: return "the resource is not in a valid state to perform the requested operation";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
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
// Device memory (inside a live allocation), pinned host memory, or any other pointer (unregistered).
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (a == nullptr) return note(cudaErrorInvalidValue);
  *a = cudaPointerAttributes{cudaMemoryTypeUnregistered, -1, nullptr, nullptr};
  if (is_device_range(p, 1)) {
    *a = cudaPointerAttributes{cudaMemoryTypeDevice, 0, const_cast<void*>(p), nullptr};
    return cudaSuccess;
  }
  std::lock_guard<std::mutex> lock(g_handles_mu);
  if (g_pinned.count(p) != 0) *a = cudaPointerAttributes{cudaMemoryTypeHost, 0, const_cast<void*>(p), const_cast<void*>(p)};
  else a->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t rc = capture_blocks_synchronization("cudaDeviceSynchronize"); rc != cudaSuccess) return rc;
  std::vector<const void*> streams{nullptr};
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    streams.insert(streams.end(), g_streams.begin(), g_streams.end());
  }
  for (const void* s : streams) runtime::finish_stream_work(s);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (p == nullptr) return note(cudaErrorInvalidValue);
  if (const cudaError_t rc = runtime::unsafe_during_capture("cudaMalloc"); rc != cudaSuccess) return rc;
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
  if (const cudaError_t rc = capture_blocks_synchronization("cudaFree"); rc != cudaSuccess) return rc;
  if (any_work()) cudaDeviceSynchronize();  // as on a GPU: work that may still use it finishes first
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
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaMallocAsync (the emulation does not capture allocations)");
  runtime::finish_stream_work(s);
  return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaFreeAsync (the emulation does not capture frees)");
  runtime::finish_stream_work(s);
  return cudaFree(p);
}
cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  if (p == nullptr) return note(cudaErrorInvalidValue);
  if (const cudaError_t rc = runtime::unsafe_during_capture("cudaMallocHost"); rc != cudaSuccess) return rc;
  *p = std::aligned_alloc(kPage, round_up(bytes == 0 ? 1 : bytes, kPage));
  if (*p == nullptr) return note(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_pinned.insert(*p);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (const cudaError_t rc = capture_blocks_synchronization("cudaFreeHost"); rc != cudaSuccess) return rc;
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (g_pinned.erase(p) == 0) return note(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}

namespace {
// The copy's direction (cudaMemcpyDefault resolved), or an error when its sides are not what it says.
cudaError_t check_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind& k) {
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
  return cudaSuccess;
}

bool pinned(const void* p) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_pinned.count(p) != 0;
}

// A copy or memset that its stream cannot run yet (it holds a collective): run when the stream
// reaches it.
class Deferred final : public runtime::StreamWork {
 public:
  explicit Deferred(std::function<void()> f) : f_(std::move(f)) {}
  bool progress() override {
    f_();
    return true;
  }

 private:
  std::function<void()> f_;
};

// A copy on stream `s` (null: the legacy default stream, whose copies are synchronous). When `s`
// holds work that cannot run yet, the copy waits behind it as on a GPU: the host goes on, except
// for a copy to pageable host memory, which CUDA completes before returning; a copy from pageable
// host memory reads it now (CUDA stages it before returning).
cudaError_t copy_on(cudaStream_t s, bool synchronous, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t rc = check_copy(dst, src, bytes, k); rc != cudaSuccess) return rc;
  const auto now = [=] {
    const DeviceAccess access;
    std::memmove(dst, src, bytes);
  };
  if (synchronous) {
    if (const cudaError_t rc = runtime::unsafe_during_capture("cudaMemcpy"); rc != cudaSuccess) return rc;
  } else if (runtime::capturing(s)) {
    // Host memory a graph reads or writes each time it runs must be pinned.
    const bool pageable = (k == cudaMemcpyHostToDevice && !pinned(src)) || (k == cudaMemcpyDeviceToHost && !pinned(dst)) ||
                          (k == cudaMemcpyHostToHost && (!pinned(src) || !pinned(dst)));
    if (pageable) return runtime::invalidate_capture(s, "cudaMemcpyAsync to or from pageable host memory");
    runtime::capture_node(s, now);
    return cudaSuccess;
  }
  if (runtime::poll_stream_work(s)) {
    now();
    return cudaSuccess;
  }
  if (synchronous || ((k == cudaMemcpyDeviceToHost || k == cudaMemcpyHostToHost) && !pinned(dst))) {
    runtime::finish_stream_work(s);
    now();
    return cudaSuccess;
  }
  std::shared_ptr<std::vector<char>> staged;
  if (k == cudaMemcpyHostToDevice && !pinned(src)) {
    staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
  }
  runtime::enqueue_stream_work(s, std::make_shared<Deferred>([=] {
                                 const DeviceAccess access;
                                 std::memmove(dst, staged ? staged->data() : src, bytes);
                               }));
  return cudaSuccess;
}

cudaError_t memset_on(cudaStream_t s, bool synchronous, void* p, int v, std::size_t bytes) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!is_device_range(p, bytes)) return note(cudaErrorInvalidValue);
  const auto now = [=] {
    const DeviceAccess access;
    std::memset(p, v, bytes);
  };
  if (synchronous) {
    if (const cudaError_t rc = runtime::unsafe_during_capture("cudaMemset"); rc != cudaSuccess) return rc;
  } else if (runtime::capturing(s)) {
    runtime::capture_node(s, now);
    return cudaSuccess;
  }
  if (runtime::poll_stream_work(s)) {
    now();
    return cudaSuccess;
  }
  if (synchronous) {
    runtime::finish_stream_work(s);
    now();
    return cudaSuccess;
  }
  runtime::enqueue_stream_work(s, std::make_shared<Deferred>(now));
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k) {
  return copy_on(nullptr, true, dst, src, bytes, k);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k, cudaStream_t s) {
  return copy_on(s, false, dst, src, bytes, k);
}
cudaError_t cudaMemset(void* p, int v, std::size_t bytes) { return memset_on(nullptr, true, p, v, bytes); }
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t s) { return memset_on(s, false, p, v, bytes); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr || (flags & ~unsigned(cudaStreamNonBlocking)) != 0) return note(cudaErrorInvalidValue);
  *s = new CUstream_st{flags};
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
// As on a GPU, destroying a stream does not wait for its work: what it holds is tried once more, and
// what cannot run yet is dropped (a collective then never arrives; its peers time out).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (s == nullptr || g_streams.count(s) == 0) return note(cudaErrorInvalidResourceHandle);
  }
  runtime::poll_stream_work(s);
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    g_captures.erase(s);  // a capture in progress ends with it
  }
  {
    std::lock_guard<std::recursive_mutex> lock(g_work_mu);
    g_tails.erase(s);
  }
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    g_streams.erase(s);
  }
  delete s;
  return cudaSuccess;
}
// Work runs when it is enqueued, except what waits on a stream (a collective): that runs here.
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaStreamSynchronize of the capturing stream");
  runtime::finish_stream_work(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaStreamQuery of the capturing stream");
  return runtime::poll_stream_work(s) ? cudaSuccess : cudaErrorNotReady;
}

namespace {
bool event_live(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return e != nullptr && g_events.count(e) != 0;
}
}  // namespace

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr || (flags & ~unsigned(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) return note(cudaErrorInvalidValue);
  *e = new CUevent_st{flags, false, {}, nullptr};
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
// The stream's earlier work has run (it ran when enqueued) unless it waits (a collective): the
// event's time is now, and it completes when that work does.
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!event_live(e) || !stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaEventRecord (the emulation does not capture events)");
  e->recorded = true;
  e->at = std::chrono::steady_clock::now();
  std::lock_guard<std::recursive_mutex> lock(g_work_mu);
  e->pending = tail_of(s);
  return cudaSuccess;
}
namespace {
bool event_done(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> lock(g_work_mu);
  if (e->pending && !advance(*e->pending)) return false;
  e->pending.reset();
  return true;
}
}  // namespace
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!event_live(e)) return note(cudaErrorInvalidResourceHandle);
  wait_until([&] { return event_done(e); });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!event_live(e)) return note(cudaErrorInvalidResourceHandle);
  return event_done(e) ? cudaSuccess : cudaErrorNotReady;
}
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
// Later work on `s` waits for what the event's stream held when it was recorded.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (flags != 0) return note(cudaErrorInvalidValue);
  if (!stream_ok(s) || !event_live(e)) return note(cudaErrorInvalidResourceHandle);
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaStreamWaitEvent (the emulation does not capture events)");
  if (event_done(e)) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lock(g_work_mu);
  auto join = std::make_shared<WorkNode>();
  if (auto before = tail_of(s)) join->after.push_back(std::move(before));
  join->after.push_back(e->pending);
  g_tails[s] = std::move(join);
  return cudaSuccess;
}

// --- stream capture and graphs -------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (s == nullptr) return note(cudaErrorStreamCaptureUnsupported);  // not the legacy stream
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal && mode != cudaStreamCaptureModeRelaxed) {
    return note(cudaErrorInvalidValue);
  }
  runtime::finish_stream_work(s);  // what it holds runs first: the graph starts from nothing pending
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (g_captures.count(s) != 0) return note(cudaErrorIllegalState);
  Capture& c = g_captures[s];
  c.mode = mode;
  c.thread = std::this_thread::get_id();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (graph == nullptr) return note(cudaErrorInvalidValue);
  *graph = nullptr;
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures.find(s);
  if (it == g_captures.end()) return note(cudaErrorIllegalState);
  if (it->second.mode != cudaStreamCaptureModeRelaxed && it->second.thread != std::this_thread::get_id()) {
    return note(cudaErrorStreamCaptureWrongThread);
  }
  Capture c = std::move(it->second);
  g_captures.erase(it);
  if (!c.invalid.empty()) return note(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(c.nodes)};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return note(cudaErrorInvalidValue);
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = s == nullptr ? g_captures.end() : g_captures.find(s);
  *status = it == g_captures.end()       ? cudaStreamCaptureStatusNone
            : it->second.invalid.empty() ? cudaStreamCaptureStatusActive
                                         : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (exec == nullptr || graph == nullptr || flags != 0) return note(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}
// The graph's nodes in the order they were captured, each as its call would have run (a kernel on
// the interpreter, a copy reading the pinned host memory as it is now).
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return note(cudaErrorInvalidValue);
  if (!stream_ok(s)) return note(cudaErrorInvalidResourceHandle);
  if (runtime::capturing(s)) return runtime::invalidate_capture(s, "cudaGraphLaunch (the emulation does not capture graphs)");
  runtime::finish_stream_work(s);
  for (const std::function<void()>& node : exec->nodes) node();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count) {
  if (graph == nullptr || count == nullptr || nodes != nullptr) return note(cudaErrorInvalidValue);
  *count = graph->nodes.size();
  return cudaSuccess;
}
