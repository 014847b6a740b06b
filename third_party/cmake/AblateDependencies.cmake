# Finds ablate's dependencies (all from Debian packages, see third_party/apt-packages.txt), with a
# message naming the package to install when one is missing.
include_guard(GLOBAL)

macro(ablate_require pkg debian)
  find_package(${pkg} ${ARGN} QUIET)
  if(NOT ${pkg}_FOUND)
    message(FATAL_ERROR "ablate needs ${pkg}: run scripts/setup.sh (or apt-get install ${debian})")
  endif()
endmacro()

ablate_require(Boost libboost-dev 1.74 COMPONENTS program_options filesystem)
ablate_require(tomlplusplus libtomlplusplus-dev)
ablate_require(spdlog libspdlog-dev)
ablate_require(nlohmann_json nlohmann-json3-dev)
find_package(Threads REQUIRED)
find_package(OpenMP COMPONENTS CXX)
# OpenBLAS for the CPU layers. The OpenMP build is preferred: it shares libgomp's thread pool with
# the layers' own OpenMP loops, where the default pthreads build's threads and OpenMP's spin against
# each other (measured: the quickstart step twice as fast). Debian installs it beside the pthreads
# build, which stays the system default, so the plugins that use BLAS get its directory as RPATH.
# ablate::blas carries both.
find_library(ABLATE_OPENBLAS_OPENMP NAMES openblas
             PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
add_library(ablate_blas INTERFACE)
add_library(ablate::blas ALIAS ablate_blas)
if(ABLATE_OPENBLAS_OPENMP)
  get_filename_component(ABLATE_BLAS_RPATH "${ABLATE_OPENBLAS_OPENMP}" DIRECTORY)
  target_link_libraries(ablate_blas INTERFACE "${ABLATE_OPENBLAS_OPENMP}")
  message(STATUS "ablate: OpenBLAS (OpenMP build) ${ABLATE_OPENBLAS_OPENMP}")
else()
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  if(NOT BLAS_FOUND)
    message(FATAL_ERROR "ablate needs OpenBLAS for the CPU layers: apt-get install libopenblas-openmp-dev "
                        "(scripts/setup.sh does it)")
  endif()
  set(ABLATE_BLAS_RPATH "")
  target_link_libraries(ablate_blas INTERFACE BLAS::BLAS)
  message(WARNING "ablate: OpenBLAS's OpenMP build not found (libopenblas-openmp-dev); the pthreads build's "
                  "threads will contend with OpenMP's")
endif()
if(ABLATE_BUILD_TESTS)
  ablate_require(doctest doctest-dev)
endif()

# MPI (Open MPI: libopenmpi-dev, openmpi-bin) for the `mpi` communicator and for the `nccl`
# communicator's unique-id exchange. Optional: without it neither is built and tests/comm runs only
# its launcher-environment test. ABLATE_MPI_FOUND says which, ablate::mpi links it,
# MPIEXEC_EXECUTABLE runs the tests.
find_package(MPI COMPONENTS C QUIET)
if(MPI_C_FOUND AND MPIEXEC_EXECUTABLE)
  set(ABLATE_MPI_FOUND ON)
  # ablate::mpi: MPI's C API only. Open MPI's mpi.h otherwise pulls its deprecated C++ bindings into
  # C++ code, which then needs libmpi_cxx at load time.
  if(NOT TARGET ablate::mpi)
    add_library(ablate_mpi_dep INTERFACE)
    add_library(ablate::mpi ALIAS ablate_mpi_dep)
    target_link_libraries(ablate_mpi_dep INTERFACE MPI::MPI_C)
    target_compile_definitions(ablate_mpi_dep INTERFACE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  endif()
  message(STATUS "ablate: MPI ${MPI_C_VERSION} (${MPIEXEC_EXECUTABLE}); the mpi communicator is built")
else()
  set(ABLATE_MPI_FOUND OFF)
  message(STATUS "ablate: MPI not found (apt-get install libopenmpi-dev openmpi-bin); the mpi and nccl "
                 "communicators are not built")
endif()

# NCCL for the `nccl` communicator: nccl.h and libnccl from one installation, looked for in
# $NCCL_HOME, the CUDA toolkit (/usr/local/cuda ships it on NVIDIA's images, in lib/ or lib64/),
# /usr, and the nvidia-nccl-cu* wheel of the Python on the PATH. The library is taken from beside
# the header first, so the two versions match. ablate::nccl carries both; ABLATE_NCCL_FOUND says
# whether it exists (the plugin also needs CUDA and MPI, see plugins/CMakeLists.txt).
set(_ablate_nccl_roots "$ENV{NCCL_HOME}" "$ENV{CUDA_HOME}" /usr/local/cuda /usr)
find_program(_ablate_python NAMES python3)
if(_ablate_python)
  execute_process(COMMAND "${_ablate_python}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    OUTPUT_VARIABLE _ablate_purelib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_ablate_purelib)
    list(APPEND _ablate_nccl_roots "${_ablate_purelib}/nvidia/nccl")
  endif()
endif()
find_path(ABLATE_NCCL_INCLUDE_DIR nccl.h HINTS ${_ablate_nccl_roots} PATH_SUFFIXES include)
if(ABLATE_NCCL_INCLUDE_DIR)
  get_filename_component(_ablate_nccl_root "${ABLATE_NCCL_INCLUDE_DIR}" DIRECTORY)
  find_library(ABLATE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS "${_ablate_nccl_root}"
               PATH_SUFFIXES lib lib64 "lib/${CMAKE_LIBRARY_ARCHITECTURE}" NO_DEFAULT_PATH)
  find_library(ABLATE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_ablate_nccl_roots} PATH_SUFFIXES lib lib64)
endif()
if(ABLATE_NCCL_INCLUDE_DIR AND ABLATE_NCCL_LIBRARY)
  set(ABLATE_NCCL_FOUND ON)
  file(STRINGS "${ABLATE_NCCL_INCLUDE_DIR}/nccl.h" _ablate_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE "[^0-9;]" "" _ablate_nccl_version "${_ablate_nccl_version}")
  string(REPLACE ";" "." _ablate_nccl_version "${_ablate_nccl_version}")
  if(NOT TARGET ablate::nccl)
    add_library(ablate_nccl_dep INTERFACE)
    add_library(ablate::nccl ALIAS ablate_nccl_dep)
    target_include_directories(ablate_nccl_dep INTERFACE "${ABLATE_NCCL_INCLUDE_DIR}")
    target_link_libraries(ablate_nccl_dep INTERFACE "${ABLATE_NCCL_LIBRARY}")
  endif()
  message(STATUS "ablate: NCCL ${_ablate_nccl_version}: ${ABLATE_NCCL_LIBRARY}")
else()
  set(ABLATE_NCCL_FOUND OFF)
  message(STATUS "ablate: NCCL not found (nccl.h and libnccl; set NCCL_HOME, or pip install nvidia-nccl-cu12); "
                 "the nccl communicator is not built")
endif()

# SentencePiece (libsentencepiece-dev): Llama-style tokenizer models for the token_shards source.
find_path(ABLATE_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h)
find_library(ABLATE_SENTENCEPIECE_LIBRARY sentencepiece)
if(ABLATE_SENTENCEPIECE_INCLUDE_DIR AND ABLATE_SENTENCEPIECE_LIBRARY)
  add_library(ablate_sentencepiece INTERFACE)
  add_library(ablate::sentencepiece ALIAS ablate_sentencepiece)
  target_include_directories(ablate_sentencepiece INTERFACE "${ABLATE_SENTENCEPIECE_INCLUDE_DIR}")
  target_link_libraries(ablate_sentencepiece INTERFACE "${ABLATE_SENTENCEPIECE_LIBRARY}")
  message(STATUS "ablate: SentencePiece ${ABLATE_SENTENCEPIECE_LIBRARY}")
else()
  message(STATUS "ablate: libsentencepiece not found: token_shards reads no SentencePiece models "
                 "(apt install libsentencepiece-dev)")
endif()
