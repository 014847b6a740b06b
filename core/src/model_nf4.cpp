// The NF4 base (model_nf4.hpp).
#include "model_nf4.hpp"

#include <algorithm>

#include "ablate/error.hpp"
#include "ablate/nf4.hpp"

namespace ablate::schedule {

void Nf4Base::plan(bool on, const ParamTable& table, const Schedule& sched, const Layer* lin, const Layer* mlp) {
  std::vector<int64_t> starts{table.total, sched.head};
  for (const Site& s : sched.sites) {
    if (s.param >= 0) starts.push_back(s.param);
    if (s.adapter_param >= 0) starts.push_back(s.adapter_param);
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  if (!on) return;
  int64_t codes = 0, scales = 0, before = 0;
  for (const Site& s : sched.sites) {  // in table order: the sites declared their parameters in turn
    if (s.param < 0 || (s.layer != lin && s.layer != mlp)) continue;
    const int64_t end = *std::upper_bound(starts.begin(), starts.end(), s.param);
    for (const ParamSlice& slice : table.slices) {
      if (slice.offset < s.param || slice.offset >= end || slice.shape.size() != 2) continue;
      tensors_.push_back({slice.offset, slice.numel(), codes, scales, before});
      codes += nf4::code_bytes(slice.numel());
      scales += nf4::blocks(slice.numel());
      before += slice.numel();
    }
    staged_.push_back({s.param, end});
  }
}

void Nf4Base::allocate(Device& device) {
  if (tensors_.empty()) return;
  const Tensor& last = tensors_.back();
  int64_t largest = 0;
  for (const Staged& r : staged_) largest = std::max(largest, r.end - r.begin);
  codes_ = device.alloc(DType::u8, last.codes + nf4::code_bytes(last.numel));
  absmax_ = device.alloc(DType::f32, last.scales + nf4::blocks(last.numel));
  staging_ = device.alloc(DType::f32, largest);
}

int64_t Nf4Base::stored(int64_t x) const {
  int64_t skipped = 0;
  for (const Tensor& t : tensors_) {
    if (t.offset >= x) break;
    skipped = t.before + t.numel;
  }
  return x - skipped;
}

const Nf4Base::Tensor* Nf4Base::at(int64_t offset) const {
  for (const Tensor& t : tensors_) {
    if (t.offset == offset) return &t;
  }
  return nullptr;
}

TensorView Nf4Base::site_params(const Site& s, const Buffer& params, const ParamTable& table, Device& device) const {
  const auto r = std::lower_bound(staged_.begin(), staged_.end(), s.param, [](const Staged& a, int64_t x) { return a.begin < x; });
  if (r == staged_.end() || r->begin != s.param) return params.view(stored(s.param), params.count() - stored(s.param));
  const auto [begin, end] = *r;
  for (const ParamSlice& slice : table.slices) {
    if (slice.offset < begin || slice.offset >= end) continue;
    const TensorView to = staging_.view(slice.offset - begin, slice.numel());
    if (const Tensor* t = at(slice.offset)) {
      device.dequantize_nf4(to, codes_.view(t->codes, nf4::code_bytes(t->numel)), absmax_.view(t->scales, nf4::blocks(t->numel)));
    } else {
      device.copy(to, params.view(stored(slice.offset), slice.numel()));
    }
  }
  return staging_.view(0, end - begin);
}

void Nf4Base::download(Device& device, const Buffer& params, const ParamTable& table, std::vector<float>& out) const {
  std::vector<float> held(std::size_t(params.count())), scales(std::size_t(absmax_.count()));
  std::vector<uint8_t> codes(std::size_t(codes_.count()));
  device.download(held.data(), params.view());
  device.download(codes.data(), codes_.view());
  device.download(scales.data(), absmax_.view());
  out.resize(std::size_t(table.total));
  for (const ParamSlice& s : table.slices) {
    float* to = out.data() + s.offset;
    if (const Tensor* t = at(s.offset)) {
      for (int64_t i = 0; i < t->numel; ++i) to[i] = nf4::value(codes.data() + t->codes, scales.data() + t->scales, i);
    } else {
      std::copy_n(held.data() + stored(s.offset), s.numel(), to);
    }
  }
}

void Nf4Base::upload(Device& device, const Buffer& params, const ParamTable& table, const std::vector<float>& values) const {
  std::vector<float> held(std::size_t(params.count())), scales(std::size_t(absmax_.count()));
  std::vector<uint8_t> codes(std::size_t(codes_.count()), 0);
  for (const ParamSlice& s : table.slices) {
    const float* from = values.data() + s.offset;
    if (const Tensor* t = at(s.offset)) {
      if (!nf4::quantize(from, t->numel, codes.data() + t->codes, scales.data() + t->scales)) {
        throw_input_error("adapter.base_dtype", "'" + s.name + "' holds a value that is not finite: it cannot be held in NF4");
      }
    } else {
      std::copy_n(from, s.numel(), held.data() + stored(s.offset));
    }
  }
  device.upload(params.view(), held.data());
  device.upload(codes_.view(), codes.data());
  device.upload(absmax_.view(), scales.data());
}

}  // namespace ablate::schedule
