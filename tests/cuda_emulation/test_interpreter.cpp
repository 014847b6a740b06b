// The kernel interpreter's own semantics (interpreter_kernels.cu), under every test schedule, and
// each fault it must report as an ablate::emu::Error naming the .cu line instead of a hang or a
// wrong result.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "emu_support.hpp"
#include "interpreter_kernels.hpp"

using namespace ablate;


namespace {

std::vector<int> run_ints(std::size_t n, void (*f)(int*, int), int arg) {
  cuda::DeviceBuffer<int> d(n);
  f(d.data(), arg);
  std::vector<int> h(n);
  d.download(h.data());
  return h;
}

// The message of the Error `f` raises (empty when it raises none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const emu::Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("threads of a block meet at a barrier, in every schedule and block size") {
  emu_test::for_each_schedule([&] {
    for (int threads : {1, 7, 32, 33, 100, 256, 1024}) {
      const std::vector<int> h = run_ints(std::size_t(threads), emu_test::mirror_through_shared, threads);
      for (int t = 0; t < threads; ++t) REQUIRE(h[std::size_t(t)] == threads - 1 - t);
    }
  });
}

TEST_CASE("warp shuffles and votes give each lane the documented lane's value") {
  emu_test::for_each_schedule([&] {
    const std::vector<int> h = [] {
      cuda::DeviceBuffer<int> d(160);
      emu_test::warp_collectives(d.data());
      std::vector<int> v(160);
      d.download(v.data());
      return v;
    }();
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
    for (int l = 0; l < 32; ++l) {
      CHECK(h[std::size_t(l)] == (l ^ 1) * 10);
      CHECK(h[std::size_t(32 + l)] == (31 - l) * 10);
      CHECK(h[std::size_t(64 + l)] == (l >= 3 ? l - 3 : l));             // up: the first three keep their own
      CHECK(h[std::size_t(96 + l)] == ((l % 16) + 3 < 16 ? l + 3 : l));  // down within 16-lane segments
      CHECK(unsigned(h[std::size_t(128 + l)]) == ballot);
    }
  });
}

TEST_CASE("__syncthreads_count, _and and _or count the block's predicates") {
  emu_test::for_each_schedule([&] {
    for (int threads : {1, 6, 33, 512}) {
      const std::vector<int> h = run_ints(3, emu_test::barrier_votes, threads);
      CHECK(h[0] == threads / 2);
      CHECK(h[1] == 1);
      CHECK(h[2] == (threads > 5 ? 1 : 0));
    }
  });
}

TEST_CASE("the schedules change the order in which the threads of a block take their turns") {
  const int threads = 64;
  std::vector<std::vector<int>> orders;
  for (const emu::Schedule& s : {emu::parse_schedule("forward"), emu::parse_schedule("reverse"), emu::parse_schedule("random:1"),
                                 emu::parse_schedule("random:2")}) {
    emu::ScopedSchedule scoped(s);
    cuda::DeviceBuffer<int> out(threads), counter(1);
    counter.fill_zero();
    emu_test::arrival_order(out.data(), counter.data(), threads);
    orders.push_back(emu_test::to_host(out));
  }
  for (int k = 0; k < threads; ++k) {
    CHECK(orders[0][std::size_t(k)] == k);
    CHECK(orders[1][std::size_t(k)] == threads - 1 - k);
  }
  CHECK(orders[2] != orders[0]);
  CHECK(orders[2] != orders[1]);
  CHECK(orders[2] != orders[3]);  // another seed, another order
  // The same seed again gives the same order: a failure replays.
  emu::ScopedSchedule again(emu::parse_schedule("random:1"));
  cuda::DeviceBuffer<int> out(threads), counter(1);
  counter.fill_zero();
  emu_test::arrival_order(out.data(), counter.data(), threads);
  CHECK(emu_test::to_host(out) == orders[2]);
}

// After a barrier the threads take their turns in the schedule's order again, a new one for each
// round under a random schedule: a thread that waits hands over to the next ready thread of the
// round itself (docs/kernel-interpreter.md), which must be the one the scheduler would resume.
TEST_CASE("every round between barriers runs the threads in the schedule's order") {
  const int threads = 96;  // three warps
  const auto rounds = [&](const char* schedule) {
    emu::ScopedSchedule scoped(emu::parse_schedule(schedule));
    cuda::DeviceBuffer<int> out(3 * threads), counter(1);
    counter.fill_zero();
    emu_test::arrival_rounds(out.data(), counter.data(), threads);
    const std::vector<int> all = emu_test::to_host(out);
    std::vector<std::vector<int>> r;
    for (int k = 0; k < 3; ++k) r.emplace_back(all.begin() + k * threads, all.begin() + (k + 1) * threads);
    return r;
  };
  for (const auto& r : rounds("forward")) {
    for (int k = 0; k < threads; ++k) CHECK(r[std::size_t(k)] == k);
  }
  for (const auto& r : rounds("reverse")) {
    for (int k = 0; k < threads; ++k) CHECK(r[std::size_t(k)] == threads - 1 - k);
  }
  const auto random = rounds("random:7");
  for (const auto& r : random) {
    std::vector<int> sorted = r;
    std::sort(sorted.begin(), sorted.end());
    for (int k = 0; k < threads; ++k) CHECK(sorted[std::size_t(k)] == k);  // each thread once a round
  }
  CHECK(random[0] != random[1]);  // reshuffled every round
  CHECK(random[1] != random[2]);
  CHECK(rounds("random:7") == random);  // and replayed by its seed
}

