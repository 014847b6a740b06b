// cuBLASLt behind GemmCall (see gemm.hpp for the row-major to column-major mapping).
#include "gemm.hpp"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "epilogue_kernels.hpp"
#include "fp8_kernels.hpp"
#include "gemm_plan.hpp"
#include "layer_kernels.hpp"

namespace ablate::cuda_layers {
namespace {

using gemm_plan::alignment_of;
using gemm_plan::bias_grad_elements;
using gemm_plan::epilogue_of;

constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;

std::string shape_of(const GemmCall& g) {
  return std::string("D(") + std::to_string(g.M) + "x" + std::to_string(g.N) + ") = " + (g.ta ? "A^T" : "A") + " " +
         (g.tb ? "B^T" : "B") + ", K " + std::to_string(g.K) + ", ld " + std::to_string(g.lda) + "/" + std::to_string(g.ldb) + "/" +
         std::to_string(g.ldc) + (g.bias != nullptr ? ", bias" : "") +
         (g.act == Activation::gelu_aux ? ", gelu"
          : g.act == Activation::dgelu  ? ", dgelu"
                                        : "") +
         (g.d_column_sums != nullptr || g.a_sums != nullptr ? ", bias gradient" : "") + ", " + to_string(g.mode) +
         (g.d_bf16 ? ", bf16 out" : "");
}


// A and B as cuBLASLt reads them: the f32 operands, or (bf16) their packed bf16 copies.
struct Operands {
  const void* A;
  int64_t lda;
  const void* B;
  int64_t ldb;
};

// A product with at most a bias: cuBLASLt must serve it (there is no pass to fall back to).
// A product with no epilogue at all: the one call with no passes to fall back on (a bias alone
// falls back on the product and add_bias).
bool no_epilogue(const GemmCall& g) { return epilogue_of(g) == CUBLASLT_EPILOGUE_DEFAULT; }

// The first 256-byte aligned address in a scratch region asked 256 bytes larger: the plan key
// records packed copies (and a fused bias gradient's scratch) as 256-byte aligned, which the
// stream-ordered allocator does not promise.
uint16_t* aligned256(void* p) { return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(p) + 255) / 256 * 256); }

void check_lt(cublasStatus_t rc, const char* call, const GemmCall& g) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw_runtime_error("cuda_layers gemm", std::string(call) + " failed for " + shape_of(g) + ": " + cublasLtGetStatusName(rc) + ": " +
                                              cublasLtGetStatusString(rc));
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

// The memory a product enqueued on one stream works in: cuBLASLt's workspace and the scratch of
// bf16 copies and fused bias gradients. One set per stream, so that products on two streams (two
// models in one process, a test's devices) never write the same bytes concurrently.
struct StreamSet {
  void* workspace = nullptr;
  cuda::StreamScratch bf16_a, bf16_b;  // the bf16 copies of A and B (bf16 mode)
  cuda::StreamScratch bf16_once;       // an operand several products share (gemm_bf16_once)
  cuda::StreamScratch bias_grad;       // a fused epilogue's bias gradient, before it is added
  cuda::StreamScratch fp8_a, fp8_b;    // FP8 products: the quantised A and B (fp8_operands)
  cuda::StreamScratch fp8_a_other;     // A quantised in its other layout for the next product (a_read_again)
  cuda::StreamScratch fp8_b_kept;      // a weight-gradient product's B (the layer's input), kept for the next one
  cuda::StreamScratch fp8_partials;    // column sums taken in a pack, per 32-row tile (a_column_sums)
  // FP8 products' scaling, 24 floats: the amax of A and B [0, 1], their scales [4, 5] and the
  // scales' inverses (cuBLASLt's scale pointers) [6, 7], then current scaling's slot [8, 16), which
  // never gets a scale, so every operand is scaled by its own amax (fp8_kernels.hpp), then the kept
  // B's scale and inverse [16, 17].
  float* fp8_state = nullptr;
  // An operand quantised under current scaling: its values, extent and format.
  struct Tensor {
    const void* x = nullptr;
    bool bf16 = false;
    int64_t rows = 0, cols = 0, ld = 0;
    Fp8Format format = Fp8Format::e4m3;
    bool operator==(const Tensor&) const = default;
  };
  // A quantised copy in one of the buffers above: of which tensor, in which layout (transposed or
  // not, leading dimension kp); none when `t.x` is null.
  struct Pack {
    Tensor t;
    bool transposed = false;
    int64_t kp = 0;
    bool operator==(const Pack&) const = default;
  };
  // The A that the last FP8 product on this stream quantised under current scaling, whose scale
  // and inverse are still in fp8_state[4] and [6] (a call that says a_scale_reused with the same
  // tensor and format uses them again).
  Tensor last_a;
  Pack a_pack;  // what fp8_a holds: that A, packed by the last product (a_as_before reads it as it is)
  // That A's other layout, where the product that quantised it wrote both (a_read_again): in
  // fp8_a_other, transposed or not, with leading dimension ld; null when there is none.
  struct OtherA {
    const uint8_t* q = nullptr;
    bool transposed = false;
    int64_t ld = 0;
  } other_a;
  Pack kept_b;  // what fp8_b_kept holds, its scale in fp8_state[16] and [17] (b_as_before reads it)
  // FP8 products run on this stream so far, and the last that packed or read kept_b: a b_as_before
  // reads it only from one of the two products before it (the last layer call's weight gradient,
  // with this call's input gradient between), never an older pack of a buffer since rewritten.
  int64_t fp8_products = 0, kept_b_at = 0;
  StreamSet() {
    ABLATE_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
    const float init[24] = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
    ABLATE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&fp8_state), sizeof(init)));
    ABLATE_CUDA_CHECK(cudaMemcpy(fp8_state, init, sizeof(init), cudaMemcpyHostToDevice));
  }
  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;
  ~StreamSet() {
    if (workspace != nullptr) cudaFree(workspace);
    if (fp8_state != nullptr) cudaFree(fp8_state);
  }
};

