// What the interpreter's engine (emu.cpp) asks of the runtime (runtime.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
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

}  // namespace ablate::emu::runtime
