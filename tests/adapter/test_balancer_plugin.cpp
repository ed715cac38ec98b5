// test_balancer_plugin.cpp -- a test-only balancer plugin (cad_test_balancer.so) so that the host tests
// have a second plugin kind: lookups by kind, and an "attention" key naming a non-attention instance.
// Its plan call refuses everything. A fixture, not a product.
#include "plugin_support.h"

namespace {

struct Context {
  cad::plugin::ErrorState error;
  Context(const cad_host_services_v1_t* services, const char* config_json) {
    cad::plugin::ConfigReader config(config_json, "plugin 'test_balancer' config");
    config.finish(cad::plugin::Logger(services, "test_balancer"));
  }
};

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx, char* error,
                    size_t capacity) {
  return cad::plugin::create_context<Context>(services, config_json, out_ctx, error, capacity);
}
void destroy(void* ctx) { delete static_cast<Context*>(ctx); }
const char* last_error(void* ctx) { return static_cast<Context*>(ctx)->error.text(); }
cad_status_t plan(void* ctx, const cad_balance_input_v1_t*, cad_plan_v1_t**) {
  return cad::plugin::guarded(static_cast<Context*>(ctx)->error,
                              [] { cad::plugin::fail(CAD_STATUS_UNSUPPORTED, "test_balancer plans nothing"); });
}
void release_plan(void*, cad_plan_v1_t*) {}

const cad_balancer_v1_t kBalancer = {sizeof(cad_balancer_v1_t), create, destroy, last_error, plan, release_plan};
const cad_plugin_v1_t kPlugin = {sizeof(cad_plugin_v1_t), CAD_ABI_VERSION_MAJOR, CAD_ABI_VERSION_MINOR,
                                 CAD_PLUGIN_KIND_BALANCER, "test_balancer", "0.0-test",
                                 "test fixture of the host adapter tests (plans nothing)", nullptr, nullptr, &kBalancer};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
