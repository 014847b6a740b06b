// The `cudnn_flash` attention backend: cuDNN's fused flash SDPA (through cudnn-frontend's graph
// API) on a CUDA device, forward and backward, padded and packed rows, GQA, causal.
//
// Precision. cuDNN's flash SDPA computes in bf16 (inputs, outputs and the probabilities that meet
// V) with f32 softmax and accumulation. The model computes in f32 today, so for an f32 problem the
// plugin converts around every call: forward converts q, k, v to bf16 workspaces, runs the SDPA
// forward in training mode (the f32 softmax statistics, the log-sum-exp of each query row, go to
// `saved`), and widens O back into `out`; backward converts q, k, v, out and d_out, runs the SDPA
// backward from `saved`, and widens dQ, dK, dV. A bf16 problem is handed to cuDNN as it is; so are
// bf16 q, k, v and out beside f32 gradients (AttentionProblem::bf16_qkv, bf16_out: the model holds
// them in bf16 under run.dtype = "bf16"), which saves their conversions and workspace.
//
// Layouts, chosen per batch from its host copy (graph_key.hpp). Dense rows (every row one document
// filling it, padded or packed problem alike) are plain causal attention: no mask, no metadata, and
// no kernel around the call for a bf16 problem. Padded rows (one document per row, from position 0,
// some shorter) use cuDNN's padding mask with each row's length. Packed rows use the ragged (THD)
// layout: every segment is its own sequence, placed by ragged offsets that a kernel computes on the
// device from the batch's segments (ragged.hpp, ragged_kernels.cu), the graph's sequence dimension
// the batch's longest segment rounded up to a power of two. Positions outside every segment are never
// written by cuDNN; the plugin writes their zeros (outputs, gradients and statistics) itself.
//
// Graphs. A graph is built once per GraphKey (graph_key.hpp: shape, layout, segment and length
// bounds, dtype, pass, device, SM version, cuDNN version) and kept; graph_builds() counts builds.
// With `plan = "measured"` (the default) every plan cuDNN offers is built and, at the graph's first
// call, timed on that call's data; the fastest serves every later call (graphs_tuned() counts them).
// `plan = "heuristic"` takes cuDNN's heuristics' first choice untimed. The cuDNN workspace is sized
// from the plans and grown on the stream (never shrunk), like the bf16 workspaces.
//
// Loading. cuDNN is opened at run time (cudnn_library.hpp), and nothing of CUDA or cuDNN is created
// when the plugin loads or the backend is constructed: the handle is made on the first forward or
// backward, for the current device, and bound to the call's stream on every call. supports() works on any
// machine; the checks that need the device (SM version, cuDNN's version) run only where one is.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ablate/attention.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "cudnn_library.hpp"
#include "graph_key.hpp"
#include "ragged_kernels.hpp"
#include "sdpa_graph.hpp"

