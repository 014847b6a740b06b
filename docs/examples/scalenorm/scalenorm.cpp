// Registers the example norm: `model.norm = "scalenorm"` in an experiment file chooses it.
#include <memory>

#include <ablate/plugin.hpp>

#include "scalenorm.hpp"

namespace {

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::layer, "scalenorm", "1.0.0",
         "ScaleNorm: g * x / rms(x) with one learned scalar g, on the CPU (f32/f64; an SDK example)", {},
         [](const ablate::ComponentArgs&) -> std::unique_ptr<ablate::Component> {
           return std::make_unique<scalenorm::ScaleNorm>();
         },
         "", {"cpu"}});
}

}  // namespace

ABLATE_PLUGIN("scalenorm", "1.0.0", register_components)
