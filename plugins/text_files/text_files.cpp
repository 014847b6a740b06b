// The `text_files` data source: raw text as byte-level tokens (0..255) with an end-of-document
// token 256 (vocabulary 257). Files are memory-mapped; a document is a whole file, or each non-empty
// piece of a file between occurrences of `separator`. The last `validation_fraction` of the
// documents (in file order) form the validation split.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ablate/data.hpp"
#include "ablate/data_util.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"

namespace {

constexpr int32_t kEndOfDocument = 256;
constexpr int32_t kByteVocabulary = 257;

struct DocumentSpan {
  uint32_t file;
  uint64_t begin;  // byte offsets in the file
  uint64_t end;
};

class TextFiles final : public ablate::DataSource {
 public:
  explicit TextFiles(const ablate::Params& own) {
    const auto& patterns = own.get_string_list("paths");
    if (patterns.empty()) ablate::throw_input_error(own.path() + ".paths", "no text files given");
    const std::string& separator = own.get_string("separator");
    std::vector<DocumentSpan> docs;
    for (const auto& path : ablate::expand_paths(patterns, own.path() + ".paths")) {
      files_.emplace_back(path);
      const ablate::MappedFile& f = files_.back();
      const std::string_view text(reinterpret_cast<const char*>(f.data()), f.size());
      const auto file = uint32_t(files_.size() - 1);
      if (separator.empty()) {
        if (!text.empty()) docs.push_back({file, 0, text.size()});
        continue;
      }
      std::size_t begin = 0;
      while (begin <= text.size()) {
        std::size_t end = text.find(separator, begin);
        if (end == std::string_view::npos) end = text.size();
        if (end > begin) docs.push_back({file, begin, end});
        begin = end + separator.size();
      }
    }
    if (docs.empty()) {
      ablate::throw_input_error(files_.front().path().string(),
                                "empty data set: the files of " + own.path() + ".paths hold no document");
    }
    const uint64_t val = ablate::validation_tail(docs.size(), own.get_float("validation_fraction"));
    validation_.assign(docs.end() - std::ptrdiff_t(val), docs.end());
    docs.resize(docs.size() - val);
    train_ = std::move(docs);
  }

  int32_t vocab_size() const override { return kByteVocabulary; }
  int32_t eot_token() const override { return kEndOfDocument; }
  uint64_t size(ablate::Split split) const override { return spans(split).size(); }

  void read(ablate::Split split, uint64_t doc, ablate::Document& out) const override {
    const auto& list = spans(split);
    if (doc >= list.size()) {
      ablate::throw_runtime_error("text_files", "document " + std::to_string(doc) + " of the " + ablate::to_string(split) +
                                                    " split is out of range (" + std::to_string(list.size()) + " documents)");
    }
    const DocumentSpan& s = list[doc];
    const auto* bytes = reinterpret_cast<const unsigned char*>(files_[s.file].data());
    out.index = doc;
    out.tokens.assign(bytes + s.begin, bytes + s.end);
  }

  // Text is its bytes; the end-of-document token reads "<eot>".
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 5, "<eot>") == 0) {
        out.push_back(kEndOfDocument);
        i += 4;
      } else {
        out.push_back(int32_t(static_cast<unsigned char>(text[i])));
      }
    }
    return out;
  }
  bool has_text() const override { return true; }
  std::string decode(const std::vector<int32_t>& tokens) const override {
    std::string out;
    for (int32_t t : tokens) {
      if (t == kEndOfDocument) out += "<eot>";
      else if (t >= 0 && t < 256) out += char(t);
    }
    return out;
  }

  std::string describe() const override {
    return "text_files: " + std::to_string(files_.size()) + " files, " + std::to_string(train_.size()) + " train / " +
           std::to_string(validation_.size()) + " validation documents, byte vocabulary 257";
  }

 private:
  const std::vector<DocumentSpan>& spans(ablate::Split split) const { return split == ablate::Split::train ? train_ : validation_; }
  std::vector<ablate::MappedFile> files_;
  std::vector<DocumentSpan> train_;
  std::vector<DocumentSpan> validation_;
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  r.add({ablate::Kind::data_source,
         "text_files",
         "1.0.0",
         "raw text as bytes (vocab 257, end-of-document 256); a document is a file or a separator-delimited piece",
         {
             string_list("paths", {}, "text files or globs (relative to the working directory; recorded absolute)").path(),
             string("separator", "", "split files into documents on this string (empty = one document per file)"),
             floating("validation_fraction", 0.0, "share of documents (the last ones) held out for validation").within(0.0, 0.5),
         },
         [](const ablate::ComponentArgs& args) { return std::make_unique<TextFiles>(args.own); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("text_files", "1.0.0", register_components)
