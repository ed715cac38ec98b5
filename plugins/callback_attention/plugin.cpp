// plugin.cpp -- the "callback_attention" attention backend: validates each call as every backend does, then
// hands it to the functions the host process registered under the config's key (registry.h,
// cad_callback_attention_v1.h). The math is the callbacks'; this file decides what reaches them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cad_abi_v1_layout.h"
#include "cad_plugin_v1.h"
#include "plugin_support.h"
#include "registry.h"
#include "window.h"

namespace {

using cad::plugin::DType;
using cad::plugin::fail;
using cad::plugin::format;

constexpr const char* kName = "callback_attention";
constexpr size_t kCallbackErrorCapacity = 4096;

struct CallbackContext {
  CallbackContext(const cad_host_services_v1_t* services, const char* config_json) : logger(services, kName) {
    cad::plugin::ConfigReader config(config_json, "plugin 'callback_attention' config");
    if (!config.has("key")) {
      fail(CAD_STATUS_INVALID_CONFIG, "plugin 'callback_attention' config: 'key' is required: the key under which the "
                                      "host process registered its callbacks (e.g. {\"key\": \"torch\"})");
    }
    const std::string key = config.get_string("key", "");
    config.finish(logger);
    registration = cad::callback_attention::find(key);
  }

  const cad_callback_attention_v1_t& table() const { return registration->table; }
  const cad_attention_capabilities_v1_t& caps() const { return registration->table.capabilities; }

  cad::plugin::ErrorState error;
  cad::plugin::Logger logger;
  std::shared_ptr<cad::callback_attention::Registration> registration;
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t forward_calls = 0;
  int64_t backward_calls = 0;
};

CallbackContext* as_context(void* ctx) { return static_cast<CallbackContext*>(ctx); }

// ---- validation: what every backend checks, against the registered capabilities --------------------

struct Shape {
  int64_t tq = 0, tk = 0, hq = 0, hkv = 0, d = 0;
  DType dtype = DType::F32;
  cad::plugin::Window window;
};

std::vector<DType> accepted(const cad_attention_capabilities_v1_t& caps) {
  std::vector<DType> out;
  if (caps.dtype_mask & CAD_ATTENTION_DTYPE_FP32) out.push_back(DType::F32);
  if (caps.dtype_mask & CAD_ATTENTION_DTYPE_BF16) out.push_back(DType::BF16);
  return out;
}

void check_shaped(const cad_tensor_v1_t* t, const char* name, const CallbackContext& self, std::vector<int64_t> want,
                  std::vector<const char*> dims, DType dtype) {
  cad::plugin::check_tensor(t, {name, self.caps().device_type, want, dims, {dtype}});
}

void check_device_id(const cad_tensor_v1_t* t, const char* name, int32_t device_id) {
  if (t->device.device_id != device_id) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s' is on device %d, tensor 'q' on device %d: one device", name,
                                             t->device.device_id, device_id));
  }
}

