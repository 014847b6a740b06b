// Kernels of the CUDA layers other than the norms: elementwise activations and dropout, table
// lookups and their deterministic scatter-add backward, rope, column sums and the classifier's
// softmax rows. Grid-stride loops over 64-bit indices; the arithmetic is dense_math.hpp's.
#include <math_constants.h>

#include <cub/device/device_radix_sort.cuh>

#include <cfloat>
#include <cmath>
#include <mutex>

#include "ablate/cuda_launch.cuh"
#include "ablate/cuda_check.hpp"
#include "ablate/device_math.hpp"
#include "dense_math.hpp"
#include "fp8_kernels.hpp"
#include "gemm.hpp"
#include "layer_kernels.hpp"

namespace ablate::cuda_layers {
namespace {

using cuda::blocks_for;
using cuda::kThreads;

enum WorkSlot { kKeysIn, kKeysOut, kValsIn, kValsOut, kSortTemp, kOnes, kScatterPartials, kWorkSlots };

// Device memory the kernels need beyond their arguments (sort buffers, a ones vector, the
// scatter's partial sums), each slot grown on the stream and kept (cuda::StreamScratch).
class Workspace {
 public:
  void* bytes(int slot, std::size_t n, cudaStream_t stream) { return slots_[slot].get(n, stream); }
  bool grown(int slot) { return slots_[slot].take_grown(); }
  std::mutex mu;

 private:
  cuda::StreamScratch slots_[kWorkSlots];
};

Workspace& workspace() {
  static Workspace ws;  // freed by the driver at exit
  return ws;
}

// --- elementwise ---------------------------------------------------------------------------------

// The residual and y f32, or both bf16 (the residual stream held in bf16: the f32 sum rounded once).
template <class T>
__global__ void dropout_residual_kernel(const float* t, const T* residual, T* y, int64_t n, DropoutArgs d) {
  ABLATE_GRID_STRIDE(i, n) {
    const float v = t[i] * dropout_factor(d.key, uint64_t(i), d.p, d.scale);
    device_math::store_value(y + i, residual != nullptr ? device_math::load_value(residual[i]) + v : v);
  }
}

__global__ void dropout_grad_kernel(const float* dy, float* out, int64_t n, DropoutArgs d) {
  ABLATE_GRID_STRIDE(i, n) out[i] = dy[i] * dropout_factor(d.key, uint64_t(i), d.p, d.scale);
}

__global__ void gelu_forward_kernel(const float* pre, float* post, int64_t n) { ABLATE_GRID_STRIDE(i, n) post[i] = gelu_out(pre[i]); }

__global__ void gelu_backward_kernel(const float* pre, float* dh, int64_t n) { ABLATE_GRID_STRIDE(i, n) dh[i] *= gelu_grad(pre[i]); }

__global__ void gelu_forward_bf16_kernel(const float* t, uint16_t* pre, uint16_t* post, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) {
    const float x = t[i];
    pre[i] = device_math::bf16_bits(x);
    post[i] = device_math::bf16_bits(gelu_out(x));
  }
}

__global__ void gelu_backward_bf16_kernel(const uint16_t* pre, float* dh, uint16_t* dpre, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) {
    const float g = dh[i] * gelu_grad(device_math::bf16_value(pre[i]));
    dh[i] = g;
    dpre[i] = device_math::bf16_bits(g);
  }
}

// 32 x 32 tiles of (rows, cols), 32 x 8 threads: each thread its column's rows y, y + 8, ... in
// order, then the 8 threads of a column in order, into partials[tile row * cols + c].
__global__ void gelu_backward_bf16_sums_kernel(const uint16_t* pre, const uint16_t* dh, uint16_t* dpre, int64_t rows, int64_t cols,
                                               float* partials) {
  __shared__ float column[8][32];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c = int64_t(blockIdx.x) * 32 + int64_t(threadIdx.x);
  float sum = 0.0f;
  for (int dr = int(threadIdx.y); dr < 32; dr += 8) {
    const int64_t r = r0 + dr;
    if (r < rows && c < cols) {
      const int64_t i = r * cols + c;
      const float g = device_math::bf16_value(dh[i]) * gelu_grad(device_math::bf16_value(pre[i]));
      dpre[i] = device_math::bf16_bits(g);
      sum += g;
    }
  }
  if (partials == nullptr) return;
  column[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int i = 0; i < 8; ++i) t += column[i][threadIdx.x];
    partials[int64_t(blockIdx.y) * cols + c] = t;
  }
}

