// The norms on a CUDA device, f32 (see norm_math.hpp for the arithmetic). Forward and the input
// gradient: one warp per row, statistics by warp shuffles; a forward row of at most 1024 values is
// read once, into registers. Parameter gradients: a two-stage column
// sum in a fixed order (no atomics), so they are the same every run: chunks of rows summed in row
// order into partials, then the partials of each column summed in chunk order. Where a row is at
// most 1024 wide and both gradients are asked for, backward is one pass over x and dy: each warp
// writes the input gradient of its 32 consecutive rows and keeps their parameter-gradient terms in
// registers (its lane's columns), one partial per warp; the partials are then summed as the
// chunks' are.
#include <cstddef>
#include <mutex>

#include "ablate/cuda_check.hpp"
#include "ablate/device_math.hpp"
#include "norm_kernels.hpp"
#include "norm_math.hpp"

namespace ablate::cuda_layers {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block

__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

using device_math::load_value;

// The row a warp takes (kRowsPerBlock warps a block), and a thread's lane in it.
__device__ int64_t warp_row() { return int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; }
__device__ int lane_of_thread() { return int(threadIdx.x % kWarp); }

// y of one element from the row's statistics.
__device__ float norm_out(bool rms, float x, float mean, float rstd, const float* w, const float* b, int64_t c) {
  return rms ? rmsnorm_out(x, rstd, w[c]) : layernorm_out(x, mean, rstd, w[c], b != nullptr ? b[c] : 0.0f);
}

// A row's statistics as backward reads them: rstd (rmsnorm), or mean then rstd in the second half.
__device__ void store_row_stats(bool rms, float* saved, int64_t row, int64_t rows, float mean, float rstd) {
  if (rms) {
    saved[row] = rstd;
  } else {
    saved[row] = mean;
    saved[rows + row] = rstd;
  }
}

// x and y are f32 or, where the model holds them in bf16, bf16 (device_math::load_value and
// store_value): y a norm's output only products read, x and y the qk-norm's q and k.
template <class In, class Out>
__global__ void norm_forward_kernel(bool rms, const In* x, const float* w, const float* b, Out* y, float* saved, int64_t rows,
                                    int64_t in, float eps) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_of_thread();
  const In* xr = x + row * in;
  float mean = 0.0f;
  if (!rms) {
    float s = 0.0f;
    for (int64_t c = lane; c < in; c += kWarp) s += load_value(xr[c]);
    mean = warp_sum(s) / float(in);
  }
  float s2 = 0.0f;
  for (int64_t c = lane; c < in; c += kWarp) {
    const float d = load_value(xr[c]) - mean;
    s2 += d * d;
  }
  const float rstd = norm_rstd(warp_sum(s2) / float(in), eps);
  Out* yr = y + row * in;
  for (int64_t c = lane; c < in; c += kWarp) {
    device_math::store_value(yr + c, norm_out(rms, load_value(xr[c]), mean, rstd, w, b, c));
  }
  if (lane == 0) store_row_stats(rms, saved, row, rows, mean, rstd);
}

// The same for rows of at most kWarp * kPerLane values, in one read of x: each lane keeps its
// values (columns lane, lane + 32, ...) in registers for the mean, the variance and y, in the
// order the kernel above sums them: the same arithmetic, one read of x instead of three.
constexpr int kPerLane = 32;  // rows up to 1024 wide
template <class In, class Out>
__global__ void norm_forward_resident_kernel(bool rms, const In* x, const float* w, const float* b, Out* y, float* saved, int64_t rows,
                                             int64_t in, float eps) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_of_thread();
  const In* xr = x + row * in;
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + int64_t(j) * kWarp;
    v[j] = c < in ? load_value(xr[c]) : 0.0f;
  }
  float mean = 0.0f;
  if (!rms) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + int64_t(j) * kWarp < in) s += v[j];
    }
    mean = warp_sum(s) / float(in);
  }
  float s2 = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (lane + int64_t(j) * kWarp >= in) continue;
    const float d = v[j] - mean;
    s2 += d * d;
  }
  const float rstd = norm_rstd(warp_sum(s2) / float(in), eps);
  Out* yr = y + row * in;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + int64_t(j) * kWarp;
    if (c >= in) continue;
    device_math::store_value(yr + c, norm_out(rms, v[j], mean, rstd, w, b, c));
  }
  if (lane == 0) store_row_stats(rms, saved, row, rows, mean, rstd);
}

