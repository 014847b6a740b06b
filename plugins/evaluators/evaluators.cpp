// The shipped evaluators in one plugin library: multiple_choice, heldout_loss, generate_match.
#include "ablate/plugin.hpp"

namespace ablate::evaluators {
void register_multiple_choice(Registrar& r);
void register_heldout_loss(Registrar& r);
void register_generate_match(Registrar& r);
}  // namespace ablate::evaluators

namespace {
void register_components(ablate::Registrar& r) {
  ablate::evaluators::register_multiple_choice(r);
  ablate::evaluators::register_heldout_loss(r);
  ablate::evaluators::register_generate_match(r);
}
}  // namespace

ABLATE_PLUGIN("evaluators", "1.0.0", register_components)
