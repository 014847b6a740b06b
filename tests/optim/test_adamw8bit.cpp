// The `adamw8bit` plugin: its code maps, step-by-step agreement with fp32 `adamw`, fp32 fallbacks,
// block layout, checkpoint round trip, refused states, non-finite gradients, determinism across
// thread counts.
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/registry.hpp"
#include "dynamic_code.hpp"
#include "test_support.hpp"
#include "views.hpp"

using namespace ablate;
using ablate::adamw8bit::DynamicCode;

namespace {

struct Keys {
  int64_t block_size = 256;
  int64_t min_8bit_size = 4096;
  std::string pattern = "^w[tp]e\\.";  // the default: wte and wpe
};

struct Setup {
  Registry registry;
  double lr = 1e-3;
  Params common{"optimizer", {{"lr", 1e-3}, {"grad_clip", 0.0}, {"name", std::string("adamw8bit")}}};
  // The AdamW family's keys ([optimizer.adamw]), which every member reads with its own.
  std::map<std::string, Value, std::less<>> adamw{{"weight_decay", 0.01}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}};
  RunContext run;
  Setup() { registry.load_directories({test::plugin_dir()}); }
  std::unique_ptr<Optimizer> make8(const Keys& k = {}) {
    std::map<std::string, Value, std::less<>> keys = adamw;
    keys.insert({{"block_size", k.block_size}, {"min_8bit_size", k.min_8bit_size}, {"fp32_state_pattern", k.pattern}});
    const Params own{"optimizer.adamw8bit", keys};
    return registry.create<Optimizer>(Kind::optimizer, "adamw8bit", {common, own, run});
  }
  std::unique_ptr<Optimizer> make32() {
    const Params own{"optimizer.adamw", adamw};
    return registry.create<Optimizer>(Kind::optimizer, "adamw", {common, own, run});
  }
};

using ablate::test::view;

const NamedTensor& tensor(const std::vector<NamedTensor>& state, const std::string& name) {
  for (const NamedTensor& t : state) {
    if (t.name == name) return t;
  }
  FAIL("no tensor " << name);
  throw 0;
}

