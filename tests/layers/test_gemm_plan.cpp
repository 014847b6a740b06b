// The host side of the CUDA layers' cuBLASLt products, without a GPU (plugins/layers/cuda/
// gemm_plan.cpp): which epilogue each dense-layer product gets at GPT-2's sizes and at sizes that
// rule fusing out, that the plan-cache key tells apart every call whose plan differs (epilogue,
// bias and GELU-matrix alignment, mode), and the calls gemm() refuses.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gemm.hpp"
#include "gemm_plan.hpp"

using namespace ablate;
using namespace ablate::cuda_layers;

namespace {

// Fake device addresses: only their alignment is read.
const float* at(uintptr_t address) { return reinterpret_cast<const float*>(address); }
float* at_mut(uintptr_t address) { return reinterpret_cast<float*>(address); }

// GPT-2's first MLP product, rows 8192: x (rows, 768) W^T (768 -> 3072) + b.
GemmCall fc_forward(int64_t hidden = 3072) {
  GemmCall g;
  g.tb = true;
  g.M = 8192;
  g.N = hidden;
  g.K = 768;
  g.A = at(0x10000);
  g.lda = 768;
  g.B = at(0x20000);
  g.ldb = 768;
  g.D = at_mut(0x30000);
  g.ldc = hidden;
  g.bias = at(0x40000);
  g.act = Activation::gelu_aux;
  g.aux = at_mut(0x50000);
  g.mode = MatmulMode::bf16;
  return g;
}

// GPT-2's MLP weight gradient, rows 8192: dW (768, 3072) += dy^T x, without the bias gradient.
GemmCall proj_wgrad(MatmulMode mode) {
  GemmCall g;
  g.ta = true;
  g.M = 768;
  g.N = 3072;
  g.K = 8192;
  g.A = at(0x10000);
  g.lda = 768;
  g.B = at(0x20000);
  g.ldb = 3072;
  g.beta = 1.0f;
  g.D = at_mut(0x30000);
  g.ldc = 3072;
  g.mode = mode;
  return g;
}

}  // namespace

TEST_CASE("gemm plan: each dense-layer product gets the epilogue that saves its pass") {
  GemmCall fwd = fc_forward();
  CHECK(fused_epilogue(fwd) == "GELU_AUX_BIAS");
  fwd.bias = nullptr;
  CHECK(fused_epilogue(fwd) == "GELU_AUX");

  GemmCall back;  // d_pre (rows, 3072) = dy (rows, 768) W_proj, times gelu'(pre); fc's bias gradient
  back.M = 8192;
  back.N = 3072;
  back.K = 768;
  back.A = at(0x10000);
  back.lda = 768;
  back.B = at(0x20000);
  back.ldb = 3072;
  back.D = at_mut(0x30000);
  back.ldc = 3072;
  back.act = Activation::dgelu;
  back.aux = at_mut(0x50000);
  back.mode = MatmulMode::tf32;
  CHECK(fused_epilogue(back) == "DGELU");
  back.d_column_sums = at_mut(0x60004);  // the gradient goes to aligned scratch first: any address serves
  CHECK(fused_epilogue(back) == "DGELU_BGRAD");

  GemmCall wgrad = proj_wgrad(MatmulMode::f32);  // then with the bias gradient of dy
  CHECK(fused_epilogue(wgrad) == "DEFAULT");
  wgrad.a_sums = at_mut(0x60004);
  CHECK(fused_epilogue(wgrad) == "BGRADB");

  GemmCall plain = fc_forward();
  plain.act = Activation::none;
  plain.aux = nullptr;
  CHECK(fused_epilogue(plain) == "BIAS");
  plain.mode = MatmulMode::f32;
  CHECK(fused_epilogue(plain) == "BIAS");
  wgrad.mode = MatmulMode::f32;
  CHECK(fused_epilogue(wgrad) == "BGRADB");
}

