# ablate_add_plugin(NAME SOURCES src... [LIBRARIES lib...] [NO_INSTALL] [OUTPUT_DIR dir])
# Builds libablate_<NAME>.so against ablate::core with hidden visibility (only the plugin's entry
# point is exported). In ablate's own tree the library lands in bin/plugins next to the `ablate`
# program and is installed to lib/ablate/plugins; out of tree it lands in OUTPUT_DIR or the
# current binary directory, and ABLATE_PLUGIN_PATH (or [plugins] paths) points the loader at it.
include_guard(GLOBAL)

function(ablate_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "ablate_add_plugin(${name}): SOURCES is required")
  endif()
  set(target ablate_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE ablate::core ${ARG_LIBRARIES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIR}")
  elseif(DEFINED ABLATE_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ABLATE_PLUGIN_OUTPUT_DIR}")
  endif()
  if(NOT ARG_NO_INSTALL AND DEFINED ABLATE_PLUGIN_INSTALL_DIR)
    # Installed next to core as lib/ablate/plugins: core is two directories up.
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
    install(TARGETS ${target} LIBRARY DESTINATION "${ABLATE_PLUGIN_INSTALL_DIR}")
  endif()
endfunction()
