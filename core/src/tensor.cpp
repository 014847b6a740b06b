// DType sizes and names, the named-slice table of flat buffers, and the batch helpers.
#include "ablate/batch.hpp"
#include "ablate/tensor.hpp"

#include <deque>
#include <mutex>
#include <stdexcept>
#include <algorithm>

namespace ablate {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u16: return 2;
    case DType::u8: return 1;
    case DType::f64: return 8;
  }
  return 0;
}

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
    case DType::u8: return "u8";
    case DType::f64: return "f64";
  }
  return "unknown";
}

namespace {

// The interned names, in the order they were first asked for: the built-in two first.
struct DeviceNames {
  std::mutex mutex;
  std::deque<std::string> names{"cpu", "cuda"};  // a deque: a name's storage never moves
};
DeviceNames& device_names() {
  static DeviceNames n;
  return n;
}

}  // namespace

DeviceType DeviceType::named(std::string_view name) {
  DeviceNames& n = device_names();
  const std::lock_guard lock(n.mutex);
  for (std::size_t i = 0; i < n.names.size(); ++i) {
    if (n.names[i] == name) return DeviceType(uint16_t(i));
  }
  if (n.names.size() >= 0xffff) throw std::length_error("more than 65535 device names");
  n.names.emplace_back(name);
  return DeviceType(uint16_t(n.names.size() - 1));
}

const char* DeviceType::name() const noexcept {
  DeviceNames& n = device_names();
  const std::lock_guard lock(n.mutex);
  return n.names[id_].c_str();
}

const char* to_string(DeviceType device) noexcept { return device.name(); }

const ParamSlice* ParamTable::find(const std::string& name) const {
  for (const ParamSlice& s : slices) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

int64_t ParamTable::add(std::string name, std::vector<int64_t> shape, bool decay, double init_std, double init_value) {
  ParamSlice slice{std::move(name), total, std::move(shape), decay, init_std, init_value};
  total += slice.numel();
  slices.push_back(std::move(slice));
  return slices.back().offset;
}

}  // namespace ablate
