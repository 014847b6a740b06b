// `adamw8bit` on the CPU (registered for device "cpu"): the state in host memory, a step over its
// blocks with OpenMP (a block never spans two slices; blocks are independent, so results do not
// depend on the thread count). Per block, in fp32: decode m and v, update them and the parameters
// (adamw8bit_math.hpp), then take the block's new absmax of each moment and encode. This is the
// reference the CUDA implementation matches bit for bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ablate/error.hpp"
#include "adamw8bit_state.hpp"

namespace ablate::adamw8bit {
namespace {

// adamw8bit_math.hpp's operations as the CPU's operators: each rounded once, never contracted
// into an FMA (the plugin is compiled with -ffp-contract=off).
struct HostOps {
  static float mul(float a, float b) { return a * b; }
  static float add(float a, float b) { return a + b; }
  static float sub(float a, float b) { return a - b; }
  static float div(float a, float b) { return a / b; }
  static float sqrt(float a) { return std::sqrt(a); }
};

class CpuAdamW8bit final : public AdamW8bitState {
 public:
  using AdamW8bitState::AdamW8bitState;

  void init(const ParamTable& table, DeviceType device) override {
    if (device != DeviceType::cpu) {
      throw_input_error("optimizer.name", "adamw8bit's CPU implementation (registered for run.device = \"cpu\") was given "
                                          "another device");
    }
    plan(table);
  }

  void step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) override;

  int64_t skipped_nonfinite() const override { return skipped_; }

 private:
  // A block's update in fp32, exactly as adamw: m and v (n) hold the moments in and out. An element
  // whose gradient, or its square, is not finite keeps its p, m and v. Returns the count of those.
  static int64_t update_block(const Coefficients& c, float decay, float* p, const float* g, float* m, float* v, int64_t n) {
    int64_t skipped = 0;
    for (int64_t i = 0; i < n; ++i) skipped += update_element<HostOps>(c, decay, p[i], g[i], m[i], v[i]) ? 0 : 1;
    return skipped;
  }

  int64_t step_block_8bit(const Coefficients& c, float decay, float* p, const float* g, int64_t n, int64_t code0, int64_t block,
                          float* m, float* v);

  std::size_t slice_of_block(int64_t b) const {
    const auto it =
        std::upper_bound(slices_.begin(), slices_.end(), b, [](int64_t x, const SliceState& s) { return x < s.first_block; });
    return std::size_t(it - slices_.begin()) - 1;
  }
};

void CpuAdamW8bit::step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) {
  const Coefficients c = begin_step(table, params, grads, args);
  if (params.device != DeviceType::cpu || grads.device != DeviceType::cpu) {
    throw_runtime_error(kName, "initialised on the CPU but given device buffers");
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
      const int64_t j0 = (b - s.first_block) * bs;   // first element of the block in its slice
      const int64_t n = std::min(bs, s.numel - j0);  // the last block of a slice may be short
      const float decay = table.slices[si].decay ? c.decay : 1.0f;
      float* pb = p + s.param_offset + j0;
      const float* gb = g + s.param_offset + j0;
      if (s.quantized) {
        skipped += step_block_8bit(c, decay, pb, gb, n, s.state_offset + j0, s.absmax_offset + (b - s.first_block), scratch.data(),
                                   scratch.data() + bs);
      } else {
        skipped += update_block(c, decay, pb, gb, m_fp32_.data() + s.state_offset + j0, v_fp32_.data() + s.state_offset + j0, n);
      }
    }
  }
  skipped_ = skipped;
  warn_skipped(args.step, skipped);
}

// m, v: (n) scratch for the block's moments, decoded, updated, then encoded against the new absmax.
int64_t CpuAdamW8bit::step_block_8bit(const Coefficients& c, float decay, float* p, const float* g, int64_t n, int64_t code0,
                                      int64_t block, float* m, float* v) {
  uint8_t* mc = m_codes_.data() + code0;
  uint8_t* vc = v_codes_.data() + code0;
  const float m_scale = m_absmax_[std::size_t(block)], v_scale = v_absmax_[std::size_t(block)];
  const float* m_values = signed_.values().data();
  const float* v_values = unsigned_.values().data();
  for (int64_t i = 0; i < n; ++i) {
    m[i] = decode<HostOps>(m_values, mc[i], m_scale);
    v[i] = decode<HostOps>(v_values, vc[i], v_scale);
  }
  const int64_t skipped = update_block(c, decay, p, g, m, v, n);
  float m_max = 0.0f, v_max = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    m_max = std::max(m_max, std::fabs(m[i]));
    v_max = std::max(v_max, v[i]);
  }
  m_absmax_[std::size_t(block)] = m_max;
  v_absmax_[std::size_t(block)] = v_max;
  // encode<HostOps> for each value, through the code maps' bucket table (the same codes, faster);
  // an all-zero block is all zero codes.
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

}  // namespace

std::unique_ptr<Optimizer> make_cpu(Hyper h) { return std::make_unique<CpuAdamW8bit>(std::move(h)); }

}  // namespace ablate::adamw8bit
