// A SentencePiece model (a Llama-style tokenizer.model) as the token_shards source's text form:
// prompts encoded and samples decoded through Debian's libsentencepiece, the library the model's
// own tools use, so the ids are those of transformers' LlamaTokenizer on the same file (without
// the BOS it adds).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace ablate::token_shards {

class SentencePieceText {
 public:
  ~SentencePieceText();
  // Whether `dir` holds tokenizer.model.
  static bool present(const std::filesystem::path& dir);
  // Reads dir/tokenizer.model; a file the library cannot read, or a model of more pieces than the
  // shards' vocabulary, is an input error naming `key` and the file.
  static std::unique_ptr<SentencePieceText> load(const std::filesystem::path& dir, int32_t vocab_size, const std::string& key);
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids the model has no piece for (past its size) are written as <id>.
  std::string decode(const std::vector<int32_t>& tokens) const;
  const std::filesystem::path& file() const noexcept { return file_; }
  int32_t pieces() const noexcept { return pieces_; }

 private:
  SentencePieceText() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::filesystem::path file_;
  int32_t pieces_ = 0;
};

}  // namespace ablate::token_shards
