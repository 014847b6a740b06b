// One forward and backward of an attention backend on a Device (the GPU tests): f32 inputs
// uploaded, every output poisoned with NaN first (a position the backend never writes shows), the
// batch uploaded as the trainer uploads it, results downloaded after a synchronize. A problem with
// bf16_out gets out as a bf16 buffer, returned widened to f32 (exactly); one with bf16_qkv gets q,
// k and v rounded to bf16 (device_math::bf16_bits); one with bf16_grads d_out rounded likewise and
// d_q, d_k, d_v as bf16 buffers, returned widened.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/batch.hpp"
#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "attention_support.hpp"

namespace ablate::test {

// A view given the (B, T, heads, D) shape of an attention tensor.
inline TensorView shaped(TensorView t, int64_t a, int64_t b, int64_t c, int64_t d) {
  t.ndim = 4;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  t.shape[3] = d;
  return t;
}

struct AttentionOutputs {
  std::vector<float> out, d_q, d_k, d_v;
};

inline AttentionOutputs run_attention_on(Device& dev, Attention& attention, const AttentionProblem& p, const Batch& batch,
                                         const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                         const std::vector<float>& d_out) {
  const auto up = [&](const std::vector<float>& x) {
    Buffer b = dev.alloc(DType::f32, int64_t(x.size()));
    dev.upload(b.view(), x.data());
    return b;
  };
  const auto poisoned = [&](int64_t n) {
    Buffer b = dev.alloc(DType::f32, n);
    dev.fill(b.view(), std::numeric_limits<float>::quiet_NaN());
    return b;
  };
  const auto down = [&](const Buffer& b) {
    std::vector<float> h(std::size_t(b.count()));
    dev.download(h.data(), b.view());
    return h;
  };
  const auto up_bf16 = [&](const std::vector<float>& x) {
    std::vector<uint16_t> bits(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) bits[i] = device_math::bf16_bits(x[i]);
    Buffer b = dev.alloc(DType::bf16, int64_t(x.size()));
    dev.upload(b.view(), bits.data());
    return b;
  };
  const auto up_qkv = [&](const std::vector<float>& x) { return p.bf16_qkv ? up_bf16(x) : up(x); };
  const auto poisoned_as = [&](bool bf16, int64_t n) {
    if (!bf16) return poisoned(n);
    Buffer b = dev.alloc(DType::bf16, n);
    const std::vector<uint16_t> nan(std::size_t(n), uint16_t(0xFFFF));  // all bits set: a bf16 NaN
    dev.upload(b.view(), nan.data());
    return b;
  };
  const auto down_as = [&](const Buffer& b) {
    if (b.view().dtype != DType::bf16) return down(b);
    std::vector<uint16_t> bits(std::size_t(b.count()));
    dev.download(bits.data(), b.view());
    std::vector<float> values;
    for (uint16_t e : bits) values.push_back(device_math::bf16_value(e));
    return values;
  };
  DeviceBatch db;
  dev.upload_batch(batch, db);
  Buffer bq = up_qkv(q), bk = up_qkv(k), bv = up_qkv(v), bdo = p.bf16_grads ? up_bf16(d_out) : up(d_out);
  Buffer out = poisoned_as(p.bf16_out, int64_t(q.size()));
  Buffer dq = poisoned_as(p.bf16_grads, int64_t(q.size())), dk = poisoned_as(p.bf16_grads, int64_t(k.size())),
         dv = poisoned_as(p.bf16_grads, int64_t(k.size())), saved = poisoned(attention.saved_elements(p));
  const auto hv = [&](Buffer& b) { return shaped(b.view(), p.batch, p.seq_len, p.heads, p.head_dim); };
  const auto kv = [&](Buffer& b) { return shaped(b.view(), p.batch, p.seq_len, p.kv_heads, p.head_dim); };
  attention_forward(attention, p, db.views, hv(bq), kv(bk), kv(bv), hv(out), saved.view(), dev.stream());
  attention_backward(attention, p, db.views, hv(bq), kv(bk), kv(bv), hv(out), saved.view(), hv(bdo), hv(dq), kv(dk), kv(dv),
                     dev.stream());
  dev.synchronize();
  return {down_as(out), down_as(dq), down_as(dk), down_as(dv)};
}

}  // namespace ablate::test
