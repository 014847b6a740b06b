// The cuda device's kernels (plugins/cuda_device/cuda_device_kernels.cu), run by the kernel
// interpreter through their launch helpers under every test schedule, at n = 0, 1, 7, 257, 1100 and
// 300000 (past the 256 x 256 threads of the reductions, so their grid-stride loops turn):
//   fill and scale: bit for bit the value written / the host's fp32 product x * factor;
//   to_bf16: bit for bit emu_support.hpp's round-to-nearest-even (worked out in double), a NaN
//   any quiet NaN of its sign;
//   squared_norm and masked_loss_sum: each of the kReduceBlocks double partials against a long
//   double sum of the elements that block's grid-stride walk visits, and their host sum in block
//   order against the long double total.
// Elements past n hold a sentinel the kernels must leave.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "cuda_device_kernels.hpp"
#include "emu_support.hpp"

using namespace ablate;
using ablate::cuda_device::kReduceBlocks;
using ablate::cuda_device::kThreads;
using ablate::emu_test::bf16_nearest;

namespace {

constexpr int64_t kSizes[] = {0, 1, 7, 257, 1100, 300000};
constexpr int64_t kGuard = 37;  // sentinel elements after the n a kernel is given
constexpr float kSentinel = 12345.0f;

// The interesting floats: zeros, ties of the bf16 rounding, subnormals, the ends of the range,
// infinities and NaNs; then random values over many octaves.
std::vector<float> test_values(int64_t n, uint64_t seed) {
  const std::vector<uint32_t> special = {
      0x00000000u, 0x80000000u, 0x3F800000u, 0xBF800000u,
      0x3F808000u,  // 1 + 2^-8: halfway, rounds down to the even 0x3F80
      0x3F818000u,  // halfway above the odd 0x3F81: rounds up to 0x3F82
      0x3F808001u, 0xBF817FFFu, 0x00000001u, 0x80000001u, 0x00008000u, 0x007FFFFFu, 0x00018000u,  // subnormals, one a tie
      0x7F7FFFFFu,               // the largest float: rounds to infinity
      0x7F7F7FFFu, 0x7F7F8000u,  // just under / exactly at bf16's overflow threshold
      0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0xFF812345u,  // quiet and signalling NaNs
  };
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-40, 40);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (std::size_t(i) < special.size()) {
      x[std::size_t(i)] = std::bit_cast<float>(special[std::size_t(i)]);
    } else if (i % 11 == 0) {  // an exact tie of the bf16 rounding, above an odd or even bf16
      x[std::size_t(i)] = std::bit_cast<float>((std::bit_cast<uint32_t>(normal(rng)) & 0xFFFF0000u) | 0x8000u);
    } else {
      x[std::size_t(i)] = std::ldexp(normal(rng), octave(rng));
    }
  }
  return x;
}

std::vector<float> with_guard(const std::vector<float>& x) {
  std::vector<float> h = x;
  h.resize(x.size() + std::size_t(kGuard), kSentinel);
  return h;
}

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// x rounded to bf16 by the kernel: the nearest bf16 (ties to even); a NaN any quiet NaN of the
// same sign (its payload is not specified).
bool bf16_matches(float x, uint16_t got) {
  if (std::isnan(x)) {
    return (got & 0x7F80u) == 0x7F80u && (got & 0x0040u) != 0 && (got >> 15) == (std::bit_cast<uint32_t>(x) >> 31);
  }
  return got == bf16_nearest(x);
}

// What a reduction kernel of kReduceBlocks x kThreads threads gives per block, each term summed
// exactly enough (long double) to stand for the exact sum: block b's threads visit the elements i
// with (i mod (kReduceBlocks * kThreads)) / kThreads == b.
struct Sums {
  std::vector<long double> per_block;
  std::vector<double> magnitude;  // per block, the sum of |term|
  std::vector<int64_t> terms;     // per block
  long double total = 0;
  double total_magnitude = 0;
};