// The process's handle and plan cache (shared by every stream) and each stream's working memory.
// Created on first use, so loading the plugin on a machine without a GPU touches no CUDA state.
class Context {
 public:
  Context() { check_lt(cublasLtCreate(&handle_), "cublasLtCreate", GemmCall{}); }
  ~Context() {
    plans_.clear();
    streams_.clear();
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }

  // Runs the call with its epilogue fused; false when cuBLASLt has no algorithm for that epilogue
  // (nothing but, under bf16, the operands' copies enqueued), and the caller does its work in
  // passes of its own.
  bool run(const GemmCall& g, cudaStream_t stream) {
    if (fp8_mode(g.mode) && !fp8_served(g)) {
      GemmCall b = g;  // a layout FP8 products cannot take: a bf16 product
      b.mode = MatmulMode::bf16;
      return run(b, stream);
    }
    // a_column_sums not taken in a pack: a pass after the product, enqueued outside the lock (the
    // pass is a product itself).
    bool sums_pending = false, ran = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ran = fp8_mode(g.mode) ? run_fp8(g, stream, sums_pending) : run_locked(g, stream);
      sums_pending = ran && g.a_column_sums != nullptr && (sums_pending || !fp8_mode(g.mode));
    }
    if (sums_pending) stored_column_sums(g, stream);
    return ran;
  }

  // run() of a product not in FP8, under the lock.
  bool run_locked(const GemmCall& g, cudaStream_t stream) {
    StreamSet& set = on(stream);
    set.last_a = {};  // a product not in FP8 (a layout FP8 cannot take): the next one takes its own scale
    const std::string key = gemm_key(g);
    if (unfusable_.count(key) != 0) return false;
    const Operands ops = operands(g, set, stream);
    Plan* p = plan(key, g, ops, set);
    if (p == nullptr) {
      unfusable_.insert(key);
      return false;
    }
    // A bias gradient is written, not added: into scratch, then added to the caller's vector.
    // (In D's type: bf16 for a bf16 D.)
    const int64_t grad_n = bias_grad_elements(g);
    float* bias_grad = grad_n > 0
                           ? reinterpret_cast<float*>(aligned256(set.bias_grad.get(std::size_t(grad_n) * sizeof(float) + 256, stream)))
                           : nullptr;
    const void* bias = grad_n > 0               ? static_cast<const void*>(bias_grad)
                       : g.bias_bf16 != nullptr ? g.bias_bf16
                                                : static_cast<const void*>(g.bias);
    point_epilogue(p, g, bias);
    // Column-major: D^T(N, M) = op(B)^T(N, K) op(A)^T(K, M).
    const float* c = g.C != nullptr ? g.C : g.D;
    const cublasStatus_t rc = cublasLtMatmul(handle_, p->desc, &g.alpha, ops.B, p->a, ops.A, p->b, &g.beta, c, p->c, g.D, p->d,
                                             &p->algo, set.workspace, kWorkspaceBytes, stream);
    if (turned_down(rc, g, key)) return false;
    check_lt(rc, "cublasLtMatmul", g);
    float* grad_to = g.act == Activation::dgelu ? g.d_column_sums : g.a_sums;
    if (grad_n > 0 && g.d_bf16) launch_add_bf16(reinterpret_cast<const uint16_t*>(bias_grad), grad_to, grad_n, stream);
    if (grad_n > 0 && !g.d_bf16) launch_copy_or_add(bias_grad, grad_to, grad_n, true, stream);
    return true;
  }

  // a_column_sums by a pass of its own (A packed: its width is lda).
  void stored_column_sums(const GemmCall& g, cudaStream_t stream) {
    const int64_t rows = g.ta ? g.K : g.M, cols = g.ta ? g.M : g.K;
    if (g.A != nullptr) add_column_sums(g.A, g.a_column_sums, rows, cols, stream);
    else add_column_sums_bf16(static_cast<const uint16_t*>(g.A_bf16), g.a_column_sums, rows, cols, stream);
    std::lock_guard<std::mutex> lock(mu_);
    ++sums_by_pass_;
  }

  // Whether cuBLASLt turned down at run time the epilogue of an algorithm its heuristic offered:
  // then the epilogue's work runs in passes, from now on for this problem (nothing was written: the
  // call checks before it launches).
  bool turned_down(cublasStatus_t rc, const GemmCall& g, const std::string& key) {
    if (rc != CUBLAS_STATUS_NOT_SUPPORTED || no_epilogue(g)) return false;
    spdlog::info("cuda_layers: cuBLASLt turned down the {} epilogue of {} at run time; its work runs in passes of its own",
                 fused_epilogue(g), shape_of(g));
    unfusable_.insert(key);
    return true;
  }

  // Whether an FP8 product can take the call (gemm.hpp): no epilogue, or a forward one on a bf16 D
  // (fused_epilogue strips the others in FP8 modes); C and D 16-byte aligned with leading
  // dimensions of a multiple of 16 bytes. The operands always can: they are quantised into packed
  // copies, padded along K.
  static bool fp8_served(const GemmCall& g) {
    const int64_t out_bytes = g.d_bf16 ? 2 : 4;
    const float* c = g.C != nullptr ? g.C : g.D;
    return !fused_epilogue(g).empty() && (g.ldc * out_bytes) % 16 == 0 && alignment_of(g.D) >= 16 &&
           (g.beta == 0.0f || alignment_of(c) >= 16);
  }

  // An FP8 product: each operand's scale (current scaling: its amax, then fp8_max / amax; delayed
  // scaling: its slot's, from the amax history) and inverse, the operand quantised into the layout
  // cuBLASLt's FP8 products read (row-major (M, K) for our A, (N, K) for our B: K contiguous, padded
  // with zeros to a multiple of 16; a slot's amax and saturated count taken in the same pass), then
  // the product with the inverses as its scales, its forward epilogue (the bias, the GELU) fused
  // where it has one. All on the stream; nothing waits. False, nothing enqueued, when cuBLASLt has
  // no algorithm for the epilogue (the caller does its work in passes).
  bool run_fp8(const GemmCall& g, cudaStream_t stream, bool& sums_pending) {
    StreamSet& set = on(stream);
    const Fp8Format fa = g.a_grad && g.mode == MatmulMode::fp8 ? Fp8Format::e5m2 : Fp8Format::e4m3, fb = Fp8Format::e4m3;
    const int64_t kp = (g.K + 15) / 16 * 16;
    const std::string key = std::string("fp8 ") + (fa == Fp8Format::e5m2 ? "e5m2" : "e4m3") + " " + gemm_key(g);
    if (unfusable_.count(key) != 0) return false;
    Plan* p = plan_fp8(key, g, fa, kp, set);
    if (p == nullptr) {
      unfusable_.insert(key);
      return false;
    }
    float* st = set.fp8_state;
    ++set.fp8_products;
    // Our A: (M, K) as given, or (K, M) transposed; our B: (K, N), or (N, K) when tb.
    const Fp8Source a{
        g.A != nullptr ? static_cast<const void*>(g.A) : g.A_bf16, g.A == nullptr, g.ta ? g.K : g.M, g.ta ? g.M : g.K, g.lda, g.ta};
    const Fp8Source b{
        g.B != nullptr ? static_cast<const void*>(g.B) : g.B_bf16, g.B == nullptr, g.tb ? g.N : g.K, g.tb ? g.K : g.N, g.ldb, !g.tb};
    const uint8_t* qa = fp8_operand_a(g, set, a, fa, kp, stream, sums_pending);
    // cuBLASLt's A is our B: its scale is B's inverse, and its B's is A's.
    const void* scale_first = st + 7;
    const void* scale_second = st + 6;
    const uint8_t* qb = nullptr;
    if (g.ta && g.fp8.b == nullptr) {  // a weight-gradient product's B under current scaling
      qb = fp8_kept_b(g, set, b, kp, stream);
      scale_first = st + 17;
    } else if (g.fp8.b == nullptr && g.fp8.weight_pack != nullptr) {  // a weight under current scaling
      qb = fp8_weight(g, set, b, stream);
      scale_first = static_cast<const float*>(g.fp8.weight_pack) + 2;
    } else {
      auto* q = reinterpret_cast<uint8_t*>(aligned256(set.fp8_b.get(std::size_t(g.N * kp) + 256, stream)));
      quantise(set, b, g.fp8.b, fb, 1, q, kp, stream);
      qb = q;
    }
    ABLATE_CUDA_CHECK(cudaGetLastError());
    point_epilogue(p, g, g.bias_bf16 != nullptr ? g.bias_bf16 : static_cast<const void*>(g.bias));
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_first, sizeof(scale_first)),
             "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)", g);
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_second, sizeof(scale_second)),
             "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)", g);
    const float* c = g.C != nullptr ? g.C : g.D;
    const cublasStatus_t rc = cublasLtMatmul(handle_, p->desc, &g.alpha, qb, p->a, qa, p->b, &g.beta, c, p->c, g.D, p->d, &p->algo,
                                             set.workspace, kWorkspaceBytes, stream);
    if (turned_down(rc, g, key)) return false;
    check_lt(rc, "cublasLtMatmul", g);
    if (!no_epilogue(g)) ++fp8_epilogues_;
    return true;
  }

  // An FP8 product's operand as stored: its values (f32 where there are some, else bf16) and extent;
  // transposed: its rows run along K (packed transposed).
  struct Fp8Source {
    const void* x;
    bool bf16;
    int64_t rows, cols, ld;
    bool transposed;
    StreamSet::Tensor tensor(Fp8Format f) const { return {x, bf16, rows, cols, ld, f}; }
  };

  // The operand's scale and inverse into scale[0] and inverse[0] from its slot (delayed scaling) or
  // current scaling's (fp8_state[8, 16)), its amax (into amax[0]) first where the slot has no scale.
  static void scale_of(StreamSet& set, const Fp8Source& x, float* slot, Fp8Format f, float* amax, float* scale, float* inverse,
                       cudaStream_t stream) {
    float* s = slot != nullptr ? slot : set.fp8_state + 8;
    launch_fp8_slot_amax(x.x, x.bf16, x.rows, x.cols, x.ld, s, amax, stream);
    launch_fp8_slot_scale(s, kFp8Max[int(f)], amax, scale, inverse, stream);
  }
  // Operand i's scale and inverse into fp8_state[4 + i] and [6 + i], then its quantised copy q
  // (leading dimension kp), the amax of this use and its saturated values recorded in a
  // delayed-scaling slot.
  static void quantise(StreamSet& set, const Fp8Source& x, float* slot, Fp8Format f, int i, uint8_t* q, int64_t kp,
                       cudaStream_t stream, Fp8ColumnSums sums = {}) {
    float* st = set.fp8_state;
    scale_of(set, x, slot, f, st + i, st + 4 + i, st + 6 + i, stream);
    float* saturated = slot != nullptr ? slot + 5 : nullptr;
    launch_fp8_pack(x.x, x.bf16, x.rows, x.cols, x.ld, x.transposed, st + 4 + i, f, q, kp, saturated, slot, stream, sums);
  }

  // a_column_sums as a pack takes them (none where the call has none), its partials in scratch.
  Fp8ColumnSums column_sums(const GemmCall& g, StreamSet& set, const Fp8Source& a, cudaStream_t stream) {
    if (g.a_column_sums == nullptr) return {};
    const std::size_t n = std::size_t(fp8_column_partials(a.rows, a.cols));
    return {g.a_column_sums, static_cast<float*>(set.fp8_partials.get(n * sizeof(float), stream))};
  }

  // A, quantised (its scale in fp8_state[4] and [6]) or found so. Under current scaling:
  //  - a_as_before: A is the last product's A, unchanged, and fp8_a still holds its pack in this
  //    layout (the same tensor, extent, format, layout): read as it is (q, k and v's products
  //    reading one norm output);
  //  - a_scale_reused: an output gradient read by two products (the input gradient's and the
  //    weight gradient's) has one amax: the second quantises it with the first's scale, or reads
  //    the layout the first wrote for it (a_read_again: both layouts from one read).
  //  A's column sums (a_column_sums) are taken in the pass that quantises it; where none reads it,
  //  sums_pending says so (run() then takes them by a pass).
  const uint8_t* fp8_operand_a(const GemmCall& g, StreamSet& set, const Fp8Source& a, Fp8Format fa, int64_t kp, cudaStream_t stream,
                               bool& sums_pending) {
    float* st = set.fp8_state;
    auto* qa = reinterpret_cast<uint8_t*>(aligned256(set.fp8_a.get(std::size_t(g.M * kp) + 256, stream)));
    const bool current = g.fp8.a == nullptr;
    const StreamSet::Tensor this_a = a.tensor(fa);
    const StreamSet::Pack this_pack{this_a, a.transposed, kp};
    const StreamSet::OtherA other = set.other_a;
    set.other_a = {};
    const uint8_t* out = qa;
    const Fp8ColumnSums sums = column_sums(g, set, a, stream);
    bool summed = true;  // A read here, its column sums (if any) taken
    if (current && g.fp8.a_as_before && set.last_a == this_a && set.a_pack == this_pack) {
      ++inputs_reused_;
      summed = false;
    } else if (current && g.a_scale_reused && set.last_a == this_a) {
      if (other.q != nullptr && other.transposed == a.transposed && other.ld == kp) {
        out = other.q;
        ++packs_shared_;
        summed = false;
      } else {
        launch_fp8_pack(a.x, a.bf16, a.rows, a.cols, a.ld, a.transposed, st + 4, fa, qa, kp, nullptr, nullptr, stream, sums);
      }
      ++scales_reused_;
    } else if (current && g.a_read_again) {
      // This layout (K along the source's columns when not transposed, along its rows when
      // transposed) and the other, padded along its own K.
      scale_of(set, a, nullptr, fa, st, st + 4, st + 6, stream);
      const int64_t other_ld = a.transposed ? (a.cols + 15) / 16 * 16 : (a.rows + 15) / 16 * 16;
      const int64_t other_rows = a.transposed ? a.rows : a.cols;
      auto* qo = reinterpret_cast<uint8_t*>(aligned256(set.fp8_a_other.get(std::size_t(other_rows * other_ld) + 256, stream)));
      uint8_t* plain = a.transposed ? qo : qa;
      uint8_t* transposed = a.transposed ? qa : qo;
      launch_fp8_pack_both(a.x, a.bf16, a.rows, a.cols, a.ld, st + 4, fa, plain, a.transposed ? other_ld : kp, transposed,
                           a.transposed ? kp : other_ld, nullptr, nullptr, stream, sums);
      set.other_a = {qo, !a.transposed, other_ld};
    } else {
      quantise(set, a, g.fp8.a, fa, 0, qa, kp, stream, sums);
    }
    sums_pending = g.a_column_sums != nullptr && !summed;
    if (g.a_column_sums != nullptr && summed) ++sums_in_pack_;
    set.last_a = current ? this_a : StreamSet::Tensor{};
    set.a_pack = current && out == qa ? this_pack : StreamSet::Pack{};
    return out;
  }

  // A weight-gradient product's B under current scaling (the layer's input x, transposed), packed
  // into fp8_b_kept with its scale in fp8_state[16] and [17], or, with b_as_before, found there as
  // the last such product packed it (the same tensor, extent and layout: v's, k's and q's weight
  // gradients reading one norm output, a SwiGLU's gate and up).
  const uint8_t* fp8_kept_b(const GemmCall& g, StreamSet& set, const Fp8Source& b, int64_t kp, cudaStream_t stream) {
    float* st = set.fp8_state;
    auto* q = reinterpret_cast<uint8_t*>(aligned256(set.fp8_b_kept.get(std::size_t(g.N * kp) + 256, stream)));
    const StreamSet::Pack this_pack{b.tensor(Fp8Format::e4m3), b.transposed, kp};
    if (g.fp8.b_as_before && set.kept_b == this_pack && set.fp8_products - set.kept_b_at <= 2) {
      set.kept_b_at = set.fp8_products;  // read again: the next call may read it from here (k's, then q's)
      ++inputs_reused_;
      return q;
    }
    scale_of(set, b, nullptr, Fp8Format::e4m3, st + 1, st + 16, st + 17, stream);
    launch_fp8_pack(b.x, b.bf16, b.rows, b.cols, b.ld, b.transposed, st + 16, Fp8Format::e4m3, q, kp, nullptr, nullptr, stream);
    set.kept_b = this_pack;
    set.kept_b_at = set.fp8_products;
    return q;
  }

  // A weight (B of a forward or input-gradient product) under current scaling, from its weight
  // pack (Fp8Slots::weight_pack: amax, scale and inverse in its first floats, then the copy K along
  // the stored rows, then the transposed one): read as it is when the pack was made from this
  // tensor at this extent and not forgotten since; else its scale from its amax
  // and both layouts from one read (the input gradient's product of the same micro-batch, and every
  // later micro-batch's products of the step, then read them).
  const uint8_t* fp8_weight(const GemmCall& g, StreamSet& set, const Fp8Source& b, cudaStream_t stream) {
    auto* base = static_cast<uint8_t*>(g.fp8.weight_pack);
    auto* f = reinterpret_cast<float*>(base);
    const int64_t plain_ld = (b.cols + 15) / 16 * 16, transposed_ld = (b.rows + 15) / 16 * 16;
    uint8_t* plain = base + 256;
    uint8_t* transposed = plain + (b.rows * plain_ld + 255) / 256 * 256;
    const StreamSet::Tensor t = b.tensor(Fp8Format::e4m3);
    StreamSet::Tensor& held = weight_packs_[base];
    if (held == t) {
      ++weight_packs_reused_;
    } else {
      ABLATE_CUDA_CHECK(cudaMemsetAsync(f, 0, sizeof(float), stream));  // the amax is a running max (fp8_kernels.hpp)
      scale_of(set, b, nullptr, Fp8Format::e4m3, f, f + 1, f + 2, stream);
      launch_fp8_pack_both(b.x, b.bf16, b.rows, b.cols, b.ld, f + 1, Fp8Format::e4m3, plain, plain_ld, transposed, transposed_ld,
                           nullptr, nullptr, stream);
      held = t;
    }
    return b.transposed ? transposed : plain;
  }

  // The plan of an FP8 problem: the TN form (cuBLASLt's A, our B, transposed), both operands
  // K-contiguous with leading dimension kp, compute and scale in fp32, D (and C) f32 or bf16, and
  // its epilogue; null when cuBLASLt has no algorithm for that epilogue (a product without one and
  // no algorithm is an error).
  Plan* plan_fp8(const std::string& key, const GemmCall& g, Fp8Format fa, int64_t kp, StreamSet& set) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
    auto p = std::make_unique<Plan>();
    check_lt(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", g);
    const cublasOperation_t op_first = CUBLAS_OP_T, op_second = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
             "cublasLtMatmulDescSetAttribute(TRANSA)", g);
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
             "cublasLtMatmulDescSetAttribute(TRANSB)", g);
    const auto u = [](int64_t v) { return uint64_t(v); };
    const cudaDataType_t ta = fa == Fp8Format::e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
    check_lt(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, u(kp), u(g.N), kp), "cublasLtMatrixLayoutCreate(B, fp8)", g);
    check_lt(cublasLtMatrixLayoutCreate(&p->b, ta, u(kp), u(g.M), kp), "cublasLtMatrixLayoutCreate(A, fp8)", g);
    const cudaDataType_t out_type = g.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatrixLayoutCreate(&p->c, out_type, u(g.N), u(g.M), g.ldc), "cublasLtMatrixLayoutCreate(C)", g);
    check_lt(cublasLtMatrixLayoutCreate(&p->d, out_type, u(g.N), u(g.M), g.ldc), "cublasLtMatrixLayoutCreate(D)", g);
    describe_epilogue(p.get(), g, set);
    const uint32_t align[4] = {256, 256, alignment_of(g.C != nullptr ? g.C : g.D), alignment_of(g.D)};
    if (!choose_algo(p.get(), g, align)) {
      if (no_epilogue(g)) throw_runtime_error("cuda_layers gemm", "cuBLASLt has no FP8 algorithm for " + shape_of(g));
      spdlog::info("cuda_layers: cuBLASLt has no FP8 algorithm for the {} epilogue of {}; its work runs in passes of its own",
                   fused_epilogue(g), shape_of(g));
      return nullptr;
    }
    return plans_.emplace(key, std::move(p)).first->second.get();
  }

  // A plan's epilogue: which one, the bias's type (D's, as cuBLASLt's bias and a bias gradient must
  // be) and the GELU matrix's leading dimension; and pointers the heuristic reads the alignment of
  // (the real ones are set before each run, point_epilogue; these, the bias or the 256-byte aligned
  // scratch a gradient goes to, align alike).
  static void describe_epilogue(Plan* p, const GemmCall& g, StreamSet& set) {
    const cublasLtEpilogue_t epi = epilogue_of(g);
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
               "cublasLtMatmulDescSetAttribute(EPILOGUE)", g);
    }
    if (g.bias != nullptr || g.bias_bf16 != nullptr || bias_grad_elements(g) > 0) {
      const cudaDataType_t bias_type = g.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)", g);
      const void* bias = g.bias != nullptr ? static_cast<const void*>(g.bias) : g.bias_bf16 != nullptr ? g.bias_bf16 : set.workspace;
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", g);
    }
    if (g.act != Activation::none) {
      const int64_t aux_ld = g.ldc;
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
               "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)", g);
    }
    point_epilogue(p, g, nullptr);
  }

  // This call's bias (when it adds one; `bias` null: leave it) and GELU matrix, into the plan.
  static void point_epilogue(Plan* p, const GemmCall& g, const void* bias) {
    if (bias != nullptr) {
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", g);
    }
    if (g.act != Activation::none) {
      const void* aux = g.aux;
      check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
               "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)", g);
    }
  }

  // The heuristic's first algorithm for a plan's descriptors, told each operand's alignment (in
  // cuBLASLt's order: its A is our B's memory); false when it has none.
  bool choose_algo(Plan* p, const GemmCall& g, const uint32_t (&align)[4]) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", g);
    const uint64_t ws = kWorkspaceBytes;
    cublasStatus_t rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && rc == CUBLAS_STATUS_SUCCESS; ++i) {
      rc = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i]));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (rc == CUBLAS_STATUS_SUCCESS) {
      rc = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->d, pref, 1, &result, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (rc != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    p->algo = result.algo;
    return true;
  }

  int64_t built() {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(plans_.size());
  }

  // gemm_bf16_once's copy: packed, 256-byte aligned, in a region of its own.
  const void* bf16_once(const float* x, int64_t rows, int64_t cols, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    uint16_t* copy = aligned256(on(stream).bf16_once.get(std::size_t(rows * cols) * 2 + 256, stream));
    launch_to_bf16(x, rows, cols, cols, copy, stream);
    ABLATE_CUDA_CHECK(cudaGetLastError());
    return copy;
  }

  int64_t unfused() {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(unfusable_.size());
  }

  int64_t scales_reused() {
    std::lock_guard<std::mutex> lock(mu_);
    return scales_reused_;
  }

  int64_t sums_in_pack() {
    std::lock_guard<std::mutex> lock(mu_);
    return sums_in_pack_;
  }
  int64_t sums_by_pass() {
    std::lock_guard<std::mutex> lock(mu_);
    return sums_by_pass_;
  }
  int64_t fp8_epilogues() {
    std::lock_guard<std::mutex> lock(mu_);
    return fp8_epilogues_;
  }

  int64_t packs_shared() {
    std::lock_guard<std::mutex> lock(mu_);
    return packs_shared_;
  }

  int64_t inputs_reused() {
    std::lock_guard<std::mutex> lock(mu_);
    return inputs_reused_;
  }

  void forget_weight_packs(const void* memory, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* begin = static_cast<const char*>(memory);
    weight_packs_.erase(weight_packs_.lower_bound(begin), weight_packs_.lower_bound(begin + bytes));
  }

  int64_t weight_packs_reused() {
    std::lock_guard<std::mutex> lock(mu_);
    return weight_packs_reused_;
  }

 private:
  // bf16: A and B as given in bf16, or rounded into packed copies (leading dimension = their row
  // length in memory).
  StreamSet& on(cudaStream_t stream) {
    std::unique_ptr<StreamSet>& set = streams_[stream];
    if (!set) set = std::make_unique<StreamSet>();
    return *set;
  }

  Operands operands(const GemmCall& g, StreamSet& set, cudaStream_t stream) {
    if (!bf16_family(g.mode)) return {g.A, g.lda, g.B, g.ldb};
    const int64_t a_rows = g.ta ? g.K : g.M, a_cols = g.ta ? g.M : g.K;
    const int64_t b_rows = g.tb ? g.N : g.K, b_cols = g.tb ? g.K : g.N;
    Operands ops{g.A_bf16, g.lda, g.B_bf16, g.ldb};  // operands held in bf16: read as they are
    if (!gemm_plan::bf16_in_place(g.A_bf16, g.A, g.lda)) {
      auto* a = aligned256(set.bf16_a.get(std::size_t(a_rows * a_cols) * 2 + 256, stream));
      launch_to_bf16(g.A, a_rows, a_cols, g.lda, a, stream);
      ops.A = a;
      ops.lda = a_cols;
    }
    if (!gemm_plan::bf16_in_place(g.B_bf16, g.B, g.ldb)) {
      auto* b = aligned256(set.bf16_b.get(std::size_t(b_rows * b_cols) * 2 + 256, stream));
      launch_to_bf16(g.B, b_rows, b_cols, g.ldb, b, stream);
      ops.B = b;
      ops.ldb = b_cols;
    }
    ABLATE_CUDA_CHECK(cudaGetLastError());
    return ops;
  }

  // The plan of a problem, built on first use; null when cuBLASLt has no algorithm for its
  // epilogue (a bias or fused epilogue: the caller falls back on passes); a product with no
  // epilogue and no algorithm is an error.
  Plan* plan(const std::string& key, const GemmCall& g, const Operands& ops, StreamSet& set) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
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
    describe_epilogue(p.get(), g, set);
    const auto u = [](int64_t v) { return uint64_t(v); };
    // B's memory, column-major: (N, K) when not transposed (row-major (K, N)), else (K, N).
    const cudaDataType_t in_type = bf16_family(g.mode) ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatrixLayoutCreate(&p->a, in_type, u(g.tb ? g.K : g.N), u(g.tb ? g.N : g.K), ops.ldb),
             "cublasLtMatrixLayoutCreate(B)", g);
    // A's memory, column-major: (K, M) when not transposed (row-major (M, K)), else (M, K).
    check_lt(cublasLtMatrixLayoutCreate(&p->b, in_type, u(g.ta ? g.M : g.K), u(g.ta ? g.K : g.M), ops.lda),
             "cublasLtMatrixLayoutCreate(A)", g);
    const cudaDataType_t out_type = g.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatrixLayoutCreate(&p->c, out_type, u(g.N), u(g.M), g.ldc), "cublasLtMatrixLayoutCreate(C)", g);
    check_lt(cublasLtMatrixLayoutCreate(&p->d, out_type, u(g.N), u(g.M), g.ldc), "cublasLtMatrixLayoutCreate(D)", g);
    // Each operand's alignment, in cuBLASLt's order (its A is our B's memory).
    const uint32_t align[4] = {alignment_of(ops.B), alignment_of(ops.A), alignment_of(g.C != nullptr ? g.C : g.D), alignment_of(g.D)};
    if (!choose_algo(p.get(), g, align)) {
      if (no_epilogue(g)) throw_runtime_error("cuda_layers gemm", "cuBLASLt has no algorithm for " + shape_of(g));
      // Said once per problem (the caller remembers it): a run that falls back is slower, not wrong.
      spdlog::info("cuda_layers: cuBLASLt has no algorithm for the {} epilogue of {}; its work runs in passes of its own",
                   fused_epilogue(g), shape_of(g));
      return nullptr;
    }
    return plans_.emplace(key, std::move(p)).first->second.get();
  }

  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<cudaStream_t, std::unique_ptr<StreamSet>> streams_;
  std::map<std::string, std::unique_ptr<Plan>> plans_;
  std::set<std::string> unfusable_;  // problems whose fused epilogue cuBLASLt has no algorithm for
  int64_t scales_reused_ = 0;        // FP8 products whose A was quantised with the last product's scale
  int64_t fp8_epilogues_ = 0;        // FP8 products run with their epilogue fused
  int64_t sums_in_pack_ = 0;         // a_column_sums taken in the pass that quantised A
  int64_t sums_by_pass_ = 0;         // a_column_sums taken by a pass of their own
  int64_t packs_shared_ = 0;         // FP8 products that read the A the product before them packed for them
  int64_t inputs_reused_ = 0;        // FP8 products that read a layer input packed by an earlier one (a_as_before, b_as_before)
  int64_t weight_packs_reused_ = 0;  // FP8 products that read a weight's copy an earlier one made (Fp8Slots::weight_pack)
  // What each weight pack holds (by its memory): the weight it was made from; none before its first.
  std::map<const void*, StreamSet::Tensor> weight_packs_;
};