__global__ void add_bf16_kernel(const uint16_t* src, float* dst, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) dst[i] += device_math::bf16_value(src[i]);
}

__global__ void swiglu_forward_kernel(const float* g, const float* u, float* h, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) h[i] = swiglu_out(g[i], u[i]);
}

__global__ void swiglu_backward_kernel(const float* g, const float* u, float* du, float* dg, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) {
    const float dh = du[i];
    dg[i] = swiglu_dg(g[i], u[i], dh);
    du[i] = swiglu_du(g[i], dh);
  }
}

__global__ void swiglu_forward_bf16_kernel(const uint16_t* g, const uint16_t* u, uint16_t* h, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) h[i] = device_math::bf16_bits(swiglu_out(device_math::bf16_value(g[i]), device_math::bf16_value(u[i])));
}

__global__ void swiglu_backward_bf16_kernel(const uint16_t* g, const uint16_t* u, const uint16_t* dh, uint16_t* dg, uint16_t* du,
                                            int64_t n) {
  ABLATE_GRID_STRIDE(i, n) {
    const float gv = device_math::bf16_value(g[i]), d = device_math::bf16_value(dh[i]);
    dg[i] = device_math::bf16_bits(swiglu_dg(gv, device_math::bf16_value(u[i]), d));
    du[i] = device_math::bf16_bits(swiglu_du(gv, d));
  }
}

__global__ void copy_or_add_kernel(const float* src, float* dst, int64_t n, bool accumulate) {
  ABLATE_GRID_STRIDE(i, n) dst[i] = accumulate ? dst[i] + src[i] : src[i];
}

__global__ void fill_kernel(float* p, int64_t n, float v) { ABLATE_GRID_STRIDE(i, n) p[i] = v; }

__global__ void iota_kernel(int32_t* p, int64_t n) { ABLATE_GRID_STRIDE(i, n) p[i] = int32_t(i); }

// --- lookups --------------------------------------------------------------------------------------

// y f32, or bf16 (the residual stream held in bf16: each value rounded once, after the dropout).
template <class Out>
__global__ void gather_rows_kernel(const int32_t* index, const float* table, Out* y, int64_t rows, int64_t cols, int64_t limit,
                                   DropoutArgs d) {
  ABLATE_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const int32_t t = index[r];
    device_math::store_value(
        y + i, (t < 0 || t >= limit) ? CUDART_NAN_F : table[int64_t(t) * cols + c] * dropout_factor(d.key, uint64_t(i), d.p, d.scale));
  }
}

// x and y f32, or both bf16 (the sum of the bf16 value and the f32 table's rounded once).
template <class T>
__global__ void add_rows_kernel(const int32_t* index, const float* table, const T* x, T* y, int64_t rows, int64_t cols,
                                int64_t limit) {
  ABLATE_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const int32_t t = index[r];
    device_math::store_value(y + i,
                             (t < 0 || t >= limit) ? CUDART_NAN_F : device_math::load_value(x[i]) + table[int64_t(t) * cols + c]);
  }
}

// The scatter-add over the rows sorted by index (stable, so each index's rows are in row order),
// in two stages. The sorted positions are cut into chunks of kScatterChunk; a chunk holds segments
// of equal index (its runs, cut at the chunk's edges).
//
// Stage 1: block (chunk, column tile), one thread a column (a warp reads 32 consecutive columns of
// a row), sums each segment's rows in order. A run wholly inside the chunk is added into its table
// row here. A piece of a run that crosses a chunk edge goes to the chunk's partials instead
// (partials[(2 chunk + slot) * cols + c]): slot 0 the chunk's first segment when its run began in
// an earlier chunk, slot 1 the last segment when its run goes on into the next chunk (a segment
// that is both, a run spanning the chunk, is slot 0). Indices outside [0, limit) are skipped.
constexpr int kScatterChunk = 256;

