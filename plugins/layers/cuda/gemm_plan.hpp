// What gemm.cpp decides on the host about a product before cuBLASLt sees it (gemm_plan.cpp):
// the operands' alignment, the fused epilogue and the size of the bias gradient it writes.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "gemm.hpp"

namespace ablate::cuda_layers::gemm_plan {

// The largest power of two (up to 256) that divides the address.
uint32_t alignment_of(const void* p);
// Whether a bf16 product reads an operand given in bf16 where it is (else it rounds the f32 values
// into a packed, 256-byte aligned copy): always when there are no f32 values (an activation held in
// bf16), else only where the bf16 copy's address and rows are 16-byte aligned (a weight inside the
// flat bf16 copy of an odd-sized layer is packed, so cuBLASLt's fastest kernels serve every call).
bool bf16_in_place(const void* bf16, const float* f32, int64_t ld);
// cuBLASLt's epilogue for a call whose layout allows fusing it (fused_epilogue() says when).
cublasLtEpilogue_t epilogue_of(const GemmCall& g);
// Elements of the bias-gradient vector a fused epilogue writes (0: none).
int64_t bias_grad_elements(const GemmCall& g);

}  // namespace ablate::cuda_layers::gemm_plan
