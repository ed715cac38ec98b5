// library.h -- one loaded plugin shared object (the struct behind cad_library_t) and the C++ calls
// the rest of the host library uses to open and close one.
#pragma once

#include <ltdl.h>

#include <memory>
#include <string>
#include <vector>

#include "cad_host.h"

struct cad_library {
  lt_dlhandle handle = nullptr;
  std::string path;  // canonical absolute path
  const cad_plugin_v1_t* plugin = nullptr;
};

namespace cad::host {

// Finds (see search_path.h) and loads one plugin, with every check of cad_library_open. Throws
// HostError with a one-line message that starts with "plugin <file>: ".
cad_library* open_library(const std::string& name_or_path, const std::vector<std::string>& search_dirs);
void close_library(cad_library* library) noexcept;

struct LibraryCloser {
  void operator()(cad_library* library) const noexcept { close_library(library); }
};
using LibraryPtr = std::unique_ptr<cad_library, LibraryCloser>;

}  // namespace cad::host
