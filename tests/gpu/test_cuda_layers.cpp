// The layer suite parameterised by device: every layer the cuda_layers plugin registers against
// its CPU twin from cpu_layers, both made through the Registry under the same name. Each case
// draws fresh random float32 inputs (fixed seeds) at rows 1, 7 and 257 (also 1100 where the GPU
// works in chunks of rows: the classifier's 1024, the 256 of the norms' and lookups' gradient
// sums) and widths that are not multiples of 8 (and one mlp hidden width that is, for cuBLASLt's
// fused GELU epilogues), and runs forward and backward on both devices: the CPU twin in float64 on
// the same float32 values (so the reference carries no rounding of its own), the CUDA layer on a
// non-blocking stream of its own in each run.dtype the plugin serves: fp32 (true fp32 products),
// tf32, and bf16 with and without the model's bf16 copy of the weights (LayerCall::params_bf16).
// Under bf16 the activations only products read are also held in bf16 where the model holds them
// so (LayerBase::bf16_product_inputs): the norms write y in bf16, the dense layers and the
// classifier read x in bf16, and the MLPs keep their hidden activation in bf16. Rounding such an
// input before the call is what the product's own copy does, so a layer handed bf16 x must give
// the bits it gives for f32 x, and a norm's bf16 y must be the rounding of its f32 y, bit for bit.
// So are q, k and v where the attention backend takes them in bf16 (bf16_attention_inputs): a
// linear writes y in bf16 (the rounding of its f32 y, bit for bit), rope rotates bf16 values and
// the qk-norm reads and writes bf16 (their inputs rounded first: within one more bf16 stage of the
// CPU; rope's backward, on f32 gradients, bit for bit).
//
// Every output and scratch buffer on the GPU is poisoned with NaN before each call, so a value
// the contract says is written but is not comes back NaN and fails. Parameter gradients, which
// the contract says accumulate, start from the same random values on both devices; so does d_x
// under GradMode::accumulate. Compared: forward outputs, the saved values (defined identically by
// both twins for every layer that keeps any), d_x and every parameter gradient; for the classifier
// the losses (exactly 0 where the target is -1), the optional logits, d_x and the weight gradient,
// whose padded-vocabulary rows must come back exactly as they went in on both devices.
//
// Cases: bias on and off where a layer has one; dropout 0 and 0.1 with the same key on both
// devices (the mask is a pure function of key and index, shared by both plugins, so the outputs
// must agree like any other); residual none, separate and in y's own buffer; learned positions and
// rope also in place (y is x, d_x is d_y); rmsnorm also as the qk-norm (rows * heads rows of
// head_dim); input gradient written and accumulated. The attention backends are tested elsewhere
// (test_naive_cuda.cpp, test_cudnn_flash.cpp).
//
// One line per layer and dtype is printed with the worst error relative to the tensor's scale and
// the worst fraction of the tolerance used, so a GPU run's log shows the margins. Exits 77
// (CTest: skipped) without a CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ablate/batch.hpp"
#include "ablate/cuda_check.hpp"
#include "fp8_device.hpp"
#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/layer.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/registry.hpp"

using namespace ablate;

namespace {

// --- tolerances -----------------------------------------------------------------------------------
//
// An element passes when |gpu - cpu| <= atol * scale + rtol * |cpu|, where cpu is the float64
// reference and scale the largest |cpu| of the tensor (for a tensor that accumulates onto given
// values, the largest |cpu - given|: the part the call computed). Two things set the error:
//
// fp32 products, and every layer without products in any run.dtype (lookups, rope, norms: their
// arithmetic does not change with run.dtype). The unit roundoff is u = 2^-24 ~ 6e-8. A sum of K
// terms formed in any order (cuBLAS's blocking and split-K, warp shuffles, FMA contraction) has
// rounding errors of rms about u sqrt(K) / 2.5 times the result's size when the terms have random
// signs, against a float64 reference that has none; the GPU's expf/sqrtf (2 ulp), the GELU of
// cuBLASLt's fused epilogue and float row statistics add a few u. K here is the sum of the lengths of the reductions a value passes
// through (rows, in, out for a dense layer's gradients: independent errors add in quadrature, so
// their lengths add). The worst of up to 1e5 elements is ~4.5 rms. atol = 4e-6 sqrt(K) (~67 u
// sqrt(K)) leaves a margin of ten or more over that; rtol = 1e-5 (~170 u) covers elements whose
// own rounding is the largest part (a dropout scale rounded to float, the final add onto an
// accumulated gradient).
//
// tf32 and bf16 products: each operand is rounded to the format first, relative error up to
// u_op = 2^-8 for bf16 (8 significant bits, round to nearest) and 2^-10 for TF32 (11 significant
// bits; 2^-10 also covers truncation), then products are accumulated in fp32. A product's error
// is then up to 2 u_op, of rms about 0.8 u_op; over a K-term sum with random-signed terms these add
// to about 0.8 u_op times the result's rms, independent of K. A layer chains `stages` such steps
// (a product, or an elementwise function of a product's output: linear 1; gelu_mlp 3 for d_x and
// the fc gradients; swiglu_mlp 4; the classifier 2, logits then dz W, and 3 with bf16 logits), adding in quadrature. The
// worst of 1e5 elements at ~4.5 rms and rms <= scale put the worst error near 0.8 * 4.5 u_op
// sqrt(stages) = 3.7 u_op sqrt(stages) of the scale; atol = 8 u_op sqrt(stages) is twice that
// (bf16: 3.1e-2 of the scale for one stage, 6.3e-2 for four). rtol = 4 u_op (bf16: 1.6e-2) bounds
// an element that is a single product of two rounded operands (a rows = 1 weight gradient) with
// a factor of two to spare.
enum class Precision { f32, tf32, bf16 };

struct Tolerance {
  double rtol = 0, atol = 0;  // atol is relative to the tensor's scale
};

Tolerance tolerance(Precision p, int64_t K, int stages) {
  const double f32_atol = 4e-6 * std::sqrt(double(std::max<int64_t>(K, 1)));
  if (stages == 0 || p == Precision::f32) return {1e-5, f32_atol};
  const double u_op = p == Precision::bf16 ? 0x1p-8 : 0x1p-10;
  return {4 * u_op, 8 * u_op * std::sqrt(double(stages)) + f32_atol};
}

// How the CUDA layers compute their products (run.dtype, read by cuda_layers.cpp's factory).
struct Mode {
  const char* name;   // in messages and margin lines
  const char* dtype;  // run.dtype
  Precision precision;
  bool bf16_copy;  // bf16: the call gives the model's bf16 copy of the parameters (params_bf16)
  // bf16: the layer's product input held in bf16 (a norm's y, a dense layer's or the classifier's
  // x), for layers that take it so; checked bit for bit against the mode before it.
  bool held = false;
};

constexpr Mode kModes[] = {
    {"fp32", "fp32", Precision::f32, false},          {"tf32", "tf32", Precision::tf32, false},
    {"bf16", "bf16", Precision::bf16, true},          {"bf16 held", "bf16", Precision::bf16, true, true},
    {"bf16 no copy", "bf16", Precision::bf16, false},
};

// --- the worst margins, one line per layer and dtype ------------------------------------------------

class Margins {
 public:
  explicit Margins(std::string family) : family_(std::move(family)) {}
  Margins(const Margins&) = delete;
  Margins& operator=(const Margins&) = delete;
  ~Margins() {
    for (const auto& [mode, m] : by_mode_) {
      std::printf("cuda vs cpu  %-18s %-12s  %4d cases  worst |err|/scale %.2e  worst err/tol %.3f  (%s)\n", family_.c_str(),
                  mode.c_str(), m.cases, m.scaled, m.used, m.where.c_str());
    }
    std::fflush(stdout);
  }
  void add(const std::string& mode, const std::string& where, double scaled, double used) {
    Entry& e = entry(mode);
    e.scaled = std::max(e.scaled, scaled);
    if (used >= e.used) {
      e.used = used;
      e.where = where;
    }
  }
  void count(const std::string& mode) { ++entry(mode).cases; }

 private:
  struct Entry {
    double scaled = 0, used = 0;
    std::string where = "-";
    int cases = 0;
  };
  Entry& entry(const std::string& mode) {
    for (auto& [m, e] : by_mode_) {
      if (m == mode) return e;
    }
    by_mode_.emplace_back(mode, Entry{});
    return by_mode_.back().second;
  }
  std::string family_;
  std::vector<std::pair<std::string, Entry>> by_mode_;  // in the order the modes first report
};

// GPU results against the float64 reference; `base` (may be empty) holds the values the call
// accumulated onto. Fails with the worst element when any is over its tolerance or not finite.
void compare(const char* tensor, const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& base,
             Tolerance tol, Margins& margins, const std::string& mode, const std::string& label) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i] - (base.empty() ? 0.0 : base[i])));
  double worst = 0, used = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    const double bound = tol.atol * scale + tol.rtol * std::abs(want[i]);
    double u = d == 0 ? 0.0 : bound > 0 ? d / bound : std::numeric_limits<double>::infinity();
    if (!std::isfinite(got[i])) {
      u = std::numeric_limits<double>::infinity();
    } else {
      worst = std::max(worst, d);
    }
    if (u > used) {
      used = u;
      at = i;
    }
  }
  const double scaled = scale > 0 ? worst / scale : worst;
  margins.add(mode, std::string(tensor) + ", " + label, scaled, used);
  if (!got.empty()) {
    CHECK_MESSAGE(used <= 1.0, std::string(tensor) << ": element " << at << " of " << got.size() << " is " << got[at] << ", the CPU's "
                                                   << want[at] << " (scale " << scale << ", atol " << tol.atol << " * scale + rtol "
                                                   << tol.rtol << " * |cpu|; worst |err|/scale " << scaled << ")");
  }
}

// Element for element the same values (NaN equal to NaN: a poisoned element must stay poisoned in both).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  }
  return true;
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// --- the plugins, the stream and device memory ------------------------------------------------------

struct Suite {
  Registry registry;
  cudaStream_t stream = nullptr;  // non-blocking, as the cuda device's
  std::map<std::string, std::unique_ptr<LayerBase>> made;
  Suite() {
    registry.load_directories({ABLATE_PLUGIN_DIR});
    ABLATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Suite() {
    made.clear();
    cudaStreamDestroy(stream);
  }
  Suite(const Suite&) = delete;
  Suite& operator=(const Suite&) = delete;

  // The registration of `name` for `device`, made once per (name, device, dtype).
  template <class L>
  // `own`: the layer's own keys ([model.<name>]; rope's theta), none by default.
  L& layer(const std::string& name, const std::string& device, const std::string& dtype = "fp32", const Params& own = {}) {
    std::string key = name + "/" + device + "/" + dtype;
    for (const auto& [k, v] : own.values()) key += "/" + k + "=" + format_value(v);
    auto it = made.find(key);
    if (it == made.end()) {
      const Params common{"model", {}};
      RunContext run;
      run.device = device;
      run.dtype = dtype;
      run.threads = 2;
      it = made.emplace(key, registry.create<L>(Kind::layer, name, {common, own, run})).first;
    }
    return dynamic_cast<L&>(*it->second);
  }
};

Suite* g_suite = nullptr;  // made by main once a device is known to be there
Suite& suite() { return *g_suite; }

using DeviceFloats = cuda::DeviceBuffer<float>;

template <class T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& host) {
  cuda::DeviceBuffer<T> b(host.size());
  if (!host.empty()) {
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(b.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, suite().stream));
  }
  return b;
}

// All bits set: a NaN in every float.
void poison(DeviceFloats& b) {
  if (b.size() > 0) ABLATE_CUDA_CHECK(cudaMemsetAsync(b.data(), 0xFF, b.bytes(), suite().stream));
}

DeviceFloats poisoned(int64_t n) {
  DeviceFloats b(static_cast<std::size_t>(n));
  poison(b);
  return b;
}

// The bits of every element (a buffer that holds bf16 values in pairs, too).
std::vector<uint32_t> bits_from_device(const DeviceFloats& b) {
  std::vector<uint32_t> h(b.size());
  if (!h.empty()) ABLATE_CUDA_CHECK(cudaMemcpyAsync(h.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost, suite().stream));
  ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
  return h;
}

std::vector<double> from_device(const DeviceFloats& b) {
  std::vector<float> h(b.size());
  if (!h.empty()) ABLATE_CUDA_CHECK(cudaMemcpyAsync(h.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost, suite().stream));
  ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
  return {h.begin(), h.end()};
}

TensorView device_view(DeviceFloats& b) {
  return b.size() == 0 ? TensorView{} : flat_view(b.data(), DType::f32, int64_t(b.size()), DeviceType::cuda);
}

TensorView host_view(std::vector<double>& v) { return v.empty() ? TensorView{} : flat_view(v.data(), DType::f64, int64_t(v.size())); }

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The model's bf16 copy of the parameters (the host rounding the optimizers' copy matches); also
// an activation the model holds in bf16.
cuda::DeviceBuffer<uint16_t> bf16_copy(const std::vector<float>& params) {
  std::vector<uint16_t> bits(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) bits[i] = device_math::bf16_bits(params[i]);
  return to_device(bits);
}

TensorView bf16_view(cuda::DeviceBuffer<uint16_t>& b) {
  return b.size() == 0 ? TensorView{} : flat_view(b.data(), DType::bf16, int64_t(b.size()), DeviceType::cuda);
}

std::vector<double> from_device_bf16(const cuda::DeviceBuffer<uint16_t>& b) {
  std::vector<uint16_t> h(b.size());
  if (!h.empty()) ABLATE_CUDA_CHECK(cudaMemcpyAsync(h.data(), b.data(), b.size() * 2, cudaMemcpyDeviceToHost, suite().stream));
  ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
  std::vector<double> v(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) v[i] = device_math::bf16_value(h[i]);
  return v;
}

// Under bf16 products the MLPs keep their saved values in bf16 (gelu_mlp: the pre-activation and
// the activation; swiglu_mlp: gate, up and h), two values to an element. The number of f32 saved
// values before them (none: from the first element), or -1 where the layer keeps all its saved
// values in f32.
int64_t f32_saved_before_bf16(const std::string& layer, const Mode& mode, int64_t hidden_values) {
  (void)hidden_values;
  if (std::string(mode.dtype) != "bf16") return -1;
  if (layer == "gelu_mlp" || layer == "swiglu_mlp") return 0;
  return -1;
}

// The values a layer keeps in bf16 under bf16 products: the GELU MLP's pre-activation and
// activation, the SwiGLU MLP's gate, up and h.
int64_t bf16_saved_values(const std::string& layer, int64_t hidden_values) {
  return layer == "gelu_mlp" ? 2 * hidden_values : 3 * hidden_values;
}

int64_t saved_elements(const std::string& layer, const Mode& mode, int64_t cpu_elements, int64_t hidden_values) {
  const int64_t f32 = f32_saved_before_bf16(layer, mode, hidden_values);
  return f32 < 0 ? cpu_elements : (f32 + 63) / 64 * 64 + (bf16_saved_values(layer, hidden_values) + 1) / 2;
}

// The saved values as the CPU twin lays them out (all f32), from the GPU's bits.
std::vector<double> saved_as_cpu(const std::vector<uint32_t>& bits, int64_t f32_before, int64_t hidden_values) {
  const auto f32_of = [](uint32_t u) {
    float x = 0;
    std::memcpy(&x, &u, 4);
    return double(x);
  };
  std::vector<double> v;
  if (f32_before < 0) {
    for (uint32_t u : bits) v.push_back(f32_of(u));
    return v;
  }
  for (int64_t i = 0; i < f32_before; ++i) v.push_back(f32_of(bits[std::size_t(i)]));
  const auto* halves = reinterpret_cast<const uint16_t*>(bits.data() + (f32_before + 63) / 64 * 64);
  for (int64_t i = 0; i < hidden_values; ++i) v.push_back(device_math::bf16_value(halves[i]));
  return v;
}

// The batch's ids on the device, viewed as the cuda device's upload_batch views them.
struct DeviceIds {
  cuda::DeviceBuffer<int32_t> tokens, targets, positions;
  BatchViews views;
  explicit DeviceIds(const Batch& b) : tokens(to_device(b.tokens)), targets(to_device(b.targets)), positions(to_device(b.positions)) {
    const int64_t n = b.positions_total();
    views.rows = b.rows;
    views.seq_len = b.seq_len;
    views.host = &b;
    views.device = DeviceType::cuda;
    views.tokens = flat_view(tokens.data(), DType::i32, n, DeviceType::cuda);
    views.targets = flat_view(targets.data(), DType::i32, n, DeviceType::cuda);
    views.positions = flat_view(positions.data(), DType::i32, n, DeviceType::cuda);
  }
};

