// The `adamw8bit` optimizer on the CPU: adamw's maths (PyTorch AdamW: decoupled weight decay on the
// parameter before the moment update, bias corrections, eps after the bias-corrected sqrt(v)) with
// both moments held as 8-bit codes, block-wise quantized (Dettmers et al. 2022; the code maps are
// built in dynamic_code.hpp). Per block of `block_size` values of one slice: one fp32 absmax per
// moment; the first moment on the signed map, the second on the unsigned map. Slices under
// `min_8bit_size` elements, or whose name matches `fp32_state_pattern` (none by default; '^w[tp]e\.'
// picks the embeddings `wte` and `wpe`, as bitsandbytes' StableEmbedding keeps its optimizer state
// in 32 bits), keep fp32 moments, updated exactly as adamw does.
//
// A step, per block and element, in fp32: decode m and v, update them with the gradient, update the
// parameter from the new (unquantized) m and v, then take the block's new absmax of each moment and
// encode. An element whose gradient (or its square) is not finite leaves its parameter and moments
// as they were (its moments are re-encoded against the block's new absmax); skipped_nonfinite()
// counts such elements in the last step, and a step that skipped any logs a warning.
// OpenMP over blocks (a block never spans two slices); blocks are independent, so results do not
// depend on the thread count.
//
// On a CUDA device (builds with CUDA; init(table, cuda)) the same state lives in device memory and
// one kernel per step (adamw8bit_kernel.cu) does the same arithmetic, bit for bit; save_state and
// load_state go through the host copies, so a checkpoint is the same on either device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/plugin.hpp"
#include "dynamic_code.hpp"

#ifdef ABLATE_ADAMW8BIT_CUDA
#include "ablate/cuda_check.hpp"
#include "adamw8bit_kernel.hpp"
#endif

namespace {

using ablate::adamw8bit::DynamicCode;

constexpr const char* kName = "adamw8bit";
constexpr const char* kStateWhere = "adamw8bit state";

struct Hyper {
  double weight_decay, beta1, beta2, eps;
  int64_t block_size;
  int64_t min_8bit_size;
  std::string fp32_state_pattern;  // "" = none
};

// Where one parameter slice keeps its moments.
struct SliceState {
  std::string name;
  int64_t param_offset = 0, numel = 0;
  bool quantized = false;
  int64_t state_offset = 0;   // into the code arrays (quantized) or the fp32 arrays
  int64_t absmax_offset = 0;  // first block's absmax (quantized only)
  int64_t first_block = 0;    // first work block of this slice (every slice is cut into block_size pieces)
};

class AdamW8bit final : public ablate::Optimizer {
 public:
  explicit AdamW8bit(Hyper h)
      : h_(std::move(h)), signed_(DynamicCode::make(true)), unsigned_(DynamicCode::make(false)) {
    if (!h_.fp32_state_pattern.empty()) pattern_ = std::regex(h_.fp32_state_pattern, std::regex::ECMAScript);
  }

  void init(const ablate::ParamTable& table, ablate::DeviceType device) override {
#ifndef ABLATE_ADAMW8BIT_CUDA
    if (device != ablate::DeviceType::cpu) {
      ablate::throw_input_error("optimizer.name", "this build of adamw8bit has no CUDA kernel (built without the CUDA toolkit)");
    }
#else
    if (device == ablate::DeviceType::cuda && h_.block_size > ablate::adamw8bit::cuda::kMaxBlockSize) {
      ablate::throw_input_error("optimizer.adamw8bit.block_size", std::to_string(h_.block_size) +
                                                                     " is above the CUDA kernel's largest block, " +
                                                                     std::to_string(ablate::adamw8bit::cuda::kMaxBlockSize));
    }
#endif
    device_ = device;
    slices_.clear();
    int64_t codes = 0, absmax = 0, fp32 = 0, blocks = 0;
    for (const ablate::ParamSlice& s : table.slices) {
      SliceState st;
      st.name = s.name;
      st.param_offset = s.offset;
      st.numel = s.numel();
      st.quantized = keeps_8bit(s.name, st.numel);
      st.first_block = blocks;
      const int64_t nb = (st.numel + h_.block_size - 1) / h_.block_size;
      blocks += nb;
      if (st.quantized) {
        st.state_offset = codes;
        st.absmax_offset = absmax;
        codes += st.numel;
        absmax += nb;
      } else {
        st.state_offset = fp32;
        fp32 += st.numel;
      }
      slices_.push_back(std::move(st));
    }
    total_ = table.total;
    blocks_ = blocks;
    m_codes_.assign(std::size_t(codes), signed_.zero_code());
    v_codes_.assign(std::size_t(codes), unsigned_.zero_code());
    m_absmax_.assign(std::size_t(absmax), 0.0f);
    v_absmax_.assign(std::size_t(absmax), 0.0f);
    m_fp32_.assign(std::size_t(fp32), 0.0f);
    v_fp32_.assign(std::size_t(fp32), 0.0f);
    skipped_ = 0;
    initialised_ = true;
#ifdef ABLATE_ADAMW8BIT_CUDA
    if (device_ == ablate::DeviceType::cuda) init_device(table);
#endif
  }

