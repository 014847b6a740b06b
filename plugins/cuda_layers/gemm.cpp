// cuBLASLt behind GemmCall (see gemm.hpp for the row-major to column-major mapping).
#include "gemm.hpp"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "layer_kernels.hpp"

namespace ablate::cuda_layers {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;

std::string shape_of(const GemmCall& g) {
  return std::string("D(") + std::to_string(g.M) + "x" + std::to_string(g.N) + ") = " + (g.ta ? "A^T" : "A") + " " +
         (g.tb ? "B^T" : "B") + ", K " + std::to_string(g.K) + ", ld " + std::to_string(g.lda) + "/" + std::to_string(g.ldb) +
         "/" + std::to_string(g.ldc) + (g.bias != nullptr ? ", bias" : "") + ", " + to_string(g.mode);
}

// The largest power of two (up to 256) that divides the address: cuBLASLt's heuristic is told each
// operand's alignment, so a pointer inside a buffer (a classifier chunk, an odd width) never gets a
// kernel that assumes more.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// A and B as cuBLASLt reads them: the f32 operands, or (bf16) their packed bf16 copies.
struct Operands {
  const void* A;
  int64_t lda;
  const void* B;
  int64_t ldb;
};

void check_lt(cublasStatus_t rc, const char* call, const GemmCall& g) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw_runtime_error("cuda_layers gemm", std::string(call) + " failed for " + shape_of(g) + ": " + cublasLtGetStatusName(rc) +
                                              ": " + cublasLtGetStatusString(rc));
}

// One problem's descriptors and the algorithm chosen for it.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// The process's handle, workspace and plan cache. Created on first use, so loading the plugin on
// a machine without a GPU touches no CUDA state.
class Context {
 public:
  Context() {
    check_lt(cublasLtCreate(&handle_), "cublasLtCreate", GemmCall{});
    ABLATE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  }
  ~Context() {
    plans_.clear();
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }

  void run(const GemmCall& g, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const Operands ops = operands(g, stream);
    Plan& p = plan(g, ops);
    if (g.bias != nullptr) {
      const void* bias = g.bias;
      check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", g);
    }
    // Column-major: D^T(N, M) = op(B)^T(N, K) op(A)^T(K, M).
    const float* c = g.C != nullptr ? g.C : g.D;
    check_lt(cublasLtMatmul(handle_, p.desc, &g.alpha, ops.B, p.a, ops.A, p.b, &g.beta, c, p.c, g.D, p.d, &p.algo, workspace_,
                            kWorkspaceBytes, stream),
             "cublasLtMatmul", g);
  }

  int64_t built() {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(plans_.size());
  }

 private:
  // bf16: A and B rounded into packed copies (leading dimension = their row length in memory).
  Operands operands(const GemmCall& g, cudaStream_t stream) {
    if (g.mode != MatmulMode::bf16) return {g.A, g.lda, g.B, g.ldb};
    const int64_t a_rows = g.ta ? g.K : g.M, a_cols = g.ta ? g.M : g.K;
    const int64_t b_rows = g.tb ? g.N : g.K, b_cols = g.tb ? g.K : g.N;
    auto* a = static_cast<uint16_t*>(bf16_a_.get(std::size_t(a_rows * a_cols) * 2, stream));
    launch_to_bf16(g.A, a_rows, a_cols, g.lda, a, stream);
    if (g.B_bf16 != nullptr) {  // the model's bf16 weights: read as they are
      ABLATE_CUDA_CHECK(cudaGetLastError());
      return {a, a_cols, g.B_bf16, g.ldb};
    }
    auto* b = static_cast<uint16_t*>(bf16_b_.get(std::size_t(b_rows * b_cols) * 2, stream));
    launch_to_bf16(g.B, b_rows, b_cols, g.ldb, b, stream);
    ABLATE_CUDA_CHECK(cudaGetLastError());
    return {a, a_cols, b, b_cols};
  }

  Plan& plan(const GemmCall& g, const Operands& ops) {
    const std::string key = gemm_key(g);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    check_lt(cublasLtMatmulDescCreate(&p->desc, g.mode == MatmulMode::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                      CUDA_R_32F),
             "cublasLtMatmulDescCreate", g);
    // The column-major operands: first B's memory (op = tb), then A's (op = ta).
    const cublasOperation_t op_first = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
             "cublasLtMatmulDescSetAttribute(TRANSA)", g);
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
             "cublasLtMatmulDescSetAttribute(TRANSB)", g);
    if (g.bias != nullptr) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_32F;
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
               "cublasLtMatmulDescSetAttribute(EPILOGUE)", g);
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)", g);
    }
    const auto u = [](int64_t v) { return uint64_t(v); };
    // B's memory, column-major: (N, K) when not transposed (row-major (K, N)), else (K, N).
    const cudaDataType_t in_type = g.mode == MatmulMode::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatrixLayoutCreate(&p->a, in_type, u(g.tb ? g.K : g.N), u(g.tb ? g.N : g.K), ops.ldb),
             "cublasLtMatrixLayoutCreate(B)", g);
    // A's memory, column-major: (K, M) when not transposed (row-major (M, K)), else (M, K).
    check_lt(cublasLtMatrixLayoutCreate(&p->b, in_type, u(g.ta ? g.M : g.K), u(g.ta ? g.K : g.M), ops.lda),
             "cublasLtMatrixLayoutCreate(A)", g);
    check_lt(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, u(g.N), u(g.M), g.ldc), "cublasLtMatrixLayoutCreate(C)", g);
    check_lt(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, u(g.N), u(g.M), g.ldc), "cublasLtMatrixLayoutCreate(D)", g);
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", g);
    const uint64_t ws = kWorkspaceBytes;
    cublasStatus_t rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    // Each operand's alignment, in cuBLASLt's order (its A is our B's memory).
    const uint32_t align[4] = {alignment_of(ops.B), alignment_of(ops.A), alignment_of(g.C != nullptr ? g.C : g.D),
                               alignment_of(g.D)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && rc == CUBLAS_STATUS_SUCCESS; ++i) {
      rc = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i]));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (rc == CUBLAS_STATUS_SUCCESS) {
      rc = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->d, pref, 1, &result, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(rc, "cublasLtMatmulAlgoGetHeuristic", g);
    if (found == 0) throw_runtime_error("cuda_layers gemm", "cuBLASLt has no algorithm for " + shape_of(g));
    p->algo = result.algo;
    return *plans_.emplace(key, std::move(p)).first->second;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  cuda::StreamScratch bf16_a_, bf16_b_;  // the bf16 copies of A and B (bf16 mode)
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Plan>> plans_;
};

