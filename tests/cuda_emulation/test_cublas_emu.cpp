// The cuBLAS(Lt) stand-in of the emulated CUDA device (cublas_emu.cpp) against float64 references
// (OpenBLAS's cblas_dgemm for the products, float64 loops for the epilogues), with error bounds
// derived from the arithmetic: each sum over k in fp32 (k + 2 roundings of 2^-24 on sum |a||b|),
// operands rounded to TF32 (2^-11 relative each) or bf16 (2^-8), bf16 outputs rounded to nearest
// even (2^-8). Every combination of transposes, orders, leading dimensions, batches and scale
// factors it serves, and the calls it must turn down as cuBLASLt does (nothing written).
#include <cblas.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr double kU = 1.0 / 16777216.0;                     // fp32's unit roundoff, 2^-24
constexpr double kBf16U = 1.0 / 256.0;                      // bf16's, 2^-8
constexpr double kTf32Op = 1.0 / 1024.0 + 1.0 / 4194304.0;  // a product of two TF32-rounded operands
constexpr double kBf16Op = 1.0 / 128.0 + 1.0 / 65536.0;     // of two bf16-rounded operands

uint32_t align_of(uintptr_t a) {
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}
uint32_t align_of(const void* p) { return align_of(reinterpret_cast<uintptr_t>(p)); }

// Device memory, freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) { REQUIRE(cudaMalloc(&p, n) == cudaSuccess); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p); }
  char* at(std::size_t offset) const { return static_cast<char*>(p) + offset; }
  void upload(const void* src, std::size_t n, std::size_t offset = 0) {
    REQUIRE(cudaMemcpy(at(offset), src, n, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  void download(void* dst, std::size_t n, std::size_t offset = 0) const {
    REQUIRE(cudaMemcpy(dst, at(offset), n, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
};

// A matrix (or a strided batch of them) on the host, in the layout it will have on the device.
struct HostMat {
  cudaDataType_t type;
  bool row;
  int64_t rows, cols, ld;
  int32_t batch;
  int64_t stride = 0;
  std::vector<unsigned char> data;

  HostMat(cudaDataType_t t, bool row_order, int64_t r, int64_t c, int64_t pad, int32_t b)
      : type(t), row(row_order), rows(r), cols(c), ld((row_order ? c : r) + pad), batch(b) {
    stride = b > 1 ? span() + 7 : 0;  // batch members apart, by an odd gap
    data.resize(std::size_t(count()) * esize());
  }
  std::size_t esize() const { return type == CUDA_R_32F ? 4 : 2; }
  int64_t span() const { return row ? (rows - 1) * ld + cols : (cols - 1) * ld + rows; }
  int64_t count() const { return (batch - 1) * stride + span(); }
  std::size_t bytes() const { return data.size(); }
  std::size_t index(int64_t r, int64_t c, int32_t b) const { return std::size_t(b * stride + (row ? r * ld + c : r + c * ld)); }
  double get(int64_t r, int64_t c, int32_t b) const { return element(index(r, c, b)); }
  double element(std::size_t e) const {
    if (type == CUDA_R_32F) {
      float f;
      std::memcpy(&f, &data[e * 4], 4);
      return f;
    }
    __nv_bfloat16 h;
    std::memcpy(&h, &data[e * 2], 2);
    return __bfloat162float(h);
  }
  void put(std::size_t e, float v) {
    if (type == CUDA_R_32F) {
      std::memcpy(&data[e * 4], &v, 4);
    } else {
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      std::memcpy(&data[e * 2], &h, 2);
    }
  }
  void randomize(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t e = 0; e < count(); ++e) put(std::size_t(e), u(rng));
  }
  // 1 for every element of a batch member, 0 for padding and gaps.
  std::vector<char> mask() const {
    std::vector<char> m(std::size_t(count()), 0);
    for (int32_t b = 0; b < batch; ++b) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) m[index(r, c, b)] = 1;
      }
    }
    return m;
  }
};

struct Lt {
  cublasLtHandle_t h = nullptr;
  Lt() { REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS); }
  ~Lt() { cublasLtDestroy(h); }
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    REQUIRE(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld) == CUBLAS_STATUS_SUCCESS);
  }
  explicit Layout(const HostMat& h) : Layout(h.type, uint64_t(h.rows), uint64_t(h.cols), h.ld) {
    if (h.row) set(CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t(CUBLASLT_ORDER_ROW));
    if (h.batch > 1) {
      set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(h.batch));
      set(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(h.stride));
    }
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
  template <class T>
  void set(cublasLtMatrixLayoutAttribute_t a, T v) {
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, a, &v, sizeof v) == CUBLAS_STATUS_SUCCESS);
  }
};

struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  explicit Desc(cublasComputeType_t compute, cudaDataType_t scale = CUDA_R_32F) {
    REQUIRE(cublasLtMatmulDescCreate(&d, compute, scale) == CUBLAS_STATUS_SUCCESS);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() { cublasLtMatmulDescDestroy(d); }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t a, T v) {
    REQUIRE(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v) == CUBLAS_STATUS_SUCCESS);
  }
  void trans(bool ta, bool tb) {
    set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(ta ? CUBLAS_OP_T : CUBLAS_OP_N));
    set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(tb ? CUBLAS_OP_T : CUBLAS_OP_N));
  }
  void epilogue(cublasLtEpilogue_t e) { set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(e)); }
  void bias(const void* p) { set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p); }
  void aux(const void* p, int64_t ld) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
  }
};

struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  Pref() { REQUIRE(cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS); }
  Pref(const Pref&) = delete;
  Pref& operator=(const Pref&) = delete;
  ~Pref() { cublasLtMatmulPreferenceDestroy(p); }
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t a, T v) {
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof v) == CUBLAS_STATUS_SUCCESS);
  }
  void align(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, a);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, b);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, d);
  }
};

// What a matrix at `p` is aligned to, every batch member included.
uint32_t member_align(const void* p, const HostMat& h) {
  uint32_t al = align_of(p);
  if (h.batch > 1) al = std::min(al, align_of(uintptr_t(h.stride) * h.esize()));
  return al;
}

// The heuristic's one algorithm for a problem whose matrices are aligned as given.
cublasLtMatmulAlgo_t algo_for(const Lt& lt, const Desc& desc, const Layout& a, const Layout& b, const Layout& c, const Layout& d,
                              const uint32_t align[4]) {
  Pref pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(1) << 20);
  pref.align(align[0], align[1], align[2], align[3]);
  cublasLtMatmulHeuristicResult_t r{};
  int found = -1;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, a.l, b.l, c.l, d.l, pref.p, 1, &r, &found);
  INFO(ablate::emu::cublas_last_refusal());
  REQUIRE(rc == CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == 1);
  CHECK(r.state == CUBLAS_STATUS_SUCCESS);
  CHECK(r.workspaceSize == 0);
  return r.algo;
}

// op(A) (m x k) and op(B) (k x n) of one batch member as row-major float64, and their products
// with cblas_dgemm: P = op(A) op(B), S = |op(A)| |op(B)|.
struct Reference {
  std::vector<double> a, b, abs_a, abs_b, P, S;
};
Reference reference(const HostMat& A, bool ta, const HostMat& B, bool tb, int64_t m, int64_t n, int64_t k, int32_t bt) {
  Reference r;
  r.a.resize(std::size_t(m * k));
  r.b.resize(std::size_t(k * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) r.a[std::size_t(i * k + p)] = ta ? A.get(p, i, bt) : A.get(i, p, bt);
  }
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = 0; j < n; ++j) r.b[std::size_t(p * n + j)] = tb ? B.get(j, p, bt) : B.get(p, j, bt);
  }
  r.abs_a = r.a;
  r.abs_b = r.b;
  for (double& v : r.abs_a) v = std::fabs(v);
  for (double& v : r.abs_b) v = std::fabs(v);
  r.P.assign(std::size_t(m * n), 0.0);
  r.S.assign(std::size_t(m * n), 0.0);
  if (k > 0) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0, r.a.data(), int(k), r.b.data(), int(n), 0.0,
                r.P.data(), int(n));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0, r.abs_a.data(), int(k), r.abs_b.data(), int(n),
                0.0, r.S.data(), int(n));
  }
  return r;
}

// The bound on |D - alpha op(A) op(B) - beta c| for a sum of k terms.
double product_bound(double alpha, double S, double beta_c, double ref, int64_t k, double op_err) {
  return 1.01 * (std::fabs(alpha) * S * (op_err + double(k + 2) * kU * (1.0 + op_err)) + 2.0 * kU * std::fabs(beta_c) +
                 kU * std::fabs(ref)) +
         1e-37;
}

