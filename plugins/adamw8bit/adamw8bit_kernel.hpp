// The `adamw8bit` CUDA step kernel's host interface (C++17: nvcc compiles the kernel; the CUDA
// implementation, adamw8bit_cuda.cpp, calls it). Its arithmetic is adamw8bit_math.hpp's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "adamw8bit_math.hpp"

namespace ablate::adamw8bit::cuda {

// One work block: at most `block_size` consecutive elements of one slice.
struct BlockInfo {
  int64_t param_offset = 0;  // first element in the parameter buffer
  int64_t state_offset = 0;  // first element in the code arrays (quantized) or the fp32 moments
  int32_t absmax_index = 0;  // quantized: the block's absmax entry
  int32_t n = 0;             // elements (the last block of a slice may be short)
  int32_t quantized = 0;     // 1: 8-bit moments; 0: fp32 moments
  int32_t decay = 0;         // 1: decoupled weight decay applies
};

using Coefficients = ablate::adamw8bit::Coefficients;

// The two code maps: values (256, ascending) and the thresholds of DynamicCode (260: [k] lies
// between values[k-1] and values[k], +inf past 255), and the code of 0.
struct CodeMap {
  const float* values = nullptr;
  const float* thresholds = nullptr;
  const uint8_t* bucket_first = nullptr;  // kBuckets entries: DynamicCode::bucket_first()
  uint8_t zero_code = 0;
};

struct StepArgs {
  float* params = nullptr;
  const float* grads = nullptr;
  uint16_t* params_bf16 = nullptr;  // not null: each new parameter is also written here rounded to bf16
  const BlockInfo* blocks = nullptr;
  int64_t num_blocks = 0;
  uint8_t* m_codes = nullptr;
  uint8_t* v_codes = nullptr;
  float* m_absmax = nullptr;
  float* v_absmax = nullptr;
  float* m_fp32 = nullptr;
  float* v_fp32 = nullptr;
  CodeMap m_map, v_map;
  Coefficients c{};
  const float* grad_scale = nullptr;      // not null: the gradient's factor, in device memory, in place of c.grad_scale
  unsigned long long* skipped = nullptr;  // device counter; elements with a non-finite gradient are added
};

// Threads per thread block (a warp per quantization block), and the largest block_size the kernel
// serves (a block longer than 256 values is updated twice, so longer ones cost more reads).
constexpr int kThreads = 256;
constexpr int kMaxBlockSize = 4096;

cudaError_t launch_step(const StepArgs& args, cudaStream_t stream);

}  // namespace ablate::adamw8bit::cuda
