// host.cpp -- cad_host_t: builds the configured stack (validate the config, load each plugin once,
// create the instances in order with their own services tables) and tears it down in reverse.
#include <cstring>
#include <filesystem>

#include "host_config.h"
#include "host_error.h"
#include "host_state.h"
#include "search_path.h"

namespace cad::host {
namespace {

constexpr size_t kCreateMessageCapacity = 2048;

HostConfig read_config(const cad_host_options_v1_t& options) {
  const char* path = options.config_path;
  if (options.config_json != nullptr) {
    const std::string base_dir =
        path != nullptr ? std::filesystem::absolute(path).parent_path().string() : std::string();
    return parse_host_config(options.config_json, path != nullptr ? path : "config", base_dir);
  }
  if (path == nullptr) raise(CAD_STATUS_INVALID_ARGUMENT, "cad_host_create: options name neither config_json nor config_path");
  return load_host_config_file(path);
}

// The library for `plugin` (a name or path), loading it unless an instance already did.
cad_library* library_for(HostState& host, const std::string& plugin, const std::vector<std::string>& dirs) {
  const std::string path = canonical_or_absolute(resolve_plugin_file(plugin, dirs));
  for (const auto& library : host.libraries) {
    if (library->path == path) return library.get();
  }
  host.libraries.emplace_back(open_library(path, dirs));
  return host.libraries.back().get();
}

void create_instance(HostState& host, const InstanceConfig& config, cad_library* library) {
  Instance instance;
  instance.name = config.name;
  instance.library = library;
  instance.functions = kind_functions(library->plugin);
  instance.services = std::make_unique<ServiceContext>();
  instance.services->host = &host;
  instance.services->visible_instances = host.instances.size();
  instance.services->instance_name = config.name;
  instance.services->plugin_name = library->plugin->name;
  init_services_table(instance.services.get());

  char message[kCreateMessageCapacity] = {0};
  void* context = nullptr;
  cad_status_t status = CAD_STATUS_INTERNAL;
  try {
    status = instance.functions.create(&instance.services->table, config.config_json.c_str(), &context, message,
                                       sizeof message);
  } catch (...) {
    // An exception must never cross the ABI; the plugin's state is unknown, its context is not used.
    raise(CAD_STATUS_INTERNAL, "plugin " + library->path + ": create let an exception escape through the C ABI");
  }
  message[sizeof message - 1] = '\0';  // in case the plugin forgot the terminator
  if (status != CAD_STATUS_OK) {
    raise(status, "plugin " + library->path + ": create failed: " + (message[0] != '\0' ? message : "(no message)"));
  }
  if (context == nullptr) raise(CAD_STATUS_INTERNAL, "plugin " + library->path + ": create returned OK but no instance");
  instance.context = context;
  host.logger->log(CAD_LOG_DEBUG, "created instance '" + config.name + "' of plugin " + library->plugin->name);
  std::lock_guard<std::mutex> lock(host.instances_mutex);
  host.instances.push_back(std::move(instance));
}

void build_stack(HostState& host, const HostConfig& config, const cad_host_options_v1_t& options) {
  std::vector<std::string> first = split_path_list(options.search_path);
  first.insert(first.end(), config.plugin_path.begin(), config.plugin_path.end());
  const std::vector<std::string> dirs = plugin_search_dirs(first);
  for (size_t i = 0; i < config.instances.size(); ++i) {
    const InstanceConfig& instance = config.instances[i];
    try {
      create_instance(host, instance, library_for(host, instance.plugin, dirs));
    } catch (const HostError& e) {
      raise(e.status(), config.source + ": instances[" + std::to_string(i) + "] ('" + instance.name + "'): " + e.what());
    }
  }
  if (!config.attention.empty()) {
    for (const Instance& instance : host.instances) {
      if (instance.name == config.attention && instance.library->plugin->kind != CAD_PLUGIN_KIND_ATTENTION) {
        raise(CAD_STATUS_INVALID_CONFIG, config.source + ": attention: instance '" + config.attention + "' is a " +
                                             cad_plugin_kind_name(instance.library->plugin->kind) +
                                             ", expected an attention instance");
      }
    }
    host.attention = config.attention;
  }
}

// Reverse creation order: an instance may use the ones created before it until it is destroyed.
void tear_down(HostState& host) noexcept {
  while (!host.instances.empty()) {
    Instance instance;
    {
      std::lock_guard<std::mutex> lock(host.instances_mutex);
      instance = std::move(host.instances.back());
      host.instances.pop_back();
    }
    host.logger->log(CAD_LOG_DEBUG, "destroying instance '" + instance.name + "'");
    try {
      instance.functions.destroy(instance.context);
    } catch (...) {
      // Teardown is noexcept (it also runs while a failure unwinds): report and go on with the rest.
      host.logger->log(CAD_LOG_ERROR, "plugin " + instance.library->path + ": destroy of instance '" + instance.name +
                                          "' let an exception escape through the C ABI; continuing the teardown");
    }
  }
  size_t bytes = 0;
  const size_t blocks = host.memory.release_all(&bytes);
  if (blocks > 0) {
    host.logger->log(CAD_LOG_WARN, std::to_string(blocks) + " allocation(s) of " + std::to_string(bytes) +
                                       " bytes were not freed by the plugins; freed now");
  }
  while (!host.libraries.empty()) host.libraries.pop_back();
}

}  // namespace
}  // namespace cad::host

