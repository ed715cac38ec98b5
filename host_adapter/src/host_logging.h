// host_logging.h -- the host's log: one line per message, "[source] message", to the host's callback if
// it lent one, else to stderr through spdlog. The level comes from $CAD_LOG_LEVEL, else the config.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "cad_host.h"

namespace spdlog {
class logger;
}

namespace cad::host {

const char* log_level_name(cad_log_level_t level);

// $CAD_LOG_LEVEL wins over the config's level (if any), which wins over `info`. An unknown name in
// the environment is ignored and reported through *warning.
cad_log_level_t effective_log_level(bool config_has_level, cad_log_level_t config_level, std::string* warning);

class HostLogger {
 public:
  HostLogger(cad_log_level_t level, cad_host_log_fn callback, void* user);
  ~HostLogger();
  HostLogger(const HostLogger&) = delete;
  HostLogger& operator=(const HostLogger&) = delete;

  cad_log_level_t level() const { return level_; }
  // Thread-safe; drops messages below level().
  void log(cad_log_level_t level, const char* source, const char* message);
  void log(cad_log_level_t level, const std::string& message) { log(level, "host", message.c_str()); }

 private:
  cad_log_level_t level_;
  cad_host_log_fn callback_;
  void* user_;
  std::mutex callback_mutex_;              // the callback is promised one call at a time
  std::shared_ptr<spdlog::logger> logger_;  // used when there is no callback; not in spdlog's registry
};

}  // namespace cad::host
