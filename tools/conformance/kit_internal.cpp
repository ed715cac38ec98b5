// kit_internal.cpp -- see kit_internal.h.
#include "kit_internal.h"

#include <algorithm>
#include <cmath>

namespace cad::conformance {

bool lifecycle_of(const cad_plugin_v1_t* plugin, Lifecycle* out) {
  if (plugin == nullptr) return false;
  switch (plugin->kind) {
    case CAD_PLUGIN_KIND_ATTENTION:
      if (plugin->attention == nullptr) return false;
      *out = Lifecycle{plugin->attention->create, plugin->attention->destroy, plugin->attention->last_error};
      break;
    case CAD_PLUGIN_KIND_COMMUNICATOR:
      if (plugin->communicator == nullptr) return false;
      *out = Lifecycle{plugin->communicator->create, plugin->communicator->destroy,
                       plugin->communicator->last_error};
      break;
    case CAD_PLUGIN_KIND_BALANCER:
      if (plugin->balancer == nullptr) return false;
      *out = Lifecycle{plugin->balancer->create, plugin->balancer->destroy, plugin->balancer->last_error};
      break;
    default:
      return false;
  }
  return out->create != nullptr && out->destroy != nullptr && out->last_error != nullptr;
}

std::string status_name(cad_status_t status) {
  static const char* const names[] = {"OK",        "INVALID_ARGUMENT", "UNSUPPORTED",  "OUT_OF_MEMORY",
                                      "INVALID_CONFIG", "NOT_FOUND",   "COMMUNICATION", "TIMEOUT",
                                      "ABI_MISMATCH",   "DEVICE_ERROR", "INTERNAL"};
  const std::string code = "(" + std::to_string(status) + ")";
  if (status >= 0 && status <= CAD_STATUS_INTERNAL) return std::string("CAD_STATUS_") + names[status] + " " + code;
  return "unknown status " + code;
}

std::string last_error_of(const Lifecycle& life, void* ctx) {
  const char* message = life.last_error(ctx);
  return message == nullptr ? "<NULL>" : message;
}

bool names_quoted(const std::string& message, const std::string& what) {
  return message.find("'" + what + "'") != std::string::npos ||
         message.find("\"" + what + "\"") != std::string::npos;
}

std::unique_ptr<Instance> create_for_run(const cad_plugin_v1_t* plugin, const Options& options,
                                         const TestServices& services, const std::string& check_name,
                                         Report& report) {
  Lifecycle life;
  if (!lifecycle_of(plugin, &life)) {
    report.fail(check_name, "the plugin's kind table is unusable");
    return nullptr;
  }
  char message[512] = {0};
  void* ctx = nullptr;
  const cad_status_t status =
      life.create(services.table(), options.config_json.c_str(), &ctx, message, sizeof(message));
  if (status == CAD_STATUS_OK && ctx != nullptr) return std::make_unique<Instance>(life, ctx);
  const std::string why = "create with config " + options.config_json + " returned " + status_name(status) +
                          ": " + message;
  if (status == CAD_STATUS_OK) {
    report.fail(check_name, "create returned OK but a NULL context");
  } else if (status == CAD_STATUS_NOT_FOUND && options.instances.empty()) {
    report.skip(check_name, "the plugin needs helper instances this run does not provide (" + why +
                                "); pass --config and --instance");
  } else {
    report.fail(check_name, why);
  }
  return nullptr;
}

double max_relative_error(const double* got, const double* want, size_t n, double floor) {
  double max_diff = 0.0, max_want = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    // NaN never compares greater: treat it as an infinite error.
    max_diff = std::isnan(diff) ? INFINITY : std::max(max_diff, diff);
    max_want = std::max(max_want, std::fabs(want[i]));
  }
  return max_diff / std::max(max_want, floor);
}

}  // namespace cad::conformance
