// cuDNN as `cudnn_flash` reaches it: loaded at run time, on first use, rather than linked, so the
// plugin loads (and answers supports()) on machines without cuDNN or without a GPU. cudnn-frontend's
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING mode resolves every cuDNN call through the library handle
// set here. Also the few handle calls the plugin makes itself, so that only cudnn_library.cpp and
// sdpa_graph.cpp compile the frontend's headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace ablate::cudnn_flash {

struct CudnnLibrary {
  bool loaded = false;
  std::string error;    // why it is not loaded
  int64_t version = 0;  // cudnnGetVersion(), e.g. 91900 for 9.19.0
  std::string path;     // what was opened
};

// Opens libcudnn once per process (thread-safe): "libcudnn.so.9" on the loader's path first, then the
// library the build found. Every later call returns the first answer. Creates no CUDA state.
const CudnnLibrary& cudnn_library();

// cuDNN handles as opaque pointers (cudnnHandle_t). Each throws an ablate error naming the call and
// cuDNN's status on failure; create needs the library loaded and a current CUDA device.
void* create_cudnn_handle();
void destroy_cudnn_handle(void* handle) noexcept;
void set_cudnn_stream(void* handle, cudaStream_t stream);

}  // namespace ablate::cudnn_flash
