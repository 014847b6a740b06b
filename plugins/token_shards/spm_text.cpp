// SentencePiece text through libsentencepiece (spm_text.hpp).
#include "spm_text.hpp"

#include <sentencepiece_processor.h>

#include "ablate/error.hpp"

namespace ablate::token_shards {

SentencePieceText::~SentencePieceText() = default;

bool SentencePieceText::present(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "tokenizer.model", ec);
}

std::unique_ptr<SentencePieceText> SentencePieceText::load(const std::filesystem::path& dir, int32_t vocab_size,
                                                           const std::string& key) {
  std::unique_ptr<SentencePieceText> t(new SentencePieceText);
  t->file_ = dir / "tokenizer.model";
  t->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t->sp_->Load(t->file_.string());
  if (!status.ok()) {
    throw_input_error(key, t->file_.string() + " is not a SentencePiece model this library reads: " + status.ToString());
  }
  t->pieces_ = t->sp_->GetPieceSize();
  if (t->pieces_ > vocab_size) {
    throw_input_error(key, t->file_.string() + " has " + std::to_string(t->pieces_) + " pieces, more than the shards' vocab_size " +
                               std::to_string(vocab_size));
  }
  return t;
}

std::vector<int32_t> SentencePieceText::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw_input_error(file_.string(), "cannot encode the text: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceText::decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  std::vector<int> run;
  const auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    const auto status = sp_->Decode(run, &piece);
    if (!status.ok()) throw_runtime_error(file_.string(), "cannot decode: " + status.ToString());
    out += piece;
    run.clear();
  };
  for (int32_t id : tokens) {
    if (id >= 0 && id < pieces_) {
      run.push_back(id);
    } else {
      flush();
      out += "<" + std::to_string(id) + ">";
    }
  }
  flush();
  return out;
}

}  // namespace ablate::token_shards
