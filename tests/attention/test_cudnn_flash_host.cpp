// `cudnn_flash` without a GPU: its graph keys (every field that changes a graph changes the key,
// equal problems give equal keys, packed batches share a graph within a segment bound and a length
// bound, a batch without padding takes the unmasked graph whatever the problem says), the host
// twin of its ragged-offset kernel against a direct walk of random packed layouts, the padded
// lengths, its supports() answers through the Registry, and cuDNN SDPA graphs (bf16, THD with GQA,
// causal, padding mask; dense without a mask; ragged with a sequence dimension below T; forward and
// backward) described, validated and lowered to cuDNN operation graphs for SM90 with no device. Execution plans need a device and are left to tests/gpu.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ablate/attention.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "attention_support.hpp"
#include "cudnn_library.hpp"
#include "graph_key.hpp"
#include "ragged.hpp"
#include "sdpa_graph.hpp"
#include "test_support.hpp"

using namespace ablate;
using namespace ablate::cudnn_flash;
using ablate::test::make_batch;
using ablate::test::random_packed_row;
using ablate::test::RowLayout;

namespace {

AttentionProblem problem(int32_t B, int32_t T, int32_t H, int32_t Hkv, int32_t D, bool packed, DType dtype = DType::f32) {
  AttentionProblem p;
  p.batch = B;
  p.seq_len = T;
  p.heads = H;
  p.kv_heads = Hkv;
  p.head_dim = D;
  p.dtype = dtype;
  p.device = DeviceType::cuda;
  p.packed = packed;
  return p;
}

struct Flash {
  Registry registry;
  Params common{"attention", {}};
  Params own{"attention.cudnn_flash", {}};
  RunContext run;
  std::unique_ptr<Attention> attention;
  Flash() {
    registry.load_directories({test::plugin_dir()});
    run.device = "cuda";
    attention = registry.create<Attention>(Kind::attention, "cudnn_flash", {common, own, run});
  }
};

// Expected metadata from the rows' (start, length) lists directly: segments in row order, token
// r * T + start, the empty entries after them at the end of the data.
struct Expected {
  std::vector<int32_t> lengths, q, kv, stats;
};

Expected walk(const std::vector<RowLayout>& rows, int32_t T, int32_t H, int32_t Hkv, int32_t D, int32_t bound) {
  Expected e;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (auto [start, length] : rows[r]) {
      const int64_t token = int64_t(r) * T + start;
      e.lengths.push_back(length);
      e.q.push_back(int32_t(token * H * D));
      e.kv.push_back(int32_t(token * Hkv * D));
      e.stats.push_back(int32_t(token * H));
    }
  }
  const int64_t end = int64_t(rows.size()) * T;
  while (int32_t(e.lengths.size()) < bound) e.lengths.push_back(0);
  while (int32_t(e.q.size()) < bound + 1) {
    e.q.push_back(int32_t(end * H * D));
    e.kv.push_back(int32_t(end * Hkv * D));
    e.stats.push_back(int32_t(end * H));
  }
  return e;
}

// A batch of `n` segments that may hold padding and a T-long segment.
BatchLayout segments(int32_t n, int32_t longest = 77) { return BatchLayout{n, longest, false}; }

}  // namespace