  void step(const ablate::ParamTable& table, ablate::TensorView params, ablate::TensorView grads,
            const ablate::StepArgs& args) override {
    const double lr = args.lr;
    const int64_t step = args.step;
    if (!initialised_) ablate::throw_runtime_error(kName, "step before init");
    if (step < 1) ablate::throw_runtime_error(kName, "step counts from 1");
    check_table(table);
    if (params.numel() != total_ || grads.numel() != total_) {
      ablate::throw_runtime_error(kName, "parameter or gradient buffer does not match the parameter table");
    }
    // The same coefficients, rounded the same way, as adamw.
    const double bias1 = 1.0 - std::pow(h_.beta1, double(step));
    const double bias2 = 1.0 - std::pow(h_.beta2, double(step));
    const Coefficients c{float(lr / bias1),
                         float(std::sqrt(bias2)),
                         float(h_.beta1),
                         float(h_.beta2),
                         float(h_.eps),
                         float(1.0 - h_.beta1),
                         float(1.0 - h_.beta2),
                         float(1.0 - lr * h_.weight_decay),
                         args.grad_scale};
    if (device_ == ablate::DeviceType::cuda) {
      step_device(params, grads, c, step, args.stream, args.params_bf16);
      return;
    }
    if (params.device != ablate::DeviceType::cpu || grads.device != ablate::DeviceType::cpu) {
      ablate::throw_runtime_error(kName, "initialised on the CPU but given device buffers");
    }
    float* p = params.as<float>();
    const float* g = grads.as<float>();
    const int64_t bs = h_.block_size;
    int64_t skipped = 0;
#pragma omp parallel reduction(+ : skipped)
    {
      std::vector<float> scratch(std::size_t(2 * bs));  // the block's new m and v before encoding
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks_; ++b) {
        const std::size_t si = slice_of_block(b);
        const SliceState& s = slices_[si];
        const int64_t j0 = (b - s.first_block) * bs;           // first element of the block in its slice
        const int64_t n = std::min(bs, s.numel - j0);           // the last block of a slice may be short
        const float decay = table.slices[si].decay ? c.decay : 1.0f;
        float* pb = p + s.param_offset + j0;
        const float* gb = g + s.param_offset + j0;
        if (s.quantized) {
          skipped += step_block_8bit(c, decay, pb, gb, n, s.state_offset + j0, s.absmax_offset + (b - s.first_block),
                                     scratch.data(), scratch.data() + bs);
        } else {
          skipped += update_block(c, decay, pb, gb, m_fp32_.data() + s.state_offset + j0,
                                  v_fp32_.data() + s.state_offset + j0, n);
        }
      }
    }
    skipped_ = skipped;
    if (skipped > 0) {
      spdlog::warn("adamw8bit: step {}: {} of {} gradient elements were not finite; their parameters and moments were left as they were",
                   step, skipped, total_);
    }
  }

  // Bytes of the moments as held: codes, absmax per block, fp32 moments, and the two code maps.
  int64_t state_bytes() const override {
    return int64_t(m_codes_.size() + v_codes_.size()) + int64_t(m_absmax_.size() + v_absmax_.size()) * 4 +
           int64_t(m_fp32_.size() + v_fp32_.size()) * 4 + 2 * DynamicCode::kCodes * 4;
  }

