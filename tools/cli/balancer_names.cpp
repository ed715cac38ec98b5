// balancer_names.cpp -- see balancer_names.h.
#include "balancer_names.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

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
    // A valid name whose plugin file is missing (not built, or another search path): where it was looked for is
    // the news, not a suggestion of the name itself.
    if (std::find(valid.begin(), valid.end(), name) != valid.end()) {
      throw UsageError(option + ": balancer '" + name + "' is a known name but its plugin was not found: " +
                       e.what());
    }
    throw UsageError(option + ": unknown balancer '" + name + "'" + keys::did_you_mean(name, valid) + hint);
  }
}

double parse_tolerance(const std::string& tolerance) {
  char* end = nullptr;
  const double value = std::strtod(tolerance.c_str(), &end);
  if (end == tolerance.c_str() || *end != '\0' || !(value >= 0 && value <= 10)) {
    throw UsageError("--tolerance: expected a number in [0, 10], got '" + tolerance + "'");
  }
  return value;
}

std::string balancer_config(const std::string& name, const std::string& base, const std::string& tolerance,
                            const std::string& rate_table) {
  const std::string stem = std::filesystem::path(name).stem().string();
  const bool prefix_aware = stem.find("prefix_aware") != std::string::npos;
  const bool set_tolerance = !tolerance.empty() && (prefix_aware || stem.find("distca") != std::string::npos);
  const bool set_rates = !rate_table.empty() && prefix_aware;
  if (!set_tolerance && !set_rates) return base;
  nlohmann::json c = nlohmann::json::parse(base, nullptr, false);
  if (c.is_discarded() || !c.is_object()) throw UsageError("--config is not a JSON object");
  if (set_tolerance) c["tolerance"] = parse_tolerance(tolerance);
  if (set_rates) c["rate_table"] = rate_table;
  return c.dump();
}

}  // namespace cad::cli
