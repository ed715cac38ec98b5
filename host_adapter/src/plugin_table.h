// plugin_table.h -- checks a plugin's entry table before the host touches anything else in it, and
// gives uniform access to the create/destroy functions every kind table starts with.
#pragma once

#include "cad_plugin_v1.h"

namespace cad::host {

// Throws HostError(ABI_MISMATCH) naming what is wrong (no path prefix): ABI major, table sizes, kind,
// name, and every mandatory function of the kind's table.
void check_plugin_table(const cad_plugin_v1_t* plugin);

using create_fn = cad_status_t (*)(const cad_host_services_v1_t*, const char*, void**, char*, size_t);

// The parts shared by every kind's table. Only valid for a table that passed check_plugin_table.
struct KindFunctions {
  const void* table;
  create_fn create;
  void (*destroy)(void*);
};
KindFunctions kind_functions(const cad_plugin_v1_t* plugin);

}  // namespace cad::host
