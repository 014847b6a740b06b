// The `token_shards` data source: pre-tokenised llm.c shards (a header of 256 int32 -- magic
// 20240520, version 1, token count -- then that many uint16 tokens), memory-mapped, never read whole.
// Documents are the runs of tokens between end-of-text tokens (`eot`) within one shard; the split
// is by shard glob (`val_paths`) or the last `validation_fraction` of the documents. Samples are
// decoded through the corpus's GPT-2 tokenizer files when it has them (gpt2_vocab.hpp), else
// written as token ids.
#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ablate/data.hpp"
#include "ablate/data_util.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "gpt2_vocab.hpp"
#include "spm_text.hpp"

#include <spdlog/spdlog.h>

namespace {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr std::size_t kHeaderInts = 256;
constexpr std::size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

std::string at_offset(const std::filesystem::path& file, uint64_t offset) {
  return file.string() + ":offset " + std::to_string(offset);
}

// One mapped shard and the start/end (token offsets) of each of its documents.
struct Shard {
  explicit Shard(const std::filesystem::path& path) : file(path) {}
  ablate::MappedFile file;
  const uint16_t* tokens = nullptr;  // (count)
  uint64_t count = 0;
  std::vector<uint32_t> doc_begin;
  std::vector<uint32_t> doc_end;
  uint64_t eot_count = 0;  // end-of-text tokens met
  int32_t max_token = -1;  // the largest token id met
};

std::unique_ptr<Shard> open_shard(const std::filesystem::path& path, int32_t eot, int32_t vocab) {
  auto owned = std::make_unique<Shard>(path);
  Shard& shard = *owned;
  const std::size_t size = shard.file.size();
  if (size < kHeaderBytes) {
    ablate::throw_input_error(at_offset(path, size), "truncated header: the file has " + std::to_string(size) +
                                                         " bytes, an llm.c shard header has " + std::to_string(kHeaderBytes));
  }
  int32_t header[kHeaderInts];
  std::memcpy(header, shard.file.data(), kHeaderBytes);
  if (header[0] != kShardMagic) {
    ablate::throw_input_error(at_offset(path, 0), "wrong magic " + std::to_string(header[0]) + " (an llm.c token shard has " +
                                                      std::to_string(kShardMagic) + ")");
  }
  if (header[1] != kShardVersion) {
    ablate::throw_input_error(at_offset(path, 4), "unsupported version " + std::to_string(header[1]) + " (expected " +
                                                      std::to_string(kShardVersion) + ": uint16 tokens)");
  }
  if (header[2] < 0) ablate::throw_input_error(at_offset(path, 8), "negative token count " + std::to_string(header[2]));
  shard.count = uint64_t(header[2]);
  const uint64_t expected = kHeaderBytes + shard.count * sizeof(uint16_t);
  if (size < expected) {
    ablate::throw_input_error(at_offset(path, size), "truncated body: the header says " + std::to_string(shard.count) + " tokens (" +
                                                         std::to_string(expected) + " bytes) but the file has " +
                                                         std::to_string(size) + " bytes");
  }
  if (size > expected) {
    ablate::throw_input_error(at_offset(path, expected),
                              std::to_string(size - expected) + " bytes after the last token the header counts");
  }
  shard.tokens = reinterpret_cast<const uint16_t*>(shard.file.data() + kHeaderBytes);
  // One pass: check the vocabulary and record the documents (maximal runs between eot tokens).
  uint64_t begin = 0;
  for (uint64_t i = 0; i < shard.count; ++i) {
    const int32_t t = shard.tokens[i];
    if (t >= vocab) {
      ablate::throw_input_error(at_offset(path, kHeaderBytes + i * sizeof(uint16_t)), "token " + std::to_string(t) +
                                                                                          " is outside the vocabulary (vocab_size " +
                                                                                          std::to_string(vocab) + ")");
    }
    shard.max_token = std::max(shard.max_token, t);
    if (t == eot) {
      ++shard.eot_count;
      if (i > begin) {
        shard.doc_begin.push_back(uint32_t(begin));
        shard.doc_end.push_back(uint32_t(i));
      }
      begin = i + 1;
    }
  }
  if (shard.count > begin) {
    shard.doc_begin.push_back(uint32_t(begin));
    shard.doc_end.push_back(uint32_t(shard.count));
  }
  return owned;
}

// The documents of one split: a list of shards, each with a range of its documents.
struct SplitIndex {
  struct Part {
    const Shard* shard;
    uint64_t first_doc;  // first document of the shard in this part
    uint64_t docs;
  };
  std::vector<Part> parts;
  std::vector<uint64_t> starts;  // split-level index of each part's first document
  uint64_t total = 0;

