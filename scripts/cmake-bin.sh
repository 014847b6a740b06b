# Sourced by the build and test scripts: CMAKE and CTEST name the CMake of PyPI's `cmake` package
# (third_party/pip-packages.txt) when python3 has it, else the system's. Debian 12's CMake 3.25
# cannot configure against CUDA 13 (its FindCUDAToolkit asks for CUDA::nvToolsExt, which CUDA 13
# no longer ships); PyPI's 3.31 can.
ablate_cmake_dir=$(${PYTHON:-python3} -c 'import cmake; print(cmake.CMAKE_BIN_DIR)' 2>/dev/null || true)
if [ -n "$ablate_cmake_dir" ] && [ -x "$ablate_cmake_dir/cmake" ]; then
  CMAKE="$ablate_cmake_dir/cmake"
  CTEST="$ablate_cmake_dir/ctest"
else
  CMAKE=$(command -v cmake)
  CTEST=$(command -v ctest)
fi
