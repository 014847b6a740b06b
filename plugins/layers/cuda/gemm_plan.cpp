// The host side of the cuBLASLt products that needs no GPU (gemm_plan.hpp): modes, each call's
// epilogue and the key its plan is cached under. Tested without a GPU (tests/layers/test_gemm_plan.cpp).
#include "gemm_plan.hpp"

#include <string>

namespace ablate::cuda_layers {
namespace gemm_plan {

// The largest power of two (up to 256) that divides the address: cuBLASLt's heuristic is told each
// operand's alignment, so a pointer inside a buffer (a classifier chunk, an odd width) never gets a
// kernel that assumes more.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

inline bool aligned16(const void* p) { return p == nullptr || alignment_of(p) >= 16; }

bool bf16_in_place(const void* bf16, const float* f32, int64_t ld) {
  if (bf16 == nullptr) return false;
  return f32 == nullptr || (alignment_of(bf16) >= 16 && (ld * 2) % 16 == 0);
}

// cuBLASLt's epilogue for a call whose layout allows fusing it (fused_epilogue() says when).
cublasLtEpilogue_t epilogue_of(const GemmCall& g) {
  const bool bias = g.bias != nullptr || g.bias_bf16 != nullptr;
  switch (g.act) {
    case Activation::gelu_aux: return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Activation::dgelu: return g.d_column_sums != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    case Activation::none: break;
  }
  // cuBLASLt's B is our A: the sums of our A over K are its BGRADB.
  if (g.a_sums != nullptr) return CUBLASLT_EPILOGUE_BGRADB;
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// Elements of the bias-gradient vector a fused epilogue writes (0: none).
int64_t bias_grad_elements(const GemmCall& g) {
  if (g.act == Activation::dgelu && g.d_column_sums != nullptr) return g.N;
  if (g.act == Activation::none && g.a_sums != nullptr) return g.M;
  return 0;
}

}  // namespace gemm_plan

using gemm_plan::aligned16;
using gemm_plan::alignment_of;
using gemm_plan::epilogue_of;

MatmulMode matmul_mode(const std::string& dtype) {
  if (dtype == "tf32") return MatmulMode::tf32;
  if (dtype == "bf16") return MatmulMode::bf16;
  if (dtype == "fp8") return MatmulMode::fp8;
  if (dtype == "fp8_e4m3") return MatmulMode::fp8_e4m3;
  return MatmulMode::f32;
}

const char* to_string(MatmulMode mode) {
  switch (mode) {
    case MatmulMode::tf32: return "tf32";
    case MatmulMode::bf16: return "bf16";
    case MatmulMode::fp8: return "fp8";
    case MatmulMode::fp8_e4m3: return "fp8_e4m3";
    case MatmulMode::f32: break;
  }
  return "f32";
}

std::string gemm_key(const GemmCall& g) {
  // The C operand's layout equals D's; whether C is D changes nothing in the plan. The heuristic is
  // told each operand's alignment, so the key holds them (bf16 operands not given in bf16 are packed
  // copies, always 256-byte aligned, with their own leading dimensions).
  const bool bf16 = bf16_family(g.mode);
  const bool a_copied = bf16 && !gemm_plan::bf16_in_place(g.A_bf16, g.A, g.lda);
  const bool b_copied = bf16 && !gemm_plan::bf16_in_place(g.B_bf16, g.B, g.ldb);
  const auto al = [](const void* p) { return std::to_string(alignment_of(p)); };
  const std::string lda = std::to_string(a_copied ? (g.ta ? g.M : g.K) : g.lda);
  const std::string ldb = std::to_string(b_copied ? (g.tb ? g.K : g.N) : g.ldb);
  const std::string epi = fused_epilogue(g);
  return std::string(g.ta ? "T" : "N") + (g.tb ? "T" : "N") + " " + std::to_string(g.M) + "," + std::to_string(g.N) + "," +
         std::to_string(g.K) + " ld " + lda + "," + ldb + "," + std::to_string(g.ldc) + " " +
         (epi.empty() ? std::string("unfused") : epi) + " " + to_string(g.mode) + " align " +
         (a_copied ? "256" : al(bf16 ? g.A_bf16 : g.A)) + "," + (b_copied ? "256" : al(bf16 ? g.B_bf16 : g.B)) + "," + al(g.D) + "," +
         al(g.C != nullptr ? g.C : g.D) + (g.bias != nullptr ? "," + al(g.bias) : "") +
         (g.bias_bf16 != nullptr ? ",bf16 bias " + al(g.bias_bf16) : "") + (g.act != Activation::none ? "," + al(g.aux) : "") +
         (g.d_bf16 ? " out bf16" : "") + (fp8_mode(g.mode) && g.a_grad ? " A gradient" : "");
}

std::string gemm_refusal(const GemmCall& g) {
  const bool bf16 = bf16_family(g.mode);
  const bool has_a = g.A != nullptr || (bf16 && g.A_bf16 != nullptr), has_b = g.B != nullptr || (bf16 && g.B_bf16 != nullptr);
  if (!bf16 && ((g.A == nullptr && g.A_bf16 != nullptr) || (g.B == nullptr && g.B_bf16 != nullptr))) {
    return "an operand held in bf16 only is read by bf16 products only";
  }
  if (g.M < 0 || g.N < 0 || g.K < 0 || g.D == nullptr || (g.K > 0 && (!has_a || !has_b))) {
    return "invalid problem (negative size or missing operand)";
  }
  if (g.a_sums != nullptr && g.A == nullptr && !(bf16 && g.A_bf16 != nullptr)) {
    return "sums of A need A's values (f32, or bf16 under bf16 products)";
  }
  if (g.K == 0 && g.M > 0 && g.N > 0) return "a product over K = 0 (an empty sum) is not served";
  if (g.act != Activation::none && g.aux == nullptr) return "a GELU epilogue needs its pre-activation matrix (aux)";
  if (g.d_column_sums != nullptr && g.act != Activation::dgelu) return "column sums of D are served under dgelu only";
  if (g.bias != nullptr && (g.act == Activation::dgelu || g.a_sums != nullptr)) {
    return "a bias is added to forward products only (not with dgelu or a bias gradient)";
  }
  if (g.bias != nullptr && g.ldc != g.N) return "a bias needs D packed (ldc == N)";
  if (g.a_sums != nullptr && (!g.ta || g.act != Activation::none)) {
    return "sums of A are served for a transposed A without an activation only (a weight-gradient product)";
  }
  if (g.d_bf16 && (!bf16 || g.bias != nullptr || g.a_sums != nullptr || (g.beta != 0.0f && g.act != Activation::none))) {
    return "a bf16 D is written by bf16 products with, of the epilogues, a bf16 bias or a GELU one only (and no C with a GELU)";
  }
  if (g.a_column_sums != nullptr &&
      (g.act != Activation::none || g.bias != nullptr || g.bias_bf16 != nullptr || g.a_sums != nullptr)) {
    return "column sums of A are taken beside no epilogue";
  }
  if (g.a_column_sums != nullptr && g.lda != (g.ta ? g.M : g.K)) return "column sums of A need A packed (lda its width)";
  if (g.a_column_sums != nullptr && g.A == nullptr && !(bf16 && g.A_bf16 != nullptr)) {
    return "column sums of A need A's values (f32, or bf16 under bf16 products)";
  }
  if (g.bias_bf16 != nullptr && !g.d_bf16) return "a bf16 bias is added to a bf16 D only";
  if (g.bias_bf16 != nullptr && g.ldc != g.N) return "a bias needs D packed (ldc == N)";
  return "";
}

std::string fused_epilogue(const GemmCall& g) {
  // A GELU matrix's leading dimension (cuBLASLt: a multiple of 8 elements) and 16-byte aligned
  // bias and GELU matrix (a fused bias gradient goes to 256-byte aligned scratch first).
  if (g.act != Activation::none && (g.ldc % 8 != 0 || !aligned16(g.aux))) return "";
  // True fp32 products keep the GELU and its gradient in dense_math.hpp's arithmetic (the f32
  // path is the one held within fp32 rounding of the CPU; cuBLASLt's GELU is its own).
  if (g.act != Activation::none && g.mode == MatmulMode::f32) return "";
  if (!aligned16(g.bias) || !aligned16(g.bias_bf16)) return "";
  // FP8 products fuse the forward epilogues (the bias, the GELU and its saved input) on a bf16 D,
  // as Transformer Engine's FP8 forward products do; the gradient ones (DGELU, the bias gradients)
  // and any on an f32 D run as passes of their own.
  if (fp8_mode(g.mode) && epilogue_of(g) != CUBLASLT_EPILOGUE_DEFAULT &&
      (!g.d_bf16 || g.act == Activation::dgelu || gemm_plan::bias_grad_elements(g) > 0)) {
    return "";
  }
  switch (epilogue_of(g)) {
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    default: return "DEFAULT";
  }
}

}  // namespace ablate::cuda_layers
