// The emulated NCCL (nccl_emu.cpp) under mpiexec with 2, 3 and 4 ranks, each an emulated CUDA
// device (ABLATE_EMULATE_CUDA=1): every collective the project uses, in every NCCL type, against
// values computed here on the host (small integers, so every sum is exact in every type and the
// expected result is the mathematical one); in-place forms; groups; send and receive; stream order
// (a collective holds its stream, and a stream waiting on an event after it, until every rank has
// reached it); and the errors NCCL gives: mismatched collectives, a buffer that is not device
// memory, an id that is not one, a peer that never comes. MPI carries the unique id and keeps the
// ranks in step where a case needs a rank to hold back.
#define DOCTEST_CONFIG_IMPLEMENT  // main() below: MPI around doctest
#include <doctest/doctest.h>
#include <mpi.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime_internal.hpp"

namespace {

int g_rank = 0, g_world = 1;

#define NCCL_OK(call) REQUIRE((call) == ncclSuccess)
#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

ncclComm_t make_comm(bool blocking = true) {
  ncclUniqueId id{};
  if (g_rank == 0) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, g_world, id, g_rank, &config);
  if (blocking) {
    REQUIRE(rc == ncclSuccess);
  } else {
    REQUIRE((rc == ncclSuccess || rc == ncclInProgress));
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) REQUIRE(ncclCommGetAsyncError(comm, &state) == ncclSuccess);
    REQUIRE(state == ncclSuccess);
  }
  return comm;
}

void destroy(ncclComm_t comm) {
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
}

// Host values of an NCCL type, as doubles (every value used here is exact in every type).
struct Typed {
  ncclDataType_t type;
  std::size_t size;
};
const Typed kTypes[] = {{ncclInt8, 1},   {ncclUint8, 1},   {ncclInt32, 4},   {ncclUint32, 4},  {ncclInt64, 8},
                        {ncclUint64, 8}, {ncclFloat16, 2}, {ncclFloat32, 4}, {ncclFloat64, 8}, {ncclBfloat16, 2}};

