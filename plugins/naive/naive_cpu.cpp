// The `naive_cpu` attention backend: exact causal softmax attention on the CPU in f32 or f64, the
// reference every other backend is checked against. Work follows the batch's segment layout, so a
// row costs the sum over its segments of length^2 (block-diagonal causal), never T^2; positions
// outside every segment (padding) get zero output and zero gradient.
//
// Each segment and head is computed in blocks of query rows with BLAS matrix products: the block's
// scores S = scale * Q K^T against the keys up to its last row, the causal mask and a row softmax
// (its logsumexp, (B, H, T), is kept in `saved`), then O = P V. Backward recomputes P from q, k and
// that statistic and applies the softmax backward
//   dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  rowsum(P * dP) = dot(d_out_i, out_i),
//   dQ = scale * dS K,  dK += scale * dS^T Q,  dV += P^T dO.
// `saved` is f32 as the interface describes; for an f64 problem the caller may hand an f64 buffer
// of the same element count instead, which keeps the gradients at full double precision.
//
// Threads: forward splits over (row, segment, query head), backward over (row, segment, kv head)
// so each thread owns the d_k/d_v rows of its kv head and the d_q rows of that head's query group,
// accumulated over the group's heads and the query blocks in a fixed order. BLAS runs on the
// calling thread inside the parallel region, so results do not depend on the thread count or
// schedule.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cblas.h>

#include "ablate/attention.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"

namespace {

using ablate::AttentionProblem;
using ablate::DType;
using ablate::DeviceType;
using ablate::TensorView;

constexpr const char* kWhere = "naive_cpu";

// The batch's segment layout as host memory (a model on the cpu device views its Batch in place).
struct SegmentLayout {
  int32_t rows = 0, seq_len = 0;
  std::span<const ablate::Segment> segments;
  std::span<const int32_t> row_segments;
};

SegmentLayout layout_of(const ablate::BatchViews& v) {
  if (v.device != DeviceType::cpu || v.segments.dtype != DType::i32 || v.row_segments.dtype != DType::i32) {
    ablate::throw_runtime_error(kWhere, "the batch's segment layout is not host i32 memory");
  }
  SegmentLayout l;
  l.rows = v.rows;
  l.seq_len = v.seq_len;
  l.segments = {reinterpret_cast<const ablate::Segment*>(v.segments.data), std::size_t(v.num_segments)};
  l.row_segments = {v.row_segments.as<const int32_t>(), std::size_t(v.row_segments.numel())};
  return l;
}

void check_saved(const TensorView& saved, const AttentionProblem& p) {
  const int64_t need = int64_t(p.batch) * p.heads * p.seq_len;
  if (saved.numel() != need) {
    ablate::throw_runtime_error(kWhere, "saved holds " + std::to_string(saved.numel()) + " elements, expected " +
                                            std::to_string(need) + " (batch * heads * seq_len)");
  }
  const bool dtype_ok = saved.dtype == DType::f32 || (saved.dtype == DType::f64 && p.dtype == DType::f64);
  if (!dtype_ok) {
    ablate::throw_runtime_error(kWhere, std::string("saved is ") + ablate::to_string(saved.dtype) +
                                            ", expected f32 (or f64 for an f64 problem)");
  }
  if (saved.device != DeviceType::cpu || (saved.data == nullptr && need > 0)) {
    ablate::throw_runtime_error(kWhere, "saved must be a host buffer");
  }
}

// Checks the problem itself and the batch's segment layout against it.
void check_problem(const AttentionProblem& p, const SegmentLayout& batch) {
  if (p.batch < 0 || p.seq_len < 0 || p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0) {
    ablate::throw_runtime_error(kWhere, "batch and seq_len must be >= 0, heads, kv_heads and head_dim > 0");
  }
  if (p.heads % p.kv_heads != 0) {
    ablate::throw_runtime_error(kWhere, "heads (" + std::to_string(p.heads) + ") is not a multiple of kv_heads (" +
                                            std::to_string(p.kv_heads) + ")");
  }
  if (p.device != DeviceType::cpu || (p.dtype != DType::f32 && p.dtype != DType::f64)) {
    ablate::throw_runtime_error(kWhere, std::string("naive_cpu runs on the CPU in f32/f64; got ") + ablate::to_string(p.device) + "/" +
                                            ablate::to_string(p.dtype));
  }
  if (batch.rows != p.batch || batch.seq_len != p.seq_len) {
    ablate::throw_runtime_error(kWhere, "batch is " + std::to_string(batch.rows) + " x " + std::to_string(batch.seq_len) +
                                            " but the problem is " + std::to_string(p.batch) + " x " + std::to_string(p.seq_len));
  }
  if (batch.row_segments.size() != std::size_t(p.batch) + 1 || batch.row_segments.front() != 0 ||
      batch.row_segments.back() != int32_t(batch.segments.size())) {
    ablate::throw_runtime_error(kWhere, "batch.row_segments must hold rows + 1 offsets from 0 to the number of "
                                        "segments");
  }
  for (int32_t b = 0; b < p.batch; ++b) {
    const int32_t first = batch.row_segments[std::size_t(b)], last = batch.row_segments[std::size_t(b) + 1];
    if (first > last) ablate::throw_runtime_error(kWhere, "batch.row_segments decreases at row " + std::to_string(b));
    int32_t end = 0;
    for (int32_t s = first; s < last; ++s) {
      const ablate::Segment& seg = batch.segments[std::size_t(s)];
      if (seg.start < end || seg.length < 0 || int64_t(seg.start) + seg.length > p.seq_len) {
        ablate::throw_runtime_error(kWhere, "row " + std::to_string(b) + " segment " + std::to_string(s - first) + " (start " +
                                                std::to_string(seg.start) + ", length " + std::to_string(seg.length) +
                                                ") overlaps the previous one or leaves the row of " + std::to_string(p.seq_len) +
                                                " positions");
      }
      end = seg.start + seg.length;
    }
  }
}

// Threads for one parallel region: the run's `threads` when set, else OpenMP's default.
int team_size(int threads) {
#ifdef _OPENMP
  return threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

// While alive, OpenBLAS runs each call on the calling thread. The OpenMP build of OpenBLAS does so by
// itself inside a parallel region; the pthreads build would start its own workers for every call from
// every team thread, so its thread count is lowered to 1 for the region and restored afterwards.
class SerialBlas {
 public:
  SerialBlas() : active_(openblas_get_parallel() == 1) {
    if (active_) {
      saved_ = openblas_get_num_threads();
      if (saved_ != 1) openblas_set_num_threads(1);
    }
  }
  ~SerialBlas() {
    if (active_ && saved_ != 1) openblas_set_num_threads(saved_);
  }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;

 private:
  bool active_;
  int saved_ = 1;
};

// Row-major C = alpha * op(A) op(B) + beta * C.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha,
              a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha,
              a, int(lda), b, int(ldb), beta, c, int(ldc));
}