TEST_CASE("votes, shuffles narrower than a warp, __activemask and float atomics") {
  emu_test::for_each_schedule([&] {
    cuda::DeviceBuffer<int> d(160);
    cuda::DeviceBuffer<float> sum(1);
    sum.fill_zero();
    emu_test::warp_votes_and_widths(d.data(), sum.data());
    const std::vector<int> h = emu_test::to_host(d);
    for (int l = 0; l < 32; ++l) {
      CHECK(h[std::size_t(l)] == 1);                          // some lane is 7
      CHECK(h[std::size_t(32 + l)] == 1);                     // every lane is below 40
      CHECK(h[std::size_t(64 + l)] == (l ^ 1));               // within 8-lane segments
      CHECK(h[std::size_t(96 + l)] == ((l & ~15) + 5) * 3);   // lane 5 of its 16-lane segment
      CHECK(unsigned(h[std::size_t(128 + l)]) == (1u << l));  // the calling lane only
    }
    CHECK(emu_test::to_host(sum)[0] == 16.0f);
  });
}

TEST_CASE("a ballot counts the lanes that have not returned, as CUDA's votes do") {
  emu_test::for_each_schedule([&] {
    for (int live : {1, 20, 31}) {
      cuda::DeviceBuffer<unsigned> d(32);
      emu_test::ballot_after_returns(d.data(), live);
      const std::vector<unsigned> h = emu_test::to_host(d);
      unsigned want = 0;
      for (int l = 1; l < live; l += 2) want |= 1u << l;
      for (int l = 0; l < live; ++l) CHECK(h[std::size_t(l)] == want);
    }
  });
}

TEST_CASE("dynamic shared memory and 2-D grids") {
  const std::vector<int> h = run_ints(300, emu_test::dynamic_shared, 300);
  for (int i = 0; i < 300; ++i) REQUIRE(h[std::size_t(i)] == i);
  emu_test::for_each_schedule([&] {
    cuda::DeviceBuffer<int> d(std::size_t(3 * 5) * std::size_t(2 * 7));
    emu_test::grid_indices(d.data(), 3, 2, 5, 7);
    std::vector<int> v(d.size());
    d.download(v.data());
    for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == 1 + int(i / (3 * 5 * 7)));
  });
}

#ifndef __SANITIZE_THREAD__  // where ThreadSanitizer reports the race itself
TEST_CASE("a missing barrier gives a wrong result under some schedule") {
  // Not an error the interpreter can name: the test of the kernel sees the wrong sum, and the
  // schedules differ in which thread reads too early.
  int wrong_schedules = 0;
  for (const emu::Schedule& s : emu::test_schedules()) {
    emu::ScopedSchedule scoped(s);
    const std::vector<int> h = run_ints(64, emu_test::missing_barrier_sum, 64);
    bool all_right = true;
    for (int v : h) all_right = all_right && v == 64 * 65 / 2;
    wrong_schedules += all_right ? 0 : 1;
  }
  CHECK(wrong_schedules > 0);
}
#endif

// The faults: each abandons a block mid-run, which a thread sanitizer cannot follow (the threads
// left waiting never release what they hold), so they run in the plain and ASan builds.
#ifndef __SANITIZE_THREAD__
TEST_CASE("a barrier some threads return before is an error naming the counts and the line") {
  const std::string e = error_of([] { emu_test::barrier_after_early_return(1024); });
  INFO(e);
  CHECK(e.find("1017 threads wait at __syncthreads") != std::string::npos);
  CHECK(e.find("while 7 have returned") != std::string::npos);
  CHECK(e.find("interpreter_kernels.cu:") != std::string::npos);
  CHECK(e.find("early_return_kernel") != std::string::npos);
}

TEST_CASE("a full-mask shuffle in a block that is not a multiple of 32 names the missing lanes") {
  cuda::DeviceBuffer<float> d(52);
  const std::string e = error_of([&] { emu_test::full_mask_shuffle(d.data(), 52); });
  INFO(e);
  CHECK(e.find("__shfl_xor_sync") != std::string::npos);
  CHECK(e.find("names lanes 20-31 that do not exist") != std::string::npos);
  CHECK(e.find("52 threads") != std::string::npos);
  CHECK(error_of([&] { emu_test::full_mask_shuffle(d.data(), 32); }).empty());
}

