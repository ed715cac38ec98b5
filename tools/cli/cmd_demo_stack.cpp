// cmd_demo_stack.cpp -- see demo_stack.h.
#include "demo_stack.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bounded_file.h"
#include "cad_host.hpp"

namespace cad::demo {
namespace {

using nlohmann::json;

// The instance object called `name`, or nullptr.
json* find_instance(json& root, const std::string& name) {
  if (!root.contains("instances") || !root["instances"].is_array()) return nullptr;
  for (json& entry : root["instances"]) {
    if (entry.is_object() && entry.value("name", std::string()) == name) return &entry;
  }
  return nullptr;
}

std::string string_key(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_string()) return "";
  return object[key].get<std::string>();
}

}  // namespace

std::optional<CadStack> read_cad_stack(const std::string& path) {
  std::string text, error;  // a regular file of at most 16 MiB (bounded_file.h); the host reports why not
  if (files::read_regular_file(path, files::kMaxJsonFileBytes, "--config", &text, &error) != files::ReadStatus::kOk) {
    return std::nullopt;
  }
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return std::nullopt;

  CadStack stack;
  stack.config_text = text;
  stack.attention = string_key(root, "attention");
  const json* attention = stack.attention.empty() ? nullptr : find_instance(root, stack.attention);
  if (attention == nullptr || !attention->contains("config")) return std::nullopt;
  stack.balancer = string_key((*attention)["config"], "balancer");
  stack.communicator = string_key((*attention)["config"], "communicator");
  const json* balancer = stack.balancer.empty() ? nullptr : find_instance(root, stack.balancer);
  if (balancer == nullptr) return std::nullopt;
  stack.balancer_plugin = string_key(*balancer, "plugin");
  return stack;
}

std::string with_balancer(const CadStack& stack, const std::string& plugin) {
  json root = json::parse(stack.config_text);
  json* balancer = find_instance(root, stack.balancer);
  if (balancer == nullptr) {
    throw cad::Error(CAD_STATUS_INVALID_CONFIG, "the config has no instance named '" + stack.balancer + "'");
  }
  if (plugin != stack.balancer_plugin) (*balancer)["config"] = json::object();
  (*balancer)["plugin"] = plugin;
  return root.dump();
}

}  // namespace cad::demo
