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