Context& context() {
  static Context ctx;
  return ctx;
}

}  // namespace

MatmulMode matmul_mode(const std::string& dtype) {
  if (dtype == "tf32") return MatmulMode::tf32;
  if (dtype == "bf16") return MatmulMode::bf16;
  return MatmulMode::f32;
}

const char* to_string(MatmulMode mode) {
  switch (mode) {
    case MatmulMode::tf32: return "tf32";
    case MatmulMode::bf16: return "bf16";
    case MatmulMode::f32: break;
  }
  return "f32";
}

std::string gemm_key(const GemmCall& g) {
  // The C operand's layout equals D's; whether C is D changes nothing in the plan. The heuristic is
  // told each operand's alignment, so the key holds them (bf16 operands are packed copies, always
  // 256-byte aligned, with their own leading dimensions).
  const bool copies = g.mode == MatmulMode::bf16, b_copied = copies && g.B_bf16 == nullptr;
  const auto al = [](const void* p) { return std::to_string(alignment_of(p)); };
  const std::string lda = std::to_string(copies ? (g.ta ? g.M : g.K) : g.lda);
  const std::string ldb = std::to_string(b_copied ? (g.tb ? g.K : g.N) : g.ldb);
  return std::string(g.ta ? "T" : "N") + (g.tb ? "T" : "N") + " " + std::to_string(g.M) + "," + std::to_string(g.N) + "," +
         std::to_string(g.K) + " ld " + lda + "," + ldb + "," + std::to_string(g.ldc) + (g.bias != nullptr ? " bias " : " ") +
         to_string(g.mode) + " align " + (copies ? "256" : al(g.A)) + "," +
         (b_copied ? "256" : al(copies ? g.B_bf16 : g.B)) + "," + al(g.D) + "," +
         al(g.C != nullptr ? g.C : g.D);
}

void gemm(const GemmCall& g, cudaStream_t stream) {
  if (g.M == 0 || g.N == 0) return;
  if (g.M < 0 || g.N < 0 || g.K < 0 || g.D == nullptr || (g.K > 0 && (g.A == nullptr || g.B == nullptr))) {
    throw_runtime_error("cuda_layers gemm", "invalid problem " + shape_of(g));
  }
  context().run(g, stream);
}

int64_t gemm_plans_built() { return context().built(); }

int64_t gemm_workspace_bytes(MatmulMode mode, int64_t rows, int64_t in, int64_t out) {
  int64_t bytes = int64_t(kWorkspaceBytes);
  if (mode == MatmulMode::bf16) {
    const int64_t wide = std::max(in, out);
    bytes += 2 * (rows * wide + std::max(in * out, rows * wide));  // A: an activation; B: the weight or one
  }
  return bytes;
}

void gemm_x_wt(const float* x, int64_t rows, int64_t in, int64_t out, Weight W, const float* bias, const float* c,
               float beta, float* y, cudaStream_t stream, MatmulMode mode) {
  GemmCall g;
  g.mode = mode;
  g.tb = true;
  g.M = rows;
  g.N = out;
  g.K = in;
  g.A = x;
  g.lda = in;
  g.B = W.f32;
  g.B_bf16 = mode == MatmulMode::bf16 ? W.bf16 : nullptr;
  g.ldb = in;
  g.beta = beta;
  g.C = c;
  g.D = y;
  g.ldc = out;
  g.bias = bias;
  gemm(g, stream);
}

void gemm_dy_w(const float* dy, int64_t rows, int64_t in, int64_t out, Weight W, bool accumulate, float* dx,
               cudaStream_t stream, MatmulMode mode) {
  GemmCall g;
  g.mode = mode;
  g.M = rows;
  g.N = in;
  g.K = out;
  g.A = dy;
  g.lda = out;
  g.B = W.f32;
  g.B_bf16 = mode == MatmulMode::bf16 ? W.bf16 : nullptr;
  g.ldb = in;
  g.beta = accumulate ? 1.0f : 0.0f;
  g.D = dx;
  g.ldc = in;
  gemm(g, stream);
}

void gemm_add_dyt_x(const float* dy, int64_t rows, int64_t in, int64_t out, const float* x, float* dW, cudaStream_t stream,
                    MatmulMode mode) {
  GemmCall g;
  g.mode = mode;
  g.ta = true;
  g.M = out;
  g.N = in;
  g.K = rows;
  g.A = dy;
  g.lda = out;
  g.B = x;
  g.ldb = in;
  g.beta = 1.0f;
  g.D = dW;
  g.ldc = in;
  gemm(g, stream);
}

}  // namespace ablate::cuda_layers
