/*
 * cad_plugin_v1.h -- the one symbol a plugin exports, ABI major version 1. FROZEN.
 *
 * A plugin is a shared object that exports exactly one symbol per ABI major it implements:
 *
 *     const cad_plugin_v1_t* cad_plugin_entry_v1(void);
 *
 * The host loads the object with local symbol scope, looks the symbol up, checks that it is defined in
 * that object (not in a library it depends on), calls it, and checks `abi_major` and `struct_size`
 * before reading anything else. The returned table and every string and table it points to are static
 * data of the plugin: valid until the object is unloaded, never freed by the host. The entry function
 * is thread-safe, has no side effects and may be called any number of times.
 *
 * Plugins never link against host symbols: everything they need from the host arrives in the
 * cad_host_services_v1_t passed to create.
 */
#ifndef CAD_PLUGIN_V1_H
#define CAD_PLUGIN_V1_H

#include "cad_attention_v1.h"
#include "cad_balancer_v1.h"
#include "cad_common_v1.h"
#include "cad_communicator_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CAD_PLUGIN_ENTRY_SYMBOL_V1 "cad_plugin_entry_v1"

typedef struct cad_plugin_v1 {
  size_t struct_size;  /* sizeof(cad_plugin_v1_t) as the plugin was built                           */
  uint32_t abi_major;  /* must be CAD_ABI_VERSION_MAJOR (1)                                          */
  uint32_t abi_minor;  /* CAD_ABI_VERSION_MINOR the plugin was built against                         */
  cad_plugin_kind_t kind; /* which one of the tables below is set                                    */
  const char* name;    /* short unique name, e.g. "reference"; [a-z0-9_]+                            */
  const char* version; /* the plugin's own version, free text                                        */
  const char* description; /* one line for `cad plugins`                                             */
  /* Exactly one of these is non-NULL, per `kind`. */
  const cad_attention_v1_t* attention;
  const cad_communicator_v1_t* communicator;
  const cad_balancer_v1_t* balancer;
} cad_plugin_v1_t;

typedef const cad_plugin_v1_t* (*cad_plugin_entry_v1_fn)(void);

/* Plugins define the entry with this macro so that it is exported even under -fvisibility=hidden. */
#if defined(__GNUC__)
#define CAD_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define CAD_PLUGIN_EXPORT
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_PLUGIN_V1_H */