// One row of `rows` positions: tokens and targets in [0, vocab), positions in [0, max_pos).
Batch make_batch(int64_t rows, int32_t vocab, int32_t max_pos, std::mt19937_64& rng) {
  Batch b;
  b.reset(1, int32_t(rows));
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1), pos(0, max_pos - 1);
  for (int64_t r = 0; r < rows; ++r) {
    b.tokens[std::size_t(r)] = tok(rng);
    b.targets[std::size_t(r)] = tok(rng);
    b.positions[std::size_t(r)] = pos(rng);
    b.segment_ids[std::size_t(r)] = 1;
  }
  return b;
}

std::vector<float> randn(std::size_t n, std::mt19937_64& rng, double mean = 0.0, double stddev = 1.0) {
  std::normal_distribution<double> normal(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = float(normal(rng));
  return v;
}

// Both twins declare the same table (the contract's parameter layout); random values for it:
// matrices N(0, gain^2 / fan_in) (fan_in = the row length), so every product stays of order one;
// vectors their initial value (norm weights 1, biases 0) plus N(0, 0.3^2).
std::vector<float> random_params(const LayerBase& cpu, const LayerBase& gpu, const LayerSpec& spec, std::mt19937_64& rng,
                                 double gain = 1.0) {
  ParamTable want, got;
  cpu.declare_params(spec, "l", want);
  gpu.declare_params(spec, "l", got);
  REQUIRE(got.total == want.total);
  REQUIRE(got.slices.size() == want.slices.size());
  std::vector<float> p(std::size_t(want.total));
  for (std::size_t s = 0; s < want.slices.size(); ++s) {
    const ParamSlice& w = want.slices[s];
    CHECK(got.slices[s].name == w.name);
    CHECK(got.slices[s].offset == w.offset);
    CHECK(got.slices[s].shape == w.shape);
    std::normal_distribution<double> normal(0.0, 1.0);
    const double stddev = w.shape.size() == 2 ? gain / std::sqrt(double(w.shape[1])) : 0.3;
    const double mean = w.shape.size() == 2 ? 0.0 : w.init_value;
    for (int64_t i = 0; i < w.numel(); ++i) p[std::size_t(w.offset + i)] = float(mean + stddev * normal(rng));
  }
  return p;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// --- the Layer cases ----------------------------------------------------------------------------------

struct Problem {
  std::string layer;  // the registered name
  std::string label;  // in messages
  LayerSpec spec;
  int64_t rows = 1, heads = 1;
  int64_t x_width = 0, y_width = 0;  // values per row of x and y (x_width 0: no input, the embedding)
  Batch batch;
  bool residual = false, residual_in_y = false;
  bool in_place = false;  // y is x's buffer and d_x is d_y's (learned positions, rope)
  double dropout = 0.0;
  uint64_t key = 0;
  GradMode input_grad = GradMode::overwrite;
  bool qk = false;  // a norm as the qk-norm: its x (q or k) is held in bf16 too
  Params own;       // the layer's own keys (rope's theta)
  int64_t K = 1;    // tolerance: the reductions' lengths, added
  int stages = 0;   // tolerance: chained reduced-precision products (0: the layer has none)
  int64_t nx() const { return rows * x_width; }
  int64_t ny() const { return rows * y_width; }
};

// The float32 values both devices start from.
struct Values {
  std::vector<float> x, residual, params, d_y;
  std::vector<float> d_x;    // d_x before backward: NaN (overwrite) or random (accumulate)
  std::vector<float> grads;  // parameter gradients before backward: random
};

struct Results {
  std::vector<double> y, saved, d_x, grads;
};

Values random_values(const Problem& p, const Layer& cpu, const Layer& gpu, std::mt19937_64& rng, double x_mean) {
  Values v;
  v.params = random_params(cpu, gpu, p.spec, rng);
  v.x = randn(std::size_t(p.nx()), rng, x_mean);
  if (p.residual) v.residual = randn(std::size_t(p.ny()), rng);
  v.d_y = randn(std::size_t(p.ny()), rng);
  v.d_x = p.input_grad == GradMode::accumulate ? randn(std::size_t(p.nx()), rng)
                                               : std::vector<float>(std::size_t(p.nx()), std::numeric_limits<float>::quiet_NaN());
  v.grads = randn(v.params.size(), rng);
  return v;
}

LayerCall base_call(const Problem& p, const BatchViews& views) {
  LayerCall call;
  call.spec = &p.spec;
  call.batch = &views;
  call.rows = p.rows;
  call.heads = p.heads;
  call.dropout = p.dropout;
  call.dropout_key = p.key;
  return call;
}

// The CPU twin in float64 on the float32 values; its scratch and outputs start as NaN too.
Results run_cpu(Layer& layer, const Problem& p, const Values& v) {
  const BatchViews views = host_batch_views(p.batch);
  std::vector<double> x = widen(v.x), res = widen(v.residual), params = widen(v.params), dy = widen(v.d_y);
  std::vector<double> y(std::size_t(p.ny()), kNaN);
  if (p.in_place) y = x;
  if (p.residual_in_y) y = res;
  std::vector<double> saved(std::size_t(layer.activation_elements(p.spec, p.rows)), kNaN);
  std::vector<double> scratch(std::size_t(layer.scratch_elements(p.spec, p.rows)), kNaN);
  LayerCall call = base_call(p, views);
  call.x = p.in_place ? host_view(y) : host_view(x);
  call.y = host_view(y);
  if (p.residual) call.residual = p.residual_in_y ? host_view(y) : host_view(res);
  call.params = host_view(params);
  call.saved = host_view(saved);
  call.scratch = host_view(scratch);
  layer.forward(call);
  Results r;
  r.y = y;
  r.saved = saved;

  std::fill(scratch.begin(), scratch.end(), kNaN);
  std::vector<double> dx = widen(v.d_x), grads = widen(v.grads);
  LayerCall back = base_call(p, views);
  back.x = host_view(x);
  back.params = host_view(params);
  back.saved = host_view(saved);
  back.scratch = host_view(scratch);
  back.grads = host_view(grads);
  back.d_y = host_view(dy);
  back.d_x = p.in_place ? host_view(dy) : host_view(dx);
  back.input_grad = p.input_grad;
  layer.backward(back);
  r.d_x = p.in_place ? dy : dx;
  r.grads = grads;
  return r;
}

// Which of a call's activations a `held` mode gives in bf16, as the model holds them: a norm's y
// (and the qk-norm's x: q and k), rope's x and y (q and k), a linear's x (and its y where it has no
// residual or dropout: q, k, v), an MLP's x.
struct Held {
  bool x = false, y = false;
};

Held held_of(const Layer& layer, const Problem& p, const Mode& mode) {
  if (!mode.held) return {};
  switch (layer.role()) {
    case LayerRole::norm: return {p.qk, true};
    case LayerRole::position: return {true, true};
    case LayerRole::linear: return {true, !p.residual && p.dropout == 0.0};
    default: return {true, false};
  }
}

// The CUDA layer on the suite's stream: every output and the scratch poisoned before each call
// (a bf16 one too: all bits set is a bf16 NaN). Activations held in bf16 (held_of) are the bf16
// rounding of the values; in place, y is x's bf16 buffer.
Results run_gpu(Layer& layer, const Problem& p, const Values& v, const Mode& mode) {
  const DeviceIds ids(p.batch);
  const Held held = held_of(layer, p, mode);
  const bool held_x = held.x, held_y = held.y && !p.in_place;
  DeviceFloats x = to_device(v.x), res = to_device(v.residual), params = to_device(v.params), dy = to_device(v.d_y);
  DeviceFloats y = p.in_place ? to_device(v.x) : p.residual_in_y ? to_device(v.residual) : poisoned(held_y ? 0 : p.ny());
  cuda::DeviceBuffer<uint16_t> x16 = held_x ? bf16_copy(v.x) : cuda::DeviceBuffer<uint16_t>{};
  cuda::DeviceBuffer<uint16_t> y16(held_y ? std::size_t(p.ny()) : 0);
  if (held_y) ABLATE_CUDA_CHECK(cudaMemsetAsync(y16.data(), 0xFF, y16.size() * 2, suite().stream));
  const int64_t hidden = p.rows * p.spec.out;
  DeviceFloats saved = poisoned(layer.activation_elements(p.spec, p.rows));
  DeviceFloats scratch = poisoned(layer.scratch_elements(p.spec, p.rows));
  cuda::DeviceBuffer<uint16_t> copy = mode.bf16_copy ? bf16_copy(v.params) : cuda::DeviceBuffer<uint16_t>{};
  LayerCall call = base_call(p, ids.views);
  call.stream = ablate::Stream(suite().stream);
  call.x = held_x ? bf16_view(x16) : p.in_place ? device_view(y) : device_view(x);
  call.y = held_y ? bf16_view(y16) : held.y ? bf16_view(x16) : device_view(y);
  if (p.residual) call.residual = p.residual_in_y ? device_view(y) : device_view(res);
  call.params = device_view(params);
  if (copy.size() > 0) call.params_bf16 = bf16_view(copy);
  call.saved = device_view(saved);
  call.scratch = device_view(scratch);
  layer.forward(call);
  Results r;
  r.y = held_y ? from_device_bf16(y16) : held.y ? from_device_bf16(x16) : from_device(y);
  r.saved = saved_as_cpu(bits_from_device(saved), f32_saved_before_bf16(p.layer, mode, hidden), bf16_saved_values(p.layer, hidden));

  poison(scratch);
  DeviceFloats dx = to_device(v.d_x), grads = to_device(v.grads);  // d_x: NaN unless accumulating
  LayerCall back = call;
  back.residual = {};
  back.x = held_x ? bf16_view(x16) : device_view(x);
  back.y = {};
  back.grads = device_view(grads);
  back.d_y = device_view(dy);
  back.d_x = p.in_place ? device_view(dy) : device_view(dx);
  back.input_grad = p.input_grad;
  layer.backward(back);
  r.d_x = from_device(p.in_place ? dy : dx);
  r.grads = from_device(grads);
  return r;
}

// One problem: the CPU reference once, then the CUDA layer in every mode against it.
void run_problem(const Problem& p, std::mt19937_64& rng, Margins& margins, double x_mean = 0.0) {
  INFO(p.label);
  Layer& cpu = suite().layer<Layer>(p.layer, "cpu", "fp32", p.own);
  Layer& first = suite().layer<Layer>(p.layer, "cuda", kModes[0].dtype, p.own);
  const Values v = random_values(p, cpu, first, rng, x_mean);
  const Results want = run_cpu(cpu, p, v);
  REQUIRE(all_finite(want.y));
  REQUIRE(all_finite(want.saved));
  REQUIRE(all_finite(want.d_x));
  REQUIRE(all_finite(want.grads));
  const std::vector<double> grads0 = widen(v.grads);
  const std::vector<double> dx0 = p.input_grad == GradMode::accumulate && !p.in_place ? widen(v.d_x) : std::vector<double>{};
  Results before;  // the results of the mode before, which a `held` mode must equal bit for bit
  for (const Mode& mode : kModes) {
    INFO("run.dtype " << std::string(mode.name));
    Layer& gpu = suite().layer<Layer>(p.layer, "cuda", mode.dtype, p.own);
    if (mode.held && !gpu.bf16_product_inputs() && !gpu.bf16_attention_inputs()) continue;
    // The same saved values on both devices (the contract: a recomputed forward means the same on
    // either), but for the MLPs' hidden activation, which bf16 products keep in bf16.
    REQUIRE(gpu.activation_elements(p.spec, p.rows) ==
            saved_elements(p.layer, mode, cpu.activation_elements(p.spec, p.rows), p.rows * p.spec.out));
    const Results got = run_gpu(gpu, p, v, mode);
    const Held held = held_of(gpu, p, mode);
    // An input held in bf16 that a product reads is what the product's own copy of it was: the
    // same bits out. One that elementwise arithmetic reads (rope's and the qk-norm's x: q and k)
    // is rounded where it was not: bf16's rounding on top, and for the qk-norm on its backward too.
    const bool rounded_input = held.x && (gpu.role() == LayerRole::norm || gpu.role() == LayerRole::position);
    if (mode.held) {
      // A y held in bf16 is the rounding of the f32 y; the rest is unchanged.
      std::vector<double> rounded_y = before.y;
      if (held.y) {
        for (double& e : rounded_y) e = device_math::bf16_value(device_math::bf16_bits(float(e)));
      }
      if (!rounded_input) {
        CHECK_MESSAGE(same_bits(got.y, rounded_y), "y differs from the run with f32 activations");
        CHECK_MESSAGE(same_bits(got.saved, before.saved), "saved values differ from the run with f32 activations");
      }
      if (!rounded_input || gpu.role() == LayerRole::position) {  // rope's backward reads gradients only
        CHECK_MESSAGE(same_bits(got.d_x, before.d_x), "d_x differs from the run with f32 activations");
        CHECK_MESSAGE(same_bits(got.grads, before.grads), "parameter gradients differ from the run with f32 activations");
      }
    }
    before = got;
    const Tolerance tol = tolerance(mode.precision, p.K, p.stages);
    // A y held in bf16 carries bf16's rounding (half a unit in the 8th bit) on top; a rounded input
    // another, through the arithmetic after it (one stage more).
    const Tolerance held_tol = tolerance(Precision::bf16, p.K, std::max(p.stages, 1) + (rounded_input ? 1 : 0));
    const bool norm_backward_rounded = rounded_input && gpu.role() == LayerRole::norm;
    margins.count(mode.name);
    compare("y", got.y, want.y, {}, held.y || rounded_input ? held_tol : tol, margins, mode.name, p.label);
    compare("saved", got.saved, want.saved, {}, norm_backward_rounded ? held_tol : tol, margins, mode.name, p.label);
    if (p.x_width > 0) {
      compare("d_x", got.d_x, want.d_x, dx0, norm_backward_rounded ? held_tol : tol, margins, mode.name, p.label);
    }
    compare("grads", got.grads, want.grads, grads0, norm_backward_rounded ? held_tol : tol, margins, mode.name, p.label);
  }
}

const char* grad_name(GradMode m) { return m == GradMode::accumulate ? "accumulate" : "write"; }

// The three ways a position layer is called (0 d_x written, 1 accumulated, 2 in place: y is x and
// d_x is d_y); returns the label's words for it.
std::string set_variant(Problem& p, int variant) {
  p.in_place = variant == 2;
  p.input_grad = variant == 1 ? GradMode::accumulate : GradMode::overwrite;
  return p.in_place ? " in place" : std::string(" ") + grad_name(p.input_grad);
}

constexpr int64_t kRows[] = {1, 7, 257};
// The layers that sum over rows in chunks of 256 on the GPU (the norms' parameter gradients, the
// lookups' scatter-add) also run at 1100 rows: five chunks, and with few distinct ids, runs of one
// id that cross several chunk edges.
constexpr int64_t kLongRows = 1100;

// --- the classifier ---------------------------------------------------------------------------------

struct ClassifierProblem {
  std::string label;
  LayerSpec spec;
  int64_t rows = 1;
  Batch batch;
  GradMode input_grad = GradMode::overwrite;
  bool with_grad = true;  // d_x set: the gradients in the same pass
  bool logits = false;    // the optional (rows, out) logits output
  double scale = 1.0;     // grad_scale
  Params own;             // [model.cross_entropy] (chunk_rows), on both devices
};

struct ClassifierResults {
  std::vector<double> losses, logits, d_x, grads;
};

struct ClassifierValues {
  std::vector<float> x, W, d_x, grads;
};

ClassifierResults run_classifier_cpu(LossLayer& layer, const ClassifierProblem& p, const ClassifierValues& v) {
  const BatchViews views = host_batch_views(p.batch);
  std::vector<double> x = widen(v.x), W = widen(v.W), d_x = widen(v.d_x), grads = widen(v.grads);
  std::vector<double> losses(std::size_t(p.rows), kNaN), scratch(std::size_t(layer.scratch_elements(p.spec, p.rows)), kNaN);
  std::vector<double> logits(p.logits ? std::size_t(p.rows * p.spec.out) : 0, kNaN);
  LayerCall call;
  call.spec = &p.spec;
  call.batch = &views;
  call.rows = p.rows;
  call.x = host_view(x);
  call.params = host_view(W);
  call.scratch = host_view(scratch);
  call.losses = host_view(losses);
  call.logits = host_view(logits);
  call.grad_scale = p.scale;
  if (p.with_grad) {
    call.d_x = host_view(d_x);
    call.grads = host_view(grads);
    call.input_grad = p.input_grad;
  }
  layer.loss(call);
  return {losses, logits, d_x, grads};
}

ClassifierResults run_classifier_gpu(LossLayer& layer, const ClassifierProblem& p, const ClassifierValues& v, const Mode& mode) {
  const DeviceIds ids(p.batch);
  DeviceFloats x = to_device(v.x), W = to_device(v.W), d_x = to_device(v.d_x), grads = to_device(v.grads);
  DeviceFloats losses = poisoned(p.rows), scratch = poisoned(layer.scratch_elements(p.spec, p.rows));
  DeviceFloats logits = poisoned(p.logits ? p.rows * p.spec.out : 0);
  cuda::DeviceBuffer<uint16_t> copy = mode.bf16_copy ? bf16_copy(v.W) : cuda::DeviceBuffer<uint16_t>{};
  cuda::DeviceBuffer<uint16_t> x16 = mode.held ? bf16_copy(v.x) : cuda::DeviceBuffer<uint16_t>{};
  LayerCall call;
  call.spec = &p.spec;
  call.batch = &ids.views;
  call.rows = p.rows;
  call.stream = ablate::Stream(suite().stream);
  call.x = mode.held ? bf16_view(x16) : device_view(x);
  call.params = device_view(W);
  if (copy.size() > 0) call.params_bf16 = flat_view(copy.data(), DType::bf16, int64_t(copy.size()), DeviceType::cuda);
  call.scratch = device_view(scratch);
  call.losses = device_view(losses);
  call.logits = device_view(logits);
  call.grad_scale = p.scale;
  if (p.with_grad) {
    call.d_x = device_view(d_x);
    call.grads = device_view(grads);
    call.input_grad = p.input_grad;
  }
  layer.loss(call);
  return {from_device(losses), from_device(logits), from_device(d_x), from_device(grads)};
}

// Rows [real_out, out) of the weight gradient: the padded vocabulary, which never enters the
// softmax, so its gradient is exactly the values it started from.
void check_padded_rows_untouched(const char* device, const ClassifierProblem& p, const std::vector<double>& grads,
                                 const std::vector<float>& before) {
  const int64_t in = p.spec.in;
  int64_t changed = 0;
  for (int64_t i = p.spec.real_out * in; i < p.spec.out * in; ++i)
    changed += grads[std::size_t(i)] != double(before[std::size_t(i)]) ? 1 : 0;
  CHECK_MESSAGE(changed == 0, std::string(device) << ": " << changed << " gradient values of padded vocabulary rows changed");
}

void run_classifier(const ClassifierProblem& p, std::mt19937_64& rng, Margins& margins) {
  INFO(p.label);
  LossLayer& cpu = suite().layer<LossLayer>("cross_entropy", "cpu", "fp32", p.own);
  LossLayer& first = suite().layer<LossLayer>("cross_entropy", "cuda", kModes[0].dtype, p.own);
  ClassifierValues v;
  // Weights N(0, 4 / in): logits of rms 2, a softmax with a few dominant columns; the padded rows
  // are random too, so a padded column that entered the softmax would show.
  v.W = random_params(cpu, first, p.spec, rng, 2.0);
  v.x = randn(std::size_t(p.rows * p.spec.in), rng);
  // The gradients accumulate onto values of the size of what the call adds (d_x: grad_scale times
  // order one; the weight gradient: grad_scale times up to sqrt(rows) such terms), so its error is
  // not lost under the rounding of the final add.
  v.d_x = p.with_grad && p.input_grad == GradMode::accumulate
              ? randn(v.x.size(), rng, 0.0, p.scale)
              : std::vector<float>(v.x.size(), std::numeric_limits<float>::quiet_NaN());
  v.grads = randn(v.W.size(), rng, 0.0, p.scale * std::sqrt(double(p.rows)));
  const ClassifierResults want = run_classifier_cpu(cpu, p, v);
  REQUIRE(all_finite(want.losses));
  REQUIRE(all_finite(want.logits));
  if (p.with_grad) {
    REQUIRE(all_finite(want.d_x));
    REQUIRE(all_finite(want.grads));
    check_padded_rows_untouched("cpu", p, want.grads, v.grads);
  }
  const std::vector<double> grads0 = widen(v.grads);
  const std::vector<double> dx0 = p.input_grad == GradMode::accumulate ? widen(v.d_x) : std::vector<double>{};
  const int64_t K = p.rows + p.spec.in + p.spec.out;
  ClassifierResults before;  // of the mode before, which a `held` mode must equal bit for bit
  for (const Mode& mode : kModes) {
    INFO("run.dtype " << std::string(mode.name));
    LossLayer& gpu = suite().layer<LossLayer>("cross_entropy", "cuda", mode.dtype, p.own);
    if (mode.held && !gpu.bf16_product_inputs()) continue;
    const ClassifierResults got = run_classifier_gpu(gpu, p, v, mode);
    if (mode.held) {  // x held in bf16 is what the products' own copy of it was: the same bits out
      CHECK_MESSAGE(same_bits(got.losses, before.losses), "losses differ from the run with f32 x");
      CHECK_MESSAGE(same_bits(got.logits, before.logits), "logits differ from the run with f32 x");
      CHECK_MESSAGE(same_bits(got.d_x, before.d_x), "d_x differs from the run with f32 x");
      CHECK_MESSAGE(same_bits(got.grads, before.grads), "the weight gradient differs from the run with f32 x");
    }
    before = got;
    margins.count(mode.name);
    // Losses and logits come from one product (1 stage); d_x and the weight gradient from the
    // softmax of it times W or x (2). Under bf16 products, when the logits are not asked for, the
    // product writes them in bf16 (cross_entropy_cuda.cpp): their rounding is one stage more for all three.
    const int more = mode.precision == Precision::bf16 && !p.logits ? 1 : 0;
    const Tolerance one = tolerance(mode.precision, K, 1 + more), two = tolerance(mode.precision, K, 2 + more);
    compare("losses", got.losses, want.losses, {}, one, margins, mode.name, p.label);
    for (int64_t r = 0; r < p.rows; ++r) {
      if (p.batch.targets[std::size_t(r)] == -1) CHECK_MESSAGE(got.losses[std::size_t(r)] == 0.0, "row " << r << " has target -1");
    }
    if (p.logits) compare("logits", got.logits, want.logits, {}, one, margins, mode.name, p.label);
    if (p.with_grad) {
      compare("d_x", got.d_x, want.d_x, dx0, two, margins, mode.name, p.label);
      compare("grads", got.grads, want.grads, grads0, two, margins, mode.name, p.label);
      check_padded_rows_untouched("cuda", p, got.grads, v.grads);
    }
  }
}

}  // namespace

// --- the cases -----------------------------------------------------------------------------------------

TEST_CASE("the suite covers every layer cuda_layers registers, each with a CPU twin") {
  const std::set<std::string> covered = {"embedding", "learned",  "rope",       "layernorm",     "rmsnorm",
                                         "linear",    "gelu_mlp", "swiglu_mlp", "cross_entropy", "lora"};
  std::set<std::string> registered;
  for (const ComponentInfo* info : suite().registry.list(Kind::layer)) {
    if (std::filesystem::path(info->library).filename().string().find("cuda_layers") == std::string::npos) continue;
    registered.insert(info->name);
    CHECK_MESSAGE(suite().registry.find(Kind::layer, info->name, "cpu") != nullptr, info->name << " has no CPU twin");
  }
  CHECK(registered == covered);
}

TEST_CASE("embedding: lookup and scatter-add, dropout off and on, padded vocabulary") {
  Margins margins("embedding");
  std::mt19937_64 rng(101);
  // (rows, distinct tokens): tokens below 127 of a vocabulary padded to 131, so the padded rows'
  // gradients must stay as they were; at 1100 rows also 3 tokens and a single one.
  const std::pair<int64_t, int32_t> shapes[] = {{1, 127}, {7, 127}, {257, 127}, {kLongRows, 127}, {kLongRows, 3}, {kLongRows, 1}};
  for (const auto& [rows, tokens] : shapes) {
    for (int64_t in : {37, 100}) {
      for (double dropout : {0.0, 0.1}) {
        Problem p;
        p.layer = "embedding";
        p.spec.in = in;
        p.spec.out = 131;
        p.rows = rows;
        p.y_width = in;
        p.batch = make_batch(rows, tokens, 1, rng);
        p.dropout = dropout;
        p.key = 0xD7090u + uint64_t(rows);
        p.K = rows;  // a table row's gradient sums at most `rows` rows
        p.label = "rows " + std::to_string(rows) + " tokens " + std::to_string(tokens) + " in " + std::to_string(in) +
                  (dropout > 0 ? " dropout" : "");
        run_problem(p, rng, margins);
      }
    }
  }
}

TEST_CASE("learned positions: added to the stream, d_x passed through, in place or not") {
  Margins margins("learned");
  std::mt19937_64 rng(102);
  // (rows, distinct positions) of a 50-row table: positions repeat and their gradients add.
  const std::pair<int64_t, int32_t> shapes[] = {{1, 50}, {7, 50}, {257, 50}, {kLongRows, 50}, {kLongRows, 3}, {kLongRows, 1}};
  for (const auto& [rows, positions] : shapes) {
    for (int64_t in : {37, 61, 100}) {
      for (int variant = 0; variant < 3; ++variant) {  // write, accumulate, in place
        Problem p;
        p.layer = "learned";
        p.spec.in = in;
        p.spec.max_positions = 50;
        p.rows = rows;
        p.x_width = p.y_width = in;
        p.batch = make_batch(rows, 1, positions, rng);
        p.K = rows;
        p.label = "rows " + std::to_string(rows) + " positions " + std::to_string(positions) + " in " + std::to_string(in) +
                  set_variant(p, variant);
        run_problem(p, rng, margins);
      }
    }
  }
}

TEST_CASE("rope: rotate-half on (rows, heads, head_dim), inverse in backward, in place or not") {
  Margins margins("rope");
  std::mt19937_64 rng(103);
  for (int64_t rows : kRows) {
    for (int64_t head_dim : {22, 38, 62}) {
      for (int64_t heads : {1, 3}) {
        for (int variant = 0; variant < 3; ++variant) {  // write, accumulate, in place
          Problem p;
          p.layer = "rope";
          p.spec.in = head_dim;
          p.own = Params("model.rope", {{"theta", Value{head_dim == 38 ? 500000.0 : 10000.0}}});
          p.rows = rows;
          p.heads = heads;
          p.x_width = p.y_width = heads * head_dim;
          p.batch = make_batch(rows, 1, 4096, rng);
          p.K = 2;  // a rotated pair: two products and a sum
          p.label = "rows " + std::to_string(rows) + " heads " + std::to_string(heads) + " head_dim " + std::to_string(head_dim) +
                    set_variant(p, variant);
          run_problem(p, rng, margins);
        }
      }
    }
  }
}

TEST_CASE("layernorm: with and without bias, d_x written and accumulated") {
  Margins margins("layernorm");
  std::mt19937_64 rng(104);
  for (int64_t rows : {kRows[0], kRows[1], kRows[2], kLongRows}) {
    for (int64_t in : {37, 61, 100}) {
      for (bool bias : {true, false}) {
        for (GradMode mode : {GradMode::overwrite, GradMode::accumulate}) {
          Problem p;
          p.layer = "layernorm";
          p.spec.in = in;
          p.spec.bias = bias;
          p.rows = rows;
          p.x_width = p.y_width = in;
          p.batch = make_batch(rows, 1, 1, rng);
          p.input_grad = mode;
          p.K = rows + in;  // row statistics over `in`, parameter gradients over the rows
          p.label = "rows " + std::to_string(rows) + " in " + std::to_string(in) + (bias ? " bias " : " no bias ") + grad_name(mode);
          run_problem(p, rng, margins, 0.5);  // a mean away from zero, as a residual stream has
        }
      }
    }
  }
}

TEST_CASE("rmsnorm, and rmsnorm as the qk-norm (rows * heads rows of head_dim)") {
  Margins margins("rmsnorm"), qk("rmsnorm as qk-norm");
  std::mt19937_64 rng(105);
  for (int64_t rows : {kRows[0], kRows[1], kRows[2], kLongRows}) {
    for (GradMode mode : {GradMode::overwrite, GradMode::accumulate}) {
      for (int64_t in : {37, 61, 100}) {
        Problem p;
        p.layer = "rmsnorm";
        p.spec.in = in;
        p.spec.bias = false;
        p.rows = rows;
        p.x_width = p.y_width = in;
        p.batch = make_batch(rows, 1, 1, rng);
        p.input_grad = mode;
        p.K = rows + in;
        p.label = "rows " + std::to_string(rows) + " in " + std::to_string(in) + " " + grad_name(mode);
        run_problem(p, rng, margins, 0.5);
      }
      // The qk-norm: one rmsnorm of head_dim over every head of every position (B*T*heads rows),
      // head_dim under a warp's 32 lanes and over it.
      for (int64_t head_dim : {22, 38}) {
        const int64_t heads = 3;
        Problem p;
        p.layer = "rmsnorm";
        p.spec.in = head_dim;
        p.spec.bias = false;
        p.rows = rows * heads;
        p.x_width = p.y_width = head_dim;
        p.batch = make_batch(p.rows, 1, 1, rng);
        p.input_grad = mode;
        p.K = p.rows + head_dim;
        p.qk = true;
        p.label = "positions " + std::to_string(rows) + " heads 3 head_dim " + std::to_string(head_dim) + " " + grad_name(mode);
        run_problem(p, rng, qk);
      }
    }
  }
}

namespace {

// linear, gelu_mlp and swiglu_mlp over the same grid: rows, width pairs, bias, residual (none,
// separate, in y's buffer), dropout 0 and 0.1, d_x written and accumulated.
void run_dense_grid(const std::string& layer, const std::vector<std::pair<int64_t, int64_t>>& widths, int stages, uint64_t seed) {
  Margins margins(layer);
  std::mt19937_64 rng(seed);
  for (int64_t rows : kRows) {
    for (const auto& [in, out] : widths) {
      for (bool bias : {true, false}) {
        for (int residual : {0, 1, 2}) {  // none, separate, in y
          for (double dropout : {0.0, 0.1}) {
            for (GradMode mode : {GradMode::overwrite, GradMode::accumulate}) {
              Problem p;
              p.layer = layer;
              p.spec.in = in;
              p.spec.out = out;
              p.spec.bias = bias;
              p.rows = rows;
              p.x_width = in;
              p.y_width = layer == "linear" ? out : in;  // an mlp's `out` is its hidden width
              p.batch = make_batch(rows, 1, 1, rng);
              p.residual = residual > 0;
              p.residual_in_y = residual == 2;
              p.dropout = dropout;
              p.key = 0xDE05E000u + uint64_t(rows * 1000 + in);
              p.input_grad = mode;
              p.K = rows + in + out;
              p.stages = stages;
              p.label = "rows " + std::to_string(rows) + " in " + std::to_string(in) + " out " + std::to_string(out) +
                        (bias ? " bias" : " no bias") +
                        (residual == 0   ? ""
                         : residual == 1 ? " residual"
                                         : " residual in y") +
                        (dropout > 0 ? " dropout" : "") + " " + grad_name(mode);
              run_problem(p, rng, margins);
            }
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("linear: bias, residual, dropout, d_x written and accumulated") {
  // (in, out): 37 * 61 puts the bias off 16-byte alignment (its add a pass of its own), 100 * 37 on it
  // (cuBLASLt's bias epilogue).
  run_dense_grid("linear", {{37, 61}, {100, 37}}, 1, 106);
}

namespace {

// The linear layer's backward under bf16 products with the attention's gradients held in bf16: d_y
// in bf16 (q, k, v's gradients) and d_x written in bf16 (the attention output's). `dy_bf16`: d_y
// given as a bf16 buffer, else as f32; `dx_bf16` likewise for d_x. The x is held in bf16 and the
// weights' bf16 copy given, as the model calls it; d_x accumulates where input_grad says.
struct LinearGrads {
  std::vector<double> d_x, grads;
};
LinearGrads linear_backward_bf16(const Problem& p, const Values& v, bool dy_bf16, bool dx_bf16) {
  Layer& gpu = suite().layer<Layer>("linear", "cuda", "bf16");
  const DeviceIds ids(p.batch);
  cuda::DeviceBuffer<uint16_t> x16 = bf16_copy(v.x), copy = bf16_copy(v.params), dy16 = bf16_copy(v.d_y);
  cuda::DeviceBuffer<uint16_t> dx16(dx_bf16 ? std::size_t(p.nx()) : 0);
  if (dx_bf16) ABLATE_CUDA_CHECK(cudaMemsetAsync(dx16.data(), 0xFF, dx16.size() * 2, suite().stream));
  DeviceFloats params = to_device(v.params), dy = to_device(v.d_y), dx = to_device(v.d_x), grads = to_device(v.grads);
  DeviceFloats scratch = poisoned(gpu.scratch_elements(p.spec, p.rows));
  LayerCall call = base_call(p, ids.views);
  call.stream = ablate::Stream(suite().stream);
  call.x = bf16_view(x16);
  call.params = device_view(params);
  call.params_bf16 = bf16_view(copy);
  call.scratch = device_view(scratch);
  call.grads = device_view(grads);
  call.d_y = dy_bf16 ? bf16_view(dy16) : device_view(dy);
  call.d_x = dx_bf16 ? bf16_view(dx16) : device_view(dx);
  call.input_grad = p.input_grad;
  gpu.backward(call);
  return {dx_bf16 ? from_device_bf16(dx16) : from_device(dx), from_device(grads)};
}

}  // namespace

TEST_CASE("linear: the attention's gradients held in bf16, d_y read as it is and d_x written in bf16") {
  // A d_y held in bf16 is what the products' own bf16 copy of an f32 d_y was: given the same
  // (bf16-representable) values either way, d_x and the weight gradient are the same bits; the
  // bias gradient sums the same values, in fp32, perhaps in another order (cuBLASLt's epilogue or
  // a product with ones). A d_x written in bf16 is the f32 product's sums rounded once: within half
  // a bf16 unit of the f32 d_x, beside fp32's reordering of the K = out sums.
  std::mt19937_64 rng(2718);
  Layer& cpu = suite().layer<Layer>("linear", "cpu");
  Layer& gpu = suite().layer<Layer>("linear", "cuda", "bf16");
  REQUIRE(gpu.bf16_attention_grads());
  CHECK_FALSE(suite().layer<Layer>("linear", "cuda", "fp32").bf16_attention_grads());
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{64, 96}, {100, 37}}) {
    for (bool bias : {false, true}) {
      for (GradMode mode : {GradMode::overwrite, GradMode::accumulate}) {
        Problem p;
        p.layer = "linear";
        p.spec.in = in;
        p.spec.out = out;
        p.spec.bias = bias;
        p.rows = 45;
        p.x_width = in;
        p.y_width = out;
        p.batch = make_batch(p.rows, 1, 1, rng);
        p.input_grad = mode;
        INFO("in " << in << " out " << out << (bias ? " bias " : " no bias ") << grad_name(mode));
        Values v = random_values(p, cpu, gpu, rng, 0.0);
        for (float& e : v.d_y) e = device_math::bf16_value(device_math::bf16_bits(e));
        const LinearGrads f32 = linear_backward_bf16(p, v, false, false);
        const LinearGrads held_dy = linear_backward_bf16(p, v, true, false);
        CHECK(same_bits(held_dy.d_x, f32.d_x));
        const int64_t weights = in * out;
        const std::vector<double> w_f32(f32.grads.begin(), f32.grads.begin() + weights),
            w_held(held_dy.grads.begin(), held_dy.grads.begin() + weights);
        CHECK(same_bits(w_held, w_f32));
        for (int64_t j = weights; j < int64_t(f32.grads.size()); ++j) {  // the bias gradient: p.rows terms of order one
          CHECK(std::abs(held_dy.grads[std::size_t(j)] - f32.grads[std::size_t(j)]) <= 1e-5 * double(p.rows));
        }
        if (mode == GradMode::accumulate) continue;  // a bf16 d_x is written, never added to
        const LinearGrads held_dx = linear_backward_bf16(p, v, false, true);
        CHECK(same_bits(held_dx.grads, f32.grads));
        double scale = 0.0;
        for (double e : f32.d_x) scale = std::max(scale, std::abs(e));
        for (std::size_t i = 0; i < f32.d_x.size(); ++i) {
          CHECK(std::abs(held_dx.d_x[i] - f32.d_x[i]) <= 0x1p-8 * std::abs(f32.d_x[i]) + 1e-5 * scale);
        }
      }
    }
  }
  // What the model never asks: a bf16 d_x added to, a bf16 d_y with dropout.
  Problem p;
  p.layer = "linear";
  p.spec.in = 16;
  p.spec.out = 16;
  p.rows = 4;
  p.x_width = p.y_width = 16;
  p.batch = make_batch(p.rows, 1, 1, rng);
  p.input_grad = GradMode::accumulate;
  const Values v = random_values(p, cpu, gpu, rng, 0.0);
  CHECK_THROWS_AS(linear_backward_bf16(p, v, false, true), Error);
  p.input_grad = GradMode::overwrite;
  p.dropout = 0.1;
  CHECK_THROWS_AS(linear_backward_bf16(p, v, true, false), Error);
}

namespace {

// A counter the cuda_layers plugin exports (the library the registry loaded: under the emulated
// device its emulated/ build).
using Counter = int64_t (*)();
Counter plugin_counter(const char* symbol) {
  const char* emulate = std::getenv("ABLATE_EMULATE_CUDA");
  const std::string dir = std::string(ABLATE_PLUGIN_DIR) + (emulate != nullptr && std::string(emulate) == "1" ? "/emulated" : "");
  void* plugin = dlopen((dir + "/libablate_cuda_layers.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(plugin != nullptr);
  const auto counter = reinterpret_cast<Counter>(dlsym(plugin, symbol));
  REQUIRE(reinterpret_cast<void*>(counter) != nullptr);
  return counter;
}

// --- FP8 products ---------------------------------------------------------------------------------
//
// Under run.dtype = "fp8" and "fp8_e4m3" each product quantises its two operands per tensor with
// current scaling (gemm.hpp): scale = fp8_max / amax(operand) in float, q = fp8(v * scale) rounded
// to nearest even and saturated, and the product is sum q_a q_b times (1 / scale_a) (1 / scale_b).
// The reference does exactly that on the host (the rounding a search over the format's values,
// decoded from its definition, not cuda_fp8.h's conversion the kernels use) and sums in float64:
// what is left between the two is
// fp32 accumulation alone, so the f32 tolerance applies, not FP8's. Weights and activations are
// E4M3; the output gradient d_y is E5M2 under "fp8" (the hybrid recipe) and E4M3 under "fp8_e4m3".

// The value of an FP8 code, from the format's definition (sign, exponent field, mantissa).
double fp8_value(uint8_t c, bool e5m2) {
  const int man = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const int e = (c & 0x7F) >> man, m = c & ((1 << man) - 1);
  const double v = e == 0 ? std::ldexp(m, 1 - bias - man) : std::ldexp((1 << man) + m, e - bias - man);
  return (c & 0x80) != 0 ? -v : v;
}

// v rounded to the nearest value of the format by a search over its finite codes: ties to the even
// code, past the largest finite value that value (saturation).
double fp8_round(float v, bool e5m2) {
  double best = 0, best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 128; ++c) {
    if (e5m2 ? c >= 0x7C : c == 0x7F) continue;  // infinities and NaNs
    const double d = std::fabs(std::fabs(double(v)) - fp8_value(uint8_t(c), e5m2));
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best_d = d;
      best = fp8_value(uint8_t(c), e5m2);
    }
  }
  return std::copysign(best, double(v));
}

struct Quantised {
  std::vector<double> q;  // the FP8 values, unscaled
  float inv = 1.0f;       // 1 / scale
};

// `given` > 0: that scale (delayed scaling's), values past the format's range saturating; else the
// tensor's own (current scaling).
Quantised quantise(const std::vector<float>& v, std::size_t begin, std::size_t n, bool e5m2, float given = 0.0f) {
  float amax = 0.0f;
  for (std::size_t i = begin; i < begin + n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float scale = given > 0.0f ? given : amax > 0.0f ? (e5m2 ? 57344.0f : 448.0f) / amax : 1.0f;
  Quantised r;
  r.inv = 1.0f / scale;
  for (std::size_t i = begin; i < begin + n; ++i) {
    r.q.push_back(fp8_round(v[i] * scale, e5m2));
  }
  return r;
}

// The products of a dense layer's quantised operands as defined, in float64: y = s_xw qx qw^T
// (rows, out); d_x = s_dyw qdy qw (rows, in); grads (out, in) += s_dyx qdy^T qx. x (rows, in), W
// (out, in), dy (rows, out).
std::vector<double> fp8_forward(const Quantised& qx, const Quantised& qw, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  const double s = double(qx.inv * qw.inv);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double t = 0;
      for (int64_t i = 0; i < in; ++i) t += qx.q[std::size_t(r * in + i)] * qw.q[std::size_t(o * in + i)];
      y[std::size_t(r * out + o)] = s * t;
    }
  }
  return y;
}
std::vector<double> fp8_input_grad(const Quantised& qdy, const Quantised& qw, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> dx(static_cast<std::size_t>(rows * in));
  const double s = double(qdy.inv * qw.inv);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < in; ++i) {
      double t = 0;
      for (int64_t o = 0; o < out; ++o) t += qdy.q[std::size_t(r * out + o)] * qw.q[std::size_t(o * in + i)];
      dx[std::size_t(r * in + i)] = s * t;
    }
  }
  return dx;
}
void fp8_add_weight_grad(const Quantised& qdy, const Quantised& qx, int64_t rows, int64_t in, int64_t out,
                         std::vector<double>& grads) {
  const double s = double(qdy.inv * qx.inv);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double t = 0;
      for (int64_t r = 0; r < rows; ++r) t += qdy.q[std::size_t(r * out + o)] * qx.q[std::size_t(r * in + i)];
      grads[std::size_t(o * in + i)] += s * t;
    }
  }
}

struct Fp8Linear {
  std::vector<double> y, d_x, grads;
};

// The linear layer's forward and backward under `dtype`, x given in f32 or held in bf16 (as the
// model holds a norm's output), the weights' bf16 copy given as the model gives it.
Fp8Linear linear_fp8(const Problem& p, const Values& v, const char* dtype, bool x_held, Layer* layer = nullptr,
                     DeviceFloats* state = nullptr) {
  Layer& gpu = layer != nullptr ? *layer : suite().layer<Layer>("linear", "cuda", dtype);
  const DeviceIds ids(p.batch);
  cuda::DeviceBuffer<uint16_t> x16 = bf16_copy(v.x), copy = bf16_copy(v.params);
  DeviceFloats x = to_device(v.x), params = to_device(v.params), dy = to_device(v.d_y), grads = to_device(v.grads);
  DeviceFloats y = poisoned(p.ny()), dx = poisoned(p.nx()), scratch = poisoned(gpu.scratch_elements(p.spec, p.rows));
  LayerCall call = base_call(p, ids.views);
  call.stream = ablate::Stream(suite().stream);
  call.x = x_held ? bf16_view(x16) : device_view(x);
  call.y = device_view(y);
  call.params = device_view(params);
  call.params_bf16 = bf16_view(copy);
  call.scratch = device_view(scratch);
  if (state != nullptr) call.scaling_state = device_view(*state);
  gpu.forward(call);
  call.grads = device_view(grads);
  call.d_y = device_view(dy);
  call.d_x = device_view(dx);
  call.input_grad = GradMode::overwrite;
  gpu.backward(call);
  return {from_device(y), from_device(dx), from_device(grads)};
}

}  // namespace

TEST_CASE("linear under FP8 products: every product of per-tensor quantised operands as defined, E5M2 gradients under fp8") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  std::mt19937_64 rng(1618);
  Layer& cpu = suite().layer<Layer>("linear", "cpu");
  Margins margins("linear fp8");
  // (in, out, rows): K = in, out and rows padded to 16 (40 -> 48, 24 -> 32, 45 -> 48); 64 x 96 x 32
  // with nothing to pad.
  for (const auto& [in, out, rows] : {std::tuple<int64_t, int64_t, int64_t>{40, 24, 45}, {64, 96, 32}}) {
    for (const char* dtype : {"fp8", "fp8_e4m3"}) {
      for (const bool bias : {false, true}) {
        Layer& gpu = suite().layer<Layer>("linear", "cuda", dtype);
        CHECK(gpu.bf16_product_inputs());
        Problem p;
        p.layer = "linear";
        p.spec.in = in;
        p.spec.out = out;
        p.spec.bias = bias;
        p.rows = rows;
        p.x_width = in;
        p.y_width = out;
        p.batch = make_batch(p.rows, 1, 1, rng);
        const std::string label = std::string(dtype) + " in " + std::to_string(in) + " out " + std::to_string(out) + " rows " +
                                  std::to_string(rows) + (bias ? " bias" : " no bias");
        INFO(label);
        Values v = random_values(p, cpu, gpu, rng, 0.0);
        for (float& e : v.x) e = device_math::bf16_value(device_math::bf16_bits(e));  // the same values f32 or held
        const bool e5m2 = std::string(dtype) == "fp8";
        const Quantised qx = quantise(v.x, 0, v.x.size(), false), qw = quantise(v.params, 0, std::size_t(in * out), false);
        const Quantised qdy = quantise(v.d_y, 0, v.d_y.size(), e5m2);
        std::vector<double> y = fp8_forward(qx, qw, rows, in, out), dx = fp8_input_grad(qdy, qw, rows, in, out);
        std::vector<double> grads(v.grads.begin(), v.grads.end());
        fp8_add_weight_grad(qdy, qx, rows, in, out, grads);
        if (bias) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t o = 0; o < out; ++o) {
              y[std::size_t(r * out + o)] += double(v.params[std::size_t(in * out + o)]);
              grads[std::size_t(in * out + o)] += double(v.d_y[std::size_t(r * out + o)]);
            }
          }
        }
        const Counter in_pack = plugin_counter("ablate_cuda_layers_fp8_sums_in_pack");
        const Counter by_pass = plugin_counter("ablate_cuda_layers_fp8_sums_by_pass");
        const int64_t packed = in_pack(), passed = by_pass();
        const Fp8Linear f32 = linear_fp8(p, v, dtype, false);
        // db taken in the pass that quantises d_y for the input gradient's product, none by a pass.
        CHECK(in_pack() - packed == (bias ? 1 : 0));
        CHECK(by_pass() - passed == 0);
        const Fp8Linear held = linear_fp8(p, v, dtype, true);
        // fp32 accumulation over K = in, out or rows terms (the f32 tolerance), the bias added after.
        const Tolerance tol = tolerance(Precision::f32, in + out + rows, 0);
        margins.count(dtype);
        compare("y", f32.y, y, {}, tol, margins, dtype, label);
        compare("d_x", f32.d_x, dx, {}, tol, margins, dtype, label);
        compare("grads", f32.grads, grads, widen(v.grads), tol, margins, dtype, label);
        // x held in bf16 holds the same values: quantised to the same codes, the same bits out.
        CHECK(same_bits(held.y, f32.y));
        CHECK(same_bits(held.d_x, f32.d_x));
        CHECK(same_bits(held.grads, f32.grads));
        // Against bf16 products: FP8's rounding (2^-4 relative for E4M3, 2^-3 for E5M2) and no
        // more, in the mean: the relative rms difference of y stays below 2^-3.
        const Fp8Linear b16 = linear_fp8(p, v, "bf16", true);
        double num = 0, den = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
          num += (f32.y[i] - b16.y[i]) * (f32.y[i] - b16.y[i]);
          den += b16.y[i] * b16.y[i];
        }
        CHECK(std::sqrt(num / den) < 0x1p-3);
        CHECK(std::sqrt(num / den) > 0.0);  // FP8 did round: not a bf16 product under another name
      }
    }
  }
}

