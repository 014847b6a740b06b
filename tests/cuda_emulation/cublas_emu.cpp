// cuBLAS and cuBLASLt for the emulated CUDA device (cublas_v2.h, cublasLt.h): the products the
// CUDA plugins ask for, computed on the CPU on device memory as a GPU would (each sum over k in
// order, in fp32; operands rounded as the compute type allows), and the calls real cuBLASLt turns
// down turned down alike, so that the callers' fallbacks run. A refusal writes nothing. Why a call
// was refused: ablate::emu::cublas_last_refusal(), or ABLATE_EMU_CUBLAS_LOG=1.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime_internal.hpp"

namespace {

constexpr uint32_t kLtTag = 0x4c74'6878, kDescTag = 0x4c74'6465, kLayoutTag = 0x4c74'6c61, kPrefTag = 0x4c74'7072,
                   kBlasTag = 0x426c'6173;
constexpr uint64_t kAlgoTag = 0x6162'6c61'7465'4c74;  // the heuristic's algorithms
// The most alignment an algorithm relies on (its widest loads: 16 bytes), and what a fused
// epilogue's bias and GELU matrix must have.
constexpr uint32_t kMaxAlign = 16, kEpilogueAlign = 16;

thread_local std::string t_refusal;

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}

const char* status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized (a null or destroyed handle)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "a resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "the device lacks a feature the function needs";
    case CUBLAS_STATUS_MAPPING_ERROR: return "access to device memory failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the work failed to execute on the device";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the functionality needs a license";
  }
  return "unknown status";
}

bool log_refusals() {
  static const bool on = [] {
    const char* v = std::getenv("ABLATE_EMU_CUBLAS_LOG");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

cublasStatus_t refuse(cublasStatus_t rc, const char* call, const std::string& why) {
  t_refusal = std::string(call) + ": " + status_name(rc) + ": " + why;
  if (log_refusals()) std::fprintf(stderr, "emulated cuBLAS: %s\n", t_refusal.c_str());
  return rc;
}

std::size_t element_bytes(int type) {
  if (type == CUDA_R_32F) return 4;
  if (type == CUDA_R_16BF) return 2;
  if (type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2) return 1;
  return 0;
}
bool is_fp8(int type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }
__nv_fp8_interpretation_t fp8_kind(int type) { return type == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2; }
const char* type_name(int type) {
  switch (type) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    default: return "an unsupported data type";
  }
}

// The largest power of two (up to 256) dividing the address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}
uint32_t pow2_floor(uint32_t v) {
  uint32_t p = 1;
  while (p <= v / 2) p *= 2;
  return v == 0 ? 0 : p;
}

float load(const void* base, int type, std::size_t i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(base)[i];
  if (is_fp8(type)) return ablate_emu_fp8_to_float(static_cast<const __nv_fp8_storage_t*>(base)[i], fp8_kind(type));
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
// An FP8 output saturates to its largest finite value (NaN stays NaN).
void store(void* base, int type, std::size_t i, float v) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(base)[i] = v;
  } else if (is_fp8(type)) {
    static_cast<__nv_fp8_storage_t*>(base)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8_kind(type));
  } else {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  }
}

// TF32 as cvt.rna.tf32.f32: 10 explicit mantissa bits, to nearest with ties away from zero.
float round_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) == 0x7F800000u) return x;  // inf, NaN
  u = (u + 0x1000u) & 0xFFFFE000u;
  std::memcpy(&x, &u, 4);
  return x;
}
float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

enum class Round { none, tf32, bf16 };
float rounded(float x, Round r) {
  switch (r) {
    case Round::tf32: return round_tf32(x);
    case Round::bf16: return round_bf16(x);
    case Round::none: break;
  }
  return x;
}

// GELU's tanh approximation and its derivative, in fp32.
constexpr float kGeluC0 = 0.7978845608028654f, kGeluC1 = 0.044715f;
float gelu(float x) {
  const float u = kGeluC0 * (x + kGeluC1 * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}
float gelu_grad(float x) {
  const float u = kGeluC0 * (x + kGeluC1 * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC0 * (1.0f + 3.0f * kGeluC1 * x * x);
}

// A matrix in memory: element (r, c) of one batch member.
struct View {
  const void* p;
  int type;
  bool row;
  int64_t ld;
  std::size_t index(int64_t r, int64_t c) const { return std::size_t(row ? r * ld + c : r + c * ld); }
  float at(int64_t r, int64_t c) const { return load(p, type, index(r, c)); }
};

// Elements from a matrix's first to its last (0 when it has none).
int64_t span_of(bool row, int64_t rows, int64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0) return 0;
  return row ? (rows - 1) * ld + cols : (cols - 1) * ld + rows;
}

using Lanes = float __attribute__((vector_size(32)));

// op(A) (m x k) times op(B) (k x n): for each column j, `column(j, acc, bcol, a)` with acc[i] the
// fp32 sum over p, in order, of the operands as the compute type rounds them; bcol is op(B)(:, j)
// and a is op(A), column p at a + p m, both rounded so.
template <class F>
void multiply(int64_t m, int64_t n, int64_t k, const View& a, bool ta, const View& b, bool tb, Round rnd, F&& column) {
  std::vector<float> ap(static_cast<std::size_t>(m * k)), bp(static_cast<std::size_t>(k)), acc(static_cast<std::size_t>(m));
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t i = 0; i < m; ++i) ap[std::size_t(p * m + i)] = rounded(ta ? a.at(p, i) : a.at(i, p), rnd);
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) bp[std::size_t(p)] = rounded(tb ? b.at(j, p) : b.at(p, j), rnd);
    std::fill(acc.begin(), acc.end(), 0.0f);
    float* out = acc.data();
    for (int64_t p = 0; p < k; ++p) {
      const float bv = bp[std::size_t(p)];
      const float* col = ap.data() + p * m;
      // Eight rows at a time (each lane its own product and sum, rounded as the scalar loop).
      int64_t i = 0;
      for (; i + 8 <= m; i += 8) {
        Lanes o, c;
        std::memcpy(&o, out + i, sizeof o);
        std::memcpy(&c, col + i, sizeof c);
        o += c * bv;
        std::memcpy(out + i, &o, sizeof o);
      }
      for (; i < m; ++i) out[i] += col[i] * bv;
    }
    column(j, static_cast<const float*>(out), static_cast<const float*>(bp.data()), static_cast<const float*>(ap.data()));
  }
}

}  // namespace

