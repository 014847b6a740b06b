// The keys of the AdamW family, one schema for every optimizer that is AdamW: weight_decay, beta1,
// beta2 and eps, with the same defaults, ranges and documentation wherever they are declared. The
// family's table is [optimizer.adamw]: `adamw` declares these keys (schema()), and every other
// member (adamw8bit, a plugin's) registers with ComponentInfo::family = "adamw" and reads them from
// its own keys all the same (read()), so that an experiment moving between members keeps its
// values. Core knows none of them; experiments that wrote them in [optimizer] itself have them
// moved into [optimizer.adamw] as they are read, with a warning.
#pragma once

#include "ablate/schema.hpp"

namespace ablate::adamw_keys {

inline constexpr const char* kFamily = "adamw";

inline Schema schema() {
  using namespace param;
  return {
      floating("weight_decay", 0.1, "decoupled weight decay (matrices and embeddings)").at_least(0.0),
      floating("beta1", 0.9, "first moment decay").within(0.0, 0.999999),
      floating("beta2", 0.95, "second moment decay").within(0.0, 0.999999),
      floating("eps", 1e-8, "added to the square root of the second moment").at_least(0.0),
  };
}

struct Hyper {
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

// The values from an optimizer's own keys (ComponentArgs::own, the family's included).
inline Hyper read(const Params& own) {
  return {own.get_float("weight_decay"), own.get_float("beta1"), own.get_float("beta2"), own.get_float("eps")};
}

}  // namespace ablate::adamw_keys
