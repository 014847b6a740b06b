// The `padded` batcher: one document per row, padded to seq_len. A document longer than a row is
// split into consecutive rows or truncated ([batching] long_documents). The baseline the other
// batchers are measured against: most positions are padding when documents are short.
#include <deque>
#include <memory>

#include "ablate/data.hpp"
#include "ablate/data_util.hpp"
#include "ablate/plugin.hpp"

namespace {

class PaddedBatcher final : public ablate::Batcher {
 public:
  explicit PaddedBatcher(const ablate::BatchingOptions& options) : options_(options) {}

  void next(ablate::DocumentFeed& feed, ablate::Batch& out) override {
    const int32_t final_target = options_.append_eot ? feed.eot_token() : -1;
    while (held_.size() < std::size_t(options_.batch_size)) {
      cut_.clear();
      ablate::cut_document(feed.next(), options_.seq_len, options_.split_long, cut_);
      for (auto& piece : cut_) held_.push_back(std::move(piece));
    }
    rows_.resize(std::size_t(options_.batch_size));
    for (std::size_t r = 0; r < rows_.size(); ++r) rows_[r].assign(1, &held_[r]);
    ablate::write_rows(out, options_.batch_size, options_.seq_len, rows_, final_target);
    held_.erase(held_.begin(), held_.begin() + options_.batch_size);
  }

  std::vector<ablate::PendingPiece> pending() const override {
    std::vector<ablate::PendingPiece> out;
    for (const auto& piece : held_) out.push_back(piece.span);
    return out;
  }

  void restore(const std::vector<ablate::PendingPiece>& pieces, ablate::DocumentFeed& feed) override {
    held_.clear();
    for (const auto& span : pieces) held_.push_back(ablate::piece_of(feed.fetch(span.document), span));
  }

  int32_t max_rows() const override { return options_.batch_size; }
  int32_t max_seq_len() const override { return options_.seq_len; }

 private:
  ablate::BatchingOptions options_;
  std::deque<ablate::DocumentPiece> held_;  // pieces of split documents not yet given a row
  std::vector<ablate::DocumentPiece> cut_;
  std::vector<std::vector<const ablate::DocumentPiece*>> rows_;
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::batcher,
         "padded",
         "1.0.0",
         "one document per row, padded to seq_len (the baseline)",
         {},
         [](const ablate::ComponentArgs& args) { return std::make_unique<PaddedBatcher>(ablate::BatchingOptions::from(args.common)); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("padded", "1.0.0", register_components)