namespace ablate::cudnn_flash {
namespace {

constexpr const char* kWhere = "cudnn_flash";
constexpr int64_t kMinCudnn = 90600;  // ragged layouts with GQA, token totals for ragged workspaces
constexpr int64_t kAlign = 256;       // every workspace region starts on this many bytes

std::string describe(const AttentionProblem& p) {
  return std::string(p.packed ? "packed" : "padded") + " B " + std::to_string(p.batch) + " T " + std::to_string(p.seq_len) + " H " +
         std::to_string(p.heads) + " Hkv " + std::to_string(p.kv_heads) + " D " + std::to_string(p.head_dim) + " " +
         to_string(p.dtype);
}

// What the problem alone decides, whatever the machine.
std::string problem_refusal(const AttentionProblem& p) {
  if (p.device != DeviceType::cuda) {
    return std::string("cudnn_flash runs on a CUDA device; got ") + to_string(p.device);
  }
  if (p.dtype != DType::f32 && p.dtype != DType::bf16) {
    return std::string("cudnn_flash computes in bf16 with cuDNN's flash attention and takes f32 tensors (converted "
                       "to bf16 and back) or bf16 tensors; got ") +
           to_string(p.dtype);
  }
  if (p.batch < 0 || p.seq_len < 0 || p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0) {
    return "cudnn_flash needs batch and seq_len >= 0 and heads, kv_heads, head_dim > 0; got " + describe(p);
  }
  if (p.seq_len == 1) {
    return "cudnn_flash needs seq_len >= 2 (cuDNN's flash backward refuses one query against one key); got " + describe(p);
  }
  if (p.heads % p.kv_heads != 0) {
    return "cudnn_flash needs heads to be a multiple of kv_heads; got heads " + std::to_string(p.heads) + ", kv_heads " +
           std::to_string(p.kv_heads);
  }
  if (p.head_dim > 128 || p.head_dim % 8 != 0) {
    return "cudnn_flash needs head_dim a multiple of 8 and at most 128 (cuDNN's bf16 flash kernels); got " +
           std::to_string(p.head_dim);
  }
  if (int64_t(p.batch) * p.seq_len * p.heads * p.head_dim >= (int64_t(1) << 31)) {
    return "cudnn_flash addresses q with int32 offsets and needs batch * seq_len * heads * head_dim < 2^31; got " + describe(p);
  }
  return "";
}

// The current device and cuDNN, looked at once, the first time supports() is asked.
struct Facts {
  bool gpu = false;
  int32_t device = 0, sm = 0;
};

Facts look_at_device() {
  Facts f;
  f.gpu = cuda::device_available();
  if (!f.gpu) return f;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    f.gpu = false;
    return f;
  }
  f.device = device;
  f.sm = major * 10 + minor;
  return f;
}

// What the device and the loaded cuDNN decide.
std::string device_refusal(const AttentionProblem& p, int32_t sm) {
  const CudnnLibrary& lib = cudnn_library();
  if (!lib.loaded) return "cudnn_flash: " + lib.error;
  if (lib.version < kMinCudnn) {
    return "cudnn_flash needs cuDNN 9.6.0 or newer (ragged layouts with GQA); loaded " + std::to_string(lib.version);
  }
  if (lib.version == 91000 || lib.version == 91001) {
    return "cuDNN 9.10.0 and 9.10.1 have known faults in bf16 SDPA; cudnn_flash needs another version";
  }
  if (sm < 80) return "cudnn_flash needs an SM80 (Ampere) or newer device; this one is sm" + std::to_string(sm);
  if (p.packed && sm / 10 != 9 && sm / 10 != 10) {
    // Packed rows keep their statistics ragged (token-major) so that `saved` holds B * H * T values;
    // cuDNN's backward reads ragged statistics on SM90 and SM100 only.
    return "cudnn_flash serves packed rows on SM90 and SM100 devices (ragged softmax statistics in backward); "
           "this one is sm" +
           std::to_string(sm);
  }
  return "";
}

// Regions carved from one scratch allocation, each aligned to kAlign.
class Carver {
 public:
  int64_t take(int64_t bytes) {
    const int64_t at = used_;
    used_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  int64_t size() const noexcept { return used_; }

 private:
  int64_t used_ = 0;
};

class CudnnFlash final : public Attention {
 public:
  explicit CudnnFlash(bool measure) : measure_(measure) {}
  ~CudnnFlash() override {
    graphs_.clear();  // execution plans before the handles they were built with
    for (auto& [device, handle] : handles_) destroy_cudnn_handle(handle);
  }
  CudnnFlash(const CudnnFlash&) = delete;
  CudnnFlash& operator=(const CudnnFlash&) = delete;

  std::string supports(const AttentionProblem& p) const override {
    if (std::string why = problem_refusal(p); !why.empty()) return why;
    std::call_once(facts_once_, [this] { facts_ = look_at_device(); });
    if (!facts_.gpu) return "";  // nothing more to ask without a device; forward names what is missing
    return device_refusal(p, facts_.sm);
  }

  // The softmax statistic (log-sum-exp) of every query row: (B, H, T) for padded rows, (B, T, H) for
  // packed rows; zero at padding positions.
  int64_t saved_elements(const AttentionProblem& p) const override { return int64_t(p.batch) * p.heads * p.seq_len; }

