/* stub_attention.h -- a complete, do-nothing attention table for the deliberately broken plugins, so
 * each of them is broken in exactly one way. Test fixtures only. */
#ifndef CAD_TEST_STUB_ATTENTION_H
#define CAD_TEST_STUB_ATTENTION_H

#include <stdlib.h>
#include <string.h>

#include "cad_plugin_v1.h"

static inline cad_status_t stub_create(const cad_host_services_v1_t* services, const char* config_json,
                                       void** out_ctx, char* error_message, size_t error_capacity) {
  (void)services;
  (void)config_json;
  (void)error_message;
  (void)error_capacity;
  *out_ctx = malloc(1);
  return *out_ctx != NULL ? CAD_STATUS_OK : CAD_STATUS_OUT_OF_MEMORY;
}
static inline void stub_destroy(void* ctx) { free(ctx); }
static inline const char* stub_last_error(void* ctx) {
  (void)ctx;
  return "";
}
static inline cad_status_t stub_get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  (void)ctx;
  (void)out;
  return CAD_STATUS_UNSUPPORTED;
}
static inline cad_status_t stub_forward(void* ctx, const cad_attention_forward_args_v1_t* args) {
  (void)ctx;
  (void)args;
  return CAD_STATUS_UNSUPPORTED;
}
static inline cad_status_t stub_backward(void* ctx, const cad_attention_backward_args_v1_t* args) {
  (void)ctx;
  (void)args;
  return CAD_STATUS_UNSUPPORTED;
}

#define STUB_ATTENTION_TABLE(create_fn, forward_fn)                                                     \
  {                                                                                                      \
    sizeof(cad_attention_v1_t), create_fn, stub_destroy, stub_last_error, stub_get_capabilities, forward_fn, \
        stub_backward, NULL, NULL, NULL, NULL                                                            \
  }

#define STUB_PLUGIN_TABLE(struct_size, abi_major, name, attention_table)                                \
  {                                                                                                      \
    struct_size, abi_major, CAD_ABI_VERSION_MINOR, CAD_PLUGIN_KIND_ATTENTION, name, "0.0-broken",          \
        "deliberately broken test plugin", attention_table, NULL, NULL                                   \
  }

#endif