TEST_CASE("linear under FP8 delayed scaling: a fresh state scales as current scaling, then each operand by its amax history") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const int64_t history = 4;
  RunContext run;
  run.device = "cuda";
  run.dtype = "fp8";
  run.fp8_scaling = "delayed";
  run.fp8_amax_history = history;
  run.threads = 2;
  const Params common{"model", {}}, own{"model.linear", {}};
  auto delayed = suite().registry.create<Layer>(Kind::layer, "linear", {common, own, run});
  std::mt19937_64 rng(4242);
  Layer& cpu = suite().layer<Layer>("linear", "cpu");
  Problem p;
  p.layer = "linear";
  p.spec.in = 40;
  p.spec.out = 24;
  p.spec.bias = true;
  p.rows = 45;
  p.x_width = p.spec.in;
  p.y_width = p.spec.out;
  p.batch = make_batch(p.rows, 1, 1, rng);
  const int64_t slot = 8 + history;  // fp8_kernels.hpp's slot: 8 header values, then the history
  REQUIRE(delayed->scaling_state_elements(p.spec) == 3 * 2 * slot);
  CHECK(suite().layer<Layer>("linear", "cuda", "fp8").scaling_state_elements(p.spec) == 0);  // current scaling keeps none
  Values v = random_values(p, cpu, *delayed, rng, 0.0);
  for (float& e : v.x) e = device_math::bf16_value(device_math::bf16_bits(e));
  DeviceFloats state = to_device(std::vector<float>(std::size_t(3 * 2 * slot), 0.0f));
  // Step 1, fresh: the same bits as current scaling.
  const Fp8Linear first = linear_fp8(p, v, "fp8", true, delayed.get(), &state);
  const Fp8Linear current = linear_fp8(p, v, "fp8", true);
  CHECK(same_bits(first.y, current.y));
  CHECK(same_bits(first.d_x, current.d_x));
  CHECK(same_bits(first.grads, current.grads));
  // The step's end: each slot's scale is fp8_max over the amax its operand had.
  LayerCall end;
  end.spec = &p.spec;
  end.stream = ablate::Stream(suite().stream);
  end.scaling_state = device_view(state);
  delayed->end_step(end);
  const std::vector<double> st = from_device(state);
  const auto amax = [](const std::vector<float>& x, std::size_t n) {
    float a = 0.0f;
    for (std::size_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
    return a;
  };
  const float ax = amax(v.x, v.x.size()), aw = amax(v.params, std::size_t(p.spec.in * p.spec.out)), ady = amax(v.d_y, v.d_y.size());
  // (product, operand): 0 forward (x, W), 1 input gradient (dy in E5M2, W), 2 weight gradient (dy in E5M2, x).
  const float want_amax[6] = {ax, aw, ady, aw, ady, ax};
  const float want_max[6] = {448.0f, 448.0f, 57344.0f, 448.0f, 57344.0f, 448.0f};
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    const std::size_t at = std::size_t(i * slot);
    CHECK(st[at + 0] == 0.0);                                 // the step's amax pushed
    CHECK(st[at + 1] == double(want_max[i] / want_amax[i]));  // the scale
    CHECK(st[at + 3] == double(want_max[i]));                 // the format's largest value
    CHECK(st[at + 4] == 1.0);                                 // one update
    CHECK(st[at + 8] == double(want_amax[i]));                // in the history
  }
  // Step 2 with x twice as large and d_y half: scaled by step 1's amax, x's upper half saturates.
  Values v2 = v;
  for (float& e : v2.x) e *= 2.0f;
  for (float& e : v2.d_y) e *= 0.5f;
  const Fp8Linear second = linear_fp8(p, v2, "fp8", true, delayed.get(), &state);
  const int64_t in = p.spec.in, out = p.spec.out, rows = p.rows;
  const Quantised qx = quantise(v2.x, 0, v2.x.size(), false, 448.0f / ax);
  const Quantised qw = quantise(v2.params, 0, std::size_t(in * out), false, 448.0f / aw);
  const Quantised qdy = quantise(v2.d_y, 0, v2.d_y.size(), true, 57344.0f / ady);
  std::vector<double> y = fp8_forward(qx, qw, rows, in, out), dx = fp8_input_grad(qdy, qw, rows, in, out);
  std::vector<double> grads(v2.grads.begin(), v2.grads.end());
  fp8_add_weight_grad(qdy, qx, rows, in, out, grads);
  for (int64_t r = 0; r < rows; ++r) {  // the bias, and its gradient
    for (int64_t o = 0; o < out; ++o) {
      y[std::size_t(r * out + o)] += double(v2.params[std::size_t(in * out + o)]);
      grads[std::size_t(in * out + o)] += double(v2.d_y[std::size_t(r * out + o)]);
    }
  }
  Margins margins("linear fp8 delayed");
  const Tolerance tol = tolerance(Precision::f32, in + out + rows, 0);
  margins.count("fp8 delayed");
  compare("y", second.y, y, {}, tol, margins, "fp8 delayed", "step 2");
  compare("d_x", second.d_x, dx, {}, tol, margins, "fp8 delayed", "step 2");
  compare("grads", second.grads, grads, widen(v2.grads), tol, margins, "fp8 delayed", "step 2");
  // ...which is not what current scaling gives (x saturated), and the new amaxes are pending.
  CHECK_FALSE(same_bits(second.y, linear_fp8(p, v2, "fp8", true).y));
  const std::vector<double> st2 = from_device(state);
  CHECK(st2[0] == double(2.0f * ax));
  CHECK(st2[std::size_t(2 * slot)] == double(0.5f * ady));
  // The step's saturated values: counted per slot in the quantising pass, reported after end_step.
  const auto over = [](const std::vector<float>& x, std::size_t n, float scale, float limit) {
    int64_t c = 0;
    for (std::size_t i = 0; i < n; ++i) c += std::fabs(x[i] * scale) > limit ? 1 : 0;
    return c;
  };
  const int64_t sx = over(v2.x, v2.x.size(), 448.0f / ax, 448.0f), sw = over(v2.params, std::size_t(in * out), 448.0f / aw, 448.0f),
                sdy = over(v2.d_y, v2.d_y.size(), 57344.0f / ady, 57344.0f);
  REQUIRE(sx > 0);  // x doubled: its upper half clipped
  delayed->end_step(end);
  std::vector<float> host(std::size_t(3 * 2 * slot));
  const std::vector<double> st3 = from_device(state);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(st3[i]);
  const ScalingReport report = delayed->scaling_report(p.spec, host.data());
  CHECK(report.saturated == 2 * (sx + sw + sdy));  // x in products 0 and 2, W in 0 and 1, d_y in 1 and 2
  CHECK(report.worst == std::max({sx, sw, sdy}));
}

