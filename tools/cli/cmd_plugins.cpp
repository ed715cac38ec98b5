// cmd_plugins.cpp -- `cad plugins`: every plugin file on the search path, opened and described, with
// broken files listed alongside their one-line reason.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cad_host.h"
#include "cli_args.h"
#include "command.h"
#include "plugin_probe.h"

namespace {

const char* kUsage =
    "usage: cad plugins [--path DIRS] [--json]\n\n"
    "Lists every plugin file (cad_*.so) found in DIRS (colon-separated), $CAD_PLUGIN_PATH and the\n"
    "build/install plugin directories: kind, name, plugin ABI version, plugin version, description\n"
    "and path. Files that cannot be loaded are listed with the reason. Each file is opened in a child\n"
    "process first, so a plugin that crashes, hangs (10 s), calls exit() or throws while loading is\n"
    "listed as broken with the signal, exit status or timeout.\n\n"
    "  --path DIRS  directories searched first\n"
    "  --json       one JSON array instead of a table\n";

// What the probe (a child process) saw: a hostile plugin cannot crash or hang this listing.
struct Entry : cad::cli::ProbeResult {
  std::string path;
};

Entry describe(const std::string& path) {
  Entry entry;
  static_cast<cad::cli::ProbeResult&>(entry) = cad::cli::probe_plugin(path);
  entry.path = path;
  return entry;
}

void print_table(const std::vector<Entry>& entries) {
  std::printf("%-12s %-16s %-5s %-10s %s\n", "KIND", "NAME", "ABI", "VERSION", "DESCRIPTION / PATH");
  for (const auto& e : entries) {
    if (!e.error.empty()) {
      std::printf("%-12s %s\n", "(broken)", e.error.c_str());
      continue;
    }
    std::printf("%-12s %-16s %-5s %-10s %s\n%13s%s\n", e.kind.c_str(), e.name.c_str(), e.abi.c_str(),
                e.version.c_str(), e.description.c_str(), "", e.path.c_str());
  }
}

void print_json(const std::vector<Entry>& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : entries) {
    if (!e.error.empty()) {
      out.push_back({{"path", e.path}, {"ok", false}, {"error", e.error}});
    } else {
      out.push_back({{"path", e.path}, {"ok", true}, {"kind", e.kind}, {"name", e.name}, {"abi", e.abi},
                     {"version", e.version}, {"description", e.description}});
    }
  }
  // Plugin text need not be UTF-8: replace invalid bytes rather than fail the whole listing.
  std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

int run_plugins(int argc, char** argv) {
  const cad::cli::Args args(argc, argv, {"--path"}, {"--json"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.positional().empty()) throw cad::cli::UsageError("unexpected argument '" + args.positional()[0] + "'");
  const std::string search_path = args.get("--path", "");
  char error[2048] = {0};
  char* joined = nullptr;
  if (cad_list_plugin_files(search_path.empty() ? nullptr : search_path.c_str(), &joined, error, sizeof error) !=
      CAD_STATUS_OK) {
    std::fprintf(stderr, "cad plugins: %s\n", error);
    return 1;
  }
  std::vector<Entry> entries;
  std::string paths = joined;
  cad_string_free(joined);
  size_t start = 0;
  while (start < paths.size()) {
    size_t end = paths.find('\n', start);
    if (end == std::string::npos) end = paths.size();
    entries.push_back(describe(paths.substr(start, end - start)));
    start = end + 1;
  }
  if (args.has("--json")) {
    print_json(entries);
  } else if (entries.empty()) {
    std::printf("no plugin files found (add directories with --path or $CAD_PLUGIN_PATH)\n");
  } else {
    print_table(entries);
  }
  return 0;
}

}  // namespace

CAD_REGISTER_COMMAND(plugins, "plugins", "list the plugin files found, with kind, name, versions (or why broken)",
                     run_plugins);
