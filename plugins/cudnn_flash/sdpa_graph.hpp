// One cuDNN SDPA pass (forward or backward) for one GraphKey, described with cudnn-frontend's graph
// API and built once: validated, lowered to a cuDNN operation graph, its execution plans created
// from cuDNN's heuristics, checked and built; then executed with the data pointers of each call.
// The frontend's headers stay behind this interface (sdpa_graph.cpp), so the plugin's other sources
// compile without them.
//
// Tensors as cuDNN sees them, dims (batch, heads, sequence, D) with the strides of ablate's
// contiguous (B, T, heads, D) tensors (sequence stride heads * D, head stride D):
//   padded rows: batch = B, sequence = T, lengths per row (padding mask); statistics (B, H, T, 1);
//   packed rows: batch = the key's segment bound, sequence = T (the longest a segment can be), each
//     entry placed by a ragged offset (ragged.hpp); statistics token-major (B, T, H) with their own
//     ragged offsets, so that `saved` holds B * H * T values in both layouts.
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
enum Slot : int {
  kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqLenQ, kSeqLenKV, kOffsetQ, kOffsetKV, kOffsetStats, kSlotCount
};
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
  // With a cuDNN handle (cudnnHandle_t): the whole build, ready to execute. Without one (nullptr):
  // validation and the operation graph only, against the key's SM version, which needs no GPU.
  static Built build(const GraphKey& key, void* handle);

  const GraphKey& key() const noexcept { return key_; }
  int64_t workspace_bytes() const noexcept { return workspace_bytes_; }
  // Enqueues the pass on the handle's stream; "" on success, else cuDNN's message.
  std::string execute(void* handle, const Pointers& pointers, void* workspace) const;

 private:
  struct Impl;
  explicit SdpaGraph(const GraphKey& key);
  GraphKey key_;
  int64_t workspace_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ablate::cudnn_flash
