// The Device seam's conformance checks, run on any device against independent host references
// (in the manner of ggml's test-backend-ops): allocation (zeroed, counted), copies both ways,
// fill, scale (bit for bit: one fp32 multiply), the squared norm and the masked loss sum (double
// sums of the same terms in another order: within n * 2^-52 of the reference, relative to the
// sum of the terms' magnitudes), and a batch's views read back equal to the Batch. Sizes are odd
// on purpose (1, 7, 257, 100003: not multiples of a block or a warp).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/device_math.hpp"

namespace ablate::test {

inline std::vector<float> download_f32(Device& dev, TensorView v) {
  std::vector<float> out(std::size_t(v.numel()));
  dev.download(out.data(), v);
  return out;
}

// NF4 dequantization against the code book as published with QLoRA, typed in here (not nf4.hpp's),
// the nibbles decoded here: every byte value, block scales of both signs' magnitudes, lengths odd
// and not multiples of a block; and copies of f32 and u8 views, bit for bit.
inline void check_device_nf4_and_copy(Device& dev) {
  static const float book[16] = {-1.0f,
                                 -0.6961928009986877f,
                                 -0.5250730514526367f,
                                 -0.39491748809814453f,
                                 -0.28444138169288635f,
                                 -0.18477343022823334f,
                                 -0.09105003625154495f,
                                 0.0f,
                                 0.07958029955625534f,
                                 0.16093020141124725f,
                                 0.24611230194568634f,
                                 0.33791524171829224f,
                                 0.44070982933044434f,
                                 0.5626170039176941f,
                                 0.7229568362236023f,
                                 1.0f};
  std::mt19937_64 rng(21);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(64), int64_t(65), int64_t(257), int64_t(100003)}) {
    INFO("n = " << n);
    std::vector<uint8_t> codes(std::size_t((n + 1) / 2));
    std::vector<float> scales(std::size_t((n + 63) / 64));
    for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i < 256 ? i : rng() & 255);
    std::uniform_real_distribution<float> u(0.0f, 3.0f);
    for (float& m : scales) m = u(rng);
    Buffer c = dev.alloc(DType::u8, int64_t(codes.size())), m = dev.alloc(DType::f32, int64_t(scales.size())),
           y = dev.alloc(DType::f32, n);
    dev.upload(c.view(), codes.data());
    dev.upload(m.view(), scales.data());
    dev.dequantize_nf4(y.view(), c.view(), m.view());
    const std::vector<float> got = download_f32(dev, y.view());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int nibble = i % 2 == 0 ? codes[std::size_t(i / 2)] & 15 : codes[std::size_t(i / 2)] >> 4;
      wrong += got[std::size_t(i)] != book[nibble] * scales[std::size_t(i / 64)];
    }
    CHECK(wrong == 0);
    // Copies: f32 and u8, bit for bit.
    Buffer y2 = dev.alloc(DType::f32, n), c2 = dev.alloc(DType::u8, int64_t(codes.size()));
    dev.copy(y2.view(), y.view());
    dev.copy(c2.view(), c.view());
    CHECK(download_f32(dev, y2.view()) == got);
    std::vector<uint8_t> back(codes.size());
    dev.download(back.data(), c2.view());
    CHECK(back == codes);
  }
  Buffer a = dev.alloc(DType::f32, 8), b = dev.alloc(DType::f32, 9);
  CHECK_THROWS(dev.copy(a.view(), b.view()));  // unequal lengths are refused
}

inline std::vector<int32_t> download_i32(Device& dev, TensorView v) {
  std::vector<int32_t> out(std::size_t(v.numel()));
  if (!out.empty()) dev.download(out.data(), v);
  return out;
}

