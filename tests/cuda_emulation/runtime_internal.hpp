// What the interpreter's engine (emu.cpp) asks of the runtime (runtime.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

// ABLATE_EMU_ASAN: an AddressSanitizer build (GCC's macro, or clang's feature test).
#if defined(__SANITIZE_ADDRESS__)
#define ABLATE_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ABLATE_EMU_ASAN 1
#endif
#endif

namespace ablate::emu::runtime {

constexpr std::size_t kGuard = 64;       // bytes after each __shared__ array and device allocation
constexpr unsigned char kPoison = 0xFF;  // fresh memory and guards: every float read from it is a NaN

// True when the guard after `bytes` is intact (under AddressSanitizer the guard is poisoned and a
// write into it has already been reported).
inline bool guard_intact(const char* p, std::size_t bytes) {
#ifdef ABLATE_EMU_ASAN
  (void)p;
  (void)bytes;
  return true;
#else
  for (std::size_t i = 0; i < kGuard; ++i) {
    if (static_cast<unsigned char>(p[bytes + i]) != kPoison) return false;
  }
  return true;
#endif
}

// An invalid launch: as the emulated device (emulating_device()), the launch does not run and
// `rc` becomes the next cudaGetLastError's answer, as on a GPU; for the interpreter's own tests,
// an Error carrying `message`.
void launch_refused(cudaError_t rc, const std::string& message);
// True for the default stream (null) and for a stream created and not yet destroyed.
bool stream_live(const void* stream);

// Work an emulated library puts on a stream that cannot always run when it is enqueued: a
// collective, which runs once every rank has reached it (nccl_emu.cpp). Everything else still runs
// when it is enqueued; what is enqueued on a stream after such work first waits for it, as on a
// GPU. progress() never blocks: it does what it can now and answers true once the work is done
// (or abandoned: an aborted communicator's).
class StreamWork {
 public:
  virtual ~StreamWork() = default;
  virtual bool progress() = 0;
};
// Puts `work` on stream `s` after what `s` holds (an event waited on included), and tries it once.
void enqueue_stream_work(const void* s, std::shared_ptr<StreamWork> work);
// Before new work on `s`: runs what `s` holds to its end, blocking (the null stream: every stream
// created without cudaStreamNonBlocking too, the legacy default stream's rule).
void finish_stream_work(const void* s);
// Tries what `s` holds once; true when nothing is left.
bool poll_stream_work(const void* s);
// Tries the work of every stream once (a library's progress call: the peers' collectives wait on
// this rank's arrivals).
void poll_all_stream_work();

// Stream capture (cudaStreamBeginCapture): true while `stream` (not the legacy one) captures.
bool capturing(const void* stream);
// Appends `node` to the graph `stream` is capturing: it runs, in order, each time the graph does.
void capture_node(const void* stream, std::function<void()> node);
// The capture on `stream` cannot be what the calls meant (`why`): it ends in
// cudaErrorStreamCaptureInvalidated. Returns cudaErrorStreamCaptureUnsupported, the call's answer.
cudaError_t invalidate_capture(const void* stream, const std::string& why);
// A call that is not on a stream and that no capture may see (an allocation, a free, a synchronous
// copy, a device-wide synchronisation): cudaSuccess where no capture forbids it, else every capture
// it would break (the global ones, and this thread's thread-local ones) is invalidated and the call
// is refused with cudaErrorStreamCaptureUnsupported.
cudaError_t unsafe_during_capture(const char* call);

}  // namespace ablate::emu::runtime
