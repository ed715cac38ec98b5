// test_attention_plugin.cpp -- a test-only attention plugin (cad_test_attention.so) for the host adapter's
// tests: trivial math (O = Q, LSE = 0, dQ = dO, dK = dV = 0), plus config switches that exercise the
// host services. A fixture, not a product. Config keys:
//   "tag": string       logged at info on create and destroy ("create <tag>", "destroy <tag>")
//   "needs": string     an attention instance looked up at create (NOT_FOUND if the host has none)
//   "allocate_bytes": n CPU bytes allocated through the host at create, freed at destroy
//   "leak": bool        keep (do not free) that allocation at destroy
//   "shared_kv": bool   claim CAD_ATTENTION_CAP_SHARED_KV (what CAD asks of a server backend), so that CAD's tests
//                       can offer it as a server backend whose other capabilities differ from the reference's
#include <cstring>
#include <string>

#include "plugin_support.h"

namespace {

using cad::plugin::ConfigReader;
using cad::plugin::DType;
using cad::plugin::ErrorState;
using cad::plugin::fail;
using cad::plugin::guarded;
using cad::plugin::Logger;

struct Context {
  ErrorState error;
  const cad_host_services_v1_t* services;
  Logger logger;
  std::string tag;
  void* block = nullptr;
  bool leak = false;
  bool shared_kv = false;

  Context(const cad_host_services_v1_t* s, const char* config_json) : services(s), logger(s, "test_attention") {
    ConfigReader config(config_json, "plugin 'test_attention' config");
    tag = config.get_string("tag", "");
    const std::string needs = config.get_string("needs", "");
    const int64_t bytes = config.get_int("allocate_bytes", 0, 0, int64_t{1} << 30);
    leak = config.get_bool("leak", false);
    shared_kv = config.get_bool("shared_kv", false);
    config.finish(logger);
    if (!needs.empty()) {
      const void* table = nullptr;
      void* instance = nullptr;
      const cad_status_t status = s->lookup_plugin(s->host_ctx, needs.c_str(), CAD_PLUGIN_KIND_ATTENTION, &table, &instance);
      if (status != CAD_STATUS_OK || table == nullptr || instance == nullptr) {
        fail(CAD_STATUS_NOT_FOUND, "needs attention instance '" + needs + "', which the host did not find");
      }
    }
    if (bytes > 0 && s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, static_cast<size_t>(bytes), nullptr, &block) != CAD_STATUS_OK) {
      fail(CAD_STATUS_OUT_OF_MEMORY, "host allocation failed");
    }
    if (!tag.empty()) logger.info("create " + tag);
  }
  ~Context() {
    if (block != nullptr && !leak) services->free(services->host_ctx, {CAD_DEVICE_CPU, 0}, block, nullptr);
    if (!tag.empty()) logger.info("destroy " + tag);
  }
};

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx, char* error,
                    size_t capacity) {
  return cad::plugin::create_context<Context>(services, config_json, out_ctx, error, capacity);
}
void destroy(void* ctx) { delete static_cast<Context*>(ctx); }
const char* last_error(void* ctx) { return static_cast<Context*>(ctx)->error.text(); }

cad_status_t get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  return guarded(static_cast<Context*>(ctx)->error, [&] {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "out is NULL");
    cad_attention_capabilities_v1_t caps{};
    caps.struct_size = sizeof caps;
    caps.device_type = CAD_DEVICE_CPU;
    caps.dtype_mask = CAD_ATTENTION_DTYPE_FP32;
    caps.flags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA | CAD_ATTENTION_CAP_BACKWARD;
    if (static_cast<Context*>(ctx)->shared_kv) caps.flags |= CAD_ATTENTION_CAP_SHARED_KV;
    caps.head_dim_mask = 0xffffffffu;
    caps.max_head_dim = 512;
    const size_t n = out->struct_size < sizeof caps ? out->struct_size : sizeof caps;
    const size_t caller_size = out->struct_size;
    std::memcpy(out, &caps, n);
    out->struct_size = caller_size;
  });
}

void copy_floats(const cad_tensor_v1_t* from, cad_tensor_v1_t* to) {
  std::memcpy(cad::plugin::tensor_data(to), cad::plugin::tensor_data(from),
              static_cast<size_t>(cad::plugin::tensor_numel(from)) * sizeof(float));
}
void zero_floats(cad_tensor_v1_t* t) {
  std::memset(cad::plugin::tensor_data(t), 0, static_cast<size_t>(cad::plugin::tensor_numel(t)) * sizeof(float));
}

cad_status_t forward(void* ctx, const cad_attention_forward_args_v1_t* a) {
  return guarded(static_cast<Context*>(ctx)->error, [&] {
    if (a == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "args is NULL");
    cad::plugin::check_tensor(a->q, {"q", CAD_DEVICE_CPU, {-1, -1, -1}, {"Tq", "Hq", "D"}, {DType::F32}});
    const int64_t* s = a->q->shape;
    cad::plugin::check_tensor(a->o, {"o", CAD_DEVICE_CPU, {s[0], s[1], s[2]}, {"Tq", "Hq", "D"}, {DType::F32}});
    cad::plugin::check_tensor(a->lse, {"lse", CAD_DEVICE_CPU, {s[1], s[0]}, {"Hq", "Tq"}, {DType::F32}});
    copy_floats(a->q, a->o);
    zero_floats(a->lse);
  });
}

cad_status_t backward(void* ctx, const cad_attention_backward_args_v1_t* a) {
  return guarded(static_cast<Context*>(ctx)->error, [&] {
    if (a == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "args is NULL");
    cad::plugin::check_tensor(a->d_o, {"d_o", CAD_DEVICE_CPU, {-1, -1, -1}, {"Tq", "Hq", "D"}, {DType::F32}});
    const int64_t* s = a->d_o->shape;
    cad::plugin::check_tensor(a->d_q, {"d_q", CAD_DEVICE_CPU, {s[0], s[1], s[2]}, {"Tq", "Hq", "D"}, {DType::F32}});
    cad::plugin::check_tensor(a->d_k, {"d_k", CAD_DEVICE_CPU, {-1, -1, s[2]}, {"Tk", "Hkv", "D"}, {DType::F32}});
    cad::plugin::check_tensor(a->d_v, {"d_v", CAD_DEVICE_CPU, {-1, -1, s[2]}, {"Tk", "Hkv", "D"}, {DType::F32}});
    copy_floats(a->d_o, a->d_q);
    zero_floats(a->d_k);
    zero_floats(a->d_v);
  });
}

// Built as a v1.0 plugin (the table ends before the v1.1 plan slots): the host must still take it.
const cad_attention_v1_t kAttention = {CAD_ATTENTION_V1_0_TABLE_SIZE, create, destroy, last_error, get_capabilities,
                                       forward, backward, nullptr, nullptr, nullptr, nullptr};
const cad_plugin_v1_t kPlugin = {sizeof(cad_plugin_v1_t), CAD_ABI_VERSION_MAJOR, CAD_ABI_VERSION_MINOR,
                                 CAD_PLUGIN_KIND_ATTENTION, "test_attention", "0.0-test",
                                 "test fixture of the host adapter tests (O = Q)", &kAttention, nullptr, nullptr};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
