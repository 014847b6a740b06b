// Table lookups and positions: `embedding` (token table), `learned` (position table added to the
// stream) and `rope` (rotary position embedding of query/key heads).
#include "common.hpp"

namespace ablate::cpu_layers {
namespace {

// grads[index[r], :] += scale(r, c) * d[r, :] for every row, deterministically (see kColumnBlock).
template <class T, class Factor>
void scatter_add_rows(const int32_t* index, int64_t rows, int64_t cols, const T* d, T* grads, Factor factor) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
    for (int64_t r = 0; r < rows; ++r) {
      T* g = grads + int64_t(index[r]) * cols;
      const T* dr = d + r * cols;
      for (int64_t c = c0; c < c1; ++c) g[c] += dr[c] * factor(r, c);
    }
  }
}

void check_indices(const char* layer, std::span<const int32_t> index, int64_t limit, const char* what) {
  for (std::size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= limit) {
      throw_input_error(layer, std::string(what) + " " + std::to_string(index[i]) + " at " + std::to_string(i) + " is outside [0, " +
                                   std::to_string(limit) + ")");
    }
  }
}

// --- embedding ------------------------------------------------------------------------------------

class Embedding final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::embedding; }

  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::embedding(spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const DType dt = call_dtype(kName, {&call.y, &call.params});
    require(kName, call.y, "y", call.rows * s.in);
    require(kName, call.params, "params", s.out * s.in);
    const std::span<const int32_t> tokens = require_ids(kName, call, &BatchViews::tokens, "tokens");
    check_indices(kName, tokens, s.out, "token");
    const Dropout drop = make_dropout(kName, call);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* w = call.params.as<T>();
      T* y = call.y.as<T>();
      const int64_t in = s.in;
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
      for (int64_t r = 0; r < call.rows; ++r) {
        const T* src = w + int64_t(tokens[r]) * in;
        T* yr = y + r * in;
        if (drop.on()) {
          for (int64_t c = 0; c < in; ++c) yr[c] = src[c] * drop.factor<T>(uint64_t(r * in + c));
        } else {
          std::memcpy(yr, src, std::size_t(in) * sizeof(T));
        }
      }
    });
  }

  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const DType dt = call_dtype(kName, {&call.d_y, &call.grads});
    require(kName, call.d_y, "d_y", call.rows * s.in);
    if (call.grads.data == nullptr) return;  // a frozen table: its gradient is all this backward computes
    require(kName, call.grads, "grads", s.out * s.in);
    const std::span<const int32_t> tokens = require_ids(kName, call, &BatchViews::tokens, "tokens");
    check_indices(kName, tokens, s.out, "token");
    const Dropout drop = make_dropout(kName, call);
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const int64_t in = s.in;
      if (drop.on()) {
        scatter_add_rows(tokens.data(), call.rows, in, call.d_y.as<T>(), call.grads.as<T>(),
                         [&](int64_t r, int64_t c) { return drop.factor<T>(uint64_t(r * in + c)); });
      } else {
        scatter_add_rows(tokens.data(), call.rows, in, call.d_y.as<T>(), call.grads.as<T>(), [](int64_t, int64_t) { return T(1); });
      }
    });
  }

 private:
  static constexpr const char* kName = "embedding";
};

// --- learned positions ------------------------------------------------------------------------------

class Learned final : public Layer {
 public:
  LayerRole role() const override { return LayerRole::position; }

  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    layer_params::learned(spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }

  void forward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const DType dt = call_dtype(kName, {&call.x, &call.y, &call.params});
    require(kName, call.x, "x", call.rows * s.in);
    require(kName, call.y, "y", call.rows * s.in);
    require(kName, call.params, "params", s.max_positions * s.in);
    const std::span<const int32_t> positions = require_ids(kName, call, &BatchViews::positions, "positions");
    check_indices(kName, positions, s.max_positions, "position");
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* w = call.params.as<T>();
      const T* x = call.x.as<T>();
      T* y = call.y.as<T>();
      const int64_t in = s.in;
#pragma omp parallel for schedule(static) if (call.rows * in >= kParallelMin)
      for (int64_t r = 0; r < call.rows; ++r) {
        const T* p = w + int64_t(positions[r]) * in;
        for (int64_t c = 0; c < in; ++c) y[r * in + c] = x[r * in + c] + p[c];
      }
    });
  }

  // d_x = d_y (written or added); when d_x is d_y's buffer the pass-through is already in place.
  void backward(const LayerCall& call) override {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    const DType dt = call_dtype(kName, {&call.d_y, &call.d_x, &call.grads});
    require(kName, call.d_y, "d_y", call.rows * s.in);
    if (call.grads.data != nullptr) require(kName, call.grads, "grads", s.max_positions * s.in);
    const std::span<const int32_t> positions = require_ids(kName, call, &BatchViews::positions, "positions");
    check_indices(kName, positions, s.max_positions, "position");
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const int64_t in = s.in, n = call.rows * in;
      const T* dy = call.d_y.as<T>();
      if (call.grads.data != nullptr) {  // null: a frozen table
        scatter_add_rows(positions.data(), call.rows, in, dy, call.grads.as<T>(), [](int64_t, int64_t) { return T(1); });
      }
      if (call.d_x.data != nullptr && !same(call.d_x, call.d_y)) {
        require(kName, call.d_x, "d_x", n);
        T* dx = call.d_x.as<T>();
        if (call.input_grad == GradMode::accumulate) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
          for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
        } else {
          std::memcpy(dx, dy, std::size_t(n) * sizeof(T));
        }
      }
    });
  }

 private:
  static constexpr const char* kName = "learned";
};