inline void check_device_buffers(Device& dev) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(257), int64_t(100003)}) {
    INFO("n = " << n);
    const int64_t before = dev.memory_in_use();
    {
      Buffer b = dev.alloc(DType::f32, n);
      CHECK(dev.memory_in_use() >= before + n * 4);
      REQUIRE(b.count() == n);
      for (float v : download_f32(dev, b.view())) REQUIRE(v == 0.0f);
      std::vector<float> host(static_cast<std::size_t>(n));
      for (float& v : host) v = normal(rng);
      dev.upload(b.view(), host.data());
      CHECK(download_f32(dev, b.view()) == host);
      // scale: one fp32 multiply per element, bit for bit.
      const float factor = 0.37f;
      dev.scale(b.view(), factor);
      const std::vector<float> scaled = download_f32(dev, b.view());
      for (std::size_t i = 0; i < host.size(); ++i) REQUIRE(scaled[i] == host[i] * factor);
      // squared norm: double sum of double squares.
      dev.upload(b.view(), host.data());
      double want = 0;
      for (float v : host) want += double(v) * double(v);
      CHECK(std::abs(dev.squared_norm(b.view()) - want) <= double(n) * 0x1p-52 * want);
      // fill
      dev.fill(b.view(), -2.5f);
      for (float v : download_f32(dev, b.view())) REQUIRE(v == -2.5f);
      // to_bf16: device_math::bf16_bits per element, bit for bit.
      dev.upload(b.view(), host.data());
      Buffer half = dev.alloc(DType::bf16, n);
      dev.to_bf16(half.view(), b.view());
      std::vector<uint16_t> bits(static_cast<std::size_t>(n));
      dev.download(bits.data(), half.view());
      for (std::size_t i = 0; i < host.size(); ++i) REQUIRE(bits[i] == device_math::bf16_bits(host[i]));
      CHECK_THROWS(dev.to_bf16(b.view(), half.view()));  // the arguments' dtypes swapped
    }
    CHECK(dev.memory_in_use() == before);
  }
}

inline void check_device_loss_sum(Device& dev) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> loss(0.0f, 9.0f);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(257), int64_t(100003)}) {
    INFO("n = " << n);
    std::vector<float> l(static_cast<std::size_t>(n));
    std::vector<int32_t> t(static_cast<std::size_t>(n));
    double want = 0, magnitude = 0;
    for (int64_t i = 0; i < n; ++i) {
      l[std::size_t(i)] = loss(rng);
      t[std::size_t(i)] = (i % 3 == 1) ? -1 : int32_t(i % 50);
      if (t[std::size_t(i)] >= 0) want += double(l[std::size_t(i)]);
      magnitude += double(l[std::size_t(i)]);
    }
    Buffer lb = dev.alloc(DType::f32, n), tb = dev.alloc(DType::i32, n);
    dev.upload(lb.view(), l.data());
    dev.upload(tb.view(), t.data());
    CHECK(std::abs(dev.masked_loss_sum(lb.view(), tb.view()) - want) <= double(n) * 0x1p-52 * magnitude);
  }
}

// Two rows of 5 positions: row 0 holds documents of 2 and 3 tokens, row 1 one of 4 and padding.
inline Batch sample_batch() {
  Batch b;
  b.reset(2, 5);
  b.tokens = {3, 4, 7, 8, 9, 1, 2, 3, 4, 0};
  b.targets = {4, -1, 8, 9, -1, 2, 3, 4, -1, -1};
  b.positions = {0, 1, 0, 1, 2, 0, 1, 2, 3, 0};
  b.segment_ids = {1, 1, 2, 2, 2, 1, 1, 1, 1, 0};
  b.segments = {{0, 2}, {2, 3}, {0, 4}};
  b.row_segments = {0, 2, 3};
  return b;
}

inline void check_device_batch(Device& dev) {
  const Batch b = sample_batch();
  DeviceBatch db;
  dev.upload_batch(b, db);
  const BatchViews& v = db.views;
  CHECK(v.rows == 2);
  CHECK(v.seq_len == 5);
  CHECK(v.num_segments == 3);
  CHECK(v.host == &b);
  CHECK(v.device == dev.type());
  CHECK(download_i32(dev, v.tokens) == b.tokens);
  CHECK(download_i32(dev, v.targets) == b.targets);
  CHECK(download_i32(dev, v.positions) == b.positions);
  CHECK(download_i32(dev, v.segment_ids) == b.segment_ids);
  CHECK(download_i32(dev, v.segments) == std::vector<int32_t>{0, 2, 2, 3, 0, 4});
  CHECK(download_i32(dev, v.row_segments) == b.row_segments);
  // A second, smaller batch reuses the storage and reads back as itself.
  Batch small;
  small.reset(1, 3);
  small.tokens = {5, 6, 7};
  small.segment_ids = {1, 1, 1};
  small.segments = {{0, 3}};
  small.row_segments = {0, 1};
  dev.upload_batch(small, db);
  CHECK(download_i32(dev, db.views.tokens) == small.tokens);
  CHECK(download_i32(dev, db.views.row_segments) == small.row_segments);
}

}  // namespace ablate::test