  // The CUDA kernel writes the bf16 copy as it stores each parameter; the CPU path has no copy to write.
  bool writes_bf16() const override { return device_ == ablate::DeviceType::cuda; }

  int64_t skipped_nonfinite() const override {
    collect_skipped();
    return skipped_;
  }

  std::vector<ablate::NamedTensor> save_state() const override {
#ifdef ABLATE_ADAMW8BIT_CUDA
    if (device_ == ablate::DeviceType::cuda) download_state();
#endif
    std::vector<uint8_t> quantized(slices_.size());
    for (std::size_t i = 0; i < slices_.size(); ++i) quantized[i] = slices_[i].quantized ? 1 : 0;
    const int32_t bs = int32_t(h_.block_size);
    return {pack("exp_avg.codes", ablate::DType::u8, m_codes_),
            pack("exp_avg.absmax", ablate::DType::f32, m_absmax_),
            pack("exp_avg.fp32", ablate::DType::f32, m_fp32_),
            pack("exp_avg.map", ablate::DType::f32, signed_.values()),
            pack("exp_avg_sq.codes", ablate::DType::u8, v_codes_),
            pack("exp_avg_sq.absmax", ablate::DType::f32, v_absmax_),
            pack("exp_avg_sq.fp32", ablate::DType::f32, v_fp32_),
            pack("exp_avg_sq.map", ablate::DType::f32, unsigned_.values()),
            pack("block_size", ablate::DType::i32, std::vector<int32_t>{bs}),
            pack("quantized_slices", ablate::DType::u8, quantized)};
  }