// What the input gradient of one row needs, computed by its warp: the saved statistics and the
// row's means of dxhat (0 for rmsnorm) and of dxhat * xhat.
struct RowGrad {
  float mean, rstd, m_dxhat, m_dxhat_xhat;
};

template <class In>
__device__ RowGrad row_grad(bool rms, const In* xr, const float* w, const float* dyr, const float* saved, int64_t row, int64_t rows,
                            int64_t in, int lane) {
  RowGrad r;
  r.mean = rms ? 0.0f : saved[row];
  r.rstd = rms ? saved[row] : saved[rows + row];
  float s_dxhat = 0.0f, s_dxhat_xhat = 0.0f;
  for (int64_t c = lane; c < in; c += kWarp) {
    const float xhat = (load_value(xr[c]) - r.mean) * r.rstd, dxhat = dyr[c] * w[c];
    s_dxhat += dxhat;
    s_dxhat_xhat += dxhat * xhat;
  }
  r.m_dxhat = rms ? 0.0f : warp_sum(s_dxhat) / float(in);
  r.m_dxhat_xhat = warp_sum(s_dxhat_xhat) / float(in);
  return r;
}

template <class In>
__global__ void norm_input_grad_kernel(bool rms, const In* x, const float* w, const float* dy, const float* saved, float* dx,
                                       bool accumulate, int64_t rows, int64_t in) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const In* xr = x + row * in;
  const float* dyr = dy + row * in;
  const RowGrad r = row_grad(rms, xr, w, dyr, saved, row, rows, in, lane);
  float* dxr = dx + row * in;
  for (int64_t c = lane; c < in; c += kWarp) {
    const float xhat = (load_value(xr[c]) - r.mean) * r.rstd;
    const float g = norm_dx(dyr[c] * w[c], xhat, r.m_dxhat, r.m_dxhat_xhat, r.rstd);
    dxr[c] = accumulate ? dxr[c] + g : g;
  }
}

// dw[c] += sum_r dy[r, c] xhat[r, c]; db[c] += sum_r dy[r, c], in two stages.
//
// Stage 1: block (chunk, column tile) sums the rows [chunk * kChunkRows, + kChunkRows) in row
// order, one thread per column (a warp reads 32 consecutive columns of a row), into
// partials[chunk * width + c] (dw's terms) and partials[chunk * width + in + c] (db's; width is in
// or 2 in). With a single chunk (partials null) it adds straight into dw and db instead: the sum
// over the rows in order, as one pass.
constexpr int64_t kChunkRows = 256;

template <class In>
__global__ void norm_param_chunk_kernel(bool rms, const In* x, const float* dy, const float* saved, int64_t rows, int64_t in,
                                        float* partials, int64_t width, float* dw, float* db) {
  const int64_t chunk = blockIdx.x, lo = chunk * kChunkRows;
  const int64_t hi = rows - lo < kChunkRows ? rows : lo + kChunkRows;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < in; c += int64_t(gridDim.y) * blockDim.x) {
    float sw = 0.0f, sb = 0.0f;
#pragma unroll 4
    for (int64_t r = lo; r < hi; ++r) {
      const float mean = rms ? 0.0f : saved[r];
      const float rstd = rms ? saved[r] : saved[rows + r];
      const float g = dy[r * in + c];
      sw += g * (load_value(x[r * in + c]) - mean) * rstd;
      sb += g;
    }
    if (partials != nullptr) {
      float* p = partials + chunk * width;
      p[c] = sw;
      if (db != nullptr) p[in + c] = sb;
    } else {
      dw[c] += sw;
      if (db != nullptr) db[c] += sb;
    }
  }
}

// The one-pass backward (rows of at most kFusedCols): block b's warp w takes rows
// [(b * kRowsPerBlock + w) * kFusedRows, + kFusedRows) in order; for each it computes the row's
// means, writes dx, and adds dy xhat (dw's term) and dy (db's) for its lane's columns c = lane +
// 32 j into registers; then writes them as partial row (b * kRowsPerBlock + w) of `partials`
// (dw's terms at [0, in), db's at [in, 2 in) where width is 2 in).
constexpr int kFusedRows = 32;
constexpr int64_t kFusedCols = 1024;
constexpr int kFusedPerLane = int(kFusedCols / kWarp);

