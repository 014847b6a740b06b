// FP8 per-tensor scaling for FP8 products (fp8_kernels.cu; the formats as the OCP FP8 specification
// and CUDA's cuda_fp8.h define them: E4M3 up to 448, E5M2 up to 57344, rounding to nearest even,
// saturating to the largest finite value):
//   slots   the scaling state of one operand of one product: the scale it is quantised with, from
//           the amax history of earlier steps (delayed scaling) or, where the slot has none (a
//           fresh slot, or current scaling's, which never gets one), from the operand's own amax;
//           the amax of each use and its saturated values recorded in the quantising pass, pushed
//           into the history once per step;
//   pack    an FP8 product's operand: x (f32 or bf16, any leading dimension) quantised into the
//           K-contiguous layout cuBLASLt's FP8 products read, transposed (through shared-memory
//           tiles) or not, its rows padded with zeros to a leading dimension of 16 (zeros add
//           nothing to the product, and every FP8 operand's leading dimension must be a multiple
//           of 16 bytes).
//   sums    (optional, in the same pass) the column sums of x as read (its f32 or bf16 values, in
//           f32): each 32-row tile's sums into `partials`, then one small pass adds their sums over
//           the tiles, in tile order, to `sums`; the same bits whichever layout is packed, run to
//           run (the bias gradient of a product whose output gradient x is: the pass that
//           quantises it reads it once for both).
// Every launcher enqueues on `stream` and does nothing for an empty tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::cuda_layers {

enum class Fp8Format : int { e4m3 = 0, e5m2 = 1 };
inline constexpr float kFp8Max[2] = {448.0f, 57344.0f};

// Column sums taken in a pack: sums (cols) += the column sums of x, through partials
// (fp8_column_partials(rows, cols) floats of scratch); none when sums is null.
struct Fp8ColumnSums {
  float* sums = nullptr;
  float* partials = nullptr;
};
inline constexpr int64_t kFp8SumRows = 32;  // rows of x summed into one partial
inline int64_t fp8_column_partials(int64_t rows, int64_t cols) { return (rows + kFp8SumRows - 1) / kFp8SumRows * cols; }

// From x (rows x cols, leading dimension ld; f32, or bf16 as its 16 bits), y = fp8(x * *scale):
//   not transposed: y (rows x y_ld), y[r * y_ld + c] = fp8(x[r * ld + c] * *scale), zero for c >= cols;
//   transposed:     y (cols x y_ld), y[c * y_ld + r] = fp8(x[r * ld + c] * *scale), zero for r >= rows.
// *amax (may be null) = max(*amax, max |x|), taken in the same pass; the count of saturated values
// added to *saturated (may be null) as a float.
void launch_fp8_pack(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, bool transposed, const float* scale,
                     Fp8Format format, uint8_t* y, int64_t y_ld, float* saturated, float* amax, cudaStream_t stream,
                     Fp8ColumnSums sums = {});
// Both layouts from one read of x, as two launch_fp8_pack calls with the same scale write them:
// `plain` (rows x plain_ld, plain_ld >= cols) and `transposed` (cols x t_ld, t_ld >= rows); the amax
// and the saturated values of x taken once (an operand two products read, one along each of its
// dimensions: an output gradient under current scaling).
void launch_fp8_pack_both(const void* x, bool bf16, int64_t rows, int64_t cols, int64_t ld, const float* scale, Fp8Format format,
                          uint8_t* plain, int64_t plain_ld, uint8_t* transposed, int64_t t_ld, float* saturated, float* amax,
                          cudaStream_t stream, Fp8ColumnSums sums = {});

// sums (cols) += the sums over x's 32-row tiles of partials (fp8_column_partials(rows, cols)), in
// tile order: the second pass of the column sums a pack (or another tiled kernel) takes.
void launch_fp8_add_column_partials(const float* partials, int64_t rows, int64_t cols, float* sums, cudaStream_t stream);

// A slot, kFp8SlotHeader floats then `history` amax values (a ring; none for current scaling):
//   [0] the amax of this step's uses so far    [1] the scale (0: none yet)    [2] 1 / scale
//   [3] the format's largest value (set at each use; 0: never used)    [4] updates so far
//   [5] values saturated in this step's uses so far    [6] values saturated in the step before
// (the rest of the header zero). Zeros are a fresh slot.
inline constexpr int64_t kFp8SlotHeader = 8;
inline int64_t fp8_slot_floats(int64_t history) { return kFp8SlotHeader + history; }

// *amax = max(*amax, max |x|) (a NaN in x makes it NaN) over x (rows x cols, leading dimension ld;
// f32, or bf16 as its 16 bits), only where the slot has no scale ([1] = 0); else nothing is read.
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

}  // namespace ablate::cuda_layers