TEST_CASE("gemm plan: layouts cuBLASLt cannot fuse are done in passes of their own") {
  // A hidden width that is no multiple of 8: the GELU matrix's leading dimension rules it out.
  CHECK(fused_epilogue(fc_forward(3070)).empty());
  // A bias only 4-byte aligned (a layer whose weight has an odd element count before it).
  GemmCall g = fc_forward();
  g.bias = at(0x40004);
  CHECK(fused_epilogue(g).empty());
  g.act = Activation::none;
  g.aux = nullptr;
  CHECK(fused_epilogue(g).empty());  // even the plain bias epilogue
  g.bias = at(0x40010);
  CHECK(fused_epilogue(g) == "BIAS");
  // True fp32 products: the GELU in dense_math.hpp's arithmetic, a pass of its own.
  GemmCall f32 = fc_forward();
  f32.mode = MatmulMode::f32;
  CHECK(fused_epilogue(f32).empty());
  // A GELU matrix only 8-byte aligned.
  GemmCall h = fc_forward();
  h.aux = at_mut(0x50008);
  CHECK(fused_epilogue(h).empty());
}

TEST_CASE("gemm plan: the cache key separates every call whose plan differs") {
  std::vector<GemmCall> calls;
  const GemmCall base = fc_forward();
  calls.push_back(base);
  GemmCall no_bias = base;
  no_bias.bias = nullptr;
  calls.push_back(no_bias);
  GemmCall plain = base;
  plain.act = Activation::none;
  plain.aux = nullptr;
  calls.push_back(plain);
  GemmCall odd_bias = plain;
  odd_bias.bias = at(0x40004);  // unfused: the product's plan has no bias epilogue
  calls.push_back(odd_bias);
  GemmCall aux16 = base;
  aux16.aux = at_mut(0x50010);  // fused still, but the heuristic was told a smaller alignment
  calls.push_back(aux16);
  GemmCall f32 = base;
  f32.mode = MatmulMode::f32;
  calls.push_back(f32);
  GemmCall tf32 = base;
  tf32.mode = MatmulMode::tf32;
  calls.push_back(tf32);
  std::set<std::string> keys;
  for (const GemmCall& g : calls) keys.insert(gemm_key(g));
  CHECK(keys.size() == calls.size());
  // Pointers with the same alignment share a plan: the next layer's product builds nothing.
  GemmCall next_layer = base;
  next_layer.A = at(0x910000);
  next_layer.bias = at(0x940000);
  next_layer.aux = at_mut(0x950000);
  CHECK(gemm_key(next_layer) == gemm_key(base));
}