TEST_CASE("gelu_mlp: bias, residual, dropout, d_x written and accumulated") {
  // pre-activation, gelu, projection; backward through both products and gelu' of the first.
  // (in, hidden): hidden 100 and 37 take the unfused GELU passes; 96, a multiple of 8, cuBLASLt's
  // GELU_AUX_BIAS and DGELU_BGRAD epilogues (gemm_plan.cpp's fused_epilogue).
  run_dense_grid("gelu_mlp", {{37, 100}, {61, 37}, {45, 96}}, 3, 107);
}

TEST_CASE("swiglu_mlp: bias, residual, dropout, d_x written and accumulated") {
  // gate and up, silu(g) u, down; backward: dg and du from dh, u and g, then two more products.
  run_dense_grid("swiglu_mlp", {{37, 100}, {61, 37}, {45, 96}}, 4, 108);
}

TEST_CASE("lora: adds to y and to d_x, A and B gradients, dropout on its input") {
  // The adapter adds s u B^T to the projection's y (here y starts as a random "projection output")
  // and its part of the input gradient to d_x (which starts random: the projection's part);
  // rank 8 (the [adapter.lora] default), alpha 16, B random so that every product matters.
  Margins margins("lora");
  std::mt19937_64 rng(109);
  for (int64_t rows : kRows) {
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{37, 61}, {100, 37}}) {
      for (double dropout : {0.0, 0.1}) {
        Problem p;
        p.layer = "lora";
        p.spec.in = in;
        p.spec.out = out;
        p.rows = rows;
        p.x_width = in;
        p.y_width = out;
        p.batch = make_batch(rows, 1, 1, rng);
        p.residual = p.residual_in_y = true;  // y's own values, added to
        p.dropout = dropout;
        p.key = 0x10BA0000u + uint64_t(rows * 1000 + in);
        p.input_grad = GradMode::accumulate;
        p.K = rows + in + out + 8;
        p.stages = 2;
        p.label = "rows " + std::to_string(rows) + " in " + std::to_string(in) + " out " + std::to_string(out) +
                  (dropout > 0 ? " dropout" : "");
        run_problem(p, rng, margins);
      }
    }
  }
}