using namespace cad::host;

extern "C" cad_status_t cad_host_create(const cad_host_options_v1_t* options, cad_host_t** out, char* error,
                                        size_t error_capacity) {
  cad_host* created = nullptr;
  const cad_status_t status = c_boundary(error, error_capacity, [&] {
    if (options == nullptr || out == nullptr) raise(CAD_STATUS_INVALID_ARGUMENT, "cad_host_create: options and out must not be NULL");
    const size_t v10_size = offsetof(cad_host_options_v1_t, log_callback);
    if (options->struct_size < v10_size) {
      raise(CAD_STATUS_ABI_MISMATCH, "cad_host_create: options.struct_size is " + std::to_string(options->struct_size) +
                                         ", expected at least " + std::to_string(v10_size));
    }
    // Fields appended after v1.0 read as 0 when the caller's struct predates them.
    cad_host_options_v1_t opts{};
    std::memcpy(&opts, options, options->struct_size < sizeof opts ? options->struct_size : sizeof opts);

    const HostConfig config = read_config(opts);
    std::string env_warning;
    const cad_log_level_t level = effective_log_level(config.has_log_level, config.log_level, &env_warning);

    if ((opts.device_allocate == nullptr) != (opts.device_free == nullptr)) {
      raise(CAD_STATUS_INVALID_ARGUMENT, std::string("cad_host_create: options lend ") +
                                             (opts.device_allocate != nullptr ? "device_allocate" : "device_free") +
                                             " without " +
                                             (opts.device_allocate != nullptr ? "device_free" : "device_allocate") +
                                             ": lend both device_allocate and device_free, or neither");
    }
    const DeviceAllocator allocator{opts.device_allocate, opts.device_free, opts.allocator_user};
    auto host = std::make_unique<cad_host>(allocator);
    host->logger = std::make_unique<HostLogger>(level, opts.log_callback, opts.log_user);
    if (!env_warning.empty()) host->logger->log(CAD_LOG_WARN, env_warning);
    for (const auto& warning : config.warnings) host->logger->log(CAD_LOG_WARN, warning);
    host->bootstrap_all_gather = opts.bootstrap_all_gather;
    host->bootstrap_user = opts.bootstrap_user;
    host->bootstrap_rank = opts.bootstrap_rank;
    host->bootstrap_world_size = opts.bootstrap_world_size;
    const int lent = (opts.host_all_to_all_v != nullptr) + (opts.host_all_gather != nullptr) + (opts.host_barrier != nullptr);
    if (lent != 0 && lent != 3) {
      raise(CAD_STATUS_INVALID_ARGUMENT, "cad_host_create: options lend " + std::to_string(lent) +
                                             " of the 3 host collectives (host_all_to_all_v, host_all_gather, "
                                             "host_barrier): lend all or none");
    }
    if (lent == 3 && (opts.bootstrap_world_size < 1 || opts.bootstrap_rank < 0 ||
                      opts.bootstrap_rank >= opts.bootstrap_world_size)) {
      raise(CAD_STATUS_INVALID_ARGUMENT, "cad_host_create: options lend host collectives but bootstrap_rank " +
                                             std::to_string(opts.bootstrap_rank) + " of bootstrap_world_size " +
                                             std::to_string(opts.bootstrap_world_size) + " is not a valid rank");
    }
    host->host_all_to_all_v = opts.host_all_to_all_v;
    host->host_all_gather = opts.host_all_gather;
    host->host_barrier = opts.host_barrier;
    host->collectives_user = opts.collectives_user;
    host->services = std::make_unique<ServiceContext>();
    host->services->host = host.get();
    init_services_table(host->services.get());
    try {
      build_stack(*host, config, opts);
    } catch (...) {
      tear_down(*host);  // nothing stays loaded
      throw;
    }
    created = host.release();
  });
  if (status == CAD_STATUS_OK) *out = created;
  return status;
}