Context& context() {
  static Context ctx;
  return ctx;
}

}  // namespace


namespace {

// The epilogue's work in passes of its own, after a product with at most a bias: the GELU (its
// pre-activation product first into aux), the GELU gradient, the bias gradients (as cuBLASLt
// products with a ones vector, add_column_sums).
void gemm_unfused(const GemmCall& g, cudaStream_t stream) {
  if ((g.act != Activation::none && g.ldc != g.N) || (g.a_sums != nullptr && g.lda != g.M)) {
    throw_runtime_error("cuda_layers gemm", "an unfused epilogue needs packed operands; got " + shape_of(g));
  }
  GemmCall plain = g;
  plain.act = Activation::none;
  plain.aux = plain.d_column_sums = plain.a_sums = nullptr;
  if (g.act == Activation::gelu_aux) plain.D = g.aux;
  // The product with its bias fused where cuBLASLt can; else (a bias it cannot fuse, or has no
  // algorithm for: said once per problem) the product, then the bias.
  if (fused_epilogue(plain).empty() || !context().run(plain, stream)) {
    plain.bias = nullptr;
    context().run(plain, stream);  // no epilogue: runs, or throws naming the problem
    if (g.bias != nullptr) launch_add_bias(plain.D, g.bias, g.M, g.N, stream);
  }
  const int64_t n = g.M * g.N;
  if (g.act == Activation::gelu_aux) launch_gelu_forward(g.aux, g.D, n, stream);
  if (g.act == Activation::dgelu) launch_gelu_backward(g.aux, g.D, n, stream);
  if (g.d_column_sums != nullptr) add_column_sums(g.D, g.d_column_sums, g.M, g.N, stream);
  if (g.a_sums != nullptr && g.A != nullptr) add_column_sums(g.A, g.a_sums, g.K, g.M, stream);
  if (g.a_sums != nullptr && g.A == nullptr) add_column_sums_bf16(static_cast<const uint16_t*>(g.A_bf16), g.a_sums, g.K, g.M, stream);
}

}  // namespace

