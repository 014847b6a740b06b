// adamw8bit's host side common to both devices (adamw8bit_state.hpp): the layout of the state,
// the checks and coefficients of a step, and the checkpoint format.
#include "adamw8bit_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include <spdlog/spdlog.h>

#include "ablate/error.hpp"

namespace ablate::adamw8bit {

namespace {

constexpr const char* kStateWhere = "adamw8bit state";

// The tensors of a state, in the order save_state writes them (and find_tensors returns them).
constexpr const char* kTensorNames[] = {"exp_avg.codes",     "exp_avg.absmax",  "exp_avg.fp32",   "exp_avg.map", "exp_avg_sq.codes",
                                        "exp_avg_sq.absmax", "exp_avg_sq.fp32", "exp_avg_sq.map", "block_size",  "quantized_slices"};
constexpr std::size_t kTensors = std::size(kTensorNames);

template <class C>
NamedTensor pack(const char* name, DType dtype, const C& v) {
  using T = typename C::value_type;
  NamedTensor t{name, dtype, {int64_t(v.size())}, {}};
  t.bytes.resize(v.size() * sizeof(T));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

template <class T>
void unpack(const NamedTensor& t, std::vector<T>& dst) {
  if (!t.bytes.empty()) std::memcpy(dst.data(), t.bytes.data(), t.bytes.size());
}

void require(const NamedTensor& t, DType dtype, int64_t n, const char* what) {
  const bool ok = t.dtype == dtype && t.shape.size() == 1 && t.shape[0] == n && t.bytes.size() == std::size_t(n) * dtype_size(dtype);
  if (!ok) {
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    throw_input_error(kStateWhere, "tensor '" + t.name + "' is " + to_string(t.dtype) + " [" + shape + "], expected " +
                                       to_string(dtype) + " [" + std::to_string(n) + "] (" + what +
                                       "); was it written for another model or configuration?");
  }
}

// Each expected tensor of `state`, in kTensorNames' order; an unknown or missing one is refused.
std::vector<const NamedTensor*> find_tensors(const std::vector<NamedTensor>& state) {
  std::vector<const NamedTensor*> found(kTensors, nullptr);
  for (const NamedTensor& t : state) {
    const auto it = std::find(std::begin(kTensorNames), std::end(kTensorNames), t.name);
    if (it == std::end(kTensorNames)) {
      throw_input_error(kStateWhere, "unexpected tensor '" + t.name + "' (was it written by another optimizer?)");
    }
    found[std::size_t(it - std::begin(kTensorNames))] = &t;
  }
  for (std::size_t i = 0; i < kTensors; ++i) {
    if (found[i] == nullptr) throw_input_error(kStateWhere, "tensor '" + std::string(kTensorNames[i]) + "' is missing");
  }
  return found;
}

void check_absmax(const NamedTensor& t) {
  for (std::size_t i = 0; i < t.bytes.size() / 4; ++i) {
    float a = 0.0f;
    std::memcpy(&a, t.bytes.data() + 4 * i, 4);
    if (!(std::isfinite(a) && a >= 0.0f)) {
      throw_input_error(kStateWhere, "tensor '" + t.name + "' holds a negative or non-finite absmax at block " + std::to_string(i));
    }
  }
}

}  // namespace

AdamW8bitState::AdamW8bitState(Hyper h) : h_(std::move(h)), signed_(DynamicCode::make(true)), unsigned_(DynamicCode::make(false)) {
  if (!h_.fp32_state_pattern.empty()) pattern_ = std::regex(h_.fp32_state_pattern, std::regex::ECMAScript);
}

void AdamW8bitState::plan(const ParamTable& table) {
  slices_.clear();
  int64_t codes = 0, absmax = 0, fp32 = 0, blocks = 0;
  for (const ParamSlice& s : table.slices) {
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
}

Coefficients AdamW8bitState::begin_step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) const {
  const double lr = args.lr;
  const int64_t step = args.step;
  if (!initialised_) throw_runtime_error(kName, "step before init");
  if (step < 1) throw_runtime_error(kName, "step counts from 1");
  check_table(table);
  if (params.numel() != total_ || grads.numel() != total_) {
    throw_runtime_error(kName, "parameter or gradient buffer does not match the parameter table");
  }
  // The same coefficients, rounded the same way, as adamw.
  const double bias1 = 1.0 - std::pow(h_.beta1, double(step));
  const double bias2 = 1.0 - std::pow(h_.beta2, double(step));
  return Coefficients{float(lr / bias1), float(std::sqrt(bias2)), float(h_.beta1),       float(h_.beta2),
                      float(h_.eps),     float(1.0 - h_.beta1),   float(1.0 - h_.beta2), float(1.0 - lr * h_.weight_decay),
                      args.grad_scale};
}

void AdamW8bitState::warn_skipped(int64_t step, int64_t skipped) const {
  if (skipped > 0) {
    spdlog::warn("adamw8bit: step {}: {} of {} gradient elements were not finite; their parameters and moments were left as they were",
                 step, skipped, total_);
  }
}

int64_t AdamW8bitState::state_bytes() const {
  return int64_t(m_codes_.size() + v_codes_.size()) + int64_t(m_absmax_.size() + v_absmax_.size()) * 4 +
         int64_t(m_fp32_.size() + v_fp32_.size()) * 4 + 2 * DynamicCode::kCodes * 4;
}

std::vector<NamedTensor> AdamW8bitState::save_state() const {
  download_state();
  std::vector<uint8_t> quantized(slices_.size());
  for (std::size_t i = 0; i < slices_.size(); ++i) quantized[i] = slices_[i].quantized ? 1 : 0;
  const int32_t bs = int32_t(h_.block_size);
  return {pack("exp_avg.codes", DType::u8, m_codes_),
          pack("exp_avg.absmax", DType::f32, m_absmax_),
          pack("exp_avg.fp32", DType::f32, m_fp32_),
          pack("exp_avg.map", DType::f32, signed_.values()),
          pack("exp_avg_sq.codes", DType::u8, v_codes_),
          pack("exp_avg_sq.absmax", DType::f32, v_absmax_),
          pack("exp_avg_sq.fp32", DType::f32, v_fp32_),
          pack("exp_avg_sq.map", DType::f32, unsigned_.values()),
          pack("block_size", DType::i32, std::vector<int32_t>{bs}),
          pack("quantized_slices", DType::u8, quantized)};
}

// The state's block size and which slices it quantized must be this run's.
void AdamW8bitState::check_layout(const NamedTensor& bs, const NamedTensor& qs) const {
  require(bs, DType::i32, 1, "one int32");
  int32_t saved_bs = 0;
  std::memcpy(&saved_bs, bs.bytes.data(), 4);
  if (saved_bs != h_.block_size) {
    throw_input_error(kStateWhere, "the state was written with block_size " + std::to_string(saved_bs) +
                                       "; this run has optimizer.adamw8bit.block_size = " + std::to_string(h_.block_size));
  }
  require(qs, DType::u8, int64_t(slices_.size()), "one flag per parameter slice");
  for (std::size_t i = 0; i < slices_.size(); ++i) {
    if ((qs.bytes[i] != 0) != slices_[i].quantized) {
      throw_input_error(kStateWhere, "slice '" + slices_[i].name + "' has " + (qs.bytes[i] ? "8-bit" : "fp32") +
                                         " moments in the state but " + (slices_[i].quantized ? "8-bit" : "fp32") +
                                         " moments in this run (min_8bit_size or fp32_state_pattern differ)");
    }
  }
}

void AdamW8bitState::load_state(const std::vector<NamedTensor>& state) {
  if (!initialised_) throw_runtime_error(kName, "load_state before init");
  const std::vector<const NamedTensor*> found = find_tensors(state);
  const NamedTensor &mc = *found[0], &ma = *found[1], &mf = *found[2], &mm = *found[3], &vc = *found[4], &va = *found[5],
                    &vf = *found[6], &vm = *found[7];
  check_layout(*found[8], *found[9]);
  require(mm, DType::f32, DynamicCode::kCodes, "the 256 values of the signed code map");
  require(vm, DType::f32, DynamicCode::kCodes, "the 256 values of the unsigned code map");
  if (std::memcmp(mm.bytes.data(), signed_.values().data(), mm.bytes.size()) != 0 ||
      std::memcmp(vm.bytes.data(), unsigned_.values().data(), vm.bytes.size()) != 0) {
    throw_input_error(kStateWhere, "the state's code maps differ from this build's; its codes cannot be read");
  }
  require(mc, DType::u8, int64_t(m_codes_.size()), "one code per element of the 8-bit slices");
  require(vc, DType::u8, int64_t(v_codes_.size()), "one code per element of the 8-bit slices");
  require(ma, DType::f32, int64_t(m_absmax_.size()), "one absmax per block of the 8-bit slices");
  require(va, DType::f32, int64_t(v_absmax_.size()), "one absmax per block of the 8-bit slices");
  require(mf, DType::f32, int64_t(m_fp32_.size()), "one value per element of the fp32 slices");
  require(vf, DType::f32, int64_t(v_fp32_.size()), "one value per element of the fp32 slices");
  check_absmax(ma);
  check_absmax(va);
  unpack(mc, m_codes_);
  unpack(vc, v_codes_);
  unpack(ma, m_absmax_);
  unpack(va, v_absmax_);
  unpack(mf, m_fp32_);
  unpack(vf, v_fp32_);
  upload_state();
}

bool AdamW8bitState::keeps_8bit(const std::string& name, int64_t numel) const {
  if (numel < h_.min_8bit_size) return false;
  return !(pattern_ && std::regex_search(name, *pattern_));
}

void AdamW8bitState::check_table(const ParamTable& table) const {
  bool same = table.total == total_ && table.slices.size() == slices_.size();
  for (std::size_t i = 0; same && i < slices_.size(); ++i) {
    same = table.slices[i].offset == slices_[i].param_offset && table.slices[i].numel() == slices_[i].numel;
  }
  if (!same) throw_runtime_error(kName, "the parameter table differs from the one given to init");
}

}  // namespace ablate::adamw8bit