template <class Term>
Sums block_sums(int64_t n, Term term) {
  Sums s;
  s.per_block.assign(kReduceBlocks, 0.0L);
  s.magnitude.assign(kReduceBlocks, 0.0);
  s.terms.assign(kReduceBlocks, 0);
  const int64_t stride = int64_t(kReduceBlocks) * kThreads;
  for (int64_t i = 0; i < n; ++i) {
    const std::size_t b = std::size_t((i % stride) / kThreads);
    const double t = term(i);
    s.per_block[b] += t;
    s.magnitude[b] += std::fabs(t);
    s.terms[b] += 1;
    s.total += t;
    s.total_magnitude += std::fabs(t);
  }
  return s;
}

struct Worst {
  double abs = 0, rel = 0;
  void add(double got, long double want, double scale) {
    const double d = double(std::fabs((long double)got - want));
    abs = std::max(abs, d);
    if (scale > 0) rel = std::max(rel, d / scale);
  }
};

// Checks the partials of one reduction and their host sum in block order. A double sum of k terms
// (each exact: a float's square, or a float) in any order is within k * 2^-53 of the sum of their
// magnitudes; the long double reference is 2^11 times closer than that.
void check_partials(const std::vector<double>& partials, const Sums& want, Worst& worst) {
  const double u = std::ldexp(1.0, -53);
  int64_t bad = 0, first_bad = -1;
  for (int b = 0; b < kReduceBlocks; ++b) {
    const double tol = double(want.terms[std::size_t(b)] + 1) * u * want.magnitude[std::size_t(b)];
    const double got = partials[std::size_t(b)];
    const bool ok = std::isfinite(got) && std::fabs((long double)got - want.per_block[std::size_t(b)]) <= tol;
    if (!ok && first_bad < 0) first_bad = b;
    bad += ok ? 0 : 1;
  }
  INFO("first wrong partial: block ", first_bad);
  CHECK(bad == 0);
  double host = 0;
  for (double p : partials) host += p;  // as the cuda device adds them
  int64_t n = 0;
  for (int64_t t : want.terms) n += t;
  const double tol = double(n + kReduceBlocks + 1) * u * want.total_magnitude;
  CHECK(std::fabs((long double)host - want.total) <= tol);
  worst.add(host, want.total, want.total_magnitude);
}

std::vector<double> run_partials(const std::function<void(double*)>& launch) {
  std::vector<double> h(kReduceBlocks, std::numeric_limits<double>::quiet_NaN());  // every block must write its own
  cuda::DeviceBuffer<double> d;
  d.upload(h.data(), h.size());
  launch(d.data());
  d.download(h.data());
  return h;
}

}  // namespace

TEST_CASE("fill writes the value to n elements and nothing past them") {
  for (const float value : {2.5f, -0.0f, std::numeric_limits<float>::infinity()}) {
    emu_test::for_each_schedule([&] {
      for (const int64_t n : kSizes) {
        CAPTURE(n);
        CAPTURE(value);
        const std::vector<float> before = with_guard(test_values(n, 11));
        cuda::DeviceBuffer<float> d;
        d.upload(before.data(), before.size());
        cuda_device::launch_fill(d.data(), n, value, nullptr);
        std::vector<float> h(before.size());
        d.download(h.data());
        int64_t bad = 0;
        for (std::size_t i = 0; i < h.size(); ++i) bad += same_bits(h[i], int64_t(i) < n ? value : kSentinel) ? 0 : 1;
        CHECK(bad == 0);
      }
    });
  }
  emu_test::report_worst("fill_kernel", 0, 0);
}

TEST_CASE("scale multiplies n elements in fp32, bit for bit the host's product") {
  for (const float factor : {0.37f, -3.0f, 0.0f, 1e-30f}) {
    emu_test::for_each_schedule([&] {
      for (const int64_t n : kSizes) {
        CAPTURE(n);
        CAPTURE(factor);
        const std::vector<float> x = test_values(n, 12);
        const std::vector<float> before = with_guard(x);
        cuda::DeviceBuffer<float> d;
        d.upload(before.data(), before.size());
        cuda_device::launch_scale(d.data(), n, factor, nullptr);
        std::vector<float> h(before.size());
        d.download(h.data());
        int64_t bad = 0, first_bad = -1;
        for (std::size_t i = 0; i < h.size(); ++i) {
          const bool ok = same_bits(h[i], int64_t(i) < n ? x[i] * factor : kSentinel);
          if (!ok && first_bad < 0) first_bad = int64_t(i);
          bad += ok ? 0 : 1;
        }
        INFO("first wrong element: ", first_bad);
        CHECK(bad == 0);
      }
    });
  }
  emu_test::report_worst("scale_kernel", 0, 0);
}

