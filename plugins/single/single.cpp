// The `single` communicator: a world of one rank. Every collective is the identity (one rank's
// shard is the whole buffer), so a single-process run uses the same code path as a data-parallel
// one. Buffers may live on any device; only broadcast's root is checked.
#include <string>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"

namespace {

class SingleCommunicator final : public ablate::Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  bool moves_data() const override { return false; }
  int local_rank() const override { return 0; }
  int local_world() const override { return 1; }
  void abort_job_at_exit(int, const std::string&) override {}
  void all_reduce(ablate::TensorView, ablate::ReduceOp) override {}
  void reduce_scatter(ablate::TensorView, ablate::ReduceOp) override {}
  void all_gather(ablate::TensorView) override {}
  void broadcast(ablate::TensorView, int root) override {
    if (root != 0) {
      ablate::throw_input_error("single communicator", "broadcast from root " + std::to_string(root) + " in a world of 1 rank");
    }
  }
  void barrier() override {}
};

void register_components(ablate::Registrar& r) {
  r.add({ablate::Kind::communicator,
         "single",
         "1.1.0",
         "one process, one device: collectives are the identity",
         {},
         [](const ablate::ComponentArgs&) { return std::make_unique<SingleCommunicator>(); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("single", "1.1.0", register_components)
