// adapter_test_support.h -- shared helpers of the host adapter tests: where the fixture and broken
// plugins were built, a log capture, and a one-call host builder.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "cad_host.h"

namespace cad::test {

inline std::string broken_plugin(const std::string& name) {
  return std::string(CAD_BROKEN_PLUGIN_DIR) + "/cad_" + name + ".so";
}
inline std::string fixture_dir() { return CAD_TEST_PLUGIN_DIR; }
inline std::string fixture_plugin() { return fixture_dir() + "/cad_test_attention.so"; }

// Collects the host's log lines as "<level>|<source>|<message>".
struct LogCapture {
  std::mutex mutex;
  std::vector<std::string> lines;

  static void callback(void* user, cad_log_level_t level, const char* source, const char* message) {
    auto* self = static_cast<LogCapture*>(user);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->lines.push_back(std::to_string(level) + "|" + source + "|" + message);
  }
  bool contains(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
  // Index of the first line containing `text`, or -1.
  int index_of(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].find(text) != std::string::npos) return static_cast<int>(i);
    }
    return -1;
  }
};

struct HostResult {
  cad_status_t status = CAD_STATUS_OK;
  std::string error;
  cad_host_t* host = nullptr;
};

// Builds a host from JSON text named "bad.json" in messages (config_path), logging into `log`.
inline HostResult make_host(const std::string& json, LogCapture* log = nullptr, const char* search_path = nullptr,
                            const char* config_path = "bad.json") {
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_json = json.c_str();
  options.config_path = config_path;
  options.search_path = search_path;
  if (log != nullptr) {
    options.log_callback = &LogCapture::callback;
    options.log_user = log;
  }
  HostResult result;
  char error[4096] = {0};
  result.status = cad_host_create(&options, &result.host, error, sizeof error);
  result.error = error;
  return result;
}

}  // namespace cad::test
