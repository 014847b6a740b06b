// FP8 per-tensor scaling for FP8 products (fp8_kernels.cu; the formats as the OCP FP8 specification
// and CUDA's cuda_fp8.h define them: E4M3 up to 448, E5M2 up to 57344, rounding to nearest even):
//   amax          the largest |x| of a tensor, max-ed into a float in device memory;
//   quantise      y = fp8(x * scale), the scale read on the device (delayed scaling: the one the
//                 amax history gave; current scaling: this tensor's, after its amax), saturating to
//                 the format's largest finite value and counting the values that did, with the
//                 tensor's amax taken in the same pass;
//   quantise^T    the same into the transposed layout (cuBLASLt's FP8 products on SM 9.0 read A
//                 transposed), through shared-memory tiles;
//   pack          an FP8 product's operand: x (f32 or bf16, any leading dimension) quantised into
//                 the K-contiguous layout cuBLASLt's FP8 products read, transposed or not, its
//                 rows padded with zeros to a leading dimension of 16 (zeros add nothing to the
//                 product, and every FP8 operand's leading dimension must be a multiple of 16 bytes);
//   update        each tensor's amax pushed into its history, and its scale and inverse from the
//                 history's max (or most recent value): fp8_max / (amax * 2^margin).
// Every launcher enqueues on `stream` and does nothing for an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::cuda_layers {

enum class Fp8Format : int { e4m3 = 0, e5m2 = 1 };
inline constexpr float kFp8Max[2] = {448.0f, 57344.0f};

// *amax = max(*amax, max_i |x[i]|); a NaN in x makes it NaN. x f32, or bf16 as its 16 bits.
void launch_fp8_amax(const float* x, int64_t n, float* amax, cudaStream_t stream);
void launch_fp8_amax_bf16(const uint16_t* x, int64_t n, float* amax, cudaStream_t stream);

// y[i] = fp8(x[i] * *scale) saturated; *saturated += how many |x[i] * *scale| exceeded the format's
// largest finite value; *amax = max(*amax, |x[i]|). amax and saturated may be null.
void launch_fp8_quantize(const float* x, int64_t n, const float* scale, Fp8Format format, uint8_t* y, float* amax, unsigned* saturated,
                         cudaStream_t stream);

// x (rows x cols, row order) -> y (cols x rows, row order): y[c * rows + r] = fp8(x[r * cols + c] * *scale),
// with amax and saturated as above.
void launch_fp8_quantize_transposed(const float* x, int64_t rows, int64_t cols, const float* scale, Fp8Format format, uint8_t* y,
                                    float* amax, unsigned* saturated, cudaStream_t stream);

// *amax = max(*amax, max |x|) over x (rows x cols, leading dimension ld; f32, or bf16 as its 16 bits).
void launch_fp8_amax_2d(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, float* amax, cudaStream_t stream);

// From x (rows x cols, leading dimension ld; f32, or bf16 as its 16 bits), saturating as above and
// counting into *saturated (may be null):
//   not transposed: y (rows x y_ld), y[r * y_ld + c] = fp8(x[r * ld + c] * *scale), zero for c >= cols;
//   transposed:     y (cols x y_ld), y[c * y_ld + r] = fp8(x[r * ld + c] * *scale), zero for r >= rows.
void launch_fp8_pack(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, bool transposed, const float* scale,
                     Fp8Format format, uint8_t* y, int64_t y_ld, unsigned* saturated, cudaStream_t stream);

// For each tensor t < tensors: history[t * length + step % length] = amax[t], amax[t] = 0; the
// reduced amax a = max over the history, passing over NaNs (use_max), or amax[t] itself (the most
// recent); when a is
// finite and positive, scale[t] = fp8_max / (a * 2^margin), else scale[t] is left as it is;
// scale_inv[t] = 1 / scale[t]. One thread a tensor.
void launch_fp8_update_scales(float* amax, float* history, int64_t tensors, int64_t length, int64_t step, bool use_max, float fp8_max,
                              int margin, float* scale, float* scale_inv, cudaStream_t stream);

}  // namespace ablate::cuda_layers
