// The parameter layout of the built-in layers: each tensor's name, shape and initialisation, in
// the order it sits in the layer's part of the flat buffers. It is part of the layer contract, not
// of one implementation: the cpu and cuda registrations of a name declare through these, so a
// checkpoint written on one device loads on the other and exports see the same names.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/schema.hpp"
#include "ablate/tensor.hpp"

namespace ablate::layer_params {

inline std::string name(const std::string& prefix, const char* leaf) {
  return prefix.empty() ? std::string(leaf) : prefix + "." + leaf;
}

// Offsets of a dense weight (out, in) and its optional bias (out) from `begin` in a layer's
// parameters; bias is -1 without one; `end` is one past the last value.
struct Dense {
  int64_t weight = 0, bias = -1, end = 0;
};
inline Dense dense(int64_t begin, int64_t in, int64_t out, bool bias) {
  Dense d{begin, -1, begin + in * out};
  if (bias) {
    d.bias = d.end;
    d.end += out;
  }
  return d;
}

// embedding: weight (vocab_padded = spec.out, in).
inline void embedding(const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  t.add(name(prefix, "weight"), {s.out, s.in}, true, s.init_std);
}

// learned positions: weight (max_positions, in).
inline void learned(const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  if (s.max_positions <= 0) throw_input_error("position", "spec.max_positions must be positive");
  t.add(name(prefix, "weight"), {s.max_positions, s.in}, true, s.init_std);
}

// layernorm: weight (in) = 1 and, with spec.bias, bias (in) = 0; rmsnorm: the weight alone.
inline void norm(bool rms, const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  t.add(name(prefix, "weight"), {s.in}, false, 0.0, 1.0);
  if (!rms && s.bias) t.add(name(prefix, "bias"), {s.in}, false, 0.0, 0.0);
}

// linear: weight (out, in), bias (out).
inline void linear(const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  t.add(name(prefix, "weight"), {s.out, s.in}, true, s.init_std);
  if (s.bias) t.add(name(prefix, "bias"), {s.out}, false, 0.0, 0.0);
}

// gelu_mlp of width C = in, hidden H = out: fc.weight (H, C), fc.bias (H), proj.weight (C, H), proj.bias (C).
inline void gelu_mlp(const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  t.add(name(prefix, "fc.weight"), {s.out, s.in}, true, s.init_std);
  if (s.bias) t.add(name(prefix, "fc.bias"), {s.out}, false, 0.0, 0.0);
  t.add(name(prefix, "proj.weight"), {s.in, s.out}, true, s.init_std);
  if (s.bias) t.add(name(prefix, "proj.bias"), {s.in}, false, 0.0, 0.0);
}

// swiglu_mlp: gate.weight (H, C), gate.bias (H), up.weight (H, C), up.bias (H), down.weight (C, H), down.bias (C).
inline void swiglu_mlp(const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  t.add(name(prefix, "gate.weight"), {s.out, s.in}, true, s.init_std);
  if (s.bias) t.add(name(prefix, "gate.bias"), {s.out}, false, 0.0, 0.0);
  t.add(name(prefix, "up.weight"), {s.out, s.in}, true, s.init_std);
  if (s.bias) t.add(name(prefix, "up.bias"), {s.out}, false, 0.0, 0.0);
  t.add(name(prefix, "down.weight"), {s.in, s.out}, true, s.init_std);
  if (s.bias) t.add(name(prefix, "down.bias"), {s.in}, false, 0.0, 0.0);
}

// The dense pieces of the mlps in parameter order (fc, proj; gate, up, down).
struct GeluMlp {
  Dense fc, proj;
};
inline GeluMlp gelu_mlp_offsets(const LayerSpec& s) {
  const Dense fc = dense(0, s.in, s.out, s.bias);
  return {fc, dense(fc.end, s.out, s.in, s.bias)};
}
struct SwigluMlp {
  Dense gate, up, down;
};
inline SwigluMlp swiglu_mlp_offsets(const LayerSpec& s) {
  const Dense gate = dense(0, s.in, s.out, s.bias), up = dense(gate.end, s.in, s.out, s.bias);
  return {gate, up, dense(up.end, s.out, s.in, s.bias)};
}

// lora (an adapter on a linear of spec.in -> spec.out): lora_A (rank, in), random with the spread of
// PyTorch's Linear default that PEFT keeps (U(+-1/sqrt(in)) has standard deviation 1/sqrt(3 in);
// the table draws normals of it), then lora_B (out, rank) = 0, so the adapted model starts as the
// base. Its saved values: u = dropout(x) A^T, (rows, rank); its scratch: dropout(x) and t, rows x
// (in + rank).
inline void lora(int64_t rank, const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  if (s.in <= 0 || s.out <= 0) throw_input_error("adapter", "the adapted linear needs positive in and out widths");
  t.add(name(prefix, "lora_A"), {rank, s.in}, true, 1.0 / std::sqrt(3.0 * double(s.in)));
  t.add(name(prefix, "lora_B"), {s.out, rank}, true, 0.0, 0.0);
}
inline int64_t lora_saved(int64_t rank, int64_t rows) { return rows * rank; }
inline int64_t lora_scratch(int64_t rank, const LayerSpec& s, int64_t rows) { return rows * (s.in + rank); }

// lora's own keys, [adapter.lora], one schema for its registration on every device: rank, alpha and
// the dropout on its input. A caller that builds the layer without keys (a test) gets the defaults.
inline Schema lora_keys() {
  using namespace param;
  return {
      integer("rank", 8, "LoRA rank r: A is (r, in), B (out, r)").within(1, 65536),
      floating("alpha", 16.0, "LoRA alpha: the adapter's output is scaled by alpha / rank").at_least(0.0),
      floating("dropout", 0.0, "dropout on the adapter's input while training").within(0.0, 0.99),
  };
}
struct LoraKeys {
  int64_t rank = 8;
  double alpha = 16.0, dropout = 0.0;
};
inline LoraKeys read_lora_keys(const Params& own) {
  LoraKeys k;
  if (own.has("rank")) k.rank = own.get_int("rank");
  if (own.has("alpha")) k.alpha = own.get_float("alpha");
  if (own.has("dropout")) k.dropout = own.get_float("dropout");
  return k;
}
// What the model's description says of a lora adapter (what its weights depend on; the checkpoint
// compares it on resume): "rank=8,alpha=16".
inline std::string lora_text(const LoraKeys& k) {
  std::ostringstream s;
  s << "rank=" << k.rank << ",alpha=" << k.alpha;
  return s.str();
}

// lora's face, the same on every device: its role, keys, parameters and sizes; a device's twin
// adds forward and backward.
class LoraFace : public Layer {
 public:
  explicit LoraFace(const LoraKeys& k) : keys_(k), rank_(k.rank) {}
  LayerRole role() const override { return LayerRole::adapter; }
  double input_dropout() const override { return keys_.dropout; }
  std::string describe_keys() const override { return lora_text(keys_); }
  void declare_params(const LayerSpec& spec, const std::string& prefix, ParamTable& table) const override {
    lora(rank_, spec, prefix, table);
  }
  int64_t activation_elements(const LayerSpec&, int64_t rows) const override { return lora_saved(rank_, rows); }
  int64_t scratch_elements(const LayerSpec& s, int64_t rows) const override { return lora_scratch(rank_, s, rows); }