template <class Args>
Shape check_common(const CallbackContext& self, const Args* args, const char* call) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: args is NULL", call));
  if (args->struct_size < cad::plugin::abi_v1_0_size(args)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: args.struct_size is %zu, ABI v1.0 needs at least %zu", call,
                                         args->struct_size, cad::plugin::abi_v1_0_size(args)));
  }
  cad::plugin::refuse_partial_v1_1(args, call);
  const cad_attention_capabilities_v1_t& caps = self.caps();
  if (args->causal != 0 && args->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: causal must be 0 or 1, got %d", call, args->causal));
  }
  if (!(caps.flags & (args->causal ? CAD_ATTENTION_CAP_CAUSAL : CAD_ATTENTION_CAP_NONCAUSAL))) {
    fail(CAD_STATUS_UNSUPPORTED, format("%s: the callbacks registered under '%s' do not compute %s attention", call,
                                        self.registration->key.c_str(), args->causal ? "causal" : "non-causal"));
  }
  if (!std::isfinite(args->softmax_scale)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: softmax_scale must be finite, got %g", call, args->softmax_scale));
  }
  if (args->num_pieces != 0 || args->pieces != nullptr) {
    fail(CAD_STATUS_UNSUPPORTED, format("%s: the callback_attention backend takes segments, not pieces "
                                        "(num_pieces=%lld)", call, static_cast<long long>(args->num_pieces)));
  }
  if (CAD_HAS_FIELD(Args, args, plan) && args->plan != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: plan is not NULL, but the callback_attention backend makes no "
                                             "plans", call));
  }
  if (caps.device_type == CAD_DEVICE_CPU && args->stream != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: stream must be NULL (the callbacks run on the CPU)", call));
  }
  const std::vector<DType> dtypes = accepted(caps);
  cad::plugin::check_tensor(args->q, {"q", caps.device_type, {-1, -1, -1}, {"Tq", "Hq", "D"}, dtypes});
  Shape s;
  s.dtype = cad::plugin::dtype_is(args->q->dtype, DType::BF16) ? DType::BF16 : DType::F32;
  s.tq = args->q->shape[0];
  s.hq = args->q->shape[1];
  s.d = args->q->shape[2];
  if (s.hq == 0 || s.d == 0) fail(CAD_STATUS_INVALID_ARGUMENT, "tensor 'q': Hq and D must be positive");
  const bool in_mask = s.d % 16 == 0 && s.d / 16 >= 1 && s.d / 16 <= 32 && (caps.head_dim_mask >> (s.d / 16 - 1)) & 1u;
  if (s.d > caps.max_head_dim || !in_mask) {
    fail(CAD_STATUS_UNSUPPORTED, format("tensor 'q': head dim D=%lld is not one the callbacks registered under '%s' "
                                        "support (head_dim_mask 0x%x, at most %d)", static_cast<long long>(s.d),
                                        self.registration->key.c_str(), caps.head_dim_mask, caps.max_head_dim));
  }
  cad::plugin::check_tensor(args->k, {"k", caps.device_type, {-1, -1, s.d}, {"Tk", "Hkv", "D"}, {s.dtype}});
  s.tk = args->k->shape[0];
  s.hkv = args->k->shape[1];
  if (s.hkv == 0 || s.hq % s.hkv != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("grouped-query attention needs Hq %% Hkv == 0: tensor 'q' has Hq=%lld heads, tensor 'k' has Hkv=%lld",
                static_cast<long long>(s.hq), static_cast<long long>(s.hkv)));
  }
  if (s.hq != s.hkv && !(caps.flags & CAD_ATTENTION_CAP_GQA)) {
    fail(CAD_STATUS_UNSUPPORTED, format("tensors 'q' (Hq=%lld) and 'k' (Hkv=%lld): the callbacks registered under '%s' "
                                        "do not compute grouped-query attention", static_cast<long long>(s.hq),
                                        static_cast<long long>(s.hkv), self.registration->key.c_str()));
  }
  check_shaped(args->v, "v", self, {s.tk, s.hkv, s.d}, {"Tk", "Hkv", "D"}, s.dtype);
  check_device_id(args->k, "k", args->q->device.device_id);
  check_device_id(args->v, "v", args->q->device.device_id);
  cad::plugin::check_segments(args->segments, args->num_segments, s.tq, s.tk, args->causal == 1);
  if (!(caps.flags & CAD_ATTENTION_CAP_SHARED_KV)) {
    // Without CAP_SHARED_KV no two segments may read one K/V row.
    std::vector<std::pair<int64_t, int64_t>> kv;
    for (int64_t i = 0; i < args->num_segments; ++i) {
      if (args->segments[i].kv_len > 0) kv.emplace_back(args->segments[i].kv_offset, args->segments[i].kv_len);
    }
    std::sort(kv.begin(), kv.end());
    for (size_t i = 1; i < kv.size(); ++i) {
      if (kv[i - 1].first + kv[i - 1].second > kv[i].first) {
        fail(CAD_STATUS_UNSUPPORTED, format("%s: segments share K/V rows, which the callbacks registered under '%s' do "
                                            "not support", call, self.registration->key.c_str()));
      }
    }
  }
  s.window = cad::plugin::read_window(args, args->causal == 1, call);
  if (!(caps.flags & CAD_ATTENTION_CAP_WINDOW)) cad::plugin::refuse_window(s.window, kName, call);
  return s;
}

template <class Args>
void check_device_ids(const Args* args, std::initializer_list<std::pair<const cad_tensor_v1_t*, const char*>> tensors) {
  for (const auto& [t, name] : tensors) check_device_id(t, name, args->q->device.device_id);
}

// The full v1.2 struct a callback sees: the caller's fields, the normalised window, no plan, no saved.
template <class Args>
Args normalised(const Args* args, const Shape& s) {
  Args out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(&out, args, std::min(args->struct_size, sizeof(out)));
  out.struct_size = sizeof(out);
  out.plan = nullptr;
  out.saved = {};
  out.window_flags = CAD_WINDOW_GIVEN;
  out.reserved_v1_2 = 0;
  out.window_left = s.window.left;
  out.window_right = s.window.right;
  return out;
}

