// plugin_paths.h -- where the build put the balancer plugins (compile definitions from CMake).
#pragma once

#include <string>
#include <vector>

namespace cad::balancer_test {

inline std::string plugin_path(const std::string& name) { return std::string(CAD_BALANCER_PLUGIN_DIR) + "/cad_" + name + ".so"; }

inline const std::vector<std::string>& all_balancers() {
  static const std::vector<std::string> names = {"colocated", "per_doc_cp", "distca", "prefix_aware"};
  return names;
}

}  // namespace cad::balancer_test
