// cli_args.h -- the little argument parsing the `cad` subcommands share: "--name value" and
// "--name=value" options, flags, and positional arguments, with usage errors as exceptions.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace cad::cli {

// A wrong command line; main programs print "cad <cmd>: <what>" and exit 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // `valued`: options that take a value (e.g. "--tokens"); `flags`: options that don't (e.g. "--json").
  // "--help"/"-h" is always a flag. Throws UsageError on an unknown option or a missing value.
  Args(int argc, char** argv, const std::set<std::string>& valued, const std::set<std::string>& flags);

  bool help() const { return has("--help"); }
  bool has(const std::string& option) const;
  std::string get(const std::string& option, const std::string& fallback) const;
  // Integer option within [min_value, max_value]; UsageError naming the option otherwise.
  int64_t get_int(const std::string& option, int64_t fallback, int64_t min_value, int64_t max_value) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace cad::cli