  // Checks everything before changing anything: a refused state leaves the optimizer as it was.
  void load_state(const std::vector<ablate::NamedTensor>& state) override {
    if (!initialised_) ablate::throw_runtime_error(kName, "load_state before init");
    const std::vector<std::string> expected = {"exp_avg.codes",    "exp_avg.absmax",    "exp_avg.fp32",    "exp_avg.map",
                                               "exp_avg_sq.codes", "exp_avg_sq.absmax", "exp_avg_sq.fp32", "exp_avg_sq.map",
                                               "block_size",       "quantized_slices"};
    std::vector<const ablate::NamedTensor*> found(expected.size(), nullptr);
    for (const ablate::NamedTensor& t : state) {
      const auto it = std::find(expected.begin(), expected.end(), t.name);
      if (it == expected.end()) {
        ablate::throw_input_error(kStateWhere, "unexpected tensor '" + t.name + "' (was it written by another optimizer?)");
      }
      found[std::size_t(it - expected.begin())] = &t;
    }
    for (std::size_t i = 0; i < expected.size(); ++i) {
      if (found[i] == nullptr) ablate::throw_input_error(kStateWhere, "tensor '" + expected[i] + "' is missing");
    }
    const auto get = [&](const char* name) -> const ablate::NamedTensor& {
      return *found[std::size_t(std::find(expected.begin(), expected.end(), name) - expected.begin())];
    };
    const ablate::NamedTensor &mc = get("exp_avg.codes"), &ma = get("exp_avg.absmax"), &mf = get("exp_avg.fp32"),
                              &mm = get("exp_avg.map"), &vc = get("exp_avg_sq.codes"), &va = get("exp_avg_sq.absmax"),
                              &vf = get("exp_avg_sq.fp32"), &vm = get("exp_avg_sq.map"), &bs = get("block_size"),
                              &qs = get("quantized_slices");

    require(bs, ablate::DType::i32, 1, "one int32");
    int32_t saved_bs = 0;
    std::memcpy(&saved_bs, bs.bytes.data(), 4);
    if (saved_bs != h_.block_size) {
      ablate::throw_input_error(kStateWhere, "the state was written with block_size " + std::to_string(saved_bs) +
                                                 "; this run has optimizer.adamw8bit.block_size = " + std::to_string(h_.block_size));
    }
    require(qs, ablate::DType::u8, int64_t(slices_.size()), "one flag per parameter slice");
    for (std::size_t i = 0; i < slices_.size(); ++i) {
      if ((qs.bytes[i] != 0) != slices_[i].quantized) {
        ablate::throw_input_error(kStateWhere, "slice '" + slices_[i].name + "' has " + (qs.bytes[i] ? "8-bit" : "fp32") +
                                                   " moments in the state but " + (slices_[i].quantized ? "8-bit" : "fp32") +
                                                   " moments in this run (min_8bit_size or fp32_state_pattern differ)");
      }
    }
    require(mm, ablate::DType::f32, DynamicCode::kCodes, "the 256 values of the signed code map");
    require(vm, ablate::DType::f32, DynamicCode::kCodes, "the 256 values of the unsigned code map");
    if (std::memcmp(mm.bytes.data(), signed_.values().data(), mm.bytes.size()) != 0 ||
        std::memcmp(vm.bytes.data(), unsigned_.values().data(), vm.bytes.size()) != 0) {
      ablate::throw_input_error(kStateWhere, "the state's code maps differ from this build's; its codes cannot be read");
    }
    require(mc, ablate::DType::u8, int64_t(m_codes_.size()), "one code per element of the 8-bit slices");
    require(vc, ablate::DType::u8, int64_t(v_codes_.size()), "one code per element of the 8-bit slices");
    require(ma, ablate::DType::f32, int64_t(m_absmax_.size()), "one absmax per block of the 8-bit slices");
    require(va, ablate::DType::f32, int64_t(v_absmax_.size()), "one absmax per block of the 8-bit slices");
    require(mf, ablate::DType::f32, int64_t(m_fp32_.size()), "one value per element of the fp32 slices");
    require(vf, ablate::DType::f32, int64_t(v_fp32_.size()), "one value per element of the fp32 slices");
    for (const ablate::NamedTensor* t : {&ma, &va}) {
      for (std::size_t i = 0; i < t->bytes.size() / 4; ++i) {
        float a = 0.0f;
        std::memcpy(&a, t->bytes.data() + 4 * i, 4);
        if (!(std::isfinite(a) && a >= 0.0f)) {
          ablate::throw_input_error(kStateWhere, "tensor '" + t->name + "' holds a negative or non-finite absmax at block " +
                                                     std::to_string(i));
        }
      }
    }
    unpack(mc, m_codes_);
    unpack(vc, v_codes_);
    unpack(ma, m_absmax_);
    unpack(va, v_absmax_);
    unpack(mf, m_fp32_);
    unpack(vf, v_fp32_);
#ifdef ABLATE_ADAMW8BIT_CUDA
    if (device_ == ablate::DeviceType::cuda) upload_state();
#endif
  }

 private:
  struct Coefficients {
    float step_size, sqrt_bias2, b1, b2, eps, one_minus_b1, one_minus_b2, decay, grad_scale;
  };

  bool keeps_8bit(const std::string& name, int64_t numel) const {
    if (numel < h_.min_8bit_size) return false;
    return !(pattern_ && std::regex_search(name, *pattern_));
  }

  void check_table(const ablate::ParamTable& table) const {
    bool same = table.total == total_ && table.slices.size() == slices_.size();
    for (std::size_t i = 0; same && i < slices_.size(); ++i) {
      same = table.slices[i].offset == slices_[i].param_offset && table.slices[i].numel() == slices_[i].numel;
    }
    if (!same) ablate::throw_runtime_error(kName, "the parameter table differs from the one given to init");
  }

  std::size_t slice_of_block(int64_t b) const {
    const auto it = std::upper_bound(slices_.begin(), slices_.end(), b,
                                     [](int64_t x, const SliceState& s) { return x < s.first_block; });
    return std::size_t(it - slices_.begin()) - 1;
  }

