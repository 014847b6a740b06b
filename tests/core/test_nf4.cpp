// NF4 (nf4.hpp) against its definition: the code book's values map to themselves, every value
// dequantizes to the code-book value nearest to it (checked by brute force over the book) times
// its block's absmax, so the error is at most half the gap between the two book values around it;
// quantizing what was dequantized gives the same codes; an all-zero block is zeros; a value that
// is not finite is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ablate/nf4.hpp"

using namespace ablate;

namespace {

std::vector<float> dequantized(const std::vector<uint8_t>& codes, const std::vector<float>& scales, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[std::size_t(i)] = nf4::value(codes.data(), scales.data(), i);
  return out;
}

}  // namespace

TEST_CASE("nf4: book values times the block's absmax are exact, others are the nearest book value") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int64_t n : {int64_t(1), int64_t(63), int64_t(64), int64_t(130), int64_t(4099)}) {
    INFO("n = " << n);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& v : x) v = normal(rng);
    // Block 0 (when it is whole): the sixteen book values times 0.5, four times over.
    if (n >= 64) {
      for (int64_t i = 0; i < 64; ++i) x[std::size_t(i)] = 0.5f * nf4::code_value(uint32_t(i % 16));
    }
    std::vector<uint8_t> codes(std::size_t(nf4::code_bytes(n)));
    std::vector<float> scales(std::size_t(nf4::blocks(n)));
    REQUIRE(nf4::quantize(x.data(), n, codes.data(), scales.data()));
    const std::vector<float> y = dequantized(codes, scales, n);
    int64_t not_nearest = 0, inexact = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float m = scales[std::size_t(i / nf4::kBlock)], v = x[std::size_t(i)], got = y[std::size_t(i)];
      if (n >= 64 && i < 64) inexact += got != v;
      // Brute force: no book value times m is nearer to v than what came back (up to rounding).
      for (uint32_t c = 0; c < 16; ++c) {
        not_nearest += std::abs(nf4::code_value(c) * m - v) < std::abs(got - v) - 1e-6f * m;
      }
    }
    CHECK(inexact == 0);
    CHECK(not_nearest == 0);
    // The block's absmax is a value of the block, and dequantizes to itself.
    for (std::size_t b = 0; b < scales.size(); ++b) {
      bool found = false;
      for (int64_t i = int64_t(b) * 64; i < std::min<int64_t>(n, int64_t(b + 1) * 64); ++i)
        found |= std::abs(x[std::size_t(i)]) == scales[b];
      CHECK(found);
    }
    // Quantizing the dequantized values gives the same codes and scales.
    std::vector<uint8_t> again(codes.size());
    std::vector<float> scales_again(scales.size());
    REQUIRE(nf4::quantize(y.data(), n, again.data(), scales_again.data()));
    CHECK(again == codes);
    CHECK(scales_again == scales);
  }
}

TEST_CASE("nf4: the round-trip error of a block is at most half the widest gap of the book times its absmax") {
  float widest = 0.0f;
  for (uint32_t c = 0; c + 1 < 16; ++c) widest = std::max(widest, nf4::code_value(c + 1) - nf4::code_value(c));
  CHECK(widest == doctest::Approx(1.0 - 0.6961928009986877));  // between -1 and the next value
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 64 * 200;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> codes(std::size_t(nf4::code_bytes(n)));
  std::vector<float> scales(std::size_t(nf4::blocks(n)));
  REQUIRE(nf4::quantize(x.data(), n, codes.data(), scales.data()));
  const std::vector<float> y = dequantized(codes, scales, n);
  double worst = 0, mean_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::abs(double(x[std::size_t(i)]) - double(y[std::size_t(i)])) / double(scales[std::size_t(i / 64)]);
    worst = std::max(worst, e);
    mean_sq += e * e / double(n);
  }
  CHECK(worst <= 0.5 * double(widest) * (1 + 1e-6));
  MESSAGE("normal weights: worst error " << worst << " of absmax, rms " << std::sqrt(mean_sq));
}

TEST_CASE("nf4: an all-zero block is zeros, and a value that is not finite is refused") {
  std::vector<float> x(70, 0.0f);
  x[65] = -2.0f;
  std::vector<uint8_t> codes(35);
  std::vector<float> scales(2);
  REQUIRE(nf4::quantize(x.data(), 70, codes.data(), scales.data()));
  CHECK(scales[0] == 0.0f);
  CHECK(scales[1] == 2.0f);
  CHECK(dequantized(codes, scales, 70) == x);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(!nf4::quantize(x.data(), 70, codes.data(), scales.data()));
  x[3] = std::numeric_limits<float>::infinity();
  CHECK(!nf4::quantize(x.data(), 70, codes.data(), scales.data()));
  CHECK(nf4::bytes(70) == 35 + 8);
}