int32_t longest_segment(const SegmentLayout& batch) {
  int32_t n = 0;
  for (const ablate::Segment& s : batch.segments) n = std::max(n, s.length);
  return n;
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Index helpers for the contiguous (B, T, heads, D) layouts.
struct Layout {
  int64_t T, H, Hkv, D;
  int64_t q(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }
  int64_t kv(int64_t b, int64_t t, int64_t g) const { return ((b * T + t) * Hkv + g) * D; }
  int64_t stat(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * T + t; }
};

// Queries are taken kBlock at a time: a block of rows scores against the keys up to its last row
// only, so a segment of length n costs about n^2 / 2 + n * kBlock / 2 products, and the scratch a
// thread needs is kBlock * n per matrix rather than n^2.
constexpr int64_t kBlock = 64;

// One unit of parallel work: a segment of a row for one head (a query head in forward, a kv head
// with its query group in backward). Every unit writes its own outputs, so the result does not
// depend on which thread runs it.
struct Unit {
  int32_t row, start, length, head;
};

std::vector<Unit> units(const SegmentLayout& batch, int32_t heads) {
  std::vector<Unit> out;
  for (int32_t b = 0; b < batch.rows; ++b) {
    for (int32_t s = batch.row_segments[std::size_t(b)]; s < batch.row_segments[std::size_t(b) + 1]; ++s) {
      const ablate::Segment& seg = batch.segments[std::size_t(s)];
      if (seg.length == 0) continue;
      for (int32_t h = 0; h < heads; ++h) out.push_back({b, seg.start, seg.length, h});
    }
  }
  // Longest first, so the dynamic schedule ends with short units and the threads finish together.
  std::stable_sort(out.begin(), out.end(), [](const Unit& a, const Unit& b) { return a.length > b.length; });
  return out;
}

template <class T, class S>
void forward_impl(const AttentionProblem& p, const SegmentLayout& batch, const T* q, const T* k, const T* v, T* out, S* lse,
                  int threads) {
  const Layout L{p.seq_len, p.heads, p.kv_heads, p.head_dim};
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  const int64_t ldq = L.H * D, ldkv = L.Hkv * D;
  const T scale = T(1) / std::sqrt(T(D));
  // Padding positions keep these zeros; every position inside a segment is overwritten below.
  std::fill_n(out, int64_t(p.batch) * L.T * ldq, T(0));
  std::fill_n(lse, int64_t(p.batch) * L.H * L.T, S(0));
  const std::vector<Unit> work = units(batch, p.heads);
  const int64_t n_work = int64_t(work.size());
  const int64_t width = std::max<int64_t>(longest_segment(batch), 1);
  SerialBlas serial_blas;
#pragma omp parallel num_threads(team_size(threads))
  {
    std::vector<T> scores(std::size_t(kBlock * width));
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_work; ++w) {
      const Unit& u = work[std::size_t(w)];
      const int64_t h = u.head, g = h / group, len = u.length;
      const T* qs = q + L.q(u.row, u.start, h);
      const T* ks = k + L.kv(u.row, u.start, g);
      const T* vs = v + L.kv(u.row, u.start, g);
      T* os = out + L.q(u.row, u.start, h);
      S* ls = lse + L.stat(u.row, h, u.start);
      for (int64_t i0 = 0; i0 < len; i0 += kBlock) {
        const int64_t rows = std::min(kBlock, len - i0), cols = i0 + rows;
        T* sc = scores.data();
        gemm(false, true, rows, cols, D, scale, qs + i0 * ldq, ldq, ks, ldkv, T(0), sc, cols);
        T inv_sums[kBlock];
        for (int64_t r = 0; r < rows; ++r) {
          T* row = sc + r * cols;
          const int64_t n = i0 + r + 1;  // keys 0..i0+r of the segment
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
          T sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            const T e = std::exp(row[j] - m);
            row[j] = e;
            sum += e;
          }
          std::fill(row + n, row + cols, T(0));
          inv_sums[r] = T(1) / sum;
          ls[i0 + r] = S(m + std::log(sum));
        }
        T* ob = os + i0 * ldq;
        gemm(false, false, rows, D, cols, T(1), sc, cols, vs, ldkv, T(0), ob, ldq);
        for (int64_t r = 0; r < rows; ++r) {
          T* o = ob + r * ldq;
          for (int64_t d = 0; d < D; ++d) o[d] *= inv_sums[r];
        }
      }
    }
  }
}

