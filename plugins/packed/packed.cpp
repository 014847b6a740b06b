// The `packed` batcher: several documents per row, so almost no position is padding. It looks at a
// `window` of pieces (documents, or seq_len-sized pieces of long ones) and places them into the
// batch's rows:
//   first_fit: pieces in arrival order, each into the first row it fits;
//   best_fit:  pieces longest first (best-fit decreasing), each into the row it fills most tightly.
// A row holds at most `max_segments_per_row` pieces (0 = no limit). The window is refilled and
// passes repeat until a pass places nothing; unplaced pieces wait (in order) for the next batch.
// Positions restart at every piece and the last token of a document targets eot (or -1), so no
// target crosses a document boundary; attention backends mask block-diagonally by segment.
#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>
#include <string>

#include "ablate/data.hpp"
#include "ablate/data_util.hpp"
#include "ablate/plugin.hpp"

namespace {

enum class FitStrategy { first_fit, best_fit };

class PackedBatcher final : public ablate::Batcher {
 public:
  PackedBatcher(const ablate::BatchingOptions& options, const ablate::Params& own)
      : options_(options),
        strategy_(own.get_string("strategy") == "best_fit" ? FitStrategy::best_fit : FitStrategy::first_fit),
        window_size_(std::size_t(own.get_int("window"))),
        max_segments_(int32_t(own.get_int("max_segments_per_row"))) {}

  void next(ablate::DocumentFeed& feed, ablate::Batch& out) override {
    const int32_t final_target = options_.append_eot ? feed.eot_token() : -1;
    const auto rows = std::size_t(options_.batch_size);
    free_.assign(rows, options_.seq_len);
    segments_.assign(rows, 0);
    row_pieces_.assign(rows, {});
    placed_.clear();
    for (;;) {
      while (window_.size() < window_size_) {
        cut_.clear();
        ablate::cut_document(feed.next(), options_.seq_len, options_.split_long, cut_);
        for (auto& piece : cut_) window_.push_back(std::move(piece));
      }
      if (!place_window()) break;
    }
    ablate::write_rows(out, options_.batch_size, options_.seq_len, row_pieces_, final_target);
  }

  std::vector<ablate::PendingPiece> pending() const override {
    std::vector<ablate::PendingPiece> out;
    for (const auto& piece : window_) out.push_back(piece.span);
    return out;
  }

  void restore(const std::vector<ablate::PendingPiece>& pieces, ablate::DocumentFeed& feed) override {
    window_.clear();
    for (const auto& span : pieces) window_.push_back(ablate::piece_of(feed.fetch(span.document), span));
  }

  int32_t max_rows() const override { return options_.batch_size; }
  int32_t max_seq_len() const override { return options_.seq_len; }

 private:
  bool row_accepts(std::size_t row, int32_t length) const {
    return free_[row] >= length && (max_segments_ == 0 || segments_[row] < max_segments_);
  }

  // The row a piece of `length` goes to under the strategy, or rows() when none accepts it.
  std::size_t choose_row(int32_t length) const {
    std::size_t chosen = free_.size();
    for (std::size_t r = 0; r < free_.size(); ++r) {
      if (!row_accepts(r, length)) continue;
      if (strategy_ == FitStrategy::first_fit) return r;
      if (chosen == free_.size() || free_[r] < free_[chosen]) chosen = r;
    }
    return chosen;
  }

  // One pass over the window; returns whether it placed anything.
  bool place_window() {
    order_.resize(window_.size());
    std::iota(order_.begin(), order_.end(), std::size_t(0));
    if (strategy_ == FitStrategy::best_fit) {
      std::stable_sort(order_.begin(), order_.end(),
                       [&](std::size_t a, std::size_t b) { return window_[a].length() > window_[b].length(); });
    }
    taken_.assign(window_.size(), false);
    bool placed_any = false;
    for (std::size_t i : order_) {
      const int32_t length = window_[i].length();
      const std::size_t row = choose_row(length);
      if (row == free_.size()) continue;
      placed_.push_back(std::move(window_[i]));
      row_pieces_[row].push_back(&placed_.back());
      free_[row] -= length;
      ++segments_[row];
      taken_[i] = true;
      placed_any = true;
    }
    if (placed_any) {
      std::size_t kept = 0;
      for (std::size_t i = 0; i < window_.size(); ++i) {
        if (taken_[i]) continue;
        if (kept != i) window_[kept] = std::move(window_[i]);
        ++kept;
      }
      window_.resize(kept);
    }
    return placed_any;
  }

  ablate::BatchingOptions options_;
  FitStrategy strategy_;
  std::size_t window_size_;
  int32_t max_segments_;
  std::vector<ablate::DocumentPiece> window_;  // pieces waiting, in arrival order
  std::deque<ablate::DocumentPiece> placed_;   // pieces of the batch being built (stable addresses)
  std::vector<int32_t> free_;                  // (rows) positions left per row
  std::vector<int32_t> segments_;              // (rows) pieces per row
  std::vector<std::vector<const ablate::DocumentPiece*>> row_pieces_;
  std::vector<ablate::DocumentPiece> cut_;
  std::vector<std::size_t> order_;
  std::vector<bool> taken_;
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  r.add({ablate::Kind::batcher,
         "packed",
         "1.0.0",
         "several documents per row (first-fit or best-fit over a window); positions restart per document",
         {
             string("strategy", "best_fit", "first_fit: arrival order, first row that fits; best_fit: longest first, tightest row")
                 .one_of({"first_fit", "best_fit"}),
             integer("window", 256, "pieces considered at once (more: denser rows, more reordering)").within(1, 1048576),
             integer("max_segments_per_row", 0, "most documents in one row (0 = no limit)").within(0, 16777216),
         },
         [](const ablate::ComponentArgs& args) {
           return std::make_unique<PackedBatcher>(ablate::BatchingOptions::from(args.common), args.own);
         },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("packed", "1.0.0", register_components)