TEST_CASE("cross_entropy: losses and gradients, targets -1 ignored, padded vocabulary, chunked rows") {
  Margins margins("cross_entropy");
  std::mt19937_64 rng(109);
  for (int64_t rows : {1, 7, 257, 1100}) {
    for (int64_t in : {37, 100}) {
      for (const auto& [out, real_out] : {std::pair<int64_t, int64_t>{131, 127}, std::pair<int64_t, int64_t>{61, 61}}) {
        // write, accumulate (with the logits output), loss only (no gradients), every target -1
        for (int variant = 0; variant < 4; ++variant) {
          if (variant == 3 && rows > 7) continue;
          ClassifierProblem p;
          p.spec.in = in;
          p.spec.out = out;
          p.spec.real_out = real_out;
          p.rows = rows;
          p.batch = make_batch(rows, int32_t(real_out), 1, rng);
          std::bernoulli_distribution ignored(0.2);
          for (int64_t r = 0; r < rows; ++r) {
            if (variant == 3 || ignored(rng) || (rows > 1 && r == 1)) p.batch.targets[std::size_t(r)] = -1;
          }
          p.input_grad = variant == 1 ? GradMode::accumulate : GradMode::overwrite;
          p.with_grad = variant != 2;
          p.logits = variant == 1;
          const int64_t real = p.batch.real_targets();
          p.scale = real > 0 ? 1.0 / double(real) : 1.0;  // the mean over real targets, as the model scales
          static const char* const kVariant[] = {"write", "accumulate, logits", "loss only", "every target -1"};
          p.label = "rows " + std::to_string(rows) + " in " + std::to_string(in) + " vocab " + std::to_string(real_out) + "/" +
                    std::to_string(out) + " " + kVariant[variant];
          run_classifier(p, rng, margins);
        }
      }
    }
  }
}

// [model.cross_entropy] chunk_rows: the rows whose logits are held at once, on both devices. The
// same problems as above in chunks of 100 and 128 rows (three and two chunks at 257 rows, the last
// one shorter; eleven and nine at 1100): every chunk's losses, d_x and weight gradient added as in
// one, in every mode, the bf16 logits' chunks included (those are one chunk without the key, at
// these sizes). The scratch holds one chunk; by default the bf16 logits come in the fewest equal
// chunks of at most 1 GiB: 7 of 9,472 rows for GPT-2's 64 x 1024 batch, one for a small batch.
TEST_CASE("cross_entropy with [model.cross_entropy] chunk_rows: several chunks, the last shorter, as one; the default chunks") {
  Margins margins("cross_entropy chunks");
  std::mt19937_64 rng(113);
  for (int64_t chunk : {100, 128}) {
    const Params own("model.cross_entropy", {{"chunk_rows", Value{chunk}}});
    for (int64_t rows : {257, 1100}) {
      for (int variant = 0; variant < 2; ++variant) {
        ClassifierProblem p;
        p.spec.in = 37;
        p.spec.out = 131;
        p.spec.real_out = 127;
        p.rows = rows;
        p.own = own;
        p.batch = make_batch(rows, int32_t(p.spec.real_out), 1, rng);
        for (int64_t r = 0; r < rows; r += 5) p.batch.targets[std::size_t(r)] = -1;
        p.input_grad = variant == 1 ? GradMode::accumulate : GradMode::overwrite;
        p.logits = variant == 1;
        const int64_t real = p.batch.real_targets();
        p.scale = 1.0 / double(real);
        p.label =
            "chunk_rows " + std::to_string(chunk) + ", rows " + std::to_string(rows) + (variant == 1 ? ", accumulate, logits" : "");
        run_classifier(p, rng, margins);
      }
    }
    LayerSpec s;
    s.in = 37;
    s.out = 131;
    s.real_out = 127;
    CHECK(suite().layer<LossLayer>("cross_entropy", "cuda", "fp32", own).scratch_elements(s, 1100) == chunk * 131);
    CHECK(suite().layer<LossLayer>("cross_entropy", "cuda", "bf16", own).scratch_elements(s, 1100) == chunk * 131);
    CHECK(suite().layer<LossLayer>("cross_entropy", "cpu", "fp32", own).scratch_elements(s, 1100) == chunk * 131);
  }
  LayerSpec gpt2;
  gpt2.in = 768;
  gpt2.out = gpt2.real_out = 50304;
  LossLayer& b16 = suite().layer<LossLayer>("cross_entropy", "cuda", "bf16");
  CHECK(b16.scratch_elements(gpt2, 65536) == 9472 * 50304 / 2);  // 7 chunks: 6,593 MB of logits over 1 GiB
  CHECK(b16.scratch_elements(gpt2, 16384) == 8192 * 50304 / 2);  // 2 chunks
  CHECK(b16.scratch_elements(gpt2, 2000) == 1024 * 50304);       // one chunk of bf16 logits, under 1024 rows of f32's
  CHECK(suite().layer<LossLayer>("cross_entropy", "cuda", "fp32").scratch_elements(gpt2, 65536) == 1024 * 50304);
}

namespace {

// The FP8 classifier's call on the device with x held in bf16 (as the model holds it under bf16 and
// FP8 plans) and the weights' bf16 copy, returning besides the outputs the logit gradient dz the
// row kernel left in the scratch (bf16, in place of the logits: the whole batch when it is one
// chunk), the operand its two gradient products quantised.
struct Fp8ClassifierResults {
  ClassifierResults out;
  std::vector<double> dz;
};

// One FP8 classifier call site on the device: the weights, their bf16 copy and the weight gradient
// kept from call to call (as the model keeps its parameters), x (held in bf16), d_x, the losses and
// the scratch per call; `cache` null: no weight cache (each product quantises W itself).
struct Fp8ClassifierSite {
  DeviceFloats W, grads;
  cuda::DeviceBuffer<uint16_t> copy;
  explicit Fp8ClassifierSite(const ClassifierValues& v) : W(to_device(v.W)), grads(to_device(v.grads)), copy(bf16_copy(v.W)) {}
  // New values in the same buffers: the weights and their copy (an optimizer step), the gradient.
  void set(const std::vector<float>& w, const std::vector<float>& g) {
    const DeviceFloats f = to_device(w), gf = to_device(g);
    const cuda::DeviceBuffer<uint16_t> b = bf16_copy(w);
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(W.data(), f.data(), f.bytes(), cudaMemcpyDeviceToDevice, suite().stream));
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(copy.data(), b.data(), b.bytes(), cudaMemcpyDeviceToDevice, suite().stream));
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(grads.data(), gf.data(), gf.bytes(), cudaMemcpyDeviceToDevice, suite().stream));
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
  }
  // losses, d_x and the weight gradient after the call, and the logit gradient the row kernel left
  // in the scratch (the last chunk's).
  Fp8ClassifierResults call(LossLayer& layer, const ClassifierProblem& p, const std::vector<float>& x, DeviceFloats* cache,
                            bool unchanged) {
    const DeviceIds ids(p.batch);
    DeviceFloats d_x = poisoned(int64_t(x.size())), losses = poisoned(p.rows),
                 scratch = poisoned(layer.scratch_elements(p.spec, p.rows));
    cuda::DeviceBuffer<uint16_t> x16 = bf16_copy(x);
    LayerCall c;
    c.spec = &p.spec;
    c.batch = &ids.views;
    c.rows = p.rows;
    c.stream = ablate::Stream(suite().stream);
    c.x = bf16_view(x16);
    c.params = device_view(W);
    c.params_bf16 = bf16_view(copy);
    c.scratch = device_view(scratch);
    c.losses = device_view(losses);
    c.grad_scale = p.scale;
    c.d_x = device_view(d_x);
    c.grads = device_view(grads);
    c.input_grad = GradMode::overwrite;
    if (cache != nullptr) c.weight_cache = device_view(*cache);
    c.weights_unchanged = unchanged;
    layer.loss(c);
    std::vector<uint16_t> halves(std::size_t(std::min<int64_t>(p.rows, int64_t(scratch.size()) * 2 / p.spec.out) * p.spec.out));
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(halves.data(), scratch.data(), halves.size() * 2, cudaMemcpyDeviceToHost, suite().stream));
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
    std::vector<double> dz(halves.size());
    for (std::size_t i = 0; i < dz.size(); ++i) dz[i] = device_math::bf16_value(halves[i]);
    return {{from_device(losses), {}, from_device(d_x), from_device(grads)}, dz};
  }
};

Fp8ClassifierResults classifier_fp8(LossLayer& layer, const ClassifierProblem& p, const ClassifierValues& v) {
  Fp8ClassifierSite site(v);
  return site.call(layer, p, v.x, nullptr, false);
}

// The rms of a - b over the rms of b.
double relative_rms(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

}  // namespace