template <class T, class S>
void backward_impl(const AttentionProblem& p, const SegmentLayout& batch, const T* q, const T* k, const T* v, const T* out,
                   const S* lse, const T* d_out, T* d_q, T* d_k, T* d_v, int threads) {
  const Layout L{p.seq_len, p.heads, p.kv_heads, p.head_dim};
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  const int64_t ldq = L.H * D, ldkv = L.Hkv * D;
  const T scale = T(1) / std::sqrt(T(D));
  // d_k and d_v accumulate over the query group and the query blocks; padding keeps the zeros.
  std::fill_n(d_q, int64_t(p.batch) * L.T * ldq, T(0));
  std::fill_n(d_k, int64_t(p.batch) * L.T * ldkv, T(0));
  std::fill_n(d_v, int64_t(p.batch) * L.T * ldkv, T(0));
  const std::vector<Unit> work = units(batch, p.kv_heads);
  const int64_t n_work = int64_t(work.size());
  const int64_t width = std::max<int64_t>(longest_segment(batch), 1);
  SerialBlas serial_blas;
#pragma omp parallel num_threads(team_size(threads))
  {
    std::vector<T> probs(std::size_t(kBlock * width)), grads(std::size_t(kBlock * width));
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_work; ++w) {
      const Unit& u = work[std::size_t(w)];
      const int64_t g = u.head, len = u.length;
      const T* ks = k + L.kv(u.row, u.start, g);
      const T* vs = v + L.kv(u.row, u.start, g);
      T* dks = d_k + L.kv(u.row, u.start, g);
      T* dvs = d_v + L.kv(u.row, u.start, g);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* qs = q + L.q(u.row, u.start, h);
        const T* os = out + L.q(u.row, u.start, h);
        const T* dos = d_out + L.q(u.row, u.start, h);
        T* dqs = d_q + L.q(u.row, u.start, h);
        const S* ls = lse + L.stat(u.row, h, u.start);
        for (int64_t i0 = 0; i0 < len; i0 += kBlock) {
          const int64_t rows = std::min(kBlock, len - i0), cols = i0 + rows;
          T* pr = probs.data();
          T* ds = grads.data();
          gemm(false, true, rows, cols, D, scale, qs + i0 * ldq, ldq, ks, ldkv, T(0), pr, cols);
          gemm(false, true, rows, cols, D, T(1), dos + i0 * ldq, ldq, vs, ldkv, T(0), ds, cols);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r, n = i + 1;
            T* prow = pr + r * cols;
            T* drow = ds + r * cols;
            const T li = T(ls[i]);
            const T delta = dot(dos + i * ldq, os + i * ldq, D);
            for (int64_t j = 0; j < n; ++j) {
              const T pij = std::exp(prow[j] - li);
              prow[j] = pij;
              drow[j] = pij * (drow[j] - delta) * scale;
            }
            std::fill(prow + n, prow + cols, T(0));
            std::fill(drow + n, drow + cols, T(0));
          }
          gemm(false, false, rows, D, cols, T(1), ds, cols, ks, ldkv, T(0), dqs + i0 * ldq, ldq);
          gemm(true, false, cols, D, rows, T(1), ds, cols, qs + i0 * ldq, ldq, T(1), dks, ldkv);
          gemm(true, false, cols, D, rows, T(1), pr, cols, dos + i0 * ldq, ldq, T(1), dvs, ldkv);
        }
      }
    }
  }
}