  // An f32 problem's bf16 copies (backward's eight: q, k, v, o, dO, dQ, dK, dV, less those the
  // model holds in bf16) and the sequence metadata; cuDNN's own workspace is known once a plan is
  // built (flash SDPA asks for little or none) and is not counted.
  int64_t workspace_bytes(const AttentionProblem& p) const override {
    const Sizes n = sizes(p);
    // Backward's: dO, dQ (unless held in bf16) and o, q (likewise); dK, dV and k, v (likewise).
    const int64_t grads = p.bf16_grads ? 0 : 2;
    const int64_t q_copies = grads + (p.bf16_out ? 0 : 1) + (p.bf16_qkv ? 0 : 1), kv_copies = grads + (p.bf16_qkv ? 0 : 2);
    const int64_t copies = p.dtype == DType::f32 ? (q_copies * n.q + kv_copies * n.kv) * 2 : 0;
    return copies + 4 * (2 * int64_t(p.batch) * p.seq_len + 4) * 4;
  }

  bool bf16_activations() const override { return true; }
  bool bf16_gradients() const override { return true; }

  void forward(const AttentionCall& c) override {
    check_attention_forward_tensors(kWhere, c, DeviceType::cuda);
    const AttentionProblem& p = *c.problem;
    const BatchViews& batch = *c.batch;
    const TensorView &q = c.q, &k = c.k, &v = c.v, &out = c.out, &saved = c.saved;
    check_call(p, batch, saved);
    if (int64_t(p.batch) * p.seq_len == 0) return;
    const Context ctx = context(c.stream);
    const cudaStream_t stream = ctx.stream;
    const Sizes n = sizes(p);
    if (p.packed && batch.num_segments == 0) {  // nothing but padding
      ABLATE_CUDA_CHECK(cudaMemsetAsync(out.data, 0, std::size_t(n.q * dtype_size(out.dtype)), stream));
      ABLATE_CUDA_CHECK(cudaMemsetAsync(saved.data, 0, std::size_t(saved.numel()) * sizeof(float), stream));
      return;
    }
    const GraphKey key = make_graph_key(p, layout_of(p, batch), Pass::forward, ctx.device, ctx.sm, ctx.cudnn_version);
    SdpaGraph& graph = graph_for(key, ctx.handle);

    Pointers ptr{};
    set_metadata(p, batch, key, ptr, stream);
    bind({{kQ, q, n.q, true}, {kK, k, n.kv, true}, {kV, v, n.kv, true}, {kO, out, n.q, false}}, ptr, stream);
    ptr[kStats] = saved.data;
    run(graph, ctx, ptr);

    const int64_t positions = int64_t(p.batch) * p.seq_len, per_q = int64_t(p.heads) * p.head_dim;
    const int32_t* ids = batch.segment_ids.as<const int32_t>();
    if (out.dtype == DType::f32) {
      launch_store_f32(ptr[kO], out.as<float>(), positions, per_q, ids, stream);
    } else if (key.masked()) {
      launch_zero_padding_bf16(out.data, positions, per_q, ids, stream);
    }
    if (key.masked()) {
      launch_zero_padding_stats(saved.as<float>(), ids, p.batch, p.seq_len, p.heads, key.ragged(), stream);
    }
  }

