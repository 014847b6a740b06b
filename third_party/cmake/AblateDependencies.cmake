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
set(BLA_VENDOR OpenBLAS)
find_package(BLAS QUIET)
if(NOT BLAS_FOUND)
  message(FATAL_ERROR "ablate needs OpenBLAS for the CPU layers: apt-get install libopenblas-dev "
                      "(scripts/setup.sh does it)")
endif()
if(ABLATE_BUILD_TESTS)
  ablate_require(doctest doctest-dev)
endif()
