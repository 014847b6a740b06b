// The launcher-environment reader (core/include/ablate/launch_env.hpp) against fake environments: Open MPI,
// Slurm, both at once, neither, and malformed or inconsistent values.
#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>

#include "ablate/launch_env.hpp"

using ablate::launch::LaunchEnv;
using ablate::launch::read_launch_env;

namespace {

LaunchEnv read(const std::map<std::string, std::string>& vars) {
  return read_launch_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read(vars);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("no launcher variables mean a world of one") {
  const LaunchEnv e = read({{"HOME", "/root"}, {"SLURM_NTASKS", "8"}});  // an salloc shell: no SLURM_PROCID
  CHECK(e.launcher == "none");
  CHECK(e.rank == 0);
  CHECK(e.world == 1);
  CHECK(e.local_rank == -1);
}

TEST_CASE("open mpi's variables give rank, world and local rank") {
  const LaunchEnv e = read({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  CHECK(e.launcher == "open_mpi");
  CHECK(e.rank == 5);
  CHECK(e.world == 8);
  CHECK(e.local_rank == 1);
}

TEST_CASE("slurm's variables give rank, world and local rank") {
  const LaunchEnv e = read({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}});
  CHECK(e.launcher == "slurm");
  CHECK(e.rank == 3);
  CHECK(e.world == 16);
  CHECK(e.local_rank == 3);
}

TEST_CASE("open mpi's variables win over slurm's (mpirun inside an allocation)") {
  const LaunchEnv e = read({{"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "1"},
                            {"SLURM_LOCALID", "0"},
                            {"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  CHECK(e.launcher == "open_mpi");
  CHECK(e.rank == 1);
  CHECK(e.world == 2);
}

TEST_CASE("a missing local rank is reported as unknown") {
  const LaunchEnv e = read({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(e.local_rank == -1);
}

TEST_CASE("the GPU of a process is its local rank modulo the visible GPUs, else GPU 0") {
  const LaunchEnv third = read({{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}});
  CHECK(ablate::launch::gpu_ordinal(third, 8) == 2);  // a machine showing all its GPUs
  CHECK(ablate::launch::gpu_ordinal(third, 1) == 0);  // srun --gpus-per-task=1: each task sees its own
  CHECK(ablate::launch::gpu_ordinal(third, 2) == 0);  // more local ranks than GPUs: shared
  CHECK(ablate::launch::gpu_ordinal(read({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), 8) == 0);
  CHECK(ablate::launch::gpu_ordinal(read({}), 4) == 0);  // no launcher
  CHECK(ablate::launch::gpu_ordinal(third, 0) == 0);
}

TEST_CASE("a rank without a world size is an error naming the missing variable") {
  CHECK(error_of({{"SLURM_PROCID", "0"}}).find("SLURM_NTASKS") != std::string::npos);
}

TEST_CASE("a rank not below the world size is an error naming both variables") {
  const std::string e = error_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(e.find("OMPI_COMM_WORLD_RANK=2") != std::string::npos);
  CHECK(e.find("OMPI_COMM_WORLD_SIZE=2") != std::string::npos);
}

TEST_CASE("values that are not non-negative integers are errors naming the variable and value") {
  CHECK(error_of({{"SLURM_PROCID", "one"}, {"SLURM_NTASKS", "2"}}).find("SLURM_PROCID='one'") != std::string::npos);
  CHECK(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "-2"}}).find("SLURM_NTASKS='-2'") != std::string::npos);
  CHECK(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2x"}}).find("SLURM_NTASKS='2x'") != std::string::npos);
  CHECK(error_of({{"SLURM_PROCID", ""}, {"SLURM_NTASKS", "2"}}).find("SLURM_PROCID=''") != std::string::npos);
  CHECK(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "99999999999999999999"}}).find("SLURM_NTASKS") != std::string::npos);
  CHECK(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}).find("at least one rank") != std::string::npos);
}

TEST_CASE("a local rank above the rank is an error") {
  const std::string e = error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}});
  CHECK(e.find("OMPI_COMM_WORLD_LOCAL_RANK=3") != std::string::npos);
}
