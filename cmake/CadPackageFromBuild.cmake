# The Python package's libraries taken from an existing build tree instead of compiled again:
#   pip wheel . -C cmake.define.CAD_PACKAGE_FROM_BUILD=$PWD/build
# (CI's test job packages its Release build this way: .ci/quickstart.sh). The tree must be a plain build of this
# source tree (no sanitizers) that has built libcad_host and every plugin the package ships
# (<tree>/cad_package_plugins.txt, CadPackage.cmake). Its own install rules place them (`cmake --install` into a
# staging directory, which sets each library's install RPATH), and this project installs libcad_host and those
# plugins from there into the package, with the runtime libraries CadPackage.cmake bundles.
#
# Unlike a package built with CAD_PYTHON_PACKAGE=ON, the tree's libcad_host keeps the plugin directories compiled
# into it (the tree's lib/cad/plugins and the install prefix's), searched after the package's own
# lib/cad/plugins: use such a wheel on the machine that built it (CI, a developer's checkout), not for
# distribution.
set(_tree "${CAD_PACKAGE_FROM_BUILD}")
get_filename_component(_tree "${_tree}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
if(NOT EXISTS "${_tree}/CMakeCache.txt")
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: no CMakeCache.txt there; configure and build that tree "
                      "first (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release; cmake --build build)")
endif()
load_cache("${_tree}" READ_WITH_PREFIX _tree_ CMAKE_HOME_DIRECTORY CMAKE_BUILD_TYPE CAD_SANITIZE CAD_FUZZ
           CAD_ENABLE_CUDA CMAKE_CUDA_ARCHITECTURES CUDA_CUDART)
file(REAL_PATH "${_tree_CMAKE_HOME_DIRECTORY}" _tree_source)
file(REAL_PATH "${CMAKE_SOURCE_DIR}" _this_source)
if(NOT _tree_source STREQUAL _this_source)
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: that tree was configured from ${_tree_source}, not from "
                      "this source tree (${_this_source})")
endif()
if(_tree_CAD_SANITIZE OR _tree_CAD_FUZZ)
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: a sanitizer or fuzzing build (CAD_SANITIZE="
                      "'${_tree_CAD_SANITIZE}', CAD_FUZZ=${_tree_CAD_FUZZ}) cannot be loaded into a plain Python")
endif()
if(NOT _tree_CMAKE_BUILD_TYPE STREQUAL "Release")
  message(WARNING "CAD_PACKAGE_FROM_BUILD=${_tree}: CMAKE_BUILD_TYPE is '${_tree_CMAKE_BUILD_TYPE}', not Release")
endif()
set(_manifest "${_tree}/cad_package_plugins.txt")
if(NOT EXISTS "${_manifest}")
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: no cad_package_plugins.txt (the tree was configured before "
                      "it was written): configure it again (cmake ${_tree}) and build it")
endif()
file(STRINGS "${_manifest}" _plugins)
set(_missing "")
foreach(file libcad_host.so ${_plugins})
  if(file STREQUAL "libcad_host.so")
    set(_path "${_tree}/lib/${file}")
  else()
    set(_path "${_tree}/lib/cad/plugins/${file}")
  endif()
  if(NOT EXISTS "${_path}")
    list(APPEND _missing "${_path}")
  endif()
endforeach()
if(_missing)
  list(JOIN _missing "\n  " _missing)
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: not built yet:\n  ${_missing}\n"
                      "build them first (cmake --build ${_tree})")
endif()

set(_staging "${CMAKE_BINARY_DIR}/from_build")
file(REMOVE_RECURSE "${_staging}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${_tree}" --prefix "${_staging}" --config Release
                RESULT_VARIABLE _status OUTPUT_QUIET)
if(NOT _status EQUAL 0)
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: `cmake --install ${_tree}` failed (${_status})")
endif()
# The staging prefix has what the tree's install rules give (lib/, or lib64/ where GNUInstallDirs says so).
file(GLOB _host "${_staging}/lib*/libcad_host.so")
if(NOT _host)
  message(FATAL_ERROR "CAD_PACKAGE_FROM_BUILD=${_tree}: `cmake --install` gave no libcad_host.so in ${_staging}")
endif()
get_filename_component(_staged_lib "${_host}" DIRECTORY)
file(REAL_PATH "${_host}" _host)
install(FILES "${_host}" DESTINATION lib RENAME libcad_host.so)
foreach(file ${_plugins})
  install(FILES "${_staged_lib}/cad/plugins/${file}" DESTINATION lib/cad/plugins)
endforeach()
list(LENGTH _plugins _count)
message(STATUS "cad package from ${_tree}: libcad_host and ${_count} plugins (CAD_ENABLE_CUDA=${_tree_CAD_ENABLE_CUDA}"
               ", CMAKE_CUDA_ARCHITECTURES=${_tree_CMAKE_CUDA_ARCHITECTURES})")
include(${CMAKE_CURRENT_LIST_DIR}/CadPackage.cmake)
set(_cuda_dir "")
if(_tree_CUDA_CUDART)
  get_filename_component(_cuda_dir "${_tree_CUDA_CUDART}" DIRECTORY)
endif()
cad_package_bundle_runtime(lib ${_cuda_dir})
