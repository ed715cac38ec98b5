// plugin_probe.h -- opening a plugin file in a child process first, so that a plugin whose static
// initialiser or entry function crashes, hangs, calls exit() or throws is reported as broken (with the
// signal, exit status or timeout) instead of taking the `cad` command down or ending it with a false
// success. Used by `cad plugins` (which then reports only what the child saw) and `cad conformance`
// (which then loads the plugin in process for the kit).
#pragma once

#include <string>

namespace cad::cli {

struct ProbeResult {
  std::string error;  // empty if the plugin loaded and its table was read
  std::string kind, name, abi, version, description;
};

// Forks; the child opens `path` with cad_library_open and sends back what it read; the parent waits at
// most `timeout_ms` (default: $CAD_PLUGIN_PROBE_TIMEOUT_MS, else 10000), then kills the child. Never
// throws for a hostile plugin.
ProbeResult probe_plugin(const std::string& path, int timeout_ms = 0);

}  // namespace cad::cli