void gemm(const GemmCall& call, cudaStream_t stream) {
  if (call.M == 0 || call.N == 0) return;
  if (const std::string why = gemm_refusal(call); !why.empty()) throw_runtime_error("cuda_layers gemm", why + ": " + shape_of(call));
  GemmCall g = call;
  if (fp8_mode(g.mode) && g.a_sums != nullptr) {  // FP8: a weight-gradient product's bias gradient from A's pack
    g.a_column_sums = g.a_sums;
    g.a_sums = nullptr;
  }
  if (!fused_epilogue(g).empty() && context().run(g, stream)) return;
  // The passes work in f32: a bf16 D's epilogue is fused or done by its caller (gemm_fused_only).
  if (g.d_bf16 && !no_epilogue(g)) throw_runtime_error("cuda_layers gemm", "no fallback for the epilogue of " + shape_of(g));
  gemm_unfused(g, stream);
}

namespace {

// A call whose epilogue has no pass to fall back on here (a bf16 D: the passes would round twice):
// true when cuBLASLt ran it with the epilogue fused, false (nothing written) when it serves no such
// epilogue, and the caller computes the result another way.
bool gemm_fused_only(const GemmCall& g, cudaStream_t stream) {
  if (g.M == 0 || g.N == 0) return true;
  if (const std::string why = gemm_refusal(g); !why.empty()) throw_runtime_error("cuda_layers gemm", why + ": " + shape_of(g));
  return !fused_epilogue(g).empty() && context().run(g, stream);
}

}  // namespace

