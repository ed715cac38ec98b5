// cmd_check_config.cpp -- `cad check-config FILE`: validates a stack config, loads its plugins, creates
// and destroys its instances, and says what it built (or the one-line reason it could not).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cad_host.h"
#include "cli_args.h"
#include "command.h"

namespace {

const char* kUsage =
    "usage: cad check-config FILE [--path DIRS] [--strict]\n\n"
    "Validates the stack config FILE (see configs/README.md), loads every plugin it names, creates\n"
    "every instance in order and destroys them again. Prints the instances; exit status 1 with the\n"
    "reason on stderr if any step fails. A key that neither the host nor the plugin knows is warned\n"
    "about and ignored, with the nearest known key (\"did you mean 'timeout_ms'?\").\n\n"
    "  --path DIRS  directories searched for plugins first (colon-separated)\n"
    "  --strict     unknown keys are errors: exit status 1 after listing them (for CI). Warnings are\n"
    "               then logged even if CAD_LOG_LEVEL or the config's log_level asks for less\n";

// Every log line goes to stderr as the host's default logger would print it; --strict also needs to
// see the unknown-key warnings, which the host and the plugins only log (an unknown key is not an
// error at create: a newer config must still load on an older plugin).
struct LogCapture {
  std::vector<std::string> unknown_keys;
};

void log_line(void* user, cad_log_level_t level, const char* source, const char* message) {
  static const char* const names[] = {"trace", "debug", "info", "warn", "error", "off"};
  const char* name = level >= CAD_LOG_TRACE && level <= CAD_LOG_OFF ? names[level] : "?";
  std::fprintf(stderr, "[%s] [%s] %s\n", name, source, message);
  if (level == CAD_LOG_WARN && std::strstr(message, "unknown key '") != nullptr) {
    static_cast<LogCapture*>(user)->unknown_keys.push_back(std::string("[") + source + "] " + message);
  }
}

// --strict must see warnings: a level above warn (from CAD_LOG_LEVEL, which overrides the config) is
// lowered to warn. Without CAD_LOG_LEVEL the config's log_level could still be "error"; the
// environment then pins warn, which only hides info lines the config would have shown.
void log_at_least_warnings() {
  const char* env = std::getenv("CAD_LOG_LEVEL");
  cad_log_level_t level = CAD_LOG_INFO;
  if (env != nullptr && cad_log_level_from_name(env, &level) == 0 && level <= CAD_LOG_WARN) return;
  ::setenv("CAD_LOG_LEVEL", "warn", 1);
}

int run_check_config(int argc, char** argv) {
  const cad::cli::Args args(argc, argv, {"--path"}, {"--strict"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.positional().size() != 1) throw cad::cli::UsageError("expected exactly one config FILE");
  const std::string file = args.positional()[0];
  const std::string search_path = args.get("--path", "");
  const bool strict = args.has("--strict");
  if (strict) log_at_least_warnings();
  LogCapture captured;

  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_path = file.c_str();
  options.search_path = search_path.empty() ? nullptr : search_path.c_str();
  options.log_callback = &log_line;
  options.log_user = &captured;
  char error[4096] = {0};
  cad_host_t* host = nullptr;
  const cad_status_t status = cad_host_create(&options, &host, error, sizeof error);
  if (status != CAD_STATUS_OK) {
    std::fprintf(stderr, "cad check-config: %s [%s]\n", error, cad_status_name(status));
    return 1;
  }
  const int64_t count = cad_host_num_instances(host);
  // Every unknown-key warning was logged by create (host config first, then each plugin's).
  const bool refused = strict && !captured.unknown_keys.empty();
  std::printf("%s: %s, %lld instance(s)\n", file.c_str(), refused ? "FAILED (--strict: unknown keys)" : "OK",
              static_cast<long long>(count));
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
  if (refused) {
    std::fprintf(stderr, "cad check-config: --strict: %s has %zu unknown key(s):\n", file.c_str(),
                 captured.unknown_keys.size());
    for (const auto& line : captured.unknown_keys) std::fprintf(stderr, "  %s\n", line.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CAD_REGISTER_COMMAND_IN_CHILD(check_config, "check-config",
                     "validate a stack config: load its plugins, create and destroy its instances", run_check_config);