  void backward(const AttentionCall& c) override {
    check_attention_backward_tensors(kWhere, c, DeviceType::cuda);
    const AttentionProblem& p = *c.problem;
    const BatchViews& batch = *c.batch;
    const TensorView &q = c.q, &k = c.k, &v = c.v, &out = c.out, &saved = c.saved, &d_out = c.d_out, &d_q = c.d_q, &d_k = c.d_k,
                     &d_v = c.d_v;
    check_call(p, batch, saved);
    if (int64_t(p.batch) * p.seq_len == 0) return;
    const Context ctx = context(c.stream);
    const cudaStream_t stream = ctx.stream;
    const Sizes n = sizes(p);
    const std::size_t width = dtype_size(p.grad_dtype());
    if (p.packed && batch.num_segments == 0) {
      ABLATE_CUDA_CHECK(cudaMemsetAsync(d_q.data, 0, std::size_t(n.q) * width, stream));
      ABLATE_CUDA_CHECK(cudaMemsetAsync(d_k.data, 0, std::size_t(n.kv) * width, stream));
      ABLATE_CUDA_CHECK(cudaMemsetAsync(d_v.data, 0, std::size_t(n.kv) * width, stream));
      return;
    }
    const GraphKey key = make_graph_key(p, layout_of(p, batch), Pass::backward, ctx.device, ctx.sm, ctx.cudnn_version);
    SdpaGraph& graph = graph_for(key, ctx.handle);

    Pointers ptr{};
    set_metadata(p, batch, key, ptr, stream);
    bind({{kQ, q, n.q, true},
          {kK, k, n.kv, true},
          {kV, v, n.kv, true},
          {kO, out, n.q, true},
          {kDO, d_out, n.q, true},
          {kDQ, d_q, n.q, false},
          {kDK, d_k, n.kv, false},
          {kDV, d_v, n.kv, false}},
         ptr, stream);
    ptr[kStats] = saved.data;
    run(graph, ctx, ptr);

    const int64_t positions = int64_t(p.batch) * p.seq_len;
    const int64_t per_q = int64_t(p.heads) * p.head_dim, per_kv = int64_t(p.kv_heads) * p.head_dim;
    const int32_t* ids = batch.segment_ids.as<const int32_t>();
    if (p.grad_dtype() == DType::f32) {
      launch_store_f32(ptr[kDQ], d_q.as<float>(), positions, per_q, ids, stream);
      launch_store_f32(ptr[kDK], d_k.as<float>(), positions, per_kv, ids, stream);
      launch_store_f32(ptr[kDV], d_v.as<float>(), positions, per_kv, ids, stream);
    } else if (key.masked()) {
      launch_zero_padding_bf16(d_q.data, positions, per_q, ids, stream);
      launch_zero_padding_bf16(d_k.data, positions, per_kv, ids, stream);
      launch_zero_padding_bf16(d_v.data, positions, per_kv, ids, stream);
    }
  }

  // Graphs built since construction: one per distinct GraphKey met; those whose plan was chosen by
  // timing more than one.
  int64_t graph_builds() const noexcept { return builds_; }
  int64_t graphs_cached() const noexcept { return int64_t(graphs_.size()); }
  int64_t graphs_tuned() const noexcept { return tuned_; }

 private:
  struct Context {
    int32_t device = 0, sm = 0;
    int64_t cudnn_version = 0;
    void* handle = nullptr;
    cudaStream_t stream = nullptr;
  };
  struct Sizes {
    int64_t q = 0, kv = 0;  // elements of q (and out, d_out, d_q) and of k (v, d_k, d_v)
  };

  static Sizes sizes(const AttentionProblem& p) {
    const int64_t positions = int64_t(p.batch) * p.seq_len;
    return {positions * p.heads * p.head_dim, positions * p.kv_heads * p.head_dim};
  }

  // The current device, its cuDNN handle (made on first use) bound to the call's stream.
  Context context(Stream stream) {
    Context c;
    const CudnnLibrary& lib = cudnn_library();
    if (!lib.loaded) throw_runtime_error(kWhere, lib.error);
    int device = 0, major = 0, minor = 0;
    ABLATE_CUDA_CHECK(cudaGetDevice(&device));
    ABLATE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    ABLATE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    c.device = device;
    c.sm = major * 10 + minor;
    c.cudnn_version = lib.version;
    void*& handle = handles_[device];
    if (handle == nullptr) handle = create_cudnn_handle();
    c.handle = handle;
    c.stream = stream.as<cudaStream_t>();
    set_cudnn_stream(handle, c.stream);
    return c;
  }

  // What the batch decides of the graph; the padded problem's rows are checked by check_call.
  static BatchLayout layout_of(const AttentionProblem& p, const BatchViews& batch) {
    return batch_layout(batch.host, batch.num_segments, p.batch, p.seq_len);
  }

  SdpaGraph& graph_for(const GraphKey& key, void* handle) {
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return *it->second;
    SdpaGraph::Built built = SdpaGraph::build(key, handle, measure_);
    if (!built.graph) throw_runtime_error(kWhere, "cuDNN SDPA graph for " + key.describe() + ": " + built.error);
    ++builds_;
    return *graphs_.emplace(key, std::move(built.graph)).first->second;
  }