TEST_CASE("gemm plan: the calls gemm() refuses, with the reason") {
  CHECK(gemm_refusal(fc_forward()).empty());
  GemmCall no_aux = fc_forward();
  no_aux.aux = nullptr;
  CHECK(gemm_refusal(no_aux).find("pre-activation") != std::string::npos);
  GemmCall sums_without_dgelu = fc_forward();
  sums_without_dgelu.d_column_sums = at_mut(0x60000);
  CHECK(gemm_refusal(sums_without_dgelu).find("dgelu") != std::string::npos);
  GemmCall a_sums_untransposed = fc_forward();
  a_sums_untransposed.act = Activation::none;
  a_sums_untransposed.aux = nullptr;
  a_sums_untransposed.bias = nullptr;
  a_sums_untransposed.a_sums = at_mut(0x60000);
  CHECK(gemm_refusal(a_sums_untransposed).find("transposed") != std::string::npos);
  GemmCall bias_with_dgelu = fc_forward();
  bias_with_dgelu.act = Activation::dgelu;
  CHECK(gemm_refusal(bias_with_dgelu).find("forward products only") != std::string::npos);
  GemmCall strided_bias = fc_forward();
  strided_bias.ldc = strided_bias.N + 8;
  CHECK(gemm_refusal(strided_bias).find("packed") != std::string::npos);
  GemmCall empty_sum = fc_forward();
  empty_sum.K = 0;
  CHECK(gemm_refusal(empty_sum).find("K = 0") != std::string::npos);
  GemmCall negative = fc_forward();
  negative.M = -1;
  CHECK(gemm_refusal(negative).find("invalid") != std::string::npos);
  GemmCall no_b = fc_forward();
  no_b.B = nullptr;
  CHECK(!gemm_refusal(no_b).empty());
  // Column sums of A as stored (an FP8 product's bias gradient, taken where A is quantised): beside
  // no epilogue, A packed, A's values at hand; a weight gradient's or an input gradient's product.
  GemmCall wgrad_sums = proj_wgrad(MatmulMode::fp8);
  wgrad_sums.a_column_sums = at_mut(0x60000);
  CHECK(gemm_refusal(wgrad_sums).empty());
  CHECK(fused_epilogue(wgrad_sums) == "DEFAULT");     // no epilogue: the FP8 product serves it
  GemmCall dgrad_sums = proj_wgrad(MatmulMode::fp8);  // dx (8192, 3072) = dy (8192, 768) W
  dgrad_sums.ta = false;
  dgrad_sums.M = 8192;
  dgrad_sums.K = 768;
  dgrad_sums.beta = 0.0f;
  dgrad_sums.a_column_sums = at_mut(0x60000);
  CHECK(gemm_refusal(dgrad_sums).empty());
  GemmCall strided_sums = dgrad_sums;
  strided_sums.lda = 776;
  CHECK(gemm_refusal(strided_sums).find("packed") != std::string::npos);
  GemmCall sums_and_gelu = fc_forward();
  sums_and_gelu.bias = nullptr;
  sums_and_gelu.a_column_sums = at_mut(0x60000);
  CHECK(gemm_refusal(sums_and_gelu).find("no epilogue") != std::string::npos);
  GemmCall sums_without_a = dgrad_sums;
  sums_without_a.A = nullptr;
  sums_without_a.A_bf16 = at(0x70000);
  CHECK(gemm_refusal(sums_without_a).empty());  // bf16 values under FP8 products
  sums_without_a.A_bf16 = nullptr;
  CHECK(!gemm_refusal(sums_without_a).empty());
}

TEST_CASE("gemm plan: operands held in bf16 are read in place, by bf16 products only") {
  // The fc product with x held in bf16 (a norm's output): no f32 values of A at all.
  GemmCall held = fc_forward();
  held.A_bf16 = held.A;
  held.A = nullptr;
  CHECK(gemm_refusal(held).empty());
  CHECK(fused_epilogue(held) == "GELU_AUX_BIAS");
  // Read in place: its own leading dimension and alignment are in the key, where a packed copy
  // has the row length and 256 bytes. A held A at a 256-byte aligned address with the packed
  // row length plans like the copy; one less aligned does not.
  CHECK(gemm_key(held) == gemm_key(fc_forward()));
  GemmCall strided = held;
  strided.lda = 800;
  CHECK(gemm_key(strided) != gemm_key(held));
  GemmCall less_aligned = held;
  less_aligned.A_bf16 = at(0x10010);
  CHECK(gemm_key(less_aligned) != gemm_key(held));
  // A weight-gradient product's x (its B) held in bf16.
  GemmCall wgrad = proj_wgrad(MatmulMode::bf16);
  wgrad.B = nullptr;
  wgrad.B_bf16 = at(0x20010);
  wgrad.a_sums = at_mut(0x60000);
  CHECK(gemm_refusal(wgrad).empty());
  CHECK(gemm_key(wgrad).find("align 256,16,") != std::string::npos);
  // Refused: a bf16-only operand under f32 or tf32 products, and a missing one. The sums of an A
  // held in bf16 only (a gradient the model holds in bf16) are served under bf16 products (the
  // unfused bias gradient sums its bf16 values with a bf16 product of ones), under no other mode.
  for (MatmulMode mode : {MatmulMode::f32, MatmulMode::tf32}) {
    GemmCall g = held;
    g.mode = mode;
    CHECK(gemm_refusal(g).find("bf16 products only") != std::string::npos);
  }
  GemmCall none = held;
  none.A_bf16 = nullptr;
  CHECK(gemm_refusal(none).find("missing operand") != std::string::npos);
  GemmCall sums = wgrad;
  sums.A_bf16 = sums.A;
  sums.A = nullptr;
  CHECK(gemm_refusal(sums).empty());
  sums.mode = MatmulMode::tf32;
  CHECK_FALSE(gemm_refusal(sums).empty());
  sums.A_bf16 = nullptr;
  sums.mode = MatmulMode::bf16;
  CHECK(gemm_refusal(sums).find("missing operand") != std::string::npos);
}