// --- the handles and descriptors ------------------------------------------------------------------

struct cublasLtContext {
  uint32_t tag = kLtTag;
};
struct cublasContext {
  uint32_t tag = kBlasTag;
  cudaStream_t stream = nullptr;
};
struct cublasLtMatrixLayoutOpaque_t {
  uint32_t tag = kLayoutTag;
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct cublasLtMatmulDescOpaque_t {
  uint32_t tag = kDescTag;
  int32_t compute = CUBLAS_COMPUTE_32F;
  int32_t scale = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  int64_t aux_batch_stride = 0;
  int32_t bias_type = -1;  // -1: D's type
  int32_t aux_type = -1;
  // FP8 products: device pointers to one float each (null: 1), and where amax(D) goes (null: not computed).
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  const void* c_scale = nullptr;
  const void* d_scale = nullptr;
  void* amax_d = nullptr;
  int8_t fast_accum = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint32_t tag = kPrefTag;
  uint32_t search = CUBLASLT_SEARCH_BEST_FIT;
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = 0x7;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

// An attribute's value: `buf` of exactly the attribute's size.
template <class T>
cublasStatus_t put(T& field, const void* buf, std::size_t size, const char* call) {
  if (buf == nullptr || size != sizeof(T)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "the value's size is " + std::to_string(size) + " bytes; the attribute takes " + std::to_string(sizeof(T)));
  }
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
template <class T>
cublasStatus_t get(const T& field, void* buf, std::size_t size, std::size_t* written, const char* call) {
  if (size == 0) {
    if (written == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "sizeInBytes 0 and no sizeWritten");
    *written = sizeof(T);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != sizeof(T)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the buffer's size does not match the attribute's");
  }
  std::memcpy(buf, &field, sizeof(T));
  if (written != nullptr) *written = sizeof(T);
  return CUBLAS_STATUS_SUCCESS;
}

// What an epilogue does.
struct Epilogue {
  bool known = false;
  bool bias = false;     // adds BIAS_POINTER (rows of D)
  bool gelu = false;     // GELU of the result
  bool aux_out = false;  // writes GELU's input to the AUX matrix
  bool dgelu = false;    // multiplies by GELU's derivative at the AUX matrix
  bool grad_d = false;   // writes the sums of D's rows (over columns) to BIAS_POINTER
  bool grad_a = false;   // writes the sums of op(A) over k (rows of D) to BIAS_POINTER
  bool grad_b = false;   // writes the sums of op(B) over k (columns of D) to BIAS_POINTER
  bool uses_bias() const { return bias || grad_d || grad_a || grad_b; }
  bool uses_aux() const { return aux_out || dgelu; }
};
Epilogue epilogue_of(uint32_t e) {
  Epilogue x;
  x.known = true;
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_BIAS: x.bias = true; break;
    case CUBLASLT_EPILOGUE_GELU: x.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: x.gelu = x.aux_out = true; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: x.gelu = x.bias = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: x.gelu = x.aux_out = x.bias = true; break;
    case CUBLASLT_EPILOGUE_DGELU: x.dgelu = true; break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: x.dgelu = x.grad_d = true; break;
    case CUBLASLT_EPILOGUE_BGRADA: x.grad_a = true; break;
    case CUBLASLT_EPILOGUE_BGRADB: x.grad_b = true; break;
    default: x.known = false;
  }
  return x;
}

struct Mat {
  int type;
  std::size_t esize;
  bool row;
  int64_t rows, cols, ld;
  int32_t batch;
  int64_t stride;
  int64_t span() const { return span_of(row, rows, cols, ld); }
  // Elements from the first batch member's first to the last one's last.
  int64_t extent() const { return span() == 0 ? 0 : (batch - 1) * stride + span(); }
  View view(const void* base, int32_t b) const {
    return {static_cast<const char*>(base) + std::size_t(b) * std::size_t(stride) * esize, type, row, ld};
  }
};

// A cublasLtMatmul problem, checked.
struct Problem {
  Mat A, B, C, D;
  bool ta, tb;
  int64_t m, n, k;
  int32_t batch;
  Round rnd;
  bool fp8 = false;  // FP8 operands (A and B)
  Epilogue epi;
  int64_t bias_len;  // elements of BIAS_POINTER's vector (0: none)
};

cublasStatus_t check_layout(const cublasLtMatrixLayoutOpaque_t* l, char name, Mat* out, const char* call) {
  const std::string which = std::string("matrix ") + name;
  if (l == nullptr || l->tag != kLayoutTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, which + ": no layout");
  if (element_bytes(int(l->type)) == 0) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  which + ": type " + type_name(int(l->type)) + " (" + std::to_string(l->type) + ")");
  }
  if (l->order != CUBLASLT_ORDER_COL && l->order != CUBLASLT_ORDER_ROW) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, which + ": order " + std::to_string(l->order) + " (COL and ROW only)");
  }
  if (l->rows > uint64_t(INT32_MAX) || l->cols > uint64_t(INT32_MAX)) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, which + ": a dimension beyond int32");
  }
  const bool row = l->order == CUBLASLT_ORDER_ROW;
  const int64_t rows = int64_t(l->rows), cols = int64_t(l->cols);
  const int64_t need = std::max<int64_t>(1, row ? cols : rows);
  if (l->ld < need) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  which + ": leading dimension " + std::to_string(l->ld) + " below " + std::to_string(need) + " (" +
                      (row ? "columns, row order" : "rows, column order") + ")");
  }
  if (l->batch < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, which + ": batch count " + std::to_string(l->batch));
  if (l->stride < 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, which + ": a negative batch offset");
  *out = Mat{int(l->type), element_bytes(int(l->type)), row, rows, cols, l->ld, l->batch, l->stride};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_epilogue(const cublasLtMatmulDescOpaque_t* d, const Problem& problem, const char* call);

