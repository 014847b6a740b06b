// The emulated CUDA device's runtime (runtime.cpp) as a program using the CUDA runtime sees it:
// device memory the host cannot touch outside copies and kernels, copies checked against their
// kind and their allocation, what cudaMemGetInfo reports, streams and events as checked handles
// with timing, the device's properties, and an invalid launch refused as a GPU refuses it (the
// next cudaGetLastError says so). Run with ABLATE_EMULATE_CUDA=1.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "interpreter_kernels.hpp"

namespace {

// Runs `f` in a child process; returns its wait status and what it wrote to standard error.
template <class F>
std::pair<int, std::string> in_child(F&& f) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    f();
    _exit(0);
  }
  close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, std::size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {status, err};
}

}  // namespace

TEST_CASE("the process is the emulated device") {
  REQUIRE(ablate::emu::emulating_device());  // ctest sets ABLATE_EMULATE_CUDA=1
}

TEST_CASE("the device answers as an H100 SXM and says it is emulated") {
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  CHECK(n == 1);
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(std::string(p.name).find("H100") != std::string::npos);
  CHECK(std::string(p.name).find("emulated") != std::string::npos);
  CHECK(p.major == 9);
  CHECK(p.minor == 0);
  CHECK(p.multiProcessorCount == 132);
  CHECK(p.totalGlobalMem == (std::size_t(80) << 30));
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  CHECK(sms == p.multiProcessorCount);
  CHECK(cudaGetDeviceProperties(&p, 1) == cudaErrorInvalidDevice);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);  // read once, then cleared
}

