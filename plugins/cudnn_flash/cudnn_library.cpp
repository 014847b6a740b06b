// Run-time loading of cuDNN for cudnn-frontend (see cudnn_library.hpp).
#include "cudnn_library.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include <mutex>

#include <cudnn_frontend.h>

#include "ablate/error.hpp"

// The frontend's dynamic-loading mode resolves cuDNN's symbols from this handle (it declares it and
// leaves the definition to its user). The plugin is built with hidden visibility, so the definition
// stays inside it.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace ablate::cudnn_flash {

namespace {

constexpr const char* kWhere = "cudnn_flash";

// The CUDA runtime the frontend opens for its own calls (memsets, stream queries on our stream):
// the one the plugin was built against, not the first of libcudart.so.12 / .13 it finds on the
// loader's path (a machine with PyTorch for CUDA 12 has both), unless the user named one.
void pin_frontend_cudart() {
  const std::string name = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", name.c_str(), /*overwrite=*/0);
}

CudnnLibrary open_library() {
  pin_frontend_cudart();
  CudnnLibrary lib;
  std::string tried;
  const auto try_open = [&](const char* name) {
    if (name == nullptr || *name == '\0' || cudnn_frontend::cudnn_dlhandle != nullptr) return;
    dlerror();
    cudnn_frontend::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (cudnn_frontend::cudnn_dlhandle != nullptr) {
      lib.path = name;
    } else {
      const char* why = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + name + ": " + (why ? why : "not found");
    }
  };
  try_open("libcudnn.so.9");
#ifdef ABLATE_CUDNN_LIBRARY_PATH
  try_open(ABLATE_CUDNN_LIBRARY_PATH);
#endif
  if (cudnn_frontend::cudnn_dlhandle == nullptr) {
    lib.error = "cuDNN 9 could not be loaded (" + tried + ")";
    return lib;
  }
  try {
    lib.version = int64_t(cudnn_frontend::detail::get_backend_version());
    lib.loaded = true;
  } catch (const std::exception& e) {
    lib.error = std::string("cuDNN was opened from ") + lib.path + " but cudnnGetVersion is missing: " + e.what();
  }
  return lib;
}

void check(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw_runtime_error(kWhere, std::string(call) + " failed: " + cudnn_frontend::detail::get_error_string(status));
}

}  // namespace

const CudnnLibrary& cudnn_library() {
  static std::once_flag once;
  static CudnnLibrary lib;
  std::call_once(once, [] { lib = open_library(); });
  return lib;
}

void* create_cudnn_handle() {
  const CudnnLibrary& lib = cudnn_library();
  if (!lib.loaded) throw_runtime_error(kWhere, lib.error);
  cudnnHandle_t handle = nullptr;
  check(cudnn_frontend::detail::create_handle(&handle), "cudnnCreate");
  return handle;
}

void destroy_cudnn_handle(void* handle) noexcept {
  if (handle != nullptr) (void)cudnn_frontend::detail::destroy_handle(static_cast<cudnnHandle_t>(handle));
}

void set_cudnn_stream(void* handle, cudaStream_t stream) {
  check(cudnn_frontend::detail::set_stream(static_cast<cudnnHandle_t>(handle), stream), "cudnnSetStream");
}

}  // namespace ablate::cudnn_flash