__global__ void scatter_chunks_kernel(const int32_t* sorted_index, const int32_t* sorted_row, const float* d, float* grads,
                                      float* partials, int64_t rows, int64_t cols, int64_t limit, DropoutArgs drop) {
  __shared__ int32_t s_index[kScatterChunk], s_row[kScatterChunk];
  const int64_t chunk = blockIdx.x, lo = chunk * kScatterChunk;
  const int n = rows - lo < kScatterChunk ? int(rows - lo) : kScatterChunk;
  for (int k = int(threadIdx.x); k < n; k += int(blockDim.x)) {
    s_index[k] = sorted_index[lo + k];
    s_row[k] = sorted_row[lo + k];
  }
  __syncthreads();
  const bool from_before = lo > 0 && sorted_index[lo - 1] == s_index[0];
  const bool into_next = lo + n < rows && sorted_index[lo + n] == s_index[n - 1];
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < cols; c += int64_t(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    int start = 0;  // the current segment's first position in the chunk
    for (int k = 0; k < n; ++k) {
      const int32_t t = s_index[k];
      const bool valid = t >= 0 && t < limit;
      if (valid) {
        const int64_t i = int64_t(s_row[k]) * cols + c;
        acc += d[i] * dropout_factor(drop.key, uint64_t(i), drop.p, drop.scale);
      }
      if (k + 1 < n && s_index[k + 1] == t) continue;  // the segment goes on
      if (valid) {
        if (start == 0 && from_before) {
          partials[2 * chunk * cols + c] = acc;
        } else if (k + 1 == n && into_next) {
          partials[(2 * chunk + 1) * cols + c] = acc;
        } else {
          grads[int64_t(t) * cols + c] += acc;
        }
      }
      acc = 0.0f;
      start = k + 1;
    }
  }
}

// Stage 2: block (chunk, column tile). The block of the chunk where a run crossing chunk edges
// begins (the others exit) adds that chunk's slot-1 partial and then the slot-0 partial of each
// following chunk up to the one where the run ends, in chunk order, into the run's table row.
__global__ void scatter_crossing_runs_kernel(const int32_t* sorted_index, const float* partials, float* grads, int64_t rows,
                                             int64_t cols, int64_t limit) {
  const int64_t chunk = blockIdx.x, lo = chunk * kScatterChunk, hi = lo + kScatterChunk;
  if (hi >= rows) return;  // the last chunk: no run goes on past it
  const int32_t t = sorted_index[hi - 1];
  if (sorted_index[hi] != t || t < 0 || t >= limit) return;                  // the chunk's last run ends in it, or is skipped
  if (lo > 0 && sorted_index[lo] == t && sorted_index[lo - 1] == t) return;  // the run began in an earlier chunk
  int64_t last = chunk + 1;                                                  // the chunk where the run ends
  while ((last + 1) * kScatterChunk < rows && sorted_index[(last + 1) * kScatterChunk] == t) ++last;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < cols; c += int64_t(gridDim.y) * blockDim.x) {
    float acc = partials[(2 * chunk + 1) * cols + c];
    for (int64_t j = chunk + 1; j <= last; ++j) acc += partials[2 * j * cols + c];
    grads[int64_t(t) * cols + c] += acc;
  }
}

// --- rope ------------------------------------------------------------------------------------------

// T: f32, or bf16 for q and k held in bf16 (forward only; never accumulating).
template <class T>
__global__ void rope_kernel(const int32_t* positions, const T* src, T* dst, int64_t rows, int64_t heads, int64_t D, double theta,
                            double sign, bool accumulate) {
  const int64_t half = D / 2;
  ABLATE_GRID_STRIDE(k, rows * heads * half) {
    const int64_t i = k % half, rh = k / half, r = rh / heads;
    const int64_t base = rh * D;
    const RopePair p = rope_rotate(device_math::load_value(src[base + i]), device_math::load_value(src[base + i + half]),
                                   rope_angle(positions[r], i, D, theta), sign);
    if (accumulate) {
      device_math::store_value(dst + base + i, device_math::load_value(dst[base + i]) + p.a);
      device_math::store_value(dst + base + i + half, device_math::load_value(dst[base + i + half]) + p.b);
    } else {
      device_math::store_value(dst + base + i, p.a);
      device_math::store_value(dst + base + i + half, p.b);
    }
  }
}

// --- classifier rows -------------------------------------------------------------------------------

constexpr int kRowThreads = 512;