  // Sequence lengths (both sides of the padding mask read the same array) and, for ragged rows, the
  // ragged offsets, computed on the device from the batch's layout. Dense rows need none.
  void set_metadata(const AttentionProblem& p, const BatchViews& batch, const GraphKey& key, Pointers& ptr, cudaStream_t stream) {
    if (!key.masked()) return;
    const int64_t n = key.sequences();
    Carver c;
    const int64_t at_len = c.take(n * 4), at_q = c.take((n + 1) * 4), at_kv = c.take((n + 1) * 4), at_st = c.take((n + 1) * 4);
    char* base = static_cast<char*>(meta_.get(std::size_t(c.size()), stream));
    auto* lengths = reinterpret_cast<int32_t*>(base + at_len);
    ptr[kSeqLenQ] = lengths;
    ptr[kSeqLenKV] = lengths;
    const int32_t* segments = batch.segments.as<const int32_t>();
    const int32_t* row_segments = batch.row_segments.as<const int32_t>();
    if (key.ragged()) {
      ptr[kOffsetQ] = base + at_q;
      ptr[kOffsetKV] = base + at_kv;
      ptr[kOffsetStats] = base + at_st;
      const RaggedShape shape{p.batch, p.seq_len, p.heads, p.kv_heads, p.head_dim};
      launch_build_ragged(segments, row_segments, batch.num_segments, key.segment_bound, shape, lengths,
                          static_cast<int32_t*>(ptr[kOffsetQ]), static_cast<int32_t*>(ptr[kOffsetKV]),
                          static_cast<int32_t*>(ptr[kOffsetStats]), stream);
    } else {
      launch_build_padded(segments, row_segments, p.batch, lengths, stream);
    }
  }

  // The first call of a measured graph times its plans on this call's data (the outputs are simply
  // written again); a failed timing leaves heuristics' first choice, which still runs.
  void run(SdpaGraph& graph, const Context& ctx, Pointers& ptr) {
    void* workspace = nullptr;
    if (graph.needs_tuning()) {
      if (graph.workspace_bytes() > 0) workspace = workspace_.get(std::size_t(graph.workspace_bytes()), ctx.stream);
      if (graph.tune(ctx.handle, ptr, workspace).empty()) ++tuned_;
    }
    if (graph.workspace_bytes() > 0) workspace = workspace_.get(std::size_t(graph.workspace_bytes()), ctx.stream);
    const std::string error = graph.execute(ctx.handle, ptr, workspace);
    if (!error.empty()) throw_runtime_error(kWhere, "cuDNN SDPA " + graph.key().describe() + ": " + error);
  }

  void check_call(const AttentionProblem& p, const BatchViews& batch, const TensorView& saved) const {
    if (std::string why = supports(p); !why.empty()) throw_runtime_error(kWhere, why);
    if (batch.device != DeviceType::cuda || batch.segments.dtype != DType::i32 || batch.row_segments.dtype != DType::i32 ||
        batch.segment_ids.dtype != DType::i32) {
      throw_runtime_error(kWhere, "the batch's segment layout must be i32 views on the CUDA device");
    }
    if (batch.rows != p.batch || batch.seq_len != p.seq_len) {
      throw_runtime_error(kWhere, "the batch is " + std::to_string(batch.rows) + " x " + std::to_string(batch.seq_len) +
                                      " but the problem is " + std::to_string(p.batch) + " x " + std::to_string(p.seq_len));
    }
    if (saved.numel() != saved_elements(p) || saved.dtype != DType::f32 || saved.device != DeviceType::cuda ||
        (saved.data == nullptr && saved.numel() > 0)) {
      throw_runtime_error(kWhere, "saved must be an f32 CUDA buffer of " + std::to_string(saved_elements(p)) +
                                      " elements (batch * heads * seq_len); got " + std::to_string(saved.numel()) + " " +
                                      to_string(saved.dtype));
    }
    // The padding mask gives each row one sequence from position 0; the host copy of the batch says
    // whether that holds (packed rows take any layout).
    if (!p.packed && batch.host != nullptr) {
      const Batch& b = *batch.host;
      for (int32_t r = 0; r < p.batch && std::size_t(r) + 1 < b.row_segments.size(); ++r) {
        const int32_t first = b.row_segments[std::size_t(r)], count = b.row_segments[std::size_t(r) + 1] - first;
        if (count > 1 || (count == 1 && b.segments[std::size_t(first)].start != 0)) {
          throw_input_error(kWhere, "row " + std::to_string(r) + " holds " + std::to_string(count) + " segment(s) starting at " +
                                        std::to_string(b.segments[std::size_t(first)].start) +
                                        "; a padded problem (packed = false) takes one segment per row from "
                                        "position 0: mark the problem packed");
        }
      }
    }
  }

