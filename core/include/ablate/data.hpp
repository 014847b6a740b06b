// Data interfaces: a DataSource gives random access to documents by index (so a sampler can shard
// and shuffle them and a cursor can be restored exactly), a Sampler decides the order in which one
// rank draws them, and a Batcher turns the drawn documents into Batches (batch.hpp).
//
// Cursor: a rank's position in its stream of draws (the k-th draw) plus the batcher's pending
// pieces (documents it has taken but not yet fully placed). Saving both and restoring them gives
// exactly the batches an uninterrupted run would have seen.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ablate/batch.hpp"
#include "ablate/component.hpp"

namespace ablate {

enum class Split { train, validation };
const char* to_string(Split split) noexcept;

struct Document {
  uint64_t index = 0;           // index in its split
  std::vector<int32_t> tokens;  // without an end-of-document token; batchers add it when asked
};

// Documents [first, first + documents) of a split that come from one source (a shard pattern).
struct DocumentGroup {
  std::string name;
  uint64_t first = 0, documents = 0;
};

class DataSource : public Component {
 public:
  ~DataSource() override;
  virtual int32_t vocab_size() const = 0;
  // The end-of-document token id (targets of a document's last token point at it when a batcher
  // appends it); -1 when the source has none.
  virtual int32_t eot_token() const = 0;
  // Number of documents of a split (0: the split is empty).
  virtual uint64_t size(Split split) const = 0;
  // Reads document `index` of `split` into `out`. Must be safe to call from several threads.
  virtual void read(Split split, uint64_t index, Document& out) const = 0;
  // One line for logs: "synthetic_probes: 100000 documents, vocab 512".
  virtual std::string describe() const = 0;
  // Text <-> tokens for prompts and samples. The defaults speak token ids ("17 4 203"): a source
  // with a text form (bytes, the probe logs) overrides both; encode throws an input error on text it
  // cannot express.
  virtual std::vector<int32_t> encode(const std::string& text) const;
  virtual std::string decode(const std::vector<int32_t>& tokens) const;
  // Whether decode gives the text the tokens were made from (the probe logs, bytes, a tokenizer's
  // text), so that evaluations can count its bytes (bits per byte); false for token ids.
  virtual bool has_text() const { return false; }
  // The directory of the GPT-2 byte-level BPE files the tokens were made with (encoder.json and
  // vocab.bpe), which `ablate export` copies beside the weights; empty when the source has none.
  virtual std::filesystem::path gpt2_tokenizer_dir() const { return {}; }
  // The split's documents as consecutive groups in index order (the sources a `mixture` sampler
  // weighs: token_shards makes one per `paths` pattern); by default one group of every document.
  virtual std::vector<DocumentGroup> groups(Split split) const;
};

class Sampler : public Component {
 public:
  ~Sampler() override;
  // The split's groups (DataSource::groups), given before reset; samplers that draw from the split
  // as a whole ignore them.
  virtual void set_groups(const std::vector<DocumentGroup>& groups) { (void)groups; }
  // Prepares the order over `documents` documents for `rank` of `world`. Over one epoch the ranks'
  // draws are disjoint and together cover every document exactly once.
  virtual void reset(uint64_t documents, uint64_t seed, int rank, int world) = 0;
  // Draws this rank makes per epoch.
  virtual uint64_t draws_per_epoch() const = 0;
  // The document index of this rank's draw number `draw` (0-based over all epochs). Deterministic
  // in (seed, rank, world, draw): this is what makes cursors exact.
  virtual uint64_t document_at(uint64_t draw) = 0;

  // Resuming a checkpoint on another world size (docs/distributed.md) needs the deal behind the
  // draws: one global sequence g = 0, 1, 2, ... whose document at g does not depend on the world,
  // dealt out so that each rank's draws are an increasing subsequence of it, the ranks' subsequences
  // disjoint and together every g. A sampler that deals so says `reshardable()` and implements the
  // two methods below (valid after reset, which gave the documents); the defaults say it does not,
  // and such a checkpoint then resumes only with the world that wrote it.
  virtual bool reshardable() const { return false; }
  // The global position of draw `draw` of rank `rank` in a world of `world` ranks.
  virtual uint64_t global_position(uint64_t draw, int rank, int world) const;
  // The document at global position `g`.
  virtual uint64_t document_at_global(uint64_t g);
};

// A piece of a document a batcher holds between batches; [begin, end) are token offsets.
struct PendingPiece {
  uint64_t document = 0;
  int32_t begin = 0;
  int32_t end = 0;
};

// How a job resumed on another world size deals its documents (docs/distributed.md, "Resuming on
// another world size"): the global positions [first, end) less `drawn` (the ones the old job's
// ranks had drawn ahead of the others) are the leftovers, dealt round-robin to the ranks (the j-th,
// in increasing order, to rank j % world); each rank draws its leftovers first, then goes on with
// its world's standard deal from `end` on. Every global position below `first`, and those of
// `drawn`, were drawn before.
struct Reshard {
  int from_world = 1;           // the world size of the cursors it was merged from (for messages)
  uint64_t first = 0;           // the first global position some rank had not drawn
  uint64_t end = 0;             // where the standard deal goes on (>= first)
  std::vector<uint64_t> drawn;  // increasing, in [first, end)
};

// Where a rank's data stream stands. Plain numbers, so checkpoints can store it as JSON.
struct DataCursor {
  uint64_t draw = 0;                  // next draw number of the sampler (after a reshard: since it)
  std::vector<PendingPiece> pending;  // the batcher's held pieces, in its order
  std::optional<Reshard> reshard;     // none: the sampler's standard deal for the rank
};

// What a batcher pulls documents from (implemented by core's pipeline).
class DocumentFeed {
 public:
  virtual ~DocumentFeed();
  // The next document of this rank's order (never ends: epochs follow each other).
  virtual const Document& next() = 0;
  // Reads a document again by index (restore uses it to rebuild pending pieces). The reference is
  // valid until the next call of fetch() or next(); fetching the same document again may return it
  // without reading (many pending pieces of one long document read it once).
  virtual const Document& fetch(uint64_t document) = 0;
  // The source's end-of-document token (the target of a document's last token when the batcher
  // appends it), -1 when the source has none.
  virtual int32_t eot_token() const = 0;
};

class Batcher : public Component {
 public:
  ~Batcher() override;
  // Fills `out` with the next batch, pulling as many documents from `feed` as it needs.
  virtual void next(DocumentFeed& feed, Batch& out) = 0;
  // The pieces it holds now (taken from the feed but not yet emitted).
  virtual std::vector<PendingPiece> pending() const = 0;
  // Replaces what it holds by `pieces`, reading their tokens through `feed.fetch`.
  virtual void restore(const std::vector<PendingPiece>& pieces, DocumentFeed& feed) = 0;
  // Upper bound of rows and of T of any batch it produces (for sizing buffers up front).
  virtual int32_t max_rows() const = 0;
  virtual int32_t max_seq_len() const = 0;
};

}  // namespace ablate
