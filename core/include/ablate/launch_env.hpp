// Rank, world size and local rank as the launcher set them in the environment: Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK), then Slurm's srun (SLURM_PROCID / SLURM_NTASKS /
// SLURM_LOCALID); neither means a world of one. Depends on nothing but the standard library, and
// reads the environment through a function, so tests hand it a fake one.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

namespace ablate::launch {

struct LaunchEnv {
  std::string launcher = "none";  // "open_mpi" | "slurm" | "none"
  int rank = 0;
  int world = 1;
  int local_rank = -1;  // -1: the launcher did not say (a caller may ask MPI instead)
};

// Returns the value of an environment variable, or nullptr when it is not set.
using EnvLookup = std::function<const char*(const char*)>;

namespace detail {

// A non-negative decimal integer that fits an int, or an error naming the variable.
inline int parse_count(const char* var, const char* text) {
  const std::string s = text;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || v < 0 || v > 1'000'000'000) {
    throw std::invalid_argument(std::string(var) + "='" + s + "' is not a non-negative integer");
  }
  return int(v);
}

struct Names {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
};

inline LaunchEnv read_with(const Names& n, const EnvLookup& env) {
  const char* rank = env(n.rank);
  const char* world = env(n.world);
  const char* local = env(n.local_rank);
  if (world == nullptr) {
    throw std::invalid_argument(std::string(n.rank) + " is set but " + n.world + " is not: the " + n.launcher +
                                " environment is incomplete");
  }
  LaunchEnv e;
  e.launcher = n.launcher;
  e.rank = parse_count(n.rank, rank);
  e.world = parse_count(n.world, world);
  if (e.world < 1) {
    throw std::invalid_argument(std::string(n.world) + "=" + world + ": a world needs at least one rank");
  }
  if (e.rank >= e.world) {
    throw std::invalid_argument(std::string(n.rank) + "=" + rank + " is not below " + n.world + "=" + world);
  }
  if (local != nullptr) {
    e.local_rank = parse_count(n.local_rank, local);
    if (e.local_rank > e.rank) {
      throw std::invalid_argument(std::string(n.local_rank) + "=" + local + " is above " + n.rank + "=" + rank);
    }
  }
  return e;
}

}  // namespace detail

// Throws std::invalid_argument naming the variable when a launcher's variables are malformed or
// inconsistent (rank not below world, a rank without a world, a local rank above the rank).
inline const char* process_env(const char* name) { return std::getenv(name); }

inline LaunchEnv read_launch_env(const EnvLookup& env = process_env) {
  static constexpr detail::Names kOpenMpi{"open_mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"};
  static constexpr detail::Names kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  // A launcher is recognised by its rank variable (an salloc shell sets SLURM_NTASKS without
  // SLURM_PROCID; only srun's tasks and the batch step have one). mpirun inside a Slurm allocation
  // sets both kinds; the MPI job's own variables describe this process, so they come first.
  for (const detail::Names* n : {&kOpenMpi, &kSlurm}) {
    if (env(n->rank) != nullptr) return detail::read_with(*n, env);
  }
  return {};
}

// The GPU a process uses among the `visible` ones: its local rank modulo their number (one GPU per
// process on a machine showing them all; GPU 0 when the launcher shows each task only its own, as
// Slurm's --gpus-per-task=1 does; several processes per GPU when there are more local ranks than
// GPUs), GPU 0 when the launcher says no local rank. The cuda device and the nccl communicator
// both choose by it, so their buffers and collectives are on the same GPU.
inline int gpu_ordinal(const LaunchEnv& env, int visible) { return env.local_rank > 0 && visible > 0 ? env.local_rank % visible : 0; }

}  // namespace ablate::launch
