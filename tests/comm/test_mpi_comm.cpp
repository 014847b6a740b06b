// The `mpi` communicator, run by CTest under mpiexec (2 and 3 ranks; the checks hold for any world,
// 1 included). Every rank fills its buffer with rank-dependent values and checks each collective
// against the result computed here from the same formula for every rank: sums and maxima of f32,
// f64 and i32 over sizes that do and do not divide by the world (fewer elements than ranks too),
// reduce_scatter's shards, all_gather's reassembly, broadcast from rank 1, barrier ordering, empty
// buffers, and the input errors a wrong call gets before any communication. Values are multiples
// of powers of two, so every sum is exact in any order and comparisons are exact.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

// Two communicators: one with the default keys (all_reduce goes round the ring from 1 MiB up,
// below that through MPI_Iallreduce; 8 MiB ring segments) and one that sends every all_reduce
// round the ring in 4 KiB segments (1024 f32), so moderate sizes cross many segment boundaries.
struct World {
  Registry registry;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Communicator> ring;
  World() {
    registry.load_directories({test::plugin_dir()});
    comm = make({{"timeout_s", Value(60.0)}, {"ring_min_bytes", Value(int64_t(1) << 20)}, {"segment_bytes", Value(int64_t(8) << 20)}});
    ring = make({{"timeout_s", Value(60.0)}, {"ring_min_bytes", Value(int64_t(0))}, {"segment_bytes", Value(int64_t(4096))}});
  }
  std::unique_ptr<Communicator> make(std::map<std::string, Value, std::less<>> keys) {
    const Params common{"run", {}};
    const Params own{"run.mpi", std::move(keys)};
    const RunContext run;
    return registry.create<Communicator>(Kind::communicator, "mpi", {common, own, run});
  }
};

World& world() {
  static World w;
  return w;
}
Communicator& comm() { return *world().comm; }
Communicator& ring() { return *world().ring; }

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  if constexpr (std::is_same_v<T, double>) return DType::f64;
  return DType::i32;
}

template <class T>
TensorView view(std::vector<T>& v, DType dtype = dtype_of<T>()) {
  TensorView t;
  t.data = v.data();
  t.dtype = dtype;
  t.ndim = 1;
  t.shape[0] = int64_t(v.size());
  return t;
}

// Rank r's i-th element: distinct per rank and element, exact in every type.
template <class T>
T value(int r, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return float(i % 1000) * 0.25f + float(r) * 1.5f + 1.0f;
  if constexpr (std::is_same_v<T, double>) return double(i % 100003) * 0.125 - double(r) * 3.0 - 7.5;
  return int32_t((i * 7) % 1009) * (r + 1) - r * 1000;
}

// For max: which rank holds the largest value changes from element to element.
template <class T>
T value_for_max(int r, int64_t i) {
  return T(((i * 7 + r * 13) % 11) - 5);
}

template <class T>
std::vector<T> local_values(int64_t n, bool for_max = false) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = for_max ? value_for_max<T>(comm().rank(), i) : value<T>(comm().rank(), i);
  return v;
}

template <class T>
T expected_sum(int64_t i) {
  T s = 0;
  for (int r = 0; r < comm().world(); ++r) s += value<T>(r, i);
  return s;
}

template <class T>
T expected_max(int64_t i) {
  T m = value_for_max<T>(0, i);
  for (int r = 1; r < comm().world(); ++r) m = std::max(m, value_for_max<T>(r, i));
  return m;
}