 protected:
  double scale() const { return keys_.alpha / double(keys_.rank); }  // alpha / rank
  LoraKeys keys_;
  int64_t rank_;
};

// rope has no parameters; its spec is checked where the others declare: head_dim (spec.in)
// positive and even (rope_problem: why not, "" when it is). Its one key, [model.rope] theta, is
// the same schema on every device (rope_keys); a caller without keys (a test) gets the default.
inline std::string rope_problem(const LayerSpec& s) {
  if (s.in <= 0 || s.in % 2 != 0) return "rope needs a positive, even head_dim (d_model / n_heads), got " + std::to_string(s.in);
  return "";
}
inline constexpr double kRopeTheta = 10000.0;
inline Schema rope_keys() {
  return {
      param::floating("theta", kRopeTheta, "RoPE base: pair i of a head of D values turns by position * theta^(-2i/D)").at_least(1.0)};
}
inline double read_rope_theta(const Params& own) { return own.has("theta") ? own.get_float("theta") : kRopeTheta; }
inline void rope(const LayerSpec& s) {
  if (const std::string why = rope_problem(s); !why.empty()) throw_input_error("position", why);
}

// rope's face, the same on every device: a position layer applied to q and k, no parameters, its
// head_dim checked; a device's twin adds forward and backward.
class RopeFace : public Layer {
 public:
  explicit RopeFace(double theta) : theta_(theta) {}
  LayerRole role() const override { return LayerRole::position; }
  PositionSite position_site() const override { return PositionSite::qk; }
  std::string unsupported(const LayerSpec& spec) const override { return rope_problem(spec); }
  void declare_params(const LayerSpec& spec, const std::string&, ParamTable&) const override { rope(spec); }
  int64_t activation_elements(const LayerSpec&, int64_t) const override { return 0; }

