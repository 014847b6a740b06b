// Launchers of `cudnn_flash`'s own kernels (ragged_kernels.cu): the sequence metadata cuDNN reads
// (ragged.hpp computes each entry), the f32 <-> bf16 conversions around cuDNN's bf16 SDPA, and the
// zeroing of positions outside every segment. bf16 buffers are passed as void* so that host code
// needs no CUDA header beyond the runtime's. All enqueue on `stream`, return at once, and throw an
// ablate error when a launch fails.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ragged.hpp"

namespace ablate::cudnn_flash {

// Packed rows: lengths[bound], q/kv/stat offsets[bound + 1] from the batch's segments (S, 2) and
// row_segments (B + 1), all on the device.
void launch_build_ragged(const int32_t* segments, const int32_t* row_segments, int32_t num_segments, int32_t bound,
                         const RaggedShape& shape, int32_t* lengths, int32_t* q_offsets, int32_t* kv_offsets, int32_t* stat_offsets,
                         cudaStream_t stream);

// Padded rows: lengths[rows].
void launch_build_padded(const int32_t* segments, const int32_t* row_segments, int32_t rows, int32_t* lengths, cudaStream_t stream);

// dst[i] = bf16(src[i]) (round to nearest even), n elements.
void launch_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream);

// Per position p of `positions` (B * T), its `per_position` values (heads * D): zero where
// segment_ids[p] == 0 (padding), else the bf16 source widened to f32.
void launch_store_f32(const void* src, float* dst, int64_t positions, int64_t per_position, const int32_t* segment_ids,
                      cudaStream_t stream);

// The same zeroing in place on a bf16 tensor (a bf16 problem's outputs, written by cuDNN directly).
void launch_zero_padding_bf16(void* data, int64_t positions, int64_t per_position, const int32_t* segment_ids, cudaStream_t stream);

// The softmax statistics of padding positions set to 0, so `saved` holds no stale values: (B, T, H)
// token-major for packed rows, (B, H, T) for padded rows.
void launch_zero_padding_stats(float* stats, const int32_t* segment_ids, int64_t rows, int64_t seq_len, int64_t heads,
                               bool token_major, cudaStream_t stream);

}  // namespace ablate::cudnn_flash