template <class T>
std::vector<T> values(const NamedTensor& t) {
  std::vector<T> out(t.bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// The moments of every element, decoded from a saved state (the layout docs/optimizers.md gives:
// 8-bit slices' codes and blocks in table order, fp32 slices' values in table order).
struct Moments {
  std::vector<float> m, v;
  std::vector<float> m_absmax, v_absmax;  // per element: its block's absmax (0 for fp32 slices)
  std::vector<bool> quantized;            // per element
};

Moments decode(const std::vector<NamedTensor>& state, const ParamTable& table, int64_t block_size) {
  const auto mc = values<uint8_t>(tensor(state, "exp_avg.codes")), vc = values<uint8_t>(tensor(state, "exp_avg_sq.codes"));
  const auto ma = values<float>(tensor(state, "exp_avg.absmax")), va = values<float>(tensor(state, "exp_avg_sq.absmax"));
  const auto mf = values<float>(tensor(state, "exp_avg.fp32")), vf = values<float>(tensor(state, "exp_avg_sq.fp32"));
  const auto q = values<uint8_t>(tensor(state, "quantized_slices"));
  const DynamicCode sm = DynamicCode::make(true), um = DynamicCode::make(false);
  Moments out;
  const std::size_t n = std::size_t(table.total);
  out.m.resize(n), out.v.resize(n), out.m_absmax.assign(n, 0.0f), out.v_absmax.assign(n, 0.0f), out.quantized.resize(n);
  int64_t code = 0, block = 0, f = 0;
  REQUIRE(q.size() == table.slices.size());
  for (std::size_t s = 0; s < table.slices.size(); ++s) {
    const ParamSlice& sl = table.slices[s];
    for (int64_t j = 0; j < sl.numel(); ++j) {
      const std::size_t i = std::size_t(sl.offset + j);
      out.quantized[i] = q[s] != 0;
      if (q[s]) {
        const std::size_t b = std::size_t(block + j / block_size);
        out.m_absmax[i] = ma[b];
        out.v_absmax[i] = va[b];
        out.m[i] = sm.decode(mc[std::size_t(code + j)]) * ma[b];
        out.v[i] = um.decode(vc[std::size_t(code + j)]) * va[b];
      } else {
        out.m[i] = mf[std::size_t(f + j)];
        out.v[i] = vf[std::size_t(f + j)];
      }
    }
    if (q[s]) {
      code += sl.numel();
      block += (sl.numel() + block_size - 1) / block_size;
    } else {
      f += sl.numel();
    }
  }
  CHECK(code == int64_t(mc.size()));
  CHECK(block == int64_t(ma.size()));
  CHECK(f == int64_t(mf.size()));
  return out;
}

// Brute force: the nearest value of the map, ties to the one nearer zero.
int nearest(const std::array<float, 256>& map, float x) {
  int best = 0;
  for (int i = 1; i < 256; ++i) {
    const double d = std::fabs(double(map[i]) - x), db = std::fabs(double(map[best]) - x);
    if (d < db || (d == db && std::fabs(map[i]) < std::fabs(map[best]))) best = i;
  }
  return best;
}

// Slices of several shapes: 8-bit ones not divisible by the block size, one exactly a block
// multiple, one below min_8bit_size and one matched by the default pattern (both fp32).
ParamTable mixed_table() {
  ParamTable t;
  t.add("wte.weight", {80, 64}, true);               // 5120: fp32 by name
  t.add("blocks.0.ln1.weight", {100}, false);        // fp32 by size
  t.add("blocks.0.attn.q.weight", {37, 129}, true);  // 4773 = 18 blocks + 165
  t.add("blocks.0.attn.o.weight", {64, 64}, true);   // 4096 = 16 blocks exactly
  t.add("blocks.0.mlp.fc.bias", {4097}, false);      // 16 blocks + 1
  t.add("blocks.0.mlp.fc.weight", {33, 250}, true);  // 8250
  t.add("lm_head.weight", {300, 100}, true);         // 30000
  return t;
}

}  // namespace

TEST_CASE("the dynamic maps: 256 sorted distinct values, 0 and 1 exact, -1 on the signed map, dense near zero") {
  for (const bool is_signed : {true, false}) {
    INFO("signed = " << is_signed);
    const DynamicCode code = DynamicCode::make(is_signed);
    const auto& v = code.values();
    for (int i = 1; i < 256; ++i) CHECK(v[i - 1] < v[i]);  // monotone, hence distinct
    CHECK(v.back() == 1.0f);
    CHECK(v.front() == (is_signed ? -1.0f : 0.0f));
    CHECK(std::count(v.begin(), v.end(), 0.0f) == 1);
    // Codes per decade (10^-E, 10^-E+1]: the dynamic tree gives 2^(F) with F = 6 - E (signed) or 7 - E.
    for (int e = 0; e < 7; ++e) {
      const double hi = std::pow(10.0, -e), lo = hi / 10;
      const auto positive = std::count_if(v.begin(), v.end(), [&](float x) { return x > lo && x < hi; });
      CHECK(positive == (1 << ((is_signed ? 6 : 7) - e)));
    }
    // The smallest positive value and the one below 1.
    CHECK(v[std::size_t(std::upper_bound(v.begin(), v.end(), 0.0f) - v.begin())] ==
          doctest::Approx(is_signed ? 0.55e-6 : 0.325e-6).epsilon(1e-6));
    CHECK(v[254] == doctest::Approx(1.0 - 0.9 / (is_signed ? 128 : 256)).epsilon(1e-7));
  }
  const DynamicCode signed_code = DynamicCode::make(true);
  const auto& s = signed_code.values();
  CHECK(std::count_if(s.begin(), s.end(), [](float x) { return x < 0; }) == 127);
  CHECK(s[1] == doctest::Approx(-(1.0 - 0.9 / 128)).epsilon(1e-7));
}

TEST_CASE("encode is the nearest code (ties towards zero) and the round trip error is bounded") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_real_distribution<double> exponent(-8.0, 0.0);
  for (const bool is_signed : {true, false}) {
    INFO("signed = " << is_signed);
    const DynamicCode code = DynamicCode::make(is_signed);
    const auto& map = code.values();
    // Every code encodes to itself; exact midpoints go towards zero.
    for (int i = 0; i < 256; ++i) CHECK(code.encode(map[i]) == i);
    int ties = 0;
    for (int i = 1; i < 256; ++i) {
      const double mid = (double(map[i - 1]) + double(map[i])) / 2;
      if (float(mid) != mid) continue;  // only midpoints a float can hold
      CHECK(int(code.encode(float(mid))) == (mid > 0 ? i - 1 : i));
      ++ties;
    }
    CHECK(ties > 50);
    double worst_top = 0;    // the largest |error| for |x| in [0.1, 1]
    double worst_ratio = 0;  // below: |error| / (4.5 / 2^F * |x|) in the decade of x
    for (int k = 0; k < 200000; ++k) {
      // Half uniform on the map's range, half log-uniform magnitudes down to 1e-8.
      float x = k % 2 ? uniform(rng) : float(std::pow(10.0, exponent(rng))) * (uniform(rng) < 0 ? -1.0f : 1.0f);
      if (!is_signed) x = std::fabs(x);
      const int c = code.encode(x);
      REQUIRE(c == nearest(map, x));
      const double err = std::fabs(double(code.decode(uint8_t(c))) - x);
      if (std::fabs(x) >= 0.1) worst_top = std::max(worst_top, err);
      // In the decade (10^-E-1, 10^-E] the spacing is 0.9 * 10^-E / 2^F: the error is at most half of
      // it, at most 4.5 / 2^F of |x| (F >= 1: not the signed map's lowest decade, one code).
      const int e = int(std::floor(-std::log10(std::fabs(double(x)))));
      const int f = (is_signed ? 6 : 7) - e;
      if (e >= 0 && e <= 6 && f >= 1) worst_ratio = std::max(worst_ratio, err / (4.5 / (1 << f) * std::fabs(double(x))));
    }
    // The top decade: 64 (signed) or 128 (unsigned) midpoints over [0.1, 1].
    CHECK(worst_top <= (is_signed ? 0.9 / 128 : 0.9 / 256) + 1e-7);
    CHECK(worst_ratio <= 1.0 + 1e-5);
    MESSAGE("signed=" << is_signed << " largest round-trip error for |x| >= 0.1: " << worst_top
                      << "; worst share of the per-decade bound 4.5 / 2^F |x|: " << worst_ratio);
  }
}