TEST_CASE("host code that touches device memory outside a copy or kernel is stopped, naming it") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 64 * sizeof(float)) == cudaSuccess);
  for (const bool write : {false, true}) {
    const auto [status, err] = in_child([&] {
      volatile float* p = d;
      if (write) {
        p[3] = 1.0f;
      } else {
        std::fprintf(stderr, "%g\n", double(p[3]));
      }
    });
    INFO(err);
    CHECK(WIFSIGNALED(status));
    CHECK(err.find("host code touched device memory") != std::string::npos);
    CHECK(err.find("cudaMemcpy") != std::string::npos);
  }
  // The same access inside the emulated libraries' window is allowed; so is a copy.
  const std::vector<float> h(64, 2.5f);
  REQUIRE(cudaMemcpy(d, h.data(), 64 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  {
    const ablate::emu::DeviceAccess access;
    CHECK(d[3] == 2.5f);
  }
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("allocations: aligned, fresh memory reads as NaN, counted by cudaMemGetInfo, out of memory refused") {
  std::size_t free0 = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free0, &total) == cudaSuccess);
  CHECK(total == (std::size_t(80) << 30));
  float* a = nullptr;
  float* b = nullptr;
  REQUIRE(cudaMalloc(&a, 1000 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&b, 3 * sizeof(float)) == cudaSuccess);
  CHECK(reinterpret_cast<uintptr_t>(a) % 256 == 0);
  CHECK(reinterpret_cast<uintptr_t>(b) % 256 == 0);
  CHECK(ablate::emu::is_device_range(a, 1000 * sizeof(float)));
  CHECK_FALSE(ablate::emu::is_device_range(a, 1001 * sizeof(float)));
  std::vector<float> h(1000, 0.0f);
  REQUIRE(cudaMemcpy(h.data(), a, h.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (float x : h) REQUIRE(x != x);  // NaN
  std::size_t free1 = 0;
  REQUIRE(cudaMemGetInfo(&free1, &total) == cudaSuccess);
  CHECK(free0 - free1 >= 1003 * sizeof(float));
  CHECK(free0 - free1 <= 1003 * sizeof(float) + 2 * (256 + 64));
  void* huge = nullptr;
  CHECK(cudaMalloc(&huge, total) == cudaErrorMemoryAllocation);
  CHECK(huge == nullptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaFree(a) == cudaSuccess);
  CHECK(cudaFree(b) == cudaSuccess);
  CHECK(cudaFree(b) == cudaErrorInvalidDevicePointer);  // twice
  (void)cudaGetLastError();
  std::size_t free2 = 0;
  REQUIRE(cudaMemGetInfo(&free2, &total) == cudaSuccess);
  CHECK(free2 == free0);
}

TEST_CASE("copies are checked against their kind and their allocation") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 16 * sizeof(float)) == cudaSuccess);
  std::vector<float> h(32, 1.0f), back(32, 0.0f);
  CHECK(cudaMemcpy(d, h.data(), 16 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(d, h.data(), 17 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // past the end
  CHECK(cudaMemcpy(h.data(), d, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);                   // sides swapped
  CHECK(cudaMemcpy(back.data(), h.data(), 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);         // host as device
  CHECK(cudaMemcpy(d, d + 8, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);                      // device as host
  CHECK(cudaMemcpy(d, h.data(), 4, static_cast<cudaMemcpyKind>(7)) == cudaErrorInvalidMemcpyDirection);
  CHECK(cudaMemset(d + 10, 0, 7 * sizeof(float)) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // cudaMemcpyDefault infers each side; device to device within one allocation.
  h[0] = 7.0f;
  CHECK(cudaMemcpy(d, h.data(), sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  CHECK(cudaMemcpy(d + 5, d, sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  CHECK(cudaMemset(d + 6, 0, sizeof(float)) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), d, 16 * sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  CHECK(back[0] == 7.0f);
  CHECK(back[5] == 7.0f);
  CHECK(back[6] == 0.0f);
  CHECK(back[7] == 1.0f);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("streams and events are checked handles; an event times the work before it") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t start = nullptr, end = nullptr, untimed = nullptr;
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&end) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
  float ms = -1.0f;
  CHECK(cudaEventElapsedTime(&ms, start, end) == cudaErrorInvalidResourceHandle);  // never recorded
  REQUIRE(cudaEventRecord(start, s) == cudaSuccess);
  int* d = nullptr;
  REQUIRE(cudaMalloc(&d, 64 * sizeof(int)) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // work of known length between the two
  ablate::emu_test::mirror_through_shared(d, 64);
  REQUIRE(cudaEventRecord(end, s) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(end) == cudaSuccess);
  REQUIRE(cudaEventElapsedTime(&ms, start, end) == cudaSuccess);
  CHECK(ms >= 29.0f);
  REQUIRE(cudaEventRecord(untimed, s) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamWaitEvent(s, end, 0) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  // A destroyed stream is no stream: copies and synchronisation on it are refused.
  int h[4] = {};
  CHECK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventDestroy(start) == cudaSuccess);
  CHECK(cudaEventDestroy(start) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventDestroy(end) == cudaSuccess);
  CHECK(cudaEventDestroy(untimed) == cudaSuccess);
  (void)cudaGetLastError();
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("an invalid launch does not run and is the next cudaGetLastError, as on a GPU") {
  int* d = nullptr;
  REQUIRE(cudaMalloc(&d, 32 * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(d, 0, 32 * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  ablate::emu_test::oversized_block_launch(d);  // <<<1, 1025>>>
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(ablate::emu::last_launch_error().find("block (1025,1,1)") != std::string::npos);
  ablate::emu_test::empty_grid_launch(d);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  int h[32];
  REQUIRE(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int x : h) CHECK(x == 0);  // neither kernel ran
  // A valid launch afterwards runs.
  ablate::emu_test::mirror_through_shared(d, 32);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int t = 0; t < 32; ++t) CHECK(h[t] == 31 - t);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("stream capture records kernels, copies and memsets into a graph that runs them each time it is launched") {
  constexpr int n = 100;
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float *x = nullptr, *y = nullptr, *staged = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(&x, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&y, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMallocHost(&staged, n * sizeof(float)) == cudaSuccess);  // the graph reads it when it runs
  REQUIRE(cudaMallocHost(&out, n * sizeof(float)) == cudaSuccess);
  for (int i = 0; i < n; ++i) staged[i] = float(i);
  REQUIRE(cudaMemset(x, 0, n * sizeof(float)) == cudaSuccess);

  // Captured: y = staged (pinned, read at launch), x += 2 y, y = 0, x += 3 y (so + 0), out = x.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  REQUIRE(cudaMemcpyAsync(y, staged, n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  ablate::emu_test::axpy_on(x, y, 2.0f, n, s);
  REQUIRE(cudaMemsetAsync(y, 0, n * sizeof(float), s) == cudaSuccess);
  ablate::emu_test::axpy_on(x, y, 3.0f, n, s);
  REQUIRE(cudaMemcpyAsync(out, x, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  // Nothing ran: x is still zero.
  float probe[n];
  REQUIRE(cudaMemcpyAsync(probe, x, sizeof probe, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
  for (float v : probe) CHECK(v == 0.0f);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  // Each launch runs every node again, reading the pinned input as it is then.
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  for (int i = 0; i < n; ++i) CHECK(out[i] == 2.0f * float(i));
  for (int i = 0; i < n; ++i) staged[i] = 1.0f;
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  for (int i = 0; i < n; ++i) CHECK(out[i] == 2.0f * float(i) + 2.0f);
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);

  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaFreeHost(staged) == cudaSuccess);
  CHECK(cudaFreeHost(out) == cudaSuccess);
  CHECK(cudaFree(x) == cudaSuccess);
  CHECK(cudaFree(y) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("stream capture refuses what a graph cannot hold and ends invalidated, as the runtime does") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* x = nullptr;
  REQUIRE(cudaMalloc(&x, 64 * sizeof(float)) == cudaSuccess);
  float host[64] = {};  // pageable
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);  // the legacy stream
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorIllegalState);  // none begun
  (void)cudaGetLastError();

  // Each of these breaks a capture in progress; the capture then ends without a graph.
  struct Case {
    const char* what;
    cudaStreamCaptureMode mode;
    cudaError_t (*call)(cudaStream_t, float*, float*, cudaEvent_t);
  };
  const Case cases[] = {
      {"a copy from pageable memory", cudaStreamCaptureModeGlobal,
       [](cudaStream_t st, float* d, float* h, cudaEvent_t) {
         return cudaMemcpyAsync(d, h, 64 * sizeof(float), cudaMemcpyHostToDevice, st);
       }},
      {"a copy to pageable memory", cudaStreamCaptureModeRelaxed,
       [](cudaStream_t st, float* d, float* h, cudaEvent_t) {
         return cudaMemcpyAsync(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, st);
       }},
      {"synchronising the capturing stream", cudaStreamCaptureModeRelaxed,
       [](cudaStream_t st, float*, float*, cudaEvent_t) { return cudaStreamSynchronize(st); }},
      {"querying it", cudaStreamCaptureModeRelaxed, [](cudaStream_t st, float*, float*, cudaEvent_t) { return cudaStreamQuery(st); }},
      {"an event on it", cudaStreamCaptureModeRelaxed,
       [](cudaStream_t st, float*, float*, cudaEvent_t ev) { return cudaEventRecord(ev, st); }},
      {"an allocation (global mode)", cudaStreamCaptureModeGlobal,
       [](cudaStream_t, float*, float*, cudaEvent_t) {
         void* p = nullptr;
         return cudaMalloc(&p, 16);
       }},
      {"a free", cudaStreamCaptureModeRelaxed,
       [](cudaStream_t, float*, float*, cudaEvent_t) { return cudaFree(reinterpret_cast<void*>(0x1)); }},
      {"a synchronous copy (thread-local mode)", cudaStreamCaptureModeThreadLocal,
       [](cudaStream_t, float* d, float* h, cudaEvent_t) { return cudaMemcpy(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost); }},
      {"a device-wide synchronisation", cudaStreamCaptureModeRelaxed,
       [](cudaStream_t, float*, float*, cudaEvent_t) { return cudaDeviceSynchronize(); }},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    REQUIRE(cudaStreamBeginCapture(s, c.mode) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, c.mode) == cudaErrorIllegalState);  // already capturing
    ablate::emu_test::axpy_on(x, x, 1.0f, 64, s);
    CHECK(c.call(s, x, host, e) == cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    (void)cudaGetLastError();
  }
  // In relaxed mode an allocation is allowed (it is not part of the graph).
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 16) == cudaSuccess);
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaFree(x) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}