// [model.cross_entropy] fp8 under an FP8 run.dtype: the logits product of E4M3 x and W written in
// bf16, the softmax's gradient in place in bf16, then d_x = dz W and dW += dz^T x of dz quantised
// (E5M2 under "fp8", E4M3 under "fp8_e4m3"), each operand scaled by its own amax (current scaling).
// The reference quantises as defined (the search over the format's values above): the losses
// against the FP8 logits rounded to bf16 (bf16's tolerance: a logit whose fp32 sum rounds to the
// other bf16 neighbour than the float64 one), the device's dz against the softmax of those
// (bf16's two stages), and d_x and the weight gradient from the device's own dz exactly as defined
// (fp32 accumulation: f32's tolerance). The losses lie nearer the FP8 definition than the bf16
// classifier's by a factor of ten in rms (FP8 did quantise the logits' operands); fp8 = false
// under an FP8 run.dtype is the bf16 classifier bit for bit; fp8 = true under bf16 is refused.
TEST_CASE("cross_entropy under FP8 products ([model.cross_entropy] fp8): every product of per-tensor quantised operands as defined") {
  const Params on("model.cross_entropy", {{"fp8", Value{true}}}), off("model.cross_entropy", {{"fp8", Value{false}}});
  CHECK_THROWS_WITH_AS(suite().layer<LossLayer>("cross_entropy", "cuda", "bf16", on), doctest::Contains("model.cross_entropy.fp8"),
                       ablate::Error);
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  std::mt19937_64 rng(2718);
  LossLayer& cpu = suite().layer<LossLayer>("cross_entropy", "cpu");
  Margins margins("cross_entropy fp8");
  // (rows, in, out, real_out): K = in and out padded to 16 by the pack (40 -> 48; out 56 -> 64),
  // rows any; out a multiple of 8 so the bf16 logits' rows are 16-byte aligned (FP8 products' rule).
  for (const auto& [rows, in, out, real_out] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{45, 40, 56, 50}, {300, 64, 96, 96}}) {
    for (const char* dtype : {"fp8", "fp8_e4m3"}) {
      LossLayer& gpu = suite().layer<LossLayer>("cross_entropy", "cuda", dtype, on);
      CHECK(gpu.bf16_product_inputs());
      ClassifierProblem p;
      p.spec.in = in;
      p.spec.out = out;
      p.spec.real_out = real_out;
      p.rows = rows;
      p.batch = make_batch(rows, int32_t(real_out), 1, rng);
      p.batch.targets[1] = -1;
      p.scale = 1.0 / double(p.batch.real_targets());
      const std::string label = std::string(dtype) + " rows " + std::to_string(rows) + " in " + std::to_string(in) + " vocab " +
                                std::to_string(real_out) + "/" + std::to_string(out);
      INFO(label);
      ClassifierValues v;
      v.W = random_params(cpu, gpu, p.spec, rng, 2.0);
      v.x = randn(std::size_t(rows * in), rng);
      for (float& e : v.W) e = device_math::bf16_value(device_math::bf16_bits(e));  // the f32 weights and their copy agree
      for (float& e : v.x) e = device_math::bf16_value(device_math::bf16_bits(e));
      v.d_x = std::vector<float>(v.x.size(), std::numeric_limits<float>::quiet_NaN());
      v.grads = randn(v.W.size(), rng, 0.0, p.scale * std::sqrt(double(rows)));
      const Fp8ClassifierResults got = classifier_fp8(gpu, p, v);

      const bool e5m2 = std::string(dtype) == "fp8";
      const Quantised qx = quantise(v.x, 0, v.x.size(), false), qw = quantise(v.W, 0, v.W.size(), false);
      const double s_xw = double(qx.inv * qw.inv);
      std::vector<double> losses(static_cast<std::size_t>(rows)), losses_bf16(static_cast<std::size_t>(rows));
      std::vector<double> dz(static_cast<std::size_t>(rows * out), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> z(static_cast<std::size_t>(real_out)), z16(static_cast<std::size_t>(real_out));
        for (int64_t o = 0; o < real_out; ++o) {
          double t = 0, t16 = 0;
          for (int64_t i = 0; i < in; ++i) {
            t += qx.q[std::size_t(r * in + i)] * qw.q[std::size_t(o * in + i)];
            t16 += double(v.x[std::size_t(r * in + i)]) * double(v.W[std::size_t(o * in + i)]);
          }
          z[std::size_t(o)] = device_math::bf16_value(device_math::bf16_bits(float(s_xw * t)));  // written in bf16
          z16[std::size_t(o)] = device_math::bf16_value(device_math::bf16_bits(float(t16)));     // the bf16 classifier's
        }
        const int32_t t = p.batch.targets[std::size_t(r)];
        if (t < 0) continue;  // no loss, no gradient
        const double m = *std::max_element(z.begin(), z.end()), m16 = *std::max_element(z16.begin(), z16.end());
        double sum = 0, sum16 = 0;
        for (int64_t o = 0; o < real_out; ++o) {
          sum += std::exp(z[std::size_t(o)] - m);
          sum16 += std::exp(z16[std::size_t(o)] - m16);
        }
        losses[std::size_t(r)] = m + std::log(sum) - z[std::size_t(t)];
        losses_bf16[std::size_t(r)] = m16 + std::log(sum16) - z16[std::size_t(t)];
        for (int64_t o = 0; o < real_out; ++o) {
          dz[std::size_t(r * out + o)] = (std::exp(z[std::size_t(o)] - m) / sum - (o == t ? 1.0 : 0.0)) * p.scale;
        }
      }
      margins.count(dtype);
      compare("losses", got.out.losses, losses, {}, tolerance(Precision::bf16, in, 1), margins, dtype, label);
      compare("dz", got.dz, dz, {}, tolerance(Precision::bf16, in + out, 2), margins, dtype, label);
      CHECK(relative_rms(got.out.losses, losses) < 0.1 * relative_rms(got.out.losses, losses_bf16));

      // The gradient products from the device's dz, as defined.
      std::vector<double> dz_device(got.dz);
      const std::vector<float> dz_values(dz_device.begin(), dz_device.end());
      const Quantised qdz = quantise(dz_values, 0, dz_values.size(), e5m2);
      const std::vector<double> dx = fp8_input_grad(qdz, qw, rows, in, out);
      std::vector<double> grads = widen(v.grads);
      fp8_add_weight_grad(qdz, qx, rows, in, out, grads);
      const Tolerance tol = tolerance(Precision::f32, rows + out, 0);
      compare("d_x", got.out.d_x, dx, {}, tol, margins, dtype, label);
      compare("grads", got.out.grads, grads, widen(v.grads), tol, margins, dtype, label);
      check_padded_rows_untouched("cuda", p, got.out.grads, v.grads);

      // fp8 = false under the same run.dtype: the bf16 classifier, bit for bit.
      const Fp8ClassifierResults plain = classifier_fp8(suite().layer<LossLayer>("cross_entropy", "cuda", dtype, off), p, v);
      const Fp8ClassifierResults b16 = classifier_fp8(suite().layer<LossLayer>("cross_entropy", "cuda", "bf16"), p, v);
      CHECK(same_bits(plain.out.losses, b16.out.losses));
      CHECK(same_bits(plain.out.d_x, b16.out.d_x));
      CHECK(same_bits(plain.out.grads, b16.out.grads));
      CHECK_FALSE(same_bits(got.out.losses, b16.out.losses));
    }
  }
}

namespace {

// A bf16 buffer of `n` values, all bits set (a bf16 NaN); the bf16 rounding of each value.
cuda::DeviceBuffer<uint16_t> poisoned_bf16(int64_t n) {
  cuda::DeviceBuffer<uint16_t> b(static_cast<std::size_t>(n));
  if (n > 0) ABLATE_CUDA_CHECK(cudaMemsetAsync(b.data(), 0xFF, b.size() * 2, suite().stream));
  return b;
}

std::vector<float> rounded_bf16(std::vector<float> v) {
  for (float& e : v) e = device_math::bf16_value(device_math::bf16_bits(e));
  return v;
}


// A dense layer's problem for the FP8 reuse cases below: 64 -> 96 (a linear) or 64 -> 96 -> 64 (an
// MLP), no bias, `rows` rows.
Problem fp8_reuse_problem(const char* name, int64_t rows, std::mt19937_64& rng) {
  Problem p;
  p.layer = name;
  p.spec.in = 64;
  p.spec.out = 96;
  p.spec.bias = false;
  p.rows = rows;
  p.x_width = 64;
  p.y_width = std::string(name) == "linear" ? 96 : 64;
  p.batch = make_batch(p.rows, 1, 1, rng);
  return p;
}

}  // namespace

namespace {

// One layer call's forward under `gpu` (x held in bf16, the weights' bf16 copy given, y f32) on the
// device, its buffers kept for its backward: d_y given, the input gradient written or not.
struct Fp8Call {
  const DeviceIds ids;
  cuda::DeviceBuffer<uint16_t> x16, copy;
  DeviceFloats params, dy, grads, y, dx, saved, scratch;
  LayerCall call;
  Fp8Call(Layer& gpu, const Problem& p, const Values& v)
      : ids(p.batch),
        x16(bf16_copy(v.x)),
        copy(bf16_copy(v.params)),
        params(to_device(v.params)),
        dy(to_device(v.d_y)),
        grads(to_device(v.grads)),
        y(poisoned(p.ny())),
        dx(poisoned(p.nx())),
        saved(poisoned(gpu.activation_elements(p.spec, p.rows))),
        scratch(poisoned(gpu.scratch_elements(p.spec, p.rows))),
        call(base_call(p, ids.views)) {
    call.stream = ablate::Stream(suite().stream);
    call.x = bf16_view(x16);
    call.y = device_view(y);
    call.params = device_view(params);
    call.params_bf16 = bf16_view(copy);
    call.saved = device_view(saved);
    call.scratch = device_view(scratch);
    gpu.forward(call);
    call.y = {};
    call.grads = device_view(grads);
    call.d_y = device_view(dy);
  }
  void backward(Layer& gpu, bool with_dx) {
    if (with_dx) call.d_x = device_view(dx);
    gpu.backward(call);
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
  }
};

}  // namespace

TEST_CASE("FP8 current scaling takes an output gradient's amax once, and packs it once, for the two products that read it") {
  // The input gradient's product and the weight gradient's read the same dy: the second quantises
  // it with the first's scale (the same amax, so the same codes: the FP8 linear case above checks
  // the results against their definition), and reads it as the first packed it in both layouts
  // from one read. Counted by the plugin: one reuse per linear backward, two per gelu_mlp (its
  // projection's dy, fc's gradient below the GELU), three per swiglu_mlp; none without an input
  // gradient, and none under delayed scaling (each product its own slot); every reuse reads the
  // shared pack. The weight gradients with and without the input gradient (fc's and the gate's and
  // up's products packing dy alone) are the same bits, and so is linear's input gradient without
  // the weight gradient's product: the shared layout is the pack a product makes for itself.
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter reused = plugin_counter("ablate_cuda_layers_fp8_scales_reused");
  const Counter shared = plugin_counter("ablate_cuda_layers_fp8_packs_shared");
  std::mt19937_64 rng(3141);
  // (name, reuses with d_x, without: swiglu's down projection always has its input gradient, the
  // gate's and up's products read d_g and d_u once each without one)
  const std::tuple<const char*, int64_t, int64_t> layers[] = {{"linear", 1, 0}, {"gelu_mlp", 2, 1}, {"swiglu_mlp", 3, 1}};
  for (const auto& [name, with, without] : layers) {
    std::vector<double> grads_with_dx, dx_with_grads;
    Layer& cpu = suite().layer<Layer>(name, "cpu");
    Layer& gpu = suite().layer<Layer>(name, "cuda", "fp8");
    const Problem p = fp8_reuse_problem(name, 32, rng);
    const Values v = random_values(p, cpu, gpu, rng, 0.0);  // the same values with and without d_x
    for (const bool with_dx : {true, false}) {
      const std::string label = std::string(name) + (with_dx ? " with d_x" : " without d_x");
      INFO(label);
      Fp8Call f(gpu, p, v);
      const int64_t before = reused(), shared_before = shared();
      f.backward(gpu, with_dx);
      CHECK(reused() - before == (with_dx ? with : without));
      CHECK(shared() - shared_before == (with_dx ? with : without));
      const std::vector<double> g = from_device(f.grads);
      CHECK(all_finite(g));
      if (with_dx) {
        grads_with_dx = g;
        dx_with_grads = from_device(f.dx);
      } else {
        CHECK_MESSAGE(same_bits(g, grads_with_dx), "the weight gradients differ with and without the input gradient");
      }
      if (with_dx && std::string(name) == "linear") {  // the input gradient alone: its product packs dy for itself
        DeviceFloats dx_alone = poisoned(p.nx());
        f.call.grads = {};
        f.call.d_x = device_view(dx_alone);
        gpu.backward(f.call);
        CHECK_MESSAGE(same_bits(from_device(dx_alone), dx_with_grads), "linear's d_x differs without the weight gradient's product");
      }
    }
  }
}

// Under FP8 products the bias gradients are taken where the output gradients are read anyway: a
// dense layer's db in the pass that quantises dy for the first of its two products (the input
// gradient's, or the projection's weight gradient's in the GELU MLP), and the GELU MLP's fc bias
// gradient in the kernel that writes the gradient below the GELU from the projection's bf16
// output. Checked on gelu_mlp with biases against the definitions: proj's db += the column sums of
// d_y (f32 arithmetic, the f32 tolerance); fc's db += the column sums of bf16(dh) gelu'(pre), dh the
// FP8 product of the quantised d_y and projection weight (float64), pre the saved bf16
// pre-activation: within a bf16 unit of each term (dh rounded to bf16 once). The plugin counts one
// column sum taken in a pack and none by a pass; fc's and proj's bias gradients are the same bits
// without the input gradient (the sums' order is the tiles', whichever product reads dy first).
TEST_CASE("FP8 products take the bias gradients in the passes that read the output gradients: gelu_mlp against the definitions") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter in_pack = plugin_counter("ablate_cuda_layers_fp8_sums_in_pack");
  const Counter by_pass = plugin_counter("ablate_cuda_layers_fp8_sums_by_pass");
  std::mt19937_64 rng(2718);
  const int64_t C = 64, H = 96, rows = 45;
  Layer& cpu = suite().layer<Layer>("gelu_mlp", "cpu");
  Layer& gpu = suite().layer<Layer>("gelu_mlp", "cuda", "fp8");
  Problem p;
  p.layer = "gelu_mlp";
  p.spec.in = C;
  p.spec.out = H;
  p.spec.bias = true;
  p.rows = rows;
  p.x_width = C;
  p.y_width = C;
  p.batch = make_batch(p.rows, 1, 1, rng);
  Values v = random_values(p, cpu, gpu, rng, 0.0);
  v.x = rounded_bf16(v.x);
  const int64_t fc_b = H * C, proj_w = fc_b + H, proj_b = proj_w + C * H;
  std::vector<double> grads_with_dx;
  for (const bool with_dx : {true, false}) {
    INFO((with_dx ? "with d_x" : "without d_x"));
    Fp8Call f(gpu, p, v);
    const int64_t packed = in_pack(), passed = by_pass();
    f.backward(gpu, with_dx);
    CHECK(in_pack() - packed == 1);  // proj's db, in the pass that packs d_y for proj's two products
    CHECK(by_pass() - passed == 0);
    const std::vector<double> g = from_device(f.grads);
    if (!with_dx) {
      for (int64_t h = 0; h < H; ++h) CHECK(g[std::size_t(fc_b + h)] == grads_with_dx[std::size_t(fc_b + h)]);
      for (int64_t c = 0; c < C; ++c) CHECK(g[std::size_t(proj_b + c)] == grads_with_dx[std::size_t(proj_b + c)]);
      continue;
    }
    grads_with_dx = g;
    // proj's bias gradient: the column sums of d_y.
    for (int64_t c = 0; c < C; ++c) {
      double want = v.grads[std::size_t(proj_b + c)], mag = std::abs(want);
      for (int64_t r = 0; r < rows; ++r) {
        want += double(v.d_y[std::size_t(r * C + c)]);
        mag += std::abs(double(v.d_y[std::size_t(r * C + c)]));
      }
      CHECK(std::abs(g[std::size_t(proj_b + c)] - want) <= double(rows + 2) * 0x1p-24 * mag);
    }
    // fc's: the column sums of bf16(dh) gelu'(pre).
    const std::vector<uint32_t> bits = bits_from_device(f.saved);
    const auto* pre = reinterpret_cast<const uint16_t*>(bits.data());
    const Quantised qdy = quantise(v.d_y, 0, v.d_y.size(), true),
                    qw = quantise(v.params, std::size_t(proj_w), std::size_t(C * H), false);
    const std::vector<double> dh = fp8_input_grad(qdy, qw, rows, H, C);
    const auto gelu_grad = [](double x) {
      const double c0 = 0.7978845608028654, c1 = 0.044715, t = std::tanh(c0 * (x + c1 * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c0 * (1.0 + 3.0 * c1 * x * x);
    };
    int bad = 0;
    for (int64_t h = 0; h < H; ++h) {
      double want = v.grads[std::size_t(fc_b + h)], mag = std::abs(want);
      for (int64_t r = 0; r < rows; ++r) {
        const std::size_t i = std::size_t(r * H + h);
        const double term =
            double(device_math::bf16_value(device_math::bf16_bits(float(dh[i])))) * gelu_grad(double(device_math::bf16_value(pre[i])));
        want += term;
        mag += std::abs(term);
      }
      const double tol = 0x1p-7 * mag + 1e-5 * mag;
      if (!(std::abs(g[std::size_t(fc_b + h)] - want) <= tol) && bad++ == 0) {
        FAIL_CHECK("fc's bias gradient " << h << " is " << g[std::size_t(fc_b + h)] << ", want " << want << " within " << tol);
      }
    }
    CHECK(bad == 0);
    CHECK(all_finite(g));
    CHECK(all_finite(from_device(f.dx)));
  }
}

namespace {

// One FP8 layer call's buffers on the device for the input-reuse case below: x (bf16, shared by the
// calls that read it), the layer's own parameters and copy, its outputs and gradients.
struct Fp8Site {
  DeviceFloats params, y, saved, scratch, grads, dx, dy;
  cuda::DeviceBuffer<uint16_t> copy;
  Fp8Site(const Layer& gpu, const Problem& p, const Values& v)
      : params(to_device(v.params)),
        y(poisoned(p.ny())),
        saved(poisoned(gpu.activation_elements(p.spec, p.rows))),
        scratch(poisoned(gpu.scratch_elements(p.spec, p.rows))),
        grads(to_device(v.grads)),
        dx(poisoned(p.nx())),
        dy(to_device(v.d_y)),
        copy(bf16_copy(v.params)) {}
  LayerCall call(const Problem& p, const BatchViews& views, cuda::DeviceBuffer<uint16_t>& x, bool backward, bool unchanged) {
    LayerCall c = base_call(p, views);
    c.stream = ablate::Stream(suite().stream);
    c.x = bf16_view(x);
    c.params = device_view(params);
    c.params_bf16 = bf16_view(copy);
    c.saved = device_view(saved);
    c.scratch = device_view(scratch);
    c.x_unchanged = unchanged;
    if (!backward) {
      c.y = device_view(y);
    } else {
      c.grads = device_view(grads);
      c.d_y = device_view(dy);
      c.d_x = device_view(dx);
    }
    return c;
  }
};

}  // namespace

// q's, k's and v's projections read one norm output: the model says so (LayerCall::x_unchanged),
// and under FP8 current scaling k's and v's forward products read x as q's quantised it (its scale
// and packed copy), and backward k's and q's weight-gradient products read x transposed as v's and
// k's packed it; a SwiGLU's up products likewise after its gate's. Checked here on two linears
// sharing x: the second's y, and its weight gradient, are the same bits with the flag as without
// (its own quantisation of the same x), the plugin counting one reuse each; where the call before
// read another x, the flag is ignored (the stream's record of the pack does not match). Then the
// model's flags: one forward and backward of a 2-block model reuses 4 inputs a block (k and v
// forward, k and q backward), 6 with a SwiGLU MLP, none under delayed scaling.
TEST_CASE("FP8 current scaling reads a layer input the call before read, unchanged, as that call quantised it") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter reused = plugin_counter("ablate_cuda_layers_fp8_inputs_reused");
  std::mt19937_64 rng(2024);
  for (const char* name : {"linear", "swiglu_mlp"}) {
    INFO(name);
    Layer& cpu = suite().layer<Layer>(name, "cpu");
    Layer& gpu = suite().layer<Layer>(name, "cuda", "fp8");
    const Problem p = fp8_reuse_problem(name, 48, rng);
    const Values v1 = random_values(p, cpu, gpu, rng, 0.0), v2 = random_values(p, cpu, gpu, rng, 0.0);
    const DeviceIds ids(p.batch);
    cuda::DeviceBuffer<uint16_t> x = bf16_copy(v1.x), other_x = bf16_copy(v2.x);
    const auto sync = [] { ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream)); };
    // A SwiGLU's up products reuse its gate's within one call: one reuse forward, one backward.
    // Across calls a SwiGLU gains nothing: the product before its first reading x is the previous
    // call's down projection (its A and its kept B the hidden activation, not x).
    const bool linear = std::string(name) == "linear";
    const int64_t own = linear ? 0 : 1, across = linear ? 1 : 0;
    Fp8Site first(gpu, p, v1), second(gpu, p, v2), fresh(gpu, p, v2), guarded(gpu, p, v2);
    gpu.forward(first.call(p, ids.views, x, false, false));
    int64_t before = reused();
    gpu.forward(second.call(p, ids.views, x, false, true));
    sync();
    CHECK(reused() - before == across + own);
    before = reused();
    gpu.forward(fresh.call(p, ids.views, x, false, false));
    sync();
    CHECK(reused() - before == own);
    CHECK_MESSAGE(same_bits(from_device(second.y), from_device(fresh.y)), "y differs with the reused input");
    // Where the call before read another x, the flag finds no matching pack.
    gpu.forward(first.call(p, ids.views, other_x, false, false));
    before = reused();
    gpu.forward(guarded.call(p, ids.views, x, false, true));
    sync();
    CHECK(reused() - before == own);
    CHECK(same_bits(from_device(guarded.y), from_device(fresh.y)));
    // Backward: the weight gradient's product of the second call reads x as the first's kept it.
    gpu.backward(first.call(p, ids.views, x, true, false));
    before = reused();
    gpu.backward(second.call(p, ids.views, x, true, true));
    sync();
    CHECK(reused() - before == across + own);
    before = reused();
    gpu.backward(fresh.call(p, ids.views, x, true, false));
    sync();
    CHECK(reused() - before == own);
    const std::vector<double> g = from_device(second.grads);
    CHECK(all_finite(g));
    CHECK_MESSAGE(same_bits(g, from_device(fresh.grads)), "the weight gradient differs with the reused input");
    CHECK(same_bits(from_device(second.dx), from_device(fresh.dx)));
  }
}

