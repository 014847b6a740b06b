// The `naive_cpu` attention backend: exact causal softmax attention on the CPU in f32 or f64, the
// reference every other backend is checked against. Loops follow the batch's segment layout, so a
// row costs the sum over its segments of length^2 (block-diagonal causal), never T^2; positions
// outside every segment (padding) get zero output and zero gradient.
//
// Forward keeps the logsumexp of each query's scaled scores, (B, H, T), in `saved`; backward
// recomputes the probabilities from q, k and that statistic and applies the softmax backward
//   dS_ij = P_ij * (dP_ij - sum_j P_ij dP_ij),   sum_j P_ij dP_ij = dot(d_out_i, out_i).
// `saved` is f32 as the interface describes; for an f64 problem the caller may hand an f64 buffer
// of the same element count instead, which keeps the gradients at full double precision.
//
// Threads: forward splits over (row, query head), backward over (row, kv head) so each thread owns
// the d_k/d_v rows of its kv head and the d_q rows of that head's query group. Every sum runs in a
// fixed order, so results do not depend on the thread count or schedule.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ablate/attention.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"

namespace {

using ablate::AttentionProblem;
using ablate::Batch;
using ablate::DType;
using ablate::DeviceType;
using ablate::TensorView;

constexpr const char* kWhere = "naive_cpu";

std::string shape_string(const TensorView& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + ")";
}

void check_tensor(const char* name, const TensorView& t, const AttentionProblem& p, int64_t heads) {
  const int64_t want[4] = {p.batch, p.seq_len, heads, p.head_dim};
  bool ok = t.ndim == 4;
  for (int i = 0; ok && i < 4; ++i) ok = t.shape[i] == want[i];
  if (!ok) {
    ablate::throw_runtime_error(kWhere, std::string(name) + " has shape " + shape_string(t) + ", expected (" +
                                            std::to_string(p.batch) + ", " + std::to_string(p.seq_len) + ", " +
                                            std::to_string(heads) + ", " + std::to_string(p.head_dim) + ")");
  }
  if (t.dtype != p.dtype) {
    ablate::throw_runtime_error(kWhere, std::string(name) + " is " + ablate::to_string(t.dtype) +
                                            " but the problem is " + ablate::to_string(p.dtype));
  }
  if (t.device != DeviceType::cpu) {
    ablate::throw_runtime_error(kWhere, std::string(name) + " lives on " + ablate::to_string(t.device) +
                                            "; naive_cpu reads host memory only");
  }
  if (t.data == nullptr && t.numel() > 0) {
    ablate::throw_runtime_error(kWhere, std::string(name) + " has no data");
  }
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
void check_problem(const AttentionProblem& p, const Batch& batch) {
  if (p.batch < 0 || p.seq_len < 0 || p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0) {
    ablate::throw_runtime_error(kWhere, "batch and seq_len must be >= 0, heads, kv_heads and head_dim > 0");
  }
  if (p.heads % p.kv_heads != 0) {
    ablate::throw_runtime_error(kWhere, "heads (" + std::to_string(p.heads) + ") is not a multiple of kv_heads (" +
                                            std::to_string(p.kv_heads) + ")");
  }
  if (p.device != DeviceType::cpu || (p.dtype != DType::f32 && p.dtype != DType::f64)) {
    ablate::throw_runtime_error(kWhere, std::string("naive_cpu runs on the CPU in f32/f64; got ") +
                                            ablate::to_string(p.device) + "/" + ablate::to_string(p.dtype));
  }
  if (batch.rows != p.batch || batch.seq_len != p.seq_len) {
    ablate::throw_runtime_error(kWhere, "batch is " + std::to_string(batch.rows) + " x " +
                                            std::to_string(batch.seq_len) + " but the problem is " +
                                            std::to_string(p.batch) + " x " + std::to_string(p.seq_len));
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
        ablate::throw_runtime_error(kWhere, "row " + std::to_string(b) + " segment " + std::to_string(s - first) +
                                                " (start " + std::to_string(seg.start) + ", length " +
                                                std::to_string(seg.length) +
                                                ") overlaps the previous one or leaves the row of " +
                                                std::to_string(p.seq_len) + " positions");
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

int32_t longest_segment(const Batch& batch) {
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

template <class T, class S>
void forward_impl(const AttentionProblem& p, const Batch& batch, const T* q, const T* k, const T* v, T* out,
                  S* lse, int threads) {
  const Layout L{p.seq_len, p.heads, p.kv_heads, p.head_dim};
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, group = p.heads / p.kv_heads;
  const T scale = T(1) / std::sqrt(T(D));
  const int32_t longest = longest_segment(batch);
#pragma omp parallel num_threads(team_size(threads))
  {
    std::vector<T> scores(std::size_t(std::max(longest, 1)));
    std::vector<T> acc(static_cast<std::size_t>(D));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / group;
        for (int64_t t = 0; t < L.T; ++t) {
          std::fill_n(out + L.q(b, t, h), D, T(0));
          lse[L.stat(b, h, t)] = S(0);
        }
        for (int32_t s = batch.row_segments[std::size_t(b)]; s < batch.row_segments[std::size_t(b) + 1]; ++s) {
          const int64_t start = batch.segments[std::size_t(s)].start, len = batch.segments[std::size_t(s)].length;
          for (int64_t i = start; i < start + len; ++i) {
            const T* qi = q + L.q(b, i, h);
            T m = -std::numeric_limits<T>::infinity();
            for (int64_t j = start; j <= i; ++j) {
              const T sc = dot(qi, k + L.kv(b, j, g), D) * scale;
              scores[std::size_t(j - start)] = sc;
              m = std::max(m, sc);
            }
            T sum = 0;
            std::fill(acc.begin(), acc.end(), T(0));
            for (int64_t j = start; j <= i; ++j) {
              const T e = std::exp(scores[std::size_t(j - start)] - m);
              sum += e;
              const T* vj = v + L.kv(b, j, g);
              for (int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += e * vj[d];
            }
            T* oi = out + L.q(b, i, h);
            const T inv = T(1) / sum;
            for (int64_t d = 0; d < D; ++d) oi[d] = acc[std::size_t(d)] * inv;
            lse[L.stat(b, h, i)] = S(m + std::log(sum));
          }
        }
      }
    }
  }
}

template <class T, class S>
void backward_impl(const AttentionProblem& p, const Batch& batch, const T* q, const T* k, const T* v, const T* out,
                   const S* lse, const T* d_out, T* d_q, T* d_k, T* d_v, int threads) {
  const Layout L{p.seq_len, p.heads, p.kv_heads, p.head_dim};
  const int64_t B = p.batch, Hkv = p.kv_heads, D = p.head_dim, group = p.heads / p.kv_heads;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel num_threads(team_size(threads))
  {
    std::vector<T> dqi(static_cast<std::size_t>(D));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t g = 0; g < Hkv; ++g) {
        for (int64_t t = 0; t < L.T; ++t) {
          std::fill_n(d_k + L.kv(b, t, g), D, T(0));
          std::fill_n(d_v + L.kv(b, t, g), D, T(0));
          for (int64_t h = g * group; h < (g + 1) * group; ++h) std::fill_n(d_q + L.q(b, t, h), D, T(0));
        }
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (int32_t s = batch.row_segments[std::size_t(b)]; s < batch.row_segments[std::size_t(b) + 1]; ++s) {
            const int64_t start = batch.segments[std::size_t(s)].start, len = batch.segments[std::size_t(s)].length;
            for (int64_t i = start; i < start + len; ++i) {
              const T* qi = q + L.q(b, i, h);
              const T* doi = d_out + L.q(b, i, h);
              const T li = T(lse[L.stat(b, h, i)]);
              const T delta = dot(doi, out + L.q(b, i, h), D);
              std::fill(dqi.begin(), dqi.end(), T(0));
              for (int64_t j = start; j <= i; ++j) {
                const T* kj = k + L.kv(b, j, g);
                const T* vj = v + L.kv(b, j, g);
                const T pij = std::exp(dot(qi, kj, D) * scale - li);
                const T ds = pij * (dot(doi, vj, D) - delta) * scale;  // scaled: d(score)/d(q.k) = scale
                T* dkj = d_k + L.kv(b, j, g);
                T* dvj = d_v + L.kv(b, j, g);
                for (int64_t d = 0; d < D; ++d) {
                  dqi[std::size_t(d)] += ds * kj[d];
                  dkj[d] += ds * qi[d];
                  dvj[d] += pij * doi[d];
                }
              }
              std::copy(dqi.begin(), dqi.end(), d_q + L.q(b, i, h));
            }
          }
        }
      }
    }
  }
}

class NaiveCpu final : public ablate::Attention {
 public:
  explicit NaiveCpu(int threads) : threads_(threads) {}