double operand_error(cudaDataType_t ab, cublasComputeType_t compute) {
  if (ab == CUDA_R_16BF) return 0.0;
  if (compute == CUBLAS_COMPUTE_32F_FAST_TF32) return kTf32Op;
  if (compute == CUBLAS_COMPUTE_32F_FAST_16BF) return kBf16Op;
  return 0.0;
}

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad_ref(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

// One plain product (DEFAULT epilogue) and what it is checked with.
struct Case {
  int64_t m = 1, n = 1, k = 1;
  bool ta = false, tb = false;
  bool row_a = false, row_b = false, row_d = false;
  int64_t pad = 0;
  int32_t batch = 1;
  float alpha = 1.0f, beta = 0.0f;
  bool in_place = false;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t ab = CUDA_R_32F, out = CUDA_R_32F;
  std::string name() const {
    return "m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) + (ta ? " A^T" : " A") +
           (tb ? " B^T" : " B") + " order " + (row_a ? "R" : "C") + (row_b ? "R" : "C") + (row_d ? "R" : "C") + " pad " +
           std::to_string(pad) + " batch " + std::to_string(batch) + " alpha " + std::to_string(alpha) + " beta " +
           std::to_string(beta) + (in_place ? " in place" : "") + " compute " + std::to_string(int(compute)) + " types " +
           std::to_string(int(ab)) + "/" + std::to_string(int(out));
  }
};

// Runs one case through the heuristic and cublasLtMatmul; returns the failures' count (the first
// reported through doctest).
int run_case(const Lt& lt, const Case& c, std::mt19937& rng) {
  HostMat A(c.ab, c.row_a, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.pad, c.batch);
  HostMat B(c.ab, c.row_b, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.pad, c.batch);
  HostMat C(c.out, c.row_d, c.m, c.n, c.in_place ? c.pad : c.pad + 2, c.batch);
  HostMat D(c.out, c.row_d, c.m, c.n, c.pad, c.batch);
  A.randomize(rng);
  B.randomize(rng);
  C.randomize(rng);
  std::fill(D.data.begin(), D.data.end(), 0xA5);
  if (c.in_place) D.data = C.data;
  const std::vector<unsigned char> before = D.data;
  DeviceBuffer dA(A.bytes()), dB(B.bytes()), dC(C.bytes()), dD(D.bytes());
  dA.upload(A.data.data(), A.bytes());
  dB.upload(B.data.data(), B.bytes());
  dC.upload(C.data.data(), C.bytes());
  dD.upload(D.data.data(), D.bytes());
  const void* c_ptr = c.in_place ? dD.p : dC.p;

  Desc desc(c.compute);
  desc.trans(c.ta, c.tb);
  Layout la(A), lb(B), lc(c.in_place ? D : C), ld(D);
  const uint32_t align[4] = {member_align(dA.p, A), member_align(dB.p, B), member_align(c_ptr, c.in_place ? D : C),
                             member_align(dD.p, D)};
  const cublasLtMatmulAlgo_t algo = algo_for(lt, desc, la, lb, lc, ld, align);
  const cublasStatus_t rc =
      cublasLtMatmul(lt.h, desc.d, &c.alpha, dA.p, la.l, dB.p, lb.l, &c.beta, c_ptr, lc.l, dD.p, ld.l, &algo, nullptr, 0, nullptr);
  INFO(c.name());
  INFO(ablate::emu::cublas_last_refusal());
  REQUIRE(rc == CUBLAS_STATUS_SUCCESS);
  dD.download(D.data.data(), D.bytes());

  int failures = 0;
  const double op_err = operand_error(c.ab, c.compute);
  HostMat in_place_c = D;  // in place, C's values are D's before the call
  in_place_c.data = before;
  const HostMat& cin = c.in_place ? in_place_c : C;
  for (int32_t bt = 0; bt < c.batch; ++bt) {
    const Reference r = reference(A, c.ta, B, c.tb, c.m, c.n, c.k, bt);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        const std::size_t ij = std::size_t(i * c.n + j);
        const double beta_c = c.beta != 0.0f ? double(c.beta) * cin.get(i, j, bt) : 0.0;
        const double want = double(c.alpha) * r.P[ij] + beta_c;
        double tol = product_bound(c.alpha, r.S[ij], beta_c, want, c.k, op_err);
        if (c.out == CUDA_R_16BF) tol += kBf16U * (std::fabs(want) + tol);
        const double got = D.get(i, j, bt);
        if (!(std::fabs(got - want) <= tol)) {
          if (failures++ == 0) {
            FAIL_CHECK("D(" << i << ", " << j << ") of batch member " << bt << " is " << got << ", want " << want << " within "
                            << tol);
          }
        }
      }
    }
  }
  // Nothing written outside the matrices (padding, gaps between batch members).
  const std::vector<char> inside = D.mask();
  for (std::size_t e = 0; e < inside.size(); ++e) {
    if (inside[e] == 0 && std::memcmp(&D.data[e * D.esize()], &before[e * D.esize()], D.esize()) != 0) {
      if (failures++ == 0) FAIL_CHECK("element " << e << " of D's storage outside the matrices was written");
    }
  }
  return failures;
}

const int64_t kSizes[] = {1, 7, 33, 65};

}  // namespace

TEST_CASE("cublasLtMatmul f32: every transpose, order, leading dimension, batch and scale against float64") {
  Lt lt;
  std::mt19937 rng(20260101);
  int cases = 0, failed = 0;
  const float scales[3][2] = {{1.0f, 0.0f}, {0.75f, -1.25f}, {-0.5f, 0.5f}};
  for (int64_t m : kSizes) {
    for (int64_t n : kSizes) {
      for (int64_t k : kSizes) {
        for (int t = 0; t < 4; ++t) {
          for (int order = 0; order < 4; ++order) {
            for (int shape = 0; shape < 4; ++shape) {
              Case c;
              c.m = m;
              c.n = n;
              c.k = k;
              c.ta = (t & 1) != 0;
              c.tb = (t & 2) != 0;
              // all column-major, all row-major, and mixed
              c.row_a = order == 1 || order == 2;
              c.row_b = order == 1 || order == 3;
              c.row_d = order == 1 || order == 3;
              c.pad = (shape & 1) != 0 ? 3 : 0;
              c.batch = (shape & 2) != 0 ? 3 : 1;
              const int s = cases % 3;
              c.alpha = scales[s][0];
              c.beta = scales[s][1];
              c.in_place = s == 2;  // beta != 0 with C == D, as with C != D (s == 1)
              failed += run_case(lt, c, rng) > 0 ? 1 : 0;
              ++cases;
            }
          }
        }
      }
    }
  }
  CHECK(cases == 4096);
  CHECK(failed == 0);
}

TEST_CASE("cublasLtMatmul with TF32 and bf16 rounding of f32 operands, bf16 operands and bf16 output") {
  Lt lt;
  std::mt19937 rng(20260102);
  struct Mode {
    cublasComputeType_t compute;
    cudaDataType_t ab, out;
  };
  const Mode modes[] = {{CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F},
                        {CUBLAS_COMPUTE_32F_FAST_16BF, CUDA_R_32F, CUDA_R_32F},
                        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_32F},
                        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF}};
  int cases = 0, failed = 0;
  for (const Mode& mode : modes) {
    for (int64_t m : kSizes) {
      for (int64_t n : kSizes) {
        for (int64_t k : kSizes) {
          for (int t = 0; t < 4; ++t) {
            Case c;
            c.compute = mode.compute;
            c.ab = mode.ab;
            c.out = mode.out;
            c.m = m;
            c.n = n;
            c.k = k;
            c.ta = (t & 1) != 0;
            c.tb = (t & 2) != 0;
            const int v = cases % 8;
            c.row_a = v == 1 || v == 5;
            c.row_b = v == 1 || v == 6;
            c.row_d = v == 1 || v == 7;
            c.pad = v % 2 == 0 ? 5 : 0;
            c.batch = v >= 4 ? 3 : 1;
            c.alpha = v % 3 == 0 ? 1.0f : 0.625f;
            c.beta = v % 3 == 2 ? 1.5f : 0.0f;
            c.in_place = v == 5;
            failed += run_case(lt, c, rng) > 0 ? 1 : 0;
            ++cases;
          }
        }
      }
    }
  }
  CHECK(failed == 0);
}

TEST_CASE("an empty sum (k = 0) leaves beta C") {
  Lt lt;
  std::mt19937 rng(7);
  const float alpha = 2.0f, beta = 0.5f;
  HostMat C(CUDA_R_32F, false, 5, 3, 0, 1), D(CUDA_R_32F, false, 5, 3, 0, 1);
  C.randomize(rng);
  DeviceBuffer dA(64), dB(64), dC(C.bytes()), dD(D.bytes());
  dC.upload(C.data.data(), C.bytes());
  Desc desc(CUBLAS_COMPUTE_32F);
  Layout la(CUDA_R_32F, 5, 0, 5), lb(CUDA_R_32F, 0, 3, 1), lc(C), ld(D);
  const uint32_t align[4] = {256, 256, 256, 256};
  const cublasLtMatmulAlgo_t algo = algo_for(lt, desc, la, lb, lc, ld, align);
  REQUIRE(cublasLtMatmul(lt.h, desc.d, &alpha, dA.p, la.l, dB.p, lb.l, &beta, dC.p, lc.l, dD.p, ld.l, &algo, nullptr, 0, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
  dD.download(D.data.data(), D.bytes());
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t j = 0; j < 3; ++j) CHECK(D.get(i, j, 0) == 0.5 * C.get(i, j, 0));  // 2 * 0 + 0.5 c, exact
  }
}