TEST_CASE("graph keys: equal problems give one key, every field that changes the graph another") {
  const AttentionProblem p = problem(4, 77, 6, 2, 64, true);
  const GraphKey base = make_graph_key(p, segments(10), Pass::forward, 0, 90, 91900);
  CHECK(base == make_graph_key(p, segments(10), Pass::forward, 0, 90, 91900));
  CHECK(GraphKeyHash{}(base) == GraphKeyHash{}(make_graph_key(p, segments(10), Pass::forward, 0, 90, 91900)));
  // 9 and 10 segments in 4 rows share the bound 10, so the graph; 11 does not.
  CHECK(base.segment_bound == 10);
  CHECK(base.max_len == 77);  // a segment may fill the row: the length bound is T
  CHECK(make_graph_key(p, segments(9), Pass::forward, 0, 90, 91900) == base);
  CHECK(make_graph_key(p, segments(11), Pass::forward, 0, 90, 91900) != base);
  // So do batches whose longest segments round to the same power of two (at least 64).
  CHECK(make_graph_key(p, segments(10, 70), Pass::forward, 0, 90, 91900) == base);
  const GraphKey short_docs = make_graph_key(p, segments(10, 40), Pass::forward, 0, 90, 91900);
  CHECK(short_docs.max_len == 64);
  CHECK(short_docs.sequence_dim() == 64);
  CHECK(short_docs == make_graph_key(p, segments(10, 1), Pass::forward, 0, 90, 91900));
  CHECK(short_docs != base);
  // Rows without padding: the dense graph for a packed and a padded problem alike, no mask.
  const BatchLayout full{4, 77, true};
  const GraphKey dense = make_graph_key(p, full, Pass::forward, 0, 90, 91900);
  CHECK(dense.layout == Layout::dense);
  CHECK(!dense.masked());
  CHECK(dense.sequences() == 4);
  CHECK(dense.sequence_dim() == 77);
  CHECK(dense == make_graph_key(problem(4, 77, 6, 2, 64, false), full, Pass::forward, 0, 90, 91900));
  CHECK(dense.describe() == "forward dense B 4 T 77 H 6 Hkv 2 D 64 f32 causal sm90 device 0 cuDNN 91900");
  // Padded rows: the segment count plays no part.
  const AttentionProblem padded = problem(4, 77, 6, 2, 64, false);
  CHECK(make_graph_key(padded, segments(3), Pass::forward, 0, 90, 91900) ==
        make_graph_key(padded, segments(4), Pass::forward, 0, 90, 91900));
  CHECK(make_graph_key(padded, segments(4), Pass::forward, 0, 90, 91900).segment_bound == 0);
  CHECK(make_graph_key(padded, segments(4), Pass::forward, 0, 90, 91900).layout == Layout::padded);
  CHECK(make_graph_key(padded, segments(4), Pass::forward, 0, 90, 91900).masked());

  std::vector<GraphKey> changed;
  const auto with = [&](auto change) {
    GraphKey k = base;
    change(k);
    changed.push_back(k);
  };
  with([](GraphKey& k) { k.batch = 5; });
  with([](GraphKey& k) { k.seq_len = 78; });
  with([](GraphKey& k) { k.heads = 8; });
  with([](GraphKey& k) { k.kv_heads = 3; });
  with([](GraphKey& k) { k.head_dim = 128; });
  with([](GraphKey& k) { k.layout = Layout::padded; });
  with([](GraphKey& k) { k.layout = Layout::dense; });
  with([](GraphKey& k) { k.segment_bound = 12; });
  with([](GraphKey& k) { k.max_len = 64; });
  with([](GraphKey& k) { k.dtype = DType::bf16; });
  with([](GraphKey& k) { k.causal = false; });
  with([](GraphKey& k) { k.pass = Pass::backward; });
  with([](GraphKey& k) { k.device = 1; });
  with([](GraphKey& k) { k.sm = 100; });
  with([](GraphKey& k) { k.cudnn_version = 91901; });
  std::vector<std::size_t> hashes{GraphKeyHash{}(base)};
  for (const GraphKey& k : changed) {
    INFO(k.describe());
    CHECK(k != base);
    hashes.push_back(GraphKeyHash{}(k));
  }
  std::sort(hashes.begin(), hashes.end());
  CHECK(std::adjacent_find(hashes.begin(), hashes.end()) == hashes.end());
  CHECK(base.describe() == "forward packed B 4 T 77 H 6 Hkv 2 D 64 sequences 10 longest 77 f32 causal sm90 device 0 cuDNN 91900");
}