Operand gemm_bf16_once(const float* x, int64_t rows, int64_t cols, cudaStream_t stream, MatmulMode mode) {
  // Rows that are not 16-byte multiples are packed by each product anyway (bf16_in_place).
  if (mode != MatmulMode::bf16 || rows * cols == 0 || (cols * 2) % 16 != 0) return {x};
  return {x, context().bf16_once(x, rows, cols, stream)};
}

int64_t gemm_plans_built() { return context().built(); }

int64_t gemm_unfused_problems() { return context().unfused(); }

int64_t gemm_fp8_scales_reused() { return context().scales_reused(); }

int64_t gemm_fp8_sums_in_pack() { return context().sums_in_pack(); }

int64_t gemm_fp8_sums_by_pass() { return context().sums_by_pass(); }

int64_t gemm_fp8_epilogues_fused() { return context().fp8_epilogues(); }

int64_t gemm_fp8_packs_shared() { return context().packs_shared(); }

int64_t gemm_fp8_inputs_reused() { return context().inputs_reused(); }

int64_t gemm_fp8_weight_packs_reused() { return context().weight_packs_reused(); }

void fp8_weight_packs_forget(const void* memory, int64_t bytes) { context().forget_weight_packs(memory, bytes); }

int64_t fp8_weight_pack_bytes(int64_t rows, int64_t cols) {
  const auto part = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  return 256 + part(rows * ((cols + 15) / 16 * 16)) + part(cols * ((rows + 15) / 16 * 16));
}

