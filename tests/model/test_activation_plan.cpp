// The activation plan (core/src/model_plan.hpp) as the pure function it is: offsets and sizes
// against totals worked out by hand below, each slot starting where the one before it ends (so
// none overlaps), the recompute modes' aliasing, and the bf16 policy's levels.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "model_plan.hpp"

using namespace ablate;
using namespace ablate::schedule;

namespace {

// 2 blocks, d_model 64, 4 query heads and 2 kv heads of 16: Hd = 64, Kd = 32. Batch 2 x 8: N = 16.
// Every size below is in f32 elements, each slot rounded up to 64.
const PlanShape kShape{2, 64, 4, 2, 16, false};
SavedSizes saved() {
  SavedSizes s;
  s.norm = 32;       // -> 64
  s.attention = 64;  // -> 64
  s.mlp = 100;       // -> 128
  s.scratch = 10;    // -> 64
  return s;
}

// Per block: res, ln1, q_lin, att, mid, ln2 at N*C = N*Hd = 1024 (6144); k_lin, v at N*Kd = 512
// (1024); ln1_s, ln2_s, att_s 64 each (192); mlp_s 128. In the order taken:
//   res 1024 + ln1 1024 + ln1_s 64 + q_lin 1024 + k_lin 512 + v 512 + att 1024 + att_s 64
//   + mid 1024 + ln2 1024 + ln2_s 64 + mlp_s 128 = 7488
// After the blocks: res[2] 1024, lnf 1024, lnf_s 64, losses 64 (16 -> 64), d_res 1024, d_ln 1024,
// d_q 1024, d_k 512, d_v 512, d_att 1024, scratch 64 = 7360.
constexpr int64_t kBlock = 7488, kTail = 7360;


}  // namespace

TEST_CASE("the arena of a small model holds exactly the slots worked out by hand") {
  const ArenaPlan p = plan_arena(kShape, Bf16Policy{}, "none", 2, 8, saved());
  CHECK(p.rows == 2);
  CHECK(p.seq_len == 8);
  CHECK(p.elements == 2 * kBlock + kTail);
  CHECK(p.scratch_elements == 10);
  // Slots in the order taken, each 64 aligned and where the one before it ends.
  CHECK(p.at(in_block(0, Slot::res)) == 0);
  CHECK(p.at(in_block(0, Slot::ln1)) == 1024);
  CHECK(p.at(in_block(0, Slot::ln1_s)) == 2048);
  CHECK(p.at(in_block(0, Slot::q_lin)) == 2112);
  CHECK(p.at(in_block(1, Slot::res)) == kBlock);
  CHECK(p.at(in_block(2, Slot::res)) == 2 * kBlock);
  CHECK(p.at(shared(Slot::scratch)) == 2 * kBlock + kTail - 64);
  // Block 1, slot after slot, each the size worked out above past the one before it.
  const std::pair<Slot, int64_t> block[] = {{Slot::res, 1024},  {Slot::ln1, 1024}, {Slot::ln1_s, 64}, {Slot::q_lin, 1024},
                                            {Slot::k_lin, 512}, {Slot::v, 512},    {Slot::att, 1024}, {Slot::att_s, 64},
                                            {Slot::mid, 1024},  {Slot::ln2, 1024}, {Slot::ln2_s, 64}, {Slot::mlp_s, 128}};
  int64_t at = kBlock;
  for (const auto& [slot, size] : block) {
    CHECK(p.at(in_block(1, slot)) == at);
    at += size;
  }
  CHECK(at == 2 * kBlock);
}