class NaiveCpu final : public ablate::Attention {
 public:
  explicit NaiveCpu(int threads) : threads_(threads) {}

  std::string supports(const AttentionProblem& p) const override {
    if (p.device != DeviceType::cpu || (p.dtype != DType::f32 && p.dtype != DType::f64) || p.bf16_out || p.bf16_qkv) {
      return std::string("naive_cpu runs on the CPU in f32/f64, every tensor in the problem's dtype; got ") +
             ablate::to_string(p.device) + "/" + ablate::to_string(p.dtype) + (p.bf16_out ? " with out in bf16" : "") +
             (p.bf16_qkv ? " with q, k, v in bf16" : "");
    }
    if (p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0 || p.heads % p.kv_heads != 0) {
      return "naive_cpu needs heads, kv_heads and head_dim > 0 with heads a multiple of kv_heads; got heads " +
             std::to_string(p.heads) + ", kv_heads " + std::to_string(p.kv_heads) + ", head_dim " + std::to_string(p.head_dim);
    }
    return "";
  }

  int64_t saved_elements(const AttentionProblem& p) const override { return int64_t(p.batch) * p.heads * p.seq_len; }

  void forward(const ablate::AttentionCall& c) override {
    ablate::check_attention_forward_tensors(kWhere, c, DeviceType::cpu);
    const AttentionProblem& p = *c.problem;
    const TensorView &q = c.q, &k = c.k, &v = c.v, &out = c.out, &saved = c.saved;
    const SegmentLayout batch = layout_of(*c.batch);
    check_problem(p, batch);
    check_saved(saved, p);
    if (p.dtype == DType::f32) {
      forward_impl(p, batch, q.as<const float>(), k.as<const float>(), v.as<const float>(), out.as<float>(), saved.as<float>(),
                   threads_);
    } else if (saved.dtype == DType::f64) {
      forward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(), out.as<double>(), saved.as<double>(),
                   threads_);
    } else {
      forward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(), out.as<double>(), saved.as<float>(),
                   threads_);
    }
  }

  void backward(const ablate::AttentionCall& c) override {
    ablate::check_attention_backward_tensors(kWhere, c, DeviceType::cpu);
    const AttentionProblem& p = *c.problem;
    const TensorView &q = c.q, &k = c.k, &v = c.v, &out = c.out, &saved = c.saved, &d_out = c.d_out, &d_q = c.d_q, &d_k = c.d_k,
                     &d_v = c.d_v;
    const SegmentLayout batch = layout_of(*c.batch);
    check_problem(p, batch);
    check_saved(saved, p);
    if (p.dtype == DType::f32) {
      backward_impl(p, batch, q.as<const float>(), k.as<const float>(), v.as<const float>(), out.as<const float>(),
                    saved.as<const float>(), d_out.as<const float>(), d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), threads_);
    } else if (saved.dtype == DType::f64) {
      backward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(), out.as<const double>(),
                    saved.as<const double>(), d_out.as<const double>(), d_q.as<double>(), d_k.as<double>(), d_v.as<double>(),
                    threads_);
    } else {
      backward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(), out.as<const double>(),
                    saved.as<const float>(), d_out.as<const double>(), d_q.as<double>(), d_k.as<double>(), d_v.as<double>(), threads_);
    }
  }

 private:
  int threads_;
};

// Registered as `naive` too, the exact backend's name on every device (naive_cuda serves it on cuda).
void register_components(ablate::Registrar& r) {
  const auto make = [](const ablate::ComponentArgs& a) -> std::unique_ptr<ablate::Component> {
    return std::make_unique<NaiveCpu>(a.run.threads);
  };
  r.add({ablate::Kind::attention,
         "naive_cpu",
         "1.0.0",
         "exact causal softmax attention on the CPU (f32/f64, segments, GQA): the reference backend",
         {},
         make,
         "",
         {"cpu"}});
  r.add({ablate::Kind::attention,
         "naive",
         "1.0.0",
         "exact causal softmax attention on every device (naive_cpu on the cpu, naive_cuda on cuda): the reference backend",
         {},
         make,
         "",
         {"cpu"}});
}

}  // namespace

ABLATE_PLUGIN("naive_cpu", "1.0.0", register_components)
