// Shared host pieces of the CUDA layers: the checks every call makes (f32 views on the cuda device
// holding enough values, bf16 ones where the model holds a product's input in bf16, the batch's ids
// on the device), the stream, and the dropout arguments.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "gemm.hpp"
#include "layer_kernels.hpp"

#include <functional>

namespace ablate::cuda_layers {

// Factories, one per component (defined next to each layer).
std::unique_ptr<Layer> make_norm(bool rms, const char* name);
std::unique_ptr<Layer> make_embedding();
std::unique_ptr<Layer> make_learned();
std::unique_ptr<Layer> make_rope(double theta);  // [model.rope] theta
// The layers with matrix products take the run's math mode (gemm.hpp: fp32, tf32, bf16 or FP8 products)
// and, the dense ones, how FP8 products are scaled.
std::unique_ptr<Layer> make_linear(MatmulMode mode, Fp8Scaling scaling);
std::unique_ptr<Layer> make_gelu_mlp(MatmulMode mode, Fp8Scaling scaling);
std::unique_ptr<Layer> make_swiglu_mlp(MatmulMode mode, Fp8Scaling scaling);
std::unique_ptr<LossLayer> make_cross_entropy(MatmulMode mode, int64_t chunk_rows = 0);  // 0: the layer's choice
std::unique_ptr<Layer> make_lora(const Params& own);                                     // [adapter.lora]

// A view of `dtype` on the cuda device holding at least `elements` values (none needed: any view).
inline void require_view(const char* layer, const TensorView& t, const char* what, int64_t elements, DType dtype) {
  if (elements == 0) return;
  if (t.data == nullptr) throw_runtime_error(layer, std::string("the call has no '") + what + "' tensor");
  if (t.dtype != dtype || t.device != DeviceType::cuda) {
    throw_runtime_error(layer, std::string("'") + what + "' must be " + to_string(dtype) + " on the cuda device, it is " +
                                   to_string(t.dtype) + " on " + to_string(t.device));
  }
  if (t.numel() < elements) {
    throw_runtime_error(layer, std::string("'") + what + "' holds " + std::to_string(t.numel()) + " values, the call needs " +
                                   std::to_string(elements));
  }
}

inline void require_f32(const char* layer, const TensorView& t, const char* what, int64_t elements) {
  require_view(layer, t, what, elements, DType::f32);
}

// An activation the model holds in bf16.
inline void require_bf16(const char* layer, const TensorView& t, const char* what, int64_t elements) {
  require_view(layer, t, what, elements, DType::bf16);
}

// An activation a matrix product reads (a dense layer's or the classifier's input x): f32 or, when
// the model holds it in bf16 (LayerBase::bf16_product_inputs) and the products are bf16, bf16.
inline Operand require_product_input(const char* layer, const TensorView& t, const char* what, int64_t elements, MatmulMode mode) {
  if (t.dtype == DType::bf16 && t.data != nullptr) {
    if (!bf16_family(mode)) {
      throw_runtime_error(layer, std::string("'") + what + "' is bf16 but the products are " + to_string(mode) +
                                     ": an input held in bf16 is read by bf16 products only");
    }
    require_bf16(layer, t, what, elements);
    return {nullptr, t.data};
  }
  require_f32(layer, t, what, elements);
  return {t.as<const float>(), nullptr};
}

inline cudaStream_t stream_of(const LayerCall& call) { return call.stream.as<cudaStream_t>(); }

inline void check_spec(const char* layer, const LayerCall& call) {
  if (call.spec == nullptr) throw_runtime_error(layer, "the call has no spec");
  if (call.rows < 0) throw_runtime_error(layer, "negative row count");
  if (call.spec->in <= 0) throw_runtime_error(layer, "spec.in must be positive");
}

// One of the batch's (B, T) id arrays on the cuda device, holding one id per row of the call.
inline const int32_t* require_ids(const char* layer, const LayerCall& call, TensorView BatchViews::*field, const char* what) {
  if (call.batch == nullptr) throw_runtime_error(layer, "the call has no batch");
  const TensorView& v = call.batch->*field;
  if (v.device != DeviceType::cuda || v.dtype != DType::i32) {
    throw_runtime_error(layer, std::string("the batch's ") + what + " are not i32 on the cuda device");
  }
  if (v.numel() != call.rows) {
    throw_runtime_error(layer, std::string("the batch has ") + std::to_string(v.numel()) + " " + what + ", the call " +
                                   std::to_string(call.rows) + " rows");
  }
  return v.as<const int32_t>();
}

inline DropoutArgs dropout_of(const char* layer, const LayerCall& call) {
  if (!(call.dropout >= 0.0 && call.dropout < 1.0)) {
    throw_input_error(layer, "dropout must be in [0, 1), got " + std::to_string(call.dropout));
  }
  DropoutArgs d;
  d.p = call.dropout;
  d.key = call.dropout_key;
  d.scale = d.p > 0.0 ? float(1.0 / (1.0 - d.p)) : 1.0f;
  return d;
}

inline bool same(const TensorView& a, const TensorView& b) { return a.data != nullptr && a.data == b.data; }

// FP8 current scaling's weight packs in a call site's weight cache (LayerCall::weight_cache,
// weights_unchanged; Fp8Slots::weight_pack), for every layer that keeps them:
// the cache's bytes (0: none);
inline int64_t weight_cache_size(const LayerCall& call) {
  return call.weight_cache.data == nullptr ? 0 : call.weight_cache.numel() * int64_t(dtype_size(call.weight_cache.dtype));
}
// at the start of each call, where the weights changed since the site's last call, the packs the
// cache held forgotten (made again by the first product that reads each weight): the only place
// the flag is read;
inline void forget_changed_weight_packs(const LayerCall& call) {
  if (!call.weights_unchanged && call.weight_cache.data != nullptr)
    fp8_weight_packs_forget(call.weight_cache.data, weight_cache_size(call));
}
// and `slots` of a product whose B is the weight packed `offset` bytes into the cache, where the
// cache holds the layer's `need` bytes (else as given: the product quantises the weight itself).
inline Fp8Slots with_weight_pack(Fp8Slots slots, const LayerCall& call, int64_t need, int64_t offset) {
  if (need > 0 && weight_cache_size(call) >= need) slots.weight_pack = static_cast<char*>(call.weight_cache.data) + offset;
  return slots;
}

// After a layer's launches: a launch error (bad configuration) surfaces here with the layer's name.
inline void check_launch(const char* layer) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    throw_runtime_error(layer, std::string("kernel launch failed: ") + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
}

}  // namespace ablate::cuda_layers
