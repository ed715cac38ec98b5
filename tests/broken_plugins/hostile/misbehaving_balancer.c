/* A balancer that lies about its results, one way chosen at compile time:
 *   FAULT_NULL_PLAN        plan returns OK but leaves *out_plan NULL
 *   FAULT_NULL_LAST_ERROR  plan fails and last_error returns NULL */
#include <stdlib.h>

#include "cad_plugin_v1.h"

static cad_status_t create(const cad_host_services_v1_t* s, const char* config, void** out_ctx, char* error,
                           size_t capacity) {
  (void)s;
  (void)config;
  (void)error;
  (void)capacity;
  if (out_ctx == NULL) return CAD_STATUS_INVALID_ARGUMENT;
  *out_ctx = malloc(1);
  return *out_ctx != NULL ? CAD_STATUS_OK : CAD_STATUS_OUT_OF_MEMORY;
}
static void destroy(void* ctx) { free(ctx); }
static const char* last_error(void* ctx) {
  (void)ctx;
#if defined(FAULT_NULL_LAST_ERROR)
  return NULL;
#else
  return "";
#endif
}
static cad_status_t plan(void* ctx, const cad_balance_input_v1_t* input, cad_plan_v1_t** out_plan) {
  (void)ctx;
  (void)input;
#if defined(FAULT_NULL_PLAN)
  *out_plan = NULL;
  return CAD_STATUS_OK;
#else
  (void)out_plan;
  return CAD_STATUS_INTERNAL;
#endif
}
static void release_plan(void* ctx, cad_plan_v1_t* p) {
  (void)ctx;
  (void)p;
}

static const cad_balancer_v1_t balancer = {sizeof(cad_balancer_v1_t), create, destroy, last_error, plan, release_plan};
static const cad_plugin_v1_t plugin = {sizeof(cad_plugin_v1_t), 1, CAD_ABI_VERSION_MINOR, CAD_PLUGIN_KIND_BALANCER,
                                       "misbehaving_balancer", "0.0-broken", "deliberately misbehaving balancer",
                                       NULL, NULL, &balancer};
CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