  void add(const Shard& shard, uint64_t first, uint64_t docs) {
    if (docs == 0) return;
    parts.push_back({&shard, first, docs});
    starts.push_back(total);
    total += docs;
  }
};

class TokenShards final : public ablate::DataSource {
 public:
  explicit TokenShards(const ablate::Params& own) {
    eot_ = int32_t(own.get_int("eot"));
    vocab_ = int32_t(own.get_int("vocab_size"));
    if (eot_ >= vocab_) {
      ablate::throw_input_error(own.path(), "eot " + std::to_string(eot_) + " is not below vocab_size " + std::to_string(vocab_));
    }
    const auto& train_patterns = own.get_string_list("paths");
    const auto& val_patterns = own.get_string_list("val_paths");
    if (train_patterns.empty()) ablate::throw_input_error(own.path() + ".paths", "no shard paths given");
    // Each pattern expanded on its own: a pattern is a group of documents (a source a mixture weighs).
    // A file two patterns of a split match is read once, in the first one's group.
    std::vector<std::filesystem::path> train_files, val_files;
    const auto expand = [&](const std::vector<std::string>& patterns, const std::string& key,
                            std::vector<std::filesystem::path>& files) {
      std::set<std::filesystem::path> seen;
      for (const std::string& pattern : patterns) {
        for (auto& f : ablate::expand_paths({pattern}, own.path() + key)) {
          if (!seen.insert(f).second) continue;
          files.push_back(std::move(f));
          shard_pattern_.push_back(pattern);
        }
      }
    };
    expand(train_patterns, ".paths", train_files);
    expand(val_patterns, ".val_paths", val_files);
    for (const auto& f : train_files) shards_.push_back(open_shard(f, eot_, vocab_));
    const std::size_t first_val_shard = shards_.size();
    for (const auto& f : val_files) shards_.push_back(open_shard(f, eot_, vocab_));

    uint64_t train_docs = 0;
    for (std::size_t s = 0; s < first_val_shard; ++s) train_docs += shards_[s]->doc_begin.size();
    if (train_docs == 0) {
      ablate::throw_input_error(train_files.front().string(), "empty data set: the shards of " + own.path() +
                                                                  ".paths hold no document (only end-of-text tokens or none)");
    }
    if (!val_files.empty()) {
      for (std::size_t s = 0; s < shards_.size(); ++s) {
        (s < first_val_shard ? train_ : validation_).add(*shards_[s], 0, shards_[s]->doc_begin.size());
      }
    } else {
      // The last documents (in shard order) form the validation split.
      const uint64_t val_docs = ablate::validation_tail(train_docs, own.get_float("validation_fraction"));
      uint64_t remaining_train = train_docs - val_docs;
      for (std::size_t s = 0; s < first_val_shard; ++s) {
        const uint64_t docs = shards_[s]->doc_begin.size();
        const uint64_t to_train = std::min(docs, remaining_train);
        train_.add(*shards_[s], 0, to_train);
        validation_.add(*shards_[s], to_train, docs - to_train);
        remaining_train -= to_train;
      }
    }
    tokens_total_ = 0;
    for (const auto& s : shards_) tokens_total_ += s->count;
    warn_about_the_data(own, val_files.empty());
    open_tokenizer(own, train_files.front());
  }

  int32_t vocab_size() const override { return vocab_; }
  int32_t eot_token() const override { return eot_; }
  uint64_t size(ablate::Split split) const override { return index(split).total; }

