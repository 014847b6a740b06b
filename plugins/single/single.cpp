// The `single` communicator: a world of one rank. Every collective is the identity, so a
// single-process run uses the same code path as a data-parallel one.
#include "ablate/communicator.hpp"
#include "ablate/plugin.hpp"

namespace {

class SingleCommunicator final : public ablate::Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  int local_rank() const override { return 0; }
  void all_reduce(ablate::TensorView, ablate::ReduceOp) override {}
  void broadcast(ablate::TensorView, int) override {}
  void barrier() override {}
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::communicator, "single", "1.0.0", "one process, one device: collectives are the identity", {},
         [](const ablate::ComponentArgs&) { return std::make_unique<SingleCommunicator>(); }, ""});
}

}  // namespace

ABLATE_PLUGIN("single", "1.0.0", register_components)
