// host_services.cpp -- the cad_host_services_v1_t functions the host lends every plugin instance:
// logging, memory, instance lookup and the bootstrap all-gather. All are thread-safe.
#include <string>

#include "host_state.h"

namespace cad::host {
namespace {

HostState& host_of(void* host_ctx) { return *static_cast<ServiceContext*>(host_ctx)->host; }

// The source of a line is the instance's config name, so two instances of one plugin can be told
// apart; a source the plugin chose beyond its own name is kept in brackets.
std::string log_source(const ServiceContext& ctx, const char* source) {
  if (ctx.instance_name.empty()) return source != nullptr ? source : "?";
  if (source == nullptr || source[0] == '\0' || ctx.instance_name == source || ctx.plugin_name == source) {
    return ctx.instance_name;
  }
  return ctx.instance_name + " (" + source + ")";
}

void service_log(void* host_ctx, cad_log_level_t level, const char* source, const char* message) {
  if (host_ctx == nullptr) return;
  try {
    HostLogger& logger = *host_of(host_ctx).logger;
    if (level < logger.level()) return;
    logger.log(level, log_source(*static_cast<ServiceContext*>(host_ctx), source).c_str(), message);
  } catch (...) {
    // Logging must never take a plugin down; a lost line is the lesser evil.
  }
}

cad_status_t service_allocate(void* host_ctx, cad_device_v1_t device, size_t bytes, void* stream, void** out) {
  if (host_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  HostState& host = host_of(host_ctx);
  try {
    std::string error;
    const cad_status_t status = host.memory.allocate(device, bytes, stream, out, &error);
    if (status != CAD_STATUS_OK) host.logger->log(CAD_LOG_WARN, error);
    return status;
  } catch (...) {
    return CAD_STATUS_OUT_OF_MEMORY;
  }
}

void service_free(void* host_ctx, cad_device_v1_t device, void* ptr, void* stream) {
  if (host_ctx == nullptr) return;
  HostState& host = host_of(host_ctx);
  try {
    if (!host.memory.free(device, ptr, stream)) {
      host.logger->log(CAD_LOG_ERROR, "free: pointer was not allocated by this host on that device; ignored");
    }
  } catch (...) {
  }
}

cad_status_t service_lookup(void* host_ctx, const char* instance_name, cad_plugin_kind_t kind,
                            const void** out_table, void** out_instance) {
  if (host_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  const auto* ctx = static_cast<ServiceContext*>(host_ctx);
  try {
    std::string error;
    const cad_status_t status =
        find_instance(*ctx->host, ctx->visible_instances, instance_name, kind, out_table, out_instance, &error);
    if (status != CAD_STATUS_OK) ctx->host->logger->log(CAD_LOG_DEBUG, "lookup_plugin: " + error);
    return status;
  } catch (...) {
    return CAD_STATUS_INTERNAL;
  }
}

cad_status_t service_bootstrap(void* host_ctx, const void* send, size_t bytes, void* recv) {
  if (host_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  HostState& host = host_of(host_ctx);
  if (host.bootstrap_all_gather == nullptr) return CAD_STATUS_UNSUPPORTED;
  return host.bootstrap_all_gather(host.bootstrap_user, send, bytes, recv);
}

// The lent collectives: forwarded as they are, with the host application's user pointer.
cad_status_t service_all_to_all_v(void* host_ctx, const void* send, const uint64_t* send_counts,
                                  const uint64_t* send_displs, void* recv, const uint64_t* recv_counts,
                                  const uint64_t* recv_displs, int64_t timeout_ms, char* error, size_t error_capacity) {
  if (host_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  HostState& host = host_of(host_ctx);
  return host.host_all_to_all_v(host.collectives_user, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                timeout_ms, error, error_capacity);
}

cad_status_t service_all_gather(void* host_ctx, const void* send, uint64_t bytes, void* recv, int64_t timeout_ms,
                                char* error, size_t error_capacity) {
  if (host_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  HostState& host = host_of(host_ctx);
  return host.host_all_gather(host.collectives_user, send, bytes, recv, timeout_ms, error, error_capacity);
}

cad_status_t service_barrier(void* host_ctx, int64_t timeout_ms, char* error, size_t error_capacity) {
  if (host_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  HostState& host = host_of(host_ctx);
  return host.host_barrier(host.collectives_user, timeout_ms, error, error_capacity);
}

}  // namespace

void init_services_table(ServiceContext* ctx) {
  HostState& host = *ctx->host;
  cad_host_services_v1_t& t = ctx->table;
  t = cad_host_services_v1_t{};
  t.struct_size = sizeof(cad_host_services_v1_t);
  t.abi_major = CAD_ABI_VERSION_MAJOR;
  t.abi_minor = CAD_ABI_VERSION_MINOR;
  t.host_ctx = ctx;
  t.log_level = host.logger->level();
  t.log = &service_log;
  t.allocate = &service_allocate;
  t.free = &service_free;
  t.lookup_plugin = &service_lookup;
  // Optional in the ABI: lent only when the host application supplied one.
  t.bootstrap_all_gather = host.bootstrap_all_gather != nullptr ? &service_bootstrap : nullptr;
  t.bootstrap_rank = host.bootstrap_all_gather != nullptr ? host.bootstrap_rank : -1;
  t.bootstrap_world_size = host.bootstrap_all_gather != nullptr ? host.bootstrap_world_size : 0;
  // ABI v1.1: the host collectives, also only when lent (they share the bootstrap rank and world).
  const bool collectives = host.host_all_to_all_v != nullptr;
  t.host_all_to_all_v = collectives ? &service_all_to_all_v : nullptr;
  t.host_all_gather = collectives ? &service_all_gather : nullptr;
  t.host_barrier = collectives ? &service_barrier : nullptr;
  if (collectives) {
    t.bootstrap_rank = host.bootstrap_rank;
    t.bootstrap_world_size = host.bootstrap_world_size;
  }
}

cad_status_t find_instance(const HostState& host, size_t visible, const char* name, cad_plugin_kind_t kind,
                           const void** out_table, void** out_instance, std::string* error) {
  if (name == nullptr || out_table == nullptr || out_instance == nullptr) {
    *error = "instance name, out_table and out_instance must not be NULL";
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  std::lock_guard<std::mutex> lock(host.instances_mutex);
  const size_t count = visible < host.instances.size() ? visible : host.instances.size();
  for (size_t i = 0; i < count; ++i) {
    const Instance& instance = host.instances[i];
    if (instance.name != name) continue;
    if (instance.library->plugin->kind != kind) {
      *error = std::string("instance '") + name + "' is a " + cad_plugin_kind_name(instance.library->plugin->kind) +
               ", not a " + cad_plugin_kind_name(kind);
      return CAD_STATUS_NOT_FOUND;
    }
    *out_table = instance.functions.table;
    *out_instance = instance.context;
    return CAD_STATUS_OK;
  }
  *error = std::string("no ") + cad_plugin_kind_name(kind) + " instance named '" + name + "'" +
           (count < host.instances.size() ? " created before the caller" : "");
  return CAD_STATUS_NOT_FOUND;
}

}  // namespace cad::host
