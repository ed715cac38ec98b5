// plugin_table.cpp -- see plugin_table.h. The host reads a slot of a table only once the table's
// struct_size says the slot is there (the ABI's growth rule).
#include "plugin_table.h"

#include <cstddef>
#include <string>

#include "cad_host.h"
#include "host_error.h"

namespace cad::host {
namespace {

[[noreturn]] void bad_table(const std::string& message) { raise(CAD_STATUS_ABI_MISMATCH, message); }

void require_size(size_t actual, size_t needed, const std::string& what) {
  if (actual < needed) {
    bad_table(what + " is " + std::to_string(actual) + " bytes, ABI v1 needs at least " + std::to_string(needed));
  }
}

void require_function(const void* fn, const char* table, const char* function) {
  if (fn == nullptr) bad_table(std::string(table) + " table: mandatory function '" + function + "' is NULL");
}

bool is_valid_name(const char* name) {
  if (name == nullptr || name[0] == '\0') return false;
  for (const char* p = name; *p != '\0'; ++p) {
    const bool ok = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_';
    if (!ok) return false;
  }
  return true;
}

template <class Fn>
const void* as_pointer(Fn fn) {
  return reinterpret_cast<const void*>(fn);
}

}  // namespace

void check_plugin_table(const cad_plugin_v1_t* plugin) {
  if (plugin == nullptr) bad_table("entry function " CAD_PLUGIN_ENTRY_SYMBOL_V1 " returned NULL");
  // struct_size and abi_major lie at the start of every major's table; read nothing else before
  // both are known to be right.
  require_size(plugin->struct_size, offsetof(cad_plugin_v1_t, abi_minor), "plugin table");
  if (plugin->abi_major != CAD_ABI_VERSION_MAJOR) {
    bad_table("built for plugin ABI " + std::to_string(plugin->abi_major) + ", this host supports ABI " +
              std::to_string(CAD_ABI_VERSION_MAJOR));
  }
  require_size(plugin->struct_size, sizeof(cad_plugin_v1_t), "plugin table");
  if (!is_valid_name(plugin->name)) {
    bad_table(std::string("plugin name '") + (plugin->name ? plugin->name : "(NULL)") +
              "' is not a non-empty [a-z0-9_]+ name");
  }
  switch (plugin->kind) {
    case CAD_PLUGIN_KIND_ATTENTION: {
      const cad_attention_v1_t* t = plugin->attention;
      if (t == nullptr) bad_table("kind is attention but the attention table is NULL");
      require_size(t->struct_size, CAD_ATTENTION_V1_0_TABLE_SIZE, "attention table");  // v1.1 slots are optional
      require_function(as_pointer(t->create), "attention", "create");
      require_function(as_pointer(t->destroy), "attention", "destroy");
      require_function(as_pointer(t->last_error), "attention", "last_error");
      require_function(as_pointer(t->get_capabilities), "attention", "get_capabilities");
      require_function(as_pointer(t->forward), "attention", "forward");
      require_function(as_pointer(t->backward), "attention", "backward");
      break;  // get_stats_json is optional
    }
    case CAD_PLUGIN_KIND_COMMUNICATOR: {
      const cad_communicator_v1_t* t = plugin->communicator;
      if (t == nullptr) bad_table("kind is communicator but the communicator table is NULL");
      require_size(t->struct_size, sizeof(cad_communicator_v1_t), "communicator table");
      require_function(as_pointer(t->create), "communicator", "create");
      require_function(as_pointer(t->destroy), "communicator", "destroy");
      require_function(as_pointer(t->last_error), "communicator", "last_error");
      require_function(as_pointer(t->get_rank), "communicator", "get_rank");
      require_function(as_pointer(t->get_world_size), "communicator", "get_world_size");
      require_function(as_pointer(t->get_device), "communicator", "get_device");
      require_function(as_pointer(t->all_to_all_v), "communicator", "all_to_all_v");
      require_function(as_pointer(t->all_gather), "communicator", "all_gather");
      require_function(as_pointer(t->barrier), "communicator", "barrier");
      break;
    }
    case CAD_PLUGIN_KIND_BALANCER: {
      const cad_balancer_v1_t* t = plugin->balancer;
      if (t == nullptr) bad_table("kind is balancer but the balancer table is NULL");
      require_size(t->struct_size, sizeof(cad_balancer_v1_t), "balancer table");
      require_function(as_pointer(t->create), "balancer", "create");
      require_function(as_pointer(t->destroy), "balancer", "destroy");
      require_function(as_pointer(t->last_error), "balancer", "last_error");
      require_function(as_pointer(t->plan), "balancer", "plan");
      require_function(as_pointer(t->release_plan), "balancer", "release_plan");
      break;
    }
    default:
      bad_table("unknown plugin kind " + std::to_string(plugin->kind) +
                " (expected 1 attention, 2 communicator or 3 balancer)");
  }
}

KindFunctions kind_functions(const cad_plugin_v1_t* plugin) {
  switch (plugin->kind) {
    case CAD_PLUGIN_KIND_ATTENTION:
      return {plugin->attention, plugin->attention->create, plugin->attention->destroy};
    case CAD_PLUGIN_KIND_COMMUNICATOR:
      return {plugin->communicator, plugin->communicator->create, plugin->communicator->destroy};
    default:
      return {plugin->balancer, plugin->balancer->create, plugin->balancer->destroy};
  }
}

}  // namespace cad::host
