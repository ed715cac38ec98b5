// host_config.h -- the stack config a host is built from, parsed and validated. Format (see
// configs/README.md):
//   {"log_level": "info", "plugin_path": ["dir", ...], "instances": [{"name": "...", "plugin": "...",
//    "config": {...}}, ...], "attention": "<instance name>"}
#pragma once

#include <string>
#include <vector>

#include "cad_common_v1.h"

namespace cad::host {

struct InstanceConfig {
  std::string name;
  std::string plugin;       // a plugin name or a path (relative paths: against the config's directory)
  std::string config_json;  // the instance's "config" object, serialised ("{}" if absent)
};

struct HostConfig {
  std::string source;                    // names the config in messages: its file, or "config"
  bool has_log_level = false;
  cad_log_level_t log_level = CAD_LOG_INFO;
  std::vector<std::string> plugin_path;  // directories, already resolved against the config's directory
  std::vector<InstanceConfig> instances;
  std::string attention;                 // "" if the config names none
  std::vector<std::string> warnings;     // unknown keys, to be logged once logging is set up
};

// Parses `text`. `source` names it in every message; relative paths resolve against `base_dir`.
// Throws HostError(INVALID_CONFIG) naming the source, the key path (e.g. instances[2].plugin) and
// what was expected.
HostConfig parse_host_config(const std::string& text, const std::string& source, const std::string& base_dir);

// Reads and parses a config file (NOT_FOUND if it cannot be read).
HostConfig load_host_config_file(const std::string& path);

}  // namespace cad::host
