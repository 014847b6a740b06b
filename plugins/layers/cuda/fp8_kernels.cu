// FP8 per-tensor scaling kernels (fp8_kernels.hpp).
#include "fp8_kernels.hpp"

#include <cuda_fp8.h>

#include "ablate/cuda_launch.cuh"
#include "ablate/device_math.hpp"

namespace ablate::cuda_layers {
namespace {

constexpr int kTile = 32;  // the transposing pack's tile: 32 x 32 elements, 32 x 8 threads

// |x| as the bits of a non-negative float: for those, integer order is float order, and a NaN's
// bits exceed every number's, so an integer max keeps NaN.
__device__ unsigned abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

// The block's threads' largest bits, then one atomic per warp.
__device__ void max_into(float* amax, unsigned bits) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned other = __shfl_xor_sync(0xFFFFFFFFu, bits, offset);
    bits = other > bits ? other : bits;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<unsigned*>(amax), bits);
}

__device__ uint8_t to_fp8(float v, Fp8Format format, unsigned& saturated) {
  const float limit = format == Fp8Format::e4m3 ? 448.0f : 57344.0f;
  if (fabsf(v) > limit) ++saturated;  // NaN compares false: not counted
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// The block's warps' counts added to a float (slots count in floats).
__device__ void count_into(float* saturated, unsigned count) {
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_xor_sync(0xFFFFFFFFu, count, offset);
  if ((threadIdx.x & 31) == 0 && count > 0) atomicAdd(saturated, float(count));
}

// x's element (r, c): f32, or bf16 widened.
__device__ float load2d(const void* x, bool bf16, int64_t r, int64_t c, int64_t ld) {
  if (bf16) return device_math::bf16_value(static_cast<const uint16_t*>(x)[r * ld + c]);
  return static_cast<const float*>(x)[r * ld + c];
}

// skip: a slot's scale; where it is set, nothing is read.
__global__ void amax_2d_kernel(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* skip, float* amax) {
  if (*skip > 0.0f) return;
  unsigned m = 0;
  ABLATE_GRID_STRIDE(i, rows * cols) {
    const unsigned b = abs_bits(load2d(x, bf16, i / cols, i % cols, ld));
    m = b > m ? b : m;
  }
  max_into(amax, m);
}

// Not transposed: one thread an element of y (rows x y_ld), the padding written as zeros.
__global__ void pack_kernel(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* scale, Fp8Format format,
                            uint8_t* y, int64_t y_ld, float* saturated, float* amax) {
  const float s = *scale;
  unsigned over = 0, m = 0;
  ABLATE_GRID_STRIDE(i, rows * y_ld) {
    const int64_t r = i / y_ld, c = i % y_ld;
    if (c < cols) {
      const float v = load2d(x, bf16, r, c, ld);
      const unsigned b = abs_bits(v);
      m = b > m ? b : m;
      y[i] = to_fp8(v * s, format, over);
    } else {
      y[i] = 0;
    }
  }
  if (saturated != nullptr) count_into(saturated, over);
  if (amax != nullptr) max_into(amax, m);
}

// Transposed: 32 x 32 tiles of y (cols x y_ld) through shared memory, x's rows beyond `rows` zeros.
// With `plain` (rows x plain_ld) set, each value read also goes there as the untransposed pack
// writes it (its columns beyond `cols` zeros): both layouts from one read of x; with y null, only
// that one. With `partials` set, each tile's column sums (kTile == kFp8SumRows rows) go to
// partials[tile row * cols + c]: each thread's rows in order, then the 8 threads of a column in
// order.
__global__ void pack_transposed_kernel(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* scale,
                                       Fp8Format format, uint8_t* y, int64_t y_ld, uint8_t* plain, int64_t plain_ld, float* saturated,
                                       float* amax, float* partials) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float column[8][kTile];
  const float s = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  unsigned over = 0, m = 0;
  float sum = 0.0f;
  for (int dr = int(threadIdx.y); dr < kTile; dr += int(blockDim.y)) {
    const int64_t r = r0 + dr, c = c0 + int64_t(threadIdx.x);
    uint8_t q = 0;
    if (r < rows && c < cols) {
      const float v = load2d(x, bf16, r, c, ld);
      const unsigned b = abs_bits(v);
      m = b > m ? b : m;
      q = to_fp8(v * s, format, over);
      sum += v;
    }
    if (y != nullptr && r < y_ld && c < cols) tile[dr][threadIdx.x] = q;
    if (plain != nullptr && r < rows && c < plain_ld) plain[r * plain_ld + c] = q;
  }
  if (partials != nullptr) column[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (y != nullptr) {
    for (int dc = int(threadIdx.y); dc < kTile; dc += int(blockDim.y)) {
      const int64_t c = c0 + dc, r = r0 + int64_t(threadIdx.x);
      if (r < y_ld && c < cols) y[c * y_ld + r] = tile[threadIdx.x][dc];
    }
  }
  if (partials != nullptr && threadIdx.y == 0 && r0 < rows && c0 + int64_t(threadIdx.x) < cols) {
    float t = 0.0f;
    for (int i = 0; i < 8; ++i) t += column[i][threadIdx.x];
    partials[int64_t(blockIdx.y) * cols + c0 + int64_t(threadIdx.x)] = t;
  }
  if (saturated != nullptr) count_into(saturated, over);
  if (amax != nullptr) max_into(amax, m);
}

// sums[c] += the sum of partials[t * cols + c] over the `tiles` tiles, in order.
__global__ void add_column_partials_kernel(const float* partials, int64_t tiles, int64_t cols, float* sums) {
  ABLATE_GRID_STRIDE(c, cols) {
    float t = 0.0f;
    for (int64_t i = 0; i < tiles; ++i) t += partials[i * cols + c];
    sums[c] += t;
  }
}

__global__ void slot_scale_kernel(float* slot, float fp8_max, float* amax, float* scale, float* scale_inv) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  slot[3] = fp8_max;
  float s = slot[1];
  if (!(s > 0.0f)) {  // no history yet: the operand's own amax
    const float a = *amax;
    s = a > 0.0f && a <= 3.4028234663852886e38f ? fp8_max / a : 1.0f;
  }
  *scale = s;
  *scale_inv = 1.0f / s;
  *amax = 0.0f;
}

