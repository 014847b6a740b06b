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
//                 history's max (or most recent value): fp8_max / (amax * 2^margin);
//   slots         delayed scaling's state at a call site (run.fp8_scaling = "delayed"): one slot per
//                 operand of each product, its scale from the history of earlier steps (or, before
//                 there is one, from the operand's own amax), the amax of each use recorded in the
//                 quantising pass, pushed into the history once per step.
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
// *amax (may be null) = max(*amax, max |x|), taken in the same pass; the count of saturated values
// added to *saturated (may be null) as a float.
void launch_fp8_pack(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, bool transposed, const float* scale,
                     Fp8Format format, uint8_t* y, int64_t y_ld, float* saturated, float* amax, cudaStream_t stream);

// A delayed-scaling slot, kFp8SlotHeader floats then `history` amax values (a ring):
//   [0] the amax of this step's uses so far    [1] the scale (0: none yet)    [2] 1 / scale
//   [3] the format's largest value (set at each use; 0: never used)    [4] updates so far
//   [5] values saturated in this step's uses so far    [6] values saturated in the step before
// (the rest of the header zero). Zeros are a fresh slot.
inline constexpr int64_t kFp8SlotHeader = 8;
inline int64_t fp8_slot_floats(int64_t history) { return kFp8SlotHeader + history; }

// *amax = max(*amax, max |x|) as launch_fp8_amax_2d, only where the slot has no scale yet (a fresh
// slot scales as current scaling does); else nothing is read.
void launch_fp8_slot_amax(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* slot, float* amax,
                          cudaStream_t stream);
// One use's scale: the slot's, or where it has none fp8_max / *amax (1 for an amax of zero, NaN or
// inf), into *scale and *scale_inv; slot[3] = fp8_max; *amax = 0 afterwards. One thread.
void launch_fp8_slot_scale(float* slot, float fp8_max, float* amax, float* scale, float* scale_inv, cudaStream_t stream);
// The end of a step for `slots` consecutive slots of `history` values each: every used slot's amax
// [0] pushed into its ring at updates % history, updates + 1, [0] = 0, [6] = [5], [5] = 0; then from the history's max
// (over the values pushed so far, passing over NaNs: use_max) or the value just pushed, when finite
// and positive: scale = fp8_max / amax and its inverse (else they are kept).
void launch_fp8_update_slots(float* slots, int64_t count, int64_t history, bool use_max, cudaStream_t stream);

// For each tensor t < tensors: history[t * length + step % length] = amax[t], amax[t] = 0; the
// reduced amax a = max over the history, passing over NaNs (use_max), or amax[t] itself (the most
// recent); when a is
// finite and positive, scale[t] = fp8_max / (a * 2^margin), else scale[t] is left as it is;
// scale_inv[t] = 1 / scale[t]. One thread a tensor.
void launch_fp8_update_scales(float* amax, float* history, int64_t tensors, int64_t length, int64_t step, bool use_max, float fp8_max,
                              int margin, float* scale, float* scale_inv, cudaStream_t stream);

}  // namespace ablate::cuda_layers