TEST_CASE("encode_block (bucket table, 2 halvings) gives encode's codes: every midpoint, bucket edge and random value") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> exponent(-12.0, 0.3);
  for (const bool is_signed : {true, false}) {
    INFO("signed = " << is_signed);
    const DynamicCode code = DynamicCode::make(is_signed);
    std::vector<float> xs;
    const auto& map = code.values();
    for (int i = 1; i < 256; ++i) {  // the midpoints and the floats around them
      float mid = float((double(map[i - 1]) + double(map[i])) / 2);
      for (int k = 0; k < 3; ++k) mid = std::nextafter(mid, -2.0f);
      for (int k = 0; k < 7; ++k, mid = std::nextafter(mid, 2.0f)) xs.push_back(mid);
      xs.push_back(map[i]);
    }
    for (uint32_t bits = 0; bits < (1u << 9); ++bits) {  // both ends of every bucket, every exponent
      for (uint32_t m = 0; m < 32; ++m) {
        const uint32_t first = (bits << 23) | (m << 18);
        for (const uint32_t b : {first, first | ((1u << 18) - 1)}) {
          if (!std::isnan(std::bit_cast<float>(b))) xs.push_back(std::bit_cast<float>(b));  // NaN never reaches it
        }
      }
    }
    for (int k = 0; k < 100000; ++k) {
      const float x = float(std::pow(10.0, exponent(rng)));
      xs.push_back(k % 2 && is_signed ? -x : x);
    }
    xs.push_back(0.0f);
    xs.push_back(-0.0f);
    xs.push_back(std::numeric_limits<float>::denorm_min());
    xs.push_back(std::numeric_limits<float>::infinity());
    xs.push_back(-std::numeric_limits<float>::infinity());
    std::vector<uint8_t> fast(xs.size());
    code.encode_block(xs.data(), 1.0f, fast.data(), int64_t(xs.size()));
    int64_t differ = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      differ += fast[i] != code.encode(xs[i]);
      differ += code.encode_one(xs[i]) != code.encode(xs[i]);
    }
    CHECK(differ == 0);
    // With a scale: encode_block(x, a) is encode(x / a).
    std::vector<float> scaled(xs.begin(), xs.begin() + 1000);
    code.encode_block(scaled.data(), 3.7f, fast.data(), 1000);
    for (std::size_t i = 0; i < 1000; ++i) REQUIRE(fast[i] == code.encode(scaled[i] / 3.7f));
  }
}