  void read(ablate::Split split, uint64_t doc, ablate::Document& out) const override {
    const SplitIndex& idx = index(split);
    if (doc >= idx.total) {
      ablate::throw_runtime_error("token_shards", "document " + std::to_string(doc) + " of the " + ablate::to_string(split) +
                                                      " split is out of range (" + std::to_string(idx.total) + " documents)");
    }
    const std::size_t part = std::size_t(std::upper_bound(idx.starts.begin(), idx.starts.end(), doc) - idx.starts.begin() - 1);
    const SplitIndex::Part& p = idx.parts[part];
    const uint64_t local = p.first_doc + (doc - idx.starts[part]);
    const uint16_t* begin = p.shard->tokens + p.shard->doc_begin[local];
    const uint16_t* end = p.shard->tokens + p.shard->doc_end[local];
    out.index = doc;
    out.tokens.assign(begin, end);
  }

  // Prompts are text where the shards' tokenizer covers every byte (GPT-2's does), token ids otherwise.
  std::vector<int32_t> encode(const std::string& text) const override {
#ifdef ABLATE_HAVE_SENTENCEPIECE
    if (spm_text_) return spm_text_->encode(text);
#endif
    return vocab_text_ && vocab_text_->can_encode() ? vocab_text_->encode(text) : DataSource::encode(text);
  }
  std::string decode(const std::vector<int32_t>& tokens) const override {
#ifdef ABLATE_HAVE_SENTENCEPIECE
    if (spm_text_) return spm_text_->decode(tokens);
#endif
    return vocab_text_ ? vocab_text_->decode(tokens) : DataSource::decode(tokens);
  }
  bool has_text() const override {
#ifdef ABLATE_HAVE_SENTENCEPIECE
    if (spm_text_) return true;
#endif
    return vocab_text_ != nullptr;
  }

  // One group per shard pattern, in the order the split holds their documents.
  std::vector<ablate::DocumentGroup> groups(ablate::Split split) const override {
    std::vector<ablate::DocumentGroup> out;
    uint64_t at = 0;
    for (const SplitIndex::Part& part : index(split).parts) {
      std::size_t s = 0;
      while (shards_[s].get() != part.shard) ++s;
      if (out.empty() || out.back().name != shard_pattern_[s]) out.push_back({shard_pattern_[s], at, 0});
      out.back().documents += part.docs;
      at += part.docs;
    }
    return out;
  }

  std::filesystem::path gpt2_tokenizer_dir() const override {
    return vocab_text_ ? vocab_text_->file().parent_path() : std::filesystem::path();
  }

  std::string describe() const override {
    return "token_shards: " + std::to_string(shards_.size()) + " shards, " + std::to_string(tokens_total_) + " tokens, " +
           std::to_string(train_.total) + " train / " + std::to_string(validation_.total) + " validation documents, vocab " +
           std::to_string(vocab_) + ", eot " + std::to_string(eot_) +
           (vocab_text_ ? ", decoded with " + vocab_text_->file().string() : std::string())
#ifdef ABLATE_HAVE_SENTENCEPIECE
           + (spm_text_ ? ", decoded with " + spm_text_->file().string() : std::string())
#endif
        ;
  }

 private:
  // Settings that read the data wrongly without failing: an end-of-text id the shards never hold
  // (each shard one giant document), a vocabulary far larger than the ids in use (byte shards read
  // with GPT-2's 50257), a validation fraction that holds out nothing.
  void warn_about_the_data(const ablate::Params& own, bool split_by_fraction) const {
    uint64_t eots = 0;
    int32_t max_token = -1;
    for (const auto& s : shards_) {
      eots += s->eot_count;
      max_token = std::max(max_token, s->max_token);
    }
    if (eots == 0 && tokens_total_ > 0) {
      spdlog::warn("{}.eot: token {} never occurs in the {} tokens of the shards, so each shard is one document; set eot "
                   "to the id that ends the data's documents",
                   own.path(), eot_, tokens_total_);
    }
    if (max_token >= 0 && int64_t(max_token) + 1 < vocab_ / 2) {
      spdlog::warn("{}.vocab_size: the shards use ids 0..{} only but vocab_size is {}; the model's embedding and "
                   "classifier spend {}% of their rows on ids that never occur (byte-level shards take vocab_size 256)",
                   own.path(), max_token, vocab_, 100 * (int64_t(vocab_) - max_token - 1) / vocab_);
    }
    const double fraction = own.get_float("validation_fraction");
    if (split_by_fraction && fraction > 0.0 && validation_.total == 0) {
      spdlog::warn("{}.validation_fraction: {} of {} document(s) holds out none (at least 2 documents are needed); "
                   "the run has no validation split",
                   own.path(), fraction, train_.total);
    }
  }