TEST_CASE("to_bf16 rounds n elements to the nearest bf16, ties to even") {
  emu_test::for_each_schedule([&] {
    for (const int64_t n : kSizes) {
      CAPTURE(n);
      const std::vector<float> x = test_values(n, 13);
      cuda::DeviceBuffer<float> dx;
      dx.upload(x.data(), x.size());
      std::vector<uint16_t> h(std::size_t(n + kGuard), 0xBEEFu);
      cuda::DeviceBuffer<uint16_t> dy;
      dy.upload(h.data(), h.size());
      cuda_device::launch_to_bf16(dx.data(), dy.data(), n, nullptr);
      dy.download(h.data());
      int64_t bad = 0, first_bad = -1;
      for (std::size_t i = 0; i < h.size(); ++i) {
        const bool ok = int64_t(i) < n ? bf16_matches(x[i], h[i]) : h[i] == 0xBEEFu;
        if (!ok && first_bad < 0) first_bad = int64_t(i);
        bad += ok ? 0 : 1;
      }
      INFO("first wrong element: ", first_bad);
      CHECK(bad == 0);
    }
  });
  emu_test::report_worst("to_bf16_kernel", 0, 0);
}

TEST_CASE("squared_norm's partials are each block's sum of squares, and add up to the norm") {
  Worst worst;
  emu_test::for_each_schedule([&] {
    for (const int64_t n : kSizes) {
      CAPTURE(n);
      std::vector<float> x = test_values(n, 14);
      for (float& v : x) v = std::isfinite(v) && std::fabs(v) < 1e30f ? v : 0.5f;  // finite squares
      const std::vector<float> guarded = with_guard(x);
      cuda::DeviceBuffer<float> d;
      d.upload(guarded.data(), guarded.size());
      const std::vector<double> partials = run_partials([&](double* p) { cuda_device::launch_squared_norm(d.data(), n, p, nullptr); });
      check_partials(partials, block_sums(n, [&](int64_t i) { return double(x[std::size_t(i)]) * double(x[std::size_t(i)]); }), worst);
    }
  });
  emu_test::report_worst("squared_norm_kernel", worst.abs, worst.rel);
}

TEST_CASE("masked_loss_sum adds the losses of positions with a target, per block and in total") {
  Worst worst;
  emu_test::for_each_schedule([&] {
    for (const int64_t n : kSizes) {
      CAPTURE(n);
      std::mt19937_64 rng(uint64_t(15 + n));
      std::uniform_real_distribution<float> loss(0.0f, 11.0f);
      std::uniform_int_distribution<int32_t> token(0, 50256);
      std::vector<float> losses(static_cast<std::size_t>(n));
      std::vector<int32_t> targets(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const bool masked = i % 3 == 1 || i % 257 == 0;
        targets[std::size_t(i)] = masked ? -1 : token(rng);
        losses[std::size_t(i)] = masked ? 1e30f : loss(rng);  // a masked loss that leaked would dominate
      }
      const std::vector<float> guarded = with_guard(losses);
      std::vector<int32_t> targets_guarded = targets;
      targets_guarded.resize(std::size_t(n + kGuard), 1);
      cuda::DeviceBuffer<float> dl;
      cuda::DeviceBuffer<int32_t> dt;
      dl.upload(guarded.data(), guarded.size());
      dt.upload(targets_guarded.data(), targets_guarded.size());
      const std::vector<double> partials =
          run_partials([&](double* p) { cuda_device::launch_masked_loss_sum(dl.data(), dt.data(), n, p, nullptr); });
      check_partials(partials,
                     block_sums(n, [&](int64_t i) { return targets[std::size_t(i)] < 0 ? 0.0 : double(losses[std::size_t(i)]); }),
                     worst);
    }
  });
  emu_test::report_worst("masked_loss_sum_kernel", worst.abs, worst.rel);
}