TEST_CASE("threads at different barriers are an error") {
  cuda::DeviceBuffer<int> d(64);
  const std::string e = error_of([&] { emu_test::divergent_barriers(d.data()); });
  INFO(e);
  CHECK(e.find("different barriers") != std::string::npos);
}

TEST_CASE("a shuffle reading a lane outside its mask, lanes at different collectives, and a lane returning "
          "while others shuffle with it are errors") {
  cuda::DeviceBuffer<int> d(32);
  const std::string outside = error_of([&] { emu_test::shuffle_outside_mask(d.data()); });
  INFO(outside);
  CHECK(outside.find("lane 3 of warp 0 reads lane 19") != std::string::npos);
  CHECK(outside.find("which the mask does not name") != std::string::npos);
  const std::string mixed = error_of([&] { emu_test::mismatched_collectives(d.data()); });
  INFO(mixed);
  CHECK(mixed.find("meet at different collectives") != std::string::npos);
  const std::string gone = error_of([&] { emu_test::return_during_shuffle(d.data()); });
  INFO(gone);
  CHECK((gone.find("returned while lane") != std::string::npos || gone.find("which have returned") != std::string::npos));
}

TEST_CASE("a block's __shared__ arrays past 48 KiB are an error naming the array") {
  cuda::DeviceBuffer<int> d(32);
  const std::string e = error_of([&] { emu_test::too_much_shared(d.data()); });
  INFO(e);
  CHECK(e.find("__shared__ 'b'") != std::string::npos);
  CHECK(e.find("57344 bytes, past the 49152") != std::string::npos);
}

TEST_CASE("invalid launch configurations are errors naming the configuration") {
  cuda::DeviceBuffer<int> d(32);
  const std::string empty = error_of([&] { emu_test::empty_grid_launch(d.data()); });
  CHECK(empty.find("an empty grid") != std::string::npos);
  CHECK(empty.find("cudaErrorInvalidConfiguration") != std::string::npos);
  const std::string big = error_of([&] { emu_test::oversized_block_launch(d.data()); });
  CHECK(big.find("block (1025,1,1)") != std::string::npos);
  const std::string tall = error_of([&] { emu_test::grid_y_too_large(d.data()); });
  CHECK(tall.find("grid (1,65536,1)") != std::string::npos);
  CHECK(tall.find("a grid past the limits") != std::string::npos);
}

#ifndef ABLATE_EMU_SANITIZED  // under AddressSanitizer these overruns are its reports (and end the process)
TEST_CASE("a write past the end of a __shared__ array names the array") {
  cuda::DeviceBuffer<int> d(33);
  const std::string e = error_of([&] { emu_test::shared_one_short(d.data()); });
  INFO(e);
  CHECK(e.find("a write past the end of __shared__ 's'") != std::string::npos);
  CHECK(e.find("128 bytes") != std::string::npos);
}

TEST_CASE("a write past the end of a device allocation names the kernel") {
  cuda::DeviceBuffer<int> d(100);
  const std::string e = error_of([&] { emu_test::write_past_allocation(d.data(), 100); });
  INFO(e);
  CHECK(e.find("past_end_kernel") != std::string::npos);
  CHECK(e.find("a write past the end of a device allocation of 400 bytes") != std::string::npos);
}
#endif  // ABLATE_EMU_SANITIZED
#endif  // __SANITIZE_THREAD__

TEST_CASE("schedules parse from their names, and junk is refused") {
  CHECK(emu::parse_schedule("random:42").name() == "random:42");
  CHECK(emu::parse_schedule("reverse").order == emu::Order::reverse);
  CHECK_THROWS_AS(emu::parse_schedule("sideways"), std::invalid_argument);
  CHECK_THROWS_AS(emu::parse_schedule("random:"), std::invalid_argument);
  CHECK_THROWS_AS(emu::parse_schedule("random:-1"), std::invalid_argument);
}

TEST_CASE("device memory: copies must stay inside an allocation, and freed memory leaves the books") {
  const std::size_t live = emu::live_device_allocations();
  {
    cuda::DeviceBuffer<float> a(3), b(1000);
    CHECK(emu::live_device_allocations() == live + 2);
  }
  CHECK(emu::live_device_allocations() == live);
  cuda::DeviceBuffer<int> d(4);
  std::vector<int> h(8, 1);
  CHECK(cudaMemcpy(d.data(), h.data(), 8 * sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaMemcpy(d.data(), h.data(), 4 * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  int x = 0;
  CHECK(cudaFree(&x) == cudaErrorInvalidDevicePointer);
}