template <class In>
__global__ void norm_backward_fused_kernel(bool rms, const In* x, const float* w, const float* dy, const float* saved, float* dx,
                                           bool accumulate, int64_t rows, int64_t in, float* partials, int64_t width, bool with_db) {
  const int64_t part = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  float sw[kFusedPerLane], sb[kFusedPerLane];
  for (int j = 0; j < kFusedPerLane; ++j) sw[j] = sb[j] = 0.0f;
  const int64_t lo = part * kFusedRows, hi = rows - lo < kFusedRows ? rows : lo + kFusedRows;
  for (int64_t row = lo; row < hi; ++row) {
    const In* xr = x + row * in;
    const float* dyr = dy + row * in;
    const RowGrad r = row_grad(rms, xr, w, dyr, saved, row, rows, in, lane);
    float* dxr = dx + row * in;
    int j = 0;
    for (int64_t c = lane; c < in; c += kWarp, ++j) {
      const float xhat = (load_value(xr[c]) - r.mean) * r.rstd, g = dyr[c];
      const float d = norm_dx(g * w[c], xhat, r.m_dxhat, r.m_dxhat_xhat, r.rstd);
      dxr[c] = accumulate ? dxr[c] + d : d;
      sw[j] += g * xhat;
      sb[j] += g;
    }
  }
  if (lo >= rows) return;
  float* p = partials + part * width;
  int j = 0;
  for (int64_t c = lane; c < in; c += kWarp, ++j) {
    p[c] = sw[j];
    if (with_db) p[in + c] = sb[j];
  }
}

// Stage 2: block (kSumCols columns, kSumLanes lanes) over `width` partial columns; lane l sums the
// chunks [l * per, (l + 1) * per) in chunk order, then lane 0 adds the lanes' sums in lane order
// (so the chunks in order, grouped) and adds the total into dw (column j < in) or db (j - in).
constexpr int kSumCols = 32, kSumLanes = 32;

__global__ void sum_chunk_partials_kernel(const float* partials, int64_t chunks, int64_t width, int64_t in, float* dw, float* db) {
  __shared__ float lane_sums[kSumLanes][kSumCols];
  const int64_t j = int64_t(blockIdx.x) * kSumCols + threadIdx.x;
  const int64_t per = (chunks + kSumLanes - 1) / kSumLanes;
  const int64_t k0 = int64_t(threadIdx.y) * per;
  const int64_t k1 = chunks - k0 < per ? chunks : k0 + per;
  float s = 0.0f;
  if (j < width) {
    for (int64_t k = k0; k < k1; ++k) s += partials[k * width + j];
  }
  lane_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < width) {
    float total = lane_sums[0][threadIdx.x];
    for (int l = 1; l < kSumLanes; ++l) total += lane_sums[l][threadIdx.x];
    if (j < in) {
      dw[j] += total;
    } else {
      db[j - in] += total;
    }
  }
}

// The partials of the parameter gradients, grown on the stream and kept (cuda::StreamScratch).
struct PartialsScratch {
  std::mutex mu;
  cuda::StreamScratch partials;
};

