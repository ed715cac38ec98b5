// host_logging.cpp -- see host_logging.h.
#include "host_logging.h"

#include <cstdlib>
#include <cstring>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace cad::host {
namespace {

spdlog::level::level_enum to_spdlog(cad_log_level_t level) {
  switch (level) {
    case CAD_LOG_TRACE: return spdlog::level::trace;
    case CAD_LOG_DEBUG: return spdlog::level::debug;
    case CAD_LOG_INFO: return spdlog::level::info;
    case CAD_LOG_WARN: return spdlog::level::warn;
    case CAD_LOG_ERROR: return spdlog::level::err;
    default: return spdlog::level::off;
  }
}

}  // namespace

const char* log_level_name(cad_log_level_t level) {
  static const char* const names[] = {"trace", "debug", "info", "warn", "error", "off"};
  return level >= CAD_LOG_TRACE && level <= CAD_LOG_OFF ? names[level] : "unknown";
}

cad_log_level_t effective_log_level(bool config_has_level, cad_log_level_t config_level, std::string* warning) {
  cad_log_level_t level = config_has_level ? config_level : CAD_LOG_INFO;
  const char* env = std::getenv("CAD_LOG_LEVEL");
  if (env != nullptr && env[0] != '\0') {
    cad_log_level_t from_env = CAD_LOG_INFO;
    if (cad_log_level_from_name(env, &from_env) == 0) {
      level = from_env;
    } else {
      *warning = std::string("CAD_LOG_LEVEL='") + env +
                 "' is not one of trace, debug, info, warn, error, off; using " + log_level_name(level);
    }
  }
  return level;
}

HostLogger::HostLogger(cad_log_level_t level, cad_host_log_fn callback, void* user)
    : level_(level), callback_(callback), user_(user) {
  if (callback_ == nullptr) {
    logger_ = std::make_shared<spdlog::logger>("cad", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger_->set_pattern("[%H:%M:%S.%e] [%l] %v");
    logger_->set_level(to_spdlog(level));
  }
}

HostLogger::~HostLogger() = default;

void HostLogger::log(cad_log_level_t level, const char* source, const char* message) {
  if (level < level_ || level >= CAD_LOG_OFF || level < CAD_LOG_TRACE) return;
  const char* src = source != nullptr ? source : "?";
  const char* msg = message != nullptr ? message : "";
  if (callback_ != nullptr) {
    std::lock_guard<std::mutex> lock(callback_mutex_);
    callback_(user_, level, src, msg);
    return;
  }
  logger_->log(to_spdlog(level), "[{}] {}", src, msg);
}

}  // namespace cad::host

extern "C" int cad_log_level_from_name(const char* name, cad_log_level_t* out) {
  if (name == nullptr) return -1;
  for (cad_log_level_t level = CAD_LOG_TRACE; level <= CAD_LOG_OFF; ++level) {
    if (std::strcmp(name, cad::host::log_level_name(level)) == 0) {
      if (out != nullptr) *out = level;
      return 0;
    }
  }
  if (std::strcmp(name, "warning") == 0) {  // the one common alias
    if (out != nullptr) *out = CAD_LOG_WARN;
    return 0;
  }
  return -1;
}
