// balancer_names.h -- the balancer names `cad plan --balancer` and `cad simulate --balancers` accept. A
// misspelt name ("prefix-aware") used to end in the loader's "cad_prefix-aware.so not found in <dirs>",
// which does not say what the names are; this check says it, with the nearest one, before any work.
#pragma once

#include <string>
#include <vector>

namespace cad::cli {

// The in-tree balancer plugins, in the order `--balancer all` runs them.
const std::vector<std::string>& builtin_balancers();

// Throws UsageError naming `option` when `name` is a plugin name (not a path) that no plugin file on
// `search_path` (colon-separated; then $CAD_PLUGIN_PATH and the build/install dirs) carries, or when the
// plugin found is not a balancer. The message lists the valid names and the nearest one. `extra` are
// names the option also takes (e.g. "all"). A path is left to the loader, whose message names the file.
void require_balancer(const std::string& option, const std::string& name, const std::string& search_path,
                      const std::vector<std::string>& extra = {});

// The --tolerance text as a number; UsageError unless it is a number in [0, 10].
double parse_tolerance(const std::string& tolerance);

// The config `cad plan` and `cad simulate` give balancer `name` (a plugin name or path, matched by its file
// stem): `base` (a JSON object) with "tolerance" = `tolerance` (the --tolerance text; empty: left alone) for
// distca and prefix_aware, and "rate_table" = `rate_table` (empty: left alone) for prefix_aware. Throws
// UsageError when `base` is not a JSON object or `tolerance` is not a number in [0, 10].
std::string balancer_config(const std::string& name, const std::string& base, const std::string& tolerance,
                            const std::string& rate_table);

}  // namespace cad::cli
