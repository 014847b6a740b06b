// Helpers shared by the data plugins. For the file-backed sources: expanding path globs into a
// sorted list of files (a pattern that matches nothing is an input error), a read-only memory map
// (large data sets are paged in on demand, never read whole), a deterministic tail split. For the
// batchers: the [batching] keys, cutting documents into pieces, and writing rows of pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ablate/data.hpp"
#include "ablate/schema.hpp"

namespace ablate {

// Expands every pattern (a plain path or a glob with * ? [..]) into files, sorted within each
// pattern, duplicates removed, pattern order kept. A plain path that does not exist, or a glob that
// matches nothing, is an input error naming the pattern; `where` (e.g. "data.token_shards.paths")
// prefixes the message.
std::vector<std::filesystem::path> expand_paths(const std::vector<std::string>& patterns, const std::string& where);

// A read-only, private memory map of a whole file. An empty file maps to (nullptr, 0).
class MappedFile {
 public:
  // Throws an input error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void release() noexcept;
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// The tokens of an llm.c token shard (a header of 256 int32: magic 20240520, version 1, token
// count; then that many uint16 tokens), read whole (`ablate eval --tokens`, the heldout_loss
// evaluator; token_shards maps its shards instead). Only a regular file is opened (a FIFO never
// blocks the read); a wrong magic or version, or a size other than the header's count says, is
// an input error naming the file.
std::vector<int32_t> read_token_shard(const std::filesystem::path& path);

// How many of `documents` go to the validation split when a fraction of them does: the last
// round(documents * fraction) documents, at least one when fraction > 0 and documents > 1, and
// never all of them.
uint64_t validation_tail(uint64_t documents, double fraction);

// ---------------------------------------------------------------------------------------------
// Batching.

// The keys every batcher shares ([batching] batch_size, seq_len, append_eot, long_documents).
struct BatchingOptions {
  int32_t batch_size = 8;
  int32_t seq_len = 256;
  bool append_eot = true;
  bool split_long = true;  // long_documents = "split" (else "truncate")
  static BatchingOptions from(const Params& common);
};

// A piece of a document a batcher holds: its span, and its tokens plus, when the document goes on
// after the piece, the next token (the target of the piece's last token).
struct DocumentPiece {
  PendingPiece span;
  bool ends_document = true;    // span.end is the document's length
  std::vector<int32_t> tokens;  // span.end - span.begin tokens, then the next one unless ends_document
  int32_t length() const noexcept { return span.end - span.begin; }
};

// Cuts `doc` into pieces of at most `seq_len` tokens and appends them to `out`: every piece when
// `split_long`, else only the first (the rest of the document is dropped). Empty documents give none.
void cut_document(const Document& doc, int32_t seq_len, bool split_long, std::vector<DocumentPiece>& out);
// The piece [span.begin, span.end) of `doc` (restore rebuilds held pieces with it).
DocumentPiece piece_of(const Document& doc, const PendingPiece& span);

// Writes a batch of `rows` rows of `seq_len` positions; row r holds the pieces row_pieces[r], left
// to right. Targets are the next token, and after a piece that ends its document `final_target`
// (the eot id when appending it, else -1). Positions restart at 0 and segment ids at 1 per row.
void write_rows(Batch& out, int32_t rows, int32_t seq_len, const std::vector<std::vector<const DocumentPiece*>>& row_pieces,
                int32_t final_target);

}  // namespace ablate
