// What makes one cuDNN SDPA graph different from another, so that a graph is built once per distinct
// problem and found again on every later call: the shape (B, T, H, Hkv, D), the layout (padded rows
// or packed rows, and for packed rows the number of sequences the graph holds), the problem's dtype,
// causal masking, the pass (forward or backward), and where it runs (device ordinal, SM version,
// cuDNN version: a plan built for one is not valid on another). Plain C++, no CUDA header, so the
// host tests check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ablate/attention.hpp"
#include "ablate/mix.hpp"

namespace ablate::cudnn_flash {

enum class Pass : uint8_t { forward, backward };

struct GraphKey {
  int32_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool packed = false;
  // Packed rows: the sequences (cuDNN batch entries) the graph is built for, see segment_bound().
  // Padded rows: 0 (the graph's batch is `batch`, one sequence per row).
  int32_t segment_bound = 0;
  DType dtype = DType::f32;
  bool causal = true;  // the Attention interface is causal; kept in the key so a non-causal graph cannot alias
  Pass pass = Pass::forward;
  int32_t device = 0;         // CUDA device ordinal
  int32_t sm = 0;             // compute capability, major * 10 + minor
  int64_t cudnn_version = 0;  // cudnnGetVersion() of the loaded library

  bool operator==(const GraphKey&) const = default;

  // The cuDNN batch: sequences for packed rows, rows for padded ones.
  int32_t sequences() const noexcept { return packed ? segment_bound : batch; }

  // "forward packed B 4 T 77 H 6 Hkv 2 D 64 sequences 8 f32 causal sm90 device 0 cuDNN 91900",
  // the text every error about this graph carries.
  std::string describe() const {
    std::string s = pass == Pass::forward ? "forward " : "backward ";
    s += packed ? "packed" : "padded";
    s += " B " + std::to_string(batch) + " T " + std::to_string(seq_len) + " H " + std::to_string(heads) + " Hkv " +
         std::to_string(kv_heads) + " D " + std::to_string(head_dim);
    if (packed) s += " sequences " + std::to_string(segment_bound);
    s += std::string(" ") + to_string(dtype) + (causal ? " causal" : " non-causal");
    s += " sm" + std::to_string(sm) + " device " + std::to_string(device) + " cuDNN " + std::to_string(cudnn_version);
    return s;
  }
};

struct GraphKeyHash {
  std::size_t operator()(const GraphKey& k) const noexcept {
    uint64_t h = 0;
    const auto add = [&h](uint64_t v) { h = mix64(h, v); };
    add(uint64_t(uint32_t(k.batch)));
    add(uint64_t(uint32_t(k.seq_len)));
    add(uint64_t(uint32_t(k.heads)));
    add(uint64_t(uint32_t(k.kv_heads)));
    add(uint64_t(uint32_t(k.head_dim)));
    add(uint64_t(k.packed));
    add(uint64_t(uint32_t(k.segment_bound)));
    add(uint64_t(k.dtype));
    add(uint64_t(k.causal));
    add(uint64_t(k.pass));
    add(uint64_t(uint32_t(k.device)));
    add(uint64_t(uint32_t(k.sm)));
    add(uint64_t(k.cudnn_version));
    return std::size_t(h);
  }
};

// The number of sequences a packed graph holds for a batch of `num_segments` segments in `rows` rows.
//
// The count of documents changes from one packed batch to the next, and it is a graph dimension (the
// cuDNN batch of the ragged layout). Keying the graph on the exact count would build a new graph
// (heuristics, plan compilation: tenths of a second to seconds) on almost every step. Instead the
// graph is built for a bound and the entries past the batch's segments are empty (length 0, offset
// at the end of the data), which cuDNN skips: their thread blocks exit at once. The bound is `rows`
// doubled until it holds every segment, so a run meets at most about log2(T) + 1 graphs per shape
// and a pass, and never runs more than twice the sequences it needs (or `rows`, whichever is more).
inline int32_t segment_bound(int32_t num_segments, int32_t rows) {
  int64_t bound = rows > 0 ? rows : 1;
  while (bound < num_segments) bound *= 2;
  return int32_t(bound);
}

inline GraphKey make_graph_key(const AttentionProblem& p, int32_t num_segments, Pass pass, int32_t device, int32_t sm,
                               int64_t cudnn_version) {
  GraphKey k;
  k.batch = p.batch;
  k.seq_len = p.seq_len;
  k.heads = p.heads;
  k.kv_heads = p.kv_heads;
  k.head_dim = p.head_dim;
  k.packed = p.packed;
  k.segment_bound = p.packed ? segment_bound(num_segments, p.batch) : 0;
  k.dtype = p.dtype;
  k.causal = true;
  k.pass = pass;
  k.device = device;
  k.sm = sm;
  k.cudnn_version = cudnn_version;
  return k;
}

}  // namespace ablate::cudnn_flash
