// cuBLAS for the emulated CUDA device: a handle, its stream, and the batched f32 products
// (cublas_emu.cpp). Column-major, as cuBLAS: C[i] = alpha op(A[i]) op(B[i]) + beta C[i]. Work runs
// at once on the calling thread (every stream is in order). Pointer mode host (alpha, beta on the
// host); the pointer arrays of cublasGemmBatchedEx live in device memory, as on a GPU.
#pragma once

#include <cublas_api.h>

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);

// Atype = Btype = Ctype = CUDA_R_32F; computeType CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_TF32;
// algo CUBLAS_GEMM_DEFAULT (or CUBLAS_GEMM_DEFAULT_TENSOR_OP). Anything else: NOT_SUPPORTED.
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                                   const void* alpha, const void* const Aarray[], cudaDataType Atype, int lda,
                                   const void* const Barray[], cudaDataType Btype, int ldb, const void* beta, void* const Carray[],
                                   cudaDataType Ctype, int ldc, int batchCount, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
                                          const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
                                          cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);
