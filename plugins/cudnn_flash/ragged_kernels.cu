// `cudnn_flash`'s kernels: one thread per sequence entry for the metadata (the arithmetic is
// ragged.hpp's, shared with the host tests), grid-stride loops for the conversions and the zeroing.
#include <cuda_bf16.h>

#include "ablate/cuda_launch.cuh"
#include "ablate/cuda_check.hpp"
#include "ragged_kernels.hpp"

namespace ablate::cudnn_flash {
namespace {

using cuda::blocks_for;
using cuda::kThreads;

__global__ void build_ragged_kernel(const int32_t* segments, const int32_t* row_segments, int32_t num_segments, int32_t bound,
                                    RaggedShape shape, int32_t* lengths, int32_t* q_offsets, int32_t* kv_offsets,
                                    int32_t* stat_offsets) {
  ABLATE_GRID_STRIDE(i, int64_t(bound) + 1) {
    const RaggedEntry e = ragged_entry(int32_t(i), num_segments, segments, row_segments, shape);
    if (i < bound) lengths[i] = e.length;
    q_offsets[i] = e.q_offset;
    kv_offsets[i] = e.kv_offset;
    stat_offsets[i] = e.stat_offset;
  }
}

__global__ void build_padded_kernel(const int32_t* segments, const int32_t* row_segments, int32_t rows, int32_t* lengths) {
  ABLATE_GRID_STRIDE(r, rows) lengths[r] = padded_length(int32_t(r), segments, row_segments);
}

__global__ void store_f32_kernel(const __nv_bfloat16* src, float* dst, int64_t n, int64_t per_position, const int32_t* segment_ids) {
  ABLATE_GRID_STRIDE(i, n) dst[i] = segment_ids[i / per_position] == 0 ? 0.0f : __bfloat162float(src[i]);
}

__global__ void zero_padding_bf16_kernel(__nv_bfloat16* data, int64_t n, int64_t per_position, const int32_t* segment_ids) {
  ABLATE_GRID_STRIDE(i, n) {
    if (segment_ids[i / per_position] == 0) data[i] = __float2bfloat16_rn(0.0f);
  }
}

__global__ void zero_padding_stats_kernel(float* stats, const int32_t* segment_ids, int64_t seq_len, int64_t heads, bool token_major,
                                          int64_t n) {
  ABLATE_GRID_STRIDE(i, n) {
    // i walks the stats in memory order; its position (b, t) decides.
    int64_t position;
    if (token_major) {
      position = i / heads;  // (B, T, H)
    } else {
      const int64_t b = i / (heads * seq_len), t = i % seq_len;  // (B, H, T)
      position = b * seq_len + t;
    }
    if (segment_ids[position] == 0) stats[i] = 0.0f;
  }
}

void check_launch() { ABLATE_CUDA_CHECK(cudaGetLastError()); }

}  // namespace

void launch_build_ragged(const int32_t* segments, const int32_t* row_segments, int32_t num_segments, int32_t bound,
                         const RaggedShape& shape, int32_t* lengths, int32_t* q_offsets, int32_t* kv_offsets, int32_t* stat_offsets,
                         cudaStream_t stream) {
  build_ragged_kernel<<<blocks_for(int64_t(bound) + 1), kThreads, 0, stream>>>(segments, row_segments, num_segments, bound, shape,
                                                                               lengths, q_offsets, kv_offsets, stat_offsets);
  check_launch();
}

void launch_build_padded(const int32_t* segments, const int32_t* row_segments, int32_t rows, int32_t* lengths, cudaStream_t stream) {
  if (rows == 0) return;
  build_padded_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(segments, row_segments, rows, lengths);
  check_launch();
}

void launch_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cuda::launch_f32_to_bf16(src, static_cast<uint16_t*>(dst), n, stream);
  check_launch();
}

void launch_store_f32(const void* src, float* dst, int64_t positions, int64_t per_position, const int32_t* segment_ids,
                      cudaStream_t stream) {
  const int64_t n = positions * per_position;
  if (n == 0) return;
  store_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), dst, n, per_position, segment_ids);
  check_launch();
}

void launch_zero_padding_bf16(void* data, int64_t positions, int64_t per_position, const int32_t* segment_ids, cudaStream_t stream) {
  const int64_t n = positions * per_position;
  if (n == 0) return;
  zero_padding_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), n, per_position, segment_ids);
  check_launch();
}

void launch_zero_padding_stats(float* stats, const int32_t* segment_ids, int64_t rows, int64_t seq_len, int64_t heads,
                               bool token_major, cudaStream_t stream) {
  const int64_t n = rows * seq_len * heads;
  if (n == 0) return;
  zero_padding_stats_kernel<<<blocks_for(n), kThreads, 0, stream>>>(stats, segment_ids, seq_len, heads, token_major, n);
  check_launch();
}

}  // namespace ablate::cudnn_flash
