# The cuBLAS and cuBLASLt stand-in (cublas_v2.h, cublasLt.h) inside the emulated CUDA runtime, and
# its test against float64 references (OpenBLAS's cblas_dgemm; the runtime itself needs no BLAS).
target_sources(ablate_cudart_emu PRIVATE "${CMAKE_CURRENT_LIST_DIR}/cublas_emu.cpp" "${CMAKE_CURRENT_LIST_DIR}/nccl_emu.cpp")

add_executable(test_cublas_emu EXCLUDE_FROM_ALL "${CMAKE_CURRENT_LIST_DIR}/test_cublas_emu.cpp")
target_link_libraries(test_cublas_emu PRIVATE ablate_test_main ablate_cudart_emu ablate::blas)
if(ABLATE_BLAS_RPATH)
  set_property(TARGET test_cublas_emu APPEND PROPERTY BUILD_RPATH "${ABLATE_BLAS_RPATH}")
endif()
add_dependencies(ablate_emu_tests test_cublas_emu)
doctest_discover_tests(test_cublas_emu PROPERTIES LABELS emu TEST_PREFIX "test_cublas_emu/")
