// cad_main.cpp -- the `cad` command: looks the subcommand up in the registry every cli/cmd_*.cpp adds
// itself to (see command.h) and runs it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "cad_common_v1.h"
#include "cli_args.h"
#include "command.h"
#include "verdict_child.h"

namespace cad::cli {

std::vector<Command>& registry() {
  static std::vector<Command> commands;  // filled by static registrars before main()
  return commands;
}

}  // namespace cad::cli

namespace {

void print_usage(std::FILE* out) {
  auto& commands = cad::cli::registry();
  std::sort(commands.begin(), commands.end(),
            [](const cad::cli::Command& a, const cad::cli::Command& b) { return std::strcmp(a.name, b.name) < 0; });
  std::fprintf(out,
               "usage: cad <command> [options]   (cad <command> --help for the command's options)\n"
               "       cad --version                 (the project and plugin ABI versions)\n\n"
               "Core attention disaggregation: load, inspect and run CAD plugins.\n\ncommands:\n");
  size_t width = 0;
  for (const auto& c : commands) width = std::max(width, std::strlen(c.name));
  for (const auto& c : commands) std::fprintf(out, "  %-*s  %s\n", static_cast<int>(width), c.name, c.summary);
}

// A plugin that calls exit() (in a static initialiser, an entry or any ABI function) would end a
// command with its status -- exit(0) made `cad check-config` and `cad conformance` report success with
// no output. Until the command has returned, an exit() is reported and turned into status 3.
const char* g_running_command = nullptr;

void report_exit_inside_command() {
  if (g_running_command == nullptr) return;
  std::fprintf(stderr, "cad %s: the process was ended by a call to exit() before the command finished (a plugin "
                       "called exit() while loading or in an ABI function); failing with status 3\n",
               g_running_command);
  std::fflush(stderr);
  _Exit(3);
}

// Runs one command with the error handling every command shares; returns its exit status.
int run_command(const cad::cli::Command& command, int argc, char** argv) {
  int status = 1;
  g_running_command = command.name;
  try {
    status = command.run(argc - 1, argv + 1);
  } catch (const cad::cli::UsageError& e) {
    std::fprintf(stderr, "cad %s: %s (see cad %s --help)\n", command.name, e.what(), command.name);
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad %s: %s\n", command.name, e.what());
    status = 1;
  } catch (...) {
    // Only a plugin throws something that is not a std::exception through its C ABI.
    std::fprintf(stderr, "cad %s: a plugin let a non-standard C++ exception escape through its C ABI\n",
                 command.name);
    status = 1;
  }
  g_running_command = nullptr;
  return status;
}

}  // namespace

namespace cad::cli {
void forget_running_command() { g_running_command = nullptr; }
}  // namespace cad::cli

int main(int argc, char** argv) {
  std::atexit(report_exit_inside_command);
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version") {
    // The ABI version is the one this host was built for: a plugin of another major is refused.
    std::printf("cad %s (plugin ABI %d.%d)\n", CAD_PROJECT_VERSION, CAD_ABI_VERSION_MAJOR, CAD_ABI_VERSION_MINOR);
    return 0;
  }
  for (const auto& command : cad::cli::registry()) {
    if (name != command.name) continue;
    if (!command.in_child) return run_command(command, argc, argv);
    return cad::cli::run_with_verdict(command.name, [&] { return run_command(command, argc, argv); });
  }
  std::fprintf(stderr, "cad: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}