__global__ void update_slots_kernel(float* slots, int64_t count, int64_t history, bool use_max) {
  ABLATE_GRID_STRIDE(t, count) {
    float* s = slots + t * (kFp8SlotHeader + history);
    if (!(s[3] > 0.0f)) continue;  // never used
    const float now = s[0];
    const int64_t k = int64_t(s[4]);
    float* h = s + kFp8SlotHeader;
    h[k % history] = now;
    s[4] = float(k + 1);
    s[0] = 0.0f;
    s[6] = s[5];
    s[5] = 0.0f;
    float a = now;
    if (use_max) {
      const int64_t kept = k + 1 < history ? k + 1 : history;
      for (int64_t i = 0; i < kept; ++i) a = fmaxf(a, h[i]);
    }
    if (a > 0.0f && a <= 3.4028234663852886e38f) {  // NaN and inf fail: the scale is kept
      s[1] = s[3] / a;
      s[2] = 1.0f / s[1];
    }
  }
}

// The tiled kernel over width x height elements (each covering what it writes), its sums added.
void launch_tiled(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* scale, Fp8Format format, uint8_t* y,
                  int64_t y_ld, uint8_t* plain, int64_t plain_ld, float* saturated, float* amax, Fp8ColumnSums sums, int64_t width,
                  int64_t height, cudaStream_t stream) {
  static_assert(kTile == kFp8SumRows, "a tile's rows are one partial's");
  const dim3 grid(unsigned((width + kTile - 1) / kTile), unsigned((height + kTile - 1) / kTile)), block(kTile, 8);
  float* partials = sums.sums != nullptr ? sums.partials : nullptr;
  pack_transposed_kernel<<<grid, block, 0, stream>>>(x, bf16, rows, cols, ld, scale, format, y, y_ld, plain, plain_ld, saturated, amax,
                                                     partials);
  if (partials != nullptr) launch_fp8_add_column_partials(partials, rows, cols, sums.sums, stream);
}

}  // namespace

void launch_fp8_add_column_partials(const float* partials, int64_t rows, int64_t cols, float* sums, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  add_column_partials_kernel<<<cuda::blocks_for(cols), cuda::kThreads, 0, stream>>>(partials, (rows + kFp8SumRows - 1) / kFp8SumRows,
                                                                                    cols, sums);
}

void launch_fp8_slot_amax(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* slot, float* amax,
                          cudaStream_t stream) {
  if (rows > 0 && cols > 0) {
    amax_2d_kernel<<<cuda::blocks_for(rows * cols), cuda::kThreads, 0, stream>>>(x, bf16, rows, cols, ld, slot + 1, amax);
  }
}
void launch_fp8_slot_scale(float* slot, float fp8_max, float* amax, float* scale, float* scale_inv, cudaStream_t stream) {
  slot_scale_kernel<<<1, 32, 0, stream>>>(slot, fp8_max, amax, scale, scale_inv);
}
void launch_fp8_update_slots(float* slots, int64_t count, int64_t history, bool use_max, cudaStream_t stream) {
  if (count > 0 && history > 0) {
    update_slots_kernel<<<cuda::blocks_for(count), cuda::kThreads, 0, stream>>>(slots, count, history, use_max);
  }
}
void launch_fp8_pack(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, bool transposed, const float* scale,
                     Fp8Format format, uint8_t* y, int64_t y_ld, float* saturated, float* amax, cudaStream_t stream,
                     Fp8ColumnSums sums) {
  if (rows <= 0 || cols <= 0) return;
  if (transposed) {
    launch_tiled(x, bf16, rows, cols, ld, scale, format, y, y_ld, nullptr, 0, saturated, amax, sums, cols, y_ld, stream);
  } else if (sums.sums != nullptr) {  // the sums need the tiles: the plain layout alone from them
    launch_tiled(x, bf16, rows, cols, ld, scale, format, nullptr, 0, y, y_ld, saturated, amax, sums, y_ld, rows, stream);
  } else {
    pack_kernel<<<cuda::blocks_for(rows * y_ld), cuda::kThreads, 0, stream>>>(x, bf16, rows, cols, ld, scale, format, y, y_ld,
                                                                              saturated, amax);
  }
}
void launch_fp8_pack_both(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* scale, Fp8Format format,
                          uint8_t* plain, int64_t plain_ld, uint8_t* transposed, int64_t t_ld, float* saturated, float* amax,
                          cudaStream_t stream, Fp8ColumnSums sums) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t width = cols > plain_ld ? cols : plain_ld, height = rows > t_ld ? rows : t_ld;
  launch_tiled(x, bf16, rows, cols, ld, scale, format, transposed, t_ld, plain, plain_ld, saturated, amax, sums, width, height,
               stream);
}
}  // namespace ablate::cuda_layers
