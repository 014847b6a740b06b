// What the two implementations of `adamw8bit` (adamw8bit_cpu.cpp, adamw8bit_cuda.cpp) have in
// common on the host: the hyperparameters, where each parameter slice keeps its moments, the state
// in host vectors (the state itself on the CPU, its staging copies on a CUDA device), the checks a
// step makes and its coefficients, and the checkpoint format (save_state, load_state), so a state
// saved on either device loads on the other.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "ablate/optimizer.hpp"
#include "adamw8bit_math.hpp"
#include "dynamic_code.hpp"

namespace ablate::adamw8bit {

inline constexpr const char* kName = "adamw8bit";

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

// The implementations, one per device; each throws std::regex_error for an invalid
// fp32_state_pattern. make_cuda is defined only where CUDA is enabled (adamw8bit_cuda.cpp).
std::unique_ptr<Optimizer> make_cpu(Hyper h);
std::unique_ptr<Optimizer> make_cuda(Hyper h);

class AdamW8bitState : public Optimizer {
 public:
  explicit AdamW8bitState(Hyper h);

  // Bytes of the moments as held: codes, absmax per block, fp32 moments, and the two code maps.
  int64_t state_bytes() const override;
  std::vector<NamedTensor> save_state() const override;
  // Checks everything before changing anything: a refused state leaves the optimizer as it was.
  void load_state(const std::vector<NamedTensor>& state) override;

 protected:
  // Lays the state out for `table` (every slice cut into blocks of block_size), all moments zero.
  void plan(const ParamTable& table);
  // The checks every step makes before it changes anything, then its coefficients (adamw's,
  // rounded the same way).
  Coefficients begin_step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) const;
  void warn_skipped(int64_t step, int64_t skipped) const;
  // A device implementation refreshes the host vectors from its state (save_state) and its state
  // from them (load_state).
  virtual void download_state() const {}
  virtual void upload_state() {}

  Hyper h_;
  DynamicCode signed_, unsigned_;
  std::vector<SliceState> slices_;
  int64_t total_ = 0, blocks_ = 0;
  bool initialised_ = false;
  mutable int64_t skipped_ = 0;  // elements skipped in the last step
  // On the CPU, the state; on a CUDA device, its staging copies (mutable: save_state refreshes them).
  mutable std::vector<uint8_t> m_codes_;  // (elements of 8-bit slices) first moment, signed map
  mutable std::vector<uint8_t> v_codes_;  // (elements of 8-bit slices) second moment, unsigned map
  mutable std::vector<float> m_absmax_;   // (blocks of 8-bit slices)
  mutable std::vector<float> v_absmax_;   // (blocks of 8-bit slices)
  mutable std::vector<float> m_fp32_;     // (elements of fp32 slices)
  mutable std::vector<float> v_fp32_;     // (elements of fp32 slices)

 private:
  bool keeps_8bit(const std::string& name, int64_t numel) const;
  void check_table(const ParamTable& table) const;
  void check_layout(const NamedTensor& block_size, const NamedTensor& quantized_slices) const;

  std::optional<std::regex> pattern_;
};

}  // namespace ablate::adamw8bit
