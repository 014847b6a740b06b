// What gemm.cpp decides on the host about a product before cuBLASLt sees it (gemm_plan.cpp):
// the operands' alignment, the fused epilogue and the size of the bias gradient it writes.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "gemm.hpp"

namespace ablate::cuda_layers::gemm_plan {

// The largest power of two (up to 256) that divides the address.
uint32_t alignment_of(const void* p);
// cuBLASLt's epilogue for a call whose layout allows fusing it (fused_epilogue() says when).
cublasLtEpilogue_t epilogue_of(const GemmCall& g);
// Elements of the bias-gradient vector a fused epilogue writes (0: none).
int64_t bias_grad_elements(const GemmCall& g);

}  // namespace ablate::cuda_layers::gemm_plan
