# FindCudnnFrontend: cudnn-frontend's C++ headers (header-only, from the nvidia-cudnn-frontend PyPI
# package, third_party/pip-packages.txt) and cuDNN 9's cudnn.h, for the cudnn_flash plugin.
#
# The frontend is found through python3 (`import cudnn`: its wheel installs the headers under
# site-packages/include), then the interpreter's purelib, then $CUDNN_FRONTEND_INCLUDE or
# CudnnFrontend_ROOT. cudnn.h is looked for beside the CUDA toolkit, in $CUDNN_HOME and /usr.
# libcudnn is not linked: the plugin opens it at run time (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING),
# so the plugin loads where cuDNN is missing. The library found here, if any, is only the fallback
# path the plugin tries after the loader's own search.
#
# Results:
#   CudnnFrontend_FOUND, CudnnFrontend_VERSION (the frontend's), CudnnFrontend_CUDNN_VERSION (cudnn.h's)
#   CudnnFrontend_INCLUDE_DIR, CudnnFrontend_CUDNN_INCLUDE_DIR, CudnnFrontend_CUDNN_LIBRARY (optional)
#   ablate::cudnn_frontend: interface target (both include dirs as system headers, the dynamic
#   loading definition, libdl, and ABLATE_CUDNN_LIBRARY_PATH when a library was found)
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

set(_cudnn_fe_hints "$ENV{CUDNN_FRONTEND_INCLUDE}")
find_program(_cudnn_fe_python NAMES python3)
if(_cudnn_fe_python)
  execute_process(
    COMMAND "${_cudnn_fe_python}" -c
            "import cudnn, os; print(os.path.join(os.path.dirname(os.path.dirname(cudnn.__file__)), 'include'))"
    OUTPUT_VARIABLE _cudnn_fe_from_module OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cudnn_fe_rc)
  if(_cudnn_fe_rc EQUAL 0 AND _cudnn_fe_from_module)
    list(APPEND _cudnn_fe_hints "${_cudnn_fe_from_module}")
  endif()
  execute_process(COMMAND "${_cudnn_fe_python}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    OUTPUT_VARIABLE _cudnn_fe_purelib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_cudnn_fe_purelib)
    list(APPEND _cudnn_fe_hints "${_cudnn_fe_purelib}/include")
  endif()
endif()

find_path(CudnnFrontend_INCLUDE_DIR cudnn_frontend.h HINTS ${_cudnn_fe_hints} PATH_SUFFIXES include)
find_path(CudnnFrontend_CUDNN_INCLUDE_DIR cudnn.h
  HINTS "$ENV{CUDNN_HOME}" ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda /usr
  PATH_SUFFIXES include "include/${CMAKE_LIBRARY_ARCHITECTURE}")
find_library(CudnnFrontend_CUDNN_LIBRARY NAMES libcudnn.so.9 cudnn
  HINTS "$ENV{CUDNN_HOME}" "${CUDAToolkit_LIBRARY_DIR}" /usr/local/cuda
  PATH_SUFFIXES lib lib64 "lib/${CMAKE_LIBRARY_ARCHITECTURE}")

if(CudnnFrontend_INCLUDE_DIR AND EXISTS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h" _cudnn_fe_v
       REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION [0-9]+")
  string(REGEX REPLACE "[^0-9;]*([0-9]+)" "\\1" _cudnn_fe_v "${_cudnn_fe_v}")
  string(REPLACE ";" "." CudnnFrontend_VERSION "${_cudnn_fe_v}")
endif()
if(CudnnFrontend_CUDNN_INCLUDE_DIR AND EXISTS "${CudnnFrontend_CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CudnnFrontend_CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_v
       REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) [0-9]+")
  string(REGEX REPLACE "[^0-9;]*([0-9]+)" "\\1" _cudnn_v "${_cudnn_v}")
  string(REPLACE ";" "." CudnnFrontend_CUDNN_VERSION "${_cudnn_v}")
endif()

find_package_handle_standard_args(CudnnFrontend
  REQUIRED_VARS CudnnFrontend_INCLUDE_DIR CudnnFrontend_CUDNN_INCLUDE_DIR
  VERSION_VAR CudnnFrontend_VERSION)

if(CudnnFrontend_FOUND AND NOT TARGET ablate::cudnn_frontend)
  add_library(ablate_cudnn_frontend INTERFACE)
  add_library(ablate::cudnn_frontend ALIAS ablate_cudnn_frontend)
  target_include_directories(ablate_cudnn_frontend SYSTEM INTERFACE
    "${CudnnFrontend_INCLUDE_DIR}" "${CudnnFrontend_CUDNN_INCLUDE_DIR}")
  target_compile_definitions(ablate_cudnn_frontend INTERFACE NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
  if(CudnnFrontend_CUDNN_LIBRARY)
    get_filename_component(_cudnn_real "${CudnnFrontend_CUDNN_LIBRARY}" REALPATH)
    target_compile_definitions(ablate_cudnn_frontend INTERFACE "ABLATE_CUDNN_LIBRARY_PATH=\"${_cudnn_real}\"")
  endif()
  target_link_libraries(ablate_cudnn_frontend INTERFACE ${CMAKE_DL_LIBS})
endif()
mark_as_advanced(CudnnFrontend_INCLUDE_DIR CudnnFrontend_CUDNN_INCLUDE_DIR CudnnFrontend_CUDNN_LIBRARY)