// A block-wide reduction in a fixed tree (the same order every run).
template <class T, class Op>
__device__ T block_reduce(T v, T* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (int(threadIdx.x) < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const T out = shared[0];
  __syncthreads();
  return out;
}

// A row whose target is -1 (no loss, no gradient) or out of range (a bad target, shown as a
// non-finite loss): its loss written, and with_grad its gradient row zeroed; true for such a row.
template <class T>
__device__ bool row_without_target(T* zr, int64_t out, int64_t real_out, int32_t target, float* loss, bool with_grad) {
  if (target >= 0 && target < real_out) return false;
  if (threadIdx.x == 0) *loss = target == -1 ? 0.0f : CUDART_NAN_F;
  if (with_grad) {
    for (int64_t c = threadIdx.x; c < out; c += blockDim.x) zr[c] = T(0);
  }
  return true;
}

__global__ void cross_entropy_rows_kernel(float* z, int64_t out, int64_t real_out, const int32_t* targets, float* losses,
                                          bool with_grad, float scale) {
  __shared__ double sd[kRowThreads];
  __shared__ float sf[kRowThreads];
  const int64_t row = blockIdx.x;
  float* zr = z + row * out;
  const int32_t target = targets[row];
  if (row_without_target(zr, out, real_out, target, losses + row, with_grad)) return;
  float mx = -FLT_MAX;
  for (int64_t c = threadIdx.x; c < real_out; c += blockDim.x) mx = fmaxf(mx, zr[c]);
  mx = block_reduce(mx, sf, [](float a, float b) { return fmaxf(a, b); });
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < real_out; c += blockDim.x) sum += double(expf(zr[c] - mx));
  sum = block_reduce(sum, sd, [](double a, double b) { return a + b; });
  const double lse = double(mx) + log(sum);
  const float z_target = zr[target];
  if (threadIdx.x == 0) losses[row] = ce_loss(lse, z_target);
  if (!with_grad) return;
  __syncthreads();  // every thread has read z[target] before it is overwritten
  const float lse_f = float(lse);
  for (int64_t c = threadIdx.x; c < out; c += blockDim.x) {
    const float g = c < real_out ? ce_dz(zr[c], lse_f, scale) : 0.0f;
    zr[c] = c == target ? g - scale : g;
  }
}

// A thread's running max of its columns and sum of exp(z - max) over them (-FLT_MAX: none seen).
struct MaxSum {
  float m;
  double s;
};

__global__ void cross_entropy_rows_bf16_kernel(uint16_t* z, int64_t out, int64_t real_out, const int32_t* targets, float* losses,
                                               bool with_grad, float scale) {
  __shared__ double sd[kRowThreads];
  __shared__ float sf[kRowThreads];
  const int64_t row = blockIdx.x;
  uint16_t* zr = z + row * out;
  const int32_t target = targets[row];
  if (row_without_target(zr, out, real_out, target, losses + row, with_grad)) return;
  MaxSum t{-FLT_MAX, 0.0};
  for (int64_t c = threadIdx.x; c < real_out; c += blockDim.x) {
    const float v = device_math::bf16_value(zr[c]);
    if (v > t.m) {
      t.s = (t.m == -FLT_MAX ? 0.0 : t.s * double(expf(t.m - v))) + 1.0;
      t.m = v;
    } else {
      t.s += double(expf(v - t.m));
    }
  }
  // The block's max, then each thread's sum rescaled to it and added.
  const float mx = block_reduce(t.m, sf, [](float a, float b) { return fmaxf(a, b); });
  const double mine = t.m == -FLT_MAX ? 0.0 : t.s * double(expf(t.m - mx));
  const double sum = block_reduce(mine, sd, [](double a, double b) { return a + b; });
  const double lse = double(mx) + log(sum);
  const float z_target = device_math::bf16_value(zr[target]);
  if (threadIdx.x == 0) losses[row] = ce_loss(lse, z_target);
  if (!with_grad) return;
  __syncthreads();  // every thread has read z[target] before it is overwritten
  const float lse_f = float(lse);
  for (int64_t c = threadIdx.x; c < out; c += blockDim.x) {
    const float g = c < real_out ? ce_dz(device_math::bf16_value(zr[c]), lse_f, scale) : 0.0f;
    zr[c] = device_math::bf16_bits(c == target ? g - scale : g);
  }
}

}  // namespace

void launch_dropout_residual(const float* t, const float* residual, float* y, int64_t n, DropoutArgs d, cudaStream_t stream) {
  if (n > 0) dropout_residual_kernel<<<blocks_for(n), kThreads, 0, stream>>>(t, residual, y, n, d);
}

void launch_dropout_residual(const float* t, const uint16_t* residual, uint16_t* y, int64_t n, DropoutArgs d, cudaStream_t stream) {
  if (n > 0) dropout_residual_kernel<<<blocks_for(n), kThreads, 0, stream>>>(t, residual, y, n, d);
}