int64_t gemm_workspace_bytes(MatmulMode mode, int64_t rows, int64_t in, int64_t out) {
  int64_t bytes = int64_t(kWorkspaceBytes);
  if (bf16_family(mode)) {
    const int64_t wide = std::max(in, out);
    // A: an activation; B: the weight or one; a shared output gradient; each 256 bytes over, to
    // align it.
    bytes += 2 * (2 * rows * wide + std::max(in * out, rows * wide)) + 3 * 256;
  }
  if (fp8_mode(mode)) {
    // The quantised A and B (one byte an element, K padded to 16), A's other layout (an output
    // gradient quantised for both its products at once), a weight-gradient product's B kept for the
    // next (the layer's input, transposed), and the scaling state.
    const int64_t wide = std::max(in, out) + 16;
    bytes += rows * wide + std::max(in * out + 16 * wide, rows * wide) + 2 * (rows + 16) * wide + 4 * 256 + 32;
    bytes += 4 * fp8_column_partials(rows, std::max(in, out));  // a bias gradient taken in a pack
  }
  return bytes + 4 * std::max(in, out) + 256;  // a fused bias gradient, before it is added
}

namespace {

// y(rows, out) = x(rows, in) W^T, W (out, in): the forward product of a dense layer.
GemmCall x_wt_call(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, float* y, MatmulMode mode) {
  GemmCall g;
  g.mode = mode;
  g.tb = true;
  g.M = rows;
  g.N = out;
  g.K = in;
  g.A = x.f32;
  g.A_bf16 = bf16_family(mode) ? x.bf16 : nullptr;
  g.lda = in;
  g.B = W.f32;
  g.B_bf16 = bf16_family(mode) ? W.bf16 : nullptr;
  g.ldb = in;
  g.D = y;
  g.ldc = out;
  return g;
}

// dx(rows, in) = dy(rows, out) W: the input-gradient product of a dense layer.
GemmCall dy_w_call(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, float* dx, MatmulMode mode) {
  GemmCall g;
  g.mode = mode;
  g.M = rows;
  g.N = in;
  g.K = out;
  g.A = dy.f32;
  g.A_bf16 = bf16_family(mode) ? dy.bf16 : nullptr;
  g.a_grad = true;
  g.lda = out;
  g.B = W.f32;
  g.B_bf16 = bf16_family(mode) ? W.bf16 : nullptr;
  g.ldb = in;
  g.D = dx;
  g.ldc = in;
  return g;
}

}  // namespace

