// NCCL for the emulated CUDA device (include/nccl.h), written from NCCL's documented semantics:
// ranks are processes of one machine (mpirun -np N with ABLATE_EMULATE_CUDA=1), each its own
// emulated device. A unique id names a directory; a communicator's ranks meet there, and each
// collective is a file per rank holding that rank's input, written when the collective's stream
// reaches it. A collective completes on a rank once every rank's file is there: the result is
// computed from them in rank order (the same bits on every rank) and written to the rank's output.
// Until then it holds its stream (runtime::StreamWork): later work on that stream, or on a stream
// that waits on an event recorded after it, waits for it, as on a GPU.
//
// Not more forgiving than NCCL: collectives match by their order of issue on the communicator, and
// a rank whose n-th collective differs (operation, count, type, reduction, root) is an error on
// every rank that sees it (ncclInvalidUsage); a rank whose process ended before reaching a
// collective its peers wait in is ncclRemoteError; a collective whose peer is alive but never comes
// holds its stream forever (the caller's timeout and ncclCommAbort end it). Buffers must be device
// memory of this process's emulated device, streams live. Reductions: sum, prod, max, min over
// every NCCL type (integers wrap; f16 and bf16 are rounded after each addition, as each hop of a
// ring rounds); ncclAvg is refused.
#include <cuda_bf16.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime_internal.hpp"

namespace fs = std::filesystem;
using ablate::emu::DeviceAccess;
using ablate::emu::runtime::StreamWork;

namespace {

constexpr char kIdMagic[] = "ablate emulated nccl id:";  // a unique id is this, then the directory

thread_local std::string t_last_error;

bool failed(ncclResult_t rc) { return rc != ncclSuccess && rc != ncclInProgress; }

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

const char* type_name(uint32_t t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
  }
  return "an unknown type";
}

const char* op_name(uint32_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
  }
  return "an unknown op";
}

enum class Kind : uint32_t { all_reduce, reduce, broadcast, reduce_scatter, all_gather, send };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce: return "ncclReduce";
    case Kind::broadcast: return "ncclBroadcast";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::send: return "ncclSend";
  }
  return "?";
}
bool reduces(Kind k) { return k == Kind::all_reduce || k == Kind::reduce || k == Kind::reduce_scatter; }
bool rooted(Kind k) { return k == Kind::reduce || k == Kind::broadcast; }

// What a rank's file says of its call: the fields every rank must agree on, and the payload.
struct Header {
  char magic[8];
  uint32_t kind, type, op;
  int32_t root, rank;
  uint64_t seq, count, payload;
};
constexpr char kFileMagic[8] = {'a', 'b', 'n', 'c', 'c', 'l', '1', 0};

std::string describe(const Header& h) {
  std::string s = kind_name(Kind(h.kind));
  if (reduces(Kind(h.kind))) s += std::string(" (") + op_name(h.op) + ")";
  s += " of " + std::to_string(h.count) + " " + type_name(h.type);
  if (rooted(Kind(h.kind))) s += " rooted at rank " + std::to_string(h.root);
  return s;
}

// A communicator's state, shared by its handle and the collectives still on streams.
struct State {
  std::string dir;
  int rank = 0, nranks = 1;
  bool blocking = true;
  bool joined = false;
  std::vector<pid_t> pids;
  ncclResult_t state = ncclSuccess;
  std::string error;
  bool aborted = false, finalizing = false;
  uint64_t next_seq = 0;
  std::vector<uint64_t> sent, received;  // point-to-point messages per peer
  std::vector<std::weak_ptr<StreamWork>> outstanding;

