// The decoding half of GPT-2's byte-level BPE: token id -> the bytes it stands for, read from the
// tokenizer files kept beside a corpus's shards (tools/tokenize_shards.py writes them to
// `tokenizer/`). Either `encoder.json` (token string -> id, each byte of the token written as one
// printable code point in GPT-2's byte-to-unicode table) or `gpt2.tiktoken` (one "base64-bytes id"
// line per token). Encoding (prompts) splits text as GPT-2's pre-tokenizer does, then merges each
// piece's bytes pair by pair, always the adjacent pair whose joined bytes have the lowest id (GPT-2's
// ids are its merge ranks, the rule tiktoken applies). Letters, numbers and white space are told
// apart by the C library's Unicode tables (iswalpha, iswspace): exact for ASCII and the common
// scripts; a rare code point the tables class differently from Unicode's \p{L} / \p{N} can split
// differently from tiktoken.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

namespace ablate::token_shards {

class Gpt2Vocab {
 public:
  // Reads `dir`/encoder.json or else `dir`/gpt2.tiktoken; throws an input error naming the file
  // and line/entry on anything malformed (a token string that is not byte-level, an id repeated or
  // outside 0..vocab_size-1), and on a file that is not a regular one of at most 64 MiB.
  static Gpt2Vocab load(const std::filesystem::path& dir, int32_t vocab_size);
  // Whether `dir` holds something by one of the two names (load() checks that it is a file).
  static bool present(const std::filesystem::path& dir);

  // The text of `tokens` (their bytes concatenated; ids without an entry, like an end-of-text id the
  // files do not list, written as "<|id|>").
  std::string decode(const std::vector<int32_t>& tokens) const;
  // Whether every byte has a token of its own (GPT-2's vocabulary does), so any text encodes.
  bool can_encode() const noexcept { return byte_tokens_ == 256; }
  // The ids of `text` (UTF-8); requires can_encode().
  std::vector<int32_t> encode(const std::string& text) const;
  std::size_t entries() const noexcept { return count_; }
  const std::filesystem::path& file() const noexcept { return file_; }

 private:
  std::vector<std::string> bytes_;  // by id
  std::vector<bool> known_;
  std::size_t count_ = 0;
  std::unordered_map<std::string, int32_t> rank_;  // bytes -> id (= merge rank), special tokens left out
  int byte_tokens_ = 0;                            // single-byte tokens present
  std::filesystem::path file_;
};

// GPT-2's byte-to-unicode table read backwards: the byte a code point stands for, or -1 when the
// code point is not in the table. Bytes that print (33-126, 161-172, 174-255) are their own code
// points; the other 68 bytes, in increasing order, are 256, 257, ...
int32_t gpt2_byte_of(uint32_t code_point);

}  // namespace ablate::token_shards
