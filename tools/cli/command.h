// command.h -- how a `cad` subcommand plugs into the command-line tool. Each subcommand lives in its
// own cli/cmd_<name>.cpp and registers itself with a file-scope CAD_REGISTER_COMMAND; main() looks
// commands up by name. Every command must handle --help (print usage to stdout, return 0) and report
// bad arguments on stderr with a non-zero exit code (2 for usage errors).
#pragma once

#include <string>
#include <vector>

namespace cad::cli {

struct Command {
  const char* name;     // e.g. "plans"
  const char* summary;  // one line for `cad --help`
  // argv[0] is the subcommand's name; returns the process exit code.
  int (*run)(int argc, char** argv);
  // Runs plugin code whose outcome is the command's verdict (check-config, conformance): main() runs
  // it in a child process (verdict_child.h), so a plugin ending the process cannot fake a result.
  bool in_child;
};

// All registered commands, sorted by name.
std::vector<Command>& registry();

// main() turns an exit() called while a command runs (by a plugin) into status 3 with a message. A
// child process that must exit() with its own status (the plugin probe) calls this first.
void forget_running_command();

struct Registrar {
  explicit Registrar(const Command& command) { registry().push_back(command); }
};

}  // namespace cad::cli

#define CAD_REGISTER_COMMAND(var, name, summary, fn) \
  static ::cad::cli::Registrar var##_registrar(::cad::cli::Command{name, summary, fn, false})
#define CAD_REGISTER_COMMAND_IN_CHILD(var, name, summary, fn) \
  static ::cad::cli::Registrar var##_registrar(::cad::cli::Command{name, summary, fn, true})