  std::string supports(const AttentionProblem& p) const override {
    if (p.device != DeviceType::cpu || (p.dtype != DType::f32 && p.dtype != DType::f64)) {
      return std::string("naive_cpu runs on the CPU in f32/f64; got ") + ablate::to_string(p.device) + "/" +
             ablate::to_string(p.dtype);
    }
    if (p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0 || p.heads % p.kv_heads != 0) {
      return "naive_cpu needs heads, kv_heads and head_dim > 0 with heads a multiple of kv_heads; got heads " +
             std::to_string(p.heads) + ", kv_heads " + std::to_string(p.kv_heads) + ", head_dim " +
             std::to_string(p.head_dim);
    }
    return "";
  }

  int64_t saved_elements(const AttentionProblem& p) const override {
    return int64_t(p.batch) * p.heads * p.seq_len;
  }

  void forward(const AttentionProblem& p, const Batch& batch, TensorView q, TensorView k, TensorView v,
               TensorView out, TensorView saved) override {
    check_problem(p, batch);
    check_tensor("q", q, p, p.heads);
    check_tensor("k", k, p, p.kv_heads);
    check_tensor("v", v, p, p.kv_heads);
    check_tensor("out", out, p, p.heads);
    check_saved(saved, p);
    if (p.dtype == DType::f32) {
      forward_impl(p, batch, q.as<const float>(), k.as<const float>(), v.as<const float>(), out.as<float>(),
                   saved.as<float>(), threads_);
    } else if (saved.dtype == DType::f64) {
      forward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(), out.as<double>(),
                   saved.as<double>(), threads_);
    } else {
      forward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(), out.as<double>(),
                   saved.as<float>(), threads_);
    }
  }

  void backward(const AttentionProblem& p, const Batch& batch, TensorView q, TensorView k, TensorView v,
                TensorView out, TensorView saved, TensorView d_out, TensorView d_q, TensorView d_k,
                TensorView d_v) override {
    check_problem(p, batch);
    check_tensor("q", q, p, p.heads);
    check_tensor("k", k, p, p.kv_heads);
    check_tensor("v", v, p, p.kv_heads);
    check_tensor("out", out, p, p.heads);
    check_tensor("d_out", d_out, p, p.heads);
    check_tensor("d_q", d_q, p, p.heads);
    check_tensor("d_k", d_k, p, p.kv_heads);
    check_tensor("d_v", d_v, p, p.kv_heads);
    check_saved(saved, p);
    if (p.dtype == DType::f32) {
      backward_impl(p, batch, q.as<const float>(), k.as<const float>(), v.as<const float>(), out.as<const float>(),
                    saved.as<const float>(), d_out.as<const float>(), d_q.as<float>(), d_k.as<float>(),
                    d_v.as<float>(), threads_);
    } else if (saved.dtype == DType::f64) {
      backward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(),
                    out.as<const double>(), saved.as<const double>(), d_out.as<const double>(), d_q.as<double>(),
                    d_k.as<double>(), d_v.as<double>(), threads_);
    } else {
      backward_impl(p, batch, q.as<const double>(), k.as<const double>(), v.as<const double>(),
                    out.as<const double>(), saved.as<const float>(), d_out.as<const double>(), d_q.as<double>(),
                    d_k.as<double>(), d_v.as<double>(), threads_);
    }
  }

  double forward_flops(const AttentionProblem& p, const Batch& batch) const override {
    // Per query head and attended (i, j) pair: q.k and p*v, D multiply-adds each (2 FLOPs apiece).
    double pairs = 0;
    for (const ablate::Segment& s : batch.segments) pairs += 0.5 * double(s.length) * (double(s.length) + 1.0);
    return pairs * 4.0 * double(p.head_dim) * double(p.heads);
  }

 private:
  int threads_;
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::attention, "naive_cpu", "1.0.0",
         "exact causal softmax attention on the CPU (f32/f64, segments, GQA): the reference backend", {},
         [](const ablate::ComponentArgs& a) { return std::make_unique<NaiveCpu>(a.run.threads); }, ""});
}

}  // namespace

ABLATE_PLUGIN("naive_cpu", "1.0.0", register_components)