// FP8 operands, as cuBLASLt documents them for SM 8.9 and 9.0: A and B E4M3 or E5M2 (not both
// E5M2), the "TN" form (A transposed, B not), column order, compute and scale type 32F; D f32,
// bf16, E4M3 or E5M2, C as D (bf16 under an FP8 D); every leading dimension a multiple of 16
// bytes; no batch. D = scale_d * (alpha * scale_a * scale_b * op(A) op(B) + beta * scale_c * C),
// amax(D) taken before scale_d. Of the epilogues this emulation serves the forward ones on a bf16
// D (the bias, the GELU and its saved input: BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS, the
// bias and the GELU matrix bf16), as Transformer Engine's FP8 forward products use them; the
// gradient epilogues (DGELU, the bias gradients) and any epilogue on an f32 or FP8 D it refuses.
cublasStatus_t resolve_fp8(const cublasLtMatmulDescOpaque_t* d, Problem* P, const char* call) {
  const Mat &A = P->A, &B = P->B, &C = P->C, &D = P->D;
  if (!is_fp8(A.type) || !is_fp8(B.type)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an FP8 operand with a non-FP8 one");
  if (A.type == CUDA_R_8F_E5M2 && B.type == CUDA_R_8F_E5M2) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "A and B both CUDA_R_8F_E5M2 (one must be E4M3)");
  }
  if (d->compute != CUBLAS_COMPUTE_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8 operands under a compute type other than CUBLAS_COMPUTE_32F");
  }
  if (d->scale != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "scale type other than CUDA_R_32F");
  if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "pointer mode other than CUBLASLT_POINTER_MODE_HOST");
  }
  if (d->transa != CUBLAS_OP_T || d->transb != CUBLAS_OP_N) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8 operands need A transposed and B not (the TN form)");
  }
  if (d->transc != CUBLAS_OP_N) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "TRANSC other than CUBLAS_OP_N");
  if (A.row || B.row || C.row || D.row) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an FP8 product with a row-order matrix");
  if (D.type != CUDA_R_32F && D.type != CUDA_R_16BF && !is_fp8(D.type)) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, std::string("an FP8 product's D of ") + type_name(D.type));
  }
  if (is_fp8(D.type) ? C.type != CUDA_R_16BF : C.type != D.type) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "C's type: D's, or CUDA_R_16BF when D is FP8");
  }
  if (!is_fp8(D.type) && d->d_scale != nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a D scale with a D that is not FP8");
  }
  for (auto [x, name] : {std::pair{&A, 'A'}, std::pair{&B, 'B'}, std::pair{&C, 'C'}, std::pair{&D, 'D'}}) {
    if ((uint64_t(x->ld) * x->esize) % 16 != 0) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    std::string("matrix ") + name + ": leading dimension " + std::to_string(x->ld) + " (" +
                        std::to_string(x->ld * int64_t(x->esize)) + " bytes) not a multiple of 16 bytes, which FP8 products need");
    }
  }
  P->ta = true;
  P->tb = false;
  P->m = D.rows;
  P->n = D.cols;
  P->k = A.rows;
  if (A.cols != P->m || B.rows != P->k || B.cols != P->n || C.rows != D.rows || C.cols != D.cols) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "dimensions do not agree");
  }
  if (A.batch != 1 || B.batch != 1 || C.batch != 1 || D.batch != 1) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "a batched FP8 product (not emulated)");
  }
  P->batch = 1;
  P->rnd = Round::none;  // FP8 values and their products are exact in fp32
  P->epi = epilogue_of(d->epilogue);
  const Epilogue& e = P->epi;
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    if (!e.known || e.dgelu || e.grad_a || e.grad_b || e.grad_d) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    "epilogue " + std::to_string(d->epilogue) + " on an FP8 product (not emulated: the forward ones only)");
    }
    if (D.type != CUDA_R_16BF) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    std::string("an epilogue on an FP8 product whose D is ") + type_name(D.type) + " (not emulated: bf16 only)");
    }
  }
  P->bias_len = e.bias ? P->m : 0;
  return check_epilogue(d, *P, call);
}

