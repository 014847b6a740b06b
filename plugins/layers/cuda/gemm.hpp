// Matrix products of the CUDA layers through cuBLASLt, in the row-major terms the layers think in:
//   D(M, N) = alpha op(A) op(B) + beta C (+ bias broadcast over rows),  op(X) = X or X^T
// with A (M, K) or, transposed, (K, M) in memory; B (K, N) or (N, K); C and D (M, N), C may be D.
// cuBLASLt is column-major: a row-major X is the column-major X^T, so the product is computed as
// D^T = op(B)^T op(A)^T, with the operands swapped (gemm.cpp).
//
// f32 runs with CUBLAS_COMPUTE_32F (true fp32, no TF32): the f32 path on cuda is the one that must
// agree closely with the CPU. With tf32 set (run.dtype = "tf32") the inputs are rounded to TF32
// (10-bit mantissa) inside the tensor cores and accumulated in fp32: several times faster, with
// relative errors near 1e-3 per product. With bf16 (run.dtype = "bf16") A and B are rounded to bf16
// (8-bit mantissa) into packed workspaces on the stream, multiplied on bf16 tensor cores and
// accumulated in fp32 into the f32 C/D: twice TF32's rate, relative errors near 1e-2 per product;
// weights, gradients and optimizer state stay f32. An operand given in bf16 is read as it is: a
// weight from the model's bf16 copy of the parameters (made once per optimizer step), an activation
// the model holds in bf16 (a norm's output, the MLP's hidden activation: Operand::bf16); any other
// is rounded into a packed copy first. Rounding is the same (bf16_bits) either way, so holding an
// operand in bf16 changes no bit of the product. One descriptor set and one algorithm from the heuristic are kept per
// distinct problem (transposes, sizes, strides, epilogue, dtype), so a training step after the
// first builds nothing. A 32 MiB workspace (the size NVIDIA recommends for Hopper) is allocated
// once per process, on first use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace ablate::cuda_layers {

// How the products compute: true fp32, fp32 values on TF32 tensor cores, bf16 operands with fp32
// accumulation, or FP8 operands with fp32 accumulation (run.dtype "fp32", "tf32", "bf16", "fp8",
// "fp8_e4m3"). The FP8 modes hold what bf16 holds (activations, weight copies, bf16 outputs) and
// quantise each product's operands just before it, per tensor: current scaling (each operand's
// scale fp8_max / amax of the operand itself) or delayed scaling (the scale from the amax history
// in the call's Fp8Slots), the inverse handed to cuBLASLt; E4M3 for weights and
// activations; a gradient operand (dy) in E5M2 under "fp8" (the hybrid recipe), E4M3 under
// "fp8_e4m3". FP8 products writing a bf16 output fuse the forward epilogues (a bf16 bias, the GELU
// with its saved input); the bias gradients are taken in the pass that quantises the output
// gradient (GemmCall::a_column_sums); the GELU's gradient and the epilogues of an f32 output run in
// passes of their own after the product (or, for a bf16 output, by the caller's fallback), and so
// does an epilogue cuBLASLt has no FP8 algorithm for (said once per problem). A call
// whose layout an FP8 product cannot take (an output's leading dimension not a multiple of 16
// bytes, an output not 16-byte aligned) runs as a bf16 product.
enum class MatmulMode : uint8_t { f32, tf32, bf16, fp8, fp8_e4m3 };
MatmulMode matmul_mode(const std::string& dtype);
const char* to_string(MatmulMode mode);
// bf16 and the FP8 modes: what the model holds in bf16 and the products read in bf16 alike.
inline bool bf16_family(MatmulMode m) { return m == MatmulMode::bf16 || m == MatmulMode::fp8 || m == MatmulMode::fp8_e4m3; }
inline bool fp8_mode(MatmulMode m) { return m == MatmulMode::fp8 || m == MatmulMode::fp8_e4m3; }

// A matrix operand as the products read it: f32 values, or bf16 ones (bf16 products only), or both
// (a weight: its f32 values and the model's bf16 copy of them, which bf16 products read in place of
// a copy). A layer input held in bf16 has no f32 values.
struct Operand {
  const float* f32 = nullptr;
  const void* bf16 = nullptr;  // null: none (f32 and tf32 runs, or a model without a copy)
  Operand() = default;
  Operand(const float* values) : f32(values) {}  // NOLINT: f32 values alone convert implicitly
  Operand(const float* values, const void* bf16_values) : f32(values), bf16(bf16_values) {}
  // The operand `elements` values further on.
  Operand at(int64_t elements) const {
    return {f32 != nullptr ? f32 + elements : nullptr, bf16 != nullptr ? static_cast<const uint16_t*>(bf16) + elements : nullptr};
  }
};
using Weight = Operand;

