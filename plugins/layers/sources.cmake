# The CUDA layers' sources and include folders (absolute), read by plugins/layers/CMakeLists.txt for
# libablate_cuda_layers.so and by tests/cuda_emulation for its emulated build of the same files.
set(_layers "${CMAKE_CURRENT_LIST_DIR}")
set(ABLATE_CUDA_LAYERS_SOURCES
  "${_layers}/cuda/cuda_layers.cpp" "${_layers}/cuda/gemm.cpp" "${_layers}/cuda/gemm_plan.cpp"
  "${_layers}/cuda/layer_kernels.cu" "${_layers}/cuda/epilogue_kernels.cu" "${_layers}/cuda/fp8_kernels.cu"
  "${_layers}/lookup/lookup_cuda.cpp" "${_layers}/norm/norm_cuda.cpp" "${_layers}/norm/norm_kernels.cu"
  "${_layers}/dense/dense_cuda.cpp" "${_layers}/cross_entropy/cross_entropy_cuda.cpp" "${_layers}/lora/lora_cuda.cpp")
# The kernels alone (the interpreter's kernel tests run them without the host code).
set(ABLATE_CUDA_LAYERS_KERNELS
  "${_layers}/cuda/layer_kernels.cu" "${_layers}/norm/norm_kernels.cu" "${_layers}/cuda/epilogue_kernels.cu"
  "${_layers}/cuda/fp8_kernels.cu")
set(ABLATE_CUDA_LAYERS_INCLUDES "${_layers}/cuda" "${_layers}/norm" "${_layers}/dense")
