// Collective time of the `mpi` communicator on one machine: all_reduce of a GPT-2 124M-sized f32
// gradient buffer (124,475,904 elements by default), reduce_scatter + all_gather of the same (the
// ZeRO-1 pair). References on the same buffer: MPI's blocking MPI_Allreduce and MPI_Allgatherv,
// and its non-blocking MPI_Iallreduce and MPI_Ireduce_scatter polled with MPI_Test (what the
// communicator would cost built on them instead of its own ring). Run it under the launcher:
//
//   mpiexec -n 2 bench_comm [--elements N] [--iters K] [--segment-bytes B] [--ring-min-bytes B] [--json FILE]
//
// Each timing is the slowest rank's, after a barrier; the table gives the median and the best of K
// runs, the algorithm bandwidth (buffer bytes / time) and the bus bandwidth (nccl-tests' convention:
// all-reduce x 2(n-1)/n, reduce-scatter and all-gather x (n-1)/n, comparable across world sizes).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"

namespace {

struct Options {
  int64_t elements = 124475904;  // GPT-2 124M's parameter count
  int iters = 5;
  int64_t ring_min_bytes = int64_t(1) << 20;  // the communicator's defaults
  int64_t segment_bytes = int64_t(8) << 20;
  std::string json_path;
};

struct Row {
  std::string op;
  double bus_factor = 1.0;
  std::vector<double> seconds;  // the slowest rank's time, per iteration
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--elements" && has_value) {
      opt.elements = std::stoll(argv[++i]);
    } else if (a == "--iters" && has_value) {
      opt.iters = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--segment-bytes" && has_value) {
      opt.segment_bytes = std::stoll(argv[++i]);
    } else if (a == "--ring-min-bytes" && has_value) {
      opt.ring_min_bytes = std::stoll(argv[++i]);
    } else if (a == "--json" && has_value) {
      opt.json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: mpiexec -n N bench_comm [--elements N] [--iters K] [--segment-bytes B] "
                           "[--ring-min-bytes B] [--json FILE]\n");
      return 2;
    }
  }
  try {
    ablate::Registry registry;
    registry.load_directories(ablate::Registry::default_search_path());
    const ablate::Params common{"run", {}};
    const ablate::Params own{"run.mpi",
                             {{"timeout_s", ablate::Value(600.0)},
                              {"ring_min_bytes", ablate::Value(opt.ring_min_bytes)},
                              {"segment_bytes", ablate::Value(opt.segment_bytes)}}};
    const ablate::RunContext run;
    auto comm = registry.create<ablate::Communicator>(ablate::Kind::communicator, "mpi", {common, own, run});
    const int rank = comm->rank();
    const int world = comm->world();

    std::vector<float> buffer(static_cast<std::size_t>(opt.elements));
    ablate::TensorView view;
    view.data = buffer.data();
    view.ndim = 1;
    view.shape[0] = opt.elements;
    const auto fill = [&] { std::fill(buffer.begin(), buffer.end(), float(rank + 1)); };
    const float expected_sum = float(world * (world + 1) / 2);

    // Times `op` (after `prepare`, untimed) as the slowest rank sees it; one untimed warm-up first.
    const auto measure = [&](const std::string& name, double bus_factor, const std::function<void()>& prepare,
                             const std::function<void()>& op) {
      Row row{name, bus_factor, {}};
      for (int it = -1; it < opt.iters; ++it) {
        prepare();
        comm->barrier();
        const auto start = std::chrono::steady_clock::now();
        op();
        double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double slowest = 0;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (it >= 0) row.seconds.push_back(slowest);
      }
      return row;
    };

    std::vector<Row> rows;
    const double n = world;
    rows.push_back(
        measure("all_reduce (mpi communicator)", 2 * (n - 1) / n, fill, [&] { comm->all_reduce(view, ablate::ReduceOp::sum); }));
    const bool all_reduce_ok =
        buffer.front() == expected_sum && buffer.back() == expected_sum && buffer[buffer.size() / 2] == expected_sum;
    rows.push_back(measure("MPI_Allreduce (blocking, reference)", 2 * (n - 1) / n, fill, [&] {
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), int(opt.elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }));
    // What the communicator would cost on Open MPI's own non-blocking collectives (libnbc).
    const auto test_until_done = [](MPI_Request& request) {
      for (int done = 0; !done;) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    };
    rows.push_back(measure("MPI_Iallreduce + MPI_Test (reference)", 2 * (n - 1) / n, fill, [&] {
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), int(opt.elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      test_until_done(request);
    }));
    std::vector<int> counts(world), offsets(world);
    for (int r = 0; r < world; ++r) {
      const ablate::Shard s = ablate::shard_of(opt.elements, world, r);
      counts[r] = int(s.count);
      offsets[r] = int(s.offset);
    }
    rows.push_back(
        measure("reduce_scatter (mpi communicator)", (n - 1) / n, fill, [&] { comm->reduce_scatter(view, ablate::ReduceOp::sum); }));
    rows.push_back(measure("MPI_Ireduce_scatter + MPI_Test (reference)", (n - 1) / n, fill, [&] {
      MPI_Request request;
      MPI_Ireduce_scatter(MPI_IN_PLACE, buffer.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      test_until_done(request);
    }));
    rows.push_back(measure(
        "all_gather (mpi communicator)", (n - 1) / n, [] {}, [&] { comm->all_gather(view); }));
    rows.push_back(measure(
        "MPI_Allgatherv (blocking, reference)", (n - 1) / n, [] {},
        [&] {
          MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), counts.data(), offsets.data(), MPI_FLOAT, MPI_COMM_WORLD);
        }));

    if (rank == 0) {
      const double bytes = double(opt.elements) * sizeof(float);
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      char library[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
      int library_len = 0;
      MPI_Get_library_version(library, &library_len);
      std::string mpi_version(library);
      mpi_version = mpi_version.substr(0, mpi_version.find(','));
      std::printf("bench_comm: %lld f32 elements (%.1f MB) over %d ranks on %s (%s, %u hardware threads), %s\n",
                  static_cast<long long>(opt.elements), bytes / 1e6, world, host, cpu_model().c_str(),
                  std::thread::hardware_concurrency(), mpi_version.c_str());
      std::printf("all_reduce result %s\n\n", all_reduce_ok ? "checked: every rank holds the sum" : "WRONG");
      std::printf("%-44s %10s %10s %12s %12s\n", "operation", "median ms", "best ms", "algbw GB/s", "busbw GB/s");
      nlohmann::json j;
      j["elements"] = opt.elements;
      j["bytes"] = bytes;
      j["dtype"] = "f32";
      j["world"] = world;
      j["iters"] = opt.iters;
      j["segment_bytes"] = opt.segment_bytes;
      j["ring_min_bytes"] = opt.ring_min_bytes;
      j["host"] = host;
      j["cpu"] = cpu_model();
      j["hardware_threads"] = std::thread::hardware_concurrency();
      j["mpi"] = mpi_version;
      j["all_reduce_checked"] = all_reduce_ok;
      j["timing"] = "slowest rank per iteration, after a barrier; one untimed warm-up";
      for (const Row& r : rows) {
        const double med = median(r.seconds);
        const double best = *std::min_element(r.seconds.begin(), r.seconds.end());
        const double algbw = bytes / med / 1e9;
        std::printf("%-44s %10.1f %10.1f %12.2f %12.2f\n", r.op.c_str(), med * 1e3, best * 1e3, algbw, algbw * r.bus_factor);
        j["results"].push_back({{"op", r.op},
                                {"median_ms", med * 1e3},
                                {"best_ms", best * 1e3},
                                {"seconds", r.seconds},
                                {"algbw_GBps", algbw},
                                {"busbw_GBps", algbw * r.bus_factor}});
      }
      if (!opt.json_path.empty()) std::ofstream(opt.json_path) << j.dump(2) << "\n";
    }
    return all_reduce_ok ? 0 : 1;
  } catch (const ablate::Error& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    return 1;
  }
}
