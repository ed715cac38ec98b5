// balancer_names.cpp -- see balancer_names.h.
#include "balancer_names.h"

#include "cad_host.hpp"
#include "cli_args.h"
#include "nearest_key.h"

namespace cad::cli {

const std::vector<std::string>& builtin_balancers() {
  static const std::vector<std::string> names = {"colocated", "per_doc_cp", "distca", "prefix_aware"};
  return names;
}

void require_balancer(const std::string& option, const std::string& name, const std::string& search_path,
                      const std::vector<std::string>& extra) {
  const bool path = name.find('/') != std::string::npos ||
                    (name.size() >= 3 && name.compare(name.size() - 3, 3, ".so") == 0);
  if (path) return;
  std::vector<std::string> valid = extra;
  valid.insert(valid.end(), builtin_balancers().begin(), builtin_balancers().end());
  std::string list;
  for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
  const std::string hint = "; valid names: " + list +
                           ", or another balancer plugin's name or .so path (`cad plugins` lists those found)";
  try {
    const cad::Library library(name, search_path.empty() ? nullptr : search_path.c_str());
    if (library.plugin().kind != CAD_PLUGIN_KIND_BALANCER) {
      throw UsageError(option + ": '" + name + "' is not a balancer plugin (its kind is " +
                       cad_plugin_kind_name(library.plugin().kind) + ")" + hint);
    }
  } catch (const cad::Error& e) {
    if (e.status() != CAD_STATUS_NOT_FOUND) throw;  // found but broken: the loader's reason is the news
    throw UsageError(option + ": unknown balancer '" + name + "'" + keys::did_you_mean(name, valid) + hint);
  }
}

}  // namespace cad::cli