// Everything about a problem that its descriptors say (the heuristic's and cublasLtMatmul's checks
// alike), with the bias and GELU matrix pointers the descriptor holds now.
cublasStatus_t resolve(const cublasLtMatmulDescOpaque_t* d, const cublasLtMatrixLayoutOpaque_t* a,
                       const cublasLtMatrixLayoutOpaque_t* b, const cublasLtMatrixLayoutOpaque_t* c,
                       const cublasLtMatrixLayoutOpaque_t* dd, Problem* P, const char* call) {
  if (d == nullptr || d->tag != kDescTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no matmul descriptor");
  for (auto [l, name] : {std::pair{a, 'A'}, std::pair{b, 'B'}, std::pair{c, 'C'}, std::pair{dd, 'D'}}) {
    Mat* out = name == 'A' ? &P->A : name == 'B' ? &P->B : name == 'C' ? &P->C : &P->D;
    if (const cublasStatus_t rc = check_layout(l, name, out, call); rc != CUBLAS_STATUS_SUCCESS) return rc;
  }
  if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_FAST_TF32 && d->compute != CUBLAS_COMPUTE_32F_FAST_16BF) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  "compute type " + std::to_string(d->compute) + " (32F, 32F_FAST_TF32 and 32F_FAST_16BF only)");
  }
  if (d->scale != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "scale type other than CUDA_R_32F");
  if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "pointer mode other than CUBLASLT_POINTER_MODE_HOST");
  }
  const auto op_ok = [](int32_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
  if (!op_ok(d->transa) || !op_ok(d->transb)) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "TRANSA or TRANSB not an operation");
  if (d->transc != CUBLAS_OP_N) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "TRANSC other than CUBLAS_OP_N");
  const Mat &A = P->A, &B = P->B, &C = P->C, &D = P->D;
  P->fp8 = is_fp8(A.type) || is_fp8(B.type);
  if (P->fp8) return resolve_fp8(d, P, call);
  if (d->a_scale != nullptr || d->b_scale != nullptr || d->c_scale != nullptr || d->d_scale != nullptr || d->amax_d != nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "scale or amax pointers on a product without FP8 operands");
  }
  if (is_fp8(C.type) || is_fp8(D.type)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an FP8 output of non-FP8 operands");
  // Types: f32 operands under any of the three compute types with f32 C and D; bf16 operands
  // under 32F with C and D both f32 or both bf16.
  if (A.type != B.type) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "A and B of different types");
  if (C.type != D.type) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "C and D of different types");
  if (A.type == CUDA_R_32F && D.type != CUDA_R_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "f32 operands with a bf16 output");
  }
  if (A.type == CUDA_R_16BF && d->compute != CUBLAS_COMPUTE_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "bf16 operands under a compute type other than CUBLAS_COMPUTE_32F");
  }
  P->rnd = A.type == CUDA_R_16BF || d->compute == CUBLAS_COMPUTE_32F ? Round::none
           : d->compute == CUBLAS_COMPUTE_32F_FAST_TF32              ? Round::tf32
                                                                     : Round::bf16;
  // Dimensions: D (m x n) = op(A) (m x k) op(B) (k x n); C as D.
  P->ta = d->transa != CUBLAS_OP_N;
  P->tb = d->transb != CUBLAS_OP_N;
  P->m = D.rows;
  P->n = D.cols;
  P->k = P->ta ? A.rows : A.cols;
  const int64_t a_m = P->ta ? A.cols : A.rows, b_k = P->tb ? B.cols : B.rows, b_n = P->tb ? B.rows : B.cols;
  if (a_m != P->m || b_k != P->k || b_n != P->n || C.rows != D.rows || C.cols != D.cols) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "dimensions do not agree: op(A) " + std::to_string(a_m) + "x" + std::to_string(P->k) + ", op(B) " +
                      std::to_string(b_k) + "x" + std::to_string(b_n) + ", C " + std::to_string(C.rows) + "x" +
                      std::to_string(C.cols) + ", D " + std::to_string(D.rows) + "x" + std::to_string(D.cols));
  }
  if (C.row != D.row) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "C and D in different orders");
  if (A.batch != D.batch || B.batch != D.batch || C.batch != D.batch) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the four matrices' batch counts differ");
  }
  P->batch = D.batch;
  // The epilogue.
  P->epi = epilogue_of(d->epilogue);
  const Epilogue& e = P->epi;
  if (!e.known) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "epilogue " + std::to_string(d->epilogue));
  P->bias_len = e.grad_b ? P->n : e.uses_bias() ? P->m : 0;
  return check_epilogue(d, *P, call);
}

// An epilogue's vectors and matrix as the descriptor sets them (the problem resolved): on an
// unbatched product of column-order matrices, the bias (or bias gradient) in D's type and 16-byte
// aligned, the GELU matrix in D's type, 16-byte aligned, its leading dimension at least D's rows
// and a multiple of 8.
cublasStatus_t check_epilogue(const cublasLtMatmulDescOpaque_t* d, const Problem& problem, const char* call) {
  const Problem* P = &problem;
  const Mat &A = P->A, &B = P->B, &D = P->D;
  const Epilogue& e = P->epi;
  if (d->epilogue == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
  if (P->batch > 1) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an epilogue on a batched product");
  if (A.row || B.row || D.row) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an epilogue with a row-order matrix");
  if (e.uses_bias()) {
    if (d->bias_type != -1 && d->bias_type != D.type) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "a bias (or bias gradient) type other than D's");
    }
    if (alignment_of(d->bias) < kEpilogueAlign) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "a bias vector not aligned to 16 bytes");
    }
  }
  if (e.uses_aux()) {
    if (d->aux_type != -1 && d->aux_type != D.type) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "an epilogue auxiliary matrix type other than D's");
    }
    if (d->aux_ld < P->m) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    "EPILOGUE_AUX_LD " + std::to_string(d->aux_ld) + " below D's rows " + std::to_string(P->m));
    }
    if (d->aux_ld % 8 != 0) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "EPILOGUE_AUX_LD " + std::to_string(d->aux_ld) + " not a multiple of 8");
    }
    if (d->aux_batch_stride % 8 != 0) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "EPILOGUE_AUX_BATCH_STRIDE not a multiple of 8");
    }
    if (alignment_of(d->aux) < kEpilogueAlign) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an epilogue auxiliary matrix not aligned to 16 bytes");
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The alignment an algorithm assumes of a matrix told to be aligned to `pref` bytes.
uint32_t assumed(uint32_t pref) { return std::min(pow2_floor(pref), kMaxAlign); }

// Alignment of every batch member of a matrix at `base`.
uint32_t batch_alignment(const void* base, const Mat& x) {
  uint32_t al = alignment_of(base);
  if (x.batch > 1 && x.stride != 0) {
    al = std::min(al, alignment_of(reinterpret_cast<const void*>(uintptr_t(x.stride) * x.esize)));
  }
  return al;
}

bool host_value(const void* p) { return p != nullptr && !ablate::emu::is_device_range(p, sizeof(float)); }

// An FP8 product (device memory open): t = ab_scale * sum_k a b (fp32, in k order) + c_scale * C,
// amax over t (a NaN makes it NaN), D = d_scale * t in D's type.
// A forward epilogue (P.epi: the bias, the GELU's input to `aux`, the GELU) follows, in D's type,
// before the amax and D's scale.
void multiply_fp8(const Problem& P, float ab_scale, float c_scale, float d_scale, const void* A, const void* B, const void* C, void* D,
                  float* amax_out, const void* bias, void* aux, int64_t aux_ld) {
  const View va = P.A.view(A, 0), vb = P.B.view(B, 0), vc = P.C.view(C, 0), vd = P.D.view(D, 0);
  const Epilogue& e = P.epi;
  float amax = 0.0f;
  multiply(P.m, P.n, P.k, va, true, vb, false, Round::none, [&](int64_t j, const float* acc, const float*, const float*) {
    for (int64_t i = 0; i < P.m; ++i) {
      float t = ab_scale * acc[i];
      if (c_scale != 0.0f) t = t + c_scale * vc.at(i, j);
      if (e.bias) t = t + load(bias, P.D.type, std::size_t(i));
      if (e.aux_out) store(aux, P.D.type, std::size_t(i + j * aux_ld), t);
      if (e.gelu) t = gelu(t);
      amax = std::isnan(t) || std::isnan(amax) ? NAN : std::max(amax, std::fabs(t));
      store(const_cast<void*>(vd.p), P.D.type, vd.index(i, j), is_fp8(P.D.type) ? d_scale * t : t);
    }
  });
  if (amax_out != nullptr) *amax_out = amax;
}

}  // namespace

