# What the Python package `cad` ships (pyproject.toml), in both ways of making it: built here
# (CAD_PYTHON_PACKAGE=ON) or taken from an existing build tree (CAD_PACKAGE_FROM_BUILD, CadPackageFromBuild.cmake).
#
# cad_package_write_manifest(): writes <build>/cad_package_plugins.txt, the file names of the plugins the package
#   ships (every plugins/ folder's, not the examples'), so that a wheel made from this build tree later takes
#   exactly those. Called by every build after the plugin folders are added.
# cad_package_bundle_runtime(LIBDIR [DIRS...]): at install time, copies into LIBDIR the shared libraries libcad_host and the
#   plugins need that a machine without the build's -dev packages lacks (spdlog, fmt, ltdl; the CUDA runtime where
#   the plugins use it), under the names the loader asks for. libcad_host finds them through its RPATH $ORIGIN,
#   the plugins through $ORIGIN/../.. (CadPlugin.cmake). DIRS: where else to look for them (the CUDA toolkit's
#   library directory, which the loader's own search path may lack). The C/C++ runtime, MPI (which must be the one mpirun
#   starts) and NCCL (PyTorch's, already in the process) stay the system's.

function(cad_package_write_manifest)
  get_property(targets GLOBAL PROPERTY CAD_PLUGIN_TARGETS)
  set(lines "")
  foreach(target ${targets})
    string(APPEND lines "$<TARGET_FILE_NAME:${target}>\n")
  endforeach()
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/cad_package_plugins.txt CONTENT "${lines}")
endfunction()

function(cad_package_bundle_runtime libdir)
  install(CODE "set(CAD_PACKAGE_LIBDIR \"${libdir}\")\nset(CAD_PACKAGE_SEARCH_DIRS \"${ARGN}\")")
  install(CODE [[
    set(lib "${CMAKE_INSTALL_PREFIX}/${CAD_PACKAGE_LIBDIR}")
    file(GLOB plugins "${lib}/cad/plugins/cad_*.so")
    file(GET_RUNTIME_DEPENDENCIES LIBRARIES "${lib}/libcad_host.so" MODULES ${plugins}
         DIRECTORIES ${CAD_PACKAGE_SEARCH_DIRS}
         RESOLVED_DEPENDENCIES_VAR found UNRESOLVED_DEPENDENCIES_VAR missing
         PRE_INCLUDE_REGEXES "^lib(spdlog|fmt|ltdl|cudart)\\.so" PRE_EXCLUDE_REGEXES ".*")
    if(missing)
      message(FATAL_ERROR "cad package: the libraries ${missing} that libcad_host or a plugin needs were not found")
    endif()
    foreach(dependency ${found})
      # One real file under the name the loader asks for (wheels keep no symbolic links).
      get_filename_component(name "${dependency}" NAME)
      file(REAL_PATH "${dependency}" real)
      message(STATUS "Bundling: ${lib}/${name} (from ${real})")
      file(COPY_FILE "${real}" "${lib}/${name}")
    endforeach()
  ]])
endfunction()