  std::string where() const { return "emulated NCCL: rank " + std::to_string(rank) + " of " + std::to_string(nranks); }
  void set_error(ncclResult_t rc, const std::string& why) {
    if (failed(state)) return;  // the first error stays the communicator's
    state = rc;
    error = where() + ": " + why;
    t_last_error = error;
    std::fprintf(stderr, "%s\n", error.c_str());
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

// True while process `pid` runs (not ended, not a zombie awaiting its parent).
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;  // no /proc: kill's answer
  std::string line;
  std::getline(stat, line);
  const std::size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// Writes `bytes` as file `p`, whole or not at all (written aside, then renamed).
bool publish(const std::string& p, const void* a, std::size_t na, const void* b, std::size_t nb) {
  const std::string tmp = p + ".part";
  const int fd = ::open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  if (fd < 0) return false;
  bool ok = true;
  for (const auto& [ptr, n] : {std::pair<const void*, std::size_t>{a, na}, {b, nb}}) {
    const char* c = static_cast<const char*>(ptr);
    std::size_t left = n;
    while (ok && left > 0) {
      const ssize_t w = ::write(fd, c, left);
      if (w <= 0) ok = false;
      else {
        c += w;
        left -= std::size_t(w);
      }
    }
  }
  ok = ::close(fd) == 0 && ok;
  return ok && ::rename(tmp.c_str(), p.c_str()) == 0;
}

bool read_whole(const std::string& p, std::vector<char>& out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// --- reductions -------------------------------------------------------------------------------

template <class T>
T apply(ncclRedOp_t op, T a, T b) {
  switch (op) {
    case ncclSum: return T(a + b);
    case ncclProd: return T(a * b);
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return a;
  }
}
// Integers wrap (their sums and products in the unsigned type of their width).
template <class T, class U>
void combine_int(char* acc, const char* in, std::size_t n, ncclRedOp_t op) {
  for (std::size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    T r;
    if (op == ncclSum || op == ncclProd) r = T(apply<U>(op, U(a), U(b)));
    else r = apply<T>(op, a, b);
    std::memcpy(acc + i * sizeof(T), &r, sizeof(T));
  }
}
template <class T>
void combine_float(char* acc, const char* in, std::size_t n, ncclRedOp_t op) {
  for (std::size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    const T r = apply<T>(op, a, b);
    std::memcpy(acc + i * sizeof(T), &r, sizeof(T));
  }
}
// bf16: each addition in float, rounded back to nearest even (cuda_bf16.h's conversions).
void combine_bf16(char* acc, const char* in, std::size_t n, ncclRedOp_t op) {
  for (std::size_t i = 0; i < n; ++i) {
    __nv_bfloat16 a, b;
    std::memcpy(&a, acc + 2 * i, 2);
    std::memcpy(&b, in + 2 * i, 2);
    const __nv_bfloat16 r = __float2bfloat16_rn(apply<float>(op, __bfloat162float(a), __bfloat162float(b)));
    std::memcpy(acc + 2 * i, &r, 2);
  }
}
// acc[i] = acc[i] op in[i] for n elements of `t`.
void combine(ncclDataType_t t, char* acc, const char* in, std::size_t n, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: combine_int<int8_t, uint8_t>(acc, in, n, op); break;
    case ncclUint8: combine_int<uint8_t, uint8_t>(acc, in, n, op); break;
    case ncclInt32: combine_int<int32_t, uint32_t>(acc, in, n, op); break;
    case ncclUint32: combine_int<uint32_t, uint32_t>(acc, in, n, op); break;
    case ncclInt64: combine_int<int64_t, uint64_t>(acc, in, n, op); break;
    case ncclUint64: combine_int<uint64_t, uint64_t>(acc, in, n, op); break;
    case ncclFloat16: combine_float<_Float16>(acc, in, n, op); break;
    case ncclFloat32: combine_float<float>(acc, in, n, op); break;
    case ncclFloat64: combine_float<double>(acc, in, n, op); break;
    case ncclBfloat16: combine_bf16(acc, in, n, op); break;
  }
}

// --- what the tests ask of the emulation ------------------------------------------------------
// ABLATE_EMU_NCCL_LOG=prefix: each rank appends a line per collective when its stream reaches it
// to prefix.<rank>: "seq kind type count op root address launches" (address: the output buffer's
// device address; launches: the kernels launched in this process so far), so a test can tell the
// order of gradient buckets and whether kernels ran between them.
// ABLATE_EMU_NCCL_FAULT=rank:seq:exit|stall: that rank's process ends (SIGKILL) or stops
// responding when its stream reaches collective number seq.
void log_arrival(const State& st, const Header& h, const void* out) {
  static const char* prefix = std::getenv("ABLATE_EMU_NCCL_LOG");
  if (prefix == nullptr || *prefix == '\0') return;
  std::ofstream log(std::string(prefix) + "." + std::to_string(st.rank), std::ios::app);
  log << h.seq << ' ' << kind_name(Kind(h.kind)) << ' ' << type_name(h.type) << ' ' << h.count << ' ' << op_name(h.op) << ' ' << h.root
      << ' ' << reinterpret_cast<uintptr_t>(out) << ' ' << ablate::emu::stats().launches << '\n';
}
void inject_fault(const State& st, const Header& h) {
  static const char* spec = std::getenv("ABLATE_EMU_NCCL_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  int rank = -1;
  unsigned long long seq = 0;
  char what[16] = {0};
  if (std::sscanf(spec, "%d:%llu:%15s", &rank, &seq, what) != 3 || rank != st.rank || seq != h.seq) return;
  std::fprintf(stderr, "emulated NCCL: rank %d %s at collective #%llu (ABLATE_EMU_NCCL_FAULT)\n", rank,
               std::strcmp(what, "exit") == 0 ? "killed" : "stalls", seq);
  if (std::strcmp(what, "exit") == 0) raise(SIGKILL);
  for (;;) pause();
}

// --- operations on streams --------------------------------------------------------------------

// One collective (or send, or receive) of one rank, on its stream.
class Operation final : public StreamWork {
 public:
  Operation(std::shared_ptr<State> st, Header h, const void* send, void* recv, int peer, bool receive)
      : st_(std::move(st)), h_(h), send_(send), recv_(recv), peer_(peer), receive_(receive) {}

  // Its number at issue: the communicator's n-th collective, or the n-th message between two ranks.
  void number(State& st) {
    if (receive_) h_.seq = st.received[std::size_t(peer_)]++;
    else if (Kind(h_.kind) == Kind::send) h_.seq = st.sent[std::size_t(peer_)]++;
    else h_.seq = st.next_seq++;
  }

  bool progress() override {
    State& st = *st_;
    if (st.aborted) return true;  // abandoned: an aborted communicator's work stops
    if (failed(st.state)) return false;
    if (receive_) return try_receive();
    if (!arrived_) {
      if (!arrive()) return false;
      arrived_ = true;
    }
    if (Kind(h_.kind) == Kind::send) return true;  // sent eagerly: the receiver takes it when it comes
    return try_complete();
  }

 private:
  std::string file(int rank) const { return st_->path("c" + std::to_string(h_.seq) + ".r" + std::to_string(rank)); }
  std::string message_file() const {
    const int from = receive_ ? peer_ : st_->rank, to = receive_ ? st_->rank : peer_;
    return st_->path("p" + std::to_string(from) + "-" + std::to_string(to) + "." + std::to_string(h_.seq));
  }

  // This rank's input, read from device memory now that the stream has reached the operation.
  bool arrive() {
    if (Kind(h_.kind) != Kind::send) {
      inject_fault(*st_, h_);
      log_arrival(*st_, h_, recv_);
    }
    std::vector<char> payload(h_.payload);
    if (h_.payload > 0) {
      const DeviceAccess access;
      std::memcpy(payload.data(), send_, h_.payload);
    }
    const std::string p = Kind(h_.kind) == Kind::send ? message_file() : file(st_->rank);
    if (!publish(p, &h_, sizeof h_, payload.data(), payload.size())) {
      st_->set_error(ncclSystemError, std::string("cannot write ") + p + ": " + std::strerror(errno));
      return false;
    }
    return true;
  }

  // False while rank `r`'s part is missing; an error when its process has ended.
  bool present(const std::string& p, int r, const std::string& what) {
    if (exists(p)) return true;
    if (!alive(st_->pids[std::size_t(r)])) {
      st_->set_error(ncclRemoteError, "rank " + std::to_string(r) + " (process " + std::to_string(st_->pids[std::size_t(r)]) +
                                          ") ended without reaching " + what);
    }
    return false;
  }

  bool read_part(const std::string& p, int r, std::vector<char>& bytes, Header& h) {
    if (!read_whole(p, bytes) || bytes.size() < sizeof(Header)) {
      st_->set_error(ncclSystemError, "cannot read rank " + std::to_string(r) + "'s part " + p);
      return false;
    }
    std::memcpy(&h, bytes.data(), sizeof h);
    if (std::memcmp(h.magic, kFileMagic, sizeof kFileMagic) != 0 || bytes.size() != sizeof(Header) + h.payload) {
      st_->set_error(ncclSystemError, "rank " + std::to_string(r) + "'s part " + p + " is damaged");
      return false;
    }
    return true;
  }

  std::string what() const { return "collective #" + std::to_string(h_.seq) + " (" + describe(h_) + " here)"; }

  bool try_complete() {
    State& st = *st_;
    for (int r = 0; r < st.nranks; ++r) {
      if (!present(file(r), r, what())) return false;
    }
    std::vector<std::vector<char>> parts(std::size_t(st.nranks));
    for (int r = 0; r < st.nranks; ++r) {
      Header h{};
      if (!read_part(file(r), r, parts[std::size_t(r)], h)) return false;
      if (h.kind != h_.kind || h.type != h_.type || h.count != h_.count || (reduces(Kind(h.kind)) && h.op != h_.op) ||
          (rooted(Kind(h.kind)) && h.root != h_.root)) {
        st.set_error(ncclInvalidUsage, "collective #" + std::to_string(h_.seq) + " of the communicator is " + describe(h_) +
                                           " on rank " + std::to_string(st.rank) + " but " + describe(h) + " on rank " +
                                           std::to_string(r) + ": every rank must issue the same collectives in the same order");
        return false;
      }
    }
    write_result(parts);
    // Done here; the last rank to finish removes the collective's files.
    const std::string done = file(st.rank) + ".done";
    if (!publish(done, "", 0, "", 0)) {
      st.set_error(ncclSystemError, "cannot write " + done);
      return false;
    }
    bool all = true;
    for (int r = 0; r < st.nranks && all; ++r) all = exists(file(r) + ".done");
    if (all) {
      for (int r = 0; r < st.nranks; ++r) {
        ::unlink(file(r).c_str());
        ::unlink((file(r) + ".done").c_str());
      }
    }
    return true;
  }

  // The result from every rank's part, in rank order, into this rank's output.
  void write_result(const std::vector<std::vector<char>>& parts) {
    const State& st = *st_;
    const std::size_t esize = type_size(ncclDataType_t(h_.type));
    const auto data = [&](int r) { return parts[std::size_t(r)].data() + sizeof(Header); };
    std::vector<char> out;
    switch (Kind(h_.kind)) {
      case Kind::all_reduce:
      case Kind::reduce:
      case Kind::reduce_scatter: {
        // reduce_scatter: this rank's chunk of every rank's input.
        const std::size_t n = h_.count;
        const std::size_t offset = Kind(h_.kind) == Kind::reduce_scatter ? std::size_t(st.rank) * n * esize : 0;
        out.assign(data(0) + offset, data(0) + offset + n * esize);
        for (int r = 1; r < st.nranks; ++r) combine(ncclDataType_t(h_.type), out.data(), data(r) + offset, n, ncclRedOp_t(h_.op));
        if (Kind(h_.kind) == Kind::reduce && st.rank != h_.root) return;
        break;
      }
      case Kind::broadcast: out.assign(data(h_.root), data(h_.root) + h_.count * esize); break;
      case Kind::all_gather:
        for (int r = 0; r < st.nranks; ++r) out.insert(out.end(), data(r), data(r) + h_.count * esize);
        break;
      case Kind::send: return;
    }
    if (out.empty()) return;
    const DeviceAccess access;
    std::memcpy(recv_, out.data(), out.size());
  }

  bool try_receive() {
    const std::string p = message_file();
    const std::string what = "ncclSend #" + std::to_string(h_.seq) + " to rank " + std::to_string(st_->rank) + " (" +
                             std::to_string(h_.count) + " " + type_name(h_.type) + " expected)";
    if (!present(p, peer_, what)) return false;
    std::vector<char> bytes;
    Header h{};
    if (!read_part(p, peer_, bytes, h)) return false;
    if (h.type != h_.type || h.count != h_.count) {
      st_->set_error(ncclInvalidUsage, "message #" + std::to_string(h_.seq) + " from rank " + std::to_string(peer_) + " is " +
                                           std::to_string(h.count) + " " + type_name(h.type) + ", ncclRecv expects " +
                                           std::to_string(h_.count) + " " + type_name(h_.type));
      return false;
    }
    if (h.payload > 0) {
      const DeviceAccess access;
      std::memcpy(recv_, bytes.data() + sizeof(Header), h.payload);
    }
    ::unlink(p.c_str());
    return true;
  }

  std::shared_ptr<State> st_;
  Header h_;
  const void* send_;
  void* recv_;
  int peer_;
  bool receive_;
  bool arrived_ = false;
};

// ncclGroupStart/End: calls in a group are checked when made and issued, in order, at the end.
struct Issue {
  std::shared_ptr<State> st;
  std::shared_ptr<Operation> op;
  cudaStream_t stream;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Issue> t_group;

ncclResult_t refuse(ncclResult_t rc, const std::string& why) {
  t_last_error = why.rfind("emulated NCCL", 0) == 0 ? why : "emulated NCCL: " + why;
  std::fprintf(stderr, "%s\n", t_last_error.c_str());
  return rc;
}

// Tries to complete the rendezvous of a communicator's ranks (their files rank.<r>: pid, nranks).
void try_join(State& st) {
  if (st.joined || failed(st.state)) return;
  std::vector<pid_t> pids(std::size_t(st.nranks));
  for (int r = 0; r < st.nranks; ++r) {
    std::ifstream in(st.path("rank." + std::to_string(r)));
    long pid = 0;
    int n = 0;
    if (!(in >> pid >> n)) return;
    if (n != st.nranks) {
      st.set_error(ncclInvalidUsage, "rank " + std::to_string(r) + " joined the communicator with nranks " + std::to_string(n) +
                                         ", this rank with " + std::to_string(st.nranks));
      return;
    }
    pids[std::size_t(r)] = pid_t(pid);
  }
  st.pids = std::move(pids);
  st.joined = true;
  if (st.state == ncclInProgress && !st.finalizing) st.state = ncclSuccess;
}

bool outstanding_done(State& st) {
  std::erase_if(st.outstanding, [](const std::weak_ptr<StreamWork>& w) { return w.expired(); });
  return st.outstanding.empty();
}

}  // namespace

struct ncclComm {
  std::shared_ptr<State> st;
};

namespace {

ncclResult_t check_comm(ncclComm_t comm) {
  if (comm == nullptr || !comm->st) return refuse(ncclInvalidArgument, "a null or destroyed communicator");
  if (failed(comm->st->state)) {
    t_last_error = comm->st->error;
    return comm->st->state;
  }
  if (!comm->st->joined) return refuse(ncclInvalidUsage, comm->st->where() + ": a call before the communicator is ready");
  return ncclSuccess;
}

ncclResult_t check_buffer(const State& st, const void* p, std::size_t bytes, const char* which, const char* call) {
  if (bytes == 0) return ncclSuccess;
  if (p == nullptr || !ablate::emu::is_device_range(p, bytes)) {
    return refuse(ncclInvalidArgument, st.where() + ": " + call + ": " + which + " (" + std::to_string(bytes) +
                                           " bytes) is not device memory of this rank's device");
  }
  return ncclSuccess;
}

// Checks a call's arguments and issues it (or keeps it for the group's end).
ncclResult_t enqueue(ncclComm_t comm, Kind kind, const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes,
                     std::size_t count, ncclDataType_t type, ncclRedOp_t op, int root, int peer, bool receive, cudaStream_t stream) {
  if (const ncclResult_t rc = check_comm(comm); rc != ncclSuccess) return rc;
  State& st = *comm->st;
  const char* call = receive ? "ncclRecv" : kind_name(kind);
  if (type_size(type) == 0) return refuse(ncclInvalidArgument, st.where() + ": " + call + ": not an NCCL data type");
  if (reduces(kind) && (op < ncclSum || op > ncclMin)) {
    return refuse(ncclInvalidArgument,
                  st.where() + ": " + call + ": reduction " + op_name(op) + " (the emulation does sum, prod, max and min)");
  }
  if ((rooted(kind) && (root < 0 || root >= st.nranks)) || ((kind == Kind::send || receive) && (peer < 0 || peer >= st.nranks))) {
    return refuse(ncclInvalidArgument, st.where() + ": " + call + ": rank " + std::to_string(rooted(kind) ? root : peer) +
                                           " is not in a communicator of " + std::to_string(st.nranks));
  }
  if (!ablate::emu::runtime::stream_live(stream)) return refuse(ncclInvalidArgument, st.where() + ": " + call + ": not a live stream");
  if (const ncclResult_t rc = check_buffer(st, send, send_bytes, "sendbuff", call); rc != ncclSuccess) return rc;
  if (const ncclResult_t rc = check_buffer(st, recv, recv_bytes, "recvbuff", call); rc != ncclSuccess) return rc;
  Header h{};
  std::memcpy(h.magic, kFileMagic, sizeof kFileMagic);
  h.kind = uint32_t(kind);
  h.type = uint32_t(type);
  h.op = reduces(kind) ? uint32_t(op) : 0;
  h.root = rooted(kind) ? root : -1;
  h.rank = st.rank;
  h.count = count;
  h.payload = send_bytes;
  auto operation = std::make_shared<Operation>(comm->st, h, send, recv, peer, receive);
  t_group.push_back({comm->st, std::move(operation), stream});
  if (t_group_depth == 0) return ncclGroupEnd();  // a call outside a group is a group of one
  return ncclSuccess;
}

}  // namespace

// --- the calls --------------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return refuse(ncclInvalidArgument, "ncclGetVersion: null pointer");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

// The id names a fresh directory under $TMPDIR (else /tmp) where the ranks meet.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return refuse(ncclInvalidArgument, "ncclGetUniqueId: null id");
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ablate-nccl-XXXXXX";
  if (sizeof(kIdMagic) + tmpl.size() >= NCCL_UNIQUE_ID_BYTES) {
    return refuse(ncclSystemError, "ncclGetUniqueId: $TMPDIR is too long a path for a unique id");
  }
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return refuse(ncclSystemError, std::string("ncclGetUniqueId: cannot make a directory ") + tmpl + ": " + std::strerror(errno));
  }
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "%s%s", kIdMagic, buf.data());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (comm == nullptr) return refuse(ncclInvalidArgument, "ncclCommInitRank: null communicator pointer");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return refuse(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  id.internal[NCCL_UNIQUE_ID_BYTES - 1] = '\0';
  if (std::strncmp(id.internal, kIdMagic, sizeof kIdMagic - 1) != 0) {
    return refuse(ncclInvalidArgument, "ncclCommInitRank: the id is not one ncclGetUniqueId made");
  }
  auto st = std::make_shared<State>();
  st->dir = id.internal + sizeof kIdMagic - 1;
  st->rank = rank;
  st->nranks = nranks;
  st->blocking = config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  st->sent.assign(std::size_t(nranks), 0);
  st->received.assign(std::size_t(nranks), 0);
  std::error_code ec;
  if (!fs::is_directory(st->dir, ec)) {
    return refuse(ncclSystemError, "ncclCommInitRank: the id's directory " + st->dir + " is not there (another machine's id?)");
  }
  const std::string me = std::to_string(getpid()) + " " + std::to_string(nranks) + "\n";
  if (!publish(st->path("rank." + std::to_string(rank)), me.data(), me.size(), "", 0)) {
    return refuse(ncclSystemError, "ncclCommInitRank: cannot write to " + st->dir);
  }
  st->state = ncclInProgress;
  *comm = new ncclComm{st};
  if (!st->blocking) {
    try_join(*st);
    return st->state;
  }
  auto pause = std::chrono::microseconds(50);
  while (!st->joined && !failed(st->state)) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
    try_join(*st);
  }
  return st->state;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

// Drives every stream's collectives (the peers wait on this rank's arrivals) and reports the
// communicator's state: ncclInProgress while joining or finalizing.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || !comm->st || asyncError == nullptr)
    return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  State& st = *comm->st;
  try_join(st);
  if (st.joined) ablate::emu::runtime::poll_all_stream_work();
  if (st.finalizing && !failed(st.state) && outstanding_done(st)) st.state = ncclSuccess;
  *asyncError = st.state;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return refuse(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = comm->st->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return refuse(ncclInvalidArgument, "ncclCommCuDevice: null argument");
  *device = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return refuse(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = comm->st->rank;
  return ncclSuccess;
}

// Flushes the outstanding collectives: a blocking communicator waits here, a non-blocking one
// reports ncclInProgress (ncclCommGetAsyncError) until they are done.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr || !comm->st) return refuse(ncclInvalidArgument, "ncclCommFinalize: null communicator");
  State& st = *comm->st;
  if (failed(st.state)) return st.state;
  st.finalizing = true;
  if (!st.blocking) {
    st.state = ncclInProgress;
    return ncclInProgress;
  }
  auto pause = std::chrono::microseconds(50);
  while (!outstanding_done(st) && !failed(st.state)) {
    ablate::emu::runtime::poll_all_stream_work();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  return st.state;
}

// The rank leaves; the last rank to leave removes the directory.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr || !comm->st) return refuse(ncclInvalidArgument, "ncclCommDestroy: null communicator");
  State& st = *comm->st;
  st.aborted = true;  // what is left on streams is abandoned
  publish(st.path("left." + std::to_string(st.rank)), "", 0, "", 0);
  bool all = true;
  for (int r = 0; r < st.nranks && all; ++r) all = exists(st.path("left." + std::to_string(r)));
  if (all) {
    std::error_code ec;
    fs::remove_all(st.dir, ec);
  }
  delete comm;
  return ncclSuccess;
}

// Stops this rank's outstanding collectives where they are (their peers see this rank never come).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (comm->st) comm->st->aborted = true;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth > 0) --t_group_depth;
  else if (t_group.empty()) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (t_group_depth > 0) return ncclSuccess;
  std::vector<Issue> issues;
  issues.swap(t_group);
  for (Issue& i : issues) {
    State& st = *i.st;
    if (st.aborted) continue;
    i.op->number(st);
    outstanding_done(st);  // drops the finished ones: the list holds what is still pending
    st.outstanding.push_back(i.op);
    ablate::emu::runtime::enqueue_stream_work(i.stream, std::move(i.op));
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * type_size(datatype);
  return enqueue(comm, Kind::all_reduce, sendbuff, bytes, recvbuff, bytes, count, datatype, op, -1, -1, false, stream);
}

// Every rank sends; the root alone receives.
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * type_size(datatype);
  const bool is_root = comm != nullptr && comm->st && comm->st->rank == root;
  return enqueue(comm, Kind::reduce, sendbuff, bytes, recvbuff, is_root ? bytes : 0, count, datatype, op, root, -1, false, stream);
}