void launch_dropout_grad(const float* dy, float* out, int64_t n, DropoutArgs d, cudaStream_t stream) {
  if (n > 0) dropout_grad_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, out, n, d);
}

void launch_gelu_forward(const float* pre, float* post, int64_t n, cudaStream_t stream) {
  if (n > 0) gelu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pre, post, n);
}

void launch_gelu_backward(const float* pre, float* dh, int64_t n, cudaStream_t stream) {
  if (n > 0) gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pre, dh, n);
}

void launch_swiglu_forward(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream) {
  if (n > 0) swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, h, n);
}

void launch_swiglu_backward(const float* g, const float* u, float* du, float* dg, int64_t n, cudaStream_t stream) {
  if (n > 0) swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, du, dg, n);
}

void launch_swiglu_forward_bf16(const uint16_t* g, const uint16_t* u, uint16_t* h, int64_t n, cudaStream_t stream) {
  if (n > 0) swiglu_forward_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, h, n);
}

void launch_swiglu_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dh, uint16_t* dg, uint16_t* du, int64_t n,
                                 cudaStream_t stream) {
  if (n > 0) swiglu_backward_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, dh, dg, du, n);
}

void launch_gather_rows(const int32_t* index, const float* table, float* y, int64_t rows, int64_t cols, int64_t limit, DropoutArgs d,
                        cudaStream_t stream) {
  if (rows * cols > 0) gather_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(index, table, y, rows, cols, limit, d);
}

void launch_gather_rows(const int32_t* index, const float* table, uint16_t* y, int64_t rows, int64_t cols, int64_t limit,
                        DropoutArgs d, cudaStream_t stream) {
  if (rows * cols > 0) gather_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(index, table, y, rows, cols, limit, d);
}

void launch_add_rows(const int32_t* index, const float* table, const float* x, float* y, int64_t rows, int64_t cols, int64_t limit,
                     cudaStream_t stream) {
  if (rows * cols > 0) add_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(index, table, x, y, rows, cols, limit);
}

void launch_add_rows(const int32_t* index, const float* table, const uint16_t* x, uint16_t* y, int64_t rows, int64_t cols,
                     int64_t limit, cudaStream_t stream) {
  if (rows * cols > 0) add_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(index, table, x, y, rows, cols, limit);
}

void scatter_add_rows(const int32_t* index, const float* d, float* grads, int64_t rows, int64_t cols, int64_t limit, DropoutArgs drop,
                      cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (rows > INT32_MAX) throw_runtime_error("cuda_layers", "more rows than a 32-bit sort handles");
  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mu);
  const std::size_t n = std::size_t(rows), ints = n * sizeof(int32_t);
  auto* keys_out = static_cast<int32_t*>(ws.bytes(kKeysOut, ints, stream));
  auto* vals_in = static_cast<int32_t*>(ws.bytes(kValsIn, ints, stream));
  auto* vals_out = static_cast<int32_t*>(ws.bytes(kValsOut, ints, stream));
  iota_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(vals_in, rows);
  std::size_t temp_bytes = 0;
  ABLATE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, index, keys_out, vals_in, vals_out, int(rows), 0,
                                                    int(sizeof(int32_t) * 8), stream));
  void* temp = ws.bytes(kSortTemp, temp_bytes, stream);
  ABLATE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, index, keys_out, vals_in, vals_out, int(rows), 0,
                                                    int(sizeof(int32_t) * 8), stream));
  // (chunks, column tiles) blocks of up to 256 threads, one a column, for both stages; a single
  // chunk has no run crossing an edge, so no partials and no stage 2.
  const int64_t chunks = (rows + kScatterChunk - 1) / kScatterChunk;
  const unsigned threads = cols >= 256 ? 256u : unsigned((cols + 31) / 32 * 32);
  const int64_t tiles = (cols + threads - 1) / threads;
  const dim3 grid(unsigned(chunks), unsigned(tiles < 65535 ? tiles : 65535));
  float* partials = nullptr;
  if (chunks > 1) {
    partials = static_cast<float*>(ws.bytes(kScatterPartials, std::size_t(2 * chunks * cols) * sizeof(float), stream));
  }
  scatter_chunks_kernel<<<grid, threads, 0, stream>>>(keys_out, vals_out, d, grads, partials, rows, cols, limit, drop);
  if (chunks > 1) scatter_crossing_runs_kernel<<<grid, threads, 0, stream>>>(keys_out, partials, grads, rows, cols, limit);
}

