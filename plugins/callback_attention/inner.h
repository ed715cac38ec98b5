// inner.h -- the attention instance a callback_attention instance may hand one direction to (config keys
// "inner" and "inner_runs"): e.g. forward by the project's kernel, backward by the registered callbacks. One
// instance then serves both directions, so CAD keeps one server backend, one plan and one set of checks.
#pragma once

#include <optional>
#include <string>

#include "cad_attention_v1.h"
#include "plugin_support.h"

namespace cad::callback_attention {

enum class Direction { Forward, Backward };
const char* direction_name(Direction d);

// An instance the host created before this one (borrowed through lookup_plugin: it outlives us, the host
// destroys instances in reverse creation order).
struct Inner {
  const cad_attention_v1_t* table = nullptr;
  void* instance = nullptr;
  std::string name;
  Direction runs = Direction::Forward;
  cad_attention_capabilities_v1_t caps{};
  bool has_plans() const;
  std::string last_error() const;
};

// The inner instance the config names, or nullopt when it names none. "inner" (an attention instance's name)
// and "inner_runs" ("forward" or "backward") come together; anything else fails naming the key.
std::optional<Inner> read_inner(cad::plugin::ConfigReader& config, const cad_host_services_v1_t* services);

// What an instance accepts when `inner` runs one direction and the callbacks (capabilities `callbacks`, with or
// without a backward) the other: the calls both accept, so every call is checked once against both. Fails
// (INVALID_CONFIG) where they share no device, dtype or head dim, naming both.
cad_attention_capabilities_v1_t combined(const cad_attention_capabilities_v1_t& callbacks, bool callbacks_backward,
                                         const Inner& inner, const std::string& key);

}  // namespace cad::callback_attention
