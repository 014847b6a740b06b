// The `mpi` communicator's timeout, run by CTest under mpiexec with 2 ranks: rank 1 skips an
// all_reduce, rank 0 (timeout_s = 1) must throw within about a second an error naming its rank,
// the operation and the element count, and the job must then end (rank 1 would otherwise sleep
// for 30 s). CTest passes the test on rank 0's "timeout observed" line and fails it on a timeout.
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"

int main() {
  using namespace ablate;
  using Clock = std::chrono::steady_clock;
  Registry registry;
  registry.load_directories({ABLATE_PLUGIN_DIR});
  const Params common{"run", {}};
  const Params own{
      "run.mpi", {{"timeout_s", Value(1.0)}, {"ring_min_bytes", Value(int64_t(1) << 20)}, {"segment_bytes", Value(int64_t(8) << 20)}}};
  const RunContext run;
  std::unique_ptr<Communicator> comm = registry.create<Communicator>(Kind::communicator, "mpi", {common, own, run});
  if (comm->world() != 2) {
    std::printf("this test needs 2 ranks, it has %d\n", comm->world());
    return 1;
  }
  comm->barrier();  // both ranks are up and connected
  if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::printf("rank 1 was not stopped by rank 0's timeout\n");
    return 1;
  }
  std::vector<float> v(1000, 1.0f);
  TensorView t;
  t.data = v.data();
  t.ndim = 1;
  t.shape[0] = int64_t(v.size());
  const Clock::time_point start = Clock::now();
  try {
    comm->all_reduce(t, ReduceOp::sum);
  } catch (const Error& e) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (e.kind() != ErrorKind::runtime || waited < 0.9 || waited > 2.5) {
      std::printf("wrong timeout: kind %d after %.2f s: %s\n", int(e.kind()), waited, e.what());
      return 1;
    }
    // A failed communicator refuses further collectives instead of hanging in them.
    try {
      comm->barrier();
      std::printf("barrier after a timeout did not throw\n");
      return 1;
    } catch (const Error&) {
    }
    std::printf("timeout observed after %.2f s: %s\n", waited, e.what());
    std::fflush(stdout);
    return 0;  // at exit the plugin aborts the job, which ends rank 1
  }
  std::printf("all_reduce returned without rank 1\n");
  return 1;
}
