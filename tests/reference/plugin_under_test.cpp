// plugin_under_test.cpp -- see plugin_under_test.h.
#include "plugin_under_test.h"

#include <dlfcn.h>

#include <limits>
#include <stdexcept>

namespace cad::testing {

PluginUnderTest::PluginUnderTest(const std::string& path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) throw std::runtime_error("dlopen " + path + ": " + dlerror());
  const auto entry = reinterpret_cast<cad_plugin_entry_v1_fn>(dlsym(handle_, CAD_PLUGIN_ENTRY_SYMBOL_V1));
  if (entry == nullptr) throw std::runtime_error(path + " does not export " CAD_PLUGIN_ENTRY_SYMBOL_V1);
  plugin_ = entry();
  if (plugin_ == nullptr || plugin_->abi_major != CAD_ABI_VERSION_MAJOR || plugin_->attention == nullptr) {
    throw std::runtime_error(path + " is not an ABI v1 attention plugin");
  }
  services_.struct_size = sizeof(services_);
  services_.abi_major = CAD_ABI_VERSION_MAJOR;
  services_.abi_minor = CAD_ABI_VERSION_MINOR;
  services_.host_ctx = this;
  services_.log_level = CAD_LOG_DEBUG;
  services_.log = &PluginUnderTest::record;
  services_.bootstrap_rank = -1;
}

PluginUnderTest::~PluginUnderTest() {
  if (handle_ != nullptr) dlclose(handle_);
}

void PluginUnderTest::record(void* host_ctx, cad_log_level_t level, const char*, const char* message) {
  static_cast<PluginUnderTest*>(host_ctx)->log_.push_back({level, message});
}

Instance::Instance(const PluginUnderTest& plugin, const char* config_json) : api_(plugin.api()) {
  char message[512] = "";
  create_status_ = api_->create(plugin.services(), config_json, &ctx_, message, sizeof(message));
  create_error_ = message;
}

Instance::~Instance() { api_->destroy(ctx_); }

AttentionTensors::AttentionTensors(const Problem& p, Dtype dtype, unsigned seed)
    : q({p.tq, p.hq, p.d}, dtype),
      k({p.tk, p.hkv, p.d}, dtype),
      v({p.tk, p.hkv, p.d}, dtype),
      o({p.tq, p.hq, p.d}, dtype),
      lse({p.hq, p.tq}, Dtype::F32),
      d_o({p.tq, p.hq, p.d}, dtype),
      d_q({p.tq, p.hq, p.d}, dtype),
      d_k({p.tk, p.hkv, p.d}, dtype),
      d_v({p.tk, p.hkv, p.d}, dtype) {
  std::mt19937 rng(seed);
  for (HostTensor* t : {&q, &k, &v, &d_o}) t->fill_uniform(rng, -1.0f, 1.0f);
  for (HostTensor* t : {&o, &lse, &d_q, &d_k, &d_v}) t->fill(std::numeric_limits<float>::quiet_NaN());
}

cad_attention_forward_args_v1_t forward_args(const Problem& p, AttentionTensors& t) {
  cad_attention_forward_args_v1_t a{};
  a.struct_size = sizeof(a);
  a.segments = p.segments.data();
  a.num_segments = static_cast<int64_t>(p.segments.size());
  a.softmax_scale = p.scale;
  a.causal = p.causal ? 1 : 0;
  a.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit: the problem's window, if any
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.q = t.q.view();
  a.k = t.k.view();
  a.v = t.v.view();
  a.o = t.o.view();
  a.lse = t.lse.view();
  return a;
}

cad_attention_backward_args_v1_t backward_args(const Problem& p, AttentionTensors& t) {
  cad_attention_backward_args_v1_t a{};
  a.struct_size = sizeof(a);
  a.segments = p.segments.data();
  a.num_segments = static_cast<int64_t>(p.segments.size());
  a.softmax_scale = p.scale;
  a.causal = p.causal ? 1 : 0;
  a.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit: the problem's window, if any
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.q = t.q.view();
  a.k = t.k.view();
  a.v = t.v.view();
  a.o = t.o.view();
  a.lse = t.lse.view();
  a.d_o = t.d_o.view();
  a.d_q = t.d_q.view();
  a.d_k = t.d_k.view();
  a.d_v = t.d_v.view();
  return a;
}

RunStatus run_forward_backward(const Instance& instance, const cad_attention_v1_t* api, const Problem& p,
                               AttentionTensors& t) {
  RunStatus status;
  const cad_attention_forward_args_v1_t fwd = forward_args(p, t);
  status.forward = api->forward(instance.ctx(), &fwd);
  if (status.forward != CAD_STATUS_OK) return status;
  const cad_attention_backward_args_v1_t bwd = backward_args(p, t);
  status.backward = api->backward(instance.ctx(), &bwd);
  return status;
}

}  // namespace cad::testing
