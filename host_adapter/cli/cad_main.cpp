// cad_main.cpp -- the `cad` command: looks the subcommand up in the registry every cli/cmd_*.cpp adds
// itself to (see command.h) and runs it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli_args.h"
#include "command.h"

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
               "usage: cad <command> [options]   (cad <command> --help for the command's options)\n\n"
               "Core attention disaggregation: load, inspect and run CAD plugins.\n\ncommands:\n");
  size_t width = 0;
  for (const auto& c : commands) width = std::max(width, std::strlen(c.name));
  for (const auto& c : commands) std::fprintf(out, "  %-*s  %s\n", static_cast<int>(width), c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  for (const auto& command : cad::cli::registry()) {
    if (name != command.name) continue;
    try {
      return command.run(argc - 1, argv + 1);
    } catch (const cad::cli::UsageError& e) {
      std::fprintf(stderr, "cad %s: %s (see cad %s --help)\n", command.name, e.what(), command.name);
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cad %s: %s\n", command.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "cad: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}