  // A block's update in fp32, exactly as adamw: m and v (n) hold the moments in and out. An element
  // whose gradient, or its square, is not finite keeps its p, m and v. Returns the count of those.
  // Every element is computed and the skipped ones are not stored: no branches.
  static int64_t update_block(const Coefficients& c, float decay, float* p, const float* g, float* m, float* v,
                              int64_t n) {
    int64_t skipped = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * c.grad_scale;
      const bool ok = gi * gi <= std::numeric_limits<float>::max();  // false for inf, NaN and overflow
      const float mi = c.b1 * m[i] + c.one_minus_b1 * gi;
      const float vi = c.b2 * v[i] + c.one_minus_b2 * gi * gi;
      const float denom = std::sqrt(vi) / c.sqrt_bias2 + c.eps;
      const float pi = p[i] * decay - c.step_size * mi / denom;
      m[i] = ok ? mi : m[i];
      v[i] = ok ? vi : v[i];
      p[i] = ok ? pi : p[i];
      skipped += ok ? 0 : 1;
    }
    return skipped;
  }

  // m, v: (n) scratch for the block's moments, decoded, updated, then encoded against the new absmax.
  int64_t step_block_8bit(const Coefficients& c, float decay, float* p, const float* g, int64_t n, int64_t code0,
                          int64_t block, float* m, float* v) {
    uint8_t* mc = m_codes_.data() + code0;
    uint8_t* vc = v_codes_.data() + code0;
    const float m_scale = m_absmax_[std::size_t(block)], v_scale = v_absmax_[std::size_t(block)];
    for (int64_t i = 0; i < n; ++i) {
      m[i] = signed_.decode(mc[i]) * m_scale;
      v[i] = unsigned_.decode(vc[i]) * v_scale;
    }
    const int64_t skipped = update_block(c, decay, p, g, m, v, n);
    float m_max = 0.0f, v_max = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      m_max = std::max(m_max, std::fabs(m[i]));
      v_max = std::max(v_max, v[i]);
    }
    m_absmax_[std::size_t(block)] = m_max;
    v_absmax_[std::size_t(block)] = v_max;
    // value / absmax is in [-1, 1] exactly (division rounds correctly); an all-zero block is all zero codes.
    if (m_max > 0.0f) {
      signed_.encode_block(m, m_max, mc, n);
    } else {
      std::fill(mc, mc + n, signed_.zero_code());
    }
    if (v_max > 0.0f) {
      unsigned_.encode_block(v, v_max, vc, n);
    } else {
      std::fill(vc, vc + n, unsigned_.zero_code());
    }
    return skipped;
  }

  template <class C>
  static ablate::NamedTensor pack(const char* name, ablate::DType dtype, const C& v) {
    using T = typename C::value_type;
    ablate::NamedTensor t{name, dtype, {int64_t(v.size())}, {}};
    t.bytes.resize(v.size() * sizeof(T));
    if (!t.bytes.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  }

  template <class T>
  static void unpack(const ablate::NamedTensor& t, std::vector<T>& dst) {
    if (!t.bytes.empty()) std::memcpy(dst.data(), t.bytes.data(), t.bytes.size());
  }

  static void require(const ablate::NamedTensor& t, ablate::DType dtype, int64_t n, const char* what) {
    const bool ok = t.dtype == dtype && t.shape.size() == 1 && t.shape[0] == n &&
                    t.bytes.size() == std::size_t(n) * ablate::dtype_size(dtype);
    if (!ok) {
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      ablate::throw_input_error(kStateWhere, "tensor '" + t.name + "' is " + ablate::to_string(t.dtype) + " [" + shape +
                                                 "], expected " + ablate::to_string(dtype) + " [" + std::to_string(n) +
                                                 "] (" + what + "); was it written for another model or configuration?");
    }
  }

#ifdef ABLATE_ADAMW8BIT_CUDA
  // Device state mirrors the host vectors' layout; one BlockInfo per work block.
  void init_device(const ablate::ParamTable& table) {
    namespace k = ablate::adamw8bit::cuda;
    std::vector<k::BlockInfo> blocks;
    blocks.reserve(std::size_t(blocks_));
    for (std::size_t si = 0; si < slices_.size(); ++si) {
      const SliceState& s = slices_[si];
      for (int64_t j0 = 0, b = 0; j0 < s.numel; j0 += h_.block_size, ++b) {
        k::BlockInfo info;
        info.param_offset = s.param_offset + j0;
        info.state_offset = s.state_offset + j0;
        info.absmax_index = int32_t(s.quantized ? s.absmax_offset + b : 0);
        info.n = int32_t(std::min(h_.block_size, s.numel - j0));
        info.quantized = s.quantized ? 1 : 0;
        info.decay = table.slices[si].decay ? 1 : 0;
        blocks.push_back(info);
      }
    }
    d_blocks_.upload(blocks.data(), blocks.size());
    d_m_values_.upload(signed_.values().data(), signed_.values().size());
    d_v_values_.upload(unsigned_.values().data(), unsigned_.values().size());
    d_m_thresholds_.upload(signed_.thresholds().data(), signed_.thresholds().size());
    d_v_thresholds_.upload(unsigned_.thresholds().data(), unsigned_.thresholds().size());
    d_skipped_.resize(1);
    upload_state();
  }

  void upload_state() {
    // The copies run on the legacy default stream, which the model's non-blocking stream does not
    // order: a step still queued there reads and writes this state, so it finishes first.
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
    d_m_codes_.upload(m_codes_.data(), m_codes_.size());
    d_v_codes_.upload(v_codes_.data(), v_codes_.size());
    d_m_absmax_.upload(m_absmax_.data(), m_absmax_.size());
    d_v_absmax_.upload(v_absmax_.data(), v_absmax_.size());
    d_m_fp32_.upload(m_fp32_.data(), m_fp32_.size());
    d_v_fp32_.upload(v_fp32_.data(), v_fp32_.size());
    // Those copies ran on the legacy default stream, which does not order the model's non-blocking one.
    ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // The host vectors are the staging copies of the device state (refreshed for save_state).
  void download_state() const {
    collect_skipped();  // waits for the last step on its stream
    d_m_codes_.download(m_codes_.data());
    d_v_codes_.download(v_codes_.data());
    d_m_absmax_.download(m_absmax_.data());
    d_v_absmax_.download(v_absmax_.data());
    d_m_fp32_.download(m_fp32_.data());
    d_v_fp32_.download(v_fp32_.data());
  }
#endif

  // The step on the device, enqueued on `stream`. The count of skipped elements stays in device
  // memory: it is read when asked (skipped_nonfinite) or at the start of the next step, when the
  // host has already waited for the gradient norm, so reading it costs no extra wait.
  template <class Coeff>
  void step_device(ablate::TensorView params, ablate::TensorView grads, const Coeff& c, int64_t step, void* stream,
                   void* params_bf16) {
#ifdef ABLATE_ADAMW8BIT_CUDA
    namespace k = ablate::adamw8bit::cuda;
    if (params.device != ablate::DeviceType::cuda || grads.device != ablate::DeviceType::cuda) {
      ablate::throw_runtime_error(kName, "initialised on a CUDA device but given host buffers");
    }
    collect_skipped();
    stream_ = static_cast<cudaStream_t>(stream);
    k::StepArgs a;
    a.params = params.as<float>();
    a.grads = grads.as<float>();
    a.params_bf16 = static_cast<uint16_t*>(params_bf16);
    a.blocks = d_blocks_.data();
    a.num_blocks = int64_t(d_blocks_.size());
    a.m_codes = d_m_codes_.data();
    a.v_codes = d_v_codes_.data();
    a.m_absmax = d_m_absmax_.data();
    a.v_absmax = d_v_absmax_.data();
    a.m_fp32 = d_m_fp32_.data();
    a.v_fp32 = d_v_fp32_.data();
    a.m_map = {d_m_values_.data(), d_m_thresholds_.data(), signed_.zero_code()};
    a.v_map = {d_v_values_.data(), d_v_thresholds_.data(), unsigned_.zero_code()};
    a.c = {c.step_size, c.sqrt_bias2, c.b1, c.b2, c.eps, c.one_minus_b1, c.one_minus_b2, c.decay, c.grad_scale};
    a.skipped = d_skipped_.data();
    ABLATE_CUDA_CHECK(cudaMemsetAsync(d_skipped_.data(), 0, sizeof(unsigned long long), stream_));
    ABLATE_CUDA_CHECK(k::launch_step(a, stream_));
    pending_step_ = step;
#else
    (void)params, (void)grads, (void)c, (void)step, (void)stream, (void)params_bf16;
#endif
  }

  // Reads the device's count of the last enqueued step (waiting for it) and warns when it is not 0.
  void collect_skipped() const {
#ifdef ABLATE_ADAMW8BIT_CUDA
    if (pending_step_ == 0) return;
    unsigned long long skipped = 0;
    ABLATE_CUDA_CHECK(cudaMemcpyAsync(&skipped, d_skipped_.data(), sizeof(skipped), cudaMemcpyDeviceToHost, stream_));
    ABLATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    skipped_ = int64_t(skipped);
    if (skipped_ > 0) {
      spdlog::warn("adamw8bit: step {}: {} of {} gradient elements were not finite; their parameters and moments were left as they were",
                   pending_step_, skipped_, total_);
    }
    pending_step_ = 0;
#endif
  }

  Hyper h_;
  ablate::DeviceType device_ = ablate::DeviceType::cpu;
  DynamicCode signed_, unsigned_;
  std::optional<std::regex> pattern_;
  std::vector<SliceState> slices_;
  int64_t total_ = 0, blocks_ = 0;
  bool initialised_ = false;
  mutable int64_t skipped_ = 0;            // elements skipped in the last step
  mutable int64_t pending_step_ = 0;       // cuda: a step whose count is still on the device (0: none)
#ifdef ABLATE_ADAMW8BIT_CUDA
  cudaStream_t stream_ = nullptr;          // the queue of the last step
#endif
  // On the CPU, the state; on a CUDA device, its staging copies (mutable: save_state refreshes them).
  mutable std::vector<uint8_t> m_codes_;   // (elements of 8-bit slices) first moment, signed map
  mutable std::vector<uint8_t> v_codes_;   // (elements of 8-bit slices) second moment, unsigned map
  mutable std::vector<float> m_absmax_;    // (blocks of 8-bit slices)
  mutable std::vector<float> v_absmax_;    // (blocks of 8-bit slices)
  mutable std::vector<float> m_fp32_;      // (elements of fp32 slices)
  mutable std::vector<float> v_fp32_;      // (elements of fp32 slices)
#ifdef ABLATE_ADAMW8BIT_CUDA
  ablate::cuda::DeviceBuffer<ablate::adamw8bit::cuda::BlockInfo> d_blocks_;
  ablate::cuda::DeviceBuffer<uint8_t> d_m_codes_, d_v_codes_;
  ablate::cuda::DeviceBuffer<float> d_m_absmax_, d_v_absmax_, d_m_fp32_, d_v_fp32_;
  ablate::cuda::DeviceBuffer<float> d_m_values_, d_v_values_, d_m_thresholds_, d_v_thresholds_;
  ablate::cuda::DeviceBuffer<unsigned long long> d_skipped_;
#endif
};

ablate::Schema schema() {
  using namespace ablate::param;
  return {
      integer("block_size", 256, "values per block of the 8-bit moments; each block has one fp32 absmax per moment")
          .within(1, 1 << 20),
      integer("min_8bit_size", 4096, "slices with fewer elements keep fp32 moments (0 = none by size)").at_least(0),
      string("fp32_state_pattern", "",
             "slices whose name matches this regex (ECMAScript, searched) keep fp32 moments, e.g. '^w[tp]e\\.' for the "
             "embeddings as bitsandbytes' StableEmbedding does; \"\" = none"),
  };
}

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::optimizer, kName, "1.0.0",
         "AdamW with block-wise 8-bit moments (about 2 bytes of state per parameter), on the CPU or a CUDA device", schema(),
         [](const ablate::ComponentArgs& a) {
           Hyper h{a.common.get_float("weight_decay"), a.common.get_float("beta1"), a.common.get_float("beta2"),
                   a.common.get_float("eps"),          a.own.get_int("block_size"), a.own.get_int("min_8bit_size"),
                   a.own.get_string("fp32_state_pattern")};
           try {
             return std::make_unique<AdamW8bit>(std::move(h));
           } catch (const std::regex_error& e) {
             ablate::throw_input_error(a.own.path() + ".fp32_state_pattern",
                                       "'" + a.own.get_string("fp32_state_pattern") + "' is not a valid regular expression: " +
                                           e.what());
           }
         },
         "", {"cpu", "cuda"}});
}

}  // namespace

ABLATE_PLUGIN("adamw8bit", "1.0.0", register_components)