void gemm_x_wt(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const float* bias, const float* c, float beta, float* y,
               cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = x_wt_call(x, rows, in, out, W, y, mode);
  g.fp8 = slots;
  g.beta = beta;
  g.C = c;
  g.bias = bias;
  gemm(g, stream);
}

void gemm_x_wt_gelu(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const float* bias, float* pre, float* y,
                    cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = x_wt_call(x, rows, in, out, W, y, mode);
  g.fp8 = slots;
  g.bias = bias;
  g.act = Activation::gelu_aux;
  g.aux = pre;
  gemm(g, stream);
}

void gemm_x_wt_bf16_out(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, uint16_t* y, cudaStream_t stream, MatmulMode mode,
                        Fp8Slots slots) {
  GemmCall g = x_wt_call(x, rows, in, out, W, reinterpret_cast<float*>(y), mode);
  g.fp8 = slots;
  g.d_bf16 = true;
  gemm(g, stream);
}

bool gemm_x_wt_bias_bf16_out(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const void* bias_bf16, uint16_t* y,
                             cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = x_wt_call(x, rows, in, out, W, reinterpret_cast<float*>(y), mode);
  g.fp8 = slots;
  g.d_bf16 = true;
  g.bias_bf16 = bias_bf16;
  return gemm_fused_only(g, stream);
}