TEST_CASE("without qk-norm q and k are the projections' slots, and so are their gradients") {
  const ArenaPlan p = plan_arena(kShape, Bf16Policy{}, "none", 2, 8, saved());
  for (int32_t b = 0; b < 2; ++b) {
    CHECK(p.at(in_block(b, Slot::q)) == p.at(in_block(b, Slot::q_lin)));
    CHECK(p.at(in_block(b, Slot::k)) == p.at(in_block(b, Slot::k_lin)));
  }
  CHECK(p.at(shared(Slot::d_qlin)) == p.at(shared(Slot::d_q)));
  CHECK(p.at(shared(Slot::d_klin)) == p.at(shared(Slot::d_k)));

  PlanShape with = kShape;
  with.qk_norm = true;
  SavedSizes s = saved();
  s.q_norm = 64;
  s.k_norm = 32;  // -> 64
  const ArenaPlan q = plan_arena(with, Bf16Policy{}, "none", 2, 8, s);
  // Per block q 1024 + k 512 + qn_s 64 + kn_s 64 more; d_qlin 1024 + d_klin 512 once.
  CHECK(q.elements == 2 * (kBlock + 1664) + kTail + 1536);
  CHECK(q.at(in_block(0, Slot::q)) != q.at(in_block(0, Slot::q_lin)));
}

TEST_CASE("recompute holds a recomputed slot once, in block 0's place") {
  const ArenaPlan none = plan_arena(kShape, Bf16Policy{}, "none", 2, 8, saved());
  const ArenaPlan mlp = plan_arena(kShape, Bf16Policy{}, "mlp", 2, 8, saved());
  const ArenaPlan block = plan_arena(kShape, Bf16Policy{}, "block", 2, 8, saved());
  CHECK(mlp.elements == none.elements - 128);                // block 1's mlp_s
  CHECK(block.elements == none.elements - (kBlock - 1024));  // all of block 1 but res
  CHECK(mlp.at(in_block(1, Slot::mlp_s)) == mlp.at(in_block(0, Slot::mlp_s)));
  CHECK(mlp.at(in_block(1, Slot::ln2_s)) != mlp.at(in_block(0, Slot::ln2_s)));
  for (int s = int(Slot::res); s <= int(Slot::mlp_s); ++s) {
    const Slot slot = Slot(s);
    CHECK(recomputed(slot, "block") == (slot != Slot::res));
    CHECK(recomputed(slot, "mlp") == (slot == Slot::mlp_s));
    CHECK_FALSE(recomputed(slot, "none"));
    if (slot == Slot::q || slot == Slot::k || slot == Slot::qn_s || slot == Slot::kn_s) continue;  // aliased anyway
    CHECK((block.at(in_block(1, slot)) == block.at(in_block(0, slot))) == (slot != Slot::res));
  }
}