// bitsandbytes' protocol: after each step the reference takes the 8-bit optimizer's decoded moments
// and both take the same parameters, so each step starts from the same state. Then a step must be
// adamw's on the decoded moments bit for bit, and the new moments must be encoded exactly: absmax =
// the block's largest |moment|, code = the nearest code of moment / absmax.
TEST_CASE("adamw8bit is adamw on the decoded moments, bit for bit, and encodes the new moments to the nearest codes") {
  Setup s;
  const ParamTable table = mixed_table();
  auto ref = s.make32();
  auto opt = s.make8();
  ref->init(table, DeviceType::cpu);
  opt->init(table, DeviceType::cpu);
  const DynamicCode sm = DynamicCode::make(true), um = DynamicCode::make(false);
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p32(std::size_t(table.total)), g(p32.size());
  for (float& x : p32) x = 0.1f * normal(rng);
  std::vector<float> p8 = p32;
  for (int t = 1; t <= 20; ++t) {
    for (float& x : g) x = 0.01f * normal(rng);
    ref->step(table, view(p32), view(g), s.lr, t);
    opt->step(table, view(p8), view(g), s.lr, t);
    REQUIRE(std::memcmp(p8.data(), p32.data(), p32.size() * sizeof(float)) == 0);
    const auto state = opt->save_state();
    const Moments d = decode(state, table, 256);
    const auto m32 = values<float>(tensor(ref->save_state(), "exp_avg"));
    const auto v32 = values<float>(tensor(ref->save_state(), "exp_avg_sq"));
    const auto mc = values<uint8_t>(tensor(state, "exp_avg.codes")), vc = values<uint8_t>(tensor(state, "exp_avg_sq.codes"));
    int64_t code = 0, wrong = 0;
    for (const ParamSlice& sl : table.slices) {
      if (!d.quantized[std::size_t(sl.offset)]) continue;
      for (int64_t b0 = 0; b0 < sl.numel(); b0 += 256) {
        const int64_t n = std::min<int64_t>(256, sl.numel() - b0);
        float ma = 0, va = 0;
        for (int64_t j = 0; j < n; ++j) {
          ma = std::max(ma, std::fabs(m32[std::size_t(sl.offset + b0 + j)]));
          va = std::max(va, v32[std::size_t(sl.offset + b0 + j)]);
        }
        REQUIRE(d.m_absmax[std::size_t(sl.offset + b0)] == ma);
        REQUIRE(d.v_absmax[std::size_t(sl.offset + b0)] == va);
        for (int64_t j = 0; j < n; ++j) {
          const std::size_t i = std::size_t(sl.offset + b0 + j), c = std::size_t(code + b0 + j);
          wrong += mc[c] != nearest(sm.values(), m32[i] / ma);
          wrong += vc[c] != nearest(um.values(), v32[i] / va);
        }
      }
      code += sl.numel();
    }
    CHECK(wrong == 0);
    // Re-sync: the reference continues from the decoded moments.
    NamedTensor em{"exp_avg", DType::f32, {table.total}, std::vector<uint8_t>(p32.size() * 4)};
    NamedTensor ev{"exp_avg_sq", DType::f32, {table.total}, std::vector<uint8_t>(p32.size() * 4)};
    std::memcpy(em.bytes.data(), d.m.data(), em.bytes.size());
    std::memcpy(ev.bytes.data(), d.v.data(), ev.bytes.size());
    ref->load_state({em, ev});
  }
}