bool gemm_x_wt_residual_bf16(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const void* bias_bf16,
                             const uint16_t* residual, uint16_t* y, cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = x_wt_call(x, rows, in, out, W, reinterpret_cast<float*>(y), mode);
  g.fp8 = slots;
  g.d_bf16 = true;
  g.bias_bf16 = bias_bf16;
  g.C = reinterpret_cast<const float*>(residual);  // D's type: bf16
  g.beta = 1.0f;
  return gemm_fused_only(g, stream);
}

bool gemm_x_wt_gelu_bf16(Operand x, int64_t rows, int64_t in, int64_t out, Weight W, const void* bias_bf16, uint16_t* pre,
                         uint16_t* post, cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = x_wt_call(x, rows, in, out, W, reinterpret_cast<float*>(post), mode);
  g.fp8 = slots;
  g.d_bf16 = true;
  g.bias_bf16 = bias_bf16;
  g.act = Activation::gelu_aux;
  g.aux = reinterpret_cast<float*>(pre);
  return gemm_fused_only(g, stream);
}

bool gemm_dy_w_dgelu_bf16(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, const uint16_t* pre, uint16_t* dpre, float* db,
                          cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = dy_w_call(dy, rows, in, out, W, reinterpret_cast<float*>(dpre), mode);
  g.fp8 = slots;
  g.d_bf16 = true;
  g.act = Activation::dgelu;
  g.aux = const_cast<float*>(reinterpret_cast<const float*>(pre));  // read only under dgelu
  g.d_column_sums = db;
  return gemm_fused_only(g, stream);
}

void gemm_dy_w_bf16_out(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, uint16_t* dx, cudaStream_t stream,
                        MatmulMode mode, Fp8Slots slots, bool dy_read_again, float* dy_sums, bool dy_scale_reused) {
  GemmCall g = dy_w_call(dy, rows, in, out, W, reinterpret_cast<float*>(dx), mode);
  g.fp8 = slots;
  g.a_read_again = dy_read_again;
  g.a_scale_reused = dy_scale_reused;
  g.a_column_sums = dy_sums;
  g.d_bf16 = true;
  gemm(g, stream);
}

void gemm_dy_w(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, bool accumulate, float* dx, cudaStream_t stream,
               MatmulMode mode, Fp8Slots slots, bool dy_scale_reused, bool dy_read_again, float* dy_sums) {
  GemmCall g = dy_w_call(dy, rows, in, out, W, dx, mode);
  g.fp8 = slots;
  g.a_column_sums = dy_sums;
  g.a_scale_reused = dy_scale_reused;
  g.a_read_again = dy_read_again;
  g.beta = accumulate ? 1.0f : 0.0f;
  gemm(g, stream);
}

void gemm_dy_w_dgelu(Operand dy, int64_t rows, int64_t in, int64_t out, Weight W, const float* pre, float* dpre, float* db,
                     cudaStream_t stream, MatmulMode mode, Fp8Slots slots) {
  GemmCall g = dy_w_call(dy, rows, in, out, W, dpre, mode);
  g.fp8 = slots;
  g.act = Activation::dgelu;
  g.aux = const_cast<float*>(pre);  // read only under dgelu
  g.d_column_sums = db;
  gemm(g, stream);
}

void gemm_add_dyt_x(Operand dy, int64_t rows, int64_t in, int64_t out, Operand x, float* dW, float* db, cudaStream_t stream,
                    MatmulMode mode, Fp8Slots slots, bool dy_scale_reused, bool dy_read_again) {
  GemmCall g;
  g.fp8 = slots;
  g.a_scale_reused = dy_scale_reused;
  g.a_read_again = dy_read_again;
  g.mode = mode;
  g.ta = true;
  g.M = out;
  g.N = in;
  g.K = rows;
  g.A = dy.f32;
  g.A_bf16 = bf16_family(mode) ? dy.bf16 : nullptr;
  g.a_grad = true;
  g.lda = out;
  g.B = x.f32;
  g.B_bf16 = bf16_family(mode) ? x.bf16 : nullptr;
  g.ldb = in;
  g.beta = 1.0f;
  g.D = dW;
  g.ldc = in;
  g.a_sums = db;
  gemm(g, stream);
}

}  // namespace ablate::cuda_layers
