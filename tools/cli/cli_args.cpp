// cli_args.cpp -- see cli_args.h.
#include "cli_args.h"

#include <cerrno>
#include <cstdlib>

namespace cad::cli {

Args::Args(int argc, char** argv, const std::set<std::string>& valued, const std::set<std::string>& flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h") arg = "--help";
    if (arg.size() < 2 || arg.compare(0, 2, "--") != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string value;
    const size_t eq = arg.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    if (arg == "--help" || flags.count(arg) != 0) {
      if (inline_value) throw UsageError("option " + arg + " takes no value");
      values_[arg] = "";
    } else if (valued.count(arg) != 0) {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("option " + arg + " needs a value");
        value = argv[++i];
      }
      values_[arg] = value;
    } else {
      throw UsageError("unknown option " + arg);
    }
  }
}

bool Args::has(const std::string& option) const { return values_.count(option) != 0; }

std::string Args::get(const std::string& option, const std::string& fallback) const {
  const auto it = values_.find(option);
  return it != values_.end() ? it->second : fallback;
}

int64_t Args::get_int(const std::string& option, int64_t fallback, int64_t min_value, int64_t max_value) const {
  const auto it = values_.find(option);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  const bool parsed = !text.empty() && end != nullptr && *end == '\0' && errno == 0;
  if (!parsed || value < min_value || value > max_value) {
    throw UsageError(option + ": expected an integer in [" + std::to_string(min_value) + ", " +
                     std::to_string(max_value) + "], got '" + text + "'");
  }
  return value;
}

}  // namespace cad::cli
