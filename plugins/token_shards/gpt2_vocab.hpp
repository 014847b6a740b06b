// GPT-2's byte-level BPE from the tokenizer files kept beside a corpus's shards
// (tools/tokenize_shards.py writes them to `tokenizer/`): `encoder.json` (token string -> id, each
// byte of the token written as one printable code point in GPT-2's byte-to-unicode table) with
// `vocab.bpe` (the merges, in priority order) beside it, or `gpt2.tiktoken` (one "base64-bytes id"
// line per token).
//
// Decoding: token id -> the bytes it stands for. Encoding (prompts) is GPT-2's own: text is cut as
// GPT-2's pre-tokenizer pattern cuts it under Python's `regex` module (letters, numbers and white
// space by the tables of unicode_classes.inc, generated from that module by
// tools/gen_unicode_classes.py; a byte that is not UTF-8 counts as neither), then each piece's bytes
// are merged pair by pair, always the adjacent pair of the lowest merge rank, the leftmost of equals,
// in O(n log n) for a piece of n bytes. The merges are vocab.bpe's; from gpt2.tiktoken (or an
// encoder.json alone) each token's merge is derived from the ids, which gives GPT-2's vocab.bpe.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

namespace ablate::token_shards {

class Gpt2Vocab {
 public:
  // Reads `dir`/encoder.json (and `dir`/vocab.bpe when it is there) or else `dir`/gpt2.tiktoken;
  // throws an input error naming the file and line/entry on anything malformed: a token string
  // that is not byte-level, an id repeated or outside 0..vocab_size-1, a key repeated, two ids for
  // the same bytes, a merge that does not make the token its line should make, fewer or more merges
  // than tokens to make (a file cut short), and a file that is not a regular one of at most 64 MiB.
  static Gpt2Vocab load(const std::filesystem::path& dir, int32_t vocab_size);
  // Whether `dir` holds something by one of the two names (load() checks that it is a file).
  static bool present(const std::filesystem::path& dir);

  // The text of `tokens` (their bytes concatenated; ids without an entry, like an end-of-text id the
  // files do not list, written as "<|id|>").
  std::string decode(const std::vector<int32_t>& tokens) const;
  // Whether every byte has a token of its own (GPT-2's vocabulary does), so any text encodes.
  bool can_encode() const noexcept {
    for (int32_t id : byte_id_) {
      if (id < 0) return false;
    }
    return true;
  }
  // The ids of `text` (UTF-8; other bytes are encoded as they are); requires can_encode().
  std::vector<int32_t> encode(const std::string& text) const;
  std::size_t entries() const noexcept { return count_; }
  std::size_t merges() const noexcept { return merges_.size(); }
  const std::filesystem::path& file() const noexcept { return file_; }

 private:
  void read_merges(const std::filesystem::path& path, const std::unordered_map<std::string, int32_t>& id_of);
  void derive_merges();
  // The id two adjacent tokens merge into (GPT-2's ids follow its merge order, so it is the rank),
  // or -1 when no merge joins them.
  int32_t merged(int32_t left, int32_t right) const;

  std::vector<std::string> bytes_;  // by id
  std::vector<bool> known_;
  std::size_t count_ = 0;
  std::array<int32_t, 256> byte_id_{};            // the token of each single byte, -1 when none
  std::unordered_map<uint64_t, int32_t> merges_;  // left id << 32 | right id -> the merged id
  std::filesystem::path file_;
};

// GPT-2's byte-to-unicode table read backwards: the byte a code point stands for, or -1 when the
// code point is not in the table. Bytes that print (33-126, 161-172, 174-255) are their own code
// points; the other 68 bytes, in increasing order, are 256, 257, ...
int32_t gpt2_byte_of(uint32_t code_point);

}  // namespace ablate::token_shards
