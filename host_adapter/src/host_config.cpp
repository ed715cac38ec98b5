// host_config.cpp -- see host_config.h.
#include "host_config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bounded_file.h"
#include "cad_host.h"
#include "host_error.h"
#include "json_guard.h"
#include "nearest_key.h"
#include "search_path.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace cad::host {
namespace {

// Reads one JSON value and reports problems as "<source>: <key path>: expected ..., got ...".
class Validator {
 public:
  explicit Validator(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void bad(const std::string& key, const std::string& expected, const json& got) const {
    std::string shown = got.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    raise(CAD_STATUS_INVALID_CONFIG, source_ + ": " + key + ": expected " + expected + ", got " + shown);
  }
  [[noreturn]] void bad(const std::string& key, const std::string& problem) const {
    raise(CAD_STATUS_INVALID_CONFIG, source_ + ": " + key + ": " + problem);
  }

  std::string non_empty_string(const json& value, const std::string& key) const {
    if (!value.is_string() || value.get<std::string>().empty()) bad(key, "a non-empty string", value);
    return value.get<std::string>();
  }

  void warn_unknown(const json& object, const std::set<std::string>& known, const std::string& where,
                    std::vector<std::string>* warnings) const {
    for (const auto& item : object.items()) {
      if (known.count(item.key()) == 0) {
        warnings->push_back(source_ + ": " + where + "unknown key '" + item.key() + "' ignored" +
                            keys::did_you_mean(item.key(), known));
      }
    }
  }

 private:
  std::string source_;
};

std::string resolve_against(const std::string& path, const std::string& base_dir) {
  if (base_dir.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

}  // namespace

HostConfig parse_host_config(const std::string& text, const std::string& source, const std::string& base_dir) {
  HostConfig config;
  config.source = source;
  const Validator check(source);
  json root;
  try {
    root = json_guard::parse(text, source);  // depth-limited; errors name the key path
  } catch (const json_guard::JsonInputError& e) {
    raise(CAD_STATUS_INVALID_CONFIG, e.what());
  }
  if (!root.is_object()) check.bad("(top level)", "a JSON object", root);
  check.warn_unknown(root, {"log_level", "plugin_path", "instances", "attention"}, "", &config.warnings);

  if (root.contains("log_level")) {
    const json& level = root["log_level"];
    const char* expected = "one of \"trace\", \"debug\", \"info\", \"warn\", \"error\", \"off\"";
    if (!level.is_string()) check.bad("log_level", expected, level);
    if (cad_log_level_from_name(level.get<std::string>().c_str(), &config.log_level) != 0) {
      check.bad("log_level", expected, level);
    }
    config.has_log_level = true;
  }

  if (root.contains("plugin_path")) {
    const json& dirs = root["plugin_path"];
    if (!dirs.is_array()) check.bad("plugin_path", "an array of directory names", dirs);
    for (size_t i = 0; i < dirs.size(); ++i) {
      const std::string dir = check.non_empty_string(dirs[i], "plugin_path[" + std::to_string(i) + "]");
      config.plugin_path.push_back(resolve_against(dir, base_dir));
    }
  }

  if (!root.contains("instances")) check.bad("instances", "missing (expected an array of instance objects)");
  const json& instances = root["instances"];
  if (!instances.is_array() || instances.empty()) {
    check.bad("instances", "a non-empty array of instance objects", instances);
  }
  std::set<std::string> names;
  for (size_t i = 0; i < instances.size(); ++i) {
    const std::string where = "instances[" + std::to_string(i) + "]";
    const json& entry = instances[i];
    if (!entry.is_object()) check.bad(where, "an object {\"name\", \"plugin\", \"config\"}", entry);
    check.warn_unknown(entry, {"name", "plugin", "config"}, where + ": ", &config.warnings);
    InstanceConfig instance;
    if (!entry.contains("name")) check.bad(where + ".name", "missing (expected a non-empty string)");
    instance.name = check.non_empty_string(entry["name"], where + ".name");
    if (!names.insert(instance.name).second) {
      check.bad(where + ".name", "duplicate instance name '" + instance.name + "'");
    }
    if (!entry.contains("plugin")) check.bad(where + ".plugin", "missing (expected a plugin name or path)");
    instance.plugin = check.non_empty_string(entry["plugin"], where + ".plugin");
    if (looks_like_path(instance.plugin)) instance.plugin = resolve_against(instance.plugin, base_dir);
    instance.config_json = "{}";
    if (entry.contains("config")) {
      if (!entry["config"].is_object()) check.bad(where + ".config", "a JSON object", entry["config"]);
      instance.config_json = entry["config"].dump();
    }
    config.instances.push_back(std::move(instance));
  }

  if (root.contains("attention")) {
    config.attention = check.non_empty_string(root["attention"], "attention");
    if (names.count(config.attention) == 0) {
      check.bad("attention", "names no instance ('" + config.attention + "'; expected one of the instances' names)");
    }
  }
  return config;
}

HostConfig load_host_config_file(const std::string& path) {
  // A regular file of at most 16 MiB (bounded_file.h): a FIFO blocked open() forever, /dev/zero was read
  // until memory ran out.
  std::string text, error;
  const files::ReadStatus read = files::read_regular_file(path, files::kMaxJsonFileBytes, "config file", &text, &error);
  if (read == files::ReadStatus::kNotFound || read == files::ReadStatus::kCannotRead) {
    raise(CAD_STATUS_NOT_FOUND, "config file " + path + ": cannot be read");
  }
  if (read != files::ReadStatus::kOk) raise(CAD_STATUS_INVALID_CONFIG, error);
  const std::string base_dir = fs::absolute(path).parent_path().string();
  return parse_host_config(text, path, base_dir);
}

}  // namespace cad::host