TEST_CASE("gemm plan: a bf16 weight copy is read in place only where it and its rows are 16-byte aligned") {
  using gemm_plan::bf16_in_place;
  const float* f32 = at(0x70000);
  CHECK(bf16_in_place(at(0x20000), f32, 768));        // GPT-2's weights: aligned, rows of 1536 bytes
  CHECK_FALSE(bf16_in_place(at(0x20002), f32, 768));  // a weight after an odd-sized one: packed
  CHECK_FALSE(bf16_in_place(at(0x20000), f32, 37));   // rows of 74 bytes: packed
  CHECK_FALSE(bf16_in_place(nullptr, f32, 768));      // no copy: packed
  // An activation held in bf16 has no f32 values to pack from: read where it is, whatever its layout.
  CHECK(bf16_in_place(at(0x20002), nullptr, 37));
  // An output gradient rounded once for two products (gemm_bf16_once: f32 values and a packed,
  // 256-byte aligned copy) plans like the copy each product made of it before: the same plans.
  GemmCall own_copy = proj_wgrad(MatmulMode::bf16);
  GemmCall shared = own_copy;
  shared.A_bf16 = at(0x80000);
  CHECK(gemm_plan::bf16_in_place(shared.A_bf16, shared.A, shared.lda));
  CHECK(gemm_key(shared) == gemm_key(own_copy));
  // The key follows: a weight packed for its alignment plans like a weight with no copy.
  GemmCall odd = fc_forward();
  odd.B_bf16 = at(0x20002);
  GemmCall none = fc_forward();
  CHECK(gemm_key(odd) == gemm_key(none));
  GemmCall aligned = fc_forward();
  aligned.B_bf16 = at(0x20010);
  CHECK(gemm_key(aligned) != gemm_key(none));
}

TEST_CASE("gemm plan: FP8 products fuse the forward epilogues on a bf16 output, and run the others as passes") {
  for (const MatmulMode mode : {MatmulMode::fp8, MatmulMode::fp8_e4m3}) {
    // fc's forward writing pre and post in bf16, its bias from the bf16 copy: GELU_AUX_BIAS.
    GemmCall fwd = fc_forward();
    fwd.mode = mode;
    fwd.d_bf16 = true;
    fwd.bias = nullptr;
    fwd.bias_bf16 = at(0x40000);
    CHECK(fused_epilogue(fwd) == "GELU_AUX_BIAS");
    CHECK(gemm_refusal(fwd).empty());
    // q, k or v in bf16 with its bias; and a projection adding to a bf16 residual stream (C, beta 1).
    GemmCall q = fwd;
    q.act = Activation::none;
    q.aux = nullptr;
    CHECK(fused_epilogue(q) == "BIAS");
    q.C = at(0x60000);
    q.beta = 1.0f;
    CHECK(fused_epilogue(q) == "BIAS");
    CHECK(gemm_refusal(q).empty());
    // An f32 output's bias, the GELU's gradient and a bias gradient: passes of their own.
    GemmCall f32 = fc_forward();
    f32.mode = mode;
    CHECK(fused_epilogue(f32).empty());
    f32.act = Activation::none;
    f32.aux = nullptr;
    CHECK(fused_epilogue(f32).empty());
    GemmCall wgrad = proj_wgrad(mode);
    CHECK(fused_epilogue(wgrad) == "DEFAULT");
    wgrad.a_sums = at_mut(0x70000);
    CHECK(fused_epilogue(wgrad).empty());
    // The same calls under bf16 products fuse as before.
    f32.mode = MatmulMode::bf16;
    f32.bias = at(0x40000);
    CHECK(fused_epilogue(f32) == "BIAS");
  }
}