  // `tokenizer`: "auto" reads the tokenizer/ directory beside the first training shard when there
  // is one; a path must hold the files (a SentencePiece tokenizer.model, else GPT-2's); "none"
  // decodes as token ids.
  void open_tokenizer(const ablate::Params& own, const std::filesystem::path& first_shard) {
    using ablate::token_shards::Gpt2Vocab;
    using ablate::token_shards::SentencePieceText;
    const std::string setting = own.get_string("tokenizer"), key = own.path() + ".tokenizer";
    if (setting == "none") return;
    std::filesystem::path dir = setting;
    if (setting == "auto") dir = first_shard.parent_path() / "tokenizer";
    if (SentencePieceText::present(dir)) {
#ifdef ABLATE_HAVE_SENTENCEPIECE
      spm_text_ = SentencePieceText::load(dir, vocab_, key);
      return;
#else
      ablate::throw_input_error(key, (dir / "tokenizer.model").string() +
                                         " is a SentencePiece model and this build has no "
                                         "SentencePiece (apt install libsentencepiece-dev, then build again)");
#endif
    }
    if (setting == "auto" && !Gpt2Vocab::present(dir)) return;
    if (!Gpt2Vocab::present(dir)) {
      ablate::throw_input_error(key, "'" + setting +
                                         "' holds neither tokenizer.model (SentencePiece) nor encoder.json or gpt2.tiktoken "
                                         "(GPT-2's files): give such a directory, \"auto\" or \"none\"");
    }
    vocab_text_ = std::make_unique<Gpt2Vocab>(Gpt2Vocab::load(dir, vocab_));
  }
  const SplitIndex& index(ablate::Split split) const { return split == ablate::Split::train ? train_ : validation_; }

  int32_t eot_ = 50256;
  int32_t vocab_ = 50257;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::string> shard_pattern_;  // the pattern each shard came from (parallel to shards_)
  SplitIndex train_;
  SplitIndex validation_;
  uint64_t tokens_total_ = 0;
  std::unique_ptr<ablate::token_shards::Gpt2Vocab> vocab_text_;        // null: samples as token ids
  std::unique_ptr<ablate::token_shards::SentencePieceText> spm_text_;  // a SentencePiece model instead, else null
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  r.add({ablate::Kind::data_source,
         "token_shards",
         "1.0.0",
         "llm.c token shards (uint16, memory-mapped); documents split on the end-of-text token",
         {
             string_list("paths", {}, "training shards: files or globs (relative to the working directory; recorded absolute)").path(),
             string_list("val_paths", {}, "validation shards; empty = the last validation_fraction of the documents").path(),
             floating("validation_fraction", 0.0, "share of documents held out when val_paths is empty").within(0.0, 0.5),
             integer("eot", 50256, "end-of-text token id (documents are split on it); shards hold uint16 tokens").within(0, 65535),
             integer("vocab_size", 50257, "vocabulary size; a token at or above it is an input error").within(1, 65536),
             string("tokenizer", "auto",
                    "the tokenizer prompts are encoded and samples decoded with: a directory holding a SentencePiece "
                    "tokenizer.model or GPT-2's files (encoder.json or gpt2.tiktoken), "
                    "\"auto\" (tokenizer/ beside the first shard, when there) or \"none\" (token ids)")
                 .path({"auto", "none"}),
         },
         [](const ablate::ComponentArgs& args) { return std::make_unique<TokenShards>(args.own); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("token_shards", "1.0.0", register_components)