namespace {

// One product with a fused epilogue, checked element by element (D, the GELU matrix, the bias
// gradient) against float64.
struct EpiCase {
  cublasLtEpilogue_t epi;
  int64_t m, n, k;
  bool ta, tb;
  cublasComputeType_t compute;
  cudaDataType_t ab, out;
  float alpha, beta;
};

int run_epilogue(const Lt& lt, const EpiCase& c, std::mt19937& rng) {
  const bool bias_in =
      c.epi == CUBLASLT_EPILOGUE_BIAS || c.epi == CUBLASLT_EPILOGUE_GELU_BIAS || c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu = c.epi == CUBLASLT_EPILOGUE_GELU || c.epi == CUBLASLT_EPILOGUE_GELU_AUX || c.epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                    c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool aux_out = c.epi == CUBLASLT_EPILOGUE_GELU_AUX || c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = c.epi == CUBLASLT_EPILOGUE_DGELU || c.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  const bool grad_d = c.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD, grad_a = c.epi == CUBLASLT_EPILOGUE_BGRADA,
             grad_b = c.epi == CUBLASLT_EPILOGUE_BGRADB;
  const int64_t m = c.m, n = c.n, k = c.k;
  const int64_t bias_len = grad_b ? n : m;
  const int64_t aux_ld = (m + 7) / 8 * 8 + 8;  // a multiple of 8, past the rows

  HostMat A(c.ab, false, c.ta ? k : m, c.ta ? m : k, 1, 1);
  HostMat B(c.ab, false, c.tb ? n : k, c.tb ? k : n, 2, 1);
  HostMat C(c.out, false, m, n, 0, 1), D(c.out, false, m, n, 0, 1);
  HostMat bias(c.out, false, bias_len + 8, 1, 0, 1);  // 8 elements past the vector: not written
  HostMat aux(c.out, false, aux_ld, n, 0, 1);
  A.randomize(rng);
  B.randomize(rng);
  C.randomize(rng);
  std::fill(D.data.begin(), D.data.end(), 0xA5);
  std::fill(bias.data.begin(), bias.data.end(), 0xA5);
  if (bias_in) bias.randomize(rng);
  std::fill(aux.data.begin(), aux.data.end(), 0xA5);
  if (dgelu) {
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) aux.put(aux.index(i, j, 0), u(rng));
    }
  }
  const std::vector<unsigned char> bias_before = bias.data, aux_before = aux.data;
  DeviceBuffer dA(A.bytes()), dB(B.bytes()), dC(C.bytes()), dD(D.bytes()), dBias(bias.bytes()), dAux(aux.bytes());
  dA.upload(A.data.data(), A.bytes());
  dB.upload(B.data.data(), B.bytes());
  dC.upload(C.data.data(), C.bytes());
  dD.upload(D.data.data(), D.bytes());
  dBias.upload(bias.data.data(), bias.bytes());
  dAux.upload(aux.data.data(), aux.bytes());

  Desc desc(c.compute);
  desc.trans(c.ta, c.tb);
  desc.epilogue(c.epi);
  if (bias_in || grad_d || grad_a || grad_b) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(c.out));
    desc.bias(dBias.p);
  }
  if (aux_out || dgelu) desc.aux(dAux.p, aux_ld);
  Layout la(A), lb(B), lc(C), ld(D);
  const uint32_t align[4] = {align_of(dA.p), align_of(dB.p), align_of(dC.p), align_of(dD.p)};
  const cublasLtMatmulAlgo_t algo = algo_for(lt, desc, la, lb, lc, ld, align);
  const cublasStatus_t rc =
      cublasLtMatmul(lt.h, desc.d, &c.alpha, dA.p, la.l, dB.p, lb.l, &c.beta, dC.p, lc.l, dD.p, ld.l, &algo, nullptr, 0, nullptr);
  INFO("epilogue " << int(c.epi) << " m " << m << " n " << n << " k " << k << (c.ta ? " A^T" : " A") << (c.tb ? " B^T" : " B")
                   << " compute " << int(c.compute) << " types " << int(c.ab) << "/" << int(c.out) << " alpha " << c.alpha << " beta "
                   << c.beta);
  INFO(ablate::emu::cublas_last_refusal());
  REQUIRE(rc == CUBLAS_STATUS_SUCCESS);
  dD.download(D.data.data(), D.bytes());
  dBias.download(bias.data.data(), bias.bytes());
  dAux.download(aux.data.data(), aux.bytes());

  int failures = 0;
  const auto fail = [&](const std::string& what, double got, double want, double tol) {
    if (failures++ == 0) FAIL_CHECK(what << " is " << got << ", want " << want << " within " << tol);
  };
  const bool bf16_out = c.out == CUDA_R_16BF;
  const auto out_round = [&](double want, double tol) { return bf16_out ? tol + kBf16U * (std::fabs(want) + tol) : tol; };
  const double op_err = operand_error(c.ab, c.compute);
  const Reference r = reference(A, c.ta, B, c.tb, m, n, k, 0);
  std::vector<double> row_sum(std::size_t(m), 0.0), row_tol(std::size_t(m), 0.0), row_abs(std::size_t(m), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const std::size_t ij = std::size_t(i * n + j);
      const double beta_c = c.beta != 0.0f ? double(c.beta) * C.get(i, j, 0) : 0.0;
      double pre = double(c.alpha) * r.P[ij] + beta_c;
      double tol_pre = product_bound(c.alpha, r.S[ij], beta_c, pre, k, op_err);
      if (bias_in) {
        const double bv = bias.get(i, 0, 0);
        pre += bv;
        tol_pre += kU * (std::fabs(pre) + std::fabs(bv));
      }
      double want = pre, tol = tol_pre;
      if (gelu) {
        want = gelu_ref(pre);
        tol = 1.2 * std::fabs(gelu_grad_ref(pre)) * tol_pre + 16.0 * kU * (std::fabs(pre) + std::fabs(want)) + 1e-37;
      }
      if (dgelu) {
        const double g = gelu_grad_ref(aux.get(i, j, 0));
        want = pre * g;
        tol = std::fabs(g) * tol_pre + 64.0 * kU * std::fabs(pre) + kU * std::fabs(want) + 1e-37;
      }
      row_sum[std::size_t(i)] += want;
      row_tol[std::size_t(i)] += tol;
      row_abs[std::size_t(i)] += std::fabs(want);
      const double got = D.get(i, j, 0), tol_out = out_round(want, tol);
      if (!(std::fabs(got - want) <= tol_out)) fail("D(" + std::to_string(i) + ", " + std::to_string(j) + ")", got, want, tol_out);
      if (aux_out) {
        const double a = aux.get(i, j, 0), tol_aux = out_round(pre, tol_pre);
        if (!(std::fabs(a - pre) <= tol_aux)) fail("aux(" + std::to_string(i) + ", " + std::to_string(j) + ")", a, pre, tol_aux);
      }
    }
  }
  // The GELU matrix: written at its leading dimension (its rows past m untouched), or only read.
  const std::size_t es = aux.esize();
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < aux_ld; ++i) {
      const std::size_t e = aux.index(i, j, 0);
      if ((aux_out && i < m) || std::memcmp(&aux.data[e * es], &aux_before[e * es], es) == 0) continue;
      if (failures++ == 0) FAIL_CHECK("aux element (" << i << ", " << j << ") was written");
    }
  }
  // The bias gradient (or the bias, unchanged); nothing written past the vector.
  for (int64_t i = 0; i < bias_len + 8; ++i) {
    const std::size_t e = std::size_t(i);
    const bool written = i < bias_len && (grad_d || grad_a || grad_b);
    if (!written) {
      if (std::memcmp(&bias.data[e * es], &bias_before[e * es], es) != 0 && failures++ == 0) {
        FAIL_CHECK("bias element " << i << " was written");
      }
      continue;
    }
    double want = 0.0, tol = 0.0;
    if (grad_d) {
      want = row_sum[e];
      tol = row_tol[e] + double(n + 1) * kU * row_abs[e] + 1e-37;
    } else {
      double abs = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double v = grad_a ? r.a[std::size_t(i * k + p)] : r.b[std::size_t(p * n + i)];
        want += v;
        abs += std::fabs(v);
      }
      tol = (op_err / 2 + double(k + 1) * kU) * abs + 1e-37;
    }
    const double got = bias.get(i, 0, 0), tol_out = out_round(want, tol);
    if (!(std::fabs(got - want) <= tol_out)) fail("bias gradient " + std::to_string(i), got, want, tol_out);
  }
  return failures;
}

}  // namespace

TEST_CASE("cublasLtMatmul epilogues: bias, GELU (tanh) with its matrix, GELU gradient, bias gradients") {
  Lt lt;
  std::mt19937 rng(20260103);
  const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_BIAS,        CUBLASLT_EPILOGUE_GELU,          CUBLASLT_EPILOGUE_GELU_AUX,
                                     CUBLASLT_EPILOGUE_GELU_BIAS,   CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,
                                     CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,        CUBLASLT_EPILOGUE_BGRADB};
  struct Mode {
    cublasComputeType_t compute;
    cudaDataType_t ab, out;
  };
  const Mode modes[] = {{CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F},
                        {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F},
                        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_32F},
                        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF}};
  const int64_t shapes[][3] = {{7, 33, 65}, {33, 7, 1}, {65, 65, 33}, {1, 1, 7}, {16, 24, 40}};
  int cases = 0, failed = 0;
  for (cublasLtEpilogue_t epi : epis) {
    for (const Mode& mode : modes) {
      for (const auto& s : shapes) {
        for (int t = 0; t < 4; ++t) {
          const bool scaled = cases % 2 == 1;
          const EpiCase c{epi,
                          s[0],
                          s[1],
                          s[2],
                          (t & 1) != 0,
                          (t & 2) != 0,
                          mode.compute,
                          mode.ab,
                          mode.out,
                          scaled ? 0.5f : 1.0f,
                          scaled ? 1.5f : 0.0f};
          failed += run_epilogue(lt, c, rng) > 0 ? 1 : 0;
          ++cases;
        }
      }
    }
  }
  CHECK(cases == 720);
  CHECK(failed == 0);
}

namespace {

// D = A B for k = a.size(), as cublasLtMatmul computes it (null algo: the implicit heuristic), for
// f32 or bf16 operands given as floats: A of `rows` equal rows, D of `rows` equal values (one
// returned).
float tiny_product(const Lt& lt, cublasComputeType_t compute, cudaDataType_t ab, cudaDataType_t out, const std::vector<float>& a,
                   const std::vector<float>& b, int64_t rows = 1) {
  const int64_t k = int64_t(a.size());
  HostMat A(ab, false, rows, k, 0, 1), B(ab, false, k, 1, 0, 1), D(out, false, rows, 1, 0, 1);
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t i = 0; i < rows; ++i) A.put(A.index(i, p, 0), a[std::size_t(p)]);
    B.put(B.index(p, 0, 0), b[std::size_t(p)]);
  }
  DeviceBuffer dA(A.bytes()), dB(B.bytes()), dD(D.bytes());
  dA.upload(A.data.data(), A.bytes());
  dB.upload(B.data.data(), B.bytes());
  Desc desc(compute);
  Layout la(A), lb(B), ld(D);
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t rc =
      cublasLtMatmul(lt.h, desc.d, &one, dA.p, la.l, dB.p, lb.l, &zero, dD.p, ld.l, dD.p, ld.l, nullptr, nullptr, 0, nullptr);
  INFO(ablate::emu::cublas_last_refusal());
  REQUIRE(rc == CUBLAS_STATUS_SUCCESS);
  dD.download(D.data.data(), D.bytes());
  for (int64_t i = 1; i < rows; ++i) CHECK(D.get(i, 0, 0) == D.get(0, 0, 0));
  return float(D.get(0, 0, 0));
}

}  // namespace

