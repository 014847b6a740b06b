// Launchers of the norm kernels (norm_kernels.cu), f32 (the forward's y f32 or bf16), on the given
// stream, never synchronising.
// Shapes: x, y, dy, dx (rows, in); w, b, dw, db (in); saved: layernorm mean then rstd (2 * rows),
// rmsnorm rstd (rows). bias may be null; dx may be null (no input gradient); accumulate adds into dx.
// dw, db (db may be null) are always added into: column sums over the rows, deterministic (chunks
// of 256 rows summed in row order into partials, then the partials summed in chunk order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::cuda_layers {

void launch_norm_forward(bool rms, const float* x, const float* w, const float* b, float* y, float* saved, int64_t rows, int64_t in,
                         float eps, cudaStream_t stream);
// The same with y held in bf16 (each output rounded by device_math::bf16_bits): the norm's output
// only matrix products read (the statistics and the backward are the f32 ones); and with x and y
// in bf16 (the qk-norm of q and k held in bf16), whose backward reads x in bf16 too.
void launch_norm_forward(bool rms, const float* x, const float* w, const float* b, uint16_t* y, float* saved, int64_t rows, int64_t in,
                         float eps, cudaStream_t stream);
void launch_norm_forward(bool rms, const uint16_t* x, const float* w, const float* b, uint16_t* y, float* saved, int64_t rows,
                         int64_t in, float eps, cudaStream_t stream);
void launch_norm_backward(bool rms, const uint16_t* x, const float* w, const float* dy, const float* saved, float* dx, bool accumulate,
                          float* dw, float* db, int64_t rows, int64_t in, cudaStream_t stream);
void launch_norm_backward(bool rms, const float* x, const float* w, const float* dy, const float* saved, float* dx, bool accumulate,
                          float* dw, float* db, int64_t rows, int64_t in, cudaStream_t stream);

}  // namespace ablate::cuda_layers
