// Registers the example norm: `model.norm = "scalenorm"` in an experiment file chooses it, and its
// own key lives in [model.scalenorm] (init_g = 1.0 unless the experiment says otherwise).
#include <memory>

#include <ablate/plugin.hpp>
#include <ablate/schema.hpp>

#include "scalenorm.hpp"

namespace {

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::layer,
         "scalenorm",
         "1.0.0",
         "ScaleNorm: g * x / rms(x) with one learned scalar g, on the CPU (f32/f64; an SDK example)",
         {ablate::param::floating("init_g", 1.0, "the initial value of every g (the paper suggests sqrt(d_model))").within(1e-3, 1e3)},
         [](const ablate::ComponentArgs& a) -> std::unique_ptr<ablate::Component> {
           return std::make_unique<scalenorm::ScaleNorm>(a.own.get_float("init_g"));
         },
         "",
         {"cpu"}});
}

}  // namespace

ABLATE_PLUGIN("scalenorm", "1.0.0", register_components)
