// The `adamw` optimizer on the CPU: PyTorch's AdamW exactly (decoupled weight decay applied to the
// parameter before the moment update, bias corrections, eps added after the bias-corrected
// sqrt(v)). Weight decay applies to the slices the model marks `decay` (matrices and embeddings).
// State: fp32 first and second moments, 8 bytes per parameter. One OpenMP pass over each slice.
#include <cmath>
#include <cstring>

#include "ablate/adamw_keys.hpp"
#include "ablate/error.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/plugin.hpp"

namespace {

struct Hyper {
  double weight_decay, beta1, beta2, eps;
};

class AdamW final : public ablate::Optimizer {
 public:
  explicit AdamW(Hyper h) : h_(h) {}

  void init(const ablate::ParamTable& table, ablate::DeviceType device) override {
    if (device != ablate::DeviceType::cpu) {
      ablate::throw_input_error("optimizer.name", "adamw runs on the CPU; use adamw_fused on cuda");
    }
    m_.assign(std::size_t(table.total), 0.0f);
    v_.assign(std::size_t(table.total), 0.0f);
  }

  void step(const ablate::ParamTable& table, ablate::TensorView params, ablate::TensorView grads,
            const ablate::StepArgs& args) override {
    const double lr = args.lr;
    const int64_t step = args.step;
    const float grad_scale = args.grad_scale;
    if (step < 1) ablate::throw_runtime_error("adamw", "step counts from 1");
    if (params.numel() != table.total || grads.numel() != table.total) {
      ablate::throw_runtime_error("adamw", "parameter or gradient buffer does not match the parameter table");
    }
    float* p = params.as<float>();
    const float* g = grads.as<float>();
    const double bias1 = 1.0 - std::pow(h_.beta1, double(step));
    const double bias2 = 1.0 - std::pow(h_.beta2, double(step));
    const float step_size = float(lr / bias1);
    const float sqrt_bias2 = float(std::sqrt(bias2));
    // Coefficients are formed in double and rounded once, as PyTorch does with Python floats.
    const float b1 = float(h_.beta1), b2 = float(h_.beta2), eps = float(h_.eps);
    const float one_minus_b1 = float(1.0 - h_.beta1), one_minus_b2 = float(1.0 - h_.beta2);
    for (const ablate::ParamSlice& s : table.slices) {
      const float decay = s.decay ? float(1.0 - lr * h_.weight_decay) : 1.0f;
      const int64_t begin = s.offset, end = s.offset + s.numel();
#pragma omp parallel for schedule(static)
      for (int64_t i = begin; i < end; ++i) {
        const float gi = g[i] * grad_scale;
        const float mi = b1 * m_[i] + one_minus_b1 * gi;
        const float vi = b2 * v_[i] + one_minus_b2 * gi * gi;
        m_[i] = mi;
        v_[i] = vi;
        const float denom = std::sqrt(vi) / sqrt_bias2 + eps;
        p[i] = p[i] * decay - step_size * mi / denom;
      }
    }
  }

  int64_t state_bytes() const override { return int64_t((m_.size() + v_.size()) * sizeof(float)); }

  std::vector<ablate::NamedTensor> save_state() const override { return {pack("exp_avg", m_), pack("exp_avg_sq", v_)}; }

  // Both moments, each once and of the right size, are checked before either is taken: a state
  // missing one would otherwise resume with zeroed moments, silently.
  void load_state(const std::vector<ablate::NamedTensor>& state) override {
    const ablate::NamedTensor* found[2] = {nullptr, nullptr};
    for (const ablate::NamedTensor& t : state) {
      const int which = t.name == "exp_avg" ? 0 : t.name == "exp_avg_sq" ? 1 : -1;
      if (which < 0)
        ablate::throw_input_error("adamw state", "unexpected tensor '" + t.name + "' (was it written by another optimizer?)");
      if (found[which] != nullptr) ablate::throw_input_error("adamw state", "tensor '" + t.name + "' appears twice");
      if (t.dtype != ablate::DType::f32 || t.bytes.size() != m_.size() * sizeof(float)) {
        ablate::throw_input_error("adamw state", "tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                                                     " bytes, expected " + std::to_string(m_.size() * sizeof(float)) +
                                                     " (f32, one per parameter)");
      }
      found[which] = &t;
    }
    for (int i = 0; i < 2; ++i) {
      if (found[i] == nullptr)
        ablate::throw_input_error("adamw state", std::string("tensor '") + (i == 0 ? "exp_avg" : "exp_avg_sq") + "' is missing");
    }
    std::memcpy(m_.data(), found[0]->bytes.data(), found[0]->bytes.size());
    std::memcpy(v_.data(), found[1]->bytes.data(), found[1]->bytes.size());
  }

 private:
  static ablate::NamedTensor pack(const char* name, const std::vector<float>& v) {
    ablate::NamedTensor t{name, ablate::DType::f32, {int64_t(v.size())}, {}};
    t.bytes.resize(v.size() * sizeof(float));
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  }

  Hyper h_;
  std::vector<float> m_;  // (N) first moment
  std::vector<float> v_;  // (N) second moment
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::optimizer,
         "adamw",
         "1.0.0",
         "AdamW on the CPU as PyTorch defines it (fp32 state, 8 bytes per parameter)",
         ablate::adamw_keys::schema(),
         [](const ablate::ComponentArgs& a) {
           const ablate::adamw_keys::Hyper k = ablate::adamw_keys::read(a.own);
           return std::make_unique<AdamW>(Hyper{k.weight_decay, k.beta1, k.beta2, k.eps});
         },
         "",
         {"cpu"}});
}

}  // namespace

ABLATE_PLUGIN("adamw", "1.0.0", register_components)
