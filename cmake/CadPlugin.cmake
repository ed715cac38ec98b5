# cad_add_plugin(NAME <name> SOURCES <files...> [LIBRARIES <libs...>] [EXPORTS <version script>])
#
# Builds plugin <name> as build/lib/cad/plugins/cad_<name>.so: a MODULE library (never linked
# against), with hidden visibility and a version script so that it exports only
# cad_plugin_entry_v1, built with the plugin support library, and installed with the other plugins.
# EXPORTS: a plugin with a documented API of its own beside the entry (callback_attention's register
# functions) names its own version script; its `global:` symbols are what symbols.<name> allows.
set(CAD_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/cad_plugin_exports.map)

function(cad_add_plugin)
  cmake_parse_arguments(ARG "" "NAME;EXPORTS" "SOURCES;LIBRARIES" ${ARGN})
  set(script ${CAD_PLUGIN_VERSION_SCRIPT})
  if(ARG_EXPORTS)
    set(script ${ARG_EXPORTS})
  endif()
  set(target cad_plugin_${ARG_NAME})
  add_library(${target} MODULE ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME cad_${ARG_NAME}
    LIBRARY_OUTPUT_DIRECTORY ${CAD_PLUGIN_OUTPUT_DIRECTORY}
    LINK_DEPENDS ${script}
    CAD_PLUGIN_EXPORTS ${script})
  target_link_libraries(${target} PRIVATE cad_plugin_support ${ARG_LIBRARIES})
  # -z defs: a plugin must not rely on symbols from the host process.
  target_link_options(${target} PRIVATE "LINKER:--version-script=${script}")
  if(NOT CAD_SANITIZE)
    target_link_options(${target} PRIVATE "LINKER:-z,defs")
  endif()
  if(CAD_ENABLE_CUDA)
    # The Python package bundles the CUDA runtime in its lib/, two levels up (CadPackage.cmake).
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/cad/plugins)
  set_property(GLOBAL APPEND PROPERTY CAD_PLUGIN_TARGETS ${target})
endfunction()