 protected:
  double theta_;
};

// The hidden width of swiglu_mlp when model.mlp_hidden is 0: 8/3 of the model width rounded up
// to a multiple of 64 (the parameter count of a 4 d GELU MLP, in three matrices).
inline int64_t swiglu_hidden(int64_t d_model) { return ((8 * d_model + 2) / 3 + 63) / 64 * 64; }
// rmsnorm's epsilon when model.norm_eps is 0 (layernorm's is LayerBase::default_epsilon's 1e-5).
inline constexpr double kRmsnormEpsilon = 1e-6;

// The classifier's columns: 0 < real_out <= out (padded columns never enter the softmax).
inline void check_classifier(const LayerSpec& s) {
  if (s.out <= 0 || s.real_out <= 0 || s.real_out > s.out) {
    throw_input_error("classifier",
                      "need 0 < real_out <= out, got real_out " + std::to_string(s.real_out) + ", out " + std::to_string(s.out));
  }
}

// cross_entropy's keys ([model.cross_entropy]), the same schema on every device: `fp8` puts the
// classifier's three products (the logits, d_x, the weight gradient) in FP8 as well under an FP8
// run.dtype (current scaling; E5M2 logit gradients under "fp8"), where by default they stay bf16.
// Set under any other run.dtype it is an error (exit 2), not a key that silently does nothing.
// `chunk_rows`: how many rows' logits the layer holds at once (0: the device's own choice, see
// cross_entropy_cpu.cpp and cross_entropy_cuda.cpp); more rows mean larger products and fewer
// passes over the weight gradient, for (chunk_rows, vocabulary) logits of memory.
inline Schema classifier_keys() {
  return {param::boolean("fp8", false,
                         "the classifier's products (logits, d_x, weight gradient) in FP8 too, with current scaling; needs "
                         "run.dtype = \"fp8\" or \"fp8_e4m3\" (false: bf16 products under those)"),
          param::integer("chunk_rows", 0,
                         "rows whose logits are held at once (0: the device's choice: 256 rows on the cpu; on cuda 1024 rows of "
                         "f32 logits, or under bf16 and FP8 products the fewest equal chunks of at most 1 GiB of bf16 logits)")
              .within(0, int64_t(1) << 40)};
}
inline int64_t read_classifier_chunk_rows(const Params& own) { return own.has("chunk_rows") ? own.get_int("chunk_rows") : 0; }
inline bool read_classifier_fp8(const Params& own, const std::string& dtype) {
  const bool on = own.has("fp8") && own.get_bool("fp8");
  if (on && !fp8_dtype(dtype)) {
    throw_input_error(own.path() + ".fp8", "true needs run.dtype = \"fp8\" or \"fp8_e4m3\" (FP8 products), got \"" + dtype +
                                               "\"; set it false or change run.dtype");
  }
  return on;
}

// classifier: weight (out, in), unless tied to the embedding (spec.declare false).
inline void classifier(const LayerSpec& s, const std::string& prefix, ParamTable& t) {
  if (s.declare) t.add(name(prefix, "weight"), {s.out, s.in}, true, s.init_std);
}

}  // namespace ablate::layer_params
