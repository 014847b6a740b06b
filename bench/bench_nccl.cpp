// Collective time of the `nccl` communicator on GPU buffers: all_reduce of a GPT-2 124M-sized
// gradient buffer (124,475,904 elements) in f32 and bf16, and reduce_scatter + all_gather of the f32
// one (the ZeRO-1 pair), each enqueued on the device's stream and timed to its join() and a
// synchronize. One process per GPU; under mpiexec for several:
//
//   [mpiexec -n G] bench_nccl [--elements N] [--iters K] [--json FILE]
//
// The table gives the median and best of K runs (the slowest rank's), the algorithm bandwidth
// (buffer bytes / time) and nccl-tests' bus bandwidth (all-reduce x 2(n-1)/n, reduce-scatter and
// all-gather x (n-1)/n): on one GPU the bus factor is 0 and what is measured is the communicator's
// own cost (NCCL's one-rank collectives copy at most once). Exits 77 without a CUDA device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/communicator.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"

using namespace ablate;

namespace {

struct Options {
  int64_t elements = 124475904;
  int iters = 5;
  std::string json_path;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(ErrorKind::input, "bench_nccl", a + " needs a value");
      return argv[++i];
    };
    if (a == "--elements") o.elements = std::max<int64_t>(1, std::stoll(value()));
    else if (a == "--iters") o.iters = std::max(1, std::stoi(value()));
    else if (a == "--json") o.json_path = value();
    else throw Error(ErrorKind::input, "bench_nccl", "unknown argument " + a + " (--elements N --iters K --json FILE)");
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (!cuda::device_available()) {
      std::printf("bench_nccl: no CUDA device; skipped\n");
      return 77;
    }
    Registry registry;
    registry.load_directories(Registry::default_search_path());
    RunContext run;
    run.device = "cuda";
    const Params run_p("run", {});
    const Params nccl_p("run.nccl", {{"timeout_s", Value(120.0)}});
    auto device = registry.create<Device>(Kind::device, "cuda", {run_p, run_p, run});
    auto comm = registry.create<Communicator>(Kind::communicator, "nccl", {run_p, nccl_p, run});
    comm->set_stream(device->stream());
    const int world = comm->world();
    struct Row {
      std::string op;
      DType dtype;
      double bus_factor;
      std::vector<double> seconds;
    };
    std::vector<Row> rows = {{"all_reduce", DType::f32, 2.0 * (world - 1) / world, {}},
                             {"all_reduce", DType::bf16, 2.0 * (world - 1) / world, {}},
                             {"reduce_scatter", DType::f32, double(world - 1) / world, {}},
                             {"all_gather", DType::f32, double(world - 1) / world, {}}};
    const int64_t n = o.elements / world * world;  // the sharded collectives split it evenly
    for (Row& r : rows) {
      Buffer b = device->alloc(r.dtype, n);
      const auto call = [&] {
        if (r.op == "all_reduce") comm->all_reduce(b.view(), ReduceOp::sum);
        else if (r.op == "reduce_scatter") comm->reduce_scatter(b.view(), ReduceOp::sum);
        else comm->all_gather(b.view());
        comm->join();
        device->synchronize();
      };
      call();  // warm-up: NCCL's channels and buffers
      for (int i = 0; i < o.iters; ++i) {
        comm->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        call();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        comm->all_reduce_host(flat_view(&s, DType::f64, 1), ReduceOp::max);
        r.seconds.push_back(s);
      }
    }
    nlohmann::json out = {{"device", device->describe()}, {"world", world}, {"elements", n}, {"rows", nlohmann::json::array()}};
    if (comm->rank() == 0) {
      std::printf("%-15s %-5s %12s %10s %10s %12s %12s\n", "collective", "dtype", "MB", "median ms", "best ms", "algbw GB/s",
                  "busbw GB/s");
    }
    for (const Row& r : rows) {
      const double bytes = double(n) * double(dtype_size(r.dtype)), med = median(r.seconds),
                   best = *std::min_element(r.seconds.begin(), r.seconds.end());
      const double algbw = bytes / med / 1e9;
      if (comm->rank() == 0) {
        std::printf("%-15s %-5s %12.1f %10.3f %10.3f %12.1f %12.1f\n", r.op.c_str(), to_string(r.dtype), bytes / 1e6, med * 1e3,
                    best * 1e3, algbw, algbw * r.bus_factor);
      }
      out["rows"].push_back({{"op", r.op},
                             {"dtype", to_string(r.dtype)},
                             {"bytes", bytes},
                             {"median_ms", med * 1e3},
                             {"best_ms", best * 1e3},
                             {"algbw_gbs", algbw},
                             {"busbw_gbs", algbw * r.bus_factor}});
    }
    if (comm->rank() == 0 && !o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2) << "\n";
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_nccl: %s\n", e.what());
    return e.kind() == ErrorKind::input ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nccl: %s\n", e.what());
    return 1;
  }
}