// --- rope ---------------------------------------------------------------------------------------------
//
// Rotary embedding in the rotate-half convention of Hugging Face's Llama and Qwen models: a head
// of D values is split into halves, and value i of the first half pairs with value i + D/2 of the
// second. For i in [0, D/2) the pair is rotated by angle = position * theta^(-2i/D):
//   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
// Angles, cosines and sines are computed in double, then rounded to the call's dtype. The
// position of row r is batch.positions[r] (restarting at 0 with every document). Backward applies
// the transposed (inverse) rotation. y may alias x and d_x may alias d_y.

class Rope final : public layer_params::RopeFace {
 public:
  using RopeFace::RopeFace;
  void forward(const LayerCall& call) override { run(call, false); }
  void backward(const LayerCall& call) override { run(call, true); }

 private:
  static constexpr const char* kName = "rope";


  void run(const LayerCall& call, bool inverse) {
    check_spec(kName, call);
    const LayerSpec& s = *call.spec;
    layer_params::rope(s);
    if (call.heads <= 0) throw_runtime_error(kName, "heads must be positive");
    const TensorView& src = inverse ? call.d_y : call.x;
    const TensorView& dst = inverse ? call.d_x : call.y;
    const DType dt = call_dtype(kName, {&src, &dst});
    const int64_t n = call.rows * call.heads * s.in;
    require(kName, src, inverse ? "d_y" : "x", n);
    require(kName, dst, inverse ? "d_x" : "y", n);
    const bool accumulate = inverse && call.input_grad == GradMode::accumulate;
    if (accumulate && same(src, dst)) {
      throw_runtime_error(kName, "d_x cannot both alias d_y and accumulate");
    }
    const std::span<const int32_t> positions = require_ids(kName, call, &BatchViews::positions, "positions");
    const int64_t D = s.in, half = D / 2, heads = call.heads;
    // theta^(-2i/D) for each pair.
    std::vector<double> freq(static_cast<std::size_t>(half));
    for (int64_t i = 0; i < half; ++i) freq[i] = std::pow(theta_, -2.0 * double(i) / double(D));
    // The inverse rotation is the rotation by -angle.
    const double sign = inverse ? -1.0 : 1.0;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* x = src.as<T>();
      T* y = dst.as<T>();
#pragma omp parallel if (call.rows * heads * D >= kParallelMin)
      {
        std::vector<T> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < call.rows; ++r) {
          const double pos = double(positions[r]);
          for (int64_t i = 0; i < half; ++i) {
            const double angle = pos * freq[i];
            cs[i] = T(std::cos(angle));
            sn[i] = T(sign * std::sin(angle));
          }
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t base = (r * heads + h) * D;
            const T* xh = x + base;
            T* yh = y + base;
            for (int64_t i = 0; i < half; ++i) {
              const T x1 = xh[i], x2 = xh[i + half];
              const T y1 = x1 * cs[i] - x2 * sn[i];
              const T y2 = x2 * cs[i] + x1 * sn[i];
              if (accumulate) {
                yh[i] += y1;
                yh[i + half] += y2;
              } else {
                yh[i] = y1;
                yh[i + half] = y2;
              }
            }
          }
        }
      }
    });
  }
};

}  // namespace

std::unique_ptr<Layer> make_embedding() { return std::make_unique<Embedding>(); }
std::unique_ptr<Layer> make_learned() { return std::make_unique<Learned>(); }
std::unique_ptr<Layer> make_rope(double theta) { return std::make_unique<Rope>(theta); }

}  // namespace ablate::cpu_layers
