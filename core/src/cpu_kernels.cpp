// OpenBLAS (DYNAMIC_ARCH, as Debian builds it) picks its kernels from the processor's family and
// model when the library is loaded. A release older than the processor does not know the model and
// falls back to its SSE3 ("Prescott") kernels, even on a processor with AVX-512: Debian 12's
// OpenBLAS 0.3.21 on a 5th-generation Xeon (family 6, model 207) does, and the CPU layers' products
// run ~3x slower than they would (docs/performance.md, "OpenBLAS's kernels"). OpenBLAS reads
// OPENBLAS_CORETYPE at load time, before any ablate code runs in the plugin that links it, so the
// choice is made here, in the process, before the first plugin is loaded: from the instruction sets
// the processor reports and the operating system has enabled, never from its model number.
#include "cpu_kernels.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/spdlog.h>

namespace ablate {

namespace {

// The widest OpenBLAS kernel set the instruction sets allow: SkylakeX's need AVX-512 (F, BW, VL,
// DQ, CD), the products ablate calls (sgemm, dgemm, sgemv, dgemv) are the same kernels on OpenBLAS's
// later AVX-512 sets; Haswell's need AVX2 and FMA (OpenBLAS's "Zen" is the same kernels with AMD's
// blocking sizes, so AMD processors without AVX-512 get that name). Empty: OpenBLAS's own choice.
std::string widest_kernels() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // libgcc's feature bits already require the operating system to save the AVX/AVX-512 state (XCR0).
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512) return "SkylakeX";
  if (avx2) return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
  return "";
}

}  // namespace

void choose_cpu_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr && *set != '\0') {
      spdlog::debug("OpenBLAS kernels: {} (OPENBLAS_CORETYPE, as set)", set);
      return;
    }
    const std::string kernels = widest_kernels();
    if (kernels.empty()) {
      spdlog::debug("OpenBLAS kernels: OpenBLAS's own choice (no AVX2 with FMA on this processor)");
      return;
    }
    ::setenv("OPENBLAS_CORETYPE", kernels.c_str(), 0);
    spdlog::debug("OpenBLAS kernels: {} (from the processor's instruction sets; OPENBLAS_CORETYPE overrides)", kernels);
  });
}

}  // namespace ablate
