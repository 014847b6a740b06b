// What makes one cuDNN SDPA graph different from another, so that a graph is built once per distinct
// problem and found again on every later call: the shape (B, T, H, Hkv, D), the layout the batch
// needs (dense rows without a mask, padded rows with one, or ragged sequences, and for ragged ones
// how many sequences and how long the longest may be), the problem's dtype, causal masking, the pass
// (forward or backward), and where it runs (device ordinal, SM version, cuDNN version: a plan built
// for one is not valid on another). Plain C++, no CUDA header, so the host tests check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ablate/attention.hpp"
#include "ablate/batch.hpp"
#include "ablate/mix.hpp"

namespace ablate::cudnn_flash {

enum class Pass : uint8_t { forward, backward };

// How the batch's tokens are laid out for cuDNN, decided by the batch, not only by the problem:
//   dense:  every row is one sequence filling it (no padding anywhere), padded or packed problem
//           alike: plain (B, H, T, D) causal attention, no padding mask, no kernel around the call;
//   padded: one sequence per row from position 0, some shorter than T: cuDNN's padding mask;
//   ragged: packed rows with several sequences: the ragged (THD) layout with offsets.
enum class Layout : uint8_t { dense, padded, ragged };

inline const char* to_string(Layout l) { return l == Layout::dense ? "dense" : l == Layout::padded ? "padded" : "packed"; }

// What the graph needs to know of one batch: its segments and whether any row is short.
struct BatchLayout {
  int32_t segments = 0;    // S, all rows' segments
  int32_t longest = 0;     // the longest segment's length (T when unknown)
  bool full_rows = false;  // every row is exactly one segment of length T
};

// From the host copy of the batch (BatchViews::host). Without one nothing is assumed: the rows may
// be short and a segment may be T long.
inline BatchLayout batch_layout(const Batch* host, int32_t num_segments, int32_t rows, int32_t seq_len) {
  BatchLayout b;
  b.segments = num_segments;
  b.longest = seq_len;
  if (host == nullptr) return b;
  int32_t longest = 0;
  for (const Segment& s : host->segments) longest = s.length > longest ? s.length : longest;
  b.longest = longest;
  b.full_rows = rows > 0 && num_segments == rows && longest == seq_len;
  if (b.full_rows) {
    for (const Segment& s : host->segments) b.full_rows = b.full_rows && s.start == 0 && s.length == seq_len;
  }
  return b;
}
struct GraphKey {
  int32_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  Layout layout = Layout::padded;
  // Ragged: the sequences (cuDNN batch entries) the graph is built for, see segment_bound(), and the
  // longest a sequence may be, see length_bound(). Dense and padded: 0 and T (one sequence per row).
  int32_t segment_bound = 0;
  int32_t max_len = 0;
  DType dtype = DType::f32;
  bool causal = true;  // the Attention interface is causal; kept in the key so a non-causal graph cannot alias
  Pass pass = Pass::forward;
  int32_t device = 0;         // CUDA device ordinal
  int32_t sm = 0;             // compute capability, major * 10 + minor
  int64_t cudnn_version = 0;  // cudnnGetVersion() of the loaded library

  bool operator==(const GraphKey&) const = default;

  bool ragged() const noexcept { return layout == Layout::ragged; }
  // cuDNN's padding mask (sequence lengths): for every layout but dense.
  bool masked() const noexcept { return layout != Layout::dense; }
  // The cuDNN batch: sequences for ragged rows, rows otherwise.
  int32_t sequences() const noexcept { return ragged() ? segment_bound : batch; }
  // The sequence dimension of the graph's tensors: the longest sequence it admits.
  int32_t sequence_dim() const noexcept { return ragged() ? max_len : seq_len; }

  // "forward packed B 4 T 77 H 6 Hkv 2 D 64 sequences 8 longest 64 f32 causal sm90 device 0 cuDNN
  // 91900", the text every error about this graph carries.
  std::string describe() const {
    std::string s = pass == Pass::forward ? "forward " : "backward ";
    s += to_string(layout);
    s += " B " + std::to_string(batch) + " T " + std::to_string(seq_len) + " H " + std::to_string(heads) + " Hkv " +
         std::to_string(kv_heads) + " D " + std::to_string(head_dim);
    if (ragged()) s += " sequences " + std::to_string(segment_bound) + " longest " + std::to_string(max_len);
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
    add(uint64_t(k.layout));
    add(uint64_t(uint32_t(k.segment_bound)));
    add(uint64_t(uint32_t(k.max_len)));
    add(uint64_t(k.dtype));
    add(uint64_t(k.causal));
    add(uint64_t(k.pass));
    add(uint64_t(uint32_t(k.device)));
    add(uint64_t(uint32_t(k.sm)));
    add(uint64_t(k.cudnn_version));
    return std::size_t(h);
  }
};

// The number of sequences a ragged graph holds for a batch of `num_segments` segments in `rows` rows.
//
// The count of documents changes from one packed batch to the next, and it is a graph dimension (the
// cuDNN batch of the ragged layout). Keying the graph on the exact count would build a new graph
// (heuristics, plan compilation and, with plan = "measured", timing every plan: tenths of a second
// to seconds) on almost every step. Instead the graph is built for a bound and the entries past the
// batch's segments are empty (length 0, offset at the end of the data), which cuDNN skips; but each
// empty entry still launches its thread blocks (heads x the longest sequence / the kernel's tile),
// which exit at once. The bound is the count (at least `rows`) rounded up to its top three bits:
// four bounds per doubling (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...), so at most 25% more
// entries than segments (under 8: exactly the count), and a run whose batches hold between S and 2S
// documents meets at most five graphs per pass.
inline int32_t segment_bound(int32_t num_segments, int32_t rows) {
  int64_t v = num_segments > rows ? num_segments : rows;
  if (v < 8) return int32_t(v < 1 ? 1 : v);
  int64_t top = 1;
  while (top * 2 <= v) top *= 2;
  const int64_t step = top / 4;
  return int32_t((v + step - 1) / step * step);
}

// The sequence dimension of a ragged graph for a batch whose longest segment is `longest`: the next
// power of two (at least 64, one tile of cuDNN's kernels), at most T. cuDNN launches
// sequences x heads x ceil(dimension / tile) thread blocks, so a batch of short documents must not
// pay for T-long ones; powers of two keep the graphs few (log2(T / 64) + 1 per bound at most).
inline int32_t length_bound(int32_t longest, int32_t seq_len) {
  int64_t b = 64;
  while (b < longest) b *= 2;
  return int32_t(b < seq_len ? b : seq_len);
}

inline GraphKey make_graph_key(const AttentionProblem& p, const BatchLayout& batch, Pass pass, int32_t device, int32_t sm,
                               int64_t cudnn_version) {
  GraphKey k;
  k.batch = p.batch;
  k.seq_len = p.seq_len;
  k.heads = p.heads;
  k.kv_heads = p.kv_heads;
  k.head_dim = p.head_dim;
  k.layout = batch.full_rows ? Layout::dense : p.packed ? Layout::ragged : Layout::padded;
  k.segment_bound = k.ragged() ? segment_bound(batch.segments, p.batch) : 0;
  k.max_len = k.ragged() ? length_bound(batch.longest, p.seq_len) : p.seq_len;
  k.dtype = p.dtype;
  k.causal = true;
  k.pass = pass;
  k.device = device;
  k.sm = sm;
  k.cudnn_version = cudnn_version;
  return k;
}

}  // namespace ablate::cudnn_flash