namespace {

// Two rows of T tokens (token i = (mul i) % 128, its target the next multiple's) for the FP8 model
// cases below.
Batch fp8_model_batch(int32_t T, int32_t mul) {
  Batch b;
  b.reset(2, T);
  for (int32_t i = 0; i < 2 * T; ++i) {
    b.tokens[std::size_t(i)] = (mul * i) % 128;
    b.targets[std::size_t(i)] = (mul * i + 3) % 128;
    b.positions[std::size_t(i)] = i % T;
    b.segment_ids[std::size_t(i)] = 1;
  }
  b.segments = {{0, T}, {0, T}};
  b.row_segments = {0, 1, 2};
  return b;
}

// A 2-block FP8 model on the emulated device: GPT-2 style (gelu_mlp) or Llama style (swiglu_mlp:
// RMSNorm, RoPE, GQA, no biases), its parameters drawn from seed 5; `fp8_head`: the classifier's
// products in FP8 too ([model.cross_entropy] fp8), in chunks of 32 rows.
std::unique_ptr<Model> fp8_model(const char* mlp, const char* scaling, int32_t T, bool fp8_head = false) {
  ModelOptions o;
  o.d_model = 64;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = std::string(mlp) == "swiglu_mlp" ? 2 : 4;
  o.head_dim = 16;
  o.vocab_size = o.vocab_padded = 128;
  o.max_seq_len = T;
  o.mlp_hidden = 128;
  o.mlp = mlp;
  if (std::string(mlp) == "swiglu_mlp") {
    o.norm = "rmsnorm";
    o.position = "rope";
    o.bias = false;
  }
  o.attention = "naive_cuda";
  if (fp8_head) {
    o.layer_own.insert_or_assign("cross_entropy",
                                 Params("model.cross_entropy", {{"fp8", Value{true}}, {"chunk_rows", Value{int64_t(32)}}}));
  }
  RunContext run;
  run.device = "cuda";
  run.dtype = "fp8";
  run.fp8_scaling = scaling;
  run.threads = 2;
  auto m = std::make_unique<Model>(o, suite().registry, run);
  m->init_params(5);
  m->zero_grads();
  return m;
}

}  // namespace

TEST_CASE("FP8 current scaling: the model says which projections read the input the call before read") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter reused = plugin_counter("ablate_cuda_layers_fp8_inputs_reused");
  const int32_t T = 32;
  const Batch b = fp8_model_batch(T, 7);
  // (mlp, scaling, reuses): GPT-2 style and Llama style (RMSNorm, SwiGLU, RoPE, GQA), 2 blocks.
  const std::tuple<const char*, const char*, int64_t> cases[] = {
      {"gelu_mlp", "current", 8}, {"swiglu_mlp", "current", 12}, {"gelu_mlp", "delayed", 0}};
  for (const auto& [mlp, scaling, want] : cases) {
    const std::string label = std::string(mlp) + ", " + scaling + " scaling";
    INFO(label);
    const std::unique_ptr<Model> m = fp8_model(mlp, scaling, T);
    const int64_t before = reused();
    const double loss = m->forward_backward(b, 1.0 / double(b.real_targets()), 0);
    CHECK(std::isfinite(loss));
    CHECK(reused() - before == want);
  }
}

// A layer's weights are quantised once a step under FP8 current scaling: the first product of the
// step that reads a weight makes its FP8 copies in both layouts (the forward's and the input
// gradient's) in the call site's weight cache, and every later product of the step reads them
// (LayerCall::weights_unchanged). Checked on one site over two micro-batches against a site
// without a cache (each product quantising the weight itself): y, d_x and the weight gradients
// the same bits at every call, the plugin counting a reuse for each product that reads a weight
// after the first (the input gradients of the first micro-batch, then every weight product of the
// second: 1 + 1 for a linear, 2 + 2 for a GELU MLP, 3 + 3 for a SwiGLU). Then new weights
// (weights_unchanged false) are quantised again, and a cache holding another tensor's copies is
// never read for this one, whatever the flag says.
TEST_CASE("FP8 current scaling quantises a layer's weights once a step, both layouts from one read, for every micro-batch") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter reused = plugin_counter("ablate_cuda_layers_fp8_weight_packs_reused");
  std::mt19937_64 rng(77);
  for (const char* name : {"linear", "gelu_mlp", "swiglu_mlp"}) {
    const std::string layer_name = name;
    INFO(layer_name);
    Layer& cpu = suite().layer<Layer>(name, "cpu");
    Layer& gpu = suite().layer<Layer>(name, "cuda", "fp8");
    const Problem p = fp8_reuse_problem(name, 48, rng);
    const int64_t weights = std::string(name) == "linear" ? 1 : std::string(name) == "gelu_mlp" ? 2 : 3;
    const int64_t bytes = gpu.weight_cache_bytes(p.spec);
    CHECK(bytes >= weights * (256 + p.spec.in * p.spec.out * 2));
    const Values v = random_values(p, cpu, gpu, rng, 0.0), v2 = random_values(p, cpu, gpu, rng, 0.0);
    const DeviceIds ids(p.batch);
    cuda::DeviceBuffer<uint16_t> x1 = bf16_copy(v.x), x2 = bf16_copy(v2.x);
    DeviceFloats cache = poisoned((bytes + 3) / 4);  // NaN until made: a read before would show
    Fp8Site cached(gpu, p, v), plain(gpu, p, v);
    const auto sync = [] { ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream)); };
    // One call on both sites; the cached one sees `unchanged`. Returns the reuses it counted.
    int call_number = 0;
    const auto both = [&](cuda::DeviceBuffer<uint16_t>& x, bool backward, bool unchanged) {
      const std::string which = "call " + std::to_string(++call_number) + (backward ? " (backward)" : " (forward)");
      INFO(which);
      LayerCall c = cached.call(p, ids.views, x, backward, false);
      c.weight_cache = device_view(cache);
      c.weights_unchanged = unchanged;
      const int64_t before = reused();
      backward ? gpu.backward(c) : gpu.forward(c);
      sync();
      const int64_t n = reused() - before;
      backward ? gpu.backward(plain.call(p, ids.views, x, backward, false))
               : gpu.forward(plain.call(p, ids.views, x, backward, false));
      sync();
      if (!backward) {
        CHECK_MESSAGE(same_bits(from_device(cached.y), from_device(plain.y)), "y differs with the weights' copies from the cache");
      } else {
        CHECK_MESSAGE(same_bits(from_device(cached.dx), from_device(plain.dx)), "d_x differs with the weights' copies from the cache");
        CHECK_MESSAGE(same_bits(from_device(cached.grads), from_device(plain.grads)), "the weight gradients differ");
      }
      return n;
    };
    CHECK(both(x1, false, false) == 0);  // the step's first call: the copies made
    CHECK(both(x1, true, true) == weights);
    CHECK(both(x2, false, true) == weights);  // the next micro-batch
    CHECK(both(x2, true, true) == weights);
    CHECK(all_finite(from_device(cached.y)));
    // The optimizer stepped: new values in the same buffers. Were the flag (wrongly) still true, the
    // old copies would be read and y would differ: the flag is what keeps them from being read.
    const DeviceFloats new_params = to_device(v2.params);
    const cuda::DeviceBuffer<uint16_t> new_copy = bf16_copy(v2.params);
    for (Fp8Site* site : {&cached, &plain}) {
      ABLATE_CUDA_CHECK(
          cudaMemcpyAsync(site->params.data(), new_params.data(), new_params.bytes(), cudaMemcpyDeviceToDevice, suite().stream));
      ABLATE_CUDA_CHECK(
          cudaMemcpyAsync(site->copy.data(), new_copy.data(), new_copy.bytes(), cudaMemcpyDeviceToDevice, suite().stream));
    }
    LayerCall stale = cached.call(p, ids.views, x1, false, false);
    stale.weight_cache = device_view(cache);
    stale.weights_unchanged = true;
    gpu.forward(stale);
    gpu.forward(plain.call(p, ids.views, x1, false, false));
    sync();
    CHECK_FALSE(same_bits(from_device(cached.y), from_device(plain.y)));
    CHECK(both(x1, false, false) == 0);
    CHECK(both(x1, true, true) == weights);
    // The flag alone is not enough: a cache that holds another tensor's copies is made again.
    Fp8Site other(gpu, p, v);
    LayerCall c = other.call(p, ids.views, x1, false, false);
    c.weight_cache = device_view(cache);
    c.weights_unchanged = true;
    const int64_t before = reused();
    gpu.forward(c);
    sync();
    CHECK(reused() - before == 0);
    Fp8Site fresh(gpu, p, v);
    gpu.forward(fresh.call(p, ids.views, x1, false, false));
    sync();
    CHECK(same_bits(from_device(other.y), from_device(fresh.y)));
  }
}

// The model's side of it: each site's weights_unchanged is true from its first call after a change
// of the parameters on (init, load, an optimizer step: Model::params_changed) until the next. Over
// two micro-batches of a 2-block model, every input gradient's product of the first reads its
// weight's copy made by the forward pass, and every weight product of the second reads them:
// a GPT-2-style block has 6 weights (q, k, v, o, fc, proj), a Llama-style one 7 (a SwiGLU); after
// params_changed the forward pass quantises them again. None under delayed scaling, whose slots
// scale each use of a weight by its history. With the classifier in FP8 ([model.cross_entropy] fp8,
// 2 rows of 32 in chunks of 32: two chunks, each with a logits and an input-gradient product
// reading W) its call has a cache too: 3 reuses in a step's first micro-batch, 4 in the next.
TEST_CASE("FP8 current scaling: the model says when a site's weights are unchanged since its last call") {
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter reused = plugin_counter("ablate_cuda_layers_fp8_weight_packs_reused");
  const int32_t T = 32;
  const Batch b = fp8_model_batch(T, 5);
  // (mlp, scaling, weights a block, the classifier in FP8)
  const std::tuple<const char*, const char*, int64_t, bool> cases[] = {{"gelu_mlp", "current", 6, false},
                                                                       {"swiglu_mlp", "current", 7, false},
                                                                       {"gelu_mlp", "delayed", 0, false},
                                                                       {"gelu_mlp", "current", 6, true}};
  for (const auto& [mlp, scaling, per_block, head] : cases) {
    const std::string label = std::string(mlp) + ", " + scaling + " scaling" + (head ? ", the classifier in FP8" : "");
    INFO(label);
    const std::unique_ptr<Model> m = fp8_model(mlp, scaling, T, head);
    const int64_t weights = per_block * 2;  // 2 blocks
    const int64_t first = head ? 3 : 0, next = head ? 4 : 0;
    const auto micro_batch = [&] {
      const int64_t before = reused();
      CHECK(std::isfinite(m->forward_backward(b, 1.0 / double(b.real_targets()), 0)));
      return reused() - before;
    };
    CHECK(micro_batch() == weights + first);     // the input gradients' products
    CHECK(micro_batch() == 2 * weights + next);  // every weight product
    m->params_changed();
    CHECK(micro_batch() == weights + first);  // quantised again by the forward pass
  }
}


// The FP8 classifier's weight is quantised once a step, as the dense layers' are: the first
// product of the step that reads W (the first chunk's logits) makes its copies in both layouts in
// the call's weight cache, and every later product reads them, the input gradient's of each chunk
// and every product of the next micro-batch. 300 rows in chunks of 128 (three chunks, two products
// reading W in each): 5 reuses in the step's first call, 6 in the next. The losses, d_x and weight
// gradient are the same bits as a call without a cache at every call; new weights with the flag
// false are quantised again, and with the flag (wrongly) true the old copy would be read: the
// outputs differ, which is what the flag guards. bf16 keeps no cache.
TEST_CASE("cross_entropy under FP8 products quantises its weight once a step: every chunk and micro-batch reads one copy") {
  LayerSpec spec;
  spec.in = 64;
  spec.out = spec.real_out = 96;
  CHECK(suite().layer<LossLayer>("cross_entropy", "cuda", "bf16").weight_cache_bytes(spec) == 0);
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  const Counter reused = plugin_counter("ablate_cuda_layers_fp8_weight_packs_reused");
  const Params own("model.cross_entropy", {{"fp8", Value{true}}, {"chunk_rows", Value{int64_t(128)}}});
  LossLayer& cpu = suite().layer<LossLayer>("cross_entropy", "cpu");
  LossLayer& gpu = suite().layer<LossLayer>("cross_entropy", "cuda", "fp8", own);
  std::mt19937_64 rng(4242);
  ClassifierProblem p;
  p.spec = spec;
  p.rows = 300;
  p.batch = make_batch(p.rows, int32_t(spec.real_out), 1, rng);
  p.batch.targets[7] = -1;
  p.scale = 1.0 / double(p.batch.real_targets());
  const int64_t bytes = gpu.weight_cache_bytes(spec);
  CHECK(bytes >= 256 + 2 * spec.in * spec.out);
  ClassifierValues v;
  v.W = rounded_bf16(random_params(cpu, gpu, spec, rng, 2.0));  // the f32 weights and their copy agree
  v.grads = randn(v.W.size(), rng, 0.0, p.scale);
  const std::vector<float> x1 = rounded_bf16(randn(std::size_t(p.rows * spec.in), rng)),
                           x2 = rounded_bf16(randn(std::size_t(p.rows * spec.in), rng));
  const std::vector<float> w2 = rounded_bf16(random_params(cpu, gpu, spec, rng, 2.0));
  DeviceFloats cache = poisoned((bytes + 3) / 4);  // NaN until made: a read before would show
  Fp8ClassifierSite cached(v), plain(v);
  int call_number = 0;
  // One call on both sites, the cached one told `unchanged`; the reuses it counted.
  const auto both = [&](const std::vector<float>& x, bool unchanged) {
    const std::string which = "call " + std::to_string(++call_number);
    INFO(which);
    const int64_t before = reused();
    const ClassifierResults got = cached.call(gpu, p, x, &cache, unchanged).out;
    const int64_t n = reused() - before;
    const ClassifierResults want = plain.call(gpu, p, x, nullptr, false).out;
    CHECK(all_finite(got.losses));
    CHECK_MESSAGE(same_bits(got.losses, want.losses), "the losses differ with W's copy from the cache");
    CHECK_MESSAGE(same_bits(got.d_x, want.d_x), "d_x differs with W's copy from the cache");
    CHECK_MESSAGE(same_bits(got.grads, want.grads), "the weight gradient differs with W's copy from the cache");
    return n;
  };
  CHECK(both(x1, false) == 5);  // the step's first call: the copy made by the first chunk's logits
  CHECK(both(x2, true) == 6);   // the next micro-batch
  // The optimizer stepped: new values in the same buffers.
  cached.set(w2, v.grads);
  plain.set(w2, v.grads);
  const ClassifierResults stale = cached.call(gpu, p, x1, &cache, true).out;
  const ClassifierResults fresh = plain.call(gpu, p, x1, nullptr, false).out;
  CHECK_FALSE(same_bits(stale.losses, fresh.losses));
  cached.set(w2, v.grads);  // the stale call's gradient undone
  plain.set(w2, v.grads);
  CHECK(both(x1, false) == 5);
  CHECK(both(x2, true) == 6);
}