// --- status names ----------------------------------------------------------------------------------

const char* cublasGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasGetStatusString(cublasStatus_t status) { return status_string(status); }
const char* cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return status_string(status); }

namespace ablate::emu {
const char* cublas_last_refusal() { return t_refusal.c_str(); }
}  // namespace ablate::emu

// --- cuBLASLt: handle, layouts, descriptors, preferences ------------------------------------------

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "null handle pointer");
  *lightHandle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (lightHandle == nullptr || lightHandle->tag != kLtTag) {
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "not a live handle");
  }
  lightHandle->tag = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (matLayout == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "null layout pointer");
  auto* l = new cublasLtMatrixLayoutOpaque_t;
  l->type = uint32_t(type);
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *matLayout = l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  if (matLayout == nullptr) return CUBLAS_STATUS_SUCCESS;
  if (matLayout->tag != kLayoutTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy", "not a layout");
  matLayout->tag = 0;
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                std::size_t size) {
  const char* call = "cublasLtMatrixLayoutSetAttribute";
  if (l == nullptr || l->tag != kLayoutTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a layout");
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return put(l->type, buf, size, call);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return put(l->order, buf, size, call);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return put(l->rows, buf, size, call);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return put(l->cols, buf, size, call);
    case CUBLASLT_MATRIX_LAYOUT_LD: return put(l->ld, buf, size, call);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return put(l->batch, buf, size, call);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return put(l->stride, buf, size, call);
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "layout attribute " + std::to_string(int(attr)));
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                std::size_t size, std::size_t* written) {
  const char* call = "cublasLtMatrixLayoutGetAttribute";
  if (l == nullptr || l->tag != kLayoutTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a layout");
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return get(l->type, buf, size, written, call);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return get(l->order, buf, size, written, call);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return get(l->rows, buf, size, written, call);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return get(l->cols, buf, size, written, call);
    case CUBLASLT_MATRIX_LAYOUT_LD: return get(l->ld, buf, size, written, call);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return get(l->batch, buf, size, written, call);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return get(l->stride, buf, size, written, call);
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "layout attribute " + std::to_string(int(attr)));
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "null descriptor pointer");
  auto* d = new cublasLtMatmulDescOpaque_t;
  d->compute = int32_t(computeType);
  d->scale = int32_t(scaleType);
  *matmulDesc = d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  if (d == nullptr) return CUBLAS_STATUS_SUCCESS;
  if (d->tag != kDescTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy", "not a matmul descriptor");
  d->tag = 0;
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t size) {
  const char* call = "cublasLtMatmulDescSetAttribute";
  if (d == nullptr || d->tag != kDescTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a matmul descriptor");
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return put(d->compute, buf, size, call);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return put(d->scale, buf, size, call);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return put(d->pointer_mode, buf, size, call);
    case CUBLASLT_MATMUL_DESC_TRANSA: return put(d->transa, buf, size, call);
    case CUBLASLT_MATMUL_DESC_TRANSB: return put(d->transb, buf, size, call);
    case CUBLASLT_MATMUL_DESC_TRANSC: return put(d->transc, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return put(d->epilogue, buf, size, call);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return put(d->bias, buf, size, call);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return put(d->bias_batch_stride, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return put(d->aux, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return put(d->aux_ld, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return put(d->aux_batch_stride, buf, size, call);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return put(d->bias_type, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return put(d->aux_type, buf, size, call);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return put(d->a_scale, buf, size, call);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return put(d->b_scale, buf, size, call);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return put(d->c_scale, buf, size, call);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return put(d->d_scale, buf, size, call);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return put(d->amax_d, buf, size, call);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return put(d->fast_accum, buf, size, call);
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "matmul descriptor attribute " + std::to_string(int(attr)));
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, void* buf, std::size_t size,
                                              std::size_t* written) {
  const char* call = "cublasLtMatmulDescGetAttribute";
  if (d == nullptr || d->tag != kDescTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a matmul descriptor");
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return get(d->compute, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return get(d->scale, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return get(d->pointer_mode, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_TRANSA: return get(d->transa, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_TRANSB: return get(d->transb, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_TRANSC: return get(d->transc, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get(d->epilogue, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return get(d->bias, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return get(d->bias_batch_stride, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return get(d->aux, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return get(d->aux_ld, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return get(d->aux_batch_stride, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return get(d->bias_type, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return get(d->aux_type, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return get(d->a_scale, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return get(d->b_scale, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return get(d->c_scale, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return get(d->d_scale, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return get(d->amax_d, buf, size, written, call);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return get(d->fast_accum, buf, size, written, call);
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "matmul descriptor attribute " + std::to_string(int(attr)));
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "null preference pointer");
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  if (pref->tag != kPrefTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy", "not a preference");
  pref->tag = 0;
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t size) {
  const char* call = "cublasLtMatmulPreferenceSetAttribute";
  if (p == nullptr || p->tag != kPrefTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a preference");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
      uint32_t v = 0;
      if (const cublasStatus_t rc = put(v, buf, size, call); rc != CUBLAS_STATUS_SUCCESS) return rc;
      if (v != CUBLASLT_SEARCH_BEST_FIT) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "search mode other than BEST_FIT");
      p->search = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return put(p->max_workspace, buf, size, call);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return put(p->reduction_mask, buf, size, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return put(p->align[0], buf, size, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return put(p->align[1], buf, size, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return put(p->align[2], buf, size, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return put(p->align[3], buf, size, call);
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "preference attribute " + std::to_string(int(attr)));
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    std::size_t size, std::size_t* written) {
  const char* call = "cublasLtMatmulPreferenceGetAttribute";
  if (p == nullptr || p->tag != kPrefTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a preference");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return get(p->search, buf, size, written, call);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return get(p->max_workspace, buf, size, written, call);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return get(p->reduction_mask, buf, size, written, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return get(p->align[0], buf, size, written, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return get(p->align[1], buf, size, written, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return get(p->align[2], buf, size, written, call);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return get(p->align[3], buf, size, written, call);
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "preference attribute " + std::to_string(int(attr)));
}

// --- cuBLASLt: the heuristic and the product -------------------------------------------------------

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t results[], int* returnAlgoCount) {
  const char* call = "cublasLtMatmulAlgoGetHeuristic";
  if (returnAlgoCount != nullptr) *returnAlgoCount = 0;
  if (handle == nullptr || handle->tag != kLtTag) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
  if (requestedAlgoCount <= 0 || results == nullptr || returnAlgoCount == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no room for a result");
  }
  const cublasLtMatmulPreferenceOpaque_t defaults;
  const cublasLtMatmulPreferenceOpaque_t* pref = preference != nullptr ? preference : &defaults;
  if (pref->tag != kPrefTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a preference");
  Problem P;
  if (const cublasStatus_t rc = resolve(desc, Adesc, Bdesc, Cdesc, Ddesc, &P, call); rc != CUBLAS_STATUS_SUCCESS) return rc;
  const Mat* mats[4] = {&P.A, &P.B, &P.C, &P.D};
  for (int x = 0; x < 4; ++x) {
    if (pref->align[x] < mats[x]->esize) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    std::string("no algorithm for matrix ") + "ABCD"[x] + " aligned to " + std::to_string(pref->align[x]) +
                        " bytes (its elements take " + std::to_string(mats[x]->esize) + ")");
    }
  }
  cublasLtMatmulHeuristicResult_t r;
  std::memset(&r, 0, sizeof r);
  r.algo.data[0] = kAlgoTag;
  for (int x = 0; x < 4; ++x) r.algo.data[1 + x] = assumed(pref->align[x]);
  r.algo.data[5] = desc->epilogue;
  r.algo.data[6] = uint64_t(uint32_t(desc->compute));
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// One checked cublasLtMatmul as it runs: the problem, alpha and beta, the matrices and what the
// descriptor pointed to when it was called.
struct Call {
  Problem P;
  float a, b;
  const void *A, *B, *C;
  void* D;
  const void* scales[4];  // FP8: A's, B's, C's and D's scale in device memory (null: 1)
  void* amax_d;
  void* bias;
  void* aux;
  int64_t aux_ld;
};

void execute(const Call& c) {
  const Problem& P = c.P;
  const float a = c.a, b = c.b;
  const ablate::emu::DeviceAccess access;
  if (P.fp8) {
    float scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    for (int x = 0; x < 4; ++x) {
      if (c.scales[x] != nullptr) std::memcpy(&scale[x], c.scales[x], sizeof(float));
    }
    multiply_fp8(P, a * scale[0] * scale[1], b * scale[2], scale[3], c.A, c.B, c.C, c.D, static_cast<float*>(c.amax_d), c.bias, c.aux,
                 c.aux_ld);
    return;
  }
  const Epilogue& e = P.epi;
  const int out = P.D.type;
  const int64_t m = P.m, n = P.n, k = P.k;
  void* bias = c.bias;
  void* aux = c.aux;
  const int64_t aux_ld = c.aux_ld;
  std::vector<float> grad(static_cast<std::size_t>(P.bias_len), 0.0f);
  for (int32_t bt = 0; bt < P.batch; ++bt) {
    const View va = P.A.view(c.A, bt), vb = P.B.view(c.B, bt), vc = P.C.view(c.C, bt), vd = P.D.view(c.D, bt);
    void* dst = const_cast<void*>(vd.p);
    multiply(m, n, k, va, P.ta, vb, P.tb, P.rnd, [&](int64_t j, const float* acc, const float* bcol, const float* acol) {
      for (int64_t i = 0; i < m; ++i) {
        float t = a * acc[i];
        if (b != 0.0f) t = t + b * vc.at(i, j);
        if (e.bias) t = t + load(bias, out, std::size_t(i));
        if (e.aux_out) store(aux, out, std::size_t(i + j * aux_ld), t);
        if (e.gelu) t = gelu(t);
        if (e.dgelu) t = t * gelu_grad(load(aux, out, std::size_t(i + j * aux_ld)));
        if (e.grad_d) grad[std::size_t(i)] += t;
        store(dst, out, vd.index(i, j), t);
      }
      if (e.grad_b) {
        float s = 0.0f;
        for (int64_t p = 0; p < k; ++p) s += bcol[p];
        grad[std::size_t(j)] = s;
      }
      if (e.grad_a && j == 0) {
        for (int64_t i = 0; i < m; ++i) {
          float s = 0.0f;
          for (int64_t p = 0; p < k; ++p) s += acol[p * m + i];
          grad[std::size_t(i)] = s;
        }
      }
    });
  }
  if (e.grad_d || e.grad_a || e.grad_b) {
    for (int64_t i = 0; i < P.bias_len; ++i) store(bias, out, std::size_t(i), grad[std::size_t(i)]);
  }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, std::size_t workspaceSizeInBytes,
                              cudaStream_t stream) {
  const char* call = "cublasLtMatmul";
  if (handle == nullptr || handle->tag != kLtTag) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
  Problem P;
  if (const cublasStatus_t rc = resolve(desc, Adesc, Bdesc, Cdesc, Ddesc, &P, call); rc != CUBLAS_STATUS_SUCCESS) return rc;
  if (!ablate::emu::runtime::stream_live(stream)) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a live stream");
  ablate::emu::runtime::finish_stream_work(stream);  // what the stream holds (a collective) runs first
  if (alpha == nullptr || beta == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "null alpha or beta");
  if (!host_value(alpha) || !host_value(beta)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta in device memory under pointer mode host");
  }
  // The alignment the algorithm assumes (the implicit heuristic: the elements' own).
  uint32_t need[4] = {uint32_t(P.A.esize), uint32_t(P.B.esize), uint32_t(P.C.esize), uint32_t(P.D.esize)};
  if (algo != nullptr) {
    if (algo->data[0] != kAlgoTag) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "an algorithm the heuristic did not give");
    if (algo->data[5] != desc->epilogue || algo->data[6] != uint64_t(uint32_t(desc->compute))) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "the algorithm was found for another epilogue or compute type");
    }
    for (int x = 0; x < 4; ++x) need[x] = std::max(need[x], uint32_t(algo->data[1 + x]));
  }
  if (workspaceSizeInBytes > 0 && (workspace == nullptr || !ablate::emu::is_device_range(workspace, workspaceSizeInBytes))) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the workspace is not device memory of the size given");
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const int64_t m = P.m, n = P.n, k = P.k;
  const bool empty = m == 0 || n == 0;
  const bool reads_ab = !empty && k > 0, reads_c = !empty && b != 0.0f;
  if (C == nullptr && b == 0.0f) C = D;
  // The matrices: present, aligned as the algorithm assumes, inside device allocations.
  const void* ptrs[4] = {A, B, C, D};
  const bool used[4] = {reads_ab, reads_ab, reads_c, !empty};
  const Mat* mats[4] = {&P.A, &P.B, &P.C, &P.D};
  for (int x = 0; x < 4; ++x) {
    if (!used[x]) continue;
    const std::string name = std::string("matrix ") + "ABCD"[x];
    if (ptrs[x] == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, name + ": null pointer");
    const uint32_t al = batch_alignment(ptrs[x], *mats[x]);
    if (al < mats[x]->esize) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, name + ": not aligned to its elements");
    if (al < need[x]) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    name + ": aligned to " + std::to_string(al) + " bytes; the algorithm assumes " + std::to_string(need[x]));
    }
    if (!ablate::emu::is_device_range(ptrs[x], std::size_t(mats[x]->extent()) * mats[x]->esize)) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, name + ": not inside one device allocation");
    }
  }
  if (C == D && P.C.row == P.D.row && (P.C.ld != P.D.ld || P.C.stride != P.D.stride) && reads_c) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "in place (C == D) with different layouts of C and D");
  }
  // FP8: every matrix on 16 bytes; the scales and amax one float each in device memory.
  if (P.fp8) {
    for (int x = 0; x < 4; ++x) {
      if (used[x] && alignment_of(ptrs[x]) < 16) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, std::string("matrix ") + "ABCD"[x] + ": FP8 products need 16-byte alignment");
      }
    }
    const void* scales[4] = {desc->a_scale, desc->b_scale, desc->c_scale, desc->d_scale};
    for (int x = 0; x < 4; ++x) {
      if (scales[x] != nullptr && !ablate::emu::is_device_range(scales[x], sizeof(float))) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, std::string("the ") + "ABCD"[x] + " scale is not a float in device memory");
      }
    }
    if (desc->amax_d != nullptr && !ablate::emu::is_device_range(desc->amax_d, sizeof(float))) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "AMAX_D_POINTER is not a float in device memory");
    }
  }
  // The epilogue's vectors and matrix.
  const Epilogue& e = P.epi;
  const std::size_t out_bytes = P.D.esize;
  if (e.uses_bias() && !empty) {
    if (desc->bias == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the epilogue needs BIAS_POINTER");
    if (!ablate::emu::is_device_range(desc->bias, std::size_t(P.bias_len) * out_bytes)) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the bias vector is not inside one device allocation");
    }
  }
  if (e.uses_aux() && !empty) {
    if (desc->aux == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the epilogue needs EPILOGUE_AUX_POINTER");
    if (!ablate::emu::is_device_range(desc->aux, std::size_t(span_of(false, m, n, desc->aux_ld)) * out_bytes)) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the epilogue's matrix is not inside one device allocation");
    }
  }
  if (empty) return CUBLAS_STATUS_SUCCESS;
  // What the product reads of the descriptor now (a graph keeps these, as cuBLASLt's node does);
  // the FP8 scales are read from device memory when it runs.
  const Call run{P,
                 a,
                 b,
                 A,
                 B,
                 C,
                 D,
                 {desc->a_scale, desc->b_scale, desc->c_scale, desc->d_scale},
                 desc->amax_d,
                 const_cast<void*>(desc->bias),
                 const_cast<void*>(desc->aux),
                 desc->aux_ld};
  if (ablate::emu::runtime::capturing(stream)) {
    ablate::emu::runtime::capture_node(stream, [run] { execute(run); });
    return CUBLAS_STATUS_SUCCESS;
  }
  execute(run);
  return CUBLAS_STATUS_SUCCESS;
}

// --- cuBLAS -------------------------------------------------------------------------------------------

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "null handle pointer");
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr || handle->tag != kBlasTag) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "not a live handle");
  handle->tag = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr || handle->tag != kBlasTag)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream", "not a live handle");
  if (!ablate::emu::runtime::stream_live(stream)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream", "not a live stream");
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr || handle->tag != kBlasTag)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetStream", "not a live handle");
  if (stream == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream", "null stream pointer");
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// The checks cublasGemmBatchedEx and cublasGemmStridedBatchedEx share: column-major f32,
// C (m x n) = alpha op(A) op(B) + beta C.
cublasStatus_t check_gemm_ex(const char* call, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                             int k, const void* alpha, cudaDataType Atype, int lda, cudaDataType Btype, int ldb, const void* beta,
                             cudaDataType Ctype, int ldc, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (handle == nullptr || handle->tag != kBlasTag) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
  const auto op_ok = [](cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
  if (!op_ok(transa) || !op_ok(transb)) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "transa or transb not an operation");
  if (m < 0 || n < 0 || k < 0 || batchCount < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a negative size or count");
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a leading dimension below its matrix's rows");
  }
  if (Atype != CUDA_R_32F || Btype != CUDA_R_32F || Ctype != CUDA_R_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "types other than CUDA_R_32F");
  }
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "compute type other than 32F and 32F_FAST_TF32");
  }
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "algorithm other than CUBLAS_GEMM_DEFAULT");
  }
  if (!ablate::emu::runtime::stream_live(handle->stream))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the handle's stream was destroyed");
  // (A capturing stream holds nothing to wait for: the product becomes a node of its graph.)
  if (!ablate::emu::runtime::capturing(handle->stream)) ablate::emu::runtime::finish_stream_work(handle->stream);
  if (alpha == nullptr || beta == nullptr || !host_value(alpha) || !host_value(beta)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha and beta must be host values (pointer mode host)");
  }
  return CUBLAS_STATUS_SUCCESS;
}

// One member of a batch: pointers checked, then computed.
struct Member {
  const float* a;
  const float* b;
  float* c;
};

cublasStatus_t check_member(const char* call, const Member& x, int64_t i, int64_t a_span, int64_t b_span, int64_t c_span,
                            bool reads_ab) {
  const std::string at = "batch member " + std::to_string(i);
  if (reads_ab) {
    if (x.a == nullptr || x.b == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, at + ": a null A or B");
    if (alignment_of(x.a) < 4 || alignment_of(x.b) < 4)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, at + ": A or B not aligned to floats");
    if (!ablate::emu::is_device_range(x.a, std::size_t(a_span) * 4) || !ablate::emu::is_device_range(x.b, std::size_t(b_span) * 4)) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call, at + ": A or B not inside one device allocation");
    }
  }
  if (x.c == nullptr || alignment_of(x.c) < 4)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, at + ": C null or not aligned to floats");
  if (!ablate::emu::is_device_range(x.c, std::size_t(c_span) * 4)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, at + ": C not inside one device allocation");
  }
  return CUBLAS_STATUS_SUCCESS;
}

