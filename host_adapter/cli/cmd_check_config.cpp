// cmd_check_config.cpp -- `cad check-config FILE`: validates a stack config, loads its plugins, creates
// and destroys its instances, and says what it built (or the one-line reason it could not).
#include <cstdio>
#include <string>

#include "cad_host.h"
#include "cli_args.h"
#include "command.h"

namespace {

const char* kUsage =
    "usage: cad check-config FILE [--path DIRS]\n\n"
    "Validates the stack config FILE (see configs/README.md), loads every plugin it names, creates\n"
    "every instance in order and destroys them again. Prints the instances; exit status 1 with the\n"
    "reason on stderr if any step fails.\n\n"
    "  --path DIRS  directories searched for plugins first (colon-separated)\n";

int run_check_config(int argc, char** argv) {
  const cad::cli::Args args(argc, argv, {"--path"}, {});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.positional().size() != 1) throw cad::cli::UsageError("expected exactly one config FILE");
  const std::string file = args.positional()[0];
  const std::string search_path = args.get("--path", "");

  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_path = file.c_str();
  options.search_path = search_path.empty() ? nullptr : search_path.c_str();
  char error[4096] = {0};
  cad_host_t* host = nullptr;
  const cad_status_t status = cad_host_create(&options, &host, error, sizeof error);
  if (status != CAD_STATUS_OK) {
    std::fprintf(stderr, "cad check-config: %s [%s]\n", error, cad_status_name(status));
    return 1;
  }
  const int64_t count = cad_host_num_instances(host);
  std::printf("%s: OK, %lld instance(s)\n", file.c_str(), static_cast<long long>(count));
  for (int64_t i = 0; i < count; ++i) {
    cad_host_instance_info_v1_t info{};
    info.struct_size = sizeof info;
    if (cad_host_instance_info(host, i, &info) != CAD_STATUS_OK) continue;
    std::printf("  %-16s %-12s %s %s  %s\n", info.name, cad_plugin_kind_name(info.plugin->kind), info.plugin->name,
                info.plugin->version != nullptr ? info.plugin->version : "", info.path);
  }
  const cad_attention_v1_t* attention = nullptr;
  void* instance = nullptr;
  if (cad_host_attention(host, &attention, &instance) == CAD_STATUS_OK) {
    for (int64_t i = 0; i < count; ++i) {
      cad_host_instance_info_v1_t info{};
      info.struct_size = sizeof info;
      if (cad_host_instance_info(host, i, &info) == CAD_STATUS_OK && info.instance == instance) {
        std::printf("  attention: %s\n", info.name);
      }
    }
  }
  cad_host_destroy(host);
  return 0;
}

}  // namespace

CAD_REGISTER_COMMAND_IN_CHILD(check_config, "check-config",
                     "validate a stack config: load its plugins, create and destroy its instances", run_check_config);