TEST_CASE("operand rounding: TF32 to nearest with ties away from zero, bf16 to nearest even") {
  Lt lt;
  const float e = 1.0f;
  const auto p2 = [](int x) { return std::ldexp(1.0f, x); };
  struct Round {
    cublasComputeType_t compute;
    float in, want;
  };
  const Round cases[] = {
      {CUBLAS_COMPUTE_32F_FAST_TF32, e + p2(-11), e + p2(-10)},            // a tie: away from zero (not to even)
      {CUBLAS_COMPUTE_32F_FAST_TF32, -(e + p2(-11)), -(e + p2(-10))},      // ... for negatives too
      {CUBLAS_COMPUTE_32F_FAST_TF32, e + p2(-10) + p2(-11), e + p2(-9)},   // a tie from an odd last bit
      {CUBLAS_COMPUTE_32F_FAST_TF32, e + p2(-11) - p2(-23), e},            // just below the tie: down
      {CUBLAS_COMPUTE_32F_FAST_TF32, e + p2(-11) + p2(-23), e + p2(-10)},  // just above: up
      {CUBLAS_COMPUTE_32F_FAST_TF32, 3.0f * (e + p2(-12)), 3.0f},          // below the tie: down
      {CUBLAS_COMPUTE_32F_FAST_16BF, e + p2(-8), e},                       // a tie: to even (down)
      {CUBLAS_COMPUTE_32F_FAST_16BF, e + p2(-7) + p2(-8), e + p2(-6)},     // a tie: to even (up)
      {CUBLAS_COMPUTE_32F_FAST_16BF, -(e + p2(-8)), -e},                   // a negative tie
      {CUBLAS_COMPUTE_32F_FAST_16BF, e + p2(-8) + p2(-23), e + p2(-7)},    // just above the tie: up
      {CUBLAS_COMPUTE_32F, e + p2(-11) + p2(-23), e + p2(-11) + p2(-23)},  // true fp32: as given
  };
  for (const Round& c : cases) {
    INFO("compute " << int(c.compute) << " operand " << c.in);
    // The value as A's element, then as B's: each operand is rounded.
    CHECK(tiny_product(lt, c.compute, CUDA_R_32F, CUDA_R_32F, {c.in}, {1.0f}) == c.want);
    CHECK(tiny_product(lt, c.compute, CUDA_R_32F, CUDA_R_32F, {1.0f}, {c.in}) == c.want);
  }
  // A TF32 product is exact in fp32: (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20.
  CHECK(tiny_product(lt, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F, {e + p2(-10)}, {e + p2(-10)}) == e + p2(-9) + p2(-20));
  // bf16 outputs: the fp32 sum rounded to nearest even.
  CHECK(tiny_product(lt, CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, {1.0f, p2(-8)}, {1.0f, 1.0f}) == e);
  CHECK(tiny_product(lt, CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, {1.0f, p2(-7), p2(-8)}, {1.0f, 1.0f, 1.0f}) == e + p2(-6));
  CHECK(tiny_product(lt, CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, {1.0f, p2(-8), p2(-20)}, {1.0f, 1.0f, 1.0f}) == e + p2(-7));
  // The sum is fp32, in order: 1 + 2^-24 + 2^-24 rounds to 1 twice (a float64 sum would not), for
  // one row and for rows computed eight at a time.
  for (int64_t rows : {1, 19}) {
    CHECK(tiny_product(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, {1.0f, p2(-24), p2(-24)}, {1.0f, 1.0f, 1.0f}, rows) == e);
    CHECK(tiny_product(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, {p2(-24), p2(-24), 1.0f}, {1.0f, 1.0f, 1.0f}, rows) ==
          e + p2(-23));
  }
}

namespace {

// A small column-major f32 problem, D (m x n) = A (m x k) B (k x n), for the refusals: each check
// changes one thing and expects the status, D left as it was.
struct Small {
  static constexpr int64_t m = 16, n = 8, k = 4;
  Lt lt;
  DeviceBuffer a{m * k * 4 + 256}, b{k * n * 4 + 256}, d{m * n * 4 + 256}, bias{256 + 64}, aux{m * n * 4 + 256}, ws{4096};
  std::vector<float> host_a = std::vector<float>(std::size_t(m * k), 0.5f);
  float alpha = 1.0f, beta = 0.0f;
  Small() {
    std::vector<float> ones(std::size_t(m * k + 64), 0.25f), fill(std::size_t(m * n + 64), -7.0f);
    a.upload(ones.data(), a.bytes);
    b.upload(ones.data(), std::size_t(k * n * 4 + 256));
    d.upload(fill.data(), d.bytes);
    bias.upload(ones.data(), bias.bytes);
    aux.upload(fill.data(), aux.bytes);
  }
  // True when D still holds what the constructor put there.
  bool d_untouched() const {
    std::vector<float> h(std::size_t(m * n));
    d.download(h.data(), h.size() * 4);
    return std::all_of(h.begin(), h.end(), [](float v) { return v == -7.0f; });
  }
  cublasStatus_t heuristic(const Desc& desc, const Layout& la, const Layout& lb, const Layout& lc, const Layout& ld, const Pref& pref,
                           int* found, cublasLtMatmulAlgo_t* algo = nullptr) {
    cublasLtMatmulHeuristicResult_t r{};
    *found = -1;
    const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, 1, &r, found);
    if (algo != nullptr) *algo = r.algo;
    return rc;
  }
  cublasStatus_t run(const Desc& desc, const void* A, const Layout& la, const void* B, const Layout& lb, void* D, const Layout& ld,
                     const cublasLtMatmulAlgo_t* algo, cudaStream_t stream = nullptr) {
    return cublasLtMatmul(lt.h, desc.d, &alpha, A, la.l, B, lb.l, &beta, D, ld.l, D, ld.l, algo, ws.p, ws.bytes, stream);
  }
};

}  // namespace