// The root sends; every rank receives.
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const std::size_t bytes = count * type_size(datatype);
  const bool is_root = comm != nullptr && comm->st && comm->st->rank == root;
  return enqueue(comm, Kind::broadcast, is_root ? sendbuff : nullptr, is_root ? bytes : 0, recvbuff, bytes, count, datatype, ncclSum,
                 root, -1, false, stream);
}

// sendbuff holds nranks * recvcount elements; rank r receives the reduction of chunk r.
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, std::size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = recvcount * type_size(datatype);
  const std::size_t n = comm != nullptr && comm->st ? std::size_t(comm->st->nranks) : 1;
  return enqueue(comm, Kind::reduce_scatter, sendbuff, n * bytes, recvbuff, bytes, recvcount, datatype, op, -1, -1, false, stream);
}

// recvbuff receives nranks * sendcount elements, rank r's at r * sendcount.
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, std::size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream) {
  const std::size_t bytes = sendcount * type_size(datatype);
  const std::size_t n = comm != nullptr && comm->st ? std::size_t(comm->st->nranks) : 1;
  return enqueue(comm, Kind::all_gather, sendbuff, bytes, recvbuff, n * bytes, sendcount, datatype, ncclSum, -1, -1, false, stream);
}

ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueue(comm, Kind::send, sendbuff, count * type_size(datatype), nullptr, 0, count, datatype, ncclSum, -1, peer, false,
                 stream);
}

ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, Kind::send, nullptr, 0, recvbuff, count * type_size(datatype), count, datatype, ncclSum, -1, peer, true,
                 stream);
}