void run_member(const Member& x, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha, int lda,
                int ldb, float beta, int ldc, Round rnd) {
  const View va{x.a, CUDA_R_32F, false, lda}, vb{x.b, CUDA_R_32F, false, ldb};
  multiply(m, n, k, va, transa != CUBLAS_OP_N, vb, transb != CUBLAS_OP_N, rnd,
           [&](int64_t j, const float* acc, const float*, const float*) {
             float* col = x.c + j * ldc;
             for (int64_t i = 0; i < m; ++i) {
               float t = alpha * acc[i];
               if (beta != 0.0f) t = t + beta * col[i];
               col[i] = t;
             }
           });
}

}  // namespace

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                                   const void* alpha, const void* const Aarray[], cudaDataType Atype, int lda,
                                   const void* const Barray[], cudaDataType Btype, int ldb, const void* beta, void* const Carray[],
                                   cudaDataType Ctype, int ldc, int batchCount, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo) {
  const char* call = "cublasGemmBatchedEx";
  if (const cublasStatus_t rc = check_gemm_ex(call, handle, transa, transb, m, n, k, alpha, Atype, lda, Btype, ldb, beta, Ctype, ldc,
                                              batchCount, computeType, algo);
      rc != CUBLAS_STATUS_SUCCESS) {
    return rc;
  }
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  const bool reads_ab = k > 0;
  const std::size_t array_bytes = std::size_t(batchCount) * sizeof(void*);
  const auto array_ok = [&](const void* p) {
    return p != nullptr && alignment_of(p) >= 8 && ablate::emu::is_device_range(p, array_bytes);
  };
  if ((reads_ab && (!array_ok(Aarray) || !array_ok(Barray))) || !array_ok(Carray)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a pointer array is not in device memory");
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const int64_t a_span = span_of(false, transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda);
  const int64_t b_span = span_of(false, transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb);
  const int64_t c_span = span_of(false, m, n, ldc);
  const Round rnd = computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ? Round::tf32 : Round::none;
  // The pointer arrays are read when the product runs (a graph's node reads them when it runs).
  const auto product = [=]() -> cublasStatus_t {
    const ablate::emu::DeviceAccess access;  // the pointer arrays are device memory
    std::vector<Member> members(static_cast<std::size_t>(batchCount));
    for (int i = 0; i < batchCount; ++i) {
      Member& x = members[std::size_t(i)];
      x.a = reads_ab ? static_cast<const float*>(Aarray[i]) : nullptr;
      x.b = reads_ab ? static_cast<const float*>(Barray[i]) : nullptr;
      x.c = static_cast<float*>(Carray[i]);
      if (const cublasStatus_t rc = check_member(call, x, i, a_span, b_span, c_span, reads_ab); rc != CUBLAS_STATUS_SUCCESS) return rc;
    }
    for (const Member& x : members) run_member(x, transa, transb, m, n, k, a, lda, ldb, b, ldc, rnd);
    return CUBLAS_STATUS_SUCCESS;
  };
  if (ablate::emu::runtime::capturing(handle->stream)) {
    ablate::emu::runtime::capture_node(handle->stream, [product, call] {
      if (product() != CUBLAS_STATUS_SUCCESS) {
        throw ablate::emu::Error(std::string(call) + ": a captured product's pointer arrays were refused when its graph ran");
      }
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  return product();
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
                                          const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
                                          cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const char* call = "cublasGemmStridedBatchedEx";
  if (const cublasStatus_t rc = check_gemm_ex(call, handle, transa, transb, m, n, k, alpha, Atype, lda, Btype, ldb, beta, Ctype, ldc,
                                              batchCount, computeType, algo);
      rc != CUBLAS_STATUS_SUCCESS) {
    return rc;
  }
  if (strideA < 0 || strideB < 0 || strideC < 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "a negative stride");
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  const bool reads_ab = k > 0;
  const int64_t a_span = span_of(false, transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda);
  const int64_t b_span = span_of(false, transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb);
  const int64_t c_span = span_of(false, m, n, ldc);
  const int64_t last = batchCount - 1;
  const Member whole{static_cast<const float*>(A), static_cast<const float*>(B), static_cast<float*>(C)};
  if (const cublasStatus_t rc =
          check_member(call, whole, 0, last * strideA + a_span, last * strideB + b_span, last * strideC + c_span, reads_ab);
      rc != CUBLAS_STATUS_SUCCESS) {
    return rc;
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const Round rnd = computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ? Round::tf32 : Round::none;
  const auto product = [=] {
    const ablate::emu::DeviceAccess access;
    for (int64_t i = 0; i < batchCount; ++i) {
      const Member x{reads_ab ? whole.a + i * strideA : nullptr, reads_ab ? whole.b + i * strideB : nullptr, whole.c + i * strideC};
      run_member(x, transa, transb, m, n, k, a, lda, ldb, b, ldc, rnd);
    }
  };
  if (ablate::emu::runtime::capturing(handle->stream)) {
    ablate::emu::runtime::capture_node(handle->stream, product);
  } else {
    product();
  }
  return CUBLAS_STATUS_SUCCESS;
}