TEST_CASE("FP8 products fuse the forward epilogues into a bf16 output: q/k/v's bias, the GELU MLP's bias and GELU, as defined") {
  // A linear writing q, k or v in bf16 adds its bias (the bf16 copy) in the FP8 product's epilogue;
  // gelu_mlp's fc product writes the pre-activation and the GELU of it in bf16 from its epilogue
  // (GELU_AUX_BIAS). Each against the FP8 product of the quantised operands as defined (current
  // scaling, float64), the bf16 bias added, then the GELU, then one rounding to bf16: within half
  // a bf16 unit (2^-8 relative) beside fp32's reordering of the K-term sums.
  if (!test::device_has_fp8()) {
    MESSAGE("skipped: the device has no FP8 products (compute capability below 8.9)");
    return;
  }
  std::mt19937_64 rng(2024);
  const auto bf16_round = [](float v) { return double(device_math::bf16_value(device_math::bf16_bits(v))); };
  const auto gelu = [](double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); };
  const auto check_close = [](const std::vector<double>& got, const std::vector<double>& want, int64_t K, const char* what) {
    double scale = 0.0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    int bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double tol = 0x1p-8 * std::abs(want[i]) + 4e-6 * std::sqrt(double(K)) * scale + 1e-6;
      if (!(std::abs(got[i] - want[i]) <= tol) && bad++ == 0) {
        FAIL_CHECK(what << " element " << i << " is " << got[i] << ", want " << want[i] << " within " << tol);
      }
    }
    CHECK(bad == 0);
  };
  const Counter fused = plugin_counter("ablate_cuda_layers_fp8_epilogues_fused");
  const int64_t C = 64, H = 96, rows = 32;
  for (const char* name : {"linear", "gelu_mlp"}) {
    INFO(name);
    const bool mlp = std::string(name) == "gelu_mlp";
    Layer& cpu = suite().layer<Layer>(name, "cpu");
    Layer& gpu = suite().layer<Layer>(name, "cuda", "fp8");
    Problem p;
    p.layer = name;
    p.spec.in = C;
    p.spec.out = H;
    p.spec.bias = true;
    p.rows = rows;
    p.x_width = C;
    p.y_width = mlp ? C : H;
    p.batch = make_batch(p.rows, 1, 1, rng);
    Values v = random_values(p, cpu, gpu, rng, 0.0);
    v.x = rounded_bf16(v.x);
    const DeviceIds ids(p.batch);
    cuda::DeviceBuffer<uint16_t> x16 = bf16_copy(v.x), copy = bf16_copy(v.params), y16 = poisoned_bf16(p.ny());
    DeviceFloats params = to_device(v.params), y = poisoned(p.ny()), saved = poisoned(gpu.activation_elements(p.spec, rows));
    DeviceFloats scratch = poisoned(gpu.scratch_elements(p.spec, rows)), res = to_device(randn(std::size_t(p.ny()), rng));
    LayerCall call = base_call(p, ids.views);
    call.stream = ablate::Stream(suite().stream);
    call.x = bf16_view(x16);
    call.y = mlp ? device_view(y) : bf16_view(y16);  // q, k or v in bf16; the MLP adds to an f32 stream
    if (mlp) call.residual = device_view(res);
    call.params = device_view(params);
    call.params_bf16 = bf16_view(copy);
    call.saved = device_view(saved);
    call.scratch = device_view(scratch);
    const int64_t before = fused();
    gpu.forward(call);
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(suite().stream));
    // One fused epilogue: the bias of q, k or v; fc's GELU (the MLP's projection adds to an f32
    // stream: its bias is a pass).
    CHECK(fused() - before == 1);
    // The product of the quantised x and weight (fc's for the MLP), the bf16 bias added.
    const Quantised qx = quantise(v.x, 0, v.x.size(), false), qw = quantise(v.params, 0, std::size_t(H * C), false);
    std::vector<double> want = fp8_forward(qx, qw, rows, C, H);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < H; ++o) want[std::size_t(r * H + o)] += bf16_round(v.params[std::size_t(H * C + o)]);
    }
    if (!mlp) {
      check_close(from_device_bf16(y16), want, C, "y");
      continue;
    }
    // The MLP's saved values: pre then post, bf16.
    const std::vector<uint32_t> bits = bits_from_device(saved);
    const auto* halves = reinterpret_cast<const uint16_t*>(bits.data());
    std::vector<double> pre(want.size()), post(want.size()), want_post(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      pre[i] = device_math::bf16_value(halves[i]);
      post[i] = device_math::bf16_value(halves[want.size() + i]);
      want_post[i] = gelu(want[i]);
    }
    check_close(pre, want, C, "pre-activation");
    check_close(post, want_post, C, "activation");
  }
}

namespace {

// --- the residual stream held in bf16 (run.residual_dtype = "bf16") --------------------------------

struct StreamResults {
  std::vector<double> y, d_x, grads;
  std::vector<uint32_t> saved;
};

// One forward (and, for a norm, backward) of a layer under bf16 products, the model's way, with
// the stream's values (`v.x` for the embedding's output, learned positions and a norm, `v.residual`
// for a projection's) given in f32 (`bf16_stream` false: today's plan, on values already rounded to
// bf16) or as bf16 views. A norm's y is bf16 either way (the norms' outputs are held so); a dense
// layer's x is held in bf16 (a norm's output or the attention's); y goes to the stream's buffer.
StreamResults run_stream(Layer& layer, const Problem& p, const Values& v, bool bf16_stream) {
  const DeviceIds ids(p.batch);
  const LayerRole role = layer.role();
  const bool stream_x = role == LayerRole::position || role == LayerRole::norm;
  DeviceFloats x = to_device(v.x), res = to_device(v.residual), params = to_device(v.params), dy = to_device(v.d_y);
  cuda::DeviceBuffer<uint16_t> x16 = bf16_copy(v.x), res16 = bf16_copy(v.residual), copy = bf16_copy(v.params);
  DeviceFloats y = p.in_place ? to_device(v.x) : p.residual_in_y ? to_device(v.residual) : poisoned(p.ny());
  cuda::DeviceBuffer<uint16_t> y16 = role == LayerRole::norm || !p.residual_in_y ? poisoned_bf16(p.ny()) : bf16_copy(v.residual);
  DeviceFloats saved = poisoned(layer.activation_elements(p.spec, p.rows));
  DeviceFloats scratch = poisoned(layer.scratch_elements(p.spec, p.rows));
  LayerCall call = base_call(p, ids.views);
  call.stream = ablate::Stream(suite().stream);
  call.params = device_view(params);
  call.params_bf16 = bf16_view(copy);
  call.saved = device_view(saved);
  call.scratch = device_view(scratch);
  const bool y16_out = bf16_stream || role == LayerRole::norm;
  if (p.in_place) {  // learned positions: the stream in place
    call.x = call.y = bf16_stream ? bf16_view(x16) : device_view(y);
  } else {
    call.x = stream_x && !bf16_stream ? device_view(x) : p.x_width > 0 ? bf16_view(x16) : TensorView{};
    call.y = y16_out ? bf16_view(y16) : device_view(y);
  }
  if (p.residual) {
    call.residual =
        bf16_stream ? (p.residual_in_y ? bf16_view(y16) : bf16_view(res16)) : (p.residual_in_y ? device_view(y) : device_view(res));
  }
  layer.forward(call);
  StreamResults r;
  r.y = p.in_place && bf16_stream ? from_device_bf16(x16) : y16_out ? from_device_bf16(y16) : from_device(y);
  r.saved = bits_from_device(saved);
  if (role != LayerRole::norm) return r;
  poison(scratch);
  DeviceFloats dx = to_device(v.d_x), grads = to_device(v.grads);
  LayerCall back = call;
  back.y = {};
  back.grads = device_view(grads);
  back.d_y = device_view(dy);
  back.d_x = device_view(dx);
  back.input_grad = p.input_grad;
  layer.backward(back);
  r.d_x = from_device(dx);
  r.grads = from_device(grads);
  return r;
}

// The bf16 rounding of each value (NaN stays NaN).
std::vector<double> bf16_of(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = device_math::bf16_value(device_math::bf16_bits(float(v[i])));
  return out;
}

}  // namespace

TEST_CASE("the residual stream held in bf16: every layer that writes or reads it, against today's f32 stream") {
  // run.residual_dtype = "bf16". A layer given the stream's values in bf16 must compute what it
  // computes from the same values in f32, then round once: the embedding and learned positions
  // write exactly the rounding of their f32 output; a norm reading a bf16 stream gives the bits
  // it gives for the widened values (its y, statistics, d_x and parameter gradients); a projection
  // adding to the stream (linear, gelu_mlp, swiglu_mlp) writes residual + its output rounded once,
  // in the product's epilogue (the bias from the bf16 copy) or, with dropout, by a pass after an f32
  // product: within half a bf16 unit of the f32 result, plus the bias's own bf16 rounding and fp32's
  // reordering of the sums.
  std::mt19937_64 rng(4242);
  for (const char* name : {"embedding", "learned", "layernorm", "rmsnorm", "linear", "gelu_mlp", "swiglu_mlp"}) {
    Layer& gpu = suite().layer<Layer>(name, "cuda", "bf16");
    CHECK_MESSAGE(gpu.bf16_residual(), name);
    CHECK_FALSE(suite().layer<Layer>(name, "cpu").bf16_residual());
  }
  // An adapter adds to its projection's y in f32: a model with one on the output projection refuses
  // the bf16 stream (tests/gpu/test_cuda_train.cpp).
  CHECK_FALSE(suite().layer<Layer>("lora", "cuda", "bf16").bf16_residual());
  Layer& cpu_emb = suite().layer<Layer>("embedding", "cpu");
  for (int64_t rows : {7, 64}) {
    for (double dropout : {0.0, 0.1}) {
      Problem p;
      p.layer = "embedding";
      p.spec.in = 48;
      p.spec.out = 50;
      p.rows = rows;
      p.y_width = 48;
      p.batch = make_batch(rows, 50, 1, rng);
      p.dropout = dropout;
      p.key = 0x5EEDu;
      INFO("embedding rows " << rows << " dropout " << dropout);
      Layer& gpu = suite().layer<Layer>("embedding", "cuda", "bf16");
      const Values v = random_values(p, cpu_emb, gpu, rng, 0.0);
      const StreamResults f = run_stream(gpu, p, v, false), b = run_stream(gpu, p, v, true);
      CHECK(same_bits(b.y, bf16_of(f.y)));
    }
  }
  {
    Problem p;
    p.layer = "learned";
    p.spec.in = 40;
    p.spec.max_positions = 30;
    p.rows = 33;
    p.x_width = p.y_width = 40;
    p.in_place = true;
    p.batch = make_batch(p.rows, 1, 30, rng);
    Layer& cpu = suite().layer<Layer>("learned", "cpu");
    Layer& gpu = suite().layer<Layer>("learned", "cuda", "bf16");
    Values v = random_values(p, cpu, gpu, rng, 0.0);
    v.x = rounded_bf16(v.x);
    const StreamResults f = run_stream(gpu, p, v, false), b = run_stream(gpu, p, v, true);
    CHECK(same_bits(b.y, bf16_of(f.y)));
  }
  for (const char* name : {"layernorm", "rmsnorm"}) {
    for (int64_t in : {40, 1100}) {  // a row in registers, and one that is not
      for (GradMode mode : {GradMode::overwrite, GradMode::accumulate}) {
        Problem p;
        p.layer = name;
        p.spec.in = in;
        p.spec.bias = true;
        p.spec.eps = 1e-5;
        p.rows = 37;
        p.x_width = p.y_width = in;
        p.batch = make_batch(p.rows, 1, 1, rng);
        p.input_grad = mode;
        const std::string label = std::string(name) + " in " + std::to_string(in) + " " + grad_name(mode);
        INFO(label);
        Layer& cpu = suite().layer<Layer>(name, "cpu");
        Layer& gpu = suite().layer<Layer>(name, "cuda", "bf16");
        Values v = random_values(p, cpu, gpu, rng, 0.5);
        v.x = rounded_bf16(v.x);
        const StreamResults f = run_stream(gpu, p, v, false), b = run_stream(gpu, p, v, true);
        CHECK(same_bits(b.y, f.y));
        CHECK(b.saved == f.saved);
        CHECK(same_bits(b.d_x, f.d_x));
        CHECK(same_bits(b.grads, f.grads));
      }
    }
  }
  for (const char* name : {"linear", "gelu_mlp", "swiglu_mlp"}) {
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{64, 96}, {48, 40}}) {
      for (bool bias : {true, false}) {
        for (bool in_y : {false, true}) {
          for (double dropout : {0.0, 0.1}) {
            Problem p;
            p.layer = name;
            p.spec.in = in;
            p.spec.out = out;
            p.spec.bias = bias;
            p.rows = 45;
            p.x_width = in;
            p.y_width = std::string(name) == "linear" ? out : in;  // an MLP's `out` is its hidden width
            p.batch = make_batch(p.rows, 1, 1, rng);
            p.residual = true;
            p.residual_in_y = in_y;
            p.dropout = dropout;
            p.key = 0xAB5u;
            const std::string label = std::string(name) + " in " + std::to_string(in) + " out " + std::to_string(out) +
                                      (bias ? " bias" : "") + (in_y ? " residual in y" : "") + (dropout > 0 ? " dropout" : "");
            INFO(label);
            Layer& cpu = suite().layer<Layer>(name, "cpu");
            Layer& gpu = suite().layer<Layer>(name, "cuda", "bf16");
            Values v = random_values(p, cpu, gpu, rng, 0.0);
            v.x = rounded_bf16(v.x);
            v.residual = rounded_bf16(v.residual);
            const StreamResults f = run_stream(gpu, p, v, false), b = run_stream(gpu, p, v, true);
            REQUIRE(all_finite(f.y));
            REQUIRE(all_finite(b.y));
            double scale = 0.0, bias_max = 0.0;
            for (double e : f.y) scale = std::max(scale, std::abs(e));
            ParamTable table;
            gpu.declare_params(p.spec, "l", table);
            for (const ParamSlice& sl : table.slices) {
              if (sl.shape.size() != 1) continue;  // the biases (of them only the output projection's is rounded differently)
              for (int64_t i = 0; i < sl.numel(); ++i)
                bias_max = std::max(bias_max, std::abs(double(v.params[std::size_t(sl.offset + i)])));
            }
            for (std::size_t i = 0; i < f.y.size(); ++i) {
              INFO("element " << i << ": " << b.y[i] << " against " << f.y[i]);
              // Half a bf16 unit is at most 2^-8 of the value; the bias's rounding at most 2^-8 of it.
              CHECK(std::abs(b.y[i] - f.y[i]) <= 0x1p-8 * std::abs(f.y[i]) + 0x1p-7 * bias_max + 1e-5 * scale);
            }
          }
        }
      }
    }
  }
}

int main(int argc, char** argv) {
  if (!cuda::device_available()) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  int rc = 0;
  {
    Suite s;
    g_suite = &s;
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
    g_suite = nullptr;
  }
  return rc;
}
