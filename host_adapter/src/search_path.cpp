// search_path.cpp -- see search_path.h.
#include "search_path.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <system_error>

#include "host_error.h"

namespace fs = std::filesystem;

namespace cad::host {
namespace {

// Any symbol of this library: dladdr() on it tells where libcad_host.so itself was loaded from, so a
// relocated build or install still finds its plugins in <libdir>/cad/plugins.
void locate_this_library() {}

std::string plugin_dir_next_to_this_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&locate_this_library), &info) == 0 || info.dli_fname == nullptr) return "";
  std::error_code ec;
  const fs::path library = fs::canonical(info.dli_fname, ec);
  if (ec) return "";
  return (library.parent_path() / "cad" / "plugins").string();
}

std::vector<std::string> builtin_plugin_dirs() {
  std::vector<std::string> dirs;
  const std::string relative = plugin_dir_next_to_this_library();
  if (!relative.empty()) dirs.push_back(relative);
#ifdef CAD_BUILD_PLUGIN_DIR
  dirs.push_back(CAD_BUILD_PLUGIN_DIR);
#endif
#ifdef CAD_INSTALL_PLUGIN_DIR
  dirs.push_back(CAD_INSTALL_PLUGIN_DIR);
#endif
  return dirs;
}

bool is_plugin_file_name(const std::string& name) {
  return name.size() > 7 && name.compare(0, 4, "cad_") == 0 && name.compare(name.size() - 3, 3, ".so") == 0;
}

}  // namespace

std::vector<std::string> split_path_list(const char* list) {
  std::vector<std::string> out;
  if (list == nullptr) return out;
  std::string current;
  for (const char* p = list;; ++p) {
    if (*p == ':' || *p == '\0') {
      if (!current.empty()) out.push_back(current);
      current.clear();
      if (*p == '\0') break;
    } else {
      current += *p;
    }
  }
  return out;
}

std::vector<std::string> plugin_search_dirs(const std::vector<std::string>& first) {
  std::vector<std::string> all = first;
  for (const auto& d : split_path_list(std::getenv("CAD_PLUGIN_PATH"))) all.push_back(d);
  for (const auto& d : builtin_plugin_dirs()) all.push_back(d);
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (const auto& d : all) {
    const std::string key = fs::path(d).lexically_normal().string();
    if (seen.insert(key).second) unique.push_back(d);
  }
  return unique;
}

bool looks_like_path(const std::string& name_or_path) {
  const bool ends_in_so = name_or_path.size() >= 3 && name_or_path.compare(name_or_path.size() - 3, 3, ".so") == 0;
  return ends_in_so || name_or_path.find('/') != std::string::npos;
}

std::string canonical_or_absolute(const std::string& path) {
  std::error_code ec;
  fs::path resolved = fs::canonical(path, ec);
  if (ec) resolved = fs::absolute(path, ec);
  return ec ? path : resolved.string();
}

std::string resolve_plugin_file(const std::string& name_or_path, const std::vector<std::string>& dirs) {
  if (name_or_path.empty()) raise(CAD_STATUS_INVALID_ARGUMENT, "plugin name is empty");
  if (looks_like_path(name_or_path)) return name_or_path;
  const std::string file = "cad_" + name_or_path + ".so";
  for (const auto& dir : dirs) {
    std::error_code ec;
    const fs::path candidate = fs::path(dir) / file;
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
  }
  std::string searched;
  for (const auto& dir : dirs) searched += (searched.empty() ? "" : ":") + dir;
  raise(CAD_STATUS_NOT_FOUND, "plugin '" + name_or_path + "': " + file + " not found in " +
                                  (searched.empty() ? "(no directories)" : searched) +
                                  " (set CAD_PLUGIN_PATH or the config's plugin_path)");
}

std::vector<std::string> list_plugin_files(const std::vector<std::string>& dirs) {
  struct Found {
    std::string file_name;
    size_t dir_index;
    std::string path;
  };
  std::vector<Found> found;
  std::set<std::string> seen;  // canonical paths
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::error_code ec;
    fs::directory_iterator it(dirs[i], ec);
    if (ec) continue;  // a missing directory on a search path is normal
    for (const auto& entry : it) {
      const std::string name = entry.path().filename().string();
      std::error_code file_ec;
      if (!is_plugin_file_name(name) || !entry.is_regular_file(file_ec)) continue;
      const std::string path = canonical_or_absolute(entry.path().string());
      if (seen.insert(path).second) found.push_back({name, i, path});
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.file_name != b.file_name ? a.file_name < b.file_name : a.dir_index < b.dir_index;
  });
  std::vector<std::string> out;
  for (const auto& f : found) out.push_back(f.path);
  return out;
}

}  // namespace cad::host
