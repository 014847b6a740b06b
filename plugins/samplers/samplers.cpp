// The `sequential` and `shuffled` samplers. Both deal each epoch's sequence of documents out to the
// ranks round-robin (position p goes to rank p % world), so the ranks' draws are disjoint and
// together complete. `shuffled` orders each epoch by a seeded permutation -- of the whole epoch
// (buffer = 0) or within consecutive windows of `buffer` documents -- computed by a keyed Feistel
// network, so document_at(draw) is a pure function with no per-epoch table. `mixture` draws from
// the source's groups (DataSource::groups: token_shards' path patterns) in proportion to weights.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ablate/data.hpp"
#include "ablate/error.hpp"
#include "ablate/mix.hpp"
#include "ablate/plugin.hpp"

namespace {

using ablate::mix64;

// A keyed bijection of [0, n): a balanced Feistel network on the smallest even number of bits
// covering n, with cycle walking for values that land outside [0, n).
class KeyedPermutation {
 public:
  KeyedPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
    int bits = 2;
    while (bits < 64 && (uint64_t(1) << bits) < n) bits += 2;
    half_bits_ = bits / 2;
    half_mask_ = (uint64_t(1) << half_bits_) - 1;
  }

  uint64_t operator()(uint64_t i) const {
    if (n_ <= 1) return 0;
    uint64_t x = i;
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_, right = x & half_mask_;
    for (uint64_t round = 0; round < 6; ++round) {
      const uint64_t f = mix64(key_, right + (round << 56)) & half_mask_;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  uint64_t key_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
};

// Shared by both samplers: epochs and the round-robin deal to ranks; subclasses order an epoch.
// Rank r of w draws positions r, r + w, ... of every epoch: the global sequence (a resume on another
// world size deals it anew) is g = epoch * documents + position.
class RoundRobinSampler : public ablate::Sampler {
 public:
  void reset(uint64_t documents, uint64_t seed, int rank, int world) override {
    if (world < 1 || rank < 0 || rank >= world) {
      ablate::throw_runtime_error("sampler", "rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world));
    }
    if (documents < uint64_t(world)) {
      ablate::throw_input_error("sampler", "the split has " + std::to_string(documents) + " documents, fewer than the " +
                                               std::to_string(world) + " ranks that share it");
    }
    documents_ = documents;
    seed_ = seed;
    rank_ = uint64_t(rank);
    world_ = uint64_t(world);
    per_epoch_ = (documents - rank_ + world_ - 1) / world_;
    on_reset();
  }
  uint64_t draws_per_epoch() const override { return per_epoch_; }
  uint64_t document_at(uint64_t draw) override {
    if (per_epoch_ == 0) ablate::throw_runtime_error("sampler", "document_at before reset");
    const uint64_t epoch = draw / per_epoch_;
    const uint64_t position = (draw % per_epoch_) * world_ + rank_;
    return order(epoch, position);
  }
  // The global sequence is the epochs' orders one after the other: g = epoch * documents + position.
  bool reshardable() const override { return true; }
  uint64_t global_position(uint64_t draw, int rank, int world) const override {
    if (documents_ == 0 || world < 1 || rank < 0 || uint64_t(rank) >= std::min<uint64_t>(uint64_t(world), documents_)) {
      ablate::throw_runtime_error("sampler", "global_position of rank " + std::to_string(rank) + " of " + std::to_string(world) +
                                                 " over " + std::to_string(documents_) + " documents");
    }
    const uint64_t w = uint64_t(world), r = uint64_t(rank);
    const uint64_t per_epoch = (documents_ - r + w - 1) / w;
    return (draw / per_epoch) * documents_ + (draw % per_epoch) * w + r;
  }
  uint64_t document_at_global(uint64_t g) override {
    if (documents_ == 0) ablate::throw_runtime_error("sampler", "document_at_global before reset");
    return order(g / documents_, g % documents_);
  }

 protected:
  // The document at `position` of epoch `epoch`'s sequence (a bijection of [0, documents) per epoch).
  virtual uint64_t order(uint64_t epoch, uint64_t position) = 0;
  virtual void on_reset() {}

  uint64_t documents_ = 0;
  uint64_t seed_ = 0;
  uint64_t rank_ = 0;
  uint64_t world_ = 1;
  uint64_t per_epoch_ = 0;
};

class SequentialSampler final : public RoundRobinSampler {
 protected:
  uint64_t order(uint64_t, uint64_t position) override { return position; }
};

class ShuffledSampler final : public RoundRobinSampler {
 public:
  explicit ShuffledSampler(uint64_t buffer) : buffer_(buffer) {}

 protected:
  uint64_t order(uint64_t epoch, uint64_t position) override {
    const uint64_t epoch_key = mix64(seed_, epoch + 0x5368756666ull);
    if (buffer_ == 0 || buffer_ >= documents_) return KeyedPermutation(documents_, epoch_key)(position);
    const uint64_t window = position / buffer_;
    const uint64_t start = window * buffer_;
    const uint64_t size = std::min(buffer_, documents_ - start);
    return start + KeyedPermutation(size, mix64(epoch_key, window))(position - start);
  }

 private:
  uint64_t buffer_;
};

// `mixture`: the global sequence of draws (position p, dealt to rank p % world) takes group g at
// the position where g is furthest behind its share: the g with the largest (p + 1) w_g - n_g,
// n_g the draws g had before p (ties to the lower index). Every prefix of the sequence then holds
// each group within one draw of its weighted share. Within a group, its k-th draw is document k of
// the group's own epochs, each a seeded permutation of the group (a small group is revisited
// sooner than a large one: the weights, not the sizes, set the mix). The state at a position is a
// walk from 0; snapshots every 4096 positions make any position (a resumed cursor) cheap to reach.
// The global sequence (a resume on another world size deals it anew) is the positions themselves:
// the document at a position does not depend on the world.
class MixtureSampler final : public ablate::Sampler {
 public:
  MixtureSampler(std::vector<double> weights, std::string where) : weights_(std::move(weights)), where_(std::move(where)) {}

  void set_groups(const std::vector<ablate::DocumentGroup>& groups) override { groups_ = groups; }

  void reset(uint64_t documents, uint64_t seed, int rank, int world) override {
    if (world < 1 || rank < 0 || rank >= world) {
      ablate::throw_runtime_error("sampler", "rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world));
    }
    if (groups_.empty()) groups_ = {{"all", 0, documents}};
    std::string listing;
    for (const auto& g : groups_) listing += (listing.empty() ? "" : ", ") + g.name + " (" + std::to_string(g.documents) + ")";
    if (weights_.size() != groups_.size()) {
      ablate::throw_input_error(where_ + ".weights", std::to_string(weights_.size()) + " weight(s) for the data's " +
                                                         std::to_string(groups_.size()) + " group(s): " + listing +
                                                         " (one weight per group, in this order)");
    }
    double total = 0;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (weights_[g] > 0 && groups_[g].documents == 0) {
        ablate::throw_input_error(where_ + ".weights", "group " + groups_[g].name + " has weight " + std::to_string(weights_[g]) +
                                                           " but no document in this split");
      }
      total += weights_[g];
    }
    if (!(total > 0)) ablate::throw_input_error(where_ + ".weights", "the weights sum to 0; groups: " + listing);
    share_.resize(weights_.size());
    for (std::size_t g = 0; g < weights_.size(); ++g) share_[g] = weights_[g] / total;
    seed_ = seed;
    rank_ = uint64_t(rank);
    world_ = uint64_t(world);
    per_epoch_ = std::max<uint64_t>(1, (documents - std::min(documents, rank_) + world_ - 1) / world_);
    snapshots_.clear();
    at_ = 0;
    counts_.assign(groups_.size(), 0);
    snapshots_[0] = counts_;
  }

  uint64_t draws_per_epoch() const override { return per_epoch_; }

  uint64_t document_at(uint64_t draw) override { return document_at_global(draw * world_ + rank_); }

  // The global sequence is the sequence of positions itself.
  bool reshardable() const override { return true; }
  uint64_t global_position(uint64_t draw, int rank, int world) const override { return draw * uint64_t(world) + uint64_t(rank); }
  uint64_t document_at_global(uint64_t position) override {
    if (share_.empty()) ablate::throw_runtime_error("sampler", "document_at before reset");
    seek(position);
    const std::size_t g = pick();  // the group of `position`, with counts_ as they stand before it
    const ablate::DocumentGroup& group = groups_[g];
    const uint64_t k = counts_[g];
    const uint64_t epoch = k / group.documents;
    const uint64_t key = mix64(mix64(seed_, 0x4d69787475726500ull + g), epoch);
    return group.first + KeyedPermutation(group.documents, key)(k % group.documents);
  }

 private:
  static constexpr uint64_t kSnapshotEvery = 4096;

  std::size_t pick() const {
    std::size_t best = 0;
    double best_deficit = -1e300;
    for (std::size_t g = 0; g < share_.size(); ++g) {
      if (share_[g] <= 0) continue;
      const double deficit = double(at_ + 1) * share_[g] - double(counts_[g]);
      if (deficit > best_deficit) {
        best_deficit = deficit;
        best = g;
      }
    }
    return best;
  }

  // counts_ as they stand before global position `position`.
  void seek(uint64_t position) {
    if (position < at_) {
      auto it = std::prev(snapshots_.upper_bound(position));
      at_ = it->first;
      counts_ = it->second;
    }
    while (at_ < position) {
      ++counts_[pick()];
      ++at_;
      if (at_ % kSnapshotEvery == 0) snapshots_.emplace(at_, counts_);
    }
  }

  std::vector<double> weights_, share_;
  std::string where_;
  std::vector<ablate::DocumentGroup> groups_;
  uint64_t seed_ = 0, rank_ = 0, world_ = 1, per_epoch_ = 0;
  uint64_t at_ = 0;               // the position counts_ stands before
  std::vector<uint64_t> counts_;  // draws of each group before at_
  std::map<uint64_t, std::vector<uint64_t>> snapshots_;
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  r.add({ablate::Kind::sampler,
         "sequential",
         "1.0.0",
         "documents in index order, dealt round-robin to the ranks",
         {},
         [](const ablate::ComponentArgs&) { return std::make_unique<SequentialSampler>(); },
         "",
         {}});
  r.add({ablate::Kind::sampler,
         "shuffled",
         "1.0.0",
         "a seeded permutation per epoch (run.seed), whole-epoch or within windows, dealt round-robin to the ranks",
         {integer("buffer", 0, "0 = permute the whole epoch; N = permute within consecutive windows of N documents").within(0, 1e12)},
         [](const ablate::ComponentArgs& args) { return std::make_unique<ShuffledSampler>(uint64_t(args.own.get_int("buffer"))); },
         "",
         {}});
  r.add({ablate::Kind::sampler,
         "mixture",
         "1.0.0",
         "draws from the data's groups (token_shards: one per paths pattern) in proportion to weights, each prefix within "
         "one draw of its share; each group shuffled per its own epochs (run.seed)",
         {float_list("weights", {1.0}, "one weight per group of the data, in its order (normalised to sum to 1)").within(0.0, 1e9)},
         [](const ablate::ComponentArgs& args) {
           return std::make_unique<MixtureSampler>(args.own.get_float_list("weights"), args.own.path());
         },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("samplers", "1.0.0", register_components)
