// demo_stack.h -- reading a stack config as `cad demo` needs it: whether its attention instance is a
// CAD instance (its config names a balancer instance), and the same config with that balancer
// instance's plugin swapped, so that one config yields one stack per balancer under comparison.
#pragma once

#include <optional>
#include <string>

namespace cad::demo {

struct CadStack {
  std::string config_text;      // the config file as read
  std::string attention;        // the instance the config's "attention" key names
  std::string balancer;         // the balancer instance named by that instance's config
  std::string balancer_plugin;  // ... and its plugin in the file
  std::string communicator;     // the communicator instance named by that instance's config
};

// The CAD stack of the config file at `path`; nullopt when its attention instance's config names no
// balancer (a local stack), or when the file is not readable JSON of the expected shape (the host then
// reports what is wrong, with the key, when it builds the stack).
std::optional<CadStack> read_cad_stack(const std::string& path);

// The config text with the balancer instance's "plugin" set to `plugin`. Its "config" object is kept
// when `plugin` is the configured one, and emptied otherwise (keys of one balancer mean nothing to
// another).
std::string with_balancer(const CadStack& stack, const std::string& plugin);

}  // namespace cad::demo