TEST_CASE("workspace: an f32 problem's bf16 copies are counted, a bf16 problem's are not, and no T x T block") {
  Flash f;
  AttentionProblem p{
      .batch = 8, .seq_len = 1024, .heads = 12, .kv_heads = 4, .head_dim = 64, .dtype = DType::f32, .device = DeviceType::cuda};
  const int64_t q = int64_t(8) * 1024 * 12 * 64, kv = int64_t(8) * 1024 * 4 * 64;
  CHECK(f.attention->workspace_bytes(p) >= 2 * (4 * q + 4 * kv));  // q, o, dO, dQ and k, v, dK, dV in bf16
  CHECK(f.attention->workspace_bytes(p) < 2 * (4 * q + 4 * kv) + (1 << 20));
  // out held in bf16 by the model: O is neither widened nor copied back in backward.
  AttentionProblem held = p;
  held.bf16_out = true;
  CHECK(f.attention->bf16_activations());
  CHECK(f.attention->workspace_bytes(p) - f.attention->workspace_bytes(held) == 2 * q);
  held.bf16_qkv = true;  // and q, k, v: their copies go too, dO, dQ, dK, dV stay
  CHECK(f.attention->workspace_bytes(p) - f.attention->workspace_bytes(held) == 2 * (2 * q + 2 * kv));
  p.dtype = DType::bf16;
  CHECK(f.attention->workspace_bytes(p) < (1 << 20));
}

TEST_CASE("the frontend's own CUDA runtime is pinned to the one the plugin was built against") {
  // cudnn-frontend opens libcudart itself, the first of .so.12 and .so.13 it finds unless told;
  // loading cuDNN names ours (a value the user set is kept).
  const char* before = std::getenv("CUDNN_FRONTEND_CUDART_LIB_NAME");
  const std::string preset = before != nullptr ? before : "";
  (void)cudnn_library();
  const char* after = std::getenv("CUDNN_FRONTEND_CUDART_LIB_NAME");
  REQUIRE(after != nullptr);
  CHECK(std::string(after) == (preset.empty() ? "libcudart.so." + std::to_string(CUDART_VERSION / 1000) : preset));
}

TEST_CASE("segment_bound: the count (at least the rows) rounded up to its top three bits") {
  // Brute force: the smallest value >= max(n, rows) whose binary form has at most three significant
  // bits (values under 8 are themselves).
  const auto top_three_bits = [](int64_t v) {
    int64_t bits = 0;
    while (v >= 8) {
      if (v & 1) return false;
      v >>= 1;
      ++bits;
    }
    return true;
  };
  for (int32_t rows : {1, 3, 4, 8, 64}) {
    int32_t previous = 0;
    std::vector<int32_t> distinct;
    for (int32_t n = 0; n <= 3000; ++n) {
      const int32_t b = segment_bound(n, rows);
      INFO("rows " << rows << " segments " << n << " bound " << b);
      int64_t want = std::max({n, rows, 1});
      while (!top_three_bits(want)) ++want;
      CHECK(b == want);
      CHECK(b >= previous);
      CHECK(4 * int64_t(b) <= 5 * int64_t(std::max({n, rows, 8})));  // at most 25% empty entries past 8
      if (distinct.empty() || distinct.back() != b) distinct.push_back(b);
      previous = b;
    }
    // Four graphs per doubling: between 1000 and 2000 segments, five bounds.
    CHECK(std::count_if(distinct.begin(), distinct.end(), [](int32_t b) { return b >= 1000 && b <= 2048; }) <= 5);
  }
  CHECK(segment_bound(0, 0) == 1);
  CHECK(segment_bound(220, 64) == 224);
  CHECK(segment_bound(257, 64) == 320);
}

TEST_CASE("length_bound: the longest segment rounded up to a power of two, at least 64, at most T") {
  CHECK(length_bound(1, 1024) == 64);
  CHECK(length_bound(64, 1024) == 64);
  CHECK(length_bound(65, 1024) == 128);
  CHECK(length_bound(300, 1024) == 512);
  CHECK(length_bound(1024, 1024) == 1024);
  CHECK(length_bound(600, 1000) == 1000);
  CHECK(length_bound(10, 40) == 40);
  for (int32_t T : {2, 40, 77, 1024}) {
    for (int32_t longest = 1; longest <= T; ++longest) {
      const int32_t b = length_bound(longest, T);
      CHECK(b >= longest);
      CHECK(b <= T);
      CHECK((b == T || (b >= 64 && (b & (b - 1)) == 0)));
    }
  }
}

