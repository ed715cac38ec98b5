// host_state.h -- the struct behind cad_host_t: the libraries it loaded, the instances it created (in
// creation order), its log, its memory ledger, and the services tables it lends.
#pragma once

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cad_host.h"
#include "device_memory.h"
#include "host_logging.h"
#include "library.h"
#include "plugin_table.h"

namespace cad::host {

struct HostState;

// What one services table's host_ctx points to. Each instance gets its own, so that its lookups see
// only the instances created before it (their lifetime covers its own, as the ABI promises).
struct ServiceContext {
  HostState* host = nullptr;
  size_t visible_instances = std::numeric_limits<size_t>::max();
  std::string instance_name;  // "" for the host-wide table; else log lines carry it as their source
  std::string plugin_name;
  cad_host_services_v1_t table{};
};

struct Instance {
  std::string name;
  cad_library* library = nullptr;  // owned by HostState::libraries
  KindFunctions functions{};
  void* context = nullptr;
  std::unique_ptr<ServiceContext> services;  // must outlive `context`
};

struct HostState {
  explicit HostState(const DeviceAllocator& allocator = {}) : memory(allocator) {}

  std::unique_ptr<HostLogger> logger;
  MemoryLedger memory;  // with the options' device allocator, fixed for the host's life
  cad_bootstrap_all_gather_fn bootstrap_all_gather = nullptr;
  void* bootstrap_user = nullptr;
  int32_t bootstrap_rank = -1;
  int32_t bootstrap_world_size = 0;
  cad_host_all_to_all_v_fn host_all_to_all_v = nullptr;  // lent collectives (all or none)
  cad_host_all_gather_fn host_all_gather = nullptr;
  cad_host_barrier_fn host_barrier = nullptr;
  void* collectives_user = nullptr;

  std::vector<LibraryPtr> libraries;  // one per distinct plugin file
  mutable std::mutex instances_mutex; // lookups may come from plugin threads while instances are added
  std::vector<Instance> instances;    // creation order
  std::string attention;              // the config's "attention" instance, or ""
  std::unique_ptr<ServiceContext> services;  // the host-wide table (sees every instance)
};

// Fills ctx->table with this host's service functions (services.cpp).
void init_services_table(ServiceContext* ctx);

// Finds an instance among the first `visible` ones; NOT_FOUND naming what was looked for otherwise.
cad_status_t find_instance(const HostState& host, size_t visible, const char* name, cad_plugin_kind_t kind,
                           const void** out_table, void** out_instance, std::string* error);

}  // namespace cad::host

struct cad_host : cad::host::HostState {
  using HostState::HostState;
};