extern "C" void cad_host_destroy(cad_host_t* host) {
  if (host == nullptr) return;
  tear_down(*host);
  delete host;
}

extern "C" const cad_host_services_v1_t* cad_host_services(cad_host_t* host) {
  return host != nullptr ? &host->services->table : nullptr;
}

extern "C" cad_status_t cad_host_find_instance(cad_host_t* host, const char* instance_name, cad_plugin_kind_t kind,
                                               const void** out_table, void** out_instance) {
  if (host == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  std::string ignored;
  try {
    return find_instance(*host, host->instances.size(), instance_name, kind, out_table, out_instance, &ignored);
  } catch (...) {
    return CAD_STATUS_INTERNAL;
  }
}

extern "C" cad_status_t cad_host_attention(cad_host_t* host, const cad_attention_v1_t** out_table, void** out_instance) {
  if (host == nullptr || out_table == nullptr || out_instance == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  if (host->attention.empty()) return CAD_STATUS_NOT_FOUND;
  const void* table = nullptr;
  const cad_status_t status =
      cad_host_find_instance(host, host->attention.c_str(), CAD_PLUGIN_KIND_ATTENTION, &table, out_instance);
  if (status == CAD_STATUS_OK) *out_table = static_cast<const cad_attention_v1_t*>(table);
  return status;
}

extern "C" int64_t cad_host_num_instances(const cad_host_t* host) {
  return host != nullptr ? static_cast<int64_t>(host->instances.size()) : 0;
}

extern "C" cad_status_t cad_host_instance_info(const cad_host_t* host, int64_t index, cad_host_instance_info_v1_t* out) {
  if (host == nullptr || out == nullptr || index < 0 || index >= cad_host_num_instances(host)) {
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  const Instance& instance = host->instances[static_cast<size_t>(index)];
  cad_host_instance_info_v1_t info{};
  info.struct_size = sizeof info;
  info.name = instance.name.c_str();
  info.plugin = instance.library->plugin;
  info.path = instance.library->path.c_str();
  info.table = instance.functions.table;
  info.instance = instance.context;
  // Copy only what the caller's struct holds (it may be an older, shorter one).
  const size_t n = out->struct_size < sizeof info ? out->struct_size : sizeof info;
  const size_t caller_size = out->struct_size;
  std::memcpy(out, &info, n);
  out->struct_size = caller_size;
  return CAD_STATUS_OK;
}

extern "C" cad_log_level_t cad_host_log_level(const cad_host_t* host) {
  return host != nullptr ? host->logger->level() : CAD_LOG_INFO;
}

extern "C" const char* cad_plugin_kind_name(cad_plugin_kind_t kind) {
  switch (kind) {
    case CAD_PLUGIN_KIND_ATTENTION: return "attention";
    case CAD_PLUGIN_KIND_COMMUNICATOR: return "communicator";
    case CAD_PLUGIN_KIND_BALANCER: return "balancer";
    default: return "unknown";
  }
}

extern "C" const char* cad_status_name(cad_status_t status) {
  static const char* const names[] = {"OK",          "INVALID_ARGUMENT", "UNSUPPORTED", "OUT_OF_MEMORY",
                                      "INVALID_CONFIG", "NOT_FOUND",     "COMMUNICATION", "TIMEOUT",
                                      "ABI_MISMATCH", "DEVICE_ERROR",    "INTERNAL"};
  return status >= 0 && status <= CAD_STATUS_INTERNAL ? names[status] : "UNKNOWN_STATUS";
}