// FP8 delayed scaling (run.fp8_scaling = "delayed"): the slots of one product's A and B at a call
// site (fp8_kernels.hpp: the scale from the amax history, the amax of this use recorded); null:
// current scaling, each operand scaled by its own amax.
struct Fp8Slots {
  float* a = nullptr;
  float* b = nullptr;
  // Current scaling (no slot): the layer's input read again as the call before this one read it,
  // unchanged since (LayerCall::x_unchanged, or two products of one layer reading one x): a forward
  // product's A (a_as_before) found packed by the product just before, a weight-gradient product's
  // B (b_as_before: the input, transposed) found as the last weight-gradient product kept it, each
  // with its scale; where the stream's record of that pack does not match (another tensor, extent
  // or layout), quantised as usual.
  bool a_as_before = false;
  bool b_as_before = false;
  // Current scaling: B is a layer's weight whose FP8 copies, in both layouts (a forward product's
  // and an input gradient's), and their one scale live in `weight_pack` (fp8_weight_pack_bytes of
  // the weight's stored extent: a call site's LayerCall::weight_cache). The first product to read
  // the weight makes both; a later one reads them as they are while the record of what the memory
  // holds (which tensor, extent) agrees, else makes them again. The record does not see new values
  // in the same tensor: the layer forgets its packs when its weights change
  // (fp8_weight_packs_forget). Ignored under delayed scaling (a slot for B).
  void* weight_pack = nullptr;
};
// The bytes a weight of `rows` x `cols` (as stored) takes in a weight pack: its amax, scale and
// inverse, its FP8 copy (rows, K = cols padded to 16) and its transposed copy (cols, K = rows
// padded to 16), each part 256-byte aligned.
int64_t fp8_weight_pack_bytes(int64_t rows, int64_t cols);
// The weight packs in [memory, memory + bytes) hold nothing from now on: a layer calls it at the
// start of a call whose weights changed (LayerCall::weights_unchanged false), so that a product
// that does not run in FP8 this time (a layout FP8 cannot take, no rows) leaves no old copy for a
// later call to read.
void fp8_weight_packs_forget(const void* memory, int64_t bytes);
// How FP8 products' scales are set (run.fp8_scaling): history 0, current scaling; else delayed
// scaling over an amax history of that many steps, from its max (use_max) or its newest value.
struct Fp8Scaling {
  int64_t history = 0;
  bool use_max = true;
};

// What the product's epilogue does besides the optional bias (cuBLASLt's GELU epilogues use the
// tanh approximation, as dense_math.hpp's gelu_out does):
//   gelu_aux  D = gelu(product + bias), the pre-activation (product + bias) written to `aux`
//   dgelu     D = product * gelu'(aux), aux being the forward's pre-activation
enum class Activation : uint8_t { none, gelu_aux, dgelu };

struct GemmCall {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t lda = 0;
  const float* B = nullptr;
  int64_t ldb = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* C = nullptr;  // null: C is D (read only when beta != 0); of D's type (bf16 values when d_bf16)
  float* D = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;  // (N), added to every row of D (cuBLASLt's bias epilogue)
  MatmulMode mode = MatmulMode::f32;
  bool a_grad = false;           // A is a gradient (an output gradient dy): E5M2 under the hybrid FP8 recipe
  bool a_scale_reused = false;   // FP8 current scaling: A is the tensor the last FP8 product on the stream read
                                 // as its A, unchanged since (an output gradient read by two products): its
                                 // scale is used again, its amax not taken twice (ignored unless that last A
                                 // was this tensor, in this format)
  bool a_read_again = false;     // FP8 current scaling: the next FP8 product on the stream reads this A with
                                 // a_scale_reused, along its other dimension (the weight gradient's after the
                                 // input gradient's, or the reverse): A is quantised in both layouts at once,
                                 // and that product reads the other as it is (one read of A for both)
  Fp8Slots fp8;                  // FP8 products: delayed scaling's slots (none: current scaling)
  const void* A_bf16 = nullptr;  // bf16 mode: A already in bf16 (same layout and lda), read in place of a copy
  const void* B_bf16 = nullptr;  // bf16 mode: B likewise (A and B may then be null)
  Activation act = Activation::none;
  float* aux = nullptr;             // (M, N) with leading dimension ldc: gelu_aux writes it, dgelu reads it (bf16
                                    // values when d_bf16: cuBLASLt's GELU matrix has D's type)
  bool d_bf16 = false;              // bf16 mode: D holds bf16 values (ldc in bf16 elements), written rounded to
                                    // nearest even from the fp32 sums (plus beta C, C in bf16: a residual stream
                                    // held in bf16); of the epilogues only a bf16 bias and the GELU ones (the
                                    // classifier's logits; q, k, v; a GELU MLP's hidden activation and its
                                    // gradient; a projection's output added to the stream)
  const void* bias_bf16 = nullptr;  // d_bf16 only: a bias in bf16 (cuBLASLt's bias has D's type), added to the
                                    // fp32 sums before they are rounded
  float* d_column_sums = nullptr;   // dgelu: (N) += column sums of D (the bias gradient below a gelu)
  float* a_sums = nullptr;          // ta only: (M) += sums of A's rows over K (a weight-gradient product's
                                    // bias gradient, dy summed over the batch's rows); under FP8 products
                                    // taken as a_column_sums (gemm() moves it there)
  float* a_column_sums = nullptr;   // FP8 products: (A's columns as stored: M when ta, else K) += the column
                                    // sums of A as stored (its f32 or bf16 values, A packed: lda its width),
                                    // taken in the pass that quantises A (Fp8ColumnSums), or by a pass after
                                    // the product where A is not read (its pack shared or kept) or the call
                                    // runs as a bf16 product: an output gradient's bias gradient, taken by
                                    // whichever of its two products reads it first
  // Under bf16 a fused bias gradient sums the operand as the product reads it (rounded to bf16);
  // the fallback sums the f32 values.
};