// The accumulated error: only the parameters are re-synced each step, the reference keeps its own
// fp32 moments, so the 8-bit moments drift from them as quantization errors add up. Thresholds
// (bitsandbytes' test_optimizer8bit uses 1.2e-4 for the mean |dp|, 1.2e-3 for the mean relative
// error and 1e-5 + 1e-3 |p| per element, with its reference moments re-synced every step):
//   - per step, mean |dp| < 1e-5 (lr = 1e-3: a hundredth of a step);
//   - the mean relative error err / (|p| + 1e-9), averaged over the 50 steps, < 1e-3; per step < 2e-3
//     (a single step's mean is dominated by the few parameters closest to zero);
//   - elements off by more than 1e-5 + 1e-3 |p|: at most 1% of the 8-bit elements in any step and
//     0.5% on average;
//   - fp32 slices (small, or matched by the pattern) equal adamw bit for bit.
TEST_CASE("adamw8bit follows fp32 adamw step by step over 50 steps on odd-sized random tensors") {
  Setup s;
  const ParamTable table = mixed_table();
  auto ref = s.make32();
  auto opt = s.make8();
  ref->init(table, DeviceType::cpu);
  opt->init(table, DeviceType::cpu);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p32(std::size_t(table.total)), g(p32.size());
  for (float& x : p32) x = 0.1f * normal(rng);
  std::vector<float> p8 = p32;
  const int steps = 50;
  double worst_abs = 0, worst_rel = 0, rel_total = 0, off_total = 0, worst_off = 0;
  for (int t = 1; t <= steps; ++t) {
    for (float& x : g) x = 0.01f * normal(rng);  // fresh gradients each step
    ref->step(table, view(p32), view(g), s.lr, t);
    opt->step(table, view(p8), view(g), s.lr, t);
    const Moments d = decode(opt->save_state(), table, 256);
    const auto m32 = values<float>(tensor(ref->save_state(), "exp_avg"));
    const auto v32 = values<float>(tensor(ref->save_state(), "exp_avg_sq"));
    double abs_sum = 0, rel_sum = 0;
    int64_t off = 0, n8 = 0;
    for (std::size_t i = 0; i < p32.size(); ++i) {
      if (!d.quantized[i]) {
        REQUIRE(p8[i] == p32[i]);
        REQUIRE(d.m[i] == m32[i]);
        REQUIRE(d.v[i] == v32[i]);
        continue;
      }
      const double err = std::fabs(double(p8[i]) - p32[i]);
      ++n8;
      abs_sum += err;
      rel_sum += err / (std::fabs(p32[i]) + 1e-9);
      off += err > 1e-5 + 1e-3 * std::fabs(p32[i]) ? 1 : 0;
    }
    const double mean_abs = abs_sum / double(n8), mean_rel = rel_sum / double(n8), frac_off = double(off) / double(n8);
    CHECK(mean_abs < 1e-5);
    CHECK(mean_rel < 2e-3);
    CHECK(frac_off <= 0.01);
    worst_abs = std::max(worst_abs, mean_abs);
    worst_rel = std::max(worst_rel, mean_rel);
    worst_off = std::max(worst_off, frac_off);
    rel_total += mean_rel;
    off_total += frac_off;
    p8 = p32;  // re-sync the parameters: each step's error is measured on its own
  }
  CHECK(rel_total / steps < 1e-3);
  CHECK(off_total / steps <= 0.005);
  MESSAGE("per step: mean |dp| <= " << worst_abs << ", mean relative <= " << worst_rel << " (average " << rel_total / steps
                                    << "), elements off <= " << 100 * worst_off << "% (average " << 100 * off_total / steps << "%)");
}