TEST_CASE("refusals: what cuBLASLt turns down is turned down, and nothing is written") {
  Small s;
  const int64_t m = Small::m, n = Small::n, k = Small::k;
  Desc plain(CUBLAS_COMPUTE_32F);
  Layout la(CUDA_R_32F, m, k, m), lb(CUDA_R_32F, k, n, k), ld(CUDA_R_32F, m, n, m);
  Pref pref;
  int found = -1;
  cublasLtMatmulAlgo_t algo{};
  REQUIRE(s.heuristic(plain, la, lb, ld, ld, pref, &found, &algo) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == 1);

  SUBCASE("a fused epilogue's bias not 16-byte aligned: no algorithm, and NOT_SUPPORTED at run time") {
    Desc desc(CUBLAS_COMPUTE_32F);
    desc.epilogue(CUBLASLT_EPILOGUE_BIAS);
    desc.bias(s.bias.at(4));
    CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(found == 0);
    desc.bias(s.bias.at(0));
    REQUIRE(s.heuristic(desc, la, lb, ld, ld, pref, &found, &algo) == CUBLAS_STATUS_SUCCESS);
    desc.bias(s.bias.at(4));
    CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    desc.bias(s.bias.at(8));  // 8 bytes: still short of 16
    CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.d_untouched());
    desc.bias(s.bias.at(16));
    CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_SUCCESS);
  }
  SUBCASE("a GELU matrix not 16-byte aligned, or its leading dimension not a multiple of 8") {
    for (cublasLtEpilogue_t e :
         {CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD}) {
      Desc desc(CUBLAS_COMPUTE_32F);
      desc.epilogue(e);
      desc.bias(s.bias.p);
      desc.aux(s.aux.at(8), m);
      CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(found == 0);
      desc.aux(s.aux.p, m);
      REQUIRE(s.heuristic(desc, la, lb, ld, ld, pref, &found, &algo) == CUBLAS_STATUS_SUCCESS);
      desc.aux(s.aux.at(4), m);
      CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
      desc.aux(s.aux.p, m + 4);  // not a multiple of 8
      CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
      desc.aux(s.aux.p, m - 8);  // below D's rows
      CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
      CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_INVALID_VALUE);
      desc.aux(nullptr, m);  // the heuristic reads only its alignment; the product needs it
      CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_SUCCESS);
      CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_INVALID_VALUE);
    }
    CHECK(s.d_untouched());
  }
  SUBCASE("epilogues not served: ReLU, batched, row order, a bias of another type than D") {
    for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_DRELU_BGRAD}) {
      Desc desc(CUBLAS_COMPUTE_32F);
      desc.epilogue(e);
      CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    Desc desc(CUBLAS_COMPUTE_32F);
    desc.epilogue(CUBLASLT_EPILOGUE_BIAS);
    desc.bias(s.bias.p);
    Layout ba(CUDA_R_32F, m, k, m), bb(CUDA_R_32F, k, n, k), bd(CUDA_R_32F, m, n, m);
    for (Layout* l : {&ba, &bb, &bd}) {
      l->set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(2));
      l->set(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(0));
    }
    CHECK(s.heuristic(desc, ba, bb, bd, bd, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    Layout rd(CUDA_R_32F, m, n, n);
    rd.set(CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t(CUBLASLT_ORDER_ROW));
    CHECK(s.heuristic(desc, la, lb, rd, rd, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_16BF));
    CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.d_untouched());
  }
  SUBCASE("types and compute types not served") {
    Layout h16(CUDA_R_16F, m, k, m), d64(CUDA_R_64F, m, n, m), bf_b(CUDA_R_16BF, k, n, k), bf_d(CUDA_R_16BF, m, n, m);
    Layout bf_a(CUDA_R_16BF, m, k, m);
    CHECK(s.heuristic(plain, h16, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(found == 0);
    CHECK(s.heuristic(plain, la, lb, d64, d64, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.heuristic(plain, la, bf_b, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);    // f32 with bf16
    CHECK(s.heuristic(plain, la, lb, bf_d, bf_d, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);  // f32 into bf16
    CHECK(s.heuristic(plain, la, lb, bf_d, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);    // C and D apart
    Desc tf32(CUBLAS_COMPUTE_32F_FAST_TF32);
    CHECK(s.heuristic(tf32, bf_a, bf_b, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);  // bf16 under TF32
    for (cublasComputeType_t ct : {CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_16F}) {
      Desc desc(ct);
      CHECK(s.heuristic(desc, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    Desc scale64(CUBLAS_COMPUTE_32F, CUDA_R_64F);
    CHECK(s.heuristic(scale64, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    Desc dev(CUBLAS_COMPUTE_32F);
    dev.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t(CUBLASLT_POINTER_MODE_DEVICE));
    CHECK(s.heuristic(dev, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    Layout col32(CUDA_R_32F, m, n, m);
    col32.set(CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t(CUBLASLT_ORDER_COL32));
    CHECK(s.heuristic(plain, la, lb, col32, col32, pref, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.d_untouched());
  }
  SUBCASE("attributes not served, and values of the wrong size") {
    const int32_t zero32 = 0;
    const int64_t zero64 = 0;
    const void* null = nullptr;
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_FILL_MODE, &zero32, 4) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &zero32, 4) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, &null, sizeof null) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, &null, sizeof null) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, &zero64, 8) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatrixLayoutSetAttribute(ld.l, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, &zero64, 8) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatrixLayoutSetAttribute(ld.l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &zero32, 4) == CUBLAS_STATUS_NOT_SUPPORTED);
    const float waves = 1.0f;
    const uint64_t mask = ~uint64_t(0);
    const uint32_t limited = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, &waves, 4) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_IMPL_MASK, &mask, 8) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &limited, 4) == CUBLAS_STATUS_NOT_SUPPORTED);
    // Sizes: TRANSA is an int32_t, LD an int64_t, MAX_WORKSPACE_BYTES a uint64_t.
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_TRANSA, &zero64, 8) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(plain.d, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutSetAttribute(ld.l, CUBLASLT_MATRIX_LAYOUT_LD, &zero32, 4) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &zero32, 4) ==
          CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("host pointers and ranges outside device allocations: INVALID_VALUE") {
    CHECK(s.run(plain, s.host_a.data(), la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_INVALID_VALUE);
    std::vector<float> host_d(std::size_t(m * n));
    CHECK(s.run(plain, s.a.p, la, s.b.p, lb, host_d.data(), ld, &algo) == CUBLAS_STATUS_INVALID_VALUE);
    // A range running past its allocation's end.
    CHECK(s.run(plain, s.a.at(s.a.bytes - 64), la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_INVALID_VALUE);
    {
      void* freed = nullptr;
      REQUIRE(cudaMalloc(&freed, std::size_t(m * k * 4)) == cudaSuccess);
      REQUIRE(cudaFree(freed) == cudaSuccess);
      CHECK(s.run(plain, freed, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_INVALID_VALUE);
    }
    // A bias on the host; alpha in device memory (pointer mode host).
    Desc desc(CUBLAS_COMPUTE_32F);
    desc.epilogue(CUBLASLT_EPILOGUE_BIAS);
    alignas(16) static float host_bias[Small::m] = {};
    desc.bias(host_bias);
    CHECK(s.run(desc, s.a.p, la, s.b.p, lb, s.d.p, ld, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(s.lt.h, plain.d, s.bias.p, s.a.p, la.l, s.b.p, lb.l, &s.beta, s.d.p, ld.l, s.d.p, ld.l, &algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    // A workspace that is not device memory.
    std::vector<char> host_ws(1024);
    CHECK(cublasLtMatmul(s.lt.h, plain.d, &s.alpha, s.a.p, la.l, s.b.p, lb.l, &s.beta, s.d.p, ld.l, s.d.p, ld.l, &algo, host_ws.data(),
                         host_ws.size(), nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    // A pointer not aligned to its elements.
    CHECK(s.run(plain, s.a.at(2), la, s.b.p, lb, s.d.p, ld, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(s.d_untouched());
  }
  SUBCASE("leading dimensions, dimensions and batch counts that do not fit: INVALID_VALUE") {
    Layout short_ld(CUDA_R_32F, m, k, m - 1);
    CHECK(s.heuristic(plain, short_ld, lb, ld, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(found == 0);
    CHECK(s.run(plain, s.a.p, short_ld, s.b.p, lb, s.d.p, ld, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    Layout row_short(CUDA_R_32F, m, k, k - 1);
    row_short.set(CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t(CUBLASLT_ORDER_ROW));
    CHECK(s.heuristic(plain, row_short, lb, ld, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
    Layout wrong_k(CUDA_R_32F, k + 1, n, k + 1);
    CHECK(s.heuristic(plain, la, wrong_k, ld, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
    Layout wrong_c(CUDA_R_32F, m, n + 1, m);
    CHECK(s.heuristic(plain, la, lb, wrong_c, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
    Layout batched(CUDA_R_32F, m, k, m);
    batched.set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(2));
    CHECK(s.heuristic(plain, batched, lb, ld, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
    Desc trans(CUBLAS_COMPUTE_32F);
    trans.trans(true, false);  // op(A) = A^T is k x m: does not fit D's m rows
    CHECK(s.heuristic(trans, la, lb, ld, ld, pref, &found) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(s.d_untouched());
  }
  SUBCASE("the heuristic: alignments no algorithm serves, and its own arguments") {
    Pref low;
    low.align(2, 256, 256, 256);  // f32 elements are 4 bytes
    CHECK(s.heuristic(plain, la, lb, ld, ld, low, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(found == 0);
    Pref low_d;
    low_d.align(256, 256, 256, 1);
    CHECK(s.heuristic(plain, la, lb, ld, ld, low_d, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    Pref bf_ok;
    bf_ok.align(2, 2, 4, 4);  // bf16 operands aligned to their elements: served
    Layout bf_a(CUDA_R_16BF, m, k, m), bf_b(CUDA_R_16BF, k, n, k);
    CHECK(s.heuristic(plain, bf_a, bf_b, ld, ld, bf_ok, &found) == CUBLAS_STATUS_SUCCESS);
    CHECK(found == 1);
    cublasLtMatmulHeuristicResult_t r{};
    CHECK(cublasLtMatmulAlgoGetHeuristic(s.lt.h, plain.d, la.l, lb.l, ld.l, ld.l, pref.p, 0, &r, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulAlgoGetHeuristic(nullptr, plain.d, la.l, lb.l, ld.l, ld.l, pref.p, 1, &r, &found) ==
          CUBLAS_STATUS_NOT_INITIALIZED);
  }
  SUBCASE("a pointer less aligned than the algorithm assumes: NOT_SUPPORTED; one found for it: served") {
    Pref p16;
    p16.align(16, 16, 16, 16);
    REQUIRE(s.heuristic(plain, la, lb, ld, ld, p16, &found, &algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(s.run(plain, s.a.at(4), la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.run(plain, s.a.p, la, s.b.p, lb, s.d.at(8), ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(s.d_untouched());
    Pref p4;
    p4.align(4, 16, 16, 16);
    REQUIRE(s.heuristic(plain, la, lb, ld, ld, p4, &found, &algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(s.run(plain, s.a.at(4), la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_SUCCESS);
    // The default preference (256 bytes) asks for an algorithm's full alignment (16 bytes).
    REQUIRE(s.heuristic(plain, la, lb, ld, ld, pref, &found, &algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(s.run(plain, s.a.at(16), la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_SUCCESS);
  }
  SUBCASE("an algorithm the heuristic did not give, or gave for another epilogue; a destroyed stream") {
    const cublasLtMatmulAlgo_t zero{};
    CHECK(s.run(plain, s.a.p, la, s.b.p, lb, s.d.p, ld, &zero) == CUBLAS_STATUS_INVALID_VALUE);
    Desc gelu(CUBLAS_COMPUTE_32F);
    gelu.epilogue(CUBLASLT_EPILOGUE_GELU);
    CHECK(s.run(gelu, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    cudaStream_t st = nullptr;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
    CHECK(s.run(plain, s.a.p, la, s.b.p, lb, s.d.p, ld, &algo, st) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(nullptr, plain.d, &s.alpha, s.a.p, la.l, s.b.p, lb.l, &s.beta, s.d.p, ld.l, s.d.p, ld.l, &algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(s.d_untouched());
  }
}

TEST_CASE("descriptor attributes read back as set") {
  Desc desc(CUBLAS_COMPUTE_32F_FAST_TF32);
  int32_t v32 = 0;
  std::size_t written = 0;
  REQUIRE(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &v32, 4, &written) == CUBLAS_STATUS_SUCCESS);
  CHECK(v32 == CUBLAS_COMPUTE_32F_FAST_TF32);
  CHECK(written == 4);
  desc.epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  uint32_t epi = 0;
  REQUIRE(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, 4, nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  desc.aux(reinterpret_cast<void*>(uintptr_t(0x1000)), 24);
  int64_t aux_ld = 0;
  REQUIRE(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, 8, nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(aux_ld == 24);
  // sizeInBytes 0: the size it needs.
  REQUIRE(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, nullptr, 0, &written) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(written == sizeof(void*));
  CHECK(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, nullptr, 0, nullptr) ==
        CUBLAS_STATUS_INVALID_VALUE);
  Layout l(CUDA_R_16BF, 5, 6, 7);
  l.set(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(99));
  uint64_t rows = 0;
  int64_t stride = 0;
  uint32_t type = 0;
  REQUIRE(cublasLtMatrixLayoutGetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, 8, nullptr) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutGetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, 8, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutGetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, 4, nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(rows == 5);
  CHECK(stride == 99);
  CHECK(type == CUDA_R_16BF);
  Pref pref;
  uint32_t al = 0;
  REQUIRE(cublasLtMatmulPreferenceGetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, 4, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(al == 256);  // the default
}

TEST_CASE("status names and strings are cuBLAS's") {
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE)) == "CUBLAS_STATUS_INVALID_VALUE");
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_SUCCESS)) == "CUBLAS_STATUS_SUCCESS");
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED)) == "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(std::string(cublasLtGetStatusName(cublasStatus_t(12345))) == "<unknown>");
  for (cublasStatus_t st :
       {CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_ALLOC_FAILED, CUBLAS_STATUS_INVALID_VALUE,
        CUBLAS_STATUS_ARCH_MISMATCH, CUBLAS_STATUS_MAPPING_ERROR, CUBLAS_STATUS_EXECUTION_FAILED, CUBLAS_STATUS_INTERNAL_ERROR,
        CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_LICENSE_ERROR}) {
    CHECK(std::string(cublasGetStatusName(st)).rfind("CUBLAS_STATUS_", 0) == 0);
    CHECK(std::string(cublasLtGetStatusString(st)) == cublasGetStatusString(st));
    CHECK(!std::string(cublasGetStatusString(st)).empty());
  }
  CHECK(int(CUBLAS_STATUS_NOT_SUPPORTED) == 15);
  CHECK(int(CUBLAS_STATUS_INVALID_VALUE) == 7);
  CHECK(int(CUBLASLT_EPILOGUE_DGELU_BGRAD) == 208);
  CHECK(int(CUBLASLT_EPILOGUE_GELU_AUX_BIAS) == 164);
  CHECK(int(CUBLAS_COMPUTE_32F_FAST_TF32) == 77);
  CHECK(int(CUDA_R_16BF) == 14);
}

namespace {

struct Blas {
  cublasHandle_t h = nullptr;
  Blas() { REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS); }
  ~Blas() { cublasDestroy(h); }
};

// Column-major f32 reference of one member: alpha op(A) op(B) + beta C, with its bound.
void check_member(const std::vector<float>& a, int lda, bool ta, const std::vector<float>& b, int ldb, bool tb,
                  const std::vector<float>& c_before, const std::vector<float>& c_after, int ldc, int m, int n, int k, float alpha,
                  float beta, double op_err, int* failures) {
  HostMat A(CUDA_R_32F, false, ta ? k : m, ta ? m : k, 0, 1), B(CUDA_R_32F, false, tb ? n : k, tb ? k : n, 0, 1);
  A.ld = lda;
  B.ld = ldb;
  A.data.resize(a.size() * 4);
  B.data.resize(b.size() * 4);
  std::memcpy(A.data.data(), a.data(), a.size() * 4);
  std::memcpy(B.data.data(), b.data(), b.size() * 4);
  const Reference r = reference(A, ta, B, tb, m, n, k, 0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const std::size_t ij = std::size_t(i * n + j), e = std::size_t(i + j * ldc);
      const double beta_c = beta != 0.0f ? double(beta) * c_before[e] : 0.0;
      const double want = double(alpha) * r.P[ij] + beta_c;
      const double tol = product_bound(alpha, r.S[ij], beta_c, want, k, op_err);
      if (!(std::fabs(double(c_after[e]) - want) <= tol) && (*failures)++ == 0) {
        FAIL_CHECK("C(" << i << ", " << j << ") is " << c_after[e] << ", want " << want << " within " << tol);
      }
    }
  }
}

}  // namespace

TEST_CASE("cublasGemmBatchedEx: pointer arrays in device memory, interleaved outputs, against float64") {
  Blas blas;
  cudaStream_t st = nullptr;
  REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
  REQUIRE(cublasSetStream(blas.h, st) == CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(20260104);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int failures = 0, cases = 0;
  for (cublasComputeType_t ct : {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32}) {
    for (int t = 0; t < 4; ++t) {
      for (const auto& s : {std::array<int, 3>{7, 33, 65}, std::array<int, 3>{33, 1, 7}, std::array<int, 3>{16, 16, 16}}) {
        const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
        const int m = s[0], n = s[1], k = s[2], z = 4;
        const int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 1;
        // Members 0 and 2 share A (as grouped heads share keys); C members interleave in one
        // matrix of z * m rows, as heads do in a row of the output.
        const int ldc = z * m;
        const std::size_t a_elems = std::size_t(lda) * std::size_t(ta ? m : k), b_elems = std::size_t(ldb) * std::size_t(tb ? k : n);
        const std::size_t c_elems = std::size_t(ldc) * std::size_t(n);
        std::vector<float> ha(3 * a_elems), hb(z * b_elems), hc(c_elems);
        for (float& v : ha) v = u(rng);
        for (float& v : hb) v = u(rng);
        for (float& v : hc) v = u(rng);
        DeviceBuffer da(ha.size() * 4), db(hb.size() * 4), dc(hc.size() * 4), arrays(3 * z * sizeof(void*));
        da.upload(ha.data(), ha.size() * 4);
        db.upload(hb.data(), hb.size() * 4);
        dc.upload(hc.data(), hc.size() * 4);
        const std::size_t a_member[z] = {0, a_elems, 0, 2 * a_elems};
        std::vector<void*> ptrs(3 * z);
        for (int i = 0; i < z; ++i) {
          ptrs[std::size_t(i)] = da.at(a_member[i] * 4);
          ptrs[std::size_t(z + i)] = db.at(std::size_t(i) * b_elems * 4);
          ptrs[std::size_t(2 * z + i)] = dc.at(std::size_t(i * m) * 4);
        }
        arrays.upload(ptrs.data(), ptrs.size() * sizeof(void*));
        const auto* A = reinterpret_cast<const void* const*>(arrays.at(0));
        const auto* B = reinterpret_cast<const void* const*>(arrays.at(z * sizeof(void*)));
        auto* const* C = reinterpret_cast<void* const*>(arrays.at(2 * z * sizeof(void*)));
        const float alpha = cases % 2 == 0 ? 1.0f : 0.375f, beta = cases % 3 == 0 ? 0.0f : -0.5f;
        const cublasStatus_t rc =
            cublasGemmBatchedEx(blas.h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, CUDA_R_32F,
                                lda, B, CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, z, ct, CUBLAS_GEMM_DEFAULT);
        INFO(ablate::emu::cublas_last_refusal());
        REQUIRE(rc == CUBLAS_STATUS_SUCCESS);
        std::vector<float> out(hc.size());
        dc.download(out.data(), out.size() * 4);
        const double op_err = ct == CUBLAS_COMPUTE_32F_FAST_TF32 ? kTf32Op : 0.0;
        for (int i = 0; i < z; ++i) {
          const std::vector<float> a(ha.begin() + std::ptrdiff_t(a_member[i]), ha.begin() + std::ptrdiff_t(a_member[i] + a_elems));
          const std::vector<float> b(hb.begin() + std::ptrdiff_t(std::size_t(i) * b_elems),
                                     hb.begin() + std::ptrdiff_t(std::size_t(i + 1) * b_elems));
          const std::vector<float> cb(hc.begin() + i * m, hc.end()), ca(out.begin() + i * m, out.end());
          INFO("member " << i << " m " << m << " n " << n << " k " << k << " t " << t << " compute " << int(ct));
          check_member(a, lda, ta, b, ldb, tb, cb, ca, ldc, m, n, k, alpha, beta, op_err, &failures);
        }
        ++cases;
      }
    }
  }
  CHECK(failures == 0);
  cublasDestroy(blas.h);
  blas.h = nullptr;
  REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("cublasGemmStridedBatchedEx against float64") {
  Blas blas;
  std::mt19937 rng(20260105);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int m = 9, n = 5, k = 13, z = 3, lda = 11, ldb = 13, ldc = 10;
  const long long sa = lda * k + 3, sb = ldb * n + 1, sc = ldc * n + 2;
  std::vector<float> ha(std::size_t(sa * z)), hb(std::size_t(sb * z)), hc(std::size_t(sc * z));
  for (float& v : ha) v = u(rng);
  for (float& v : hb) v = u(rng);
  for (float& v : hc) v = u(rng);
  DeviceBuffer da(ha.size() * 4), db(hb.size() * 4), dc(hc.size() * 4);
  da.upload(ha.data(), ha.size() * 4);
  db.upload(hb.data(), hb.size() * 4);
  dc.upload(hc.data(), hc.size() * 4);
  const float alpha = 2.0f, beta = 0.25f;
  REQUIRE(cublasGemmStridedBatchedEx(blas.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da.p, CUDA_R_32F, lda, sa, db.p, CUDA_R_32F,
                                     ldb, sb, &beta, dc.p, CUDA_R_32F, ldc, sc, z, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  std::vector<float> out(hc.size());
  dc.download(out.data(), out.size() * 4);
  int failures = 0;
  for (int i = 0; i < z; ++i) {
    const std::vector<float> a(ha.begin() + i * sa, ha.begin() + (i + 1) * sa), b(hb.begin() + i * sb, hb.begin() + (i + 1) * sb);
    const std::vector<float> cb(hc.begin() + i * sc, hc.end()), ca(out.begin() + i * sc, out.end());
    check_member(a, lda, false, b, ldb, false, cb, ca, ldc, m, n, k, alpha, beta, 0.0, &failures);
    // The rows past m and the gap after each member are not written.
    for (long long e = 0; e < sc; ++e) {
      if (e >= ldc * n || e % ldc >= m) CHECK(out[std::size_t(i * sc + e)] == hc[std::size_t(i * sc + e)]);
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("cublasGemmBatchedEx refusals") {
  Blas blas;
  const int m = 4, n = 4, k = 4, z = 2;
  DeviceBuffer mats(3 * z * 64 * 4), arrays(3 * z * sizeof(void*));
  std::vector<float> fill(std::size_t(3 * z * 64), 1.0f);
  mats.upload(fill.data(), fill.size() * 4);
  std::vector<void*> ptrs(3 * z);
  for (int i = 0; i < 3 * z; ++i) ptrs[std::size_t(i)] = mats.at(std::size_t(i) * 256);
  arrays.upload(ptrs.data(), ptrs.size() * sizeof(void*));
  const auto* A = reinterpret_cast<const void* const*>(arrays.at(0));
  const auto* B = reinterpret_cast<const void* const*>(arrays.at(z * sizeof(void*)));
  auto* const* C = reinterpret_cast<void* const*>(arrays.at(2 * z * sizeof(void*)));
  const float alpha = 1.0f, beta = 0.0f;
  const auto call = [&](cublasHandle_t h, int mm, const void* const* a, int lda, cudaDataType t, cublasComputeType_t ct,
                        cublasGemmAlgo_t algo) {
    return cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, mm, n, k, &alpha, a, t, lda, B, CUDA_R_32F, k, &beta, C, CUDA_R_32F, m, z,
                               ct, algo);
  };
  CHECK(call(blas.h, m, A, m, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  std::vector<float> c(std::size_t(z * 64));
  mats.download(c.data(), c.size() * 4, std::size_t(2 * z) * 256);
  CHECK(c[0] == 4.0f);  // four products of ones
  const std::vector<const void*> host_array(ptrs.begin(), ptrs.begin() + z);
  CHECK(call(blas.h, m, host_array.data(), m, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(call(nullptr, m, A, m, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(call(blas.h, -1, A, m, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(call(blas.h, m, A, m - 1, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(call(blas.h, m, A, m, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call(blas.h, m, A, m, CUDA_R_32F, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call(blas.h, m, A, m, CUDA_R_32F, CUBLAS_COMPUTE_32F, cublasGemmAlgo_t(5)) == CUBLAS_STATUS_NOT_SUPPORTED);
  // A member's matrix on the host, in a device pointer array: INVALID_VALUE, nothing written.
  std::vector<float> host_mat(64, 1.0f), zeros(std::size_t(z * 64), 0.0f);
  mats.upload(zeros.data(), zeros.size() * 4, std::size_t(2 * z) * 256);
  std::vector<void*> bad = ptrs;
  bad[1] = host_mat.data();
  arrays.upload(bad.data(), bad.size() * sizeof(void*));
  CHECK(call(blas.h, m, A, m, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  mats.download(c.data(), c.size() * 4, std::size_t(2 * z) * 256);
  CHECK(std::all_of(c.begin(), c.end(), [](float v) { return v == 0.0f; }));
  // A destroyed stream.
  cudaStream_t st = nullptr;
  REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
  REQUIRE(cublasSetStream(blas.h, st) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
  arrays.upload(ptrs.data(), ptrs.size() * sizeof(void*));
  CHECK(call(blas.h, m, A, m, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("cublasGemmBatchedEx and cublasGemmStridedBatchedEx round operands to TF32 under 32F_FAST_TF32 only") {
  Blas blas;
  const float tie = 1.0f + std::ldexp(1.0f, -11), one = 1.0f, zero = 0.0f;
  DeviceBuffer a(256), b(256), c(256), arrays(3 * sizeof(void*));
  a.upload(&tie, 4);
  b.upload(&one, 4);
  const void* ptrs[3] = {a.p, b.p, c.p};
  arrays.upload(ptrs, sizeof ptrs);
  const auto* A = reinterpret_cast<const void* const*>(arrays.at(0));
  const auto* B = reinterpret_cast<const void* const*>(arrays.at(sizeof(void*)));
  auto* const* C = reinterpret_cast<void* const*>(arrays.at(2 * sizeof(void*)));
  for (cublasComputeType_t ct : {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32}) {
    const float want = ct == CUBLAS_COMPUTE_32F ? tie : 1.0f + std::ldexp(1.0f, -10);
    float got = 0.0f;
    REQUIRE(cublasGemmBatchedEx(blas.h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, A, CUDA_R_32F, 1, B, CUDA_R_32F, 1, &zero, C,
                                CUDA_R_32F, 1, 1, ct, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    c.download(&got, 4);
    CHECK(got == want);
    REQUIRE(cublasGemmStridedBatchedEx(blas.h, CUBLAS_OP_T, CUBLAS_OP_T, 1, 1, 1, &one, a.p, CUDA_R_32F, 1, 0, b.p, CUDA_R_32F, 1, 0,
                                       &zero, c.p, CUDA_R_32F, 1, 0, 1, ct, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    c.download(&got, 4);
    CHECK(got == want);
  }
}

// --- FP8 -------------------------------------------------------------------------------------------

namespace {

// Every finite value of an FP8 format in increasing order, from its definition (OCP FP8 v1.0):
// sign, exponent field, mantissa, with the format's bias and its NaN/infinity codes left out.
std::vector<double> fp8_values(bool e4m3) {
  const int man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, fields = e4m3 ? 16 : 31;  // E5M2's field 31: inf/NaN
  std::vector<double> v;
  for (int f = 0; f < fields; ++f) {
    for (int m = 0; m < (1 << man); ++m) {
      if (e4m3 && f == 15 && m == 7) continue;  // NaN
      v.push_back(f == 0 ? std::ldexp(m, 1 - bias - man) : std::ldexp((1 << man) + m, f - bias - man));
    }
  }
  std::vector<double> all;
  for (auto it = v.rbegin(); it != v.rend(); ++it) all.push_back(-*it);
  all.insert(all.end(), v.begin() + 1, v.end());  // one zero
  return all;
}

}  // namespace

TEST_CASE("FP8 conversions: every finite value round trips, ties go to even, saturation and NaN as the OCP formats say") {
  for (const bool e4m3 : {true, false}) {
    CAPTURE(e4m3);
    const __nv_fp8_interpretation_t kind = e4m3 ? __NV_E4M3 : __NV_E5M2;
    const std::vector<double> v = fp8_values(e4m3);
    CHECK(v.back() == (e4m3 ? 448.0 : 57344.0));
    CHECK(v.size() == (e4m3 ? 253u : 247u));  // 256 codes less NaNs (and infinities), -0 and +0 as one
    for (std::size_t i = 0; i < v.size(); ++i) {
      const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(float(v[i]), __NV_SATFINITE, kind);
      CHECK(double(ablate_emu_fp8_to_float(code, kind)) == v[i]);
      if (i + 1 == v.size()) break;
      // Between two neighbours: below the midpoint to the lower, above to the upper, on it to the
      // one whose code is even.
      const double lo = v[i], hi = v[i + 1], mid = (lo + hi) / 2;
      const float below = std::nextafter(float(mid), float(lo)), above = std::nextafter(float(mid), float(hi));
      CHECK(double(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(below, __NV_SATFINITE, kind), kind)) == lo);
      CHECK(double(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(above, __NV_SATFINITE, kind), kind)) == hi);
      const __nv_fp8_storage_t tie = __nv_cvt_float_to_fp8(float(mid), __NV_NOSAT, kind);
      const __nv_fp8_storage_t clo = __nv_cvt_float_to_fp8(float(lo), __NV_NOSAT, kind);
      CHECK(double(ablate_emu_fp8_to_float(tie, kind)) == ((clo & 1) == 0 ? lo : hi));
    }
    // Beyond the largest finite: SATFINITE clamps it, NOSAT makes NaN (E4M3) or infinity (E5M2).
    const float big = float(v.back()) * 1.25f;
    CHECK(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(big, __NV_SATFINITE, kind), kind) == float(v.back()));
    CHECK(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(-INFINITY, __NV_SATFINITE, kind), kind) == -float(v.back()));
    const float nosat = ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(big, __NV_NOSAT, kind), kind);
    if (e4m3) CHECK(std::isnan(nosat));
    else CHECK(nosat == INFINITY);
    CHECK(std::isnan(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(NAN, __NV_SATFINITE, kind), kind)));
    CHECK(__nv_cvt_float_to_fp8(-0.0f, __NV_SATFINITE, kind) == 0x80);
    // Half the smallest subnormal ties to zero (even); a little more goes up to it.
    const float tiny = float(v[v.size() / 2 + 1]);
    CHECK(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(tiny / 2, __NV_SATFINITE, kind), kind) == 0.0f);
    CHECK(ablate_emu_fp8_to_float(__nv_cvt_float_to_fp8(tiny * 0.75f, __NV_SATFINITE, kind), kind) == tiny);
    // The C++ types: SATFINITE and round to nearest even.
    CHECK(float(__nv_fp8_e4m3(1000.0f)) == 448.0f);
    CHECK(float(__nv_fp8_e5m2(-1e6f)) == -57344.0f);
  }
}

namespace {

// An FP8 product D (m x n) = d_scale * (s * A^T B + c * C), A k x m and B k x n in FP8, column order.
struct Fp8Case {
  cudaDataType_t ta, tb, tc, td;
  int64_t m, n, k;
  float alpha, beta, sa, sb, sc, sd;
  // A forward epilogue on a bf16 D: the bf16 bias (of D's rows), the GELU, its input into a bf16 matrix.
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
};

void run_fp8(const Fp8Case& c, std::mt19937& rng) {
  const auto fp8_kind = [](cudaDataType_t t) { return t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2; };
  const auto esize = [](cudaDataType_t t) -> std::size_t { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1; };
  // Random finite codes of each operand's format, from values spread over its range.
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<unsigned char> a(std::size_t(c.k * c.m)), b(std::size_t(c.k * c.n));
  for (auto& x : a) x = __nv_cvt_float_to_fp8(u(rng), __NV_SATFINITE, fp8_kind(c.ta));
  for (auto& x : b) x = __nv_cvt_float_to_fp8(u(rng), __NV_SATFINITE, fp8_kind(c.tb));
  HostMat C(c.tc, false, c.m, c.n, 0, 1);
  C.randomize(rng);
  DeviceBuffer da(a.size()), db(b.size()), dc(C.bytes()), dd(std::size_t(c.m * c.n) * esize(c.td)), scales(5 * sizeof(float));
  da.upload(a.data(), a.size());
  db.upload(b.data(), b.size());
  dc.upload(C.data.data(), C.bytes());
  const float s[5] = {c.sa, c.sb, c.sc, c.sd, -1.0f};
  scales.upload(s, sizeof s);
  const bool bias_in =
      c.epi == CUBLASLT_EPILOGUE_BIAS || c.epi == CUBLASLT_EPILOGUE_GELU_BIAS || c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool aux_out = c.epi == CUBLASLT_EPILOGUE_GELU_AUX || c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu = aux_out || c.epi == CUBLASLT_EPILOGUE_GELU || c.epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  HostMat bias(CUDA_R_16BF, false, c.m, 1, 0, 1), aux(CUDA_R_16BF, false, c.m, c.n, 0, 1);
  bias.randomize(rng);
  DeviceBuffer dbias(bias.bytes()), daux(aux.bytes());
  dbias.upload(bias.data.data(), bias.bytes());
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_32F);
  desc.trans(true, false);
  if (c.epi != CUBLASLT_EPILOGUE_DEFAULT) desc.epilogue(c.epi);
  if (bias_in) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_16BF));
    desc.bias(dbias.p);
  }
  if (aux_out) desc.aux(daux.p, c.m);
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scales.at(0)));
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scales.at(4)));
  desc.set(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, static_cast<const void*>(scales.at(8)));
  const bool fp8_out = c.td == CUDA_R_8F_E4M3 || c.td == CUDA_R_8F_E5M2;
  if (fp8_out) desc.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(scales.at(12)));
  desc.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(scales.at(16)));
  Layout la(c.ta, uint64_t(c.k), uint64_t(c.m), c.k), lb(c.tb, uint64_t(c.k), uint64_t(c.n), c.k),
      lc(c.tc, uint64_t(c.m), uint64_t(c.n), c.m), ld(c.td, uint64_t(c.m), uint64_t(c.n), c.m);
  const cublasStatus_t rc =
      cublasLtMatmul(lt.h, desc.d, &c.alpha, da.p, la.l, db.p, lb.l, &c.beta, dc.p, lc.l, dd.p, ld.l, nullptr, nullptr, 0, nullptr);
  INFO(ablate::emu::cublas_last_refusal());
  REQUIRE(rc == CUBLAS_STATUS_SUCCESS);
  std::vector<unsigned char> out(dd.bytes);
  dd.download(out.data(), out.size());
  daux.download(aux.data.data(), aux.bytes());
  float amax = 0;
  scales.download(&amax, sizeof amax, 16);
  // float64 reference; the bound: k + 2 fp32 roundings of sum |a b| |scale| (the products are
  // exact), one of |beta c C|, then the output's rounding.
  double ref_amax = 0, bound_amax = 0;
  for (int64_t j = 0; j < c.n; ++j) {
    for (int64_t i = 0; i < c.m; ++i) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = ablate_emu_fp8_to_float(a[std::size_t(p + i * c.k)], fp8_kind(c.ta)) *
                         double(ablate_emu_fp8_to_float(b[std::size_t(p + j * c.k)], fp8_kind(c.tb)));
        sum += x;
        mag += std::fabs(x);
      }
      const double scale = double(c.alpha) * c.sa * c.sb, cterm = double(c.beta) * c.sc * C.get(i, j, 0);
      const double bv = bias_in ? bias.get(i, 0, 0) : 0.0;
      double t = scale * sum + cterm + bv;
      double err = double(c.k + 5) * kU * (std::fabs(scale) * mag + std::fabs(cterm) + std::fabs(bv));
      if (aux_out) {  // the GELU's input, rounded to bf16
        const double a = aux.get(i, j, 0);
        CHECK(std::fabs(a - t) <= err + kBf16U * (std::fabs(t) + err));
      }
      if (gelu) {
        const double g = gelu_ref(t);
        err = 1.2 * std::fabs(gelu_grad_ref(t)) * err + 16.0 * kU * (std::fabs(t) + std::fabs(g)) + 1e-37;
        t = g;
      }
      ref_amax = std::max(ref_amax, std::fabs(t));
      bound_amax = std::max(bound_amax, err);
      const std::size_t e = std::size_t(i + j * c.m);
      if (fp8_out) {
        // The stored code is the FP8 rounding of something within err * sd of sd * t: between the
        // roundings of the two ends.
        const double lo = c.sd * (t - err), hi = c.sd * (t + err);
        const float got = ablate_emu_fp8_to_float(out[e], fp8_kind(c.td));
        const float rlo =
            ablate_emu_fp8_to_float(__nv_cvt_double_to_fp8(std::min(lo, hi), __NV_SATFINITE, fp8_kind(c.td)), fp8_kind(c.td));
        const float rhi =
            ablate_emu_fp8_to_float(__nv_cvt_double_to_fp8(std::max(lo, hi), __NV_SATFINITE, fp8_kind(c.td)), fp8_kind(c.td));
        CHECK(got >= rlo);
        CHECK(got <= rhi);
      } else {
        double got;
        if (c.td == CUDA_R_32F) {
          float f;
          std::memcpy(&f, &out[e * 4], 4);
          got = f;
        } else {
          __nv_bfloat16 h;
          std::memcpy(&h, &out[e * 2], 2);
          got = __bfloat162float(h);
        }
        const double tol = err + (c.td == CUDA_R_16BF ? kBf16U * (std::fabs(t) + err) : 0.0);
        CHECK(std::fabs(got - t) <= tol);
      }
    }
  }
  // amax(D) before the D scale.
  CHECK(std::fabs(double(amax) - ref_amax) <= bound_amax);
}

}  // namespace

TEST_CASE("cublasLtMatmul with FP8 operands (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3) into f32, bf16 and FP8 with scales and amax, "
          "and the forward epilogues on a bf16 D") {
  std::mt19937 rng(1234);
  const Fp8Case cases[] = {
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F, CUDA_R_32F, 16, 16, 16, 1.0f, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f},
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 32, 16, 48, 0.5f, 1.0f, 0.125f, 3.0f, 2.0f, 1.0f},
      {CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF, CUDA_R_16BF, 16, 48, 32, 1.0f, 0.0f, 0.01f, 7.5f, 1.0f, 1.0f},
      {CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_32F, CUDA_R_32F, 48, 16, 16, -2.0f, 0.5f, 1.0f, 0.3f, 1.5f, 1.0f},
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_8F_E4M3, 16, 32, 32, 1.0f, 0.0f, 0.5f, 0.5f, 1.0f, 4.0f},
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_8F_E5M2, 32, 32, 16, 1.0f, 1.0f, 2.0f, 1.0f, 1.0f, 100.0f},
      // The forward epilogues on a bf16 D: bias (with C added too), GELU, its input kept, both.
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 32, 16, 48, 1.0f, 1.0f, 0.125f, 2.0f, 1.0f, 1.0f,
       CUBLASLT_EPILOGUE_BIAS},
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 16, 32, 32, 1.0f, 0.0f, 0.25f, 0.5f, 1.0f, 1.0f,
       CUBLASLT_EPILOGUE_GELU},
      {CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 48, 16, 16, 1.0f, 0.0f, 0.5f, 0.25f, 1.0f, 1.0f,
       CUBLASLT_EPILOGUE_GELU_AUX},
      {CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 32, 32, 32, 1.0f, 0.0f, 0.1f, 1.0f, 1.0f, 1.0f,
       CUBLASLT_EPILOGUE_GELU_AUX_BIAS},
  };
  for (const Fp8Case& c : cases) {
    CAPTURE(c.m);
    CAPTURE(c.k);
    CAPTURE(int(c.td));
    CAPTURE(int(c.epi));
    run_fp8(c, rng);
  }
}

TEST_CASE(
    "FP8 products cuBLASLt turns down are turned down: not TN, both E5M2, leading dimensions, alignment, epilogues, scales elsewhere") {
  Lt lt;
  DeviceBuffer buf(1 << 16);
  const float one = 1.0f, zero = 0.0f;
  const auto matmul = [&](Desc& d, cudaDataType_t ta, cudaDataType_t tb, cudaDataType_t td, int64_t lda, std::size_t offset = 0) {
    Layout la(ta, 16, 16, lda), lb(tb, 16, 16, 16), lc(td, 16, 16, 16), ld(td, 16, 16, 16);
    return cublasLtMatmul(lt.h, d.d, &one, buf.at(offset), la.l, buf.at(8192), lb.l, &zero, buf.at(16384), lc.l, buf.at(16384), ld.l,
                          nullptr, nullptr, 0, nullptr);
  };
  {
    Desc d(CUBLAS_COMPUTE_32F);
    d.trans(false, false);
    CHECK(matmul(d, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(std::string(ablate::emu::cublas_last_refusal()).find("TN") != std::string::npos);
  }
  Desc tn(CUBLAS_COMPUTE_32F);
  tn.trans(true, false);
  CHECK(matmul(tn, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2, CUDA_R_16BF, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(matmul(tn, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(matmul(tn, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 24) == CUBLAS_STATUS_NOT_SUPPORTED);  // ld 24 bytes
  CHECK(std::string(ablate::emu::cublas_last_refusal()).find("multiple of 16 bytes") != std::string::npos);
  CHECK(matmul(tn, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16, 8) == CUBLAS_STATUS_NOT_SUPPORTED);  // A on 8 bytes
  CHECK(matmul(tn, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_SUCCESS);
  {
    Desc tf32(CUBLAS_COMPUTE_32F_FAST_TF32);
    tf32.trans(true, false);
    CHECK(matmul(tf32, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {
    // Of the epilogues only the forward ones, on a bf16 D: the GELU's gradient and the bias
    // gradients are turned down, and so is any epilogue on an f32 D.
    Desc e(CUBLAS_COMPUTE_32F);
    e.trans(true, false);
    e.epilogue(CUBLASLT_EPILOGUE_GELU);
    CHECK(matmul(e, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_SUCCESS);
    CHECK(matmul(e, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(std::string(ablate::emu::cublas_last_refusal()).find("bf16 only") != std::string::npos);
    for (const cublasLtEpilogue_t grad : {CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
      Desc g(CUBLAS_COMPUTE_32F);
      g.trans(true, false);
      g.epilogue(grad);
      g.bias(buf.at(40960));
      g.aux(buf.at(49152), 16);
      CHECK(matmul(g, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(std::string(ablate::emu::cublas_last_refusal()).find("forward ones only") != std::string::npos);
    }
    Desc f32_bias(CUBLAS_COMPUTE_32F);  // a bias not in D's type
    f32_bias.trans(true, false);
    f32_bias.epilogue(CUBLASLT_EPILOGUE_BIAS);
    f32_bias.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
    f32_bias.bias(buf.at(40960));
    CHECK(matmul(f32_bias, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {
    Desc ds(CUBLAS_COMPUTE_32F);  // a D scale with a bf16 D
    ds.trans(true, false);
    ds.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(buf.at(32768)));
    CHECK(matmul(ds, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_INVALID_VALUE);
  }
  {
    Desc host_scale(CUBLAS_COMPUTE_32F);  // a scale in host memory
    host_scale.trans(true, false);
    host_scale.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(&one));
    CHECK(matmul(host_scale, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16) == CUBLAS_STATUS_INVALID_VALUE);
  }
  {
    Desc f32(CUBLAS_COMPUTE_32F);  // scales on a product without FP8 operands
    f32.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(buf.at(32768)));
    Layout l(CUDA_R_32F, 16, 16, 16);
    CHECK(cublasLtMatmul(lt.h, f32.d, &one, buf.at(0), l.l, buf.at(4096), l.l, &zero, buf.at(16384), l.l, buf.at(16384), l.l, nullptr,
                         nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  }
}