template <class Fn, class Args>
void call_back(const CallbackContext& self, Fn fn, const Args& args, const char* call) {
  std::vector<char> message(kCallbackErrorCapacity, '\0');
  const cad_status_t status = fn(self.table().user_data, &args, message.data(), message.size());
  if (status == CAD_STATUS_OK) return;
  message.back() = '\0';
  const bool known = status > CAD_STATUS_OK && status <= CAD_STATUS_INTERNAL;
  fail(known ? status : CAD_STATUS_INTERNAL,
       format("%s callback '%s' failed%s: %s", call, self.registration->key.c_str(),
              known ? "" : format(" with status %d, which is not a cad_status_t", status).c_str(),
              message[0] ? message.data() : "(no message)"));
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// ---- the ABI table -------------------------------------------------------------------------------

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                    char* error_message, size_t error_capacity) {
  return cad::plugin::create_context<CallbackContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void destroy(void* ctx) { delete as_context(ctx); }  // drops the registration; may call its release

const char* last_error(void* ctx) { return ctx == nullptr ? "context is NULL" : as_context(ctx)->error.text(); }

cad_status_t get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_capabilities: out is NULL");
    if (out->struct_size < sizeof(cad_attention_capabilities_v1_t)) {
      fail(CAD_STATUS_ABI_MISMATCH, format("get_capabilities: out.struct_size is %zu, ABI v1.0 needs at least %zu",
                                           out->struct_size, sizeof(cad_attention_capabilities_v1_t)));
    }
    const size_t size = out->struct_size;
    *out = self.caps();
    out->struct_size = size;
    if (self.table().backward == nullptr) out->flags &= ~static_cast<uint32_t>(CAD_ATTENTION_CAP_BACKWARD);
  });
}

cad_status_t forward(void* ctx, const cad_attention_forward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    const Shape s = check_common(self, args, "forward");
    check_shaped(args->o, "o", self, {s.tq, s.hq, s.d}, {"Tq", "Hq", "D"}, s.dtype);
    check_shaped(args->lse, "lse", self, {s.hq, s.tq}, {"Hq", "Tq"}, DType::F32);
    check_device_ids(args, {{args->o, "o"}, {args->lse, "lse"}});
    const auto start = std::chrono::steady_clock::now();
    call_back(self, self.table().forward, normalised(args, s), "forward");
    if (CAD_HAS_FIELD(cad_attention_forward_args_v1_t, args, saved) && args->saved != nullptr) {
      *args->saved = nullptr;  // nothing kept: the backward gets Q/K/V/O/LSE from its tensors
    }
    self.forward_ms = elapsed_ms(start);
    ++self.forward_calls;
  });
}

cad_status_t backward(void* ctx, const cad_attention_backward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    if (self.table().backward == nullptr) {
      fail(CAD_STATUS_UNSUPPORTED, "backward: the callbacks registered under '" + self.registration->key +
                                       "' have no backward");
    }
    const Shape s = check_common(self, args, "backward");
    for (const auto& [t, name] : {std::pair{args->o, "o"}, {args->d_o, "d_o"}, {args->d_q, "d_q"}}) {
      check_shaped(t, name, self, {s.tq, s.hq, s.d}, {"Tq", "Hq", "D"}, s.dtype);
    }
    check_shaped(args->lse, "lse", self, {s.hq, s.tq}, {"Hq", "Tq"}, DType::F32);
    check_shaped(args->d_k, "d_k", self, {s.tk, s.hkv, s.d}, {"Tk", "Hkv", "D"}, s.dtype);
    check_shaped(args->d_v, "d_v", self, {s.tk, s.hkv, s.d}, {"Tk", "Hkv", "D"}, s.dtype);
    if (CAD_HAS_FIELD(cad_attention_backward_args_v1_t, args, saved) && args->saved != nullptr) {
      fail(CAD_STATUS_INVALID_ARGUMENT, "backward: saved is not NULL, but this backend's forward keeps no state");
    }
    check_device_ids(args, {{args->o, "o"}, {args->lse, "lse"}, {args->d_o, "d_o"}, {args->d_q, "d_q"},
                            {args->d_k, "d_k"}, {args->d_v, "d_v"}});
    const auto start = std::chrono::steady_clock::now();
    call_back(self, self.table().backward, normalised(args, s), "backward");
    self.backward_ms = elapsed_ms(start);
    ++self.backward_calls;
  });
}

cad_status_t get_stats_json(void* ctx, char* buffer, size_t capacity, size_t* needed) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    // Host wall time of the last calls: a CUDA callback's enqueue time, not its kernels'.
    const std::string json = format("{\"key\": \"%s\", \"forward_ms\": %.6f, \"backward_ms\": %.6f, "
                                    "\"forward_calls\": %lld, \"backward_calls\": %lld}",
                                    self.registration->key.c_str(), self.forward_ms, self.backward_ms,
                                    static_cast<long long>(self.forward_calls),
                                    static_cast<long long>(self.backward_calls));
    cad::plugin::write_json_result(json, buffer, capacity, needed);
  });
}

const cad_attention_v1_t kAttentionTable = {
    sizeof(cad_attention_v1_t), create, destroy, last_error, get_capabilities, forward, backward, get_stats_json,
    nullptr, nullptr, nullptr,  // no plans: a callback rebuilds what it needs from the segment table
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_ATTENTION,
    kName,
    "1.0.0",
    "attention through forward/backward functions the host process registers under a key (e.g. the Python "
    "package's torch or FlashAttention-4 server backends)",
    &kAttentionTable,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
