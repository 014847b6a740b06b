// The norms on a CUDA device, f32 (see norm_math.hpp for the arithmetic). Forward and the input
// gradient: one warp per row, statistics by warp shuffles. Parameter gradients: one thread per
// column summing over the rows in order, so they are the same every run (no atomics).
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

__global__ void norm_forward_kernel(bool rms, const float* x, const float* w, const float* b, float* y, float* saved,
                                    int64_t rows, int64_t in, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* xr = x + row * in;
  float mean = 0.0f;
  if (!rms) {
    float s = 0.0f;
    for (int64_t c = lane; c < in; c += kWarp) s += xr[c];
    mean = warp_sum(s) / float(in);
  }
  float s2 = 0.0f;
  for (int64_t c = lane; c < in; c += kWarp) {
    const float d = xr[c] - mean;
    s2 += d * d;
  }
  const float rstd = norm_rstd(warp_sum(s2) / float(in), eps);
  float* yr = y + row * in;
  for (int64_t c = lane; c < in; c += kWarp) {
    yr[c] = rms ? rmsnorm_out(xr[c], rstd, w[c]) : layernorm_out(xr[c], mean, rstd, w[c], b != nullptr ? b[c] : 0.0f);
  }
  if (lane == 0) {
    if (rms) {
      saved[row] = rstd;
    } else {
      saved[row] = mean;
      saved[rows + row] = rstd;
    }
  }
}

__global__ void norm_input_grad_kernel(bool rms, const float* x, const float* w, const float* dy, const float* saved,
                                       float* dx, bool accumulate, int64_t rows, int64_t in) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float mean = rms ? 0.0f : saved[row];
  const float rstd = rms ? saved[row] : saved[rows + row];
  const float* xr = x + row * in;
  const float* dyr = dy + row * in;
  float s_dxhat = 0.0f, s_dxhat_xhat = 0.0f;
  for (int64_t c = lane; c < in; c += kWarp) {
    const float xhat = (xr[c] - mean) * rstd, dxhat = dyr[c] * w[c];
    s_dxhat += dxhat;
    s_dxhat_xhat += dxhat * xhat;
  }
  const float m_dxhat = rms ? 0.0f : warp_sum(s_dxhat) / float(in);
  const float m_dxhat_xhat = warp_sum(s_dxhat_xhat) / float(in);
  float* dxr = dx + row * in;
  for (int64_t c = lane; c < in; c += kWarp) {
    const float xhat = (xr[c] - mean) * rstd;
    const float g = norm_dx(dyr[c] * w[c], xhat, m_dxhat, m_dxhat_xhat, rstd);
    dxr[c] = accumulate ? dxr[c] + g : g;
  }
}

// dw[c] += sum_r dy[r, c] xhat[r, c]; db[c] += sum_r dy[r, c] (rows in order).
__global__ void norm_param_grad_kernel(bool rms, const float* x, const float* dy, const float* saved, float* dw, float* db,
                                       int64_t rows, int64_t in) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= in) return;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float mean = rms ? 0.0f : saved[r];
    const float rstd = rms ? saved[r] : saved[rows + r];
    const float g = dy[r * in + c];
    sw += g * (x[r * in + c] - mean) * rstd;
    sb += g;
  }
  dw[c] += sw;
  if (db != nullptr) db[c] += sb;
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void launch_norm_forward(bool rms, const float* x, const float* w, const float* b, float* y, float* saved, int64_t rows,
                         int64_t in, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  norm_forward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(rms, x, w, b, y, saved, rows, in, eps);
}

void launch_norm_backward(bool rms, const float* x, const float* w, const float* dy, const float* saved, float* dx,
                          bool accumulate, float* dw, float* db, int64_t rows, int64_t in, cudaStream_t stream) {
  if (rows == 0) return;
  if (dx != nullptr) {
    norm_input_grad_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(rms, x, w, dy, saved, dx, accumulate,
                                                                                  rows, in);
  }
  norm_param_grad_kernel<<<unsigned((in + 255) / 256), 256, 0, stream>>>(rms, x, dy, saved, dw, db, rows, in);
}

}  // namespace ablate::cuda_layers
