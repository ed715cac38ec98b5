// An attention plugin that breaks the ABI's promises in one way, chosen at compile time:
//   FAULT_CREATE_THROWS_INT      create throws an int (not a std::exception)
//   FAULT_DESTROY_THROWS         destroy throws a std::runtime_error
//   FAULT_CTX_ON_FAILED_CREATE   create fails but writes a bogus pointer into *out_ctx
//   FAULT_DEVICE_ERROR           create always reports CAD_STATUS_DEVICE_ERROR (a GPU plugin, no GPU)
//   FAULT_CREATE_EXIT0           create calls _exit(0): no atexit handler runs, the process "succeeds"
//   FAULT_NULL_HOST_CTX          create calls every host service with a NULL host_ctx, then succeeds
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cad_plugin_v1.h"

namespace {

[[maybe_unused]] void copy(const char* text, char* buffer, size_t capacity) {
  if (buffer == nullptr || capacity == 0) return;
  std::strncpy(buffer, text, capacity - 1);
  buffer[capacity - 1] = '\0';
}

cad_status_t create([[maybe_unused]] const cad_host_services_v1_t* services, const char* config, void** out_ctx,
                    char* error, size_t capacity) {
#if defined(FAULT_CREATE_THROWS_INT)
  (void)config, (void)out_ctx, (void)error, (void)capacity;
  throw 42;
#elif defined(FAULT_CTX_ON_FAILED_CREATE)
  (void)config;
  if (out_ctx != nullptr) *out_ctx = reinterpret_cast<void*>(0x1);
  copy("refused, but wrote *out_ctx", error, capacity);
  return CAD_STATUS_INVALID_CONFIG;
#elif defined(FAULT_DEVICE_ERROR)
  (void)config, (void)out_ctx;
  copy("no usable CUDA device (device count is 0)", error, capacity);
  return CAD_STATUS_DEVICE_ERROR;
#elif defined(FAULT_CREATE_EXIT0)
  (void)config, (void)out_ctx, (void)error, (void)capacity;
  _exit(0);
#else
  (void)config, (void)error, (void)capacity;
#if defined(FAULT_NULL_HOST_CTX)
  // A services table is lent with its host_ctx; a plugin passing NULL instead must get an error back.
  const void* table = nullptr;
  void* instance = nullptr;
  void* memory = nullptr;
  const cad_device_v1_t cpu = {CAD_DEVICE_CPU, 0};
  services->log(nullptr, CAD_LOG_ERROR, "misbehaving", "logged with a NULL host_ctx");
  if (services->lookup_plugin(nullptr, "comm", CAD_PLUGIN_KIND_COMMUNICATOR, &table, &instance) == CAD_STATUS_OK ||
      services->allocate(nullptr, cpu, 64, nullptr, &memory) == CAD_STATUS_OK) {
    copy("a host service called with a NULL host_ctx returned OK", error, capacity);
    return CAD_STATUS_INTERNAL;
  }
  services->free(nullptr, cpu, memory, nullptr);
#endif
  if (out_ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  *out_ctx = std::malloc(1);
  return CAD_STATUS_OK;
#endif
}

void destroy(void* ctx) {
#if defined(FAULT_DESTROY_THROWS)
  std::free(ctx);
  if (ctx != nullptr) throw std::runtime_error("destroy threw on purpose");
#else
  std::free(ctx);
#endif
}

const char* last_error(void*) { return ""; }
cad_status_t capabilities(void*, cad_attention_capabilities_v1_t*) { return CAD_STATUS_UNSUPPORTED; }
cad_status_t forward(void*, const cad_attention_forward_args_v1_t*) { return CAD_STATUS_UNSUPPORTED; }
cad_status_t backward(void*, const cad_attention_backward_args_v1_t*) { return CAD_STATUS_UNSUPPORTED; }

const cad_attention_v1_t attention = {sizeof(cad_attention_v1_t), create, destroy, last_error, capabilities, forward,
                                      backward, nullptr, nullptr, nullptr, nullptr};
const cad_plugin_v1_t plugin = {sizeof(cad_plugin_v1_t), 1, CAD_ABI_VERSION_MINOR, CAD_PLUGIN_KIND_ATTENTION,
                                "misbehaving", "0.0-broken", "deliberately misbehaving test plugin", &attention,
                                nullptr, nullptr};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