TEST_CASE("the bf16 policy: each level needs the one before, and a bf16 slot takes half") {
  Bf16Policy::Answers all{true, true, true};
  CHECK_FALSE(Bf16Policy::decide(false, all).norm_outputs);
  const Bf16Policy full = Bf16Policy::decide(true, all);
  CHECK((full.norm_outputs && full.attention_out && full.qkv));
  const Bf16Policy no_products = Bf16Policy::decide(true, {false, true, true});
  CHECK_FALSE((no_products.norm_outputs || no_products.attention_out || no_products.qkv));
  const Bf16Policy norms_only = Bf16Policy::decide(true, {true, false, true});
  CHECK((norms_only.norm_outputs && !norms_only.attention_out && !norms_only.qkv));
  CHECK(norms_only.slot_dtype(Slot::ln1) == DType::bf16);
  CHECK(norms_only.slot_dtype(Slot::att) == DType::f32);
  CHECK(full.slot_dtype(Slot::q_lin) == DType::bf16);
  CHECK(full.slot_dtype(Slot::res) == DType::f32);
  CHECK(full.slot_dtype(Slot::d_q) == DType::f32);  // gradients stay f32 unless the backend and the layers say so
  const Bf16Policy grads = Bf16Policy::decide(true, {true, true, true, true, true});
  CHECK(grads.grads);
  for (Slot g : {Slot::d_q, Slot::d_k, Slot::d_v, Slot::d_att, Slot::d_qlin, Slot::d_klin}) CHECK(grads.slot_dtype(g) == DType::bf16);
  CHECK(grads.slot_dtype(Slot::d_res) == DType::f32);  // the residual stream's and the norms' stay f32
  CHECK(grads.slot_dtype(Slot::d_ln) == DType::f32);
  CHECK_FALSE(Bf16Policy::decide(true, {true, true, false, true, true}).grads);  // needs q, k, v held in bf16
  CHECK_FALSE(Bf16Policy::decide(true, {true, true, true, false, true}).grads);  // and the backend
  CHECK_FALSE(Bf16Policy::decide(true, {true, true, true, true, false}).grads);  // and the layers
  // d_q and d_att halve (1024 -> 512), d_k and d_v (512 -> 256): 1536 once.
  CHECK(plan_arena(kShape, grads, "none", 2, 8, saved()).elements == plan_arena(kShape, full, "none", 2, 8, saved()).elements - 1536);

  // Per block ln1, ln2, q_lin, att halve (1024 -> 512) and k_lin, v (512 -> 256): 2560 each;
  // lnf 512 once.
  const ArenaPlan p = plan_arena(kShape, full, "none", 2, 8, saved());
  CHECK(p.elements == 2 * kBlock + kTail - 2 * 2560 - 512);
  CHECK(p.dtype(in_block(1, Slot::ln2)) == DType::bf16);
  CHECK(p.dtype(in_block(1, Slot::q)) == DType::bf16);  // aliased to q_lin, type and all
  // An odd width, one row: res holds 129 f32 (-> 192); ln1 129 bf16 in 65 elements (-> 128).
  const PlanShape odd{1, 129, 1, 1, 129, false};
  const ArenaPlan t = plan_arena(odd, full, "none", 1, 1, saved());
  CHECK(t.at(in_block(0, Slot::ln1)) - t.at(in_block(0, Slot::res)) == 192);
  CHECK(t.at(in_block(0, Slot::ln1_s)) - t.at(in_block(0, Slot::ln1)) == 128);
}

TEST_CASE("the bf16 policy's residual stream: asked for, on the norms' outputs in bf16, and no layer refusing it") {
  Bf16Policy::Answers all{true, true, true, true, true};
  CHECK_FALSE(Bf16Policy::decide(true, all).residual);  // not asked: run.residual_dtype = fp32
  const Bf16Policy stream = Bf16Policy::decide(true, all, true);
  CHECK(stream.residual);
  for (Slot s : {Slot::res, Slot::mid}) CHECK(stream.slot_dtype(s) == DType::bf16);
  CHECK(stream.slot_dtype(Slot::d_res) == DType::f32);  // its gradient stays f32
  CHECK(stream.slot_dtype(Slot::losses) == DType::f32);
  CHECK_FALSE(Bf16Policy::decide(false, all, true).residual);                             // no bf16 products
  CHECK_FALSE(Bf16Policy::decide(true, {false, true, true, true, true}, true).residual);  // norms' outputs f32
  Bf16Policy::Answers refused = all;
  refused.residual_refused_by = "lora";
  CHECK_FALSE(Bf16Policy::decide(true, refused, true).residual);
  // Per block res and mid halve (1024 -> 512), and the last res once: 5 x 512.
  const Bf16Policy full = Bf16Policy::decide(true, all);
  const ArenaPlan f = plan_arena(kShape, full, "none", 2, 8, saved()), r = plan_arena(kShape, stream, "none", 2, 8, saved());
  CHECK(f.elements - r.elements == 5 * 512);
  CHECK(r.bf16_elements - f.bf16_elements == 5 * 512);
  CHECK(r.dtype(in_block(2, Slot::res)) == DType::bf16);
  // Recomputing a whole block keeps only res per block: mid is held once, in block 0's place.
  const ArenaPlan b = plan_arena(kShape, stream, "block", 2, 8, saved());
  CHECK(b.at(in_block(1, Slot::mid)) == b.at(in_block(0, Slot::mid)));
  CHECK(b.dtype(in_block(1, Slot::mid)) == DType::bf16);
}
