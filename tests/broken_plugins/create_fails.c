/* A well-formed plugin whose create always refuses, with its own message. */
#include "stub_attention.h"

static cad_status_t failing_create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                                   char* error_message, size_t error_capacity) {
  static const char message[] = "broken on purpose";
  (void)services;
  (void)config_json;
  (void)out_ctx;
  if (error_message != NULL && error_capacity > 0) {
    const size_t n = sizeof message - 1 < error_capacity - 1 ? sizeof message - 1 : error_capacity - 1;
    memcpy(error_message, message, n);
    error_message[n] = '\0';
  }
  return CAD_STATUS_INVALID_CONFIG;
}

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(failing_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "create_fails", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
