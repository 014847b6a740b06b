// cuDNN SDPA graphs through cudnn-frontend (see sdpa_graph.hpp for the layouts).
#include "sdpa_graph.hpp"

#include <cmath>
#include <exception>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cudnn_frontend.h>

namespace ablate::cudnn_flash {

namespace fe = cudnn_frontend;
using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

struct SdpaGraph::Impl {
  std::shared_ptr<fe::graph::Graph> graph;
};

namespace {

// Variant-pack uids: the slot number + 1 (0 is not a valid uid).
int64_t uid(Slot s) { return int64_t(s) + 1; }

// (count, 1, 1, 1) i32: sequence lengths, ragged offsets.
Tensor index_tensor(fe::graph::Graph& g, const char* name, Slot slot, int64_t count) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid(slot))
                      .set_dim({count, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// The (batch, heads, sequence, D) view of a contiguous (B, T, heads, D) tensor.
void shape_data(fe::graph::Tensor_attributes& t, int64_t batch, int64_t heads, int64_t seq, int64_t d, const Tensor& offsets) {
  t.set_dim({batch, heads, seq, d}).set_stride({seq * heads * d, d, heads * d, 1});
  if (offsets) t.set_ragged_offset(offsets);
}

Tensor data_tensor(fe::graph::Graph& g, const char* name, Slot slot, int64_t batch, int64_t heads, int64_t seq, int64_t d,
                   const Tensor& offsets) {
  fe::graph::Tensor_attributes a;
  a.set_name(name).set_uid(uid(slot));
  shape_data(a, batch, heads, seq, d, offsets);
  return g.tensor(a);
}

// Softmax statistics: (B, H, T, 1) head-major for dense and padded rows; token-major with ragged
// offsets for ragged rows (cuDNN's ragged statistics layout).
void shape_stats(fe::graph::Tensor_attributes& t, const GraphKey& k, const Tensor& offsets) {
  const int64_t n = k.sequences(), h = k.heads, s = k.sequence_dim();
  t.set_data_type(fe::DataType_t::FLOAT).set_dim({n, h, s, 1});
  if (offsets) {
    t.set_stride({s * h, 1, h, 1}).set_ragged_offset(offsets);
  } else {
    t.set_stride({h * s, s, 1, 1});
  }
}

struct Common {
  Tensor q, k, v, seq_q, seq_kv, off_q, off_kv, off_stats;
};

Common common_tensors(fe::graph::Graph& g, const GraphKey& k) {
  Common c;
  const int64_t n = k.sequences(), s = k.sequence_dim();
  if (k.ragged()) {
    c.off_q = index_tensor(g, "offset_q", kOffsetQ, n + 1);
    c.off_kv = index_tensor(g, "offset_kv", kOffsetKV, n + 1);
    c.off_stats = index_tensor(g, "offset_stats", kOffsetStats, n + 1);
  }
  c.q = data_tensor(g, "q", kQ, n, k.heads, s, k.head_dim, c.off_q);
  c.k = data_tensor(g, "k", kK, n, k.kv_heads, s, k.head_dim, c.off_kv);
  c.v = data_tensor(g, "v", kV, n, k.kv_heads, s, k.head_dim, c.off_kv);
  if (k.masked()) {
    c.seq_q = index_tensor(g, "seq_len_q", kSeqLenQ, n);
    c.seq_kv = index_tensor(g, "seq_len_kv", kSeqLenKV, n);
  }
  return c;
}

// Masking and scale shared by both passes: every sequence's length through the padding mask (not for
// dense rows, which have no padding), causal from the top left of each sequence. For ragged rows the
// token total bounds cuDNN's internal buffers by the real data (B * T tokens) rather than by
// sequences * the longest.
template <class Attributes>
void configure(Attributes& a, const GraphKey& k, const Common& c) {
  a.set_attn_scale(1.0f / std::sqrt(float(k.head_dim)));
  if (k.masked()) a.set_padding_mask(true).set_seq_len_q(c.seq_q).set_seq_len_kv(c.seq_kv);
  if (k.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (k.ragged()) {
    const int64_t tokens = int64_t(k.batch) * k.seq_len;
    a.set_max_total_seq_len_q(tokens).set_max_total_seq_len_kv(tokens);
  }
}

// The key's SM version, not the current device's: the key is what the graph is cached under, and
// without a handle it is the only device fact there is. Set before any node is added (a node takes
// the graph's settings when it is made).
std::shared_ptr<fe::graph::Graph> new_graph(const GraphKey& k) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT)
      .set_sm_version(k.sm);
  return g;
}

std::shared_ptr<fe::graph::Graph> describe_forward(const GraphKey& k) {
  auto g = new_graph(k);
  const Common c = common_tensors(*g, k);
  auto attributes = fe::graph::SDPA_attributes().set_name("cudnn_flash_forward").set_generate_stats(true);
  configure(attributes, k, c);
  auto [o, stats] = g->sdpa(c.q, c.k, c.v, attributes);
  o->set_output(true).set_uid(uid(kO));
  shape_data(*o, k.sequences(), k.heads, k.sequence_dim(), k.head_dim, c.off_q);
  stats->set_output(true).set_uid(uid(kStats));
  shape_stats(*stats, k, c.off_stats);
  return g;
}

std::shared_ptr<fe::graph::Graph> describe_backward(const GraphKey& k) {
  auto g = new_graph(k);
  const Common c = common_tensors(*g, k);
  const int64_t n = k.sequences(), s = k.sequence_dim();
  const Tensor o = data_tensor(*g, "o", kO, n, k.heads, s, k.head_dim, c.off_q);
  const Tensor d_o = data_tensor(*g, "d_o", kDO, n, k.heads, s, k.head_dim, c.off_q);
  fe::graph::Tensor_attributes stats_attributes;
  stats_attributes.set_name("stats").set_uid(uid(kStats));
  shape_stats(stats_attributes, k, c.off_stats);
  const Tensor stats = g->tensor(stats_attributes);
  auto attributes = fe::graph::SDPA_backward_attributes().set_name("cudnn_flash_backward");
  configure(attributes, k, c);
  auto [d_q, d_k, d_v] = g->sdpa_backward(c.q, c.k, c.v, o, d_o, stats, attributes);
  d_q->set_output(true).set_uid(uid(kDQ));
  shape_data(*d_q, n, k.heads, s, k.head_dim, c.off_q);
  d_k->set_output(true).set_uid(uid(kDK));
  shape_data(*d_k, n, k.kv_heads, s, k.head_dim, c.off_kv);
  d_v->set_output(true).set_uid(uid(kDV));
  shape_data(*d_v, n, k.kv_heads, s, k.head_dim, c.off_kv);
  return g;
}

std::string failed(const char* stage, fe::error_t e) {
  return std::string(stage) + " failed: " + e.get_message() + " (cudnn-frontend error " + std::to_string(int(e.get_code())) + ")";
}

}  // namespace

SdpaGraph::SdpaGraph(const GraphKey& key) : key_(key), impl_(std::make_unique<Impl>()) {}
SdpaGraph::~SdpaGraph() = default;

SdpaGraph::Built SdpaGraph::build(const GraphKey& key, void* handle, bool measure) {
  Built out;
  // The frontend reports through error_t, but a backend descriptor it cannot create (or a cuDNN
  // symbol missing from the loaded library) reaches us as an exception: both become the error text.
  try {
    std::unique_ptr<SdpaGraph> self(new SdpaGraph(key));
    auto g = key.pass == Pass::forward ? describe_forward(key) : describe_backward(key);
    const auto h = static_cast<cudnnHandle_t>(handle);
    fe::error_t e = g->validate();
    if (e.is_bad()) return {nullptr, failed("validate", e)};
    e = g->build_operation_graph(h);
    if (e.is_bad()) return {nullptr, failed("build_operation_graph", e)};
    if (h != nullptr) {
      e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
      if (e.is_bad()) return {nullptr, failed("create_execution_plans", e)};
      e = g->check_support();
      if (e.is_bad()) return {nullptr, failed("check_support", e)};
      e = g->build_plans(measure ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
      if (e.is_bad()) return {nullptr, failed("build_plans", e)};
      self->plans_ = 0;
      for (int64_t i = 0; i < g->get_execution_plan_count(); ++i) {
        int64_t bytes = 0;
        if (g->get_workspace_size_plan_at_index(i, bytes).is_good()) ++self->plans_;
      }
      self->untuned_ = measure && self->plans_ > 1;
      if (self->untuned_) {
        self->workspace_bytes_ = g->get_autotune_workspace_size();
      } else {
        int64_t bytes = 0;
        e = g->get_workspace_size(bytes);
        if (e.is_bad()) return {nullptr, failed("get_workspace_size", e)};
        self->workspace_bytes_ = bytes;
      }
    }
    self->impl_->graph = std::move(g);
    out.graph = std::move(self);
  } catch (const std::exception& e) {
    out.graph.reset();
    out.error = std::string("building the graph threw: ") + e.what();
  }
  return out;
}

namespace {
std::unordered_map<int64_t, void*> variant_pack(const Pointers& pointers) {
  std::unordered_map<int64_t, void*> pack;
  for (int s = 0; s < kSlotCount; ++s) {
    if (pointers[std::size_t(s)] != nullptr) pack.emplace(int64_t(s) + 1, pointers[std::size_t(s)]);
  }
  return pack;
}
}  // namespace

std::string SdpaGraph::tune(void* handle, const Pointers& pointers, void* workspace) {
  if (!untuned_) return "";
  untuned_ = false;  // one attempt: a plan that failed to time is not retried on every call
  std::unordered_map<int64_t, void*> pack = variant_pack(pointers);
  std::string error;
  try {
    const fe::error_t e = impl_->graph->autotune(static_cast<cudnnHandle_t>(handle), pack, workspace);
    if (e.is_bad()) error = failed("autotune", e);
  } catch (const std::exception& e) {
    error = std::string("autotune threw: ") + e.what();
  }
  int64_t bytes = 0;
  if (impl_->graph->get_workspace_size(bytes).is_good()) workspace_bytes_ = bytes;
  return error;
}

std::string SdpaGraph::execute(void* handle, const Pointers& pointers, void* workspace) const {
  std::unordered_map<int64_t, void*> pack = variant_pack(pointers);
  try {
    const fe::error_t e = impl_->graph->execute(static_cast<cudnnHandle_t>(handle), pack, workspace);
    return e.is_bad() ? failed("execute", e) : std::string();
  } catch (const std::exception& e) {
    return std::string("execute threw: ") + e.what();
  }
}

}  // namespace ablate::cudnn_flash
