// The `adamw8bit` optimizer: adamw's maths (PyTorch AdamW: decoupled weight decay on the parameter
// before the moment update, bias corrections, eps after the bias-corrected sqrt(v)) with both
// moments held as 8-bit codes, block-wise quantized (Dettmers et al. 2022; the code maps are built
// in dynamic_code.hpp). Per block of `block_size` values of one slice: one fp32 absmax per moment;
// the first moment on the signed map, the second on the unsigned map. Slices under `min_8bit_size`
// elements, or whose name matches `fp32_state_pattern` (none by default; '^w[tp]e\.' picks the
// embeddings `wte` and `wpe`, as bitsandbytes' StableEmbedding keeps its optimizer state in 32
// bits), keep fp32 moments, updated exactly as adamw does.
//
// A step, per block and element, in fp32: decode m and v, update them with the gradient, update the
// parameter from the new (unquantized) m and v, then take the block's new absmax of each moment and
// encode. An element whose gradient (or its square) is not finite leaves its parameter and moments
// as they were (its moments are re-encoded against the block's new absmax); skipped_nonfinite()
// counts such elements in the last step, and a step that skipped any logs a warning.
//
// Two implementations under the one name, one per device, which the registry picks by run.device:
// the CPU's (adamw8bit_cpu.cpp, OpenMP over blocks) and, where CUDA is enabled, the CUDA device's
// (adamw8bit_cuda.cpp, one kernel per step in adamw8bit_kernel.cu). They share the arithmetic
// (adamw8bit_math.hpp), so their results are the same bit for bit, and the state's layout and
// checkpoint format (adamw8bit_state.cpp), so a checkpoint is the same on either device. This file
// registers them with the same schema and documentation.
#include <regex>
#include <string>

#include "ablate/adamw_keys.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "adamw8bit_state.hpp"

namespace {

using ablate::adamw8bit::Hyper;

// Whether the CUDA implementation is compiled in (CMake sets ABLATE_ADAMW8BIT_CUDA to 1 where CUDA
// is enabled, else 0); make_cuda is defined only then.
constexpr bool kWithCuda = ABLATE_ADAMW8BIT_CUDA != 0;

using Make = std::unique_ptr<ablate::Optimizer> (*)(Hyper);

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

// The registration of the implementation `make` for `device`.
ablate::ComponentInfo implementation(const char* device, Make make) {
  return {ablate::Kind::optimizer,
          ablate::adamw8bit::kName,
          "1.0.0",
          "AdamW with block-wise 8-bit moments (about 2 bytes of state per parameter), on the CPU or a CUDA device",
          schema(),
          [make](const ablate::ComponentArgs& a) -> std::unique_ptr<ablate::Component> {
            const ablate::adamw_keys::Hyper k = ablate::adamw_keys::read(a.own);  // [optimizer.adamw]'s
            Hyper h{k.weight_decay,
                    k.beta1,
                    k.beta2,
                    k.eps,
                    a.own.get_int("block_size"),
                    a.own.get_int("min_8bit_size"),
                    a.own.get_string("fp32_state_pattern")};
            try {
              return make(std::move(h));
            } catch (const std::regex_error& e) {
              ablate::throw_input_error(a.own.path() + ".fp32_state_pattern", "'" + a.own.get_string("fp32_state_pattern") +
                                                                                  "' is not a valid regular expression: " + e.what());
            }
          },
          "",
          {device}};
}

void register_components(ablate::Registrar& r) {
  r.add(implementation("cpu", ablate::adamw8bit::make_cpu));
  // A member of the AdamW family: its keys are read from [optimizer.adamw] (adamw_keys.hpp), its
  // own from [optimizer.adamw8bit].
  r.share_keys(ablate::Kind::optimizer, ablate::adamw8bit::kName, ablate::adamw_keys::kFamily);
  if constexpr (kWithCuda) r.add(implementation("cuda", ablate::adamw8bit::make_cuda));
}

}  // namespace

ABLATE_PLUGIN("adamw8bit", "1.0.0", register_components)