// How cuBLASLt's epilogue serves a call: the fused epilogue's name ("DEFAULT", "BIAS",
// "GELU_AUX_BIAS", "DGELU_BGRAD", "BGRADB", ...), or "" when the call's layout rules it out (a
// GELU matrix's leading dimension must be a multiple of 8; the bias and the GELU matrix 16-byte
// aligned; GELU epilogues under tf32 and bf16 only, so true fp32 products keep dense_math.hpp's
// GELU) and gemm() does the epilogue's work in passes of its own after a plain product. A fused epilogue for which cuBLASLt finds no algorithm falls
// back in the same way (once per problem).
std::string fused_epilogue(const GemmCall& g);

// Why gemm() refuses a call ("" = served): a negative size, a missing operand, K = 0 (an empty
// sum), an epilogue without the matrix or layout it needs.
std::string gemm_refusal(const GemmCall& g);

// Enqueues the product on `stream`; errors name the call, the shape and cuBLASLt's message.
void gemm(const GemmCall& g, cudaStream_t stream);

// The three products of a dense layer, W (out, in) as PyTorch stores it:
//   y(rows, out)  = x(rows, in) W^T + bias + beta c    (c null: y itself)
void gemm_x_wt(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const float* bias, const float* c, float beta, float* y,
               cudaStream_t stream, MatmulMode mode, Fp8Slots slots = {});
//   y(rows, out)  = gelu(pre), pre = x W^T + bias written too (the first product of a GELU MLP)
void gemm_x_wt_gelu(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const float* bias, float* pre, float* y,
                    cudaStream_t stream, MatmulMode mode, Fp8Slots slots = {});
//   y(rows, out)  = x(rows, in) W^T in bf16 (bf16 products only: the fp32 sums rounded to nearest even)
void gemm_x_wt_bf16_out(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, uint16_t* y, cudaStream_t stream,
                        MatmulMode mode = MatmulMode::bf16, Fp8Slots slots = {});
//   y(rows, out)  = x W^T + bias in bf16, the bias (bf16) in the product's epilogue (bf16 products only):
//   false when cuBLASLt serves no such epilogue here (an unaligned bias, no algorithm), y then unwritten
bool gemm_x_wt_bias_bf16_out(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const void* bias_bf16, uint16_t* y,
                             cudaStream_t stream, MatmulMode mode = MatmulMode::bf16, Fp8Slots slots = {});
//   y(rows, out)  = residual + x W^T + bias, all three and y in bf16, from one product (the residual as
//   its C, beta 1; the bias, if any, in its epilogue; the fp32 sum rounded once; y may be the
//   residual) (bf16 products only): false when cuBLASLt serves no such epilogue here, y then unwritten
bool gemm_x_wt_residual_bf16(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const void* bias_bf16,
                             const uint16_t* residual, uint16_t* y, cudaStream_t stream, MatmulMode mode = MatmulMode::bf16,
                             Fp8Slots slots = {});
//   pre = x W^T + bias and post = gelu(pre), both (rows, out) in bf16, from one product with the GELU
//   (and the bf16 bias, if any) in its epilogue (bf16 products only): false when cuBLASLt serves no
//   such epilogue here, nothing written (the caller computes them another way)
bool gemm_x_wt_gelu_bf16(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const void* bias_bf16, uint16_t* pre,
                         uint16_t* post, cudaStream_t stream, MatmulMode mode = MatmulMode::bf16, Fp8Slots slots = {});
