// An example plugin built out of tree against the installed ablate SDK: the `reversed` sampler
// draws documents from the last to the first, epoch after epoch, and deals them to ranks in turn.
#include <stdexcept>

#include <ablate/data.hpp>
#include <ablate/plugin.hpp>

namespace {

class ReversedSampler final : public ablate::Sampler {
 public:
  explicit ReversedSampler(int64_t stride) : stride_(uint64_t(stride)) {}

  void reset(uint64_t documents, uint64_t /*seed*/, int rank, int world) override {
    documents_ = documents;
    rank_ = uint64_t(rank);
    world_ = uint64_t(world);
    // Ranks take every world-th position; the first documents % world ranks get one more.
    per_epoch_ = documents / world_ + (rank_ < documents % world_ ? 1 : 0);
  }
  uint64_t draws_per_epoch() const override { return per_epoch_; }
  uint64_t document_at(uint64_t draw) override {
    if (per_epoch_ == 0) throw std::runtime_error("reversed sampler: no documents for this rank");
    return document_at_global((draw % per_epoch_) * world_ + rank_);
  }

  // Resuming on another world size: every epoch is the same sequence of documents_ positions, so
  // the global sequence is g = epoch * documents_ + position, and rank r of w takes positions
  // r, r + w, ... of each epoch.
  bool reshardable() const override { return true; }
  uint64_t global_position(uint64_t draw, int rank, int world) const override {
    const uint64_t w = uint64_t(world), r = uint64_t(rank);
    const uint64_t per_epoch = documents_ / w + (r < documents_ % w ? 1 : 0);
    if (per_epoch == 0) throw std::runtime_error("reversed sampler: no documents for this rank");
    return (draw / per_epoch) * documents_ + (draw % per_epoch) * w + r;
  }
  uint64_t document_at_global(uint64_t g) override { return documents_ - 1 - (g % documents_) * stride_ % documents_; }

 private:
  uint64_t stride_ = 1, documents_ = 0, rank_ = 0, world_ = 1, per_epoch_ = 0;
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::sampler,
         "reversed",
         "1.0.0",
         "documents from the last to the first (an SDK example)",
         {ablate::param::integer("stride", 1, "step between two draws (keep it coprime with the document count)").at_least(1)},
         [](const ablate::ComponentArgs& args) { return std::make_unique<ReversedSampler>(args.own.get_int("stride")); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("reversed_sampler", "1.0.0", register_components)