TEST_CASE("adamw8bit keeps fp32 moments for small and pattern-matched slices, and state_bytes counts codes, absmax, fp32 and maps") {
  Setup s;
  const ParamTable table = mixed_table();
  auto opt = s.make8();
  opt->init(table, DeviceType::cpu);
  const auto q = values<uint8_t>(tensor(opt->save_state(), "quantized_slices"));
  CHECK(q == std::vector<uint8_t>{0, 0, 1, 1, 1, 1, 1});
  // 8-bit: 4773 + 4096 + 4097 + 8250 + 30000 elements in 19 + 16 + 17 + 33 + 118 blocks; fp32: 5120 + 100.
  const int64_t n8 = 4773 + 4096 + 4097 + 8250 + 30000, blocks = 19 + 16 + 17 + 33 + 118, n32 = 5120 + 100;
  CHECK(tensor(opt->save_state(), "exp_avg.absmax").shape == std::vector<int64_t>{blocks});
  CHECK(opt->state_bytes() == 2 * n8 + 2 * 4 * blocks + 2 * 4 * n32 + 2 * 256 * 4);

  // An empty pattern and min_8bit_size 0: everything 8-bit, even a one-element slice.
  auto all8 = s.make8({128, 0, ""});
  all8->init(table, DeviceType::cpu);
  CHECK(values<uint8_t>(tensor(all8->save_state(), "quantized_slices")) == std::vector<uint8_t>(7, 1));
  // A custom pattern.
  auto custom = s.make8({256, 4096, "lm_head|\\.o\\."});
  custom->init(table, DeviceType::cpu);
  CHECK(values<uint8_t>(tensor(custom->save_state(), "quantized_slices")) == std::vector<uint8_t>{1, 0, 1, 0, 1, 1, 0});

  Keys bad;
  bad.pattern = "wte(";
  try {
    s.make8(bad);
    FAIL("an invalid regex was accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK(std::string(e.what()).find("optimizer.adamw8bit.fp32_state_pattern") != std::string::npos);
  }
}

TEST_CASE("adamw8bit state saved and loaded continues bit for bit (odd block size, short last blocks)") {
  Setup s;
  const ParamTable table = mixed_table();
  const Keys keys{100, 1000, "^wte\\."};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(std::size_t(table.total));
  for (float& x : p0) x = 0.1f * normal(rng);
  std::vector<std::vector<float>> grads(8, std::vector<float>(p0.size()));
  for (auto& gv : grads)
    for (float& x : gv) x = 0.01f * normal(rng);

  auto straight = s.make8(keys);
  straight->init(table, DeviceType::cpu);
  std::vector<float> a = p0;
  for (int t = 1; t <= 8; ++t) straight->step(table, view(a), view(grads[t - 1]), s.lr, t);

  auto first = s.make8(keys);
  first->init(table, DeviceType::cpu);
  std::vector<float> b = p0;
  for (int t = 1; t <= 5; ++t) first->step(table, view(b), view(grads[t - 1]), s.lr, t);
  const auto saved = first->save_state();
  auto second = s.make8(keys);
  second->init(table, DeviceType::cpu);
  second->load_state(saved);
  const auto reloaded = second->save_state();
  REQUIRE(reloaded.size() == saved.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    CHECK(reloaded[i].name == saved[i].name);
    CHECK(reloaded[i].dtype == saved[i].dtype);
    CHECK(reloaded[i].shape == saved[i].shape);
    CHECK(reloaded[i].bytes == saved[i].bytes);
  }
  CHECK(tensor(saved, "exp_avg.codes").dtype == DType::u8);
  CHECK(tensor(saved, "exp_avg_sq.absmax").dtype == DType::f32);
  for (int t = 6; t <= 8; ++t) second->step(table, view(b), view(grads[t - 1]), s.lr, t);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  const auto end_a = straight->save_state(), end_b = second->save_state();
  for (std::size_t i = 0; i < end_a.size(); ++i) CHECK(end_a[i].bytes == end_b[i].bytes);
}

TEST_CASE("adamw8bit refuses a state that does not fit, naming what is wrong, and keeps its own") {
  Setup s;
  const ParamTable table = mixed_table();
  auto opt = s.make8();
  opt->init(table, DeviceType::cpu);
  std::vector<float> p(std::size_t(table.total), 0.5f), g(p.size(), 0.01f);
  opt->step(table, view(p), view(g), s.lr, 1);
  const auto good = opt->save_state();
  const auto refused = [&](std::vector<NamedTensor> state, const std::string& expected) {
    try {
      opt->load_state(state);
      FAIL("accepted: " << expected);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      CHECK_MESSAGE(std::string(e.what()).find(expected) != std::string::npos, e.what());
    }
    const auto now = opt->save_state();
    for (std::size_t i = 0; i < now.size(); ++i) CHECK(now[i].bytes == good[i].bytes);
  };
  const auto edit = [&](const std::string& name, auto change) {
    std::vector<NamedTensor> st = good;
    for (NamedTensor& t : st) {
      if (t.name == name) change(t);
    }
    return st;
  };
  refused(edit("exp_avg.codes",
               [](NamedTensor& t) {
                 t.shape = {t.shape[0] - 1};
                 t.bytes.pop_back();
               }),
          "tensor 'exp_avg.codes' is u8");
  refused(edit("exp_avg_sq.absmax",
               [](NamedTensor& t) {
                 t.dtype = DType::u8;
                 t.shape = {int64_t(t.bytes.size())};
               }),
          "expected f32");
  refused(edit("exp_avg.absmax",
               [](NamedTensor& t) {
                 const float nan = std::nanf("");
                 std::memcpy(t.bytes.data(), &nan, 4);
               }),
          "non-finite absmax");
  refused(edit("block_size",
               [](NamedTensor& t) {
                 const int32_t bs = 128;
                 std::memcpy(t.bytes.data(), &bs, 4);
               }),
          "block_size 128");
  refused(edit("quantized_slices", [](NamedTensor& t) { t.bytes[0] = 1; }), "slice 'wte.weight' has 8-bit moments in the state");
  refused(edit("exp_avg.map", [](NamedTensor& t) { t.bytes[40] ^= 1; }), "code maps differ");
  std::vector<NamedTensor> missing = good;
  missing.pop_back();
  refused(missing, "'quantized_slices' is missing");
  std::vector<NamedTensor> extra = good;
  extra.push_back({"exp_avg", DType::f32, {1}, std::vector<uint8_t>(4)});
  refused(extra, "unexpected tensor 'exp_avg'");
  // Another run's layout: a different table.
  ParamTable other;
  other.add("w", {64, 100}, true);
  auto small = s.make8();
  small->init(other, DeviceType::cpu);
  try {
    small->load_state(good);
    FAIL("a state for another table was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("quantized_slices") != std::string::npos);
  }
}

TEST_CASE("adamw8bit skips and counts non-finite gradients, and their parameters and moments stay") {
  Setup s;
  ParamTable table;
  table.add("w", {1000}, true);  // 8-bit: blocks of 256, the last one 232 long
  table.add("b", {50}, false);   // fp32
  auto opt = s.make8({256, 512, ""});
  opt->init(table, DeviceType::cpu);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(std::size_t(table.total)), g(p.size());
  for (float& x : p) x = 0.1f * normal(rng);
  for (int t = 1; t <= 3; ++t) {
    for (float& x : g) x = 0.01f * normal(rng);
    opt->step(table, view(p), view(g), s.lr, t);
  }
  CHECK(opt->skipped_nonfinite() == 0);
  const Moments before = decode(opt->save_state(), table, 256);
  const auto codes_before = opt->save_state();
  const std::vector<float> p_before = p;
  for (float& x : g) x = 0.01f * normal(rng);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::size_t> bad = {3, 300, 999, 1010};
  g[3] = nan;
  g[300] = inf;
  g[999] = -inf;
  g[1010] = nan;                                       // in the fp32 slice
  for (std::size_t i = 512; i < 768; ++i) g[i] = nan;  // the whole third block
  opt->step(table, view(p), view(g), s.lr, 4);
  CHECK(opt->skipped_nonfinite() == 4 + 256);
  const Moments after = decode(opt->save_state(), table, 256);
  for (std::size_t i : bad) {
    INFO("element " << i);
    CHECK(std::memcmp(&p[i], &p_before[i], sizeof(float)) == 0);
    if (!after.quantized[i]) {
      CHECK(after.m[i] == before.m[i]);
      CHECK(after.v[i] == before.v[i]);
    } else {
      // Re-encoded against the block's new absmax: within half the top code spacing of it, not
      // decayed by beta1 (0.9) as a zero gradient would have done.
      CHECK(std::fabs(after.m[i] - before.m[i]) <= 0.9 / 128 * after.m_absmax[i] + 1e-12);
      CHECK(std::fabs(after.v[i] - before.v[i]) <= 0.9 / 256 * after.v_absmax[i] + 1e-12);
    }
    CHECK(std::isfinite(after.m[i]));
  }
  // A block whose every gradient was not finite keeps its codes, absmax and parameters exactly.
  const auto codes_after = opt->save_state();
  const auto mc0 = values<uint8_t>(tensor(codes_before, "exp_avg.codes")), mc1 = values<uint8_t>(tensor(codes_after, "exp_avg.codes"));
  const auto vc0 = values<uint8_t>(tensor(codes_before, "exp_avg_sq.codes")),
             vc1 = values<uint8_t>(tensor(codes_after, "exp_avg_sq.codes"));
  for (std::size_t i = 512; i < 768; ++i) {
    REQUIRE(mc0[i] == mc1[i]);
    REQUIRE(vc0[i] == vc1[i]);
    REQUIRE(p[i] == p_before[i]);
  }
  CHECK(after.m_absmax[512] == before.m_absmax[512]);
  CHECK(after.v_absmax[512] == before.v_absmax[512]);
  // Everything else moved and stays finite.
  for (std::size_t i = 0; i < p.size(); ++i) {
    REQUIRE(std::isfinite(p[i]));
    if ((i < 512 || i >= 768) && std::find(bad.begin(), bad.end(), i) == bad.end()) REQUIRE(p[i] != p_before[i]);
  }
  // The count is per step.
  for (float& x : g) x = 0.01f * normal(rng);
  opt->step(table, view(p), view(g), s.lr, 5);
  CHECK(opt->skipped_nonfinite() == 0);
}

TEST_CASE("adamw8bit gives the same result with 1, 2 and 3 threads") {
  Setup s;
  const ParamTable table = mixed_table();
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(std::size_t(table.total));
  for (float& x : p0) x = 0.1f * normal(rng);
  std::vector<std::vector<float>> grads(4, std::vector<float>(p0.size()));
  for (auto& gv : grads)
    for (float& x : gv) x = 0.01f * normal(rng);
  const int threads_before = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  std::vector<std::vector<NamedTensor>> states;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto opt = s.make8({64, 1000, "^wte\\."});
    opt->init(table, DeviceType::cpu);
    std::vector<float> p = p0;
    for (int t = 1; t <= 4; ++t) opt->step(table, view(p), view(grads[t - 1]), s.lr, t);
    results.push_back(p);
    states.push_back(opt->save_state());
  }
  omp_set_num_threads(threads_before);
  for (std::size_t k = 1; k < results.size(); ++k) {
    CHECK(std::memcmp(results[0].data(), results[k].data(), results[0].size() * sizeof(float)) == 0);
    for (std::size_t i = 0; i < states[0].size(); ++i) CHECK(states[0][i].bytes == states[k][i].bytes);
  }
}