// Counts mismatches instead of one CHECK per element, and names the first.
template <class T, class Expected>
void check_range(const std::vector<T>& got, int64_t begin, int64_t end, Expected expected, const std::string& what) {
  int64_t bad = 0;
  int64_t first = -1;
  for (int64_t i = begin; i < end; ++i) {
    if (got[std::size_t(i)] != expected(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  std::string detail = what + ": rank " + std::to_string(comm().rank()) + " of " + std::to_string(comm().world());
  if (first >= 0) {
    detail += ", " + std::to_string(bad) + " mismatches, the first at " + std::to_string(first) + ": got " +
              std::to_string(double(got[std::size_t(first)])) + ", expected " + std::to_string(double(expected(first)));
  }
  INFO(detail);
  CHECK(bad == 0);
}

// Sizes below and above the world, odd and even; 300007 f32 is above ring_min_bytes.
const std::vector<int64_t> kSizes = {1, 2, 5, 7, 1000, 1001, 65537, 300007};

template <class T>
void check_all_reduce(Communicator& c, const std::vector<int64_t>& sizes) {
  for (int64_t n : sizes) {
    std::vector<T> sum = local_values<T>(n);
    c.all_reduce(view(sum), ReduceOp::sum);
    check_range(sum, 0, n, expected_sum<T>, "all_reduce sum of " + std::to_string(n));
    std::vector<T> max = local_values<T>(n, true);
    c.all_reduce(view(max), ReduceOp::max);
    check_range(max, 0, n, expected_max<T>, "all_reduce max of " + std::to_string(n));
  }
}

template <class T>
void check_reduce_scatter(Communicator& c = comm(), const std::vector<int64_t>& sizes = kSizes) {
  for (int64_t n : sizes) {
    const Shard mine = shard_of(n, comm().world(), comm().rank());
    std::vector<T> sum = local_values<T>(n);
    c.reduce_scatter(view(sum), ReduceOp::sum);
    const int64_t end = mine.offset + mine.count;
    check_range(sum, mine.offset, end, expected_sum<T>, "reduce_scatter sum of " + std::to_string(n));
    std::vector<T> max = local_values<T>(n, true);
    c.reduce_scatter(view(max), ReduceOp::max);
    check_range(max, mine.offset, end, expected_max<T>, "reduce_scatter max of " + std::to_string(n));
  }
}

template <class T>
void check_all_gather(Communicator& c = comm(), const std::vector<int64_t>& sizes = kSizes) {
  for (int64_t n : sizes) {
    const Shard mine = shard_of(n, comm().world(), comm().rank());
    // Outside its shard a rank holds garbage that must not leak into anyone's result.
    std::vector<T> v(std::size_t(n), T(-12345));
    for (int64_t i = mine.offset; i < mine.offset + mine.count; ++i) v[i] = value<T>(comm().rank(), i);
    c.all_gather(view(v));
    const auto owner_value = [&](int64_t i) {
      for (int r = 0; r < comm().world(); ++r) {
        const Shard s = shard_of(n, comm().world(), r);
        if (i >= s.offset && i < s.offset + s.count) return value<T>(r, i);
      }
      return T(0);
    };
    check_range(v, 0, n, owner_value, "all_gather of " + std::to_string(n));
  }
}

}  // namespace

TEST_CASE("rank, world and local rank agree with the launcher and are distinct") {
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) CHECK(comm().world() == std::atoi(size));
  if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK")) CHECK(comm().rank() == std::atoi(rank));
  CHECK(comm().local_rank() >= 0);
  CHECK(comm().local_rank() < comm().world());
  CHECK(comm().local_world() == comm().world());  // one machine: every rank shares it
  CHECK(comm().local_rank() < comm().local_world());
  // Every rank contributes its own number: the gathered list is 0, 1, ..., world - 1.
  std::vector<int32_t> ranks(std::size_t(comm().world()), -1);
  ranks[std::size_t(comm().rank())] = comm().rank();
  comm().all_gather(view(ranks));
  for (int r = 0; r < comm().world(); ++r) CHECK(ranks[std::size_t(r)] == r);
}

TEST_CASE("all_reduce sums and maxes f32 over ranks") { check_all_reduce<float>(comm(), kSizes); }
TEST_CASE("all_reduce sums and maxes f64 over ranks") { check_all_reduce<double>(comm(), kSizes); }
TEST_CASE("all_reduce sums and maxes i32 over ranks") { check_all_reduce<int32_t>(comm(), kSizes); }
TEST_CASE("all_reduce round the ring at every size: f32") { check_all_reduce<float>(ring(), kSizes); }
TEST_CASE("all_reduce round the ring at every size: f64") { check_all_reduce<double>(ring(), kSizes); }
TEST_CASE("all_reduce round the ring at every size: i32") { check_all_reduce<int32_t>(ring(), kSizes); }

TEST_CASE("reduce_scatter and all_gather in many ring segments") {
  check_reduce_scatter<float>(ring(), kSizes);
  check_all_gather<int32_t>(ring(), kSizes);
}

TEST_CASE("all_reduce of a 2-D view reduces every element") {
  std::vector<float> v = local_values<float>(6 * 7);
  TensorView t = view(v);
  t.ndim = 2;
  t.shape = {6, 7, 0, 0};
  comm().all_reduce(t, ReduceOp::sum);
  check_range(v, 0, 42, expected_sum<float>, "all_reduce of a (6, 7) view");
}

TEST_CASE("reduce_scatter leaves each rank its shard of the reduction: f32") { check_reduce_scatter<float>(); }
TEST_CASE("reduce_scatter leaves each rank its shard of the reduction: f64") { check_reduce_scatter<double>(); }
TEST_CASE("reduce_scatter leaves each rank its shard of the reduction: i32") { check_reduce_scatter<int32_t>(); }

TEST_CASE("all_gather reassembles every rank's shard: f32") { check_all_gather<float>(); }
TEST_CASE("all_gather reassembles every rank's shard: f64") { check_all_gather<double>(); }
TEST_CASE("all_gather reassembles every rank's shard: i32") { check_all_gather<int32_t>(); }

TEST_CASE("all_gather moves 16-bit words it cannot reduce (bf16)") {
  const int64_t n = 1001;
  const Shard mine = shard_of(n, comm().world(), comm().rank());
  std::vector<uint16_t> v(std::size_t(n), 0);
  for (int64_t i = mine.offset; i < mine.offset + mine.count; ++i) v[i] = uint16_t(0x3f80 + i);
  comm().all_gather(view(v, DType::bf16));
  check_range(
      v, 0, n, [](int64_t i) { return uint16_t(0x3f80 + i); }, "all_gather of bf16 words");
}

TEST_CASE("reduce_scatter then all_gather equals all_reduce") {
  for (int64_t n : kSizes) {
    std::vector<double> v = local_values<double>(n);
    comm().reduce_scatter(view(v), ReduceOp::sum);
    comm().all_gather(view(v));
    check_range(v, 0, n, expected_sum<double>, "reduce_scatter + all_gather of " + std::to_string(n));
  }
}

TEST_CASE("broadcast copies the root's buffer (rank 1 when there is one) to every rank") {
  const int root = comm().world() > 1 ? 1 : 0;
  for (int64_t n : {int64_t(1), int64_t(1001), int64_t(65537)}) {
    std::vector<double> v = local_values<double>(n);
    comm().broadcast(view(v), root);
    check_range(
        v, 0, n, [&](int64_t i) { return value<double>(root, i); }, "broadcast of " + std::to_string(n));
    std::vector<uint16_t> words(std::size_t(n), uint16_t(comm().rank() * 100));
    comm().broadcast(view(words, DType::bf16), root);
    check_range(
        words, 0, n, [&](int64_t) { return uint16_t(root * 100); }, "broadcast of bf16 words");
  }
}

TEST_CASE("barrier holds every rank until the last one arrives") {
  // The ranks share one machine, hence one monotonic clock: no rank may leave the barrier before
  // the late rank entered it.
  const auto now_ns = [] {
    return double(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
  };
  const int late = comm().world() - 1;
  comm().barrier();
  std::vector<double> entered(1, 0.0);
  if (comm().rank() == late) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    entered[0] = now_ns();
  }
  comm().barrier();
  const double left = now_ns();
  comm().broadcast(view(entered), late);
  INFO("rank ", comm().rank(), " left ", (left - entered[0]) / 1e6, " ms after rank ", late, " entered");
  CHECK(left >= entered[0]);
}

TEST_CASE("empty buffers are a no-op on every collective") {
  std::vector<float> empty;
  TensorView t = view(empty);
  CHECK_NOTHROW(comm().all_reduce(t, ReduceOp::sum));
  CHECK_NOTHROW(comm().reduce_scatter(t, ReduceOp::sum));
  CHECK_NOTHROW(comm().all_gather(t));
  CHECK_NOTHROW(comm().broadcast(t, 0));
}

TEST_CASE("wrong calls are input errors raised before any communication") {
  std::vector<float> v(8, 1.0f);
  const auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      return e.what();
    }
    return "no error";
  };
  TensorView on_gpu = view(v);
  on_gpu.device = DeviceType::cuda;
  CHECK(message_of([&] { comm().all_reduce(on_gpu, ReduceOp::sum); }).find("host buffers") != std::string::npos);
  std::vector<uint16_t> words(8, 0);
  CHECK(message_of([&] { comm().all_reduce(view(words, DType::bf16), ReduceOp::sum); }).find("bf16") != std::string::npos);
  const std::string root = message_of([&] { comm().broadcast(view(v), comm().world()); });
  CHECK(root.find("broadcast from rank " + std::to_string(comm().world())) != std::string::npos);
  CHECK(root.find("rank " + std::to_string(comm().rank()) + " of ") != std::string::npos);
  // The communicator is still in step on every rank after the refused calls.
  std::vector<int32_t> one(1, 1);
  comm().all_reduce(view(one), ReduceOp::sum);
  CHECK(one[0] == comm().world());
}