PartialsScratch& partials_scratch() {
  static PartialsScratch s;  // freed by the driver at exit
  return s;
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

namespace {

template <class In, class Out>
void norm_forward(bool rms, const In* x, const float* w, const float* b, Out* y, float* saved, int64_t rows, int64_t in, float eps,
                  cudaStream_t stream) {
  if (rows == 0) return;
  if (in <= int64_t(kWarp) * kPerLane) {
    norm_forward_resident_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(rms, x, w, b, y, saved, rows, in, eps);
    return;
  }
  norm_forward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(rms, x, w, b, y, saved, rows, in, eps);
}

template <class In>
void norm_backward(bool rms, const In* x, const float* w, const float* dy, const float* saved, float* dx, bool accumulate, float* dw,
                   float* db, int64_t rows, int64_t in, cudaStream_t stream) {
  if (rows == 0 || in == 0) return;
  // The parameter gradients read dy after the input gradient is written: dx may not overlap it.
  const std::size_t bytes = std::size_t(rows * in) * sizeof(float);
  const auto* dx_lo = reinterpret_cast<const char*>(dx);
  const auto* dy_lo = reinterpret_cast<const char*>(dy);
  if (dx != nullptr && dx_lo < dy_lo + bytes && dy_lo < dx_lo + bytes) {
    throw_runtime_error("cuda_layers norm backward", "d_x overlaps d_y: the parameter gradients read d_y after d_x is written");
  }
  if (dx != nullptr && dw != nullptr && in <= kFusedCols) {
    // One pass over x and dy: the input gradient and a partial per warp of kFusedRows rows, then
    // the partials summed in order.
    const int64_t parts = (rows + kFusedRows - 1) / kFusedRows;
    const int64_t width = db != nullptr ? 2 * in : in;
    PartialsScratch& scratch = partials_scratch();
    std::lock_guard<std::mutex> lock(scratch.mu);  // the buffer is not regrown under the two launches
    auto* partials = static_cast<float*>(scratch.partials.get(std::size_t(parts * width) * sizeof(float), stream));
    const unsigned blocks = unsigned((parts + kRowsPerBlock - 1) / kRowsPerBlock);
    norm_backward_fused_kernel<<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(rms, x, w, dy, saved, dx, accumulate, rows, in, partials,
                                                                             width, db != nullptr);
    sum_chunk_partials_kernel<<<unsigned((width + kSumCols - 1) / kSumCols), dim3(kSumCols, kSumLanes), 0, stream>>>(
        partials, parts, width, in, dw, db);
    return;
  }
  if (dx != nullptr) {
    norm_input_grad_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(rms, x, w, dy, saved, dx, accumulate, rows, in);
  }
  if (dw == nullptr) return;  // frozen parameters: the input gradient is all
  // Stage 1: (chunks, column tiles) blocks of up to 256 threads, one a column.
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  if (chunks > INT32_MAX) throw_runtime_error("cuda_layers", "too many rows for the norm's parameter gradients");
  const unsigned threads = in >= 256 ? 256u : unsigned((in + 31) / 32 * 32);
  const int64_t tiles = (in + threads - 1) / threads;
  const dim3 grid(unsigned(chunks), unsigned(tiles < 65535 ? tiles : 65535));
  if (chunks == 1) {
    norm_param_chunk_kernel<<<grid, threads, 0, stream>>>(rms, x, dy, saved, rows, in, nullptr, 0, dw, db);
    return;
  }
  const int64_t width = db != nullptr ? 2 * in : in;
  PartialsScratch& scratch = partials_scratch();
  std::lock_guard<std::mutex> lock(scratch.mu);  // the buffer is not regrown under the two launches
  auto* partials = static_cast<float*>(scratch.partials.get(std::size_t(chunks * width) * sizeof(float), stream));
  norm_param_chunk_kernel<<<grid, threads, 0, stream>>>(rms, x, dy, saved, rows, in, partials, width, dw, db);
  // Stage 2: a block of kSumCols x kSumLanes threads per kSumCols partial columns.
  sum_chunk_partials_kernel<<<unsigned((width + kSumCols - 1) / kSumCols), dim3(kSumCols, kSumLanes), 0, stream>>>(partials, chunks,
                                                                                                                   width, in, dw, db);
}

}  // namespace

void launch_norm_forward(bool rms, const float* x, const float* w, const float* b, float* y, float* saved, int64_t rows, int64_t in,
                         float eps, cudaStream_t stream) {
  norm_forward(rms, x, w, b, y, saved, rows, in, eps, stream);
}

void launch_norm_forward(bool rms, const float* x, const float* w, const float* b, uint16_t* y, float* saved, int64_t rows, int64_t in,
                         float eps, cudaStream_t stream) {
  norm_forward(rms, x, w, b, y, saved, rows, in, eps, stream);
}

void launch_norm_forward(bool rms, const uint16_t* x, const float* w, const float* b, uint16_t* y, float* saved, int64_t rows,
                         int64_t in, float eps, cudaStream_t stream) {
  norm_forward(rms, x, w, b, y, saved, rows, in, eps, stream);
}

void launch_norm_backward(bool rms, const float* x, const float* w, const float* dy, const float* saved, float* dx, bool accumulate,
                          float* dw, float* db, int64_t rows, int64_t in, cudaStream_t stream) {
  norm_backward(rms, x, w, dy, saved, dx, accumulate, dw, db, rows, in, stream);
}

void launch_norm_backward(bool rms, const uint16_t* x, const float* w, const float* dy, const float* saved, float* dx, bool accumulate,
                          float* dw, float* db, int64_t rows, int64_t in, cudaStream_t stream) {
  norm_backward(rms, x, w, dy, saved, dx, accumulate, dw, db, rows, in, stream);
}

}  // namespace ablate::cuda_layers
