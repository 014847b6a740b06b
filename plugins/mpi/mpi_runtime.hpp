// What the `mpi` and `nccl` communicators share about MPI itself: initialising it once per process
// (whoever comes first; MPI_THREAD_SERIALIZED) and finalising it at exit, this process's rank,
// world and local rank, waiting for a non-blocking request against a deadline, and ending the
// whole job at exit after a collective timed out (MPI_Finalize would wait for the rank that never
// came). Header-only: each plugin library keeps its own copy; what they share is MPI's own state.
#pragma once

#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/launch_env.hpp"

namespace ablate::mpi_runtime {

// Throws ablate::Error (runtime) naming the file, line and call when an MPI call fails (the
// communicators set MPI_ERRORS_RETURN on their own MPI communicator, so failures come back here).
inline void check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw_runtime_error(std::string(file) + ":" + std::to_string(line), std::string(call) + " failed: " + text);
}
#define ABLATE_MPI_CHECK(call) ::ablate::mpi_runtime::check((call), #call, __FILE__, __LINE__)

inline bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

inline bool initialized() {
  int done = 0;
  MPI_Initialized(&done);
  return done != 0;
}

// Initialises MPI unless it already is (by the other communicator plugin, or by the program), and
// then finalises it when the process exits. Throws when MPI was finalised already or cannot give
// MPI_THREAD_SERIALIZED (collectives may come from any thread, one at a time).
inline void ensure_initialized(const std::string& where) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (finalized()) throw_runtime_error(where, "MPI was already finalized in this process");
  int provided = 0;
  if (!initialized()) {
    ABLATE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    std::atexit([] {
      if (initialized() && !finalized()) MPI_Finalize();
    });
  } else {
    ABLATE_MPI_CHECK(MPI_Query_thread(&provided));
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    throw_runtime_error(where, "the MPI library provides thread level " + std::to_string(provided) + ", below MPI_THREAD_SERIALIZED");
  }
}

// After a collective timed out, this process must not finalise MPI (that waits for the missing
// rank) but abort the job: MPI_Abort at exit ends every rank. The error has been thrown to the
// caller first, so a program prints it and exits as for any other runtime failure. atexit handlers
// run in reverse order of registration, so this one runs before the finaliser above.
inline void abort_job_at_exit(const std::string& reason, int exit_code = 1) {
  static std::mutex mu;
  static std::string first_reason;
  static int code = 1;
  std::lock_guard<std::mutex> lock(mu);
  if (!first_reason.empty()) return;
  first_reason = reason.empty() ? "a collective failed" : reason;
  code = exit_code;
  std::atexit([] {
    if (!initialized() || finalized()) return;
    std::fprintf(stderr, "ablate: aborting the MPI job: %s\n", first_reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  });
}

// Where this process sits in the job: rank and world from MPI, checked against what the launcher
// set in the environment (a mismatch means an MPI library that did not join the launcher's job),
// local rank from the launcher, or from the ranks sharing this machine's memory when it did not say.
struct Position {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;  // ranks sharing this machine's memory
};

inline Position position(const std::string& where) {
  launch::LaunchEnv env;
  try {
    env = launch::read_launch_env();
  } catch (const std::invalid_argument& e) {
    throw_input_error(where, e.what());
  }
  Position p;
  ABLATE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &p.rank));
  ABLATE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &p.world));
  if (env.launcher != "none" && (env.world != p.world || env.rank != p.rank)) {
    throw_runtime_error(where, "the " + env.launcher + " launcher says rank " + std::to_string(env.rank) + " of " +
                                   std::to_string(env.world) + " but MPI says rank " + std::to_string(p.rank) + " of " +
                                   std::to_string(p.world) +
                                   (env.launcher == "slurm" ? ": start the job with srun --mpi=pmix (an MPI built with Slurm's PMI "
                                                              "support) or with mpirun"
                                                            : ": this MPI library is not the one mpirun belongs to"));
  }
  MPI_Comm node = MPI_COMM_NULL;
  ABLATE_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &node));
  int node_rank = 0;
  ABLATE_MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  ABLATE_MPI_CHECK(MPI_Comm_size(node, &p.local_world));
  ABLATE_MPI_CHECK(MPI_Comm_free(&node));
  p.local_rank = env.local_rank >= 0 ? env.local_rank : node_rank;
  return p;
}

// What both MPI-launched communicators share: MPI initialised, this process's place in the job
// (rank, world, local rank and local world, from position()), and ending the job at exit when a
// rank leaves with an error. The collectives are each communicator's own.
class LaunchedCommunicator : public Communicator {
 public:
  int rank() const override { return where_.rank; }
  int world() const override { return where_.world; }
  int local_rank() const override { return where_.local_rank; }
  int local_world() const override { return where_.local_world; }
  void abort_job_at_exit(int exit_code, const std::string& reason) override {
    if (where_.world > 1) {
      mpi_runtime::abort_job_at_exit("rank " + std::to_string(where_.rank) + " of " + std::to_string(where_.world) + ": " + reason,
                                     exit_code);
    }
  }

 protected:
  explicit LaunchedCommunicator(const std::string& where) : where_((ensure_initialized(where), position(where))) {}
  const Position where_;
};

using Clock = std::chrono::steady_clock;

// The deadline of an operation starting now; timeout_s <= 0 means none.
struct Deadline {
  bool none = true;
  Clock::time_point at{};
  static Deadline after(double timeout_s) {
    Deadline d;
    if (timeout_s > 0) {
      d.none = false;
      d.at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    }
    return d;
  }
  bool passed(Clock::time_point now) const { return !none && now >= at; }
};

// Drives MPI's progress on one request until it completes (true) or the deadline passes first
// (false: the request is still pending). Polls flat out for the first 50 ms, since MPI progresses
// non-blocking collectives only inside MPI calls, then yields the core between polls, so a rank
// waiting for a slow peer does not starve processes sharing its core.
inline bool wait_until(MPI_Request& request, const Deadline& deadline) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    int done = 0;
    ABLATE_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    const Clock::time_point now = Clock::now();
    if (deadline.passed(now)) return false;
    if (now - start > std::chrono::milliseconds(50)) sched_yield();
  }
}

// The same for several requests (MPI_Testall): true when all completed.
inline bool wait_all_until(int count, MPI_Request* requests, const Deadline& deadline) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    int done = 0;
    ABLATE_MPI_CHECK(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return true;
    const Clock::time_point now = Clock::now();
    if (deadline.passed(now)) return false;
    if (now - start > std::chrono::milliseconds(50)) sched_yield();
  }
}

}  // namespace ablate::mpi_runtime