TEST_CASE("batch_layout: full rows only when every row is one segment of length T") {
  const auto layout = [](const Batch& b) { return batch_layout(&b, int32_t(b.segments.size()), b.rows, b.seq_len); };
  const Batch dense = make_batch(8, {{{0, 8}}, {{0, 8}}, {{0, 8}}});
  CHECK(layout(dense).full_rows);
  CHECK(layout(dense).longest == 8);
  CHECK(layout(dense).segments == 3);
  CHECK(!layout(make_batch(8, {{{0, 8}}, {{0, 7}}})).full_rows);          // a short row
  CHECK(!layout(make_batch(8, {{{0, 8}}, {}})).full_rows);                // an empty row
  CHECK(!layout(make_batch(8, {{{0, 8}}, {{0, 3}, {3, 5}}})).full_rows);  // two documents in a row
  CHECK(layout(make_batch(8, {{{0, 3}, {3, 5}}, {{0, 2}}})).longest == 5);
  // Without the host copy nothing is assumed.
  const BatchLayout unknown = batch_layout(nullptr, 3, 3, 8);
  CHECK(!unknown.full_rows);
  CHECK(unknown.longest == 8);
}

TEST_CASE("ragged offsets: the kernel's host twin against a direct walk of random packed layouts") {
  std::mt19937 rng(7);
  for (int32_t T : {1, 2, 7, 64, 77, 130}) {
    for (auto [H, Hkv, D] : {std::tuple{4, 4, 64}, std::tuple{6, 2, 128}, std::tuple{8, 2, 8}}) {
      for (int trial = 0; trial < 5; ++trial) {
        std::vector<RowLayout> rows;
        rows.push_back(random_packed_row(T, rng));
        rows.push_back({{0, T}});                   // one segment filling the row
        rows.push_back({{0, std::max(1, T / 2)}});  // one segment and a padding tail
        rows.push_back({});                         // all padding
        RowLayout ones;                             // every segment of length 1, the last position padding
        for (int32_t t = 0; t + 1 < T; ++t) ones.push_back({t, 1});
        rows.push_back(ones);
        rows.push_back(random_packed_row(T, rng));
        std::shuffle(rows.begin(), rows.end(), rng);
        const Batch batch = make_batch(T, rows);
        const int32_t B = batch.rows, S = int32_t(batch.segments.size());
        const int32_t bound = segment_bound(S, B);
        const RaggedShape shape{B, T, H, Hkv, D};
        std::vector<int32_t> lengths(std::size_t(bound), -1), q(std::size_t(bound) + 1, -1), kv(q), st(q);
        fill_ragged_host(S, bound, reinterpret_cast<const int32_t*>(batch.segments.data()), batch.row_segments.data(), shape,
                         lengths.data(), q.data(), kv.data(), st.data());
        const Expected want = walk(rows, T, H, Hkv, D, bound);
        INFO("T " << T << " H " << H << " Hkv " << Hkv << " D " << D << " segments " << S << " bound " << bound);
        CHECK(lengths == want.lengths);
        CHECK(q == want.q);
        CHECK(kv == want.kv);
        CHECK(st == want.stats);

        // Every real position lies in exactly one entry, padding in none (from the segment ids).
        std::vector<int> covered(std::size_t(B) * T, 0);
        for (int32_t i = 0; i < bound; ++i) {
          const int64_t first = st[std::size_t(i)] / H;
          for (int64_t t = first; t < first + lengths[std::size_t(i)]; ++t) ++covered[std::size_t(t)];
          CHECK(q[std::size_t(i)] <= q[std::size_t(i) + 1]);  // offsets never decrease
        }
        for (std::size_t at = 0; at < covered.size(); ++at) {
          CHECK(covered[at] == (batch.segment_ids[at] != 0 ? 1 : 0));
        }
      }
    }
  }
}

