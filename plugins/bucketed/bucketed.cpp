// The `bucketed` batcher: one document per row, documents grouped by length into buckets, each
// batch padded only to its bucket's bound (so batches have varying T). Buckets are explicit
// `boundaries` or geometric (smallest, smallest*growth, ..., seq_len). A batch has batch_size rows,
// or with a `token_budget` as many rows as fit in budget / bound. A bucket is emitted as soon as it
// holds a full batch.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <string>

#include "ablate/data.hpp"
#include "ablate/data_util.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"

namespace {

std::vector<int32_t> bucket_bounds(const ablate::Params& own, int32_t seq_len) {
  std::vector<int32_t> bounds;
  const auto& explicit_bounds = own.get_int_list("boundaries");
  if (!explicit_bounds.empty()) {
    for (int64_t b : explicit_bounds) {
      if (!bounds.empty() && b <= bounds.back()) {
        ablate::throw_input_error(own.path() + ".boundaries", "boundaries must increase strictly");
      }
      if (b > seq_len) {
        ablate::throw_input_error(own.path() + ".boundaries",
                                  "boundary " + std::to_string(b) + " is above seq_len " + std::to_string(seq_len));
      }
      bounds.push_back(int32_t(b));
    }
  } else {
    const double growth = own.get_float("growth");
    double bound = double(std::min<int64_t>(own.get_int("smallest"), seq_len));
    while (int32_t(bound) < seq_len) {
      if (bounds.empty() || int32_t(bound) > bounds.back()) bounds.push_back(int32_t(bound));
      bound = std::ceil(bound * growth);
    }
  }
  if (bounds.empty() || bounds.back() < seq_len) bounds.push_back(seq_len);
  return bounds;
}

class BucketedBatcher final : public ablate::Batcher {
 public:
  BucketedBatcher(const ablate::BatchingOptions& options, const ablate::Params& own)
      : options_(options), bounds_(bucket_bounds(own, options.seq_len)), buckets_(bounds_.size()) {
    const int64_t budget = own.get_int("token_budget");
    for (int32_t bound : bounds_) {
      rows_per_bucket_.push_back(budget > 0 ? int32_t(std::max<int64_t>(1, budget / bound)) : options_.batch_size);
    }
  }

  void next(ablate::DocumentFeed& feed, ablate::Batch& out) override {
    const int32_t final_target = options_.append_eot ? feed.eot_token() : -1;
    for (;;) {
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        if (buckets_[b].size() >= std::size_t(rows_per_bucket_[b])) return emit(b, final_target, out);
      }
      cut_.clear();
      ablate::cut_document(feed.next(), options_.seq_len, options_.split_long, cut_);
      for (auto& piece : cut_) buckets_[bucket_of(piece.length())].push_back(std::move(piece));
    }
  }

  std::vector<ablate::PendingPiece> pending() const override {
    std::vector<ablate::PendingPiece> out;
    for (const auto& bucket : buckets_) {
      for (const auto& piece : bucket) out.push_back(piece.span);
    }
    return out;
  }

  void restore(const std::vector<ablate::PendingPiece>& pieces, ablate::DocumentFeed& feed) override {
    for (auto& bucket : buckets_) bucket.clear();
    for (const auto& span : pieces) {
      auto piece = ablate::piece_of(feed.fetch(span.document), span);
      buckets_[bucket_of(piece.length())].push_back(std::move(piece));
    }
  }

  int32_t max_rows() const override { return *std::max_element(rows_per_bucket_.begin(), rows_per_bucket_.end()); }
  int32_t max_seq_len() const override { return options_.seq_len; }

 private:
  std::size_t bucket_of(int32_t length) const {
    return std::size_t(std::lower_bound(bounds_.begin(), bounds_.end(), length) - bounds_.begin());
  }

  void emit(std::size_t b, int32_t final_target, ablate::Batch& out) {
    const auto rows = std::size_t(rows_per_bucket_[b]);
    auto& bucket = buckets_[b];
    rows_.resize(rows);
    for (std::size_t r = 0; r < rows; ++r) rows_[r].assign(1, &bucket[r]);
    ablate::write_rows(out, int32_t(rows), bounds_[b], rows_, final_target);
    bucket.erase(bucket.begin(), bucket.begin() + std::ptrdiff_t(rows));
  }

  ablate::BatchingOptions options_;
  std::vector<int32_t> bounds_;  // ascending; the last is seq_len
  std::vector<int32_t> rows_per_bucket_;
  std::vector<std::deque<ablate::DocumentPiece>> buckets_;  // pieces waiting, oldest first
  std::vector<ablate::DocumentPiece> cut_;
  std::vector<std::vector<const ablate::DocumentPiece*>> rows_;
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  r.add({ablate::Kind::batcher,
         "bucketed",
         "1.0.0",
         "one document per row, grouped by length; each batch padded to its bucket's bound",
         {
             int_list("boundaries", {}, "bucket bounds in tokens, increasing (seq_len is added as the last); empty = geometric")
                 .within(1, 16777216),
             integer("smallest", 64, "geometric buckets: the smallest bound").within(1, 16777216),
             floating("growth", 2.0, "geometric buckets: ratio between consecutive bounds").within(1.05, 1024.0),
             integer("token_budget", 0, "rows per batch = token_budget / bound (0 = batch_size rows)").within(0, 2147483647),
         },
         [](const ablate::ComponentArgs& args) {
           return std::make_unique<BucketedBatcher>(ablate::BatchingOptions::from(args.common), args.own);
         },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("bucketed", "1.0.0", register_components)
