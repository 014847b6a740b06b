// One cuDNN SDPA pass (forward or backward) for one GraphKey, described with cudnn-frontend's graph
// API and built once: validated, lowered to a cuDNN operation graph, its execution plans created
// from cuDNN's heuristics, checked and built (heuristics' first choice only, or every plan when the
// plan is chosen by measurement); then executed with the data pointers of each call. A graph built
// with every plan is timed once, at its first call with real data (cudnn-frontend's autotune: each
// plan run until its time stops improving, the fastest kept), and that plan serves every later call.
// The frontend's headers stay behind this interface (sdpa_graph.cpp), so the plugin's other sources
// compile without them.
//
// Tensors as cuDNN sees them, dims (batch, heads, sequence, D) with the strides of ablate's
// contiguous (B, T, heads, D) tensors (sequence stride heads * D, head stride D):
//   dense rows: batch = B, sequence = T, no mask; statistics (B, H, T, 1);
//   padded rows: the same with lengths per row (padding mask);
//   ragged rows: batch = the key's segment bound, sequence = the key's longest (length_bound), each
//     entry placed by a ragged offset (ragged.hpp); statistics token-major (B, T, H) with their own
//     ragged offsets, so that `saved` holds B * H * T values in every layout.
// Inputs and outputs are bf16, softmax and accumulation f32, scale 1/sqrt(D), causal from the top
// left of each sequence (query i sees keys 0..i of its own sequence).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "graph_key.hpp"

namespace ablate::cudnn_flash {

// The tensors of a variant pack. Unused ones (offsets of a padded graph, d_out in forward) are null.
enum Slot : int { kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqLenQ, kSeqLenKV, kOffsetQ, kOffsetKV, kOffsetStats, kSlotCount };
using Pointers = std::array<void*, kSlotCount>;

class SdpaGraph {
 public:
  ~SdpaGraph();
  SdpaGraph(const SdpaGraph&) = delete;
  SdpaGraph& operator=(const SdpaGraph&) = delete;

  struct Built {
    std::unique_ptr<SdpaGraph> graph;
    std::string error;  // empty when built; else the stage that failed and cuDNN's message
  };
  // With a cuDNN handle (cudnnHandle_t): the whole build, ready to execute (every plan that builds
  // when `measure`, else heuristics' first). Without one (nullptr): validation and the operation
  // graph only, against the key's SM version, which needs no GPU.
  static Built build(const GraphKey& key, void* handle, bool measure = false);

  const GraphKey& key() const noexcept { return key_; }
  // The chosen plan's workspace (before tuning: the largest any plan needs).
  int64_t workspace_bytes() const noexcept { return workspace_bytes_; }
  // Plans built (1 unless measured) and whether the fastest is still to be found.
  int64_t plans() const noexcept { return plans_; }
  bool needs_tuning() const noexcept { return untuned_; }
  // Times every plan on the handle's stream with these pointers (synchronising the device) and
  // keeps the fastest; "" on success, else why (the heuristics' first choice then stays, and the
  // graph is not timed again).
  std::string tune(void* handle, const Pointers& pointers, void* workspace);
  // Enqueues the pass on the handle's stream; "" on success, else cuDNN's message.
  std::string execute(void* handle, const Pointers& pointers, void* workspace) const;

 private:
  struct Impl;
  explicit SdpaGraph(const GraphKey& key);
  GraphKey key_;
  int64_t workspace_bytes_ = 0;
  int64_t plans_ = 0;
  bool untuned_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ablate::cudnn_flash