namespace {
__global__ void to_bf16_kernel(const float* src, int64_t cols, int64_t ld, uint16_t* dst, int64_t n) {
  ABLATE_GRID_STRIDE(i, n) dst[i] = bf16_bits(src[(i / cols) * ld + i % cols]);
}
}  // namespace

void launch_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (ld == cols) {
    cuda::launch_f32_to_bf16(src, dst, n, stream);  // one contiguous run
  } else {
    to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, cols, ld, dst, n);
  }
}

void launch_copy_or_add(const float* src, float* dst, int64_t n, bool accumulate, cudaStream_t stream) {
  if (n > 0) copy_or_add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n, accumulate);
}

void launch_add_bf16(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n > 0) add_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
}

void launch_gelu_forward_bf16(const float* t, uint16_t* pre, uint16_t* post, int64_t n, cudaStream_t stream) {
  if (n > 0) gelu_forward_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(t, pre, post, n);
}

void launch_gelu_backward_bf16(const uint16_t* pre, float* dh, uint16_t* dpre, int64_t n, cudaStream_t stream) {
  if (n > 0) gelu_backward_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pre, dh, dpre, n);
}

void launch_gelu_backward_bf16_sums(const uint16_t* pre, const uint16_t* dh, uint16_t* dpre, int64_t rows, int64_t cols,
                                    float* partials, float* db, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  static_assert(kFp8SumRows == 32, "a tile's rows are one partial's");
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), block(32, 8);
  gelu_backward_bf16_sums_kernel<<<grid, block, 0, stream>>>(pre, dh, dpre, rows, cols, db != nullptr ? partials : nullptr);
  if (db != nullptr) launch_fp8_add_column_partials(partials, rows, cols, db, stream);
}

void launch_rope(const int32_t* positions, const float* src, float* dst, int64_t rows, int64_t heads, int64_t D, double theta,
                 bool inverse, bool accumulate, cudaStream_t stream) {
  const int64_t n = rows * heads * (D / 2);
  if (n > 0) {
    rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(positions, src, dst, rows, heads, D, theta, inverse ? -1.0 : 1.0, accumulate);
  }
}

void launch_rope(const int32_t* positions, const uint16_t* src, uint16_t* dst, int64_t rows, int64_t heads, int64_t D, double theta,
                 cudaStream_t stream) {
  const int64_t n = rows * heads * (D / 2);
  if (n > 0) rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(positions, src, dst, rows, heads, D, theta, 1.0, false);
}

namespace {

// db(1, cols) += ones(1, rows) m(rows, cols): a product with a ones vector kept in the workspace.
GemmCall column_sums_call(float* db, int64_t rows, int64_t cols, cudaStream_t stream) {
  Workspace& ws = workspace();
  GemmCall g;
  {
    std::lock_guard<std::mutex> lock(ws.mu);
    auto* p = static_cast<float*>(ws.bytes(kOnes, std::size_t(rows) * sizeof(float), stream));
    if (ws.grown(kOnes)) fill_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(p, rows, 1.0f);
    g.A = p;
  }
  g.M = 1;
  g.N = cols;
  g.K = rows;
  g.lda = rows;
  g.ldb = cols;
  g.beta = 1.0f;
  g.D = db;
  g.ldc = cols;
  return g;
}

}  // namespace

void add_column_sums(const float* m, float* db, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  GemmCall g = column_sums_call(db, rows, cols, stream);
  g.B = m;
  gemm(g, stream);
}

void add_column_sums_bf16(const uint16_t* m, float* db, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  GemmCall g = column_sums_call(db, rows, cols, stream);
  g.mode = MatmulMode::bf16;  // the ones rounded to bf16 by the product: exactly
  g.B_bf16 = m;
  gemm(g, stream);
}

void launch_cross_entropy_rows(float* z, int64_t n, int64_t out, int64_t real_out, const int32_t* targets, float* losses,
                               bool with_grad, float scale, cudaStream_t stream) {
  if (n > 0) cross_entropy_rows_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(z, out, real_out, targets, losses, with_grad, scale);
}

void launch_cross_entropy_rows_bf16(uint16_t* z, int64_t n, int64_t out, int64_t real_out, const int32_t* targets, float* losses,
                                    bool with_grad, float scale, cudaStream_t stream) {
  if (n > 0) {
    cross_entropy_rows_bf16_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(z, out, real_out, targets, losses, with_grad, scale);
  }
}

}  // namespace ablate::cuda_layers