TEST_CASE("padded lengths: each row's single segment, 0 for an empty row") {
  std::mt19937 rng(11);
  for (int32_t T : {1, 7, 77}) {
    std::vector<RowLayout> rows;
    std::vector<int32_t> want;
    for (int r = 0; r < 9; ++r) {
      const int32_t length = std::uniform_int_distribution<int32_t>(0, T)(rng);
      rows.push_back(length > 0 ? RowLayout{{0, length}} : RowLayout{});
      want.push_back(length);
    }
    const Batch batch = make_batch(T, rows);
    std::vector<int32_t> lengths(rows.size(), -1);
    fill_padded_host(reinterpret_cast<const int32_t*>(batch.segments.data()), batch.row_segments.data(), int32_t(rows.size()),
                     lengths.data());
    CHECK(lengths == want);
  }
}

TEST_CASE("supports: refusals with their reasons, answered without a GPU") {
  Flash f;
  Attention& a = *f.attention;
  const auto refuses = [&](const AttentionProblem& p, const std::string& words) {
    const std::string why = a.supports(p);
    INFO("reason: " << why);
    CHECK(why.find(words) != std::string::npos);
  };
  AttentionProblem cpu = problem(2, 64, 4, 4, 64, false);
  cpu.device = DeviceType::cpu;
  refuses(cpu, "CUDA device");
  refuses(problem(2, 64, 4, 4, 64, false, DType::f64), "f64");
  refuses(problem(2, 64, 4, 4, 64, false, DType::f16), "f16");
  refuses(problem(2, 64, 4, 4, 136, false), "at most 128");
  refuses(problem(2, 64, 4, 4, 60, false), "multiple of 8");
  refuses(problem(2, 64, 5, 2, 64, true), "multiple of kv_heads");
  refuses(problem(2, 64, 4, 0, 64, true), "kv_heads");
  refuses(problem(64, 8192, 64, 8, 128, true), "2^31");
  refuses(problem(4, 1, 4, 4, 64, true), "seq_len >= 2");
  CHECK(a.saved_elements(problem(3, 77, 6, 2, 64, true)) == 3 * 77 * 6);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool packed : {false, true}) {
      for (auto [H, Hkv, D] : {std::tuple{4, 4, 64}, std::tuple{6, 2, 128}, std::tuple{12, 3, 8}}) {
        const AttentionProblem p = problem(4, 77, H, Hkv, D, packed, dtype);
        if (!cuda::device_available()) {
          CHECK(a.supports(p).empty());
        } else {
          MESSAGE("with a device: " << a.supports(p));  // the device and cuDNN may refuse; tests/gpu runs it
        }
      }
    }
  }
}