//   dpre(rows, in) = (dy W) * gelu'(pre) in bf16, pre in bf16; db(in) += its column sums (cuBLASLt sums
//   them in fp32 and writes them in bf16) when db is not null: false when not served, as above
bool gemm_dy_w_dgelu_bf16(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, const uint16_t* pre, uint16_t* dpre, float* db,
                          cudaStream_t stream, MatmulMode mode = MatmulMode::bf16, Fp8Slots slots = {});
//   dx(rows, in)  = dy(rows, out) W in bf16, written (bf16 products only: the fp32 sums rounded to
//   nearest even; the gradient of the attention output the model holds in bf16)
//   (`dy_read_again`, here and below: the next product on the stream reads dy too, with
//   dy_scale_reused, as GemmCall::a_read_again says)
//   (`dy_sums`, here and below: FP8 products only, db(out) += the column sums of dy, taken as
//   GemmCall::a_column_sums says: a layer's bias gradient where this product reads dy first)
//   (`dy_scale_reused`, here and below: the product before this one on the stream read dy too, as
//   GemmCall::a_scale_reused says)
void gemm_dy_w_bf16_out(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, uint16_t* dx, cudaStream_t stream,
                        MatmulMode mode = MatmulMode::bf16, Fp8Slots slots = {}, bool dy_read_again = false, float* dy_sums = nullptr,
                        bool dy_scale_reused = false);
//   dx(rows, in)  = dy(rows, out) W, written or (accumulate) added
void gemm_dy_w(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, bool accumulate, float* dx, cudaStream_t stream,
               MatmulMode mode, Fp8Slots slots = {}, bool dy_scale_reused = false, bool dy_read_again = false,
               float* dy_sums = nullptr);
//   dpre(rows, in) = (dy W) * gelu'(pre), written; db(in) += its column sums when db is not null
//   (the gradient below a GELU MLP's activation, and its first product's bias gradient)
void gemm_dy_w_dgelu(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, const float* pre, float* dpre, float* db,
                     cudaStream_t stream, MatmulMode mode, Fp8Slots slots = {});
//   dW(out, in)  += dy^T x; db(out) += column sums of dy when db is not null
void gemm_add_dyt_x(Operand dy, int64_t rows, int64_t in, int64_t out, Operand x, float* dW, float* db, cudaStream_t stream,
                    MatmulMode mode, Fp8Slots slots = {}, bool dy_scale_reused = false, bool dy_read_again = false);

// An f32 operand that several products of one layer call read (an output gradient dy: the input
// gradient's product and the weight gradient's), rounded to bf16 once under bf16 products instead
// of by each product: {x, its packed bf16 copy}; {x} in other modes (FP8 products quantise x itself). The copy is valid until the
// next call of this on the stream (products enqueued before then have read it by stream order).
Operand gemm_bf16_once(const float* x, int64_t rows, int64_t cols, cudaStream_t stream, MatmulMode mode);

// Device memory the products of a dense layer of `rows` x `in` -> `out` hold beyond their
// operands: cuBLASLt's workspace and, in bf16 mode, the packed copies of the largest A and B among
// the layer's three products (forward, input gradient, weight gradient) and the copy of an output
// gradient they share (gemm_bf16_once).
int64_t gemm_workspace_bytes(MatmulMode mode, int64_t rows, int64_t in, int64_t out);

// Descriptor sets built so far in this process (each distinct problem once).
int64_t gemm_plans_built();
// Problems whose fused epilogue cuBLASLt had no algorithm for (each logged once), done in passes.
int64_t gemm_unfused_problems();
// FP8 products whose A was quantised with the scale of the product before it (a_scale_reused).
int64_t gemm_fp8_scales_reused();
// FP8 products run with their epilogue fused (a forward one on a bf16 output).
int64_t gemm_fp8_epilogues_fused();
// FP8 products that read their A as the product before them packed it for them (a_read_again).
int64_t gemm_fp8_packs_shared();
// FP8 products that read a layer input as an earlier product packed it (a_as_before, b_as_before).
int64_t gemm_fp8_inputs_reused();
// FP8 products that read a weight's copy made by an earlier product (Fp8Slots::weight_pack).
int64_t gemm_fp8_weight_packs_reused();
// FP8 products whose A's column sums (GemmCall::a_column_sums: a bias gradient) were taken in the
// pass that quantised A, and those that took them by a pass of their own.
int64_t gemm_fp8_sums_in_pack();
int64_t gemm_fp8_sums_by_pass();

// The key a problem is cached under (exposed for tests: every field that changes the plan).
std::string gemm_key(const GemmCall& g);

}  // namespace ablate::cuda_layers