  // One tensor of the graph: its slot, the call's view, its elements, and whether cuDNN reads it.
  struct Bound {
    int slot;
    TensorView t;
    int64_t n;
    bool input;
  };
  // The graph's tensor pointers: bf16 views as they are; for f32 ones, bf16 copies carved from one
  // scratch region, the inputs converted into them (the outputs cuDNN writes there are converted
  // back by the caller).
  void bind(std::initializer_list<Bound> tensors, Pointers& ptr, cudaStream_t stream) {
    Carver c;
    std::array<int64_t, kSlotCount> at{};
    for (const Bound& b : tensors) {
      if (b.t.dtype == DType::f32) at[b.slot] = c.take(b.n * 2);
    }
    char* base = c.size() > 0 ? static_cast<char*>(data_.get(std::size_t(c.size()), stream)) : nullptr;
    for (const Bound& b : tensors) {
      if (b.t.dtype != DType::f32) {
        ptr[b.slot] = b.t.data;
        continue;
      }
      ptr[b.slot] = base + at[b.slot];
      if (b.input) launch_to_bf16(b.t.as<const float>(), ptr[b.slot], b.n, stream);
    }
  }

  mutable std::once_flag facts_once_;
  mutable Facts facts_;
  bool measure_ = true;  // plan = "measured"
  std::unordered_map<GraphKey, std::unique_ptr<SdpaGraph>, GraphKeyHash> graphs_;
  int64_t builds_ = 0, tuned_ = 0;
  std::unordered_map<int32_t, void*> handles_;  // cuDNN handle per device ordinal
  cuda::StreamScratch data_;                    // bf16 copies of an f32 problem's tensors
  cuda::StreamScratch meta_;                    // sequence lengths and ragged offsets
  cuda::StreamScratch workspace_;               // cuDNN's workspace
};

void register_components(Registrar& r) {
  ComponentInfo info;
  info.kind = Kind::attention;
  info.name = "cudnn_flash";
  info.version = "1.0.0";
  info.doc = "cuDNN's fused flash attention on a CUDA device (bf16 compute; f32 tensors converted; padded rows and "
             "packed rows as ragged sequences, GQA, head_dim <= 128): the fast backend";
  info.devices = {"cuda"};
  info.schema = {param::string("plan", "measured",
                               "how each graph's execution plan is chosen: \"measured\" builds every plan cuDNN offers "
                               "and times them on the graph's first call (once per shape and layout), \"heuristic\" "
                               "takes cuDNN's heuristics' first choice untimed")
                     .one_of({"measured", "heuristic"})};
  info.factory = [](const ComponentArgs& a) -> std::unique_ptr<Component> {
    // A table made from the config has every key; one made in code may leave `plan` to its default.
    return std::make_unique<CudnnFlash>(!a.own.has("plan") || a.own.get_string("plan") == "measured");
  };
  r.add(std::move(info));
}

}  // namespace
}  // namespace ablate::cudnn_flash

ABLATE_PLUGIN("cudnn_flash", "1.0.0", ablate::cudnn_flash::register_components)

// The build counters of a cudnn_flash backend, for tests and benchmarks that hold it as an
// ablate::Attention (its class is private to the plugin): resolved with dlsym from the plugin
// library. -1 when `attention` is not a cudnn_flash backend.
extern "C" __attribute__((visibility("default"))) int64_t ablate_cudnn_flash_graph_builds(const ablate::Attention* attention) {
  const auto* self = dynamic_cast<const ablate::cudnn_flash::CudnnFlash*>(attention);
  return self != nullptr ? self->graph_builds() : -1;
}
extern "C" __attribute__((visibility("default"))) int64_t ablate_cudnn_flash_graphs_cached(const ablate::Attention* attention) {
  const auto* self = dynamic_cast<const ablate::cudnn_flash::CudnnFlash*>(attention);
  return self != nullptr ? self->graphs_cached() : -1;
}
extern "C" __attribute__((visibility("default"))) int64_t ablate_cudnn_flash_graphs_tuned(const ablate::Attention* attention) {
  const auto* self = dynamic_cast<const ablate::cudnn_flash::CudnnFlash*>(attention);
  return self != nullptr ? self->graphs_tuned() : -1;
}