TEST_CASE("forward without a device fails with an ablate error, not a crash") {
  if (cuda::device_available()) return;  // the GPU test runs it for real
  Flash f;
  const AttentionProblem p = problem(2, 8, 2, 1, 64, true);
  const Batch batch = make_batch(8, {{{0, 3}, {3, 5}}, {{0, 8}}});
  BatchViews views = host_batch_views(batch);
  views.device = DeviceType::cuda;  // never read: the call stops before any kernel
  alignas(16) static float fake[1];
  const auto tensor = [&](int64_t heads, DType dtype = DType::f32) {
    TensorView t;
    t.data = fake;
    t.dtype = dtype;
    t.device = DeviceType::cuda;
    t.ndim = 4;
    t.shape = {p.batch, p.seq_len, heads, p.head_dim};
    return t;
  };
  TensorView saved = flat_view(fake, DType::f32, f.attention->saved_elements(p), DeviceType::cuda);
  CHECK_THROWS_AS(test::attention_forward(*f.attention, p, views, tensor(2), tensor(1), tensor(1), tensor(2), saved), Error);
  // Wrong shapes are named before anything else; so is an out of another dtype than the problem's.
  CHECK_THROWS_WITH_AS(test::attention_forward(*f.attention, p, views, tensor(2), tensor(2), tensor(1), tensor(2), saved),
                       doctest::Contains("k has shape"), Error);
  CHECK_THROWS_WITH_AS(test::attention_forward(*f.attention, p, views, tensor(2), tensor(1), tensor(1), tensor(2, DType::bf16), saved),
                       doctest::Contains("out is bf16 but the problem's out is f32"), Error);
  AttentionProblem held = p;
  held.bf16_out = true;  // out must then be bf16, the rest f32
  CHECK_THROWS_WITH_AS(test::attention_forward(*f.attention, held, views, tensor(2), tensor(1), tensor(1), tensor(2), saved),
                       doctest::Contains("out is f32 but the problem's out is bf16"), Error);
  CHECK_THROWS_WITH_AS(test::attention_forward(*f.attention, held, views, tensor(2, DType::bf16), tensor(1), tensor(1),
                                               tensor(2, DType::bf16), saved),
                       doctest::Contains("q is bf16 but the problem's q, k, v are f32"), Error);
  held.bf16_qkv = true;  // q, k, v bf16 too; the gradients stay f32
  CHECK_THROWS_WITH_AS(test::attention_forward(*f.attention, held, views, tensor(2, DType::bf16), tensor(1), tensor(1),
                                               tensor(2, DType::bf16), saved),
                       doctest::Contains("k is f32 but the problem's q, k, v are bf16"), Error);
  const TensorView q16 = tensor(2, DType::bf16), kv16 = tensor(1, DType::bf16);
  CHECK_THROWS_WITH_AS(test::attention_backward(*f.attention, held, views, q16, kv16, kv16, q16, saved, q16, tensor(2), tensor(1),
                                                tensor(1)),
                       doctest::Contains("d_out is bf16 but the problem's gradients are f32"), Error);
}

TEST_CASE(
    "cuDNN graphs: bf16 THD + GQA + causal + padding mask, dense, short ragged; forward and backward, lowered for SM90 without a GPU") {
  const CudnnLibrary& lib = cudnn_library();
  if (!lib.loaded) {
    MESSAGE("cuDNN could not be loaded here (" << lib.error << "): graph lowering not checked");
    return;
  }
  MESSAGE("cuDNN " << lib.version << " from " << lib.path);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    for (bool packed : {true, false}) {
      for (auto [H, Hkv, D] : {std::tuple{6, 2, 64}, std::tuple{8, 2, 128}, std::tuple{4, 4, 64}}) {
        const AttentionProblem p = problem(3, 256, H, Hkv, D, packed);
        // A batch that may hold T-long segments, one of short ones (sequence dimension 64 < T), and
        // one without padding (the dense graph: no mask, no sequence lengths).
        for (const BatchLayout& b : {segments(11, 256), segments(11, 50), BatchLayout{3, 256, true}}) {
          const GraphKey key = make_graph_key(p, b, pass, 0, 90, lib.version);
          INFO(key.describe());
          const SdpaGraph::Built built = SdpaGraph::build(key, nullptr);
          CHECK_MESSAGE(built.error.empty(), built.error);
          REQUIRE(built.graph != nullptr);
          CHECK(built.graph->key() == key);
          CHECK(built.graph->workspace_bytes() == 0);  // no plan without a device
          CHECK(built.graph->plans() == 0);
        }
      }
    }
  }
  // A head count that is no multiple of the kv heads is refused by validation.
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const GraphKey key = make_graph_key(problem(2, 64, 5, 2, 64, true), segments(4, 64), pass, 0, 90, lib.version);
    const SdpaGraph::Built built = SdpaGraph::build(key, nullptr);
    INFO(built.error);
    CHECK(built.graph == nullptr);
    CHECK(built.error.find("validate") != std::string::npos);
  }
}
