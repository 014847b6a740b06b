// The NF4 base of a model ([adapter] base_dtype = "nf4", docs/finetuning.md): every 2-D weight of
// the frozen base's linear and MLP sites held as 4-bit codes and fp32 block scales (nf4.hpp)
// instead of in the model's fp32 parameter buffer, which then holds every other tensor in table
// order. A site whose parameters include one gets them dequantized (and its other parameters
// copied) into one staging buffer, the size of the largest such site's, before each call.
#pragma once

#include <cstdint>
#include <vector>

#include "ablate/device.hpp"
#include "ablate/tensor.hpp"
#include "model_schedule.hpp"

namespace ablate::schedule {

class Nf4Base {
 public:
  // Which tensors are held in NF4: the 2-D slices of the sites whose layer is `lin` or `mlp`
  // (none when `on` is false). Each site's parameter range is known from here on.
  void plan(bool on, const ParamTable& table, const Schedule& sched, const Layer* lin, const Layer* mlp);
  void allocate(Device& device);
  bool empty() const noexcept { return tensors_.empty(); }
  // Values held in NF4, and the bytes their codes and scales take; every buffer's bytes.
  int64_t values() const noexcept { return tensors_.empty() ? 0 : tensors_.back().before + tensors_.back().numel; }
  int64_t nf4_bytes() const noexcept { return codes_.bytes() + absmax_.bytes(); }
  int64_t bytes() const noexcept { return nf4_bytes() + staging_.bytes(); }
  // Where table offset x (not inside an NF4 tensor) lives in the fp32 buffer.
  int64_t stored(int64_t x) const;
  // Site s's parameters: `params` from its first on, or its staging copy with the NF4 tensors
  // dequantized (`table` names its slices).
  TensorView site_params(const Site& s, const Buffer& params, const ParamTable& table, Device& device) const;
  // The whole table through host memory: `out` (table.total) from the fp32 buffer and the codes;
  // `values` (table.total) into them. A value that is not finite cannot be quantized: an input error.
  void download(Device& device, const Buffer& params, const ParamTable& table, std::vector<float>& out) const;
  void upload(Device& device, const Buffer& params, const ParamTable& table, const std::vector<float>& values) const;

 private:
  struct Tensor {
    int64_t offset = 0, numel = 0;  // in the table
    int64_t codes = 0, scales = 0;  // offsets into codes_ and absmax_
    int64_t before = 0;             // values of the NF4 tensors before it
  };
  // The parameters [begin, end) of a site that holds an NF4 tensor, found by its first offset.
  struct Staged {
    int64_t begin = 0, end = 0;
  };
  const Tensor* at(int64_t offset) const;
  std::vector<Tensor> tensors_;  // by table offset
  std::vector<Staged> staged_;   // by begin
  Buffer codes_, absmax_, staging_;
};

}  // namespace ablate::schedule