void put(ncclDataType_t t, void* p, double v) {
  switch (t) {
    case ncclInt8: *static_cast<int8_t*>(p) = int8_t(v); break;
    case ncclUint8: *static_cast<uint8_t*>(p) = uint8_t(v); break;
    case ncclInt32: *static_cast<int32_t*>(p) = int32_t(v); break;
    case ncclUint32: *static_cast<uint32_t*>(p) = uint32_t(v); break;
    case ncclInt64: *static_cast<int64_t*>(p) = int64_t(v); break;
    case ncclUint64: *static_cast<uint64_t*>(p) = uint64_t(v); break;
    case ncclFloat16: *static_cast<_Float16*>(p) = _Float16(float(v)); break;
    case ncclFloat32: *static_cast<float*>(p) = float(v); break;
    case ncclFloat64: *static_cast<double*>(p) = v; break;
    case ncclBfloat16: {  // exact: small integers have at most 8 significant bits
      const float f = float(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t b = uint16_t(u >> 16);
      std::memcpy(p, &b, 2);
      break;
    }
  }
}
double get(ncclDataType_t t, const void* p) {
  switch (t) {
    case ncclInt8: return *static_cast<const int8_t*>(p);
    case ncclUint8: return *static_cast<const uint8_t*>(p);
    case ncclInt32: return *static_cast<const int32_t*>(p);
    case ncclUint32: return *static_cast<const uint32_t*>(p);
    case ncclInt64: return double(*static_cast<const int64_t*>(p));
    case ncclUint64: return double(*static_cast<const uint64_t*>(p));
    case ncclFloat16: return double(float(*static_cast<const _Float16*>(p)));
    case ncclFloat32: return *static_cast<const float*>(p);
    case ncclFloat64: return *static_cast<const double*>(p);
    case ncclBfloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t u = uint32_t(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
  }
  return NAN;
}

// Rank r's element i: small, signed only for signed types, distinct per rank.
double value(ncclDataType_t t, int r, std::size_t i) {
  const bool is_unsigned = t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
  const double v = double((i * 7 + std::size_t(r) * 3) % 11) + 1.0;
  return is_unsigned || i % 2 == 0 ? v : -v;
}

double reduce_expected(ncclRedOp_t op, ncclDataType_t t, std::size_t i) {
  double acc = value(t, 0, i);
  for (int r = 1; r < g_world; ++r) {
    const double v = value(t, r, i);
    acc = op == ncclSum ? acc + v : op == ncclProd ? acc * v : op == ncclMax ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

// A device buffer of n elements of `t` holding this rank's values (or `fill` everywhere).
struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  Buffer(const Typed& t, std::size_t n, bool ours, double fill = 0) : bytes(n * t.size) {
    REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
    std::vector<unsigned char> host(bytes);
    for (std::size_t i = 0; i < n; ++i) put(t.type, host.data() + i * t.size, ours ? value(t.type, g_rank, i) : fill);
    REQUIRE(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Buffer() { cudaFree(p); }
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> host(bytes);
    REQUIRE(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  char* at(std::size_t byte) const { return static_cast<char*>(p) + byte; }
};

}  // namespace

TEST_CASE("all-reduce in every type and reduction, out of place and in place, on a stream") {
  ncclComm_t comm = make_comm();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::size_t n = 37;
  for (const Typed& t : kTypes) {
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin}) {
      // Products stay exact where they fit: with 4 ranks the largest is 11^4, past int8's range.
      if (op == ncclProd && (t.size == 1 || t.type == ncclFloat16 || t.type == ncclBfloat16)) continue;
      INFO("type " << int(t.type) << " op " << int(op));
      Buffer in(t, n, true), out(t, n, false);
      NCCL_OK(ncclAllReduce(in.p, out.p, n, t.type, op, comm, s));
      CUDA_OK(cudaStreamSynchronize(s));
      const auto got = out.read();
      for (std::size_t i = 0; i < n; ++i) CHECK(get(t.type, got.data() + i * t.size) == reduce_expected(op, t.type, i));
      NCCL_OK(ncclAllReduce(in.p, in.p, n, t.type, op, comm, s));  // in place
      CUDA_OK(cudaStreamSynchronize(s));
      CHECK(in.read() == got);
    }
  }
  CUDA_OK(cudaStreamDestroy(s));
  destroy(comm);
}

TEST_CASE("reduce to each root, broadcast from each root, reduce-scatter and all-gather in place") {
  ncclComm_t comm = make_comm(false);  // non-blocking, as the nccl communicator makes it
  const Typed f32{ncclFloat32, 4}, bf16{ncclBfloat16, 2};
  const std::size_t n = 10;
  for (int root = 0; root < g_world; ++root) {
    Buffer in(f32, n, true), out(f32, n, false, -7);
    NCCL_OK(ncclReduce(in.p, out.p, n, ncclFloat32, ncclSum, root, comm, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = out.read();
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(get(ncclFloat32, got.data() + 4 * i) == (g_rank == root ? reduce_expected(ncclSum, ncclFloat32, i) : -7.0));
    }
    Buffer b(bf16, n, true);
    NCCL_OK(ncclBroadcast(b.p, b.p, n, ncclBfloat16, root, comm, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto bb = b.read();
    for (std::size_t i = 0; i < n; ++i) CHECK(get(ncclBfloat16, bb.data() + 2 * i) == value(ncclBfloat16, root, i));
  }
  // Reduce-scatter in place: rank r's chunk is at r * chunk of the full buffer.
  const std::size_t chunk = 5;
  Buffer full(f32, chunk * std::size_t(g_world), true);
  NCCL_OK(ncclReduceScatter(full.p, full.at(std::size_t(g_rank) * chunk * 4), chunk, ncclFloat32, ncclSum, comm, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto rs = full.read();
  for (std::size_t i = 0; i < chunk; ++i) {
    const std::size_t at = std::size_t(g_rank) * chunk + i;
    CHECK(get(ncclFloat32, rs.data() + 4 * at) == reduce_expected(ncclSum, ncclFloat32, at));
  }
  // All-gather in place: each rank's own chunk (its values at its offset) to every rank.
  Buffer gathered(f32, chunk * std::size_t(g_world), true);
  NCCL_OK(ncclAllGather(gathered.at(std::size_t(g_rank) * chunk * 4), gathered.p, chunk, ncclFloat32, comm, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto ag = gathered.read();
  for (int r = 0; r < g_world; ++r) {
    for (std::size_t i = 0; i < chunk; ++i) {
      const std::size_t at = std::size_t(r) * chunk + i;
      CHECK(get(ncclFloat32, ag.data() + 4 * at) == value(ncclFloat32, r, at));
    }
  }
  ncclResult_t state = ncclInProgress;
  NCCL_OK(ncclCommGetAsyncError(comm, &state));
  CHECK(state == ncclSuccess);
  const ncclResult_t fin = ncclCommFinalize(comm);
  CHECK((fin == ncclSuccess || fin == ncclInProgress));
  do {
    NCCL_OK(ncclCommGetAsyncError(comm, &state));
  } while (state == ncclInProgress);
  CHECK(state == ncclSuccess);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_CASE("a group of uneven reduces (the communicator's uneven reduce-scatter), and send/receive around a ring") {
  ncclComm_t comm = make_comm();
  const Typed f32{ncclFloat32, 4};
  const std::size_t n = 11;  // split unevenly: rank r owns [r * n / world, (r + 1) * n / world)
  Buffer buf(f32, n, true);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < g_world; ++r) {
    const std::size_t lo = std::size_t(r) * n / std::size_t(g_world), hi = std::size_t(r + 1) * n / std::size_t(g_world);
    if (hi > lo) NCCL_OK(ncclReduce(buf.at(lo * 4), buf.at(lo * 4), hi - lo, ncclFloat32, ncclSum, r, comm, nullptr));
  }
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = buf.read();
  const std::size_t lo = std::size_t(g_rank) * n / std::size_t(g_world), hi = std::size_t(g_rank + 1) * n / std::size_t(g_world);
  for (std::size_t i = lo; i < hi; ++i) CHECK(get(ncclFloat32, got.data() + 4 * i) == reduce_expected(ncclSum, ncclFloat32, i));

  // Each rank sends its values to the next and receives the previous rank's, in one group.
  const int next = (g_rank + 1) % g_world, prev = (g_rank + g_world - 1) % g_world;
  Buffer mine(f32, 6, true), theirs(f32, 6, false);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(mine.p, 6, ncclFloat32, next, comm, nullptr));
  NCCL_OK(ncclRecv(theirs.p, 6, ncclFloat32, prev, comm, nullptr));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaDeviceSynchronize());
  const auto r = theirs.read();
  for (std::size_t i = 0; i < 6; ++i) CHECK(get(ncclFloat32, r.data() + 4 * i) == value(ncclFloat32, prev, i));
  destroy(comm);
}

TEST_CASE("a collective holds its stream, and a stream waiting on an event after it, until the last rank reaches it") {
  ncclComm_t comm = make_comm();
  const Typed f32{ncclFloat32, 4};
  cudaStream_t s, other;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t after;
  CUDA_OK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  Buffer in(f32, 8, true), out(f32, 8, false, -1);
  const int last = g_world - 1;  // issues its collective only once the others have looked
  if (g_rank != last) {
    NCCL_OK(ncclAllReduce(in.p, out.p, 8, ncclFloat32, ncclSum, comm, s));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CUDA_OK(cudaEventRecord(after, s));
    CHECK(cudaEventQuery(after) == cudaErrorNotReady);
    CUDA_OK(cudaStreamWaitEvent(other, after, 0));
    CHECK(cudaStreamQuery(other) == cudaErrorNotReady);
    // Nothing of the result reached the output yet.
    CHECK(get(ncclFloat32, out.read().data()) == -1.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == last) NCCL_OK(ncclAllReduce(in.p, out.p, 8, ncclFloat32, ncclSum, comm, s));
  // Work on the waiting stream runs after the collective: a copy on it sees the result.
  std::vector<float> host(8, 0.0f);
  CUDA_OK(cudaMemcpyAsync(host.data(), out.p, 32, cudaMemcpyDeviceToHost, other));
  CUDA_OK(cudaStreamSynchronize(other));
  for (std::size_t i = 0; i < 8; ++i) CHECK(host[i] == reduce_expected(ncclSum, ncclFloat32, i));
  CHECK(cudaStreamQuery(s) == cudaSuccess);
  CUDA_OK(cudaEventDestroy(after));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaStreamDestroy(other));
  destroy(comm);
}

TEST_CASE("refused: a host buffer, a bad root, ncclAvg, an id that ncclGetUniqueId did not make") {
  ncclComm_t comm = make_comm();
  std::vector<float> host(4, 1.0f);
  CHECK(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("not device memory") != std::string::npos);
  const Typed f32{ncclFloat32, 4};
  Buffer b(f32, 4, true);
  CHECK(ncclBroadcast(b.p, b.p, 4, ncclFloat32, g_world, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(b.p, b.p, 4, ncclFloat32, ncclAvg, comm, nullptr) == ncclInvalidArgument);
  // None of these was issued: the communicator still works.
  NCCL_OK(ncclAllReduce(b.p, b.p, 4, ncclFloat32, ncclMax, comm, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  destroy(comm);
  ncclUniqueId bogus{};
  std::strcpy(bogus.internal, "not an id");
  ncclComm_t c = nullptr;
  CHECK(ncclCommInitRank(&c, g_world, bogus, g_rank) == ncclInvalidArgument);
}

TEST_CASE("ranks whose n-th collectives differ get ncclInvalidUsage, naming both calls; abort ends the communicator") {
  ncclComm_t comm = make_comm(false);
  const Typed f32{ncclFloat32, 4};
  Buffer b(f32, 12, true);
  // Rank 0 reduces 12 elements, the others 6: NCCL's ranks would read past each other's buffers.
  const std::size_t n = g_rank == 0 ? 12 : 6;
  NCCL_OK(ncclAllReduce(b.p, b.p, n, ncclFloat32, ncclSum, comm, nullptr));
  ncclResult_t state = ncclSuccess;
  for (int i = 0; i < 100000 && (state == ncclSuccess || state == ncclInProgress); ++i) {
    NCCL_OK(ncclCommGetAsyncError(comm, &state));
  }
  CHECK(state == ncclInvalidUsage);
  const std::string why = ncclGetLastError(comm);
  CHECK(why.find("ncclAllReduce (sum) of 12 float32") != std::string::npos);
  CHECK(why.find("ncclAllReduce (sum) of 6 float32") != std::string::npos);
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);  // the failed collective holds its stream
  NCCL_OK(ncclCommAbort(comm));
  CHECK(cudaStreamQuery(nullptr) == cudaSuccess);  // abort releases it
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  // The communicators' meeting places (ncclGetUniqueId's directories, rank 0's) in a directory of
  // this run, removed at the end with what the failed collectives left.
  char dir[] = "/tmp/ablate-test-nccl-emu-XXXXXX";
  if (g_rank == 0) {
    if (mkdtemp(dir) == nullptr) return 1;
    setenv("TMPDIR", dir, 1);
  }
  doctest::Context context(argc, argv);
  const int rc = context.run();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0) std::filesystem::remove_all(dir);
  MPI_Finalize();
  return worst;
}
