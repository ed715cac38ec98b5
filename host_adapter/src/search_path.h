// search_path.h -- where plugins are looked for: the caller's directories, $CAD_PLUGIN_PATH, then the
// plugin directory next to libcad_host.so, the build tree's and the install prefix's.
#pragma once

#include <string>
#include <vector>

namespace cad::host {

// "a:b::c" -> {"a", "b", "c"}; NULL or "" -> {}.
std::vector<std::string> split_path_list(const char* list);

// `first` (in order), then $CAD_PLUGIN_PATH, then the built-in directories; duplicates dropped.
std::vector<std::string> plugin_search_dirs(const std::vector<std::string>& first);

// True if `name_or_path` is a file path (contains '/' or ends in ".so") rather than a plugin name.
bool looks_like_path(const std::string& name_or_path);

// A plugin name -> the first existing <dir>/cad_<name>.so; a path -> itself. Throws
// HostError(NOT_FOUND) naming the file and the directories searched.
std::string resolve_plugin_file(const std::string& name_or_path, const std::vector<std::string>& dirs);

// Every cad_*.so in `dirs`, sorted by file name (then directory order), each real file once.
std::vector<std::string> list_plugin_files(const std::vector<std::string>& dirs);

// The canonical absolute path of an existing file, or `path` made absolute if it cannot be resolved.
std::string canonical_or_absolute(const std::string& path);

}  // namespace cad::host
